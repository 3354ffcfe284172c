"""Two checks of the sweep for hybrid blocks. A gated attention: attention_premix is
attention_z times the sigmoid or softplus gate the attention's forward computes
(Qwen3-Next and MiniCPM5-MoE per feature, LFM3 per head, Laguna's softplus either
way), and a gate that is not the one applied fails. A block whose identities do not name
attentions_output (Falcon-H1, a Mamba mixer beside attention): a write to it shifts
layers_mid by exactly the delta, and a row without its scale fails."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from causalab_mini import RenameConfig
from causalab_mini.generated import DEFAULT_ADDRESSES, GATE_CALLS
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools.certify import close
from causalab_mini.tools.checks.recompute import gated
from causalab_mini.tools.sweep import Result, run_one

FALCON_H1 = (
    "tiny:falcon_h1?attention_in_multiplier=2.0&attention_out_multiplier=0.5&ssm_out_multiplier=0.7"
)


def test_a_per_feature_gate_multiplies_each_feature() -> None:
    z = torch.randn(2, 5, 12)
    gate = torch.sigmoid(torch.randn(2, 5, 12))
    assert close(gated(z, gate), z * gate)[0]


def test_a_per_head_gate_multiplies_each_head_slice() -> None:
    z = torch.randn(2, 5, 12)  # 3 heads of 4
    gate = torch.sigmoid(torch.randn(2, 5, 3))
    expected = torch.cat([z[..., 4 * h : 4 * (h + 1)] * gate[..., h : h + 1] for h in range(3)], -1)
    assert close(gated(z, gate), expected)[0]


def test_a_per_feature_gate_held_per_head_multiplies_each_feature() -> None:
    z = torch.randn(2, 5, 12)  # 3 heads of 4
    gate = torch.sigmoid(torch.randn(2, 5, 3, 4))  # Beam's (b, s, heads, head_dim)
    assert close(gated(z, gate), z * gate.flatten(2))[0]


def test_a_per_head_gate_with_a_trailing_axis_multiplies_each_head_slice() -> None:
    z = torch.randn(2, 5, 12)  # 3 heads of 4; Dots3's gate is (b, s, heads, 1)
    gate = torch.sigmoid(torch.randn(2, 5, 3, 1))
    expected = torch.cat([z[..., 4 * h : 4 * (h + 1)] * gate[..., h, :] for h in range(3)], -1)
    assert close(gated(z, gate), expected)[0]
    assert not close(gated(z, gate), z * gate.mean())[0]


def test_a_gate_of_another_shape_is_not_guessed() -> None:
    z = torch.randn(2, 5, 12)
    gate = torch.sigmoid(torch.randn(2, 5, 5))  # 5 does not divide 12
    assert not close(gated(z, gate), z)[0]


def test_a_different_gate_fails() -> None:
    z = torch.randn(2, 5, 12)
    gate = torch.sigmoid(torch.randn(2, 5, 12))
    other = torch.sigmoid(torch.randn(2, 5, 12))
    assert not close(gated(z, other), z * gate)[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("tiny:qwen3_next", "sigmoid"),
        ("tiny:lfm3", "sigmoid"),
        ("tiny:laguna", "softplus"),  # one softplus gate per head
        ("tiny:laguna?gating=per-element", "softplus"),  # one per feature
        ("tiny:minicpm5_moe", "sigmoid"),  # gate_states.sigmoid(): a fused query-gate projection
    ],
)
def test_gated_attention_certifies_through_the_gate(
    spec: str, kind: str, certified: Callable[[str], Result]
) -> None:
    result = certified(spec)
    assert result.outcome == "certified", result.reason
    for name in ("attention_z", "attention_premix"):
        item = result.components[name]
        assert item["state"] == "ok", item
        assert f"attention_premix == attention_z x the attention's {kind} gate" in item["checks"]


@pytest.mark.slow
def test_without_its_gate_call_a_gated_attention_is_broken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate calls come from interiors.yaml (gates): without the sigmoid rows,
    Qwen3-Next's premix (z times its sigmoid gate) no longer equals z, and the sweep
    says broken rather than guessing."""
    from causalab_mini.tools.checks import recompute

    monkeypatch.setattr(recompute, "GATE_CALLS", tuple(g for g in GATE_CALLS if g[0] != "sigmoid"))
    result = run_one("tiny:qwen3_next")
    assert result.components["attention_premix"]["state"] == "broken"
    assert "attention_z == attention_premix" in result.components["attention_premix"]["reason"]


@pytest.mark.slow
def test_a_write_to_a_scaled_attention_output_shifts_layers_mid(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model(FALCON_H1)
    check = c.attention_write_shifts_mid(model, c.sample_inputs(model))
    assert check is not None and check.ok, check


@pytest.mark.slow
def test_an_unscaled_attention_output_fails_the_shift() -> None:
    unscaled = RenameConfig(addresses={"attentions_output": DEFAULT_ADDRESSES["attentions_output"]})
    model = StandardizedTransformer(FALCON_H1, rename_config=unscaled)
    check = c.attention_write_shifts_mid(model, c.sample_inputs(model))
    assert check is not None and not check.ok


@pytest.mark.slow
def test_the_shift_is_not_checked_where_an_identity_names_attention(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:llama")
    assert c.attention_write_shifts_mid(model, c.sample_inputs(model)) is None
