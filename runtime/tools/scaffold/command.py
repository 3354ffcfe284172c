"""The command: ``registry new-family`` and its summary."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from causalab_mini.tools.completion import complete_spec
from causalab_mini.tools.scaffold.build import scaffold
from causalab_mini.tools.scaffold.data import Scaffold, ScaffoldError, Verdict
from causalab_mini.tools.scaffold.loading import family_name, resolve_spec
from causalab_mini.tools.scaffold.writing import Written, preflight, write_scaffold, yaml_scalar

STATUS_STYLE = {
    "default": "green",
    "verified": "bold green",
    "refused": "yellow",
    "unchecked": "dim",
    "ambiguous": "bold red",
    "missing": "bold red",
}


def _where(v: Verdict) -> str:
    if v.status == "verified" and v.fields:
        return ", ".join(f"{k}: {yaml_scalar(val)}" for k, val in v.fields.items())
    if v.status in ("ambiguous",):
        return " | ".join(c.describe() for c in v.choices)
    if v.chosen is not None:
        described: str = v.chosen.describe()
        return described
    return ""


def print_summary(sc: Scaffold, written: Written | None) -> None:
    """The findings: a rich table on a terminal, plain text when piped."""
    title = (
        f"{sc.spec}: {sc.model_class}, {sc.num_layers} layers, block "
        f"{sc.structure or 'undecided'}"
        + (" (verified)" if sc.structure else f" ({sc.structure_evidence})")
    )
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, title_justify="left", show_lines=False)
        table.add_column("place")
        table.add_column("status")
        table.add_column("where / row")
        table.add_column("check")
        for v in sc.verdicts.values():
            style = STATUS_STYLE.get(v.status, "")
            table.add_row(
                v.place,
                f"[{style}]{v.status}[/]",
                _where(v),
                v.check or v.evidence[:80],
            )
        Console().print(table)
    else:
        click.echo(title)
        width = max(len(name) for name in sc.verdicts)
        wheres = {name: _where(v) for name, v in sc.verdicts.items()}
        span = max(len(w) for w in wheres.values())
        for name, v in sc.verdicts.items():
            line = f"  {name:{width}}  {v.status:9}  {wheres[name]:{span}}  {v.check or v.evidence}"
            click.echo(line.rstrip())
    for failure in sc.failures:
        click.echo(f"proof failed: {failure}", err=True)
    if written is None:
        return
    if written.family_file is not None:
        click.echo(f"wrote {written.family_file}")
    if written.rule_file is not None:
        click.echo(
            f"added a rule to {written.rule_file}: {sc.structure} for model_types [{sc.model_type}]"
        )


@click.command("new-family")
@click.argument("spec", shell_complete=complete_spec)
@click.option("--family", default=None, help="The family's name (default: the model type).")
@click.option(
    "--registry",
    "registry_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Registry to add the family to (default: the package's own registry/).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=None,
    help="Write the family file here instead ('-' prints it); touches no registry.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file; add beside a family.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def new_family_command(
    spec: str,
    family: str | None,
    registry_dir: Path | None,
    out: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Scaffold registry/families/<family>.yaml for SPEC, with verified rows only.

    SPEC is a model type (starcoder2), tiny:<model_type>[?key=value...], or a local
    checkpoint directory (a tiny random instance of its model type is built, with its
    boolean config values). Every place is tried on that instance against the
    registry's identities and transformers' own outputs; rows that pass are written,
    places where none or several pass are left as commented-out choices marked
    DECIDE. Into a registry it also adds the verified block structure's rule to
    block_structures.yaml, then runs `registry lint` on it.

    \b
    Example:
      registry new-family starcoder2
      registry new-family tiny:olmo3 --registry my_rows/
      registry new-family tiny:cohere --out - --json
    """
    from causalab_mini.codegen.lint import default_registry, lint

    sc, written = _scaffold_and_write(spec, family, registry_dir, out, force)
    diagnostics: list[Any] = []
    linted = written.family_file is not None and (out is None or registry_dir is not None)
    if linted:
        _, diagnostics = lint(registry_dir or default_registry())
    if as_json:
        click.echo(json.dumps(_json_report(sc, written, diagnostics if linted else None), indent=2))
        return
    _text_report(sc, written, diagnostics if linted else None)


def _scaffold_and_write(
    spec: str, family: str | None, registry_dir: Path | None, out: Path | None, force: bool
) -> tuple[Scaffold, Written]:
    """Refuse before any model is built, scaffold, write; a ScaffoldError exits 1."""
    try:
        _, model_type = resolve_spec(spec)
        preflight(
            family_name(model_type, family),
            model_type,
            registry_dir=registry_dir,
            out=out,
            force=force,
        )
        sc = scaffold(spec, family)
        written = write_scaffold(sc, registry_dir=registry_dir, out=out, force=force)
    except ScaffoldError as exc:
        click.echo(f"registry new-family: {exc}", err=True)
        sys.exit(1)
    return sc, written


def _json_report(sc: Scaffold, written: Written, diagnostics: list[Any] | None) -> dict[str, Any]:
    """The findings and what was written (``diagnostics``: None when nothing was linted)."""
    data: dict[str, Any] = sc.to_json()
    data["written"] = {
        "family_file": str(written.family_file) if written.family_file else None,
        "rule_file": str(written.rule_file) if written.rule_file else None,
        "lint": [d.to_json() for d in diagnostics] if diagnostics is not None else None,
    }
    if written.family_file is None:
        data["written"]["text"] = written.text
    return data


def _text_report(sc: Scaffold, written: Written, diagnostics: list[Any] | None) -> None:
    """The file (--out -) or the summary, the places to decide, lint's findings."""
    if written.family_file is None:  # --out -: the file on stdout, nothing else there
        click.echo(written.text, nl=False)
    else:
        print_summary(sc, written)
    undecided = sc.undecided
    if undecided:
        click.echo(
            err=written.family_file is None,
            message=f"{len(undecided)} place{'s' if len(undecided) != 1 else ''} to decide (DECIDE in "
            f"the file): {', '.join(v.place for v in undecided)}",
        )
    if written.family_file is None:
        return
    if diagnostics is not None:
        for diag in diagnostics:
            click.echo(str(diag))
        click.echo(
            "registry lint: clean"
            if not diagnostics
            else f"registry lint: {len(diagnostics)} errors"
        )
    click.echo("next: review the file, then `registry gen`")
