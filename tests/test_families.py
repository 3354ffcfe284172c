"""Every family file is exercised: each model type it names is built tiny, loaded and
certified component by component (the sweep's own check, in this process), and no
component may be broken: each is ok on real tensors or refused with a specific reason.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from causalab_mini.generated import FAMILY_MATCH
from causalab_mini.tools.sweep import GENERIC, Result
from causalab_mini.versions import outside_versions

from .registry_cases import family_cases

pytestmark = pytest.mark.slow

# Every model type every family file names, with the config values its match
# requires: the first of each family runs in the README's test command, the rest in
# CI (marker `wide`).
CASES = family_cases()


def test_every_family_names_a_model_type() -> None:
    assert {family for family, _ in CASES} == set(FAMILY_MATCH)
    assert {family for family, case in CASES if case.representative} == set(FAMILY_MATCH)


@pytest.mark.parametrize(
    ("family", "spec"),
    [case.param(family, case.spec, id=f"{family}-{case.id}") for family, case in CASES],
)
def test_family_certifies_with_nothing_broken(
    family: str, spec: str, certified: Callable[[str], Result]
) -> None:
    result = certified(spec)
    assert result.outcome == "certified", result.reason
    # a family that describes other releases (match.versions) must not apply here: the
    # model certifies on the rows that hold for the installed ones
    outside = outside_versions(FAMILY_MATCH[family].versions)
    assert (family in result.families) == (outside is None), (family, outside)
    broken = {name: item for name, item in result.components.items() if item["state"] == "broken"}
    assert not broken, broken
    counts = result.counts()
    assert counts["ok"] > 0
    for name, item in result.components.items():
        if item["state"] == "refused":
            reason = item["reason"]
            # the refusal names the component, and every placeholder was filled in
            assert reason.startswith(f"component '{name}': "), reason
            assert "{place}" not in reason, reason
            assert not any(reason.strip().lower().endswith(g) for g in GENERIC), reason


def test_a_fused_gate_and_up_projection_certifies_the_activation(
    certified: Callable[[str], Result],
) -> None:
    """Phi-3's MLP computes gate and up in one linear (gate_up_proj) and multiplies the
    up half by the activation: the sweep's gated check accepts either half of a linear
    twice the activation's width, and only a product that matches."""
    result = certified("tiny:phi3")
    item = result.components["mlp_activation"]
    assert item["state"] == "ok", item
    assert "mlp_neuron_output == mlp_activation (x a gate)" in item["checks"]
