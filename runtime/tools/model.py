"""`registry model SPEC`: load a model and print every component (or place) as ok or
refused, with the reason."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from causalab_mini.tools.completion import complete_spec

__all__ = ["model_command"]


@click.command("model")
@click.argument("spec", shell_complete=complete_spec)
@click.option(
    "--layer", type=int, default=None, help="Answer for one layer (default: every layer)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option(
    "--eager", is_flag=True, help="Load with eager attention and attention probabilities enabled."
)
@click.option("--strict", is_flag=True, help="Exit 1 if anything is refused.")
@click.option(
    "--places",
    is_flag=True,
    help="List the Address rows of model.internals instead of the components.",
)
@click.option(
    "--diagram",
    "diagram_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw the block (of --layer, default 0) as SVG to this file.",
)
def model_command(
    spec: str,
    layer: int | None,
    as_json: bool,
    eager: bool,
    strict: bool,
    places: bool,
    diagram_path: Path | None,
) -> None:
    """Load a model and print every component as ok (with its width, and the
    operation for an interior) or refused (with the reason).

    SPEC is tiny:<model_type> (a tiny random checkpoint built locally, no download),
    a local directory, or a hub id.

    \b
    Example:
      registry model tiny:llama
      registry model tiny:gpt_neox --layer 1 --json
      registry model tiny:gemma2 --eager --places
      registry model tiny:gpt_neox --diagram block.svg
    """
    model = _load(spec, eager)
    internals = model.internals
    n = internals.num_layers
    asked = layer
    layer = _layer_in_range(layer, n)
    scope = (
        "every layer"
        if layer is None
        else f"layer {layer}"
        + (f" (--layer {asked} counts from the end)" if asked != layer else "")
    )
    rows = _place_rows(internals, layer) if places else _component_rows(model, layer)
    header = _header(spec, model, scope)
    if diagram_path is not None:
        from causalab_mini.tools.diagram import diagram

        diagram_path.write_text(diagram(model, layer or 0, spec), encoding="utf-8")
        click.echo(f"wrote {diagram_path}", err=True)
    if as_json:
        key = "places" if places else "components"
        click.echo(json.dumps({**header, "layer": layer, key: rows}, indent=2))
    elif sys.stdout.isatty():  # a terminal: a table, in colour (piped: the plain text below)
        _print_table(spec, header, rows, places)
    else:
        _print_plain(spec, model, header, rows, places)
    refused = [str(r["name"]) for r in rows if not r["ok"]]
    if strict and refused:
        what = "places" if places else "components"
        click.echo(
            f"registry model --strict: {len(refused)} of {len(rows)} {what} refused on {spec} "
            f"({scope}): {', '.join(refused)}",
            err=True,
        )
        sys.exit(1)


def _load(spec: str, eager: bool) -> Any:
    """The model SPEC names, with the libraries' logging quiet; exit 1 (with the
    reason) where it does not load."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.spec import ModelSpecError
    from causalab_mini.tools.tiny import TinyBuildError

    for noisy in ("nnterp", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    try:
        return StandardizedTransformer(spec, enable_attention_probs=eager)
    except ModelSpecError as exc:
        click.echo(f"registry model: {exc}", err=True)
        sys.exit(1)
    except (TinyBuildError, OSError, ValueError) as exc:
        click.echo(f"registry model: cannot load {spec}: {_first_line(exc)}", err=True)
        sys.exit(1)


def _layer_in_range(layer: int | None, n: int) -> int | None:
    """``--layer`` counted from 0 (a negative one from the end); exit 2 out of range."""
    if layer is not None and not -n <= layer < n:
        click.echo(
            f"registry model: layer {layer} is out of range: this model has layers 0..{n - 1}",
            err=True,
        )
        sys.exit(2)
    if layer is not None:
        layer %= n
    return layer


def _header(spec: str, model: Any, scope: str) -> dict[str, object]:
    """What the answer says of the model before its rows."""
    return {
        "spec": spec,
        "model_class": model.internals.model_class,
        # the submodule of the checkpoint's model traced as the model (traced_module)
        "traced_module": getattr(model, "traced_module", None),
        "layers": model.internals.num_layers,
        "block_structure": model.block_structure,
        "families": list(model.families),
        "attn_implementation": getattr(model._model.config, "_attn_implementation", None),
        "padding_side": getattr(model.tokenizer, "padding_side", None),
        "answered_for": scope,
    }


def _place_rows(internals: Any, layer: int | None) -> list[dict[str, object]]:
    """One row per Address row of ``model.internals``: ok and where, or the reason."""
    rows: list[dict[str, object]] = []
    for name, reason in internals.status(layer).items():
        place = internals[name]
        where = place.address.describe()
        if reason is None and layer is not None and place.per_layer:
            where = place.address_at(layer).describe()
        rows.append({"name": name, "ok": reason is None, "where": where, "reason": reason})
    return rows


def _component_rows(model: Any, layer: int | None) -> list[dict[str, object]]:
    """One row per component: ok with its width, streams, op and module, or the reason;
    exit 1 where the components cannot be located at all."""
    from causalab_mini.components import component_status
    from causalab_mini.internals import PlaceUnavailable

    rows: list[dict[str, object]] = []
    try:
        status = component_status(model, layer)
    except PlaceUnavailable as exc:
        click.echo(f"registry model: {exc}", err=True)
        sys.exit(1)
    for name, (address, reason) in status.items():
        rows.append(
            {
                "name": name,
                "ok": reason is None,
                "reason": reason,
                "width": address.width if address else None,
                "streams": address.streams if address else None,
                "op": address.op if address and address.kind == "interior" else None,
                "where": address.module if address else None,
                "rank": list(address.rank) if address else None,
            }
        )
    return rows


def _traced_note(header: dict[str, object]) -> str:
    """What follows the model's class in the header where the model is a submodule of
    the checkpoint's model (its family's traced_module): "(the checkpoint's thinker)"."""
    traced = header["traced_module"]
    return f" (the checkpoint's {traced})" if traced else ""


def _print_plain(
    spec: str, model: Any, header: dict[str, object], rows: list[dict[str, object]], places: bool
) -> None:
    """The answer as plain text (piped): a header line, then a line a row."""
    internals = model.internals
    families = ", ".join(model.families) or "defaults only"
    traced = _traced_note(header)
    click.echo(
        f"{spec} via nnterp: {internals.num_layers} layers, padding_side={header['padding_side']} "
        f"({internals.model_class}{traced}, block {model.block_structure}, family {families}, "
        f"attention {header['attn_implementation']}); answered for {header['answered_for']}"
    )
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        if r["ok"]:
            click.echo(f"  {r['name']!s:{width}}  ok   {_detail(r, places)}".rstrip())
        else:
            click.echo(f"  {r['name']!s:{width}}  --   {_first_line(r['reason'])}")


def _detail(row: dict[str, object], places: bool) -> str:
    """What an ok row shows: where the place is read, or a component's width and op."""
    if places:
        return str(row["where"])
    parts = [] if row["width"] is None else [f"width={row['width']}"]
    streams = row.get("streams")
    if streams and isinstance(row["width"], int):  # several residual streams, handed on flat
        parts[-1] += f" ({streams} streams x {row['width'] // int(str(streams))})"
    if row["op"]:
        parts.append(f"op={row['op']}")
    return "  ".join(parts)


def _first_line(reason: object) -> str:
    return str(reason).split("\n", 1)[0]


def _print_table(
    spec: str, header: dict[str, object], rows: list[dict[str, object]], places: bool
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    families = ", ".join(str(f) for f in header["families"]) or "defaults only"  # type: ignore[attr-defined]
    table = Table(
        title=(
            f"{spec}: {header['model_class']}{_traced_note(header)}, {header['layers']} layers, block "
            f"{header['block_structure']}, family {families}, attention "
            f"{header['attn_implementation']}; answered for {header['answered_for']}"
        ),
        title_justify="left",
    )
    table.add_column("place" if places else "component")
    table.add_column("")
    table.add_column("where" if places else "width / op")
    for r in rows:
        if r["ok"]:
            table.add_row(str(r["name"]), "[green]ok[/]", escape(_detail(r, places)))
        else:
            reason = escape(_first_line(r["reason"]))
            table.add_row(str(r["name"]), "[red]--[/]", f"[red]{reason}[/]")
    Console().print(table)
