"""The sweep's check of the second engine (``causalab_mini.hooks``): every component
the hooks engine serves, on the probe layer and the whole-model places, gives tensors
``torch.equal`` to the nnsight engine's, read alone, read together, one head's slice,
and written (the read before the write, the place after it and the logits); a read and
a write at a position and an interchange likewise. A component the hooks engine
refuses is noted with its reason (``engines`` in the component's entry), and a
component where the two engines disagree (or the hooks engine fails) is broken: it
cannot count as certified."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from causalab_mini.errors import CausalabError
from causalab_mini.tools.checks.base import CheckResult
from causalab_mini.tools.checks.positions import SENTENCES, text_fed

READS = "engine='hooks' reads == engine='nnsight' reads (torch.equal)"
HEAD = "engine='hooks' == engine='nnsight' on one head's slice, read and written (torch.equal)"
WRITES = (
    "engine='hooks' write == engine='nnsight' write: the read before, the place after, "
    "the logits (torch.equal)"
)
POSITIONS = "engine='hooks' == engine='nnsight' at a position, read and written (torch.equal)"
INTERCHANGE = "engine='hooks' interchange == engine='nnsight' interchange (torch.equal)"
GRID = (
    "patching grid on pairs of different lengths: engine='hooks' == engine='nnsight' "
    "(torch.equal), each cell == its one-cell interchange (1e-5 relative), a cell moves "
    "the base"
)
BOTH = "nnsight, hooks"


def _equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a, b))


class _BothRefuse(CausalabError):  # type: ignore[misc]  # Any to mypy
    """The nnsight engine refused the plan, and the hooks engine refused it too."""


def _both(plan: Any, model: Any, inputs: Any) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The plan run by each engine; where nnsight refuses it, the hooks engine must
    refuse it too (``_BothRefuse``), else the run it made is a failure."""
    try:
        want = plan.run(model, inputs)
    except Exception as exc:
        try:
            plan.run(model, inputs, engine="hooks")
        except Exception:
            raise _BothRefuse(f"both engines refuse: {str(exc)[:160]}") from None
        raise AssertionError(f"nnsight refuses ({str(exc)[:160]}) and hooks ran it") from None
    return want, plan.run(model, inputs, engine="hooks")


def _value(read: Any) -> Any:
    """A value to write where ``read`` was read: another tensor of its shape and dtype."""
    import torch

    if not isinstance(read, torch.Tensor) or not read.is_floating_point():
        return None
    return read * 0.5 + 1


def _outcome(ctx: Any, component: str, name: str, run: Any) -> Iterator[CheckResult]:
    """``run()`` -> (ok, detail); a write the hooks engine refuses (with its reason) is
    noted, the component then served for reads only; anything else it raises is a
    failure, said."""
    from causalab_mini.hooks import HooksRefused

    try:
        ok, detail = run()
    except _BothRefuse as exc:
        ok, detail = True, str(exc)
    except HooksRefused as exc:
        note = ctx.notes.setdefault(component, {})
        note["engines"] = f"{BOTH} (reads only)"
        note["hooks_refused"] = str(exc).split("\n", 1)[0]
        return
    except Exception as exc:  # the hooks engine broke where the nnsight engine ran
        ok, detail = False, f"{type(exc).__name__}: {str(exc)[:200]}"
    yield CheckResult.of((component,), name, ok, detail)


def _probe_keys(ctx: Any, probe: int) -> list[tuple[str, int | None]]:
    """Each component at the probe layer, or, where it is refused there (a hybrid
    stack's attention-only rows), at the first layer it has."""
    layers: dict[str, list[int | None]] = {}
    for name, layer in ctx.addresses:
        layers.setdefault(name, []).append(layer)
    keys: list[tuple[str, int | None]] = []
    for name, at in layers.items():
        if probe in at:
            keys.append((name, probe))
        elif None in at:
            keys.append((name, None))
        else:
            keys.append((name, min(int(x) for x in at if x is not None)))
    return keys


def _together(model: Any, inputs: Any, served: dict[Any, Any]) -> Iterator[CheckResult]:
    """Every served component read in one run, by both engines."""
    from causalab_mini.plan import Plan

    together = Plan.of(served.values())
    try:
        want_all = together.run(model, inputs)
    except Exception:
        return  # nnsight refuses them in one trace; each alone was compared
    got_all = together.run(model, inputs, engine="hooks")
    for key, address in served.items():
        ok = _equal(want_all[address], got_all[address])
        yield CheckResult.of((key[0],), READS, ok, "" if ok else f"{key[0]}[{key[1]}] differs")


def hooks_engine(ctx: Any) -> Iterator[CheckResult]:
    from causalab_mini.hooks import HooksRefused
    from causalab_mini.plan import Plan

    model, inputs = ctx.model, ctx.inputs
    probe = min(1, ctx.n - 1)
    keys = _probe_keys(ctx, probe)
    served: dict[tuple[str, int | None], Any] = {}
    clean: dict[Any, Any] = {}  # the nnsight engine's read of each served address alone
    for key in keys:
        address = ctx.addresses[key]
        if address in ctx.unordered:
            continue  # broken by its own check
        note = ctx.notes.setdefault(key[0], {})
        try:
            plan = Plan.of([address])
            got = plan.run(model, inputs, engine="hooks")[address]
        except HooksRefused as exc:
            note["engines"] = "nnsight"
            note["hooks_refused"] = str(exc).split("\n", 1)[0]
            continue
        except Exception as exc:
            note["engines"] = "nnsight"
            detail = f"{type(exc).__name__}: {str(exc)[:200]}"
            yield CheckResult.of((key[0],), READS, False, detail)
            continue
        want = clean[address] = plan.run(model, inputs)[address]
        served[key] = address
        note["engines"] = BOTH
        ok = _equal(want, got)
        yield CheckResult.of(
            (key[0],), READS, ok, "" if ok else f"{key[0]}[{key[1]}] differs alone"
        )
    if not served:
        return
    yield from _together(model, inputs, served)
    ordered = sorted(served.items(), key=lambda kv: kv[1].rank)
    logits = served.get(("logits", None))
    for i, (key, address) in enumerate(ordered):
        if not address.writable or key[0] == "logits":
            continue
        before = ordered[i - 1][1] if i else None
        yield from _outcome(
            ctx,
            key[0],
            WRITES,
            lambda a=address, b=before: _write(model, inputs, a, b, logits, clean[a]),
        )
        if address.per_head != "none" and address.heads:
            yield from _outcome(ctx, key[0], HEAD, lambda k=key: _head(model, inputs, k, logits))
    if text_fed(ctx) and ("block_input", probe) in served:
        yield from _outcome(ctx, "block_input", POSITIONS, lambda: _positions(model, probe))
    if text_fed(ctx) and ("block_output", probe) in served:
        yield from _outcome(ctx, "block_output", INTERCHANGE, lambda: _interchange(model, probe))
        yield from _outcome(ctx, "block_output", GRID, lambda: _grid(model, probe))


def _write(
    model: Any, inputs: Any, address: Any, before: Any, logits: Any, clean: Any
) -> tuple[bool, str]:
    """The write of a value made of ``clean`` (the place's read) by both engines."""
    from causalab_mini.plan import Plan

    value = _value(clean)
    if value is None:
        return True, "not a float tensor: compared as reads only"
    reads = [a for a in (before, address, logits) if a is not None]
    want, got = _both(Plan.of(reads, [(address, value)]), model, inputs)
    bad = [str(a.component) for a in reads if not _equal(want[a], got[a])]
    return not bad, f"differ: {', '.join(bad)}" if bad else ""


def _head(model: Any, inputs: Any, key: tuple[str, int | None], logits: Any) -> tuple[bool, str]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.plan import Plan

    try:
        address = locate(model, key[0], key[1], head=0)
    except ComponentError as exc:
        return True, f"no head address: {str(exc)[:120]}"
    want, got = _both(Plan.of([address]), model, inputs)
    if not _equal(want[address], got[address]):
        return False, "the head's read differs"
    value = _value(want[address])
    if value is None:
        return True, "read only"
    reads = [address] + ([logits] if logits is not None else [])
    want, got = _both(Plan.of(reads, [(address, value)]), model, inputs)
    bad = [str(a.component) for a in reads if not _equal(want[a], got[a])]
    return not bad, f"differ: {', '.join(bad)}" if bad else ""


def _positions(model: Any, layer: int) -> tuple[bool, str]:
    from causalab_mini.components import locate
    from causalab_mini.plan import Plan

    texts = list(SENTENCES[:2])
    at = locate(model, "block_input", layer, position={"index": -1})
    after = locate(model, "block_output", layer)
    want, got = _both(Plan.of([at, after]), model, texts)
    if not all(_equal(want[a], got[a]) for a in (at, after)):
        return False, "a read at {'index': -1} differs"
    value = want[at] * 0.5 + 1
    want, got = _both(Plan.of([at, after], [(at, value)]), model, texts)
    bad = [str(a.component) for a in (at, after) if not _equal(want[a], got[a])]
    return not bad, f"differ after a write at a position: {', '.join(bad)}" if bad else ""


def _interchange(model: Any, layer: int) -> tuple[bool, str]:
    from causalab_mini.components import locate
    from causalab_mini.interchange import interchange

    patch = locate(model, "block_output", layer, position={"index": -1})
    read = locate(model, "block_input", layer, position={"index": -1})
    bases, sources = list(SENTENCES[:3]), list(SENTENCES[3:6])
    a = interchange(model, [patch], bases, sources, reads=[read], return_sources=True)
    b = interchange(
        model, [patch], bases, sources, reads=[read], return_sources=True, engine="hooks"
    )
    ok = (
        _equal(a.logits, b.logits)
        and _equal(a.sources[0].logits, b.sources[0].logits)
        and _equal(a.reads[read], b.reads[read])
    )
    return ok, "" if ok else "the logits or the read differ"


def _grid(model: Any, layer: int) -> tuple[bool, str]:
    """``interchange.grid`` at one layer, its first and last content token, on three
    pairs of different lengths, padded on each side the family can pad exactly (the
    forwards unembed only the columns the cells read, which differ by side): both
    engines give the same grid, each cell is the one-cell interchange, and patching
    the last token moves the base's logits."""
    from causalab_mini.padding import SIDES, unavailable_sides

    tokenizer = getattr(model, "tokenizer", None)
    sides = [s for s in SIDES if s not in unavailable_sides(model)]
    if tokenizer is None or not sides:
        return _grid_on(model, layer)
    before = tokenizer.padding_side
    details = []
    try:
        for side in sides:
            tokenizer.padding_side = side
            ok, detail = _grid_on(model, layer)
            details.append(f"{side}: {detail}")
            if not ok:
                return False, "; ".join(details)
    finally:
        tokenizer.padding_side = before
    return True, "; ".join(details)


def _grid_on(model: Any, layer: int) -> tuple[bool, str]:
    """The grid check on the tokenizer's padding side as it is set."""
    import torch

    from causalab_mini.components import locate
    from causalab_mini.interchange import grid, interchange

    bases = [SENTENCES[0], SENTENCES[2], SENTENCES[8]]
    sources = [SENTENCES[5], SENTENCES[3], SENTENCES[4]]
    specs = [{"index": 0}, {"index": -1}]
    try:
        want = grid(model, "block_output", [layer], specs, bases, sources)
    except CausalabError as exc:
        try:
            grid(model, "block_output", [layer], specs, bases, sources, engine="hooks")
        except CausalabError:
            raise _BothRefuse(f"both engines refuse: {str(exc)[:160]}") from None
        return False, f"nnsight refuses ({str(exc)[:160]}) and hooks ran it"
    got = grid(model, "block_output", [layer], specs, bases, sources, engine="hooks")
    if want.layers != (layer,):
        return True, f"layer {layer} refused: {want.refused.get(layer, '')[:160]}"
    if not _equal(want.logits, got.logits):
        return False, "the engines' grids differ"
    worst = 0.0
    for pi, spec in enumerate(specs):
        patch = locate(model, "block_output", layer, position=spec)
        one = interchange(model, [patch], bases, sources, engine="hooks").logits
        scale = float(one.abs().max().clamp_min(1e-30))
        worst = max(worst, float((got.logits[0, pi] - one).abs().max()) / scale)
    if worst > 1e-5:
        return False, f"a cell differs from its one-cell interchange by {worst:.2e} relative"
    if torch.equal(got.logits[0, -1], got.base_logits):
        return (
            False,
            "patching the last token from another text left the base's logits as they were",
        )
    return True, f"cells within {worst:.1e} of one-cell interchanges"


__all__ = ["BOTH", "hooks_engine"]
