"""`registry gen`: deterministic, atomic, checked, and unable to emit code from data."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path
from types import ModuleType

import pytest

from causalab_mini.codegen.generate import HEADER_MARK, default_output, digest, render
from causalab_mini.codegen.lint import lint

from .conftest import REPO, cli, edit


def test_committed_generated_is_up_to_date() -> None:
    result = cli("gen", "--check")
    assert result.exit_code == 0, result.output
    assert default_output().resolve() == (REPO / "generated").resolve()


def test_same_input_same_bytes(package_registry_copy: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    registry_copy = package_registry_copy
    assert cli("gen", "--registry", str(registry_copy), "--out", str(a)).exit_code == 0
    assert cli("gen", "--registry", str(registry_copy), "--out", str(b)).exit_code == 0
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes()
        assert (a / name).read_bytes() == (REPO / "generated" / name).read_bytes()


def _outside_strings(source: str) -> str:
    """``source`` without its string literals (comments and code kept)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return " ".join(t.string for t in tokens if t.type != tokenize.STRING)


def test_every_file_opens_with_do_not_edit_and_its_sources() -> None:
    registry, _ = lint()
    rendered = render(registry)
    for name, text in rendered.items():
        first = text.splitlines()[0]
        assert first.startswith(HEADER_MARK), name
        assert "sha256" in first and "run `registry gen`" in first
        # no time of generation: no date or clock time anywhere, and no word for one in
        # the code and comments (registry strings may name a config key such as
        # word_timestamp_config; test_same_input_same_bytes holds the bytes fixed)
        assert not re.search(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2}", text), name
        assert "timestamp" not in _outside_strings(text).lower(), name
        assert first.count("sha256") == 1, "one digest, not one per source"
    first = rendered["places.py"].splitlines()[0]
    assert "from places.yaml with template places.py.j2 (causalab-mini " in first
    assert f"sha256 {digest(registry, ('places.yaml',), ('places.py.j2', '_header.py.j2'))})" in (
        first
    )
    # __init__.py is built from no registry file: a registry edit never changes it
    assert "from no registry file with template __init__.py.j2" in rendered["__init__.py"]
    families = rendered["families.py"].splitlines()[0]
    assert (
        "from places.yaml, block_structures.yaml, interiors.yaml, families/*.yaml with template "
        "families" in families
    )


def test_the_digest_covers_every_source_the_templates_and_the_version(
    registry_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from causalab_mini.codegen import generate

    registry, _ = lint(registry_copy)
    patterns, templates = ("places.yaml", "families/*.yaml"), ("families.py.j2",)
    before = digest(registry, patterns, templates)
    assert digest(registry, patterns, templates) == before  # no timestamp, no order
    registry.sources["families/llama.yaml"] += b"\n# a comment\n"
    after_family = digest(registry, patterns, templates)
    assert after_family != before
    assert digest(registry, ("places.yaml",), templates) == digest(
        lint(registry_copy)[0], ("places.yaml",), templates
    )  # a family edit does not touch a module built from places.yaml only
    assert digest(registry, patterns, ("places.py.j2",)) != after_family
    monkeypatch.setattr(generate, "__version__", "9.9.9")
    assert digest(registry, patterns, templates) != after_family


def test_writes_only_what_changed(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    edit(registry_copy / "interiors.yaml", "The queries as", "The query vectors as")
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert result.exit_code == 0
    changed = {p.name for p in out.iterdir() if p.stat().st_mtime_ns != before[p.name]}
    # their sources (a family's own interiors replace() the defaults)
    assert changed == {"interiors.py", "components.py", "families.py"}
    assert "The query vectors as" in (out / "interiors.py").read_text()


def test_check_catches_a_hand_edit(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    target = out / "places.py"
    target.write_text(target.read_text().replace("order=60", "order=61"))
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out), "--check")
    assert result.exit_code == 1
    assert f"{target}: is not up to date. Run `registry gen --registry" in result.output
    assert target.read_text().count("order=61") == 1  # --check writes nothing


def test_check_catches_an_orphan_and_gen_removes_it(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    orphan = out / "old_table.py"
    orphan.write_text((out / "interiors.py").read_text())
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out), "--check")
    assert result.exit_code == 1 and "orphan" in result.output
    assert cli("gen", "--registry", str(registry_copy), "--out", str(out)).exit_code == 0
    assert not orphan.exists()


def test_gen_refuses_to_delete_a_hand_written_file(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    mine = out / "helpers.py"
    mine.write_text("x = 1\n")
    edit(registry_copy / "interiors.yaml", "The queries as", "The query vectors as")
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert (
        result.exit_code == 1 and "helpers.py" in result.output and "not generated" in result.output
    )
    assert mine.read_text() == "x = 1\n"
    assert "The query vectors as" not in (out / "interiors.py").read_text()


def test_gen_refuses_while_lint_fails(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    edit(registry_copy / "places.yaml", "    order: 0\n", "    order: zero\n")
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert result.exit_code == 1
    assert "S003" in result.output and "lint fails" in result.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot


def test_concurrent_gen_runs_leave_a_whole_tree(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "causalab_mini.codegen",
        "gen",
        "--registry",
        str(registry_copy),
        "--out",
        str(out),
    ]
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp"))
    for name, text in render(lint(registry_copy)[0]).items():
        assert (out / name).read_text() == text


HOSTILE = [
    "he said \"hi\" and 'bye'",
    "line one\nline two",
    '""" + __import__("os").system("echo pwned") + """',
    "__import__('os').system('echo pwned')",
    "back\\slash \\n and \\x00 and {place}",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_row_text_reaches_python_only_as_data(
    text: str, registry_copy: Path, tmp_path: Path
) -> None:
    import json

    quoted = json.dumps(text)  # a YAML double-quoted scalar
    edit(
        registry_copy / "places.yaml",
        "    doc: The residual stream entering the block.\n",
        f"    doc: {quoted}\n",
    )
    edit(
        registry_copy / "families/gpt2.yaml", "doc: GPT-2, whose", f"doc: {quoted}\n# GPT-2, whose"
    )
    out = tmp_path / "gen"
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert result.exit_code == 0, result.output
    source = (out / "places.py").read_text()
    tree = ast.parse(source)
    calls = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert calls <= {
        "Address",
        "MappingProxyType",
        "Unavailable",
        "Condition",
        "FirstIfTuple",
        "Index",
        "Lens",
        "LensStep",
    }
    module = _load(out / "places.py", "causalab_mini.generated._probe_places")
    assert module.DEFAULT_ADDRESSES["layers_input"].doc == text.strip()


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_match_the_rows() -> None:
    import causalab_mini.generated as g

    registry, _ = lint()
    assert list(g.DEFAULT_ADDRESSES) == list(registry.places)
    assert g.DEFAULT_ADDRESSES == registry.places
    assert dict(g.INTERIORS) == registry.interiors
    assert dict(g.COMPONENTS) == registry.components
    assert set(g.FAMILIES) == {f.name for f in registry.families}
    assert list(g.BLOCK_STRUCTURES) == list(registry.structures)
    # a family row is replace() on the default: unchanged fields survive
    gemma = dict(g.FAMILIES["gemma2"].addresses)
    # one Family per file, and the tables by kind read from them
    assert all(name == f.name for name, f in g.FAMILIES.items())
    assert g.FAMILY_ADDRESSES == tuple((f.match, f.addresses) for f in g.FAMILIES.values())
    assert dict(g.FAMILY_CONTAINERS) == {n: f.containers for n, f in g.FAMILIES.items()}
    assert dict(g.FAMILY_LOADING) == {n: f.loading for n, f in g.FAMILIES.items()}
    assert dict(g.FAMILY_FORWARD) == {n: f.forward for n, f in g.FAMILIES.items()}
    assert dict(g.FAMILY_CHECKS) == {n: f.checks for n, f in g.FAMILIES.items()}
    assert gemma["attentions_output"].module == "post_attention_layernorm"
    assert gemma["attentions_output"].order == g.DEFAULT_ADDRESSES["attentions_output"].order
    assert gemma["attentions_output"].select is None


def test_importing_generated_does_not_import_torch() -> None:
    code = (
        "import sys, causalab_mini.generated as g; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
        "print(len(g.DEFAULT_ADDRESSES), len(g.COMPONENTS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["29", "33"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_generated_files_get_the_mode_a_plain_write_gives(tmp_path: Path, umask: int) -> None:
    import os
    import stat

    old = os.umask(umask)
    try:
        result = cli("gen", "--out", str(tmp_path / "generated"))
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    written = sorted((tmp_path / "generated").glob("*.py"))
    assert written
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = Path(sys.executable).with_name("ruff")
    command = [str(ruff) if ruff.exists() else "ruff", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)


def test_generated_modules_come_out_as_ruff_formats_them() -> None:
    # the committed modules, with the project's ruff settings: format and lint
    check = _ruff("format", "--check", "--diff", "generated")
    assert check.returncode == 0, check.stdout + check.stderr
    lint_ = _ruff("check", "generated")
    assert lint_.returncode == 0, lint_.stdout + lint_.stderr


def test_gen_emits_ruff_formatted_modules_for_any_rows(registry_copy: Path, tmp_path: Path) -> None:
    """The frozen fixture, and rows whose text is hostile, long or wide, are emitted as
    `ruff format` would leave them, without ruff."""
    import json

    edit(
        registry_copy / "places.yaml",
        "    doc: The residual stream entering the block.\n",
        f"    doc: {json.dumps(HOSTILE[2] + ' 漢字' * 40)}\n",
    )
    edit(
        registry_copy / "families/gpt2.yaml", "doc: GPT-2, whose", "doc: 'it''s \"GPT-2\"'\n# whose"
    )
    out = tmp_path / "gen"
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert result.exit_code == 0, result.output
    check = _ruff("format", "--isolated", "--line-length", "100", "--check", "--diff", str(out))
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_emitter_lays_out_values_as_ruff_does(tmp_path: Path) -> None:
    """Random nested values (calls, tuples, mappings, rows, strings of every kind) at
    every width: ruff format changes nothing the emitter wrote."""
    import random

    from causalab_mini.address import Address, Condition, FirstIfTuple, Index, IOType, Unavailable
    from causalab_mini.codegen import emit

    rng = random.Random(20261201)
    alphabet = "abcdefghij_ xyz'\"\\\n\t{}()é漢ᵀ\u0301\x00"

    def text() -> str:
        n = rng.choice([0, 1, 5, 20, 40, 70, 120])
        return "".join(rng.choice(alphabet if rng.random() < 0.3 else "abcdef_ ") for _ in range(n))

    def value(depth: int = 0) -> object:
        r = rng.random()
        if depth > 3 or r < 0.35:
            return rng.choice([None, True, 3, -7, 1.5, float("inf"), text(), IOType.INPUT])
        if r < 0.5:
            return tuple(value(depth + 1) for _ in range(rng.choice([0, 1, 2, 3, 6])))
        if r < 0.65:
            return {text()[:15] or "k": value(depth + 1) for _ in range(rng.choice([0, 1, 2, 4]))}
        if r < 0.8:
            args = [value(depth + 1) for _ in range(rng.choice([0, 1, 2]))]
            kwargs = {f"k{i}": value(depth + 1) for i in range(rng.choice([0, 1, 2, 3]))}
            return emit.call(rng.choice(["F", "RenameConfig"]), *args, **kwargs)
        if r < 0.9:
            reason = Unavailable(Condition("config", config=(("a", 1),)), text())
            return Address(
                module=text()[:30],
                order=rng.randint(-3, 99),
                source=tuple(text()[:20] for _ in range(rng.choice([0, 1, 3]))),
                select=rng.choice([None, Index(rng.choice([0, "x"])), FirstIfTuple()]),
                unavailable=(reason,) * rng.choice([0, 1, 2]),
                doc=text(),
            )
        return emit.tuple_of([emit.ref("TABLE", text()[:20]), value(depth + 1)])

    targets = ["X", "LONG_TABLE_NAME: Final[Mapping[str, Address]]", "Y: Final[tuple[str, ...]]"]
    source = "\n".join(emit.assign(rng.choice(targets), value()) for _ in range(600)) + "\n"
    path = tmp_path / "emitted.py"
    path.write_text(source, encoding="utf-8")
    ast.parse(source)
    check = _ruff("format", "--isolated", "--line-length", "100", "--check", "--diff", str(path))
    assert check.returncode == 0, check.stdout[:4000]


def test_gen_runs_no_formatter(registry_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"registry gen started a process: {args}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    rendered = render(lint(registry_copy)[0])
    assert sorted(rendered) == sorted(generate_modules())


def generate_modules() -> list[str]:
    from causalab_mini.codegen.generate import MODULES

    return list(MODULES)


def test_ruff_is_a_tool_of_developers_not_a_dependency() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("ruff")]
    assert "ruff==0.17.*" in project["optional-dependencies"]["dev"]
    for needed in ("jinja2", "ruamel.yaml", "jsonschema", "click"):
        assert any(d.startswith(needed) for d in project["dependencies"]), needed
