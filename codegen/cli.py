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


@main.command("model")
@click.argument("spec")
@click.option(
    "--layer", type=int, default=None, help="Answer for one layer (default: every layer)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option(
    "--eager", is_flag=True, help="Load with eager attention and attention probabilities enabled."
)
@click.option("--strict", is_flag=True, help="Exit 1 if any place is refused.")
def model_command(spec: str, layer: int | None, as_json: bool, eager: bool, strict: bool) -> None:
    """Load a model and print every place as ok or refused, with the reason.

    SPEC is tiny:<model_type> (a tiny random checkpoint built locally, no download),
    a local directory, or a hub id.

    \b
    Example:
      registry model tiny:llama
      registry model tiny:gpt_neox --layer 1 --json
    """
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from causalab_mini.internals import PlaceUnavailable
    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tiny import TinyBuildError

    for noisy in ("nnterp", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    try:
        model = StandardizedTransformer(spec, enable_attention_probs=eager)
    except (TinyBuildError, OSError, ValueError) as exc:
        click.echo(f"registry model: cannot load {spec}: {exc}", err=True)
        sys.exit(1)
    internals = model.internals
    try:
        status = internals.status(layer)
    except (IndexError, PlaceUnavailable) as exc:
        click.echo(f"registry model: {exc}", err=True)
        sys.exit(2)
    rows = []
    for name, reason in status.items():
        place = internals[name]
        where = place.address.describe()
        if reason is None and layer is not None and place.per_layer:
            where = place.address_at(layer).describe()
        rows.append({"place": name, "ok": reason is None, "where": where, "reason": reason})
    header = {
        "spec": spec,
        "model_class": internals.model_class,
        "layers": internals.num_layers,
        "block_structure": model.block_structure,
        "families": list(model.families),
        "padding_side": getattr(model.tokenizer, "padding_side", None),
    }
    if as_json:
        click.echo(json.dumps({**header, "layer": layer, "places": rows}, indent=2))
    else:
        families = ", ".join(model.families) or "defaults only"
        click.echo(
            f"{spec} via nnterp: {internals.model_class}, {internals.num_layers} layers, block "
            f"{model.block_structure}, family {families}, padding_side={header['padding_side']}"
        )
        width = max(len(r["place"]) for r in rows)
        for r in rows:
            mark = "ok" if r["ok"] else "--"
            detail = r["where"] if r["ok"] else r["reason"]
            click.echo(f"  {r['place']:{width}}  {mark}   {detail}")
    if strict and any(not r["ok"] for r in rows):
        sys.exit(1)
