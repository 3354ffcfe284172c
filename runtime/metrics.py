"""Metrics: what a gradient or an attribution differentiates, one value per row.

A metric is a callable on the (rows, vocab) logits at each row's last token as the
model receives it (``{"anchor": "last"}``: the token whose logits give the next one;
the end of the chat prompt in the chat frame) that returns one value per row; its sum
is what ``causalab_mini.attribution`` differentiates. The usual ones:

- ``logit_diff(good, bad)``: logit of ``good`` minus logit of ``bad``;
- ``logprob(tokens)``: log-probability of ``tokens``;
- ``cross_entropy(labels)``: cross-entropy against ``labels``;
- ``kl(reference_logits)``: KL(reference || model) per row.

Tokens are token ids (an int for every row, or one per row), or texts that are one
token on the model's tokenizer (``tokens_of``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import CausalabError


class MetricError(CausalabError, ValueError):
    """A metric that cannot be computed as given (a token that is not one token, a
    width that does not match), with what to write instead."""


def tokens_of(model: Any, tokens: Any) -> Any:
    """``tokens`` as a LongTensor of ids: ints, a tensor, or texts that are exactly one
    token each on ``model``'s tokenizer (refused otherwise, with how they split)."""
    import torch

    if isinstance(tokens, torch.Tensor):
        return tokens.long()
    items = [tokens] if isinstance(tokens, (int, str)) else list(tokens)
    ids: list[int] = []
    for item in items:
        if isinstance(item, bool):
            raise MetricError(f"a token is an id or a text, not {item!r}")
        if isinstance(item, int):
            ids.append(item)
            continue
        if not isinstance(item, str):
            raise MetricError(f"a token is an id or a text, not {type(item).__name__}")
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise MetricError(f"{item!r} is a text and this model has no tokenizer: give ids")
        pieces = tokenizer(item, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            shown = tokenizer.convert_ids_to_tokens(pieces)
            raise MetricError(
                f"{item!r} is {len(pieces)} tokens on this tokenizer ({shown}), not one: give "
                "a token id, or a text that is one token (often with its leading space)"
            )
        ids.append(int(pieces[0]))
    return torch.tensor(ids, dtype=torch.long)


def _per_row(ids: Any, rows: int, what: str) -> Any:
    if ids.dim() == 0 or ids.numel() == 1:
        return ids.reshape(1).expand(rows)
    if ids.numel() != rows:
        raise MetricError(f"{what}: {ids.numel()} tokens for {rows} rows: give one, or one per row")
    return ids.reshape(rows)


@dataclass(frozen=True)
class Metric:
    """A named metric: ``fn(logits, model) -> (rows,)``. Pure data where its arguments
    are (it prints what it measures)."""

    name: str
    fn: Callable[[Any, Any], Any]

    def __call__(self, logits: Any, model: Any = None) -> Any:
        value = self.fn(logits, model)
        if getattr(value, "dim", lambda: -1)() != 1 or value.shape[0] != logits.shape[0]:
            raise MetricError(
                f"metric {self.name} gave shape {tuple(getattr(value, 'shape', ()))}, not one "
                f"value per row ({logits.shape[0]})"
            )
        return value

    def __repr__(self) -> str:
        return self.name


def logit_diff(good: Any, bad: Any) -> Metric:
    """Logit of ``good`` minus logit of ``bad`` (per row, or one pair for every row)."""

    def fn(logits: Any, model: Any) -> Any:
        import torch

        rows = torch.arange(logits.shape[0], device=logits.device)
        g = _per_row(tokens_of(model, good), logits.shape[0], "logit_diff good").to(logits.device)
        b = _per_row(tokens_of(model, bad), logits.shape[0], "logit_diff bad").to(logits.device)
        return logits[rows, g] - logits[rows, b]

    return Metric(f"logit_diff({good!r}, {bad!r})", fn)


def logprob(tokens: Any) -> Metric:
    """Log-probability of ``tokens`` (one per row, or one for every row)."""

    def fn(logits: Any, model: Any) -> Any:
        import torch

        rows = torch.arange(logits.shape[0], device=logits.device)
        t = _per_row(tokens_of(model, tokens), logits.shape[0], "logprob").to(logits.device)
        return torch.log_softmax(logits.float(), -1)[rows, t]

    return Metric(f"logprob({tokens!r})", fn)


def cross_entropy(labels: Any) -> Metric:
    """Cross-entropy of the logits against ``labels`` (one per row)."""

    def fn(logits: Any, model: Any) -> Any:
        import torch

        t = _per_row(tokens_of(model, labels), logits.shape[0], "cross_entropy").to(logits.device)
        return torch.nn.functional.cross_entropy(logits.float(), t, reduction="none")

    return Metric(f"cross_entropy({labels!r})", fn)


def kl(reference_logits: Any) -> Metric:
    """KL(reference || model) per row, ``reference_logits`` (rows, vocab)."""

    def fn(logits: Any, model: Any) -> Any:
        import torch

        ref = reference_logits.to(logits.device)
        if ref.shape != logits.shape:
            raise MetricError(
                f"kl: reference logits {tuple(ref.shape)} and logits {tuple(logits.shape)} differ"
            )
        p = torch.log_softmax(ref.float(), -1)
        q = torch.log_softmax(logits.float(), -1)
        return (p.exp() * (p - q)).sum(-1)

    return Metric("kl(reference)", fn)


def as_metric(metric: Any) -> Metric:
    """``metric`` as a Metric: one already, or a callable of the logits."""
    if isinstance(metric, Metric):
        return metric
    if not callable(metric):
        raise MetricError(
            f"a metric is a callable of the last-token logits returning one value per row "
            f"(e.g. causalab_mini.metrics.logit_diff(good, bad)), not {type(metric).__name__}"
        )
    name = getattr(metric, "__name__", repr(metric))
    return Metric(name, lambda logits, model: metric(logits))


__all__ = [
    "Metric",
    "MetricError",
    "as_metric",
    "cross_entropy",
    "kl",
    "logit_diff",
    "logprob",
    "tokens_of",
]
