"""`registry gen`: deterministic, atomic, checked, and unable to emit code from data."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from causalab_mini.codegen.generate import HEADER_MARK, default_output, render
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


def test_every_file_opens_with_do_not_edit_and_its_sources() -> None:
    registry, _ = lint()
    for name, text in render(registry).items():
        first = text.splitlines()[0]
        assert first.startswith(HEADER_MARK), name
        assert "sha256" in first and "run `registry gen`" in first
        assert "timestamp" not in text.lower()
    first = render(registry)["places.py"].splitlines()[0]
    import hashlib

    digest = hashlib.sha256((registry.root / "places.yaml").read_bytes()).hexdigest()
    assert f"places.yaml (sha256 {digest})" in first


def test_writes_only_what_changed(registry_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli("gen", "--registry", str(registry_copy), "--out", str(out))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    edit(registry_copy / "interiors.yaml", "The queries as", "The query vectors as")
    result = cli("gen", "--registry", str(registry_copy), "--out", str(out))
    assert result.exit_code == 0
    changed = {p.name for p in out.iterdir() if p.stat().st_mtime_ns != before[p.name]}
    assert changed == {"interiors.py", "components.py", "__init__.py"}  # their sources
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
    gemma = dict(g.FAMILY_ADDRESSES[g.FAMILIES.index("gemma2")][1])
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
    assert out.stdout.split() == ["22", "21"]


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
