"""The lint and gen caches: keyed by content, so a hit gives exactly what a miss
computes and an edit is never hidden."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from causalab_mini.codegen import cache as cache_mod
from causalab_mini.codegen.generate import render, render_all, render_docs
from causalab_mini.codegen.lint import FAMILY_SCHEMA, lint

from .conftest import REPO, edit
from .test_lint import CASES, _apply


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("CAUSALAB_MINI_CACHE", str(root))
    monkeypatch.delenv("CAUSALAB_MINI_LINT_CACHE", raising=False)
    return root / "lint"


def _shown(diags: list[object], root: Path) -> list[str]:
    return [str(d).replace(f"{root}/", "") for d in diags]


def _parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every file the loader parses."""
    from causalab_mini.codegen import lint as lint_mod

    seen: list[str] = []
    real = lint_mod.load_text

    def spy(text: str, display: str, out: object = None) -> object:
        seen.append(display)
        return real(text, display, out)  # type: ignore[arg-type]

    monkeypatch.setattr(lint_mod, "load_text", spy)
    return seen


def test_a_hit_gives_what_a_miss_computed(
    cache_dir: Path, registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _parses(monkeypatch)
    first_reg, first = lint(registry_copy)
    assert len(seen) == len(first_reg.sources) and first == []
    assert list(cache_dir.glob("registry-*.json")) and list(cache_dir.glob("file-*.json"))
    seen.clear()
    second_reg, second = lint(registry_copy)
    assert seen == []  # nothing parsed
    assert second == first
    assert second_reg.places == first_reg.places and second_reg.families == first_reg.families
    assert second_reg.structural == first_reg.structural
    assert second_reg.components == first_reg.components
    assert second_reg.sources == first_reg.sources


@pytest.mark.parametrize("code", ["Y001", "Y003", "S001", "S003", "S005", "X004", "X017"])
def test_golden_positions_are_exact_from_the_cache(
    code: str, cache_dir: Path, registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lint(registry_copy)  # the clean registry, cached
    edits, expected = CASES[code]
    _apply(registry_copy, edits)
    seen = _parses(monkeypatch)
    assert _shown(lint(registry_copy)[1], registry_copy) == expected  # the edited file: a miss
    assert len(seen) == len({rel for rel, _, _ in edits})
    seen.clear()
    assert _shown(lint(registry_copy)[1], registry_copy) == expected  # now a hit
    assert seen == []


def test_an_edit_is_never_hidden_and_an_undo_hits(
    cache_dir: Path, registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lint(registry_copy)
    path = registry_copy / "places.yaml"
    before = path.read_bytes()
    edit(path, "    order: 0\n", "    order: zero\n")
    assert [d.code for d in lint(registry_copy)[1]] == ["S003"]
    path.write_bytes(before)
    seen = _parses(monkeypatch)
    assert lint(registry_copy)[1] == []
    assert seen == []  # the original bytes' entry


def test_the_same_file_elsewhere_is_named_by_its_own_path(
    cache_dir: Path, registry_copy: Path, tmp_path: Path
) -> None:
    import shutil

    _apply(registry_copy, CASES["X010"][0])
    other = tmp_path / "elsewhere"
    shutil.copytree(registry_copy, other)
    first = lint(registry_copy)[1]
    second = lint(other)[1]
    assert _shown(first, registry_copy) == _shown(second, other)
    assert all(str(d.path).startswith(str(other)) for d in second)


def test_keys_follow_content_schema_and_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    key = cache_mod.LintCache.key
    assert key(FAMILY_SCHEMA, b"a: 1\n") == key(FAMILY_SCHEMA, b"a: 1\n")
    assert key(FAMILY_SCHEMA, b"a: 1\n") != key(FAMILY_SCHEMA, b"a: 2\n")
    assert key(FAMILY_SCHEMA, b"a: 1\n") != key("places.schema.json", b"a: 1\n")
    before = key(FAMILY_SCHEMA, b"a: 1\n")
    monkeypatch.setattr(cache_mod, "tool_key", lambda: "another version of the tool")
    assert key(FAMILY_SCHEMA, b"a: 1\n") != before


def test_the_tool_key_covers_the_schemas_the_parser_and_the_libraries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[str] = []
    real = Path.read_bytes

    def spy(self: Path) -> bytes:
        read.append(self.name)
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", spy)
    cache_mod.tool_key.cache_clear()
    try:
        cache_mod.tool_key()
    finally:
        cache_mod.tool_key.cache_clear()
    for needed in ("loader.py", "lint.py", "common.schema.json", "family.schema.json"):
        assert needed in read
    versions = {"ruamel.yaml": "1", "jsonschema": "1", "referencing": "1"}
    monkeypatch.setattr(cache_mod, "_distribution_version", lambda name: versions[name])
    one = cache_mod.tool_key()
    cache_mod.tool_key.cache_clear()
    versions["jsonschema"] = "2"
    assert cache_mod.tool_key() != one
    cache_mod.tool_key.cache_clear()


def test_a_corrupt_entry_is_a_miss(cache_dir: Path, registry_copy: Path) -> None:
    lint(registry_copy)
    for entry in cache_dir.iterdir():
        entry.write_text('{"format": 1, "entries": {"places.yaml": [')
    assert lint(registry_copy)[1] == []
    for entry in cache_dir.glob("file-*.json"):
        entry.write_text(json.dumps({"format": 1, "entry": {"data": None}}))
    for entry in cache_dir.glob("registry-*.json"):
        entry.unlink()
    assert lint(registry_copy)[1] == []


def test_the_cache_can_be_turned_off(
    cache_dir: Path, registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAUSALAB_MINI_LINT_CACHE", "0")
    assert lint(registry_copy)[1] == []
    assert not cache_dir.exists()


def test_an_unwritable_cache_is_no_error(
    cache_dir: Path, registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_dir.parent.mkdir(parents=True)
    cache_dir.write_text("a file where the directory would be")
    assert lint(registry_copy)[1] == []


def test_gen_renders_from_the_cache_what_it_renders_without(cache_dir: Path) -> None:
    registry, _ = lint()
    modules, pages = render_all(registry, docs=True)
    assert modules == render(registry) and pages == render_docs(registry)
    assert list(cache_dir.glob("render-*.json"))
    hit_modules, hit_pages = render_all(registry, docs=True)
    assert (hit_modules, hit_pages) == (modules, pages)
    only_modules = render_all(registry, docs=False)
    assert only_modules == (modules, {})


def test_a_render_key_follows_every_registry_file() -> None:
    registry, _ = lint()
    key = cache_mod.render_key(registry.sources, "modules")
    assert key == cache_mod.render_key(dict(registry.sources), "modules")
    assert key != cache_mod.render_key(registry.sources, "modules+docs")
    changed = dict(registry.sources)
    changed["families/gpt2.yaml"] += b"\n"
    assert cache_mod.render_key(changed, "modules") != key


def test_a_warm_lint_imports_neither_ruamel_nor_jsonschema(cache_dir: Path) -> None:
    code = (
        "import sys\n"
        "from causalab_mini.codegen.lint import lint\n"
        "assert lint()[1] == []\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if m.startswith(('ruamel', 'jsonschema', 'jinja2'))}))\n"
    )
    env = {"CAUSALAB_MINI_CACHE": str(cache_dir.parent), "PATH": "/usr/bin:/bin"}
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert cold.returncode == 0, cold.stderr
    assert "ruamel" in cold.stdout and "jsonschema" in cold.stdout
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.strip() == "[]"


def test_registry_gen_check_reads_the_repository_once_cached(cache_dir: Path) -> None:
    env = {"CAUSALAB_MINI_CACHE": str(cache_dir.parent), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "causalab_mini.codegen", "gen", "--check"]
    for _ in range(2):
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(list(cache_dir.glob("render-*.json"))) == 1
