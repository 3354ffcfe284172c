"""`registry positions SPEC TEXT`: the content frame of a text under a model's
tokenizer: every token, its content index (and from the end), the anchors, and what a
position spec resolves to."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from causalab_mini.tools.completion import complete_spec

__all__ = ["load_tokenizer", "positions_command", "tokenizer_as_run"]


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of a model spec (``tiny:<model_type>``, a checkpoint directory or a
    hub id), loaded without the model."""
    from transformers import AutoTokenizer

    from causalab_mini.spec import prepare_model_spec

    path, extra = prepare_model_spec(spec, {})
    return AutoTokenizer.from_pretrained(path, **extra)


def tokenizer_as_run(spec: str) -> Any:
    """The tokenizer of a model spec as the model runs it: loaded with the model on the
    meta device (no weights), so its padding side and pad token are the ones the loaded
    model sets (nnsight pads a causal LM on the left, an encoder-decoder on the right),
    not the ones the tokenizer's files say."""
    from causalab_mini.model import StandardizedTransformer

    model = StandardizedTransformer(spec, remote=True)
    return model.tokenizer


@click.command("positions")
@click.argument("spec", shell_complete=complete_spec)
@click.argument("texts", nargs=-1, required=True)
@click.option(
    "--position",
    "position",
    default=None,
    help='A position spec as JSON, e.g. \'{"index": -1}\' or \'{"span": "fox"}\': also '
    "print the tokens it names in each row.",
)
@click.option(
    "--frame",
    type=click.Choice(["plain", "chat"]),
    default="plain",
    show_default=True,
    help="plain: every token the text produced; chat: the user message inside the "
    "tokenizer's chat template.",
)
@click.option(
    "--padding-side",
    type=click.Choice(["left", "right"]),
    default=None,
    help="Pad the batch on this side (default: the side the loaded model pads on, "
    "which `registry model` prints too).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the frame (and resolution) as JSON.")
def positions_command(
    spec: str,
    texts: tuple[str, ...],
    position: str | None,
    frame: str,
    padding_side: str | None,
    as_json: bool,
) -> None:
    """Print the content frame of TEXTS (one row each) under SPEC's tokenizer.

    \b
    Example:
      registry positions tiny:llama "The quick brown fox"
      registry positions tiny:gpt2 "The fox" "A lazy dog" --position '{"index": -1}'
      registry positions tiny:qwen2 "Where is Paris?" --frame chat
      registry positions tiny:llama "The fox" --json
    """
    from causalab_mini import positions as p

    tokenizer = tokenizer_as_run(spec)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    try:
        encoded = p.encode(tokenizer, list(texts), frame=frame)
        indices = None
        if position is not None:
            try:
                parsed = json.loads(position)
            except ValueError:
                parsed = position  # "all" written bare
            indices = p.resolve(tokenizer, encoded, parsed)
    except p.PositionError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(_as_json(encoded, indices), indent=2))
        return
    click.echo(f"{spec}: {type(tokenizer).__name__}, padding_side={tokenizer.padding_side}")
    click.echo(p.describe_frame(encoded))
    if indices is not None:
        click.echo(f"{position} ->")
        for row, (fr, idx) in enumerate(zip(encoded.frames, indices, strict=True)):
            tokens = ", ".join(f"{i} {fr.tokens[i]!r}" for i in idx)
            click.echo(f"  row {row}: {tokens}")


def _as_json(encoded: Any, indices: list[list[int]] | None) -> dict[str, Any]:
    rows = []
    for row, fr in enumerate(encoded.frames):
        rows.append(
            {
                "text": fr.text,
                "tokens": list(fr.tokens),
                "content": list(fr.content),
                "anchors": dict(fr.anchors),
                "padding": [i for i in range(len(fr.tokens)) if i not in fr.real],
                "resolved": None if indices is None else indices[row],
            }
        )
    return {"frame": encoded.frame, "rows": rows}
