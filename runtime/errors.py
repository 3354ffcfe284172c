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
    unless it is a tensor of exactly ``current``'s shape, dtype and device. Nothing is
    broadcast or cast: a user who means it says so (``v.expand_as(x)``, ``v.to(x)``).
    Every spelling of a write (``model.<name>[i] = v``, ``model.internals[name][i] =
    v``, a ``Plan``) checks with this one function, so they refuse alike."""
    shape = getattr(value, "shape", None)
    want = tuple(current.shape)
    if shape is None:
        raise WriteRefused(
            f"cannot write a {type(value).__name__} to {where}, which holds a tensor of "
            f"shape {want}; write a tensor of that shape (e.g. torch.full_like(x, value))"
        )
    got = tuple(shape)
    if got != want:
        raise WriteRefused(
            f"cannot write a tensor of shape {got} to {where}, which has shape {want}; "
            "nothing is broadcast (say v.expand_as(x) if that is what you mean)"
        )
    if getattr(value, "dtype", None) != current.dtype:
        raise WriteRefused(
            f"{where} holds {current.dtype}; the value is {value.dtype}. Nothing is cast: "
            f"write v.to({current.dtype})"
        )
    if getattr(value, "device", None) != current.device:
        raise WriteRefused(
            f"{where} is on {current.device}; the value is on {value.device}: write "
            f"v.to('{current.device}')"
        )


__all__ = [
    "PlaceUnavailable",
    "RemoteIncomplete",
    "RemoteMismatch",
    "RemoteRefused",
    "RenameError",
    "WriteRefused",
    "check_value",
]
