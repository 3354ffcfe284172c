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
                   counterfactual should give (interchange intervention accuracy)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CausalabError


class MetricError(CausalabError, ValueError):
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
        if self.name == "kl" and self.against != "base":
            label += f"[{self.against}]"
        return label

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
    """The metric of each row (a float tensor (rows,)) on ``logits`` (rows, vocab)."""
    import torch

    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)
    if metric.name == "kl":
        ref = torch.log_softmax(reference.float(), dim=-1)
        return (ref.exp() * (ref - logprobs)).sum(-1)
    target = tokens[metric.target]
    index = target.unsqueeze(-1)
    if metric.name == "logprob":
        return logprobs.gather(-1, index).squeeze(-1)
    if metric.name == "cross_entropy":
        return -logprobs.gather(-1, index).squeeze(-1)
    if metric.name == "logit_diff":
        contrast = tokens[metric.contrast].unsqueeze(-1)
        return (logits.gather(-1, index) - logits.gather(-1, contrast)).squeeze(-1)
    return (logits.argmax(-1) == target).float()


__all__ = ["Metric", "MetricError", "per_row", "token_ids"]
