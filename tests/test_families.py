"""Every family file is exercised: each model type it names is built tiny, loaded and
certified component by component (the sweep's own check, in this process), and no
component may be broken: each is ok on real tensors or refused with a specific reason.
"""

from __future__ import annotations

import pytest

from causalab_mini.generated import FAMILY_MATCH
from causalab_mini.tools.sweep import GENERIC, run_one

pytestmark = pytest.mark.slow


def _spec(model_type: str, config: tuple[tuple[str, object], ...]) -> str:
    """tiny:<model_type>, with the config values the family's match requires."""
    if not config:
        return f"tiny:{model_type}"
    values = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in config)
    return f"tiny:{model_type}?{values}"


CASES = sorted(
    {
        (family, _spec(model_type, match.config))
        for family, match in FAMILY_MATCH.items()
        for model_type in match.model_types
    }
)


def test_every_family_names_a_model_type() -> None:
    assert {family for family, _ in CASES} == set(FAMILY_MATCH)


@pytest.mark.parametrize(("family", "spec"), CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_family_certifies_with_nothing_broken(family: str, spec: str) -> None:
    result = run_one(spec)
    assert result.outcome == "certified", result.reason
    assert family in result.families
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


def test_a_fused_gate_and_up_projection_certifies_the_activation() -> None:
    """Phi-3's MLP computes gate and up in one linear (gate_up_proj) and multiplies the
    up half by the activation: the sweep's gated check accepts either half of a linear
    twice the activation's width, and only a product that matches."""
    result = run_one("tiny:phi3")
    item = result.components["mlp_activation"]
    assert item["state"] == "ok", item
    assert "mlp_neuron_output == mlp_activation (x a gate)" in item["checks"]
