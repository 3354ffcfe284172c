"""The document verbs of `causalab-mini`: `validate DOC`, `explain DOC`, `run DOC --out
DIR`, and `tokens SPEC TEXT` (the frame of a text; `registry positions` is the same
command under its first name)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from causalab_mini.tools.completion import complete_spec
from causalab_mini.tools.positions import positions_command

__all__ = ["explain_command", "run_command", "tokens_command", "validate_command"]

tokens_command = click.Command(
    "tokens",
    callback=positions_command.callback,
    params=list(positions_command.params),
    help=(positions_command.help or "").replace("registry positions", "registry tokens")
    + "\n\n(`registry positions` is the same command under its first name.)",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")

_DOC = click.argument("doc", type=click.Path(dir_okay=False, path_type=Path))
_TRUST = click.option(
    "--trust-remote-code",
    is_flag=True,
    help="Let the model's own code run (a checkpoint that ships Python). Only this flag "
    "turns it on: a document never can.",
)


def _fail(exc: Any, as_json: bool = False) -> None:
    """Print a document's problems (every one, one a line) and exit 1."""
    if as_json:
        issues = [vars(i) for i in getattr(exc, "issues", [])] or [{"message": str(exc)}]
        click.echo(json.dumps({"valid": False, "issues": issues}, indent=2))
        sys.exit(1)
    for issue in getattr(exc, "issues", None) or [exc]:
        click.echo(str(issue), err=True)
    count = len(getattr(exc, "issues", None) or [exc])
    click.echo(f"{count} problem{'s' if count != 1 else ''}; nothing ran", err=True)
    sys.exit(1)


@click.command("validate")
@_DOC
@click.option(
    "--static",
    is_flag=True,
    help="Check without loading the model (no layer, head, position or token checks).",
)
@_TRUST
@_JSON
def validate_command(doc: Path, static: bool, trust_remote_code: bool, as_json: bool) -> None:
    """Check DOC: its schema, names, data, safety and (unless --static) its layers, heads,
    positions and answer tokens on its model. Every problem at once, as
    path:line:col: CODE message; exit 1 if any.

    \b
    Example:
      causalab-mini validate documents/activation_patching.yaml
      registry validate documents/logit_lens.yaml --static
    """
    from causalab_mini.documents import DocumentError, load
    from causalab_mini.documents.cells import forwards
    from causalab_mini.documents.experiment import build
    from causalab_mini.documents.validate import static_issues

    try:
        source = load(doc)
        if static:
            issues, _ = static_issues(source)
            if issues:
                raise DocumentError(issues)
            click.echo(json.dumps({"valid": True}) if as_json else f"{doc}: valid (static)")
            return
        exp = build(source, trust_remote_code=trust_remote_code)
    except DocumentError as exc:
        _fail(exc, as_json)
        return
    refused = sum(c.refused is not None for c in exp.cells)
    if as_json:
        outcome = {"valid": True, "cells": len(exp.cells), "refused": refused}
        click.echo(json.dumps({**outcome, "forwards": forwards(exp)}))
        return
    click.echo(
        f"{doc}: valid on {exp.checkpoint}: {len(exp.cells)} cells ({refused} refused), "
        f"{forwards(exp)} forwards"
    )


@click.command("explain")
@_DOC
@click.option(
    "--model",
    "spec",
    default=None,
    shell_complete=complete_spec,
    help="Explain it on this model instead of the document's (tiny:gpt2, a hub id "
    "or a checkpoint directory).",
)
@click.option("--rows", default=3, show_default=True, help="How many rows' frames to show.")
@_TRUST
@_JSON
def explain_command(
    doc: Path, spec: str | None, rows: int, trust_remote_code: bool, as_json: bool
) -> None:
    """Say what running DOC will do, without running the model: each site's place per
    layer (or why the model refuses it), each row's frame with the positions marked,
    the cells (refused ones with why) and the number of forwards.

    \b
    Example:
      causalab-mini explain documents/activation_patching.yaml
      causalab-mini explain documents/logit_lens.yaml --model tiny:gpt2
      registry explain documents/head_patching.yaml --json
    """
    from causalab_mini.documents import DocumentError, load
    from causalab_mini.documents.experiment import build
    from causalab_mini.documents.explain import explain, explained

    try:
        exp = build(load(doc), spec=spec, trust_remote_code=trust_remote_code)
    except DocumentError as exc:
        _fail(exc, as_json)
        return
    if as_json:
        click.echo(json.dumps(explained(exp), indent=2))
        return
    click.echo(explain(exp, max_rows=rows))


@click.command("run")
@_DOC
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder the results, plots and receipt go to (nothing is written outside it).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the cells an interrupted run of this document finished in --out, and run the rest.",
)
@click.option(
    "--model",
    "spec",
    default=None,
    shell_complete=complete_spec,
    help="Run it on this model instead of the document's.",
)
@_TRUST
@_JSON
def run_command(
    doc: Path, out: Path, resume: bool, spec: str | None, trust_remote_code: bool, as_json: bool
) -> None:
    """Run DOC into --out: results.json, metrics/<metric>.csv, receipt.json and
    plots/*.png (a heatmap per layer x position or layer x head grid, a line per layer
    sweep). Every check runs before anything is written.

    \b
    Example:
      causalab-mini run documents/activation_patching.yaml --out runs/patching
      causalab-mini run documents/logit_lens.yaml --out runs/lens --model tiny:gpt2
      registry run documents/ablation.yaml --out runs/ablation --resume
    """
    from causalab_mini.documents import DocumentError, load
    from causalab_mini.documents.run import run

    try:
        source = load(doc)
        with _progress() as (started, advance):
            results = run(
                source,
                out,
                resume=resume,
                spec=spec,
                trust_remote_code=trust_remote_code,
                on_start=started,
                on_cell=advance,
            )
    except DocumentError as exc:
        _fail(exc, as_json)
        return
    cells = results["cells"]
    refused = sum(c["status"] == "refused" for c in cells)
    nonfinite = sum(c["status"] == "nonfinite" for c in cells)
    if as_json:
        summary = {"out": str(out), "cells": len(cells), "refused": refused}
        summary["nonfinite"] = nonfinite
        click.echo(json.dumps({**summary, "written": results["written"]}, indent=2))
        return
    bad = f", {nonfinite} with non-finite logits" if nonfinite else ""
    click.echo(f"{len(cells)} cells ({refused} refused{bad}) -> {out}")
    for path in results["written"]:
        click.echo(f"  {path}")


class _progress:
    """A rich progress bar over the cells (on stderr; quiet when not a terminal)."""

    def __enter__(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            disable=not console.is_terminal,
        )
        self.task: Any = None
        self.bar.__enter__()

        def started(total: int, done: int) -> None:
            self.task = self.bar.add_task("cells", total=total, completed=done)

        def advance(record: dict[str, Any]) -> None:
            self.bar.update(self.task, advance=1, description=record["key"][:40])

        return started, advance

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)
