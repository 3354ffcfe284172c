"""The errors the runtime raises, in one module every part imports: a place a model
lacks, a row whose name the model uses, a write that does not fit (and the one check
every spelling of a write makes), and those of remote runs (``causalab_mini.internals``
and ``causalab_mini.remote`` re-export them)."""

from __future__ import annotations

from typing import Any


class CausalabError(Exception):
    """The root of every exception causalab-mini raises: ``except CausalabError`` catches
    any refusal of this library (a place a model lacks, a write that does not fit, a
    remote request refused, ...) and nothing of torch's, nnsight's or transformers'.
    Each subclass keeps its builtin base too (``ValueError``, ``LookupError``,
    ``RuntimeError``), so an ``except`` clause written for that still works."""


class RemoteRefused(CausalabError, RuntimeError):
    """A remote request refused before it is sent, with what to change."""


class RemoteMismatch(CausalabError, RuntimeError):
    """The server runs something other than what the request was compiled for."""


class RemoteIncomplete(CausalabError, RuntimeError):
    """A remote run that came back without every value it read."""


class HooksRefused(CausalabError, RuntimeError):
    """A step the hooks engine does not run, with the reason and the engine that does."""


class PlaceUnavailable(CausalabError, LookupError):
    """A place that does not exist on this model (or this layer), with the reason."""


class RenameError(CausalabError, ValueError):
    """A row whose name the model already uses for something else."""


class WriteRefused(CausalabError, ValueError):
    """A write that does not fit its place (shape, dtype, device, read-only)."""


class GradientRefused(CausalabError, RuntimeError):
    """A place's gradient asked for in a spelling that cannot give it (in a trace, or of
    a read), with the spelling that does."""


def check_value(where: str, value: Any, current: Any) -> None:
    """Refuse to write ``value`` at ``where`` (a place or component, with its layer)
    unless it is a tensor of exactly ``current``'s shape, dtype and device, raising
    WriteRefused: ``causalab_mini.plain.check_value``, the one check every spelling of
    a write makes (in a trace here and on a server alike)."""
    from .plain import check_value as check

    check(where, value, current, WriteRefused)


__all__ = [
    "CausalabError",
    "GradientRefused",
    "HooksRefused",
    "PlaceUnavailable",
    "RemoteIncomplete",
    "RemoteMismatch",
    "RemoteRefused",
    "RenameError",
    "WriteRefused",
    "check_value",
]
