"""The sweep's certification of one loaded model: every component located at every
layer, read in one trace, every check of ``causalab_mini.tools.checks`` run on the
values, and each component judged ok, refused (with the model's reason) or broken."""

from __future__ import annotations

from typing import Any

from causalab_mini.generated import COMPONENTS
from causalab_mini.tools import certify as cert
from causalab_mini.tools.checks import CHECKS, CheckResult, Context, row_components
from causalab_mini.tools.checks.recompute import raw_outputs_of
from causalab_mini.tools.verdicts import ComponentState

GENERIC = ("not found", "unknown error", "failed")


class _Checks:
    """Collects, per component, the checks that covered it and whether they held.
    A guard (the layout a per-head component states) can break a component but never
    certifies one: it says nothing of the values."""

    def __init__(self) -> None:
        self.by_component: dict[str, list[CheckResult]] = {}
        self.guards: dict[str, list[CheckResult]] = {}

    def add(self, result: CheckResult) -> None:
        for component in result.components:
            self.by_component.setdefault(component, []).append(result)

    def guard(self, result: CheckResult) -> None:
        for component in result.components:
            self.guards.setdefault(component, []).append(result)


def certify(model: Any, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Locate every component at every layer, read them all in one trace, run every
    check that applies, and say per component ok / refused / broken."""
    addresses, result, partial = _locate_all(model)
    unordered: dict[Any, str] = {}
    values_by_address = read_all(model, inputs, addresses, result, partial, unordered)
    v = {key: values_by_address[a] for key, a in addresses.items()}
    checks = _Checks()
    heads_refused = _layout_checks(model, inputs, addresses, checks)
    ctx = check_context(model, inputs, addresses, v, unordered)
    for check in CHECKS:
        for found in check(ctx):
            checks.add(found)
    for name in COMPONENTS:
        if name in result:
            continue
        result[name] = _judged(checks, name)
        if name in partial:
            extra = dict(partial[name])
            if result[name]["state"] == ComponentState.BROKEN:  # keep what broke it as the reason
                extra["refused_reason"] = extra.pop("reason")
            result[name].update(extra)
        if name in heads_refused:
            result[name]["heads_refused"] = heads_refused[name]
    for name, notes in ctx.notes.items():  # a check's figures (the lens identity's)
        if name in result:
            result[name].update(notes)
    return result


def _locate_all(
    model: Any,
) -> tuple[dict[tuple[str, int | None], Any], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every component located at every layer: the addresses by (component, layer);
    the components refused (or broken, where the reason is generic) on every layer;
    and those refused on some layers only (certified where they exist)."""
    from causalab_mini.components import ComponentError, locate

    n = model.internals.num_layers
    addresses: dict[tuple[str, int | None], Any] = {}
    result: dict[str, dict[str, Any]] = {}
    partial: dict[str, dict[str, Any]] = {}
    for name, spec in COMPONENTS.items():
        refusals: dict[int | None, str] = {}
        for layer in range(n) if spec.per_layer else [None]:
            try:
                addresses[(name, layer)] = locate(model, name, layer)
            except ComponentError as exc:
                refusals[layer] = str(exc)
        if not refusals:
            continue
        reason = next(iter(refusals.values()))
        generic = any(g in reason.lower() for g in GENERIC) and "Its operations are" not in reason
        if generic:
            result[name] = {"state": ComponentState.BROKEN, "reason": reason}
        elif len(refusals) == (n if spec.per_layer else 1):
            result[name] = {"state": ComponentState.REFUSED, "reason": reason}
        else:  # certified where it exists, refused (with the reason) on the other layers
            partial[name] = {
                "refused_layers": sorted(k for k in refusals if k is not None),
                "reason": reason,
            }
    return addresses, result, partial


def _judged(checks: _Checks, name: str) -> dict[str, Any]:
    """A located component's entry: broken where a check (or guard) failed or none
    covers it, else ok, with the checks that covered it."""
    done = checks.by_component.get(name, [])
    failed = [c for c in (*checks.guards.get(name, []), *done) if c.status is ComponentState.BROKEN]
    if failed:
        return {
            "state": ComponentState.BROKEN,
            "reason": "; ".join(f"{c.description} ({c.detail})" for c in failed[:3]),
            "checks": sorted({c.description for c in done}),
        }
    if not done:
        return {
            "state": ComponentState.BROKEN,
            "reason": "resolved, but no check covers it on this model",
        }
    return {"state": ComponentState.OK, "checks": sorted({c.description for c in done})}


def check_context(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    v: dict[tuple[str, int | None], Any],
    unordered: dict[Any, str],
) -> Context:
    """What the checks read, besides the components read: the rows' values (with the
    rows an identity names that no component reads: post_ln's sums before the norms),
    transformers' own forward (hidden states; attentions under eager attention), what
    attention reads where its input norm is checked, and the modules' own outputs."""

    row_of = row_components()
    places = {
        (COMPONENTS[name].target, layer): t
        for (name, layer), t in v.items()
        if COMPONENTS[name].kind == "boundary"
    }
    wanted = {
        row
        for text in cert.structure_identities(model)
        for row in cert.identity_rows(text)
        if row not in row_of
    }
    if wanted:
        places.update(cert.read_places(model, inputs, sorted(wanted)))
    hf = cert.oracle_outputs(
        model,
        inputs,
        output_hidden_states=True,
        output_attentions=model.attention_probs_enabled,
    )
    attn_inputs: dict[tuple[str, int | None], Any] = {}
    if any(k[0] == "attention_input_norm" for k in v):
        attn_inputs = cert.read_places(model, inputs, ["attentions_input"])
    raw = raw_outputs_of(model, inputs, addresses)
    return Context(model, inputs, addresses, v, raw, hf, places, attn_inputs, unordered)


def _layout_checks(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    checks: _Checks,
) -> dict[str, str]:
    """Each per-head component's stated layout against the tensor the model holds
    there, per layer: the heads on their axis, the head size (bhsd, bshd), heads x
    head size == the last axis as handed on (and the stated width). A component whose
    head size is not stated unambiguously reads whole and refuses one head: the
    reason is returned by component, to be said beside its state."""
    from causalab_mini.components import Plan, layout_mismatch

    per_head = {
        key: a for key, a in addresses.items() if a.per_head != "none" and a.layout is not None
    }
    refused: dict[str, str] = {}
    if not per_head:
        return refused
    held = Plan.of(reads=per_head.values()).run(model, inputs, held=True)
    for (name, layer), address in per_head.items():
        reason = layout_mismatch(address, tuple(held[address].shape))
        if address.head_size_unknown is not None:
            refused.setdefault(name, address.head_size_unknown)
        checks.guard(
            CheckResult.of(
                (name,),
                "the heads and head size stated == the tensor's, heads x head size == its width",
                reason is None,
                reason or f"layer {layer}",
            )
        )
    return refused


def _is_out_of_order(exc: BaseException) -> bool:
    """nnsight's refusal of a read after its value has passed (OutOfOrderError)."""
    names = {k.__name__ for k in type(exc).__mro__}
    text = str(exc)
    return "OutOfOrderError" in names or "ran past it" in text or "out of order" in text


def _run_in_order(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    unordered: dict[Any, str],
) -> dict[Any, Any]:
    """Plan.run over ``addresses``. Where nnsight refuses a whole-model place read after
    the layers' places (0.8 serves a module's calls in order, so a module that runs
    more than once in a forward, as Dory's norm, has passed its first call by then),
    the place is read alone and named in ``unordered`` with nnsight's refusal."""
    from causalab_mini.components import Plan

    try:
        values: dict[Any, Any] = Plan.of(reads=addresses.values()).run(model, inputs)
        return values
    except Exception as exc:
        if not _is_out_of_order(exc):
            raise
    per_layer = [a for key, a in addresses.items() if key[1] is not None]
    values = dict(Plan.of(reads=per_layer).run(model, inputs))
    for key, address in addresses.items():
        if key[1] is not None:
            continue
        try:
            values[address] = Plan.of(reads=[*per_layer, address]).run(model, inputs)[address]
        except Exception as exc:
            if not _is_out_of_order(exc):
                raise
            values[address] = Plan.of(reads=[address]).run(model, inputs)[address]
            unordered[address] = (
                "nnsight cannot read it after the layers' places (its module runs more "
                f"than once in a forward): {str(exc).strip().splitlines()[-1][:200]}"
            )
    return values


def read_all(
    model: Any,
    inputs: dict[str, Any],
    addresses: dict[tuple[str, int | None], Any],
    result: dict[str, dict[str, Any]],
    partial: dict[str, dict[str, Any]],
    unordered: dict[Any, str] | None = None,
) -> dict[Any, Any]:
    """Read every address in one trace. A needle after the first is looked up inside
    the function the previous call dispatches to, so only a trace finds that it names
    no operation there: such a component is refused where it does not resolve (with
    the lookup's own message), and the rest are read. Whole-model places nnsight
    cannot read after the layers' places are read alone (``_run_in_order``)."""
    from causalab_mini.components import Plan
    from causalab_mini.ops import OperationNotFound

    unordered = {} if unordered is None else unordered
    try:
        return _run_in_order(model, inputs, addresses, unordered)
    except OperationNotFound:
        failing: dict[str, dict[int | None, str]] = {}
        for key, address in addresses.items():
            if len(address.needles) < 2:
                continue
            try:
                Plan.of(reads=[address]).run(model, inputs)
            except OperationNotFound as exc:
                failing.setdefault(key[0], {})[key[1]] = str(exc)
        if not failing:
            raise
    for name, by_layer in failing.items():
        for layer in by_layer:
            del addresses[(name, layer)]
        reason = f"component {name!r}: {next(iter(by_layer.values()))}"
        if any(key[0] == name for key in addresses):  # resolved on the other layers
            earlier = partial.get(name, {}).get("refused_layers", [])
            partial[name] = {
                "refused_layers": sorted({*earlier, *(k for k in by_layer if k is not None)}),
                "reason": reason,
            }
        else:
            result[name] = {"state": ComponentState.REFUSED, "reason": reason}
            partial.pop(name, None)
    return _run_in_order(model, inputs, addresses, unordered)
