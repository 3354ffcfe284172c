"""Blocks that carry several residual streams (docs/multi-stream.md): on every model
type whose family rows say its stream carries several streams, every identity of its
structure holds on real tensors on every layer where its rows exist, transformers'
hidden states agree with the block boundaries, a write to the mid-stream reaches the
block's output, a component selects one stream or all, and each kind of identity term
fails when the tensor it names is wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini.components import Plan, locate
from causalab_mini.generated import BLOCK_STRUCTURES, FAMILY_ADDRESSES
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c

from .registry_cases import Case, rule_cases, skip_unless_installed

Load = Callable[..., StandardizedTransformer]

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def _multi_stream_types() -> set[str]:
    """The model types whose family rows give layers_input several streams."""
    return {
        model_type
        for match, rows in FAMILY_ADDRESSES
        if rows.get("layers_input") is not None and rows["layers_input"].streams is not None
        for model_type in match.model_types
    }


CASES = [case for case in rule_cases() if case.model_type in _multi_stream_types()]
PARAMS = [case.param(case) for case in CASES]


def test_the_registry_has_multi_stream_cases() -> None:
    for case in CASES:  # each structure is judged on a model this transformers has
        skip_unless_installed(case.model_type)
    assert {case.expected_structure() for case in CASES} >= {
        "hyper_connections",
        "mixed_hyper_connections",
        "gated_hyper_connections",
        "altup",
    }


@pytest.mark.parametrize("case", PARAMS)
def test_identities_oracles_and_write(case: Case, tiny_model: Load) -> None:
    model = tiny_model(case.spec)
    assert model.block_structure == case.expected_structure()
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs)
    checks = c.identities(model, values)
    structure = BLOCK_STRUCTURES[model.block_structure]
    n = model.internals.num_layers
    for text in structure.identities:  # every identity checked somewhere
        assert any(check.description == text for check in checks), f"{text} was never checked"
    assert {check.layer for check in checks} == set(range(n))
    checks += c.hidden_state_oracle(model, inputs, values)
    assert any(check.description == "hidden_states[i] == layers_input" for check in checks)
    write = c.write_reaches_stream(model, inputs, layer=1)
    assert write is not None and "written layers_mid" in write.description
    checks.append(write)
    failed = [check for check in checks if not check.ok]
    assert not failed, failed


@pytest.mark.parametrize("case", PARAMS)
def test_a_write_never_changes_an_earlier_read(case: Case, tiny_model: Load) -> None:
    model = tiny_model(case.spec)
    checks = c.write_keeps_earlier_reads(model, c.sample_inputs(model), "layers_mid", 1)
    assert len(checks) >= 3
    failed = [check for check in checks if not check.ok]
    assert not failed, failed


@pytest.mark.parametrize("case", PARAMS)
def test_a_component_selects_one_stream_or_all(case: Case, tiny_model: Load) -> None:
    """All streams are handed on flat, (batch, seq, n x hidden); stream i is its i-th
    hidden-wide slice, which is stream i of the place as the model holds it; a write to
    one stream changes that stream of the place and no other."""
    model = tiny_model(case.spec)
    inputs = c.sample_inputs(model)
    row = model.internals["layers_input"].row
    assert row.streams is not None
    n = getattr(model.text_config, row.streams.count)
    hidden = model.text_config.hidden_size
    whole = locate(model, "block_input", 1)
    assert (whole.streams, whole.width, whole.stream) == (n, n * hidden, None)
    one = [locate(model, "block_input", 1, stream=i) for i in range(n)]
    assert all(a.width == hidden for a in one)
    read = Plan.of(reads=[whole, *one]).run(model, inputs)
    held = c.read_places(model, inputs, ["layers_input"])[("layers_input", 1)]
    canonical = c.canonical(model, "layers_input", held)
    assert read[whole].shape[-1] == n * hidden
    for i, address in enumerate(one):
        assert torch.equal(read[address], canonical[:, :, i])
        assert torch.equal(read[address], read[whole][..., i * hidden : (i + 1) * hidden])
    with pytest.raises(IndexError, match="residual streams"):
        locate(model, "block_input", 1, stream=n)
    with pytest.raises(Exception, match="one stream"):
        locate(model, "attention_query", 1, stream=0)

    from causalab_mini.components import read as read_at
    from causalab_mini.components import write as write_at

    box: list[Any] = []
    target = one[n - 1]
    with model.trace(inputs):
        value = read_at(model, target)
        write_at(model, target, torch.zeros_like(value))
        box.append(model.internals["layers_input"][1].save())
    after = c.canonical(model, "layers_input", getattr(box[0], "value", box[0]))
    assert torch.equal(after[:, :, n - 1], torch.zeros_like(after[:, :, n - 1]))
    assert torch.equal(after[:, :, : n - 1], canonical[:, :, : n - 1])


# ---------------------------------------------------------------- one test per kind


def _values(model: StandardizedTransformer) -> dict[tuple[str, int | None], Any]:
    return c.read_places(model, c.sample_inputs(model))


def _holds(model: StandardizedTransformer, text: str, values: dict[Any, Any]) -> bool:
    sides = c.evaluate_identity(model, text, values, 1)
    assert sides is not None, text
    return c.difference(*sides)[0]


MIXED = "tiny:deepseek_v4"
UNMIXED = "tiny:hy_v4"
MID = "layers_mid == attentions_stream_mix @ layers_input + attentions_stream_weights * attentions_sublayer_output"


def test_a_weighted_term_fails_with_other_weights(tiny_model: Load) -> None:
    """``w * a``: attention's output reaches stream k times w_k; one weight off fails."""
    model = tiny_model(UNMIXED)
    values = _values(model)
    assert _holds(model, MID, values)
    weights = values[("attentions_stream_weights", 1)].clone()
    weights[..., 0] *= 1.5
    assert not _holds(model, MID, {**values, ("attentions_stream_weights", 1): weights})


def test_a_mixing_term_fails_without_its_matrix(tiny_model: Load) -> None:
    """``m @ x``: DeepSeek-V4 mixes the streams; taken unmixed (or transposed), the
    identity fails."""
    model = tiny_model(MIXED)
    values = _values(model)
    assert _holds(model, MID, values)
    mix = values[("attentions_stream_mix", 1)]
    eye = torch.eye(mix.shape[-1], dtype=mix.dtype).expand_as(mix)
    assert not _holds(model, MID, {**values, ("attentions_stream_mix", 1): eye})
    swapped = mix.transpose(-1, -2)
    assert not _holds(model, MID, {**values, ("attentions_stream_mix", 1): swapped})


def test_a_refused_mixing_row_means_the_streams_pass_unmixed(tiny_model: Load) -> None:
    model = tiny_model(UNMIXED)
    assert model.internals["attentions_stream_mix"].unavailable_on(1) is not None
    values = _values(model)
    assert ("attentions_stream_mix", 1) not in values
    assert _holds(model, MID, values)
    other = values[("layers_input", 1)].clone()
    other[:, :, 1] += other[:, :, 0]  # stream 0 mixed into stream 1
    assert not _holds(model, MID, {**values, ("layers_input", 1): other})


def test_a_module_term_fails_on_another_input(tiny_model: Load) -> None:
    """``a == module(b)``: the norm fed the collapsed streams gives its output; fed
    another tensor of the same shape, it does not."""
    model = tiny_model(UNMIXED)
    values = _values(model)
    text = "attentions_norm_output == module(attentions_streams_in)"
    assert _holds(model, text, values)
    other = values[("mlps_streams_in", 1)]
    assert not _holds(model, text, {**values, ("attentions_streams_in", 1): other})


def test_a_number_term_fails_with_another_number(tiny_model: Load) -> None:
    """``0.707... * a`` (AltUp's mid-stream is a sum divided by sqrt(2)): the identity
    holds with the number the block uses and fails without it; attention's
    contribution read without its row's 1/sqrt(2) fails it too."""
    model = tiny_model("tiny:gemma3n_text")
    values = _values(model)
    text = BLOCK_STRUCTURES["altup"].identities[0]
    assert text.startswith("layers_mid == 0.7071067811865476 * layers_active_input")
    assert _holds(model, text, values)
    assert not _holds(model, text.replace("0.7071067811865476", "1.0"), values)
    unscaled = values[("attentions_output", 1)] * 2**0.5
    assert not _holds(model, text, {**values, ("attentions_output", 1): unscaled})


def test_identity_terms_parse() -> None:
    assert c.parse_terms("a == b + w * x + m @ y") == (
        "a",
        (("row", "b"), ("*", "w", "x"), ("@", "m", "y")),
    )
    assert c.parse_identity("a == m @ y + w * x") == ("a", ("m", "y", "w", "x"))
    assert c.parse_terms("a == module(b)") == ("a", (("module", "b"),))
    assert c.parse_terms("a == 0.5 * b + c") == ("a", (("k", "0.5", "b"), ("row", "c")))
    assert c.parse_identity("a == 0.5 * b + c") == ("a", ("b", "c"))
    with pytest.raises(ValueError, match="stands alone"):
        c.parse_terms("a == module(b) + c")
    with pytest.raises(ValueError, match="not a row"):
        c.parse_terms("a == b - c")


@pytest.mark.parametrize("spec", ["tiny:hy_v4", "tiny:qwen4_exp_text", "tiny:gemma3n_text"])
def test_a_plain_program_reads_and_writes_streams_as_the_plan(spec: str, tiny_model: Load) -> None:
    """Remote runs lower a plan to plain module accesses: all streams and one stream
    read (and a stream written) exactly as the native plan does, on both layouts."""
    from causalab_mini import remote

    model = tiny_model(spec)
    inputs = c.sample_inputs(model)
    n = getattr(model.text_config, model.internals["layers_input"].row.streams.count)
    reads = [locate(model, "block_input", 1), locate(model, "block_input", 1, stream=n - 1)]
    reads.append(locate(model, "block_output", 1))
    plan = Plan.of(reads)
    native, plain = plan.run(model, inputs), remote.run_plan(plan, model, inputs)
    assert all(torch.equal(native[a], plain[a]) for a in reads)
    value = native[reads[1]] * 0.5
    earlier = locate(model, "block_output", 0)  # read before the write: keeps its value
    clean = Plan.of([earlier]).run(model, inputs)
    later = [earlier, reads[2]]
    written = Plan.of(later, [(reads[1], value.clone())])
    native = written.run(model, inputs)
    plain = remote.run_plan(Plan.of(later, [(reads[1], value.clone())]), model, inputs)
    assert torch.equal(native[reads[2]], plain[reads[2]])
    assert torch.equal(native[earlier], clean[earlier])
    assert torch.equal(plain[earlier], clean[earlier])


def test_a_write_to_altups_active_copy_reaches_the_sublayers(tiny_model: Load) -> None:
    """layers_active_input is written in place in AltUp's predictions: reads before the
    write keep their values, the place reads back the written value, attention's norm
    reads it, and the block's output changes."""
    model = tiny_model("tiny:gemma3n_text")
    inputs = c.sample_inputs(model)
    checks = c.write_keeps_earlier_reads(model, inputs, "layers_active_input", 1)
    assert len(checks) >= 3
    failed = [check for check in checks if not check.ok]
    assert not failed, failed
    box: dict[str, Any] = {}
    internals = model.internals
    with model.trace(inputs):
        active = internals["layers_active_input"][1]
        box["written"] = (active * 0.5).save()
        internals["layers_active_input"][1] = active * 0.5
        box["normed"] = internals["attentions_norm_output"][1].save()
    values = {
        ("layers_active_input", 1): getattr(box["written"], "value", box["written"]),
        ("attentions_norm_output", 1): getattr(box["normed"], "value", box["normed"]),
    }
    assert _holds(model, "attentions_norm_output == module(layers_active_input)", values)
