"""The errors of remote runs, in one module the lowering and the remote backend both
import (``causalab_mini.remote`` re-exports them)."""

from __future__ import annotations


class RemoteRefused(RuntimeError):
    """A remote request refused before it is sent, with what to change."""


class RemoteMismatch(RuntimeError):
    """The server runs something other than what the request was compiled for."""


class RemoteIncomplete(RuntimeError):
    """A remote run that came back without every value it read."""


__all__ = ["RemoteIncomplete", "RemoteMismatch", "RemoteRefused"]
