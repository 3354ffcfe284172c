"""The sweep's outcome of an architecture that loads: ``certified`` only when every
refusal is a reason of the model; a place refused because no block-structure rule
gives the model's structure is the registry's unfinished work, not such a reason."""

from __future__ import annotations

from typing import Any

from causalab_mini.generated import DEFAULT_ADDRESSES, FAMILY_STRUCTURE_UNKNOWN
from causalab_mini.internals import NO_STRUCTURE_RULE
from causalab_mini.tools.sweep import Result, coverage_markdown, judge_structure, summarize


def _result(model_type: str, **reasons: str | None) -> Result:
    components: dict[str, dict[str, Any]] = {}
    for name, reason in reasons.items():
        state = "ok" if reason is None else "refused"
        components[name] = {"state": state, **({"reason": reason} if reason else {})}
    return Result(model_type, "certified", model_class="X", components=components)


def _untold(place: str) -> str:
    # what internals._structural says where no rule matches
    return (
        f"component 'c': {place} depends on the block structure, and {NO_STRUCTURE_RULE} "
        "matches XForCausalLM (model_type 'x'): add a rule naming its structure"
    )


def test_a_refusal_for_want_of_a_structure_rule_leaves_the_architecture_unfinished() -> None:
    result = _result("x", block_input=None, block_mid=_untold("layers_mid"), mlp_output=None)
    judge_structure(result)
    assert result.outcome == "unfinished"
    assert result.reason is not None and "(block_mid)" in result.reason
    assert result.counts() == {"ok": 2, "refused": 1, "broken": 0}


def test_the_default_rows_structure_unknown_reason_is_recognised() -> None:
    # places.yaml's own reason for attentions_output / mlps_output when no rule matches
    reasons = [
        u.message("mlps_output")
        for u in DEFAULT_ADDRESSES["mlps_output"].unavailable
        if u.when.kind == "structure_unknown"
    ]
    assert reasons and all(NO_STRUCTURE_RULE in r for r in reasons)
    result = _result("x", mlp_output=f"component 'mlp_output': {reasons[0]}")
    judge_structure(result)
    assert result.outcome == "unfinished"


def test_a_family_that_says_why_no_structure_applies_stays_certified() -> None:
    # dory, zamba, ...: structure_unknown_reason is a true reason of the model
    assert FAMILY_STRUCTURE_UNKNOWN
    for family, reason in FAMILY_STRUCTURE_UNKNOWN.items():
        assert NO_STRUCTURE_RULE not in reason, family
        result = _result(family, block_mid=reason.replace("{place}", "layers_mid"))
        judge_structure(result)
        assert result.outcome == "certified", family


def test_other_refusals_and_other_outcomes_are_left_as_they_are() -> None:
    result = _result("x", block_mid="block_mid does not exist: its block is 'parallel'")
    judge_structure(result)
    assert result.outcome == "certified" and result.reason is None
    crashed = Result("y", "crashed", "boom")
    judge_structure(crashed)
    assert crashed.outcome == "crashed"


def test_unfinished_is_counted_and_shown_apart_from_certified() -> None:
    done = _result("a", block_mid=None)
    todo = _result("b", block_mid=_untold("layers_mid"))
    for r in (done, todo):
        judge_structure(r)
    summary = summarize([done, todo])
    assert (summary["certified"], summary["unfinished"]) == (1, 1)
    report = {
        "transformers": "5.24.0",
        "nnsight": "0.7.0",
        "seconds": 1.0,
        "summary": summary,
        "results": [r.__dict__ for r in (done, todo)],
    }
    text = coverage_markdown(report)
    assert "1 loaded and certified component by component; 1 load but are unfinished" in text
    row = next(line for line in text.splitlines() if line.startswith("| b |"))
    # (the empty cell: the lens column, no lens figure in this report)
    assert "| 0 | 1 | 0 |  | unfinished: 1 components refused only because" in row
    assert "| a |" in text and "unfinished" not in next(
        line for line in text.splitlines() if line.startswith("| a |")
    )
