"""Featurizers held to their identities on four families (pre-norm Llama, GPT-2,
parallel GPT-NeoX, sandwich-norm Gemma-2) and both engines: an Identity interchange is
the plain one bit for bit, a full-rank Subspace interchange is within 1e-5 of it, a
k = 0 swap changes nothing, an SAE spliced in with no edit leaves the logits within
1e-6, every featurizer's inverse round-trips, a featurized read returns features and a
featurized write takes them; parameters save and load with the place they were fitted
at; a featurizer that does not fit its place is refused before anything runs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from causalab_mini import locate
from causalab_mini.errors import CausalabError
from causalab_mini.featurizers import (
    PCA,
    SAE,
    Featurizer,
    FeaturizerRefused,
    Gate,
    Identity,
    Linear,
    Subspace,
    fitted_at,
    load,
)
from causalab_mini.interchange import interchange
from causalab_mini.mechanisms import Scale, Zero
from causalab_mini.plan import Plan
from causalab_mini.tools.checks import positions as checks

pytestmark = [pytest.mark.slow, pytest.mark.semantic]

FAMILIES = ["tiny:llama", "tiny:gpt2", "tiny:gpt_neox", "tiny:gemma2"]
ENGINES = ["nnsight", "hooks"]
TEXTS = ["The quick brown fox jumps", "A dog ran away"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_sae(width: int, activation: str = "relu", seed: int = 0) -> SAE:
    m = 2 * width
    g = _gen(seed)
    return SAE(
        torch.randn(width, m, generator=g) / width**0.5,
        torch.randn(m, width, generator=g) / m**0.5,
        torch.randn(m, generator=g) * 0.1,
        torch.randn(width, generator=g) * 0.1,
        activation=activation,
        topk=width // 2 if activation == "topk" else None,
        threshold=torch.full((m,), 0.05) if activation == "jumprelu" else None,
    )


def featurizers(width: int) -> list[Featurizer]:
    """One of every kind, sized for ``width``."""
    g = _gen(1)
    x = torch.randn(64, width, generator=g)
    return [
        Identity(),
        Subspace(3, width=width),
        Subspace(width, "cayley", width=width),
        Linear(torch.randn(width, width, generator=g)),
        Linear(torch.randn(3, width, generator=g)),
        PCA.fit(x, 4),
        random_sae(width, "relu"),
        random_sae(width, "topk"),
        random_sae(width, "jumprelu"),
        Gate(Subspace(4, width=width), "boundary"),
    ]


@pytest.fixture(scope="module", params=FAMILIES)
def model(request: Any, tiny_model: Callable[..., Any]) -> Any:
    return tiny_model(request.param)


def _pairs(model: Any) -> tuple[list[str], list[str]]:
    pairs = checks.equal_length_pairs(model, list(checks.SENTENCES[:10]))
    assert pairs is not None
    return pairs


def _patch(model: Any, featurizer: Any = None) -> Any:
    return locate(model, "block_input", 1, position={"index": -1}, featurizer=featurizer)


@pytest.mark.parametrize("engine", ENGINES)
def test_identity_and_full_rank_subspace_interchange_are_the_plain_one(
    model: Any, engine: str
) -> None:
    bases, sources = _pairs(model)
    plain = interchange(model, [_patch(model)], bases, sources, engine=engine)
    same = interchange(model, [_patch(model, Identity())], bases, sources, engine=engine)
    assert torch.equal(same.logits, plain.logits)
    width = _patch(model).width
    for parametrization in ("orthogonal", "cayley"):
        full = Subspace(width, parametrization, seed=3)
        out = interchange(model, [_patch(model, full)], bases, sources, engine=engine)
        scale = plain.logits.abs().max()
        assert float((out.logits.detach() - plain.logits).abs().max() / scale) < 1e-5
    # the patch moved something: the base's own run differs
    clean = interchange(model, [_patch(model)], bases, bases, engine=engine)
    assert not torch.allclose(clean.logits, plain.logits)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_swap_of_nothing_changes_nothing(model: Any, engine: str) -> None:
    bases, sources = _pairs(model)
    clean = interchange(model, [_patch(model)], bases, bases, engine=engine)
    for nothing in (Subspace(0), Gate(Subspace(4, width=_patch(model).width), init=-1e4)):
        out = interchange(model, [_patch(model, nothing)], bases, sources, engine=engine)
        if isinstance(nothing, Gate):  # a closed gate: every weight 0 (sigmoid underflows)
            assert float(nothing.mask().max()) == 0.0
        assert torch.equal(out.logits, clean.logits), nothing


@pytest.mark.parametrize("engine", ENGINES)
def test_an_sae_spliced_in_with_no_edit_leaves_the_logits(model: Any, engine: str) -> None:
    logits = locate(model, "logits")
    clean = Plan.of(reads=[logits]).run(model, TEXTS, engine=engine)[logits]
    scale = clean.abs().max()
    width = locate(model, "block_output", 0).width
    for activation in SAE.ACTIVATIONS:
        at = locate(model, "block_output", 0, featurizer=random_sae(width, activation))
        out = Plan.of(reads=[logits], writes=[(at, Scale(1.0))]).run(model, TEXTS, engine=engine)
        assert float((out[logits] - clean).abs().max() / scale) < 1e-6, activation
        ablated = Plan.of(reads=[logits], writes=[(at, Zero())]).run(model, TEXTS, engine=engine)
        assert not torch.allclose(ablated[logits], clean), activation


@pytest.mark.parametrize("engine", ENGINES)
def test_a_featurized_read_and_write(model: Any, engine: str) -> None:
    before = locate(model, "block_input", 0, position={"index": -1})
    plain_at = locate(model, "block_output", 0, position={"index": -1})
    sub = Subspace(4, seed=5)
    at = locate(model, "block_output", 0, position={"index": -1}, featurizer=sub)
    logits = locate(model, "logits")
    clean = Plan.of(reads=[before, plain_at, logits]).run(model, TEXTS, engine=engine)
    read = Plan.of(reads=[at]).run(model, TEXTS, engine=engine)[at]
    assert read.shape == (len(TEXTS), 1, 4)
    torch.testing.assert_close(read, clean[plain_at] @ sub.matrix.T, rtol=0, atol=0)
    new = read + 3.0
    out = Plan.of(reads=[before, plain_at, at, logits], writes=[(at, new)]).run(
        model, TEXTS, engine=engine
    )
    assert torch.equal(out[before], clean[before])  # read before the write: kept
    torch.testing.assert_close(out[at], new, atol=1e-5, rtol=1e-5)  # the features written
    # what the subspace leaves out stays
    rest = torch.eye(sub.width) - sub.matrix.T @ sub.matrix
    torch.testing.assert_close(out[plain_at] @ rest, clean[plain_at] @ rest, atol=1e-5, rtol=0)
    assert not torch.allclose(out[logits], clean[logits])  # and it reaches what follows


def test_the_engines_agree_on_featurized_work(model: Any) -> None:
    bases, sources = _pairs(model)
    logits = locate(model, "logits")
    width = _patch(model).width
    for f in featurizers(width):
        runs = [interchange(model, [_patch(model, f)], bases, sources, engine=e) for e in ENGINES]
        assert torch.equal(runs[0].logits, runs[1].logits), f
        at = locate(model, "block_output", 0, position={"index": -1}, featurizer=f)
        reads = [
            Plan.of(reads=[at, logits], writes=[(at, Scale(0.5))]).run(model, TEXTS, engine=e)
            for e in ENGINES
        ]
        assert torch.equal(reads[0][at], reads[1][at]), f
        assert torch.equal(reads[0][logits], reads[1][logits]), f


def test_inverses_round_trip() -> None:
    width = 16
    x = torch.randn(5, 3, width, generator=_gen(2))
    for f in featurizers(width):
        f.bind(width, "a test place")
        features = f.read(x)
        # writing a tensor's own features gives the tensor back
        torch.testing.assert_close(f.write(x, features), x, atol=1e-5, rtol=1e-5)
        if isinstance(f, SAE):
            continue  # an SAE's decode has no inverse; its write keeps the error term
        # a basis with k <= d: the features of the way back are the features
        torch.testing.assert_close(f.read(f.inverse(features)), features, atol=1e-4, rtol=1e-4)
    square = Linear(torch.randn(width, width, generator=_gen(4)))
    assert square.inverse_kind == "inverse"
    torch.testing.assert_close(square.inverse(square.read(x)), x, atol=1e-4, rtol=1e-4)
    assert Linear(torch.randn(3, width)).inverse_kind == "pseudo-inverse"


def test_matrices_and_masks() -> None:
    width = 12
    for f in (
        Subspace(5, width=width),
        Subspace(5, "cayley", width=width),
        PCA.fit(torch.randn(40, width), 5),
    ):
        m = f.matrix
        assert m.shape == (5, width)
        torch.testing.assert_close(m @ m.T, torch.eye(5), atol=1e-5, rtol=0)
    x = torch.randn(100, width)
    pca = PCA.fit(x, 3)
    assert torch.allclose(pca.read(x).mean(0), torch.zeros(3), atol=1e-5)  # centred
    variances = pca.read(x).var(0)
    assert bool((variances[:-1] >= variances[1:]).all())  # in order of variance
    inner = Subspace(6, width=width)
    for kind in Gate.KINDS:
        gate = Gate(inner, kind).eval()
        m = gate.mask()
        assert m.shape == (6,) and bool(((m >= 0) & (m <= 1)).all()), kind
    boundary = Gate(inner, "boundary", temperature=0.1).mask()
    assert bool((boundary[:-1] >= boundary[1:]).all())  # the first features swap first


def test_a_subspace_and_a_gate_train() -> None:
    """The swap is differentiable in the subspace and the gate (as DAS trains them)."""
    width = 8
    gate = Gate(Subspace(3, width=width), "sigmoid")
    base, source = torch.randn(4, width), torch.randn(4, width)
    loss = (gate.swap(base, source) - source).pow(2).sum()
    loss.backward()
    grads = [p.grad for p in gate.parameters()]
    assert grads and all(g is not None and bool(g.abs().sum() > 0) for g in grads)
    m = gate.inner.matrix.detach()
    torch.testing.assert_close(m @ m.T, torch.eye(3), atol=1e-5, rtol=0)


def test_save_and_load_keep_the_place(tiny_model: Callable[..., Any], tmp_path: Path) -> None:
    model = tiny_model("tiny:llama")
    width = locate(model, "block_output", 1).width
    for i, f in enumerate(featurizers(width)):
        at = locate(model, "block_output", 1, featurizer=f)
        path = str(tmp_path / f"f{i}.safetensors")
        f.save(path, at, model)
        meta = fitted_at(path)
        assert (meta["component"], meta["layer"], meta["head"], meta["width"]) == (
            "block_output",
            "1",
            "",
            str(width),
        )
        assert meta["family"] == "llama" and meta["checkpoint"]
        again = load(path, onto=at)
        assert again == f and type(again) is type(f)
        assert pickle.loads(pickle.dumps(at)) == at  # an address with its featurizer
    head = locate(model, "attention_z", 1, head=0)
    with pytest.raises(FeaturizerRefused, match=f"{width} wide.*{head.width} wide"):
        load(str(tmp_path / "f1.safetensors"), onto=head)


def test_featurizers_that_do_not_fit_are_refused(tiny_model: Callable[..., Any]) -> None:
    model = tiny_model("tiny:llama", probs=True)
    width = locate(model, "block_output", 0).width
    at = locate(model, "block_output", 0, position={"index": -1}, featurizer=Subspace(3))
    skew = torch.randn(3, width)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: Subspace(3, matrix=skew), "orthonormal rows"),
        (
            lambda: locate(model, "block_output", 0, featurizer=random_sae(width + 2)),
            f"{width + 2} wide, and this place is {width} wide",
        ),
        (
            lambda: locate(model, "attention_probs", 0, head=0, featurizer=Identity()),
            "states none here",
        ),
        (lambda: locate(model, "block_output", 0, featurizer=Subspace(width + 1)), "k <="),
        (lambda: locate(model, "block_output", 0, featurizer="pca"), "no featurizer"),
        (
            lambda: Plan.of(writes=[(at, torch.zeros(len(TEXTS), 1, width))]).run(model, TEXTS),
            "takes the 3 features",
        ),
        (
            lambda: Plan.of(writes=[(at, Scale(torch.zeros(width)))]).run(model, TEXTS),
            f"{width} wide, and the 3 features",
        ),
        (
            lambda: Plan.of(writes=[(at, torch.full((2, 1, 3), float("nan")))]).run(model, TEXTS),
            "NaN or inf",
        ),
    ]
    for case, says in cases:
        with pytest.raises(CausalabError, match=says) as caught:
            case()
        assert "\n" not in str(caught.value)


def test_a_featurized_read_and_write_in_generation(tiny_model: Callable[..., Any]) -> None:
    from causalab_mini import compat

    if not compat.is_08():
        pytest.skip("Plan.generate needs nnsight 0.8")
    model = tiny_model("tiny:llama")
    model.tokenizer.padding_side = "left"
    sub = Subspace(4, seed=7)
    at = locate(model, "block_output", 1, position={"index": -1}, featurizer=sub)
    plain_at = locate(model, "block_output", 1, position={"index": -1})
    run = Plan.of(reads=[at, plain_at]).generate(model, TEXTS, max_new_tokens=3, do_sample=False)
    for step in run.steps:
        assert step[at].shape == (len(TEXTS), 1, 4)
        torch.testing.assert_close(step[at], step[plain_at] @ sub.matrix.T, rtol=0, atol=0)
    zeroed = Plan.of(reads=[at], writes=[(at, Zero())]).generate(
        model, TEXTS, max_new_tokens=3, do_sample=False
    )
    for step in zeroed.steps:  # the read after the write: its features are zero
        torch.testing.assert_close(step[at], torch.zeros_like(step[at]), rtol=0, atol=1e-5)
