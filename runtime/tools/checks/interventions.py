"""The sweep's checks of intervention mechanisms and featurizers
(``causalab_mini.mechanisms``, ``causalab_mini.featurizers``), on the probe layer's
``block_output`` of every architecture, on each engine that serves it:

- ``Add(0)``, ``Scale(1)`` and ``Lerp(v, 0)`` leave the logits torch.equal to a clean
  run; ``Lerp(v, 1)`` is ``Set(v)``, ``Zero()`` is ``Set(zeros)``, a ``Mean`` of one
  row is ``Set`` to that row;
- every mechanism keeps the read before it (``block_input`` of the layer), reads back
  exactly ``apply`` of the clean tensor, and changes the logits;
- the hooks engine equals the nnsight engine on every mechanism;
- an ``SAE`` spliced in with no edit leaves the logits within 1e-6 relative;
- where the model is fed by text: an ``Identity`` interchange is the plain one
  (torch.equal), a full-rank ``Subspace`` one within 1e-5 relative, a k = 0 swap
  changes nothing, and the engines agree on a featurized interchange."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.interchange import NEXT
from causalab_mini.tools.checks.base import CheckResult
from causalab_mini.tools.checks.positions import SENTENCES, equal_length_pairs, text_fed

IDENTITIES = "Add(0), Scale(1), Lerp(v, 0) leave the logits torch.equal to a clean run"
SETS = "Lerp(v, 1) == Set(v), Zero() == Set(zeros), Mean(one row) == Set(that row)"
CONTRACT = "every mechanism keeps an earlier read, reads back apply(clean), changes the logits"
ENGINES = "engine='hooks' == engine='nnsight' on every mechanism (torch.equal)"
SPLICE = "an SAE spliced in with no edit leaves the logits within 1e-6 relative"
IDENTITY_SWAP = "Identity-featurizer interchange == plain interchange (torch.equal)"
FULL_RANK = "full-rank Subspace interchange == plain interchange within 1e-5 relative"
NOTHING = "a k = 0 Subspace interchange changes nothing (torch.equal)"
FEATURIZED_ENGINES = "engine='hooks' == engine='nnsight' on a featurized interchange (torch.equal)"


def _vector(width: int, seed: int, like: Any) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(width, generator=g).to(dtype=like.dtype, device=like.device)


def mechanisms_of(clean: Any) -> list[Any]:
    """One of every mechanism, with values that change ``clean`` (a read's tensor)."""
    from causalab_mini import mechanisms as m

    width, rows = int(clean.shape[-1]), int(clean.shape[0])
    v = _vector(width, 1, clean)
    out = [
        m.Set(clean * 0.5 + 1),
        m.Add(v),
        m.Scale(0.5),
        m.Lerp(v, 0.25),
        m.Zero(),
        m.Mean(_vector(width, 3, clean)),
        m.Clamp(-0.1 * float(clean.abs().max()), 0.1 * float(clean.abs().max())),
        m.ProjectOut(v),
        m.Renormalize(3 * v),
    ]
    if rows > 1:
        out.append(m.Resample(tuple(reversed(range(rows)))))
    return out


def _engines(model: Any, inputs: Any, reads: list[Any]) -> list[str]:
    """The engines that serve ``reads`` (nnsight always; hooks where it does)."""
    from causalab_mini.errors import HooksRefused
    from causalab_mini.plan import Plan

    try:
        Plan.of(reads).run(model, inputs, engine="hooks")
    except HooksRefused:
        return ["nnsight"]
    return ["nnsight", "hooks"]


def _rel(a: Any, b: Any) -> float:
    scale = float(b.detach().abs().max()) or 1.0
    return float((a.detach() - b.detach()).abs().max()) / scale


def mechanism_identities(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.plan import Plan

    probe = min(1, ctx.n - 1)
    at = ctx.addresses.get(("block_output", probe))
    before = ctx.addresses.get(("block_input", probe))
    logits = ctx.addresses.get(("logits", None))
    if at is None or before is None or logits is None or at in ctx.unordered:
        return
    model, inputs = ctx.model, ctx.inputs
    reads = [before, at, logits]
    runs: dict[str, list[Any]] = {}
    for engine in _engines(model, inputs, reads):
        clean = Plan.of(reads).run(model, inputs, engine=engine)

        def run(value: Any, engine: str = engine) -> dict[Any, Any]:
            out: dict[Any, Any] = Plan.of(reads, [(at, value)]).run(model, inputs, engine=engine)
            return out

        x = clean[at]
        v = _vector(int(x.shape[-1]), 4, x)
        kept = [
            m for m in (_add0(x), _scale1(), _lerp0(v)) if not _equal(run(m)[logits], clean[logits])
        ]
        yield CheckResult.of(
            ("block_output",), f"{IDENTITIES} ({engine})", not kept, str(kept)[:200]
        )
        ok = (
            _equal(run(_lerp1(v))[logits], run(v.expand(x.shape).clone())[logits])
            and _equal(run(_zero())[logits], run(x.new_zeros(x.shape))[logits])
            and _equal(run(_mean(x[0]))[logits], run(x[0].expand(x.shape).clone())[logits])
        )
        yield CheckResult.of(("block_output",), f"{SETS} ({engine})", ok)
        bad, outs = [], []
        for mechanism in mechanisms_of(x):
            out = run(mechanism)
            outs.append(out)
            if not (
                _equal(out[before], clean[before])
                and _equal(*(_real(ctx, t, mechanism) for t in (out[at], mechanism.apply(x))))
                and not bool((out[logits] == clean[logits]).all())
            ):
                bad.append(type(mechanism).__name__)
        yield CheckResult.of(("block_output",), f"{CONTRACT} ({engine})", not bad, ", ".join(bad))
        runs[engine] = outs
    if len(runs) == 2:
        differ = [i for i, (a, b) in enumerate(zip(*runs.values(), strict=True)) if not _same(a, b)]
        yield CheckResult.of(
            ("block_output",), ENGINES, not differ, f"differ at {differ}" if differ else ""
        )
    yield from _splice(ctx, at, logits)


def _real(ctx: Any, value: Any, mechanism: Any = None) -> Any:
    """``value``'s real tokens (the attention mask's), where it is (batch, seq, ...):
    padding is no token of the text, and a forward may change it in place after the
    place (XLM zeroes its block output there); a ``Resample`` takes its rows' tokens
    from other rows, so only the tokens real in both rows."""
    mask = ctx.inputs.get("attention_mask")
    if mask is None or tuple(mask.shape) != tuple(value.shape[:2]):
        return value
    real = mask.bool()
    rows = getattr(mechanism, "rows", None)
    if rows is not None and getattr(mechanism, "reference", None) is None:
        real = real & real[list(rows)]
    return value[real]


def _same(a: dict[Any, Any], b: dict[Any, Any]) -> bool:
    return all(_equal(a[k], b[k]) for k in a)


def _equal(a: Any, b: Any) -> bool:
    import torch

    return bool(a.shape == b.shape and torch.equal(a, b))


def _add0(x: Any) -> Any:
    from causalab_mini.mechanisms import Add

    return Add(x.new_zeros(x.shape[-1]))


def _scale1() -> Any:
    from causalab_mini.mechanisms import Scale

    return Scale(1.0)


def _lerp0(v: Any) -> Any:
    from causalab_mini.mechanisms import Lerp

    return Lerp(v, 0.0)


def _lerp1(v: Any) -> Any:
    from causalab_mini.mechanisms import Lerp

    return Lerp(v, 1.0)


def _zero() -> Any:
    from causalab_mini.mechanisms import Zero

    return Zero()


def _mean(row: Any) -> Any:
    from causalab_mini.mechanisms import Mean

    return Mean(row.clone())


def random_sae(width: int, seed: int = 0) -> Any:
    """A random ReLU SAE of ``width`` (twice as many features), in float32."""
    import torch

    from causalab_mini.featurizers import SAE

    g = torch.Generator().manual_seed(seed)
    m = 2 * width
    return SAE(
        torch.randn(width, m, generator=g) / width**0.5,
        torch.randn(m, width, generator=g) / m**0.5,
        torch.randn(m, generator=g) * 0.1,
        torch.randn(width, generator=g) * 0.1,
    ).requires_grad_(False)


def _splice(ctx: Any, at: Any, logits: Any) -> Iterator[CheckResult]:
    import torch

    from causalab_mini.components import locate
    from causalab_mini.mechanisms import Scale
    from causalab_mini.plan import Plan

    model, inputs = ctx.model, ctx.inputs
    if at.width is None or not torch.empty(0, dtype=_dtype(model)).is_floating_point():
        return
    sae = random_sae(at.width).to(_dtype(model))
    spliced = locate(model, at.component, at.layer, featurizer=sae)
    clean = Plan.of([logits]).run(model, inputs)[logits]
    out = Plan.of([logits], [(spliced, Scale(1.0))]).run(model, inputs)[logits]
    error = _rel(out, clean)
    yield CheckResult.of(("block_output",), SPLICE, error < 1e-6, f"relative error {error:.3g}")


def _dtype(model: Any) -> Any:
    import torch

    from causalab_mini.mechanisms import model_dtype

    return model_dtype(model) or torch.float32


def _orthogonal(width: int) -> Any:
    """A random orthogonal matrix in float64: a float32 one is orthogonal to ~1e-7
    only, which a deep or scaled model amplifies to ~2e-5 in the logits (LongCat-Flash);
    the swaps compute in float64 (``LinearBasis.swap``)."""
    import torch

    g = torch.Generator().manual_seed(3)
    return torch.linalg.qr(torch.randn(width, width, generator=g, dtype=torch.float64))[0].T


def _unpatched(model: Any, bases: list[str], sources: list[str], engine: str) -> Any:
    """The bases' last-token logits in the batch an interchange of them with
    ``sources`` runs (bases then sources, tokenized together), nothing written: a
    mixture of experts groups a batch's tokens by expert, so only the same batch is
    the same up to the last bit."""
    from causalab_mini.components import locate
    from causalab_mini.plan import Plan
    from causalab_mini.positions import encode

    last = locate(model, "logits", position=NEXT)  # where interchange reads the logits
    out = Plan.of([last]).run(model, encode(model, [*bases, *sources]), engine=engine)
    return out[last][: len(bases), 0]


def featurizer_interchange(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.featurizers import Identity, Subspace
    from causalab_mini.interchange import interchange

    if not text_fed(ctx) or ("block_input", 0) not in ctx.addresses:
        return
    model = ctx.model
    if model.resolution.checks.interchange_unavailable is not None:
        return  # the family file says why (docs/families.md)
    probe = min(1, ctx.n - 1)
    pairs = equal_length_pairs(model)
    if pairs is None:
        pairs = (list(SENTENCES[:3]), list(SENTENCES[3:6]))
    bases, sources = pairs

    def patch(featurizer: Any = None) -> Any:
        return locate(model, "block_input", probe, position={"index": -1}, featurizer=featurizer)

    try:
        plain_patch = patch()
    except ComponentError:
        return
    width = plain_patch.width
    if width is None:
        return
    engines = _engines(model, list(SENTENCES[:2]), [plain_patch])
    results: dict[str, Any] = {}
    for engine in engines:
        plain = interchange(model, [plain_patch], bases, sources, engine=engine).logits
        same = interchange(model, [patch(Identity())], bases, sources, engine=engine).logits
        ok = _equal(same, plain)
        yield CheckResult.of(("block_input",), f"{IDENTITY_SWAP} ({engine})", ok)
        full = Subspace(width, matrix=_orthogonal(width)).requires_grad_(False)
        out = interchange(model, [patch(full)], bases, sources, engine=engine).logits
        error = _rel(out, plain)
        yield CheckResult.of(
            ("block_input",), f"{FULL_RANK} ({engine})", error < 1e-5, f"relative {error:.3g}"
        )
        results[engine] = out
        clean = _unpatched(model, bases, sources, engine)
        none = interchange(model, [patch(Subspace(0))], bases, sources, engine=engine).logits
        yield CheckResult.of(("block_input",), f"{NOTHING} ({engine})", _equal(none, clean))
    if len(results) == 2:
        ok = _equal(results["nnsight"], results["hooks"])
        yield CheckResult.of(("block_input",), FEATURIZED_ENGINES, ok)


__all__ = ["featurizer_interchange", "mechanism_identities", "mechanisms_of", "random_sae"]
