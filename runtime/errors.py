"""The errors the runtime raises, in one module every part imports: a place a model
lacks, a row whose name the model uses, a write that does not fit (and the one check
every spelling of a write makes), and those of remote runs (``causalab_mini.internals``
and ``causalab_mini.remote`` re-export them)."""

from __future__ import annotations

from typing import Any


class RemoteRefused(RuntimeError):
    """A remote request refused before it is sent, with what to change."""


class RemoteMismatch(RuntimeError):
    """The server runs something other than what the request was compiled for."""


class RemoteIncomplete(RuntimeError):
    """A remote run that came back without every value it read."""


class PlaceUnavailable(LookupError):
    """A place that does not exist on this model (or this layer), with the reason."""


class RenameError(ValueError):
    """A row whose name the model already uses for something else."""


class WriteRefused(ValueError):
    """A write that does not fit its place (shape, dtype, device, read-only)."""


def check_value(where: str, value: Any, current: Any) -> None:
    """Refuse to write ``value`` at ``where`` (a place or component, with its layer)
    unless it is a tensor of exactly ``current``'s shape, dtype and device, raising
    WriteRefused: ``causalab_mini.plain.check_value``, the one check every spelling of
    a write makes (in a trace here and on a server alike)."""
    from .plain import check_value as check

    check(where, value, current, WriteRefused)


__all__ = [
    "PlaceUnavailable",
    "RemoteIncomplete",
    "RemoteMismatch",
    "RemoteRefused",
    "RenameError",
    "WriteRefused",
    "check_value",
]
