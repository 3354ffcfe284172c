"""Each of the sweep's checks as a unit: on a tiny model it holds, and with the one
tensor it compares tampered with (or the row it relies on made wrong) it fails."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from causalab_mini import RenameConfig
from causalab_mini.components import ComponentError, locate
from causalab_mini.generated import COMPONENTS, DEFAULT_ADDRESSES
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools import checks as k
from causalab_mini.tools import sweep

pytestmark = pytest.mark.slow


def _context(model: StandardizedTransformer) -> k.Context:
    inputs = c.sample_inputs(model)
    addresses: dict[tuple[str, int | None], Any] = {}
    for name, spec in COMPONENTS.items():
        for layer in range(model.internals.num_layers) if spec.per_layer else [None]:
            try:
                addresses[(name, layer)] = locate(model, name, layer)
            except ComponentError:
                pass
    unordered: dict[Any, str] = {}
    read = sweep.read_all(model, inputs, addresses, {}, {}, unordered)
    v = {key: read[a] for key, a in addresses.items()}
    return sweep.check_context(model, inputs, addresses, v, unordered)


@pytest.fixture(scope="module")
def llama() -> k.Context:
    return _context(StandardizedTransformer("tiny:llama", enable_attention_probs=True))


def _bare(model: StandardizedTransformer) -> k.Context:
    """A context with nothing read: the write checks run their own traces."""
    return k.Context(model, c.sample_inputs(model), {}, {})


def _tampered(ctx: k.Context, key: tuple[str, int | None], where: str = "v") -> k.Context:
    values = dict(getattr(ctx, where))
    values[key] = values[key] * 1.1 + 0.5
    return dataclasses.replace(ctx, **{where: values})


# check -> the tensor whose change it must notice (in ctx.v unless said)
TAMPER: dict[str, tuple[tuple[str, int | None], str]] = {
    "read_alone": (("logits", None), "v"),
    "identities": (("layers_mid", 1), "places"),
    "module_consistency": (("mlp_input", 1), "v"),
    "hidden_states": (("block_input", 1), "v"),
    "attention_probabilities": (("attention_probs", 1), "v"),
    "attention_input_norm": (("attention_input_norm", 1), "v"),
    "interiors": (("attention_z", 1), "v"),
    "mlp_interiors": (("mlp_neuron_output", 1), "v"),
    "mlp_projections": (("mlp_up", 1), "v"),
    "rotary": (("attention_query_pre_rope", 1), "v"),
    "final_norm": (("ln_final", None), "v"),
    "model_outputs": (("embeddings", None), "v"),
    "unembedding": (("lm_head", None), "v"),
    "lens_identity": (("block_output", 2), "v"),  # the last of tiny:llama's 3 layers
}


def test_every_check_has_a_unit_test() -> None:
    writes = {"write_reaches_stream", "write_keeps_earlier_reads", "attention_write_shifts_mid"}
    writes.add("in_place_edits")  # tests/test_noops.py, with a dropped edit
    # tests/test_interchange.py: the sweep's check notices a block_input row that reads
    # the attention's norm (the residual then carries the base's tokens on)
    writes |= {"position_reads_and_writes", "interchange_identities"}
    writes.add("hooks_engine")  # tests/test_hooks_engine.py, with a tampered engine
    # below: the mechanisms' and featurizers' identities, with a wrong edit or swap
    writes |= {"mechanism_identities", "featurizer_interchange"}
    # tests/test_ragged.py (a family's padding fact removed: the check fails) and
    # tests/test_encoder_decoder.py
    writes |= {"ragged_batches", "ragged_interchange", "ragged_pairs"}
    writes.add("gradients")  # below: an engine whose gradient is doubled fails it
    # tests/test_router_places.py: a mixture of experts' router (tampered weights,
    # logits, shared expert; a write that is dropped)
    writes |= {"router_checks", "router_writes"}
    assert {check.__name__ for check in k.CHECKS} == set(TAMPER) | writes


@pytest.mark.parametrize("name", sorted(TAMPER))
def test_a_check_holds_and_notices_a_tampered_tensor(name: str, llama: k.Context) -> None:
    check = getattr(k, name)
    clean = list(check(llama))
    assert clean and all(o.ok for o in clean), clean
    key, where = TAMPER[name]
    assert any(not o.ok for o in check(_tampered(llama, key, where)))


def test_a_write_that_stops_at_the_norm_does_not_reach_the_stream() -> None:
    model = StandardizedTransformer("tiny:llama")
    assert all(o.ok for o in k.write_reaches_stream(_bare(model))), "holds on the row"
    replace = dataclasses.replace(DEFAULT_ADDRESSES["layers_mid"], write="replace")
    wrong = StandardizedTransformer(
        "tiny:llama", rename_config=RenameConfig(addresses={"layers_mid": replace})
    )
    outcomes = list(k.write_reaches_stream(_bare(wrong)))
    assert outcomes and not any(o.ok for o in outcomes)


def test_a_read_that_is_not_a_copy_is_changed_by_a_later_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from causalab_mini import steps as lower

    ctx = _bare(StandardizedTransformer("tiny:llama"))
    clean = list(k.write_keeps_earlier_reads(ctx))
    assert [o.components for o in clean] == [("block_mid",)] and clean[0].ok
    # the places' steps say whether a read is a copy: a model whose steps say never
    monkeypatch.setattr(lower, "copied", lambda address: address.snapshot)
    monkeypatch.setattr(lower, "copied_for_edits", lambda address, attr: False)
    tampered = _bare(StandardizedTransformer("tiny:llama"))
    assert not any(o.ok for o in k.write_keeps_earlier_reads(tampered))


def test_a_write_to_attention_shifts_the_mid_stream_by_its_delta() -> None:
    # without the multiplier the row names the module's output, not the contribution:
    # a delta written there reaches the stream scaled, not as written
    model = StandardizedTransformer("tiny:falcon_h1?attention_out_multiplier=0.5")
    row = model.internals["attentions_output"].row
    unscaled = dataclasses.replace(row, scale=None)
    wrong = StandardizedTransformer(
        "tiny:falcon_h1?attention_out_multiplier=0.5",
        rename_config=RenameConfig(addresses={"attentions_output": unscaled}),
    )
    clean = list(k.attention_write_shifts_mid(_bare(model)))
    assert clean and all(o.ok for o in clean)
    assert not any(o.ok for o in k.attention_write_shifts_mid(_bare(wrong)))


def test_the_intervention_checks_hold_and_notice_a_wrong_edit(
    llama: k.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    from causalab_mini import plain
    from causalab_mini.featurizers import Identity

    for check in (k.interventions.mechanism_identities, k.interventions.featurizer_interchange):
        clean = list(check(llama))
        assert len(clean) >= 5 and all(o.ok for o in clean), [o for o in clean if not o.ok]
    right = plain.edited

    def off(edit: Any, current: Any, *rest: Any) -> Any:  # Scale(1) is not x
        out = right(edit, current, *rest)
        return out + 1e-3 if edit[0] == "scale" else out

    monkeypatch.setattr(plain, "edited", off)
    assert any(not o.ok for o in k.interventions.mechanism_identities(llama))
    monkeypatch.setattr(Identity, "swap", lambda self, base, source: source + 1e-6)
    assert any(not o.ok for o in k.interventions.featurizer_interchange(llama))


def test_the_gradient_check_holds_and_fails_on_a_wrong_gradient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from causalab_mini import attribution, locate
    from causalab_mini.tools.checks import gradients

    model = StandardizedTransformer("tiny:llama")
    addresses = {("block_output", i): locate(model, "block_output", i) for i in range(2)}
    # the oracle holds every whole place that is a raw module's output or input: the
    # mid-stream through both its uses (the MLP's norm and the residual sum)
    more = ["block_mid", "mlp_input", "attention_output", "mlp_output", "mlp_neuron_output"]
    addresses |= {(name, 1): locate(model, name, 1) for name in more}
    ctx = k.Context(model, c.sample_inputs(model), addresses, {})
    clean = list(gradients.gradients(ctx))
    assert clean and all(o.ok for o in clean), clean
    held = {o.components[0] for o in clean if o.description == gradients.ORACLE}
    assert held == {"block_output", *more}, held
    cut = attribution._cut
    monkeypatch.setattr(attribution, "_cut", lambda a, whole, index: 2 * cut(a, whole, index))
    tampered = [o for o in gradients.gradients(ctx) if o.description == gradients.ORACLE]
    assert tampered and not any(o.ok for o in tampered)


def test_a_ragged_error_over_the_tolerance_is_measured_again_in_float64() -> None:
    """``ragged.settled``: an error within the tolerance holds; one over it that goes
    with the weights in float64 is float32 rounding (it holds, said); one that stays
    there is a padding error (it fails, with both figures); the weights come back as
    they were."""
    import torch

    from causalab_mini.hooks import dispatched
    from causalab_mini.tools.checks import ragged

    model = StandardizedTransformer("tiny:llama")
    dispatched(model)  # the real weights
    before = [p.detach().clone() for p in model._model.parameters()]
    assert ragged.settled(model, lambda: 1e-7)[0]

    def rounding() -> float:
        float32 = next(model._model.parameters()).dtype == torch.float32
        return 3e-5 if float32 else 0.0

    ok, detail = ragged.settled(model, rounding)
    assert ok and "rounding" in detail, detail
    ok, detail = ragged.settled(model, lambda: 3e-5)
    assert not ok and "float64" in detail, detail
    after = list(model._model.parameters())
    assert all(
        a.dtype == torch.float32 and torch.equal(a, b) for a, b in zip(after, before, strict=True)
    )
