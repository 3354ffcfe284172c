"""The runtime's commands, added to the `registry` group: `registry model`."""

from __future__ import annotations

import json
import sys

import click

from causalab_mini.codegen.cli import main as _group

__all__ = ["main"]

main: click.Group = _group


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

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]

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
