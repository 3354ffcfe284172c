"""The verdicts the tools give, as string enums: a component's state in the sweep (and
in a check's note), and an architecture's outcome. Each member is equal to its string
(``ComponentState.OK == "ok"``), so the reports (docs/coverage.json) hold the same
values as before and a report read back from JSON compares equal to the members.
This module imports nothing of the project: every tool may import it."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["LOADED", "ArchitectureOutcome", "ComponentState"]


class ComponentState(StrEnum):
    """One component of one architecture, as the sweep certifies it."""

    OK = "ok"  # it resolved, and every check that covers it passed
    REFUSED = "refused"  # the model says why it has no such place
    BROKEN = "broken"  # a check failed or crashed, or the reason is generic


class ArchitectureOutcome(StrEnum):
    """One architecture of the sweep, as its worker reports it."""

    CERTIFIED = "certified"  # loads; every component ok or refused with a reason
    UNFINISHED = "unfinished"  # loads; a component refused only for want of a structure rule
    UNBUILDABLE = "unbuildable"  # no tiny checkpoint can be built
    UNLOADABLE = "unloadable"  # nnterp cannot load it
    CRASHED = "crashed"  # the certification or its process failed
    TIMEOUT = "timeout"  # no answer within the timeout


# the outcomes of an architecture that loaded, whose components were judged
LOADED = (ArchitectureOutcome.CERTIFIED, ArchitectureOutcome.UNFINISHED)
