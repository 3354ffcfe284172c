"""The sessions people run: `nox -s lint typecheck registry tests`; `fuzz` and `wide`
run the tiers the README's test command leaves out (CI runs them in .ci/run)."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "typecheck", "registry", "tests"]

# pip takes this torch from the machine's disk (a CPU build); an unpinned torch would
# pull a multi-GB CUDA build.
TORCH = "torch==2.13.0"
TRANSFORMER_LENS = "transformer-lens==4.3.0"
CODEGEN_DEPS = [
    "ruamel.yaml>=0.18",
    "jsonschema>=4.20",
    "jinja2>=3.1",
    "click>=8.1",
    "rich>=13",
    "filelock>=3.12",
    "packaging>=23",
]


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: style and lint of the hand-written code and the generated modules."""
    session.install("ruff==0.17.*")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the codegen, all of runtime/ (the library and its tools) and the generated tables, in
    the environment the tests run in (the same stubs and libraries as `.[dev]`: an
    environment with fewer makes other errors appear, or `type: ignore`s unused)."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.run(
        "mypy",
        "--strict",
        "codegen",
        "generated",
        "runtime",
    )


@nox.session
def registry(session: nox.Session) -> None:
    """`registry lint` and `registry gen --check`: the rows are valid and generated/ is fresh."""
    session.install(*CODEGEN_DEPS)
    session.install("--no-deps", "-e", ".")
    session.run("registry", "lint")
    session.run("registry", "gen", "--check")


@nox.session
def tests(session: nox.Session) -> None:
    """The README's test command: every test on the representative models (the
    markers fuzz, typecheck and wide are left out; see pyproject.toml)."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", *session.posargs)


# The nnsight releases the project supports (pyproject: nnsight>=0.6,<0.9), newest last.
NNSIGHT = ["0.6.3", "0.7.0", "0.8.1"]


@nox.session
def fuzz(session: nox.Session) -> None:
    """hypothesis over whole registries: real rows with one value swapped, through the
    full lint (marker fuzz)."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", "-q", "-m", "fuzz", *session.posargs)


@nox.session
def wide(session: nox.Session) -> None:
    """Every model type the registry names, beyond the representatives the README's
    command runs (marker wide)."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", "-q", "-m", "wide", *session.posargs)


@nox.session
@nox.parametrize("nnsight", NNSIGHT)
@nox.parametrize("transformers", ["5.17.0", "5.24.0", "5.25.0"])
def drift(session: nox.Session, nnsight: str, transformers: str) -> None:
    """The semantic suite under nnsight 0.6, 0.7 and 0.8 and an older and the newest
    transformers 5.x: a row whose operations moved fails here, with its op list."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    session.install(f"nnsight=={nnsight}", f"transformers=={transformers}")
    # the semantic suite (marker semantic): identities, oracles, interiors, the rows'
    # ops, on every model type the registry names (those this transformers lacks skip)
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:warnings", "-m", "semantic", *session.posargs
    )


@nox.session
def coverage(session: nox.Session) -> None:
    """Sweep every causal-LM architecture and regenerate docs/coverage.md."""
    session.install(TORCH)
    session.install("-e", ".")
    session.run(
        "registry",
        "sweep",
        "--jobs",
        "2",
        "--out",
        "docs/coverage.json",
        "--doc",
        "docs/coverage.md",
        *session.posargs,
    )


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks, every figure a ratio against a baseline of the same run (tracing
    overhead, resolve cost on a 70B-class meta model, tooling speed): writes bench.json
    and prints the table. Not a test: nothing here fails on a slow machine.

    ``nox -s bench -- --nnsight 0.7.0,0.8.1`` runs the tracing part once per nnsight
    release (installed in turn), writes bench-nnsight-<version>.json each, and prints
    their figures side by side, the first as the baseline."""
    session.install(TORCH)
    session.install("-e", ".[dev]")
    # the patching grid's third engine: this venv's only, never a dependency
    session.install(TRANSFORMER_LENS)
    args = list(session.posargs)
    versions: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--nnsight" or arg.startswith("--nnsight="):
            value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
            versions = [v for v in value.split(",") if v]
            del args[i : i + (1 if "=" in arg else 2)]
            break
    if not versions:
        session.run("python", "tests/bench/bench.py", "--out", "bench.json", *args)
        return
    outs = []
    for version in versions:
        session.install(f"nnsight=={version}")
        out = f"bench-nnsight-{version}.json"
        session.run("python", "tests/bench/bench.py", "--only", "tracing", "--out", out, *args)
        outs.append(out)
    session.run("python", "tests/bench/bench.py", "--compare", *outs)


@nox.session(name="transformer_lens")
def transformer_lens(session: nox.Session) -> None:
    """Every TransformerLens hook registry/transformer_lens.yaml maps, read through
    TransformerLens's TransformerBridge and through the project on the same tiny
    checkpoint, equal within 1e-5 relative (tests/interop/tl_bridge.py; the figures
    are in docs/interop.md). transformer_lens lives in this session's venv only, never
    a dependency. ``nox -s transformer_lens -- llama gemma2`` compares those only."""
    session.install(TORCH)
    session.install("-e", ".")
    session.install(TRANSFORMER_LENS)
    session.run("python", "tests/interop/tl_bridge.py", "--out", "tl-bridge.json", *session.posargs)
