"""The codegen commands of `registry`: `registry lint` and `registry gen`. The group
that holds them and the tools' commands is ``causalab_mini.tools.cli``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .diagnostics import Diagnostic
from .lint import default_registry, lint

REGISTRY_OPTION = click.option(
    "--registry",
    "registry_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Registry directory to read (default: the package's own registry/).",
)


def _print_diagnostics(diags: list[Diagnostic], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps([d.to_json() for d in diags], indent=2))
        return
    if diags and sys.stdout.isatty():  # a terminal: the same lines, in colour
        from rich.console import Console
        from rich.markup import escape

        console = Console(highlight=False)
        for diag in diags:
            where = f"{diag.path}:{diag.line}:{diag.col}:"
            console.print(
                f"[bold]{escape(where)}[/] [red]{diag.code}[/] [cyan]\\[{escape(diag.row)}][/] "
                f"{escape(diag.message)}",
                soft_wrap=True,
            )
    else:
        for diag in diags:
            click.echo(str(diag))
    if diags:
        noun = "error" if len(diags) == 1 else "errors"
        click.echo(f"{len(diags)} {noun}; the registry was not changed.", err=True)


@click.command("lint")
@REGISTRY_OPTION
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: path:line:col: CODE [row] message; json: a list.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
def lint_command(registry_dir: Path | None, fmt: str, as_json: bool) -> None:
    """Check every registry file: schema, then cross-row rules. Exit 1 on any error.

    \b
    Example:
      registry lint
      registry lint --registry my_rows/ --format json
    """
    fmt = "json" if as_json else fmt
    _, diags = lint(registry_dir)
    _print_diagnostics(diags, fmt)
    if fmt == "text" and not diags:
        root = registry_dir or default_registry()
        click.echo(f"{root}: clean", err=True)
    sys.exit(1 if diags else 0)


@click.command("gen")
@REGISTRY_OPTION
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write the modules (default: the package's generated/).",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if any file is stale or orphaned."
)
@click.option("--json", "as_json", is_flag=True, help="Report the files as JSON.")
def gen_command(
    registry_dir: Path | None, out_dir: Path | None, check: bool, as_json: bool
) -> None:
    """Compile the registry into typed Python modules in generated/.

    Refuses to write while lint fails; writes only files whose bytes change. On the
    package's own registry it also writes docs/places.md and docs/families.md.

    \b
    Example:
      registry gen
      registry gen --check            # in CI
      registry gen --registry my_rows/ --out my_pkg/generated/
    """
    from .generate import (
        GenerationError,
        default_docs,
        default_output,
        plan,
        plan_docs,
        render_all,
        write,
        write_docs,
    )

    registry, diags = lint(registry_dir)
    if diags:
        _print_diagnostics(diags, "text")
        click.echo(
            "registry gen: lint fails; fix the errors above first (see `registry lint`).", err=True
        )
        sys.exit(1)
    try:
        out = out_dir or default_output()
        # the repository's docs/, only when generating the package's own registry
        docs_dir = default_docs() if registry_dir is None and out_dir is None else None
        rendered, docs = render_all(registry, docs=docs_dir is not None)
        if check:
            todo = plan(rendered, out)
            doc_todo = plan_docs(docs, docs_dir) if docs_dir is not None else None
            if as_json:
                _echo_gen_json(out, docs_dir, todo, doc_todo, check=True)
                sys.exit(0 if todo.clean and (doc_todo is None or doc_todo.clean) else 1)
            if todo.clean and (doc_todo is None or doc_todo.clean):
                click.echo(f"{out}: up to date ({len(rendered)} files)", err=True)
                sys.exit(0)
            command = "registry gen"
            if registry_dir is not None:
                command += f" --registry {registry_dir}"
            if out_dir is not None:
                command += f" --out {out_dir}"
            for name in todo.stale:
                click.echo(f"{out / name}: is not up to date. Run `{command}`.")
            for name in todo.missing:
                click.echo(f"{out / name}: is missing. Run `{command}`.")
            for name in todo.orphans:
                click.echo(
                    f"{out / name}: is not generated from the registry (orphan). "
                    f"Run `{command}` to remove it, or move it out of {out}."
                )
            if doc_todo is not None and docs_dir is not None:
                for name in doc_todo.stale:
                    click.echo(f"{docs_dir / name}: is not up to date. Run `{command}`.")
                for name in doc_todo.missing:
                    click.echo(f"{docs_dir / name}: is missing. Run `{command}`.")
            sys.exit(1)
        done = write(rendered, out)
        doc_done = write_docs(docs, docs_dir) if docs_dir is not None else None
    except GenerationError as exc:
        click.echo(f"registry gen: {exc}", err=True)
        sys.exit(1)
    if as_json:
        _echo_gen_json(out, docs_dir, done, doc_done, check=False)
        return
    changed = [*done.missing, *done.stale]
    for name in changed:
        click.echo(f"wrote {out / name}")
    for name in done.orphans:
        click.echo(f"removed {out / name}")
    doc_changed = [*doc_done.missing, *doc_done.stale] if doc_done is not None else []
    for name in doc_changed:
        click.echo(f"wrote {docs_dir or Path('docs')}/{name}")
    if not changed and not done.orphans and not doc_changed:
        click.echo(f"{out}: up to date ({len(rendered)} files)", err=True)


def _echo_gen_json(
    out: Path, docs_dir: Path | None, todo: Any, doc_todo: Any, *, check: bool
) -> None:
    """`registry gen --json`: what is (or was) stale, missing or orphaned, by path."""
    key = ("stale", "missing", "orphans") if check else ("written", "written", "removed")
    report: dict[str, Any] = {"out": str(out), "docs": str(docs_dir) if docs_dir else None}
    report["check"] = check
    files: dict[str, list[str]] = {k: [] for k in dict.fromkeys(key)}
    for plan_, root in ((todo, out), (doc_todo, docs_dir)):
        if plan_ is None or root is None:
            continue
        files[key[0]] += [str(root / n) for n in plan_.stale]
        files[key[1]] += [str(root / n) for n in plan_.missing]
        files[key[2]] += [str(root / n) for n in plan_.orphans]
    report.update(files)
    report["clean"] = not any(files.values()) if check else True
    click.echo(json.dumps(report, indent=2))
