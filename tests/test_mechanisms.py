"""Intervention mechanisms held to their identities on four families of different block
structure (pre-norm Llama, GPT-2 with absolute positions, parallel GPT-NeoX,
sandwich-norm Gemma-2) and on both engines: Add(0), Scale(1) and Lerp(v, 0) leave the
logits torch.equal to a clean run, Lerp(v, 1) is Set(v), Zero() is Set(zeros), a mean
of one reference row is Set to that row; every mechanism keeps a value read before it,
puts exactly ``apply`` of the clean tensor, and changes what comes after; the hooks
engine equals the nnsight one; bad values are refused before anything runs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch

from causalab_mini import locate
from causalab_mini.errors import CausalabError, WriteRefused
from causalab_mini.mechanisms import (
    MECHANISMS,
    Add,
    Clamp,
    Lerp,
    Mean,
    Mechanism,
    MechanismRefused,
    ProjectOut,
    Renormalize,
    Resample,
    Scale,
    Set,
    Zero,
    checkpoint_of,
    harvest_means,
)
from causalab_mini.plain import edited
from causalab_mini.plan import Plan

from .test_remote import workers  # noqa: F401 - the stand-in NDIF servers, a fixture

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

FAMILIES = ["tiny:llama", "tiny:gpt2", "tiny:gpt_neox", "tiny:gemma2"]
ENGINES = ["nnsight", "hooks"]
TEXTS = ["The quick brown fox jumps", "A dog ran away"]


def _vector(width: int, seed: int) -> torch.Tensor:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def mechanisms(width: int, rows: int) -> list[Mechanism]:
    """One of every mechanism, each with values that change the tensor."""
    v = _vector(width, 1)
    return [
        Set(_vector(width, 2).expand(rows, 1, width).clone()),
        Add(v),
        Scale(0.5),
        Lerp(v, 0.25),
        Zero(),
        Mean(_vector(width, 3)),
        Resample(tuple(reversed(range(rows)))),
        Clamp(-0.05, 0.05),
        ProjectOut(v),
        Renormalize(3 * v),
    ]


def _run(model: Any, reads: list[Any], writes: list[Any], engine: str) -> dict[Any, Any]:
    return Plan.of(reads=reads, writes=writes).run(model, TEXTS, engine=engine)


@pytest.fixture(scope="module", params=FAMILIES)
def model(request: Any, tiny_model: Callable[..., Any]) -> Any:
    return tiny_model(request.param)


def _places(model: Any) -> dict[str, Any]:
    return {
        "before": locate(model, "block_input", 0, position={"index": -1}),
        "at": locate(model, "block_output", 0, position={"index": -1}),
        "logits": locate(model, "logits"),
    }


@pytest.mark.parametrize("engine", ENGINES)
def test_identities_leave_the_logits_equal_to_a_clean_run(model: Any, engine: str) -> None:
    p = _places(model)
    width = p["at"].width
    clean = _run(model, [p["logits"]], [], engine)[p["logits"]]
    for mechanism in (Add(torch.zeros(width)), Scale(1.0), Lerp(_vector(width, 4), 0.0)):
        out = _run(model, [p["logits"]], [(p["at"], mechanism)], engine)[p["logits"]]
        assert torch.equal(out, clean), mechanism


@pytest.mark.parametrize("engine", ENGINES)
def test_lerp_one_zero_and_a_one_row_mean_are_sets(model: Any, engine: str) -> None:
    p = _places(model)
    width, logits = p["at"].width, p["logits"]
    v = _vector(width, 5)
    exact = v.expand(len(TEXTS), 1, width).clone()

    def logits_of(value: Any) -> Any:
        return _run(model, [logits], [(p["at"], value)], engine)[logits]

    assert torch.equal(logits_of(Lerp(v, 1.0)), logits_of(Set(exact)))
    assert torch.equal(logits_of(Set(exact)), logits_of(exact))  # a bare tensor is a Set
    assert torch.equal(logits_of(Zero()), logits_of(torch.zeros_like(exact)))
    # a mean over a reference set of one row is that row's value
    reference = ["Colourless green ideas sleep"]
    mean = harvest_means(model, [p["at"]], reference, engine=engine)[p["at"]]
    row = Plan.of(reads=[p["at"]]).run(model, reference, engine=engine)[p["at"]][0]
    assert torch.equal(mean.value, row)
    assert torch.equal(logits_of(mean), logits_of(row.expand(len(TEXTS), 1, width).clone()))


@pytest.mark.parametrize("engine", ENGINES)
def test_every_mechanism_keeps_earlier_reads_and_changes_what_follows(
    model: Any, engine: str
) -> None:
    p = _places(model)
    reads = [p["before"], p["at"], p["logits"]]
    clean = _run(model, reads, [], engine)
    for mechanism in mechanisms(p["at"].width, len(TEXTS)):
        out = _run(model, reads, [(p["at"], mechanism)], engine)
        # read before the write (an earlier place): the clean value
        assert torch.equal(out[p["before"]], clean[p["before"]]), mechanism
        # read at the place after the write: exactly apply() of the clean tensor
        assert torch.equal(out[p["at"]], mechanism.apply(clean[p["at"]])), mechanism
        # and the write reaches what follows
        assert not torch.allclose(out[p["logits"]], clean[p["logits"]]), mechanism


def test_the_engines_agree_at_a_stream_and_at_a_head(model: Any) -> None:
    p = _places(model)
    head = locate(model, "attention_z", 0, head=1, position={"index": -1})
    for at in (p["at"], head):
        for mechanism in mechanisms(at.width, len(TEXTS)):
            runs = [_run(model, [p["logits"]], [(at, mechanism)], e)[p["logits"]] for e in ENGINES]
            assert torch.equal(runs[0], runs[1]), (at, mechanism)


def test_a_head_write_changes_that_head_only(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    z = locate(model, "attention_z", 0, position={"index": -1})
    head = locate(model, "attention_z", 0, head=1, position={"index": -1})
    clean = Plan.of(reads=[z]).run(model, TEXTS)[z]
    out = Plan.of(reads=[z], writes=[(head, Add(_vector(head.width, 6)))]).run(model, TEXTS)[z]
    size = head.width
    changed = (out != clean).any(dim=(0, 1)).nonzero().flatten().tolist()
    assert changed and set(changed) <= set(range(size, 2 * size))


def test_apply_and_the_plain_edit_agree() -> None:
    x = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(0))
    for mechanism in mechanisms(8, 3):
        lowered = mechanism.lowered()
        if isinstance(lowered, torch.Tensor):  # Set: a bare tensor, put as it is
            assert torch.equal(lowered, mechanism.apply(x))
            continue
        assert torch.equal(edited(lowered, x), mechanism.apply(x)), mechanism
    one_row = torch.randn(2, 8)  # one row's shape broadcasts over the rows
    assert torch.equal(Mean(one_row).apply(x), one_row.expand(3, 2, 8))
    reference = torch.randn(5, 2, 8)
    assert torch.equal(Resample((4, 0, 2), reference).apply(x), reference[[4, 0, 2]])


def test_mechanisms_are_data() -> None:
    v = torch.arange(4.0)
    assert {m.__name__ for m in MECHANISMS} == {
        "Set",
        "Add",
        "Scale",
        "Lerp",
        "Zero",
        "Mean",
        "Resample",
        "Clamp",
        "ProjectOut",
        "Renormalize",
    }
    for mechanism in mechanisms(4, 2):
        assert pickle.loads(pickle.dumps(mechanism)) == mechanism
        assert type(mechanism).__name__ in repr(mechanism)
    assert Add(v) == Add(v.clone()) and Add(v) != Add(v + 1) and Add(v) != Scale(v)
    assert Add(v) != Add(v.double())  # a value of another dtype is another value
    assert "tensor(4,) float32" in repr(Add(v))
    assert Plan.of(writes=[]).steps == ()


def _nothing_runs(model: Any) -> Any:
    """A forward hook on the model that counts its forwards."""
    calls: list[int] = []
    handle = model._model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_values_are_refused_before_anything_runs(
    tiny_model: Callable[..., Any], engine: str
) -> None:
    model = tiny_model("tiny:llama")
    at = locate(model, "block_output", 0, position={"index": -1})
    head = locate(model, "attention_z", 0, head=1, position={"index": -1})
    d = at.width
    nan = _vector(d, 7)
    nan[3] = float("nan")
    inf = _vector(d, 7)
    inf[0] = float("inf")
    bad = [
        (at, Add(torch.zeros(d + 1)), f"{d + 1} wide"),
        (head, Add(torch.zeros(d)), f"{head.width} wide"),
        (at, Add(torch.zeros(d, dtype=torch.float64)), "nothing is cast"),
        (at, Lerp(nan, 0.5), "NaN or inf"),
        (at, Renormalize(inf), "NaN or inf"),
        (at, Scale(float("inf")), "finite"),
        (at, ProjectOut(torch.zeros(d)), "non-zero"),
        (at, Clamp(), "bounds nothing"),
        (
            at,
            Mean(torch.zeros(d), ("tiny:other", "block_output[0] at {'index': -1}", d)),
            "harvested on",
        ),
        (at, Mean(torch.zeros(d), (checkpoint_of(model), "block_output[1]", d)), "harvested at"),
    ]
    calls, handle = _nothing_runs(model)
    try:
        for address, mechanism, says in bad:
            with pytest.raises(MechanismRefused, match=says) as caught:
                _run(model, [locate(model, "logits")], [(address, mechanism)], engine)
            message = str(caught.value)
            assert "\n" not in message and address.component in message, message
            assert isinstance(caught.value, (CausalabError, WriteRefused, ValueError))
    finally:
        handle.remove()
    assert calls == [], "a refused write ran the model"


def test_a_mean_harvested_elsewhere_is_refused(tiny_model: Callable[..., Any]) -> None:
    llama, gpt2 = tiny_model("tiny:llama"), tiny_model("tiny:gpt2")
    here = locate(llama, "block_output", 0, position={"index": -1})
    there = locate(llama, "block_output", 1, position={"index": -1})
    mean = harvest_means(llama, [here], TEXTS)[here]
    with pytest.raises(MechanismRefused, match=r"harvested at block_output\[0\]"):
        Plan.of(writes=[(there, mean)]).run(llama, TEXTS)
    on_gpt2 = locate(gpt2, "block_output", 0, position={"index": -1})
    moved = Mean(mean.value[..., : on_gpt2.width].clone(), mean.harvested)
    with pytest.raises(MechanismRefused, match="harvested on"):
        Plan.of(writes=[(on_gpt2, moved)]).run(gpt2, TEXTS)


def test_a_whole_place_mean_is_over_content_tokens(tiny_model: Callable[..., Any]) -> None:
    from causalab_mini.positions import encode, trace_inputs

    model = tiny_model("tiny:llama")  # adds <s>, which is no content token
    at = locate(model, "block_output", 1)
    mean = harvest_means(model, [at], TEXTS)[at]
    encoded = encode(model, TEXTS)
    full = Plan.of(reads=[at]).run(model, trace_inputs(model, encoded))[at]
    tokens = torch.cat([full[r, list(f.content)] for r, f in enumerate(encoded.frames)])
    assert len(tokens) < full.shape[0] * full.shape[1]  # the specials and padding left out
    torch.testing.assert_close(mean.value, tokens.mean(0), rtol=0, atol=0)
    clean = Plan.of(reads=[locate(model, "logits")]).run(model, TEXTS)
    ablated = Plan.of(reads=[locate(model, "logits")], writes=[(at, mean)]).run(model, TEXTS)
    assert not torch.allclose(*clean.values(), *ablated.values())


def test_steering_in_generation(tiny_model: Callable[..., Any]) -> None:
    from causalab_mini import compat

    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight 0.8")
    model = tiny_model("tiny:llama")
    model.tokenizer.padding_side = "left"
    at = locate(model, "block_output", 0, position={"index": -1})
    plain = Plan.of(reads=[at]).generate(model, TEXTS, max_new_tokens=4, do_sample=False)
    zero = Plan.of(reads=[at], writes=[(at, Add(torch.zeros(at.width)))]).generate(
        model, TEXTS, max_new_tokens=4, do_sample=False
    )
    steered = Plan.of(reads=[at], writes=[(at, Add(40 * _vector(at.width, 8)))]).generate(
        model, TEXTS, max_new_tokens=4, do_sample=False
    )
    assert torch.equal(zero.tokens, plain.tokens)
    assert not torch.equal(steered.tokens, plain.tokens)
    for step_plain, step_steered in zip(plain.steps, steered.steps, strict=True):
        # the read after the write at each step holds the steering vector added
        assert not torch.equal(step_plain[at], step_steered[at])


def test_a_mechanism_through_a_places_setter(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    v = _vector(model.hidden_size, 9)
    mid, logits = locate(model, "block_mid", 1), locate(model, "logits")
    planned = Plan.of(reads=[logits], writes=[(mid, Add(v))]).run(model, TEXTS)[logits]
    with model.trace(TEXTS):
        before = model.layers_input[1].save()
        model.layers_mid[1] = Add(v)
        out = model.logits.save()
    clean = Plan.of(reads=[locate(model, "block_input", 1)]).run(model, TEXTS)
    assert torch.equal(before, clean[locate(model, "block_input", 1)])
    assert torch.equal(out, planned)
    with pytest.raises(MechanismRefused, match="NaN or inf"), model.trace(TEXTS):
        model.layers_mid[1] = Add(torch.full_like(v, float("nan")))


def test_mechanisms_run_remotely_as_plain_edits(workers: dict[str, Any]) -> None:  # noqa: F811
    """On a stock server (no causalab_mini there), a plan's mechanisms travel as plain
    edits and give what they give locally; a featurized read comes back as features,
    and a featurized write (the featurizer's own code) is refused before sending."""
    from causalab_mini.errors import RemoteRefused
    from causalab_mini.featurizers import Subspace

    from .conftest import load_model
    from .test_remote import loopback, remote_llama

    local, client = load_model("tiny:llama"), remote_llama()
    v = _vector(local.hidden_size, 10)

    def plan(model: Any) -> Plan:
        at = locate(model, "block_mid", 0, position={"index": -1})
        reads = [locate(model, "block_input", 0), locate(model, "block_output", 1)]
        reads.append(locate(model, "logits"))
        head = locate(model, "attention_z", 1, head=1)
        writes = [(at, Renormalize(v)), (head, Clamp(-0.01, 0.01))]
        return Plan.of(reads, [*writes, (locate(model, "block_output", 1), Lerp(v, 0.3))])

    want = plan(local).run(local, TEXTS)
    with loopback(workers["stock"]).installed():
        got = plan(client).run(client, TEXTS, remote=True)
    for (a, value), w in zip(got.items(), want.values(), strict=True):
        assert torch.equal(value, w), a
    sub = Subspace(4, seed=2)
    featurized = locate(client, "block_output", 1, featurizer=sub)
    with loopback(workers["stock"]).installed():
        features = Plan.of([featurized]).run(client, TEXTS, remote=True)[featurized]
        with pytest.raises(RemoteRefused, match="featurized write"):
            Plan.of(writes=[(featurized, Scale(0.5))]).run(client, TEXTS, remote=True)
    whole = locate(local, "block_output", 1)
    expected = Plan.of([whole]).run(local, TEXTS)[whole] @ sub.matrix.T
    assert torch.equal(features, expected)


def test_values_that_do_not_broadcast_are_refused(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama")
    at = locate(model, "block_output", 0, position={"index": -1})
    d = at.width
    bad = [
        (Add(torch.zeros(3, d)), "does not broadcast"),
        (Resample((0, 1, 0)), "give one row index per row"),
        (Resample((0, 1), torch.zeros(2, 4, d)), "give one row index per row"),
        (Clamp(1.0, -1.0), "low above high"),
    ]
    for mechanism, says in bad:
        with pytest.raises(WriteRefused, match=says):
            _run(model, [locate(model, "logits")], [(at, mechanism)], "nnsight")
    x = torch.zeros(2, 1, d)
    assert _run(model, [at], [(at, Resample((1, 0), x))], "hooks")[at].abs().sum() == 0
