"""Every load loads the checkpoint's own weights, or is refused.

transformers' ``from_pretrained`` loads what it can of a checkpoint into the class it
was asked for and initialises the rest at random; it reports what it did
(``output_loading_info=True``: missing, unexpected and mismatched keys) but raises on
none of it. nnsight calls ``from_pretrained`` itself (0.6/0.7 directly, 0.8 through a
``transformers.pipeline``), so the report cannot be asked for through nnsight's
keywords. :func:`recorded` captures it where transformers makes it (the
``_finalize_model_loading`` step every ``from_pretrained`` ends with, after tied
weights and the keys the class declares ignorable are taken out), for the duration of
one load, and :func:`check` refuses a load that left a parameter of the model
uninitialised by the checkpoint or a tensor of the checkpoint unused.

A model built on the meta device (``remote=True``, or before the first trace
dispatches it) loads no weights: nothing is checked then; a local model is checked
when it dispatches, and a remote model's weights are the server's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import CausalabError

# the step of PreTrainedModel.from_pretrained that finalises the loading report
HOOK = "_finalize_model_loading"
SHOWN = 8  # keys listed per kind in a refusal


class LoadRefused(CausalabError, RuntimeError):
    """A checkpoint that does not load into the model it was loaded as: a parameter
    of the model not in the checkpoint, a tensor of the checkpoint not in the model,
    or a shape that differs. The message lists them."""


@dataclass
class LoadReport:
    """What one ``from_pretrained`` loaded: the class, the checkpoint, the model's
    parameter and buffer names (``expected``), and what transformers reported missing
    (in the model, not in the checkpoint: freshly initialised), unexpected (in the
    checkpoint, not in the model: dropped) and mismatched (name, checkpoint shape,
    model shape)."""

    model_class: str
    checkpoint: str
    expected: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, Any, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched or self.errors)


@contextlib.contextmanager
def recorded() -> Iterator[list[LoadReport]]:
    """While open, every ``from_pretrained`` appends its :class:`LoadReport`."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__.get(HOOK)
    if not isinstance(original, staticmethod):
        import transformers

        raise LoadRefused(
            f"transformers {transformers.__version__} has no PreTrainedModel.{HOOK} "
            "step, where causalab_mini reads what a load left missing or unused; "
            "without it no load can be checked, so none is made: install a "
            "transformers 5 release that has it (5.24 does)"
        )
    finalize = original.__func__
    reports: list[LoadReport] = []

    def finalize_and_record(model: Any, load_config: Any, loading_info: Any) -> Any:
        info = finalize(model, load_config, loading_info)
        reports.append(_report(model, load_config, info))
        return info

    setattr(PreTrainedModel, HOOK, staticmethod(finalize_and_record))
    try:
        yield reports
    finally:
        setattr(PreTrainedModel, HOOK, original)


def _report(model: Any, load_config: Any, info: Any) -> LoadReport:
    return LoadReport(
        model_class=type(model).__name__,
        checkpoint=str(getattr(load_config, "pretrained_model_name_or_path", "") or ""),
        expected=len(model.state_dict()),
        missing=sorted(getattr(info, "missing_keys", ()) or ()),
        unexpected=sorted(getattr(info, "unexpected_keys", ()) or ()),
        mismatched=sorted(getattr(info, "mismatched_keys", ()) or ()),
        errors=[
            *(str(e) for e in getattr(info, "error_msgs", ()) or ()),
            *(f"{k}: {v}" for k, v in (getattr(info, "conversion_errors", {}) or {}).items()),
        ],
    )


def _listed(keys: list[Any]) -> str:
    shown = ", ".join(
        f"{k[0]} (checkpoint {tuple(k[1])}, model {tuple(k[2])})" if isinstance(k, tuple) else k
        for k in keys[:SHOWN]
    )
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"[{shown}{more}]"


def check(reports: list[LoadReport], families: tuple[str, ...], architectures: list[str]) -> None:
    """Refuse (``LoadRefused``) unless every load in ``reports`` loaded every tensor
    of its checkpoint into the model and every parameter of the model from it."""
    for report in reports:
        if report.ok:
            continue
        parts = []
        if report.missing:
            parts.append(
                f"{len(report.missing)} of the model's {report.expected} parameters and "
                f"buffers are not in the checkpoint (they would be random): "
                f"{_listed(report.missing)}"
            )
        if report.unexpected:
            parts.append(
                f"{len(report.unexpected)} tensors of the checkpoint are not in the model "
                f"(they would be dropped): {_listed(report.unexpected)}"
            )
        if report.mismatched:
            parts.append(f"{len(report.mismatched)} differ in shape: {_listed(report.mismatched)}")
        if report.errors:
            parts.append(f"transformers reported: {'; '.join(report.errors)[:500]}")
        family = ", ".join(families) if families else "none (the default rows)"
        saved = ", ".join(architectures) if architectures else "none"
        raise LoadRefused(
            f"the checkpoint {report.checkpoint!r} does not load into {report.model_class} "
            f"(family: {family}): " + "; ".join(parts) + ". Its config names "
            f"architectures [{saved}]. Load it with the class that saved it (a wrapper "
            "family's auto_class is used only where it maps one of those architectures), "
            "or fix the checkpoint's tensor names; nothing was loaded"
        )


__all__ = ["LoadRefused", "LoadReport", "check", "recorded"]
