"""Components: the names research code uses, compiled to addresses that are pure data.

``locate(model, component, layer)`` asks ``model.internals`` for the row, whether the
place exists on this layer and its rank, and returns a ``ComponentAddress`` that
pickles, compares, sorts by rank and prints. ``read``/``write`` act on one address
inside an nnsight trace; ``Plan`` runs several in forward order in one trace.

Four components are interiors: tensors inside the attention module's forward that
never cross a module boundary, reached through nnsight's ``.source``.

This module is the one import research code makes; the parts live in ``locator``
(addresses), ``plan`` (reads, writes and plans in a trace) and ``geometry`` (heads,
head sizes, widths).
"""

from __future__ import annotations

from .geometry import ComponentError, HeadSizeUnknown, head_size, width_of
from .internals import PlaceUnavailable, WriteRefused
from .locator import ComponentAddress, component_status, locate
from .plan import Plan, Step, check_write, layout_mismatch, read, write

__all__ = [
    "ComponentAddress",
    "ComponentError",
    "HeadSizeUnknown",
    "PlaceUnavailable",
    "Plan",
    "Step",
    "WriteRefused",
    "check_write",
    "component_status",
    "head_size",
    "layout_mismatch",
    "locate",
    "read",
    "width_of",
    "write",
]
