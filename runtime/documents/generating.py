"""Interventions that generate (``Plan.generate``): the cell's mechanisms written at
the token of every step (``{index: -1}``: the prompt's last token at step 0, the token
being generated after), greedy decoding of ``max_new_tokens`` tokens per row. The
metrics read step 0's logits (the prompt's last token, written); ``unchanged`` is the
share of generated tokens equal to the run without writes; the texts are kept."""

from __future__ import annotations

from typing import Any

from .experiment import Cell, Experiment, texts_of
from .reading import chunks
from .vectors import mechanism

UNCHANGED = "unchanged"


def _generate(exp: Experiment, writes: list[tuple[Any, Any]], steps: int) -> tuple[Any, Any]:
    """Step 0's logits (rows, vocab) and the generated ids (rows, steps) of the base
    texts with ``writes`` at every step."""
    import torch

    from ..locator import locate
    from ..plan import Plan

    at = locate(exp.model, "logits", position={"index": -1})
    texts = texts_of(exp.rows, "base")
    logits, tokens = [], []
    for part in chunks(len(texts), exp.batch_size):
        out = Plan.of(reads=[at], writes=writes).generate(
            exp.model, texts[part], max_new_tokens=steps, frame=exp.frame, do_sample=False
        )
        logits.append(out.steps[0][at][:, -1])
        tokens.append(out.tokens)
    return torch.cat(logits), torch.cat(tokens)


def steps_of(exp: Experiment, intervention: str) -> int:
    return int(exp.doc["interventions"][intervention]["generate"]["max_new_tokens"])


def clean_tokens(exp: Experiment, steps: int) -> Any:
    """The tokens generated without writes (once per number of steps)."""
    key = ("clean generation", steps)
    if key not in exp.cache:
        exp.cache[key] = _generate(exp, [], steps)[1]
    return exp.cache[key]


def generate_cell(exp: Experiment, cell: Cell) -> tuple[Any, dict[str, Any]]:
    """The cell's step-0 logits, and what it generated: each row's text and the share
    of its tokens equal to the clean generation's (``unchanged``)."""
    steps = steps_of(exp, cell.intervention)
    writes = [
        (a, mechanism(exp, w["mechanism"], a))
        for w in exp.writes_of(cell.intervention)
        for a in cell.addresses[w["site"]]
    ]
    logits, tokens = _generate(exp, writes, steps)
    same = (tokens == clean_tokens(exp, steps)).float().mean(-1)
    decode = exp.model.tokenizer.decode
    extra = {
        "metrics": {UNCHANGED: float(same.mean())},
        "per_row": {UNCHANGED: [float(v) for v in same]},
        "generated": [decode(t, skip_special_tokens=True) for t in tokens],
    }
    return logits, extra


def generation_forwards(exp: Experiment, intervention: str) -> int:
    """The forwards one generation of the base rows makes (one per step and batch)."""
    import math

    return math.ceil(len(exp.rows.rows) / exp.batch_size) * steps_of(exp, intervention)


__all__ = ["UNCHANGED", "clean_tokens", "generate_cell", "generation_forwards", "steps_of"]
