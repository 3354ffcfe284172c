"""The `registry` (alias `causalab-mini`) command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    for diag in diags:
        click.echo(str(diag))
    if diags:
        noun = "error" if len(diags) == 1 else "errors"
        click.echo(f"{len(diags)} {noun}; the registry was not changed.", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="causalab-mini")
def main() -> None:
    """causalab-mini: named places inside transformer language models.

    \b
    Example:
      registry lint
      registry gen --check
    """


@main.command("lint")
@REGISTRY_OPTION
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: path:line:col: CODE [row] message; json: a list.",
)
def lint_command(registry_dir: Path | None, fmt: str) -> None:
    """Check every registry file: schema, then cross-row rules. Exit 1 on any error.

    \b
    Example:
      registry lint --registry my_rows/ --format json
    """
    _, diags = lint(registry_dir)
    _print_diagnostics(diags, fmt)
    if fmt == "text" and not diags:
        root = registry_dir or default_registry()
        click.echo(f"{root}: clean", err=True)
    sys.exit(1 if diags else 0)


@main.command("gen")
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
def gen_command(registry_dir: Path | None, out_dir: Path | None, check: bool) -> None:
    """Compile the registry into typed Python modules in generated/.

    Refuses to write while lint fails; writes only files whose bytes change.

    \b
    Example:
      registry gen
      registry gen --check            # in CI
      registry gen --registry my_rows/ --out my_pkg/generated/
    """
    from .generate import GenerationError, default_output, plan, render, write

    registry, diags = lint(registry_dir)
    if diags:
        _print_diagnostics(diags, "text")
        click.echo(
            "registry gen: lint fails; fix the errors above first (see `registry lint`).", err=True
        )
        sys.exit(1)
    try:
        out = out_dir or default_output()
        rendered = render(registry)
        if check:
            todo = plan(rendered, out)
            if todo.clean:
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
            sys.exit(1)
        done = write(rendered, out)
    except GenerationError as exc:
        click.echo(f"registry gen: {exc}", err=True)
        sys.exit(1)
    changed = [*done.missing, *done.stale]
    for name in changed:
        click.echo(f"wrote {out / name}")
    for name in done.orphans:
        click.echo(f"removed {out / name}")
    if not changed and not done.orphans:
        click.echo(f"{out}: up to date ({len(rendered)} files)", err=True)
