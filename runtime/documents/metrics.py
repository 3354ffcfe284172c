"""What a document measures, on the logits of each row's last content token (or of a
lens read): each metric a number per row, averaged over the rows for a cell.

    logit_diff     logit of the target token minus logit of the contrast token
    logprob        log-probability of the target token
    cross_entropy  cross-entropy of the target token (-logprob)
    kl             KL(reference || run) of the next-token distributions, the
                   reference being the clean base run (against: base) or the clean
                   source run (against: source)
    accuracy       the share of rows whose top token is the target
    iia            the same, named for an interchange: the target is the label the
                   counterfactual should give (interchange intervention accuracy);
                   against: source takes the clean source run's top token as the target,
                   against: labels the top token of the logits a document's train learns
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..metrics import MetricError as LibraryMetricError


class MetricError(LibraryMetricError):
    """A metric that cannot be computed on these rows (a token that is not one token);
    ``row`` is the row at fault."""

    def __init__(self, message: str, row: int) -> None:
        super().__init__(message)
        self.row = row


@dataclass(frozen=True)
class Metric:
    """One metric as the document wrote it (``target``, ``contrast``: the row fields
    holding the tokens; ``against``: the clean run a KL is taken against)."""

    name: str
    target: str = "answer"
    contrast: str = "contrast"
    against: str = "base"

    @property
    def label(self) -> str:
        """The metric's column name: its name, with what it reads where not the
        default."""
        label = self.name
        if self.target != "answer":
            label += f"[{self.target}]"
        if self.against != "base" and (self.name == "kl" or self.from_reference):
            label += f"[{self.against}]"
        return label

    @property
    def from_reference(self) -> bool:
        """Whether the target is a reference run's top token (accuracy, iia against:
        source, the clean source run; against: labels, the logits train learns): the
        label an interchange should give, no row field."""
        return self.name in ("accuracy", "iia") and self.against != "base"

    @staticmethod
    def of(item: dict[str, Any]) -> Metric:
        return Metric(
            str(item["metric"]),
            str(item.get("target", "answer")),
            str(item.get("contrast", "contrast")),
            str(item.get("against", "base")),
        )


def token_ids(tokenizer: Any, texts: list[str], field: str) -> list[int]:
    """The one token id of each text (encoded without special tokens), or refused
    naming the text, its tokens and the field."""
    out = []
    for n, text in enumerate(texts):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            pieces = tokenizer.convert_ids_to_tokens(ids)
            raise MetricError(
                f"row {n}: {field} {text!r} is {len(ids)} tokens on this tokenizer "
                f"({pieces}), and a metric reads one token: give a text that is one token "
                "(often with its leading space)",
                n,
            )
        out.append(int(ids[0]))
    return out


def per_row(metric: Metric, logits: Any, tokens: dict[str, Any], reference: Any) -> Any:
    """The metric of each row (a float tensor (rows,)) on ``logits`` (rows, vocab): the
    library's metrics (``causalab_mini.metrics``) on the row fields' tokens, and the
    share of rows whose top token is the target for accuracy and iia."""
    from .. import metrics as library

    logits = logits.float()
    if metric.name == "kl":
        return library.kl(reference.float())(logits)
    if metric.from_reference:
        target = reference.float().argmax(-1).to(logits.device)
        return (logits.argmax(-1) == target).float()
    target = tokens[metric.target]
    if metric.name == "logprob":
        return library.logprob(target)(logits)
    if metric.name == "cross_entropy":
        return library.cross_entropy(target)(logits)
    if metric.name == "logit_diff":
        return library.logit_diff(target, tokens[metric.contrast])(logits)
    return (logits.argmax(-1) == target.to(logits.device)).float()


__all__ = ["Metric", "MetricError", "per_row", "token_ids"]
