"""The library and the tools apart: what a research user imports loads no tool, the
core never imports the tools, and both entry points list the same commands."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import REPO

CORE = sorted(p for p in (REPO / "runtime").glob("*.py"))


def test_importing_the_model_class_loads_no_tool() -> None:
    code = (
        "import sys\n"
        "from causalab_mini import StandardizedTransformer\n"
        "from causalab_mini.components import Plan, locate\n"
        "loaded = sorted(m for m in sys.modules if m.startswith("
        "('causalab_mini.tools', 'causalab_mini.codegen')))\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_core_imports_no_tool_and_no_codegen() -> None:
    # the one exception: a `tiny:` spec is built by the tiny builder, imported when
    # (and only when) a model is constructed from one
    allowed = {("spec.py", "causalab_mini.tools.tiny")}
    for path in CORE:
        for module in _imports(path):
            if module.startswith(("causalab_mini.tools", "causalab_mini.codegen")):
                assert (path.name, module) in allowed, f"{path.name} imports {module}"


def test_codegen_imports_no_tool_and_no_core_beyond_the_row_types() -> None:
    for path in sorted((REPO / "codegen").glob("*.py")):
        if path.name == "__main__.py":  # the entry point runs the tools' command group
            continue
        for module in _imports(path):
            if module.startswith("causalab_mini.") and not module.startswith(
                "causalab_mini.codegen"
            ):
                # the row types, and the error root every exception derives from
                assert module in {"causalab_mini.address", "causalab_mini.errors"}, (
                    f"codegen/{path.name} imports {module}"
                )


def test_both_entry_points_list_the_same_commands() -> None:
    def commands(*argv: str) -> list[str]:
        done = subprocess.run([*argv, "--help"], capture_output=True, text=True, check=True)
        listing = done.stdout.split("Commands:", 1)[1]
        return [line.split()[0] for line in listing.strip().splitlines()]

    registry = str(Path(sys.executable).with_name("registry"))
    assert commands(sys.executable, "-m", "causalab_mini.codegen") == commands(registry)
    assert commands(registry) == [
        "lint",
        "gen",
        "model",
        "sweep",
        "new-family",
        "diagram",
        "positions",
        "validate",
        "explain",
        "run",
        "tokens",
    ]


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of ``path``'s code, docstrings left out (comments are not
    constants)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            docs.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_model_fact_is_spelled_in_runtime_python() -> None:
    """Every model type and model class the registry names, and every block structure,
    lives in the registry: runtime Python (library and tools) never spells one in its
    code, so a family that differs is a YAML row, not a branch."""
    from causalab_mini.generated import BLOCK_STRUCTURE_RULES, BLOCK_STRUCTURES, FAMILY_MATCH
    from causalab_mini.generated.tiny import TINY_NOT_BUILDABLE, TINY_OVERRIDES

    names = set(BLOCK_STRUCTURES) | set(TINY_OVERRIDES) | set(TINY_NOT_BUILDABLE)
    for match in [*FAMILY_MATCH.values(), *(rule.match for rule in BLOCK_STRUCTURE_RULES)]:
        names |= set(match.model_types) | set(match.classes)
    assert len(names) > 200
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in sorted((REPO / "runtime").rglob("*.py"))
        for line, value in _strings(path)
        if value in names
    ]
    assert not found, found


def _import_graph() -> dict[str, set[str]]:
    """Every module of the package (library and tools) -> the package's modules it
    imports, at module level or inside a function (a package's own submodules
    re-exported by its __init__ aside: that is a table of names, not a dependency)."""
    root = REPO / "runtime"
    known: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        known[".".join(["causalab_mini", *parts])] = path
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        graph[name] = {
            m for m in found if m in known and m != name and not m.startswith(name + ".")
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_back_into_its_importers() -> None:
    graph = _import_graph()
    assert len(graph) > 40 and "causalab_mini.plan" in graph["causalab_mini.interchange"]
    assert _cycles(graph) == [], "an import cycle among the package's modules"
    # the detector finds one where there is one
    looped = {**graph, "causalab_mini.lower": graph["causalab_mini.lower"] | {"causalab_mini.plan"}}
    assert _cycles(looped)


CORE_LIMIT = 60  # lines a function of the core (runtime/ outside runtime/tools/) may take
TOOLS_LIMIT = 66  # the tools': half of their largest function before the split (133)


def _long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """The functions and methods (nested ones too) of ``source`` longer than ``limit``
    lines, from ``def`` to their last line (decorators left out), with their lengths."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def _over(paths: list[Path], limit: int) -> list[str]:
    return [
        f"{path.relative_to(REPO)}: {name} is {length} lines (at most {limit})"
        for path in paths
        for name, length in _long_functions(path.read_text(encoding="utf-8"), limit)
    ]


def test_the_length_check_finds_a_long_function() -> None:
    body = "".join(f"x{i} = {i}\n" for i in range(CORE_LIMIT - 1))
    assert _long_functions("def f():\n" + textwrap.indent(body, "    "), CORE_LIMIT) == []
    longer = "def f():\n" + textwrap.indent(body + "return 0\n", "    ")
    assert _long_functions(longer, CORE_LIMIT) == [("f", CORE_LIMIT + 1)]
    method = "class C:\n    def f(self):\n        def g():\n" + textwrap.indent(
        body + "return 0\n", " " * 12
    )
    assert _long_functions(method, CORE_LIMIT) == [("f", CORE_LIMIT + 2), ("g", CORE_LIMIT + 1)]


def test_no_function_of_the_core_is_over_60_lines() -> None:
    assert len(CORE) > 20
    assert _over(CORE, CORE_LIMIT) == []


def test_no_function_of_the_tools_is_over_66_lines() -> None:
    tools = sorted((REPO / "runtime" / "tools").rglob("*.py"))
    assert len(tools) > 20
    assert _over(tools, TOOLS_LIMIT) == []


def _private_uses(path: Path, package: list[str]) -> list[str]:
    """Where ``path`` takes a private name (``_x``) from another module of the package:
    ``from .m import _x``, ``m._x`` on a module it imported, or ``internals._x`` (the
    model's internals reached into from outside ``internals.py``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if not module.startswith("causalab_mini"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.name}:{node.lineno} imports {module}.{alias.name}")
                if not node.module or module.endswith(f".{alias.name}"):
                    modules.add(alias.asname or alias.name)
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("causalab_mini"):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__"):
            continue
        owner = node.value
        name = owner.id if isinstance(owner, ast.Name) else None
        if isinstance(owner, ast.Attribute):
            name = owner.attr
        if name in modules and name is not None and name != "self":
            found.append(f"{path.name}:{node.lineno} uses {name}.{attr}")
        elif name in ("internals", "_internals"):
            found.append(f"{path.name}:{node.lineno} uses {name}.{attr}")
    return found


def test_no_private_name_crosses_a_module() -> None:
    found: list[str] = []
    for root, package in (
        (REPO / "runtime", ["causalab_mini"]),
        (REPO / "codegen", ["causalab_mini", "codegen"]),
    ):
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("").parts
            parent = [*package, *rel[:-1]]
            if path.name == "__init__.py":
                parent = [*package, *rel[:-1]]
            found += [f"{path.relative_to(REPO)}: {u}" for u in _private_uses(path, parent)]
    assert found == [], "private names used across modules:\n" + "\n".join(found)


def test_the_private_name_check_finds_one() -> None:
    source = (
        "from .edits import _runner\nfrom . import plain\nplain._whole(1)\n"
        "self._internals._layer(1)\n"
    )
    probe = REPO / "tests" / "_private_probe.py"
    try:
        probe.write_text(source)
        found = _private_uses(probe, ["causalab_mini"])
    finally:
        probe.unlink()
    assert len(found) == 3, found
