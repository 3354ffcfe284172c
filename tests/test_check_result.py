"""One result type for the sweep's checks (``checks.base.CheckResult``), and how the
sweep judges a component from the results that cover it (issue 31)."""

from __future__ import annotations

import dataclasses

import pytest

from causalab_mini.tools.checks import CheckResult
from causalab_mini.tools.sweep.certification import _Checks, _judged
from causalab_mini.tools.verdicts import ComponentState


def test_a_result_has_one_status() -> None:
    held = CheckResult.of(["block_output", "block_mid"], "a == b", True, "max error 0")
    assert held.status is ComponentState.OK and held.ok
    assert held.components == ("block_output", "block_mid")
    failed = CheckResult.of(("block_output",), "a == b", False, "layer 1")
    assert failed.status is ComponentState.BROKEN and not failed.ok
    refused = CheckResult.refused(("block_output",), "a == b", "refused: no such place")
    assert refused.status is ComponentState.REFUSED and refused.ok
    with pytest.raises(dataclasses.FrozenInstanceError):
        held.status = ComponentState.BROKEN  # type: ignore[misc]


def test_the_sweep_judges_by_status() -> None:
    checks = _Checks()
    checks.add(CheckResult.of(("block_output",), "first", True))
    checks.add(CheckResult.refused(("block_output",), "second", "refused: why"))
    assert _judged(checks, "block_output") == {
        "state": ComponentState.OK,
        "checks": ["first", "second"],
    }
    checks.add(CheckResult.of(("block_output", "block_mid"), "third", False, "layer 0"))
    judged = _judged(checks, "block_output")
    assert judged["state"] == ComponentState.BROKEN and judged["reason"] == "third (layer 0)"
    assert _judged(checks, "block_mid")["state"] == ComponentState.BROKEN
    assert _judged(checks, "logits") == {
        "state": ComponentState.BROKEN,
        "reason": "resolved, but no check covers it on this model",
    }
    # a guard breaks a component but never certifies one
    checks.guard(CheckResult.of(("attention_z",), "layout", True))
    assert _judged(checks, "attention_z")["state"] == ComponentState.BROKEN
