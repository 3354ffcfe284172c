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
    read = sweep._read_all(model, inputs, addresses, {}, {}, unordered)
    v = {key: read[a] for key, a in addresses.items()}
    return sweep._context(model, inputs, addresses, v, unordered)


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
    ctx = k.Context(model, c.sample_inputs(model), addresses, {})
    clean = list(gradients.gradients(ctx))
    assert clean and all(o.ok for o in clean), clean
    cut = attribution._cut
    monkeypatch.setattr(attribution, "_cut", lambda a, whole, index: 2 * cut(a, whole, index))
    tampered = [o for o in gradients.gradients(ctx) if o.name == gradients.ORACLE]
    assert tampered and not any(o.ok for o in tampered)
