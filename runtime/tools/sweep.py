"""``registry sweep``: every causal-LM architecture of the installed transformers (and
of every other group registry/tiny.yaml names: image-text-to-text wrappers), each
component of registry/components.yaml certified on real tensors or refused with a
reason.

Each architecture runs in its own process (``python -m causalab_mini.tools.sweep TYPE``)
with a timeout, so a hang or a crash never stops the sweep. A component is

* ``ok``      it resolved, and every check that covers it passed;
* ``refused`` the model says why it has no such place (a specific reason);
* ``broken``  it resolved to a tensor that failed a check, a check crashed, or the
              reason is generic.

An architecture that loads is ``certified`` when every component is ok or refused
with a reason of the model, and ``unfinished`` when a component is refused only
because no rule in registry/block_structures.yaml gives its block structure (the
registry has not been told; a family's structure_unknown_reason is a reason).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from causalab_mini.generated import COMPONENTS
from causalab_mini.internals import NO_STRUCTURE_RULE
from causalab_mini.tools import certify as cert
from causalab_mini.tools.checks import CHECKS, Context, row_components
from causalab_mini.tools.checks.recompute import raw_outputs_of
from causalab_mini.tools.verdicts import LOADED, ArchitectureOutcome, ComponentState

GENERIC = ("not found", "unknown error", "failed")


@dataclass
class Result:
    """One architecture's outcome, as the worker reports it."""

    model_type: str
    outcome: ArchitectureOutcome
    reason: str | None = None
    model_class: str | None = None
    structure: str | None = None
    families: list[str] = field(default_factory=list)
    layers: int | None = None
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    group: str | None = None  # registry/tiny.yaml groups (None: causal_lm, older reports)
    # the moved build's manifest (moved, skipped, no_effect) and, over both builds,
    # each build's outcome (tools/builds.py); None: the default build alone
    build: dict[str, Any] | None = None

    def __post_init__(self) -> None:  # read back from JSON: the member of its string
        self.outcome = ArchitectureOutcome(self.outcome)

    def counts(self) -> dict[str, int]:
        out = {state.value: 0 for state in ComponentState}
        for item in self.components.values():
            out[item["state"]] += 1
        return out


# ---------------------------------------------------------------------- checks


class _Checks:
    """Collects, per component, the checks that covered it and whether they held.
    A guard (the layout a per-head component states) can break a component but never
    certifies one: it says nothing of the values."""

    def __init__(self) -> None:
        self.by_component: dict[str, list[tuple[str, bool, str]]] = {}
        self.guards: dict[str, list[tuple[str, bool, str]]] = {}

    def add(self, components: Iterable[str], name: str, ok: bool, detail: str = "") -> None:
        for component in components:
            self.by_component.setdefault(component, []).append((name, ok, detail))

    def guard(self, component: str, name: str, ok: bool, detail: str = "") -> None:
        self.guards.setdefault(component, []).append((name, ok, detail))


def certify(model: Any, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Locate every component at every layer, read them all in one trace, run every
    check that applies, and say per component ok / refused / broken."""
    addresses, result, partial = _locate_all(model)
    unordered: dict[Any, str] = {}
    values_by_address = _read_all(model, inputs, addresses, result, partial, unordered)
    v = {key: values_by_address[a] for key, a in addresses.items()}
    checks = _Checks()
    heads_refused = _layout_checks(model, inputs, addresses, checks)
    ctx = _context(model, inputs, addresses, v, unordered)
    for check in CHECKS:
        for outcome in check(ctx):
            checks.add(outcome.components, outcome.name, outcome.ok, outcome.detail)
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
    failed = [c for c in (*checks.guards.get(name, []), *done) if not c[1]]
    if failed:
        return {
            "state": ComponentState.BROKEN,
            "reason": "; ".join(f"{c[0]} ({c[2]})" for c in failed[:3]),
            "checks": sorted({c[0] for c in done}),
        }
    if not done:
        return {
            "state": ComponentState.BROKEN,
            "reason": "resolved, but no check covers it on this model",
        }
    return {"state": ComponentState.OK, "checks": sorted({c[0] for c in done})}


def _context(
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
            name,
            "the heads and head size stated == the tensor's, heads x head size == its width",
            reason is None,
            reason or f"layer {layer}",
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


def _read_all(
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


def run_one(spec: str) -> Result:
    """Build, load and certify one architecture (in this process), in its group."""
    from causalab_mini.tools.tiny import group_of

    result = _run_one(spec)
    result.group = group_of(result.model_type)
    return result


def _run_one(spec: str) -> Result:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    model_type = spec.removeprefix("tiny:").split("?")[0]
    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools.tiny import TinyBuildError, resolve_model_spec

    for noisy in ("nnterp", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        path = resolve_model_spec(spec if spec.startswith("tiny:") else f"tiny:{spec}")
    except TinyBuildError as exc:
        return Result(
            model_type,
            ArchitectureOutcome.UNBUILDABLE,
            str(exc),
            seconds=time.perf_counter() - started,
        )
    except Exception as exc:
        return Result(
            model_type,
            ArchitectureOutcome.UNBUILDABLE,
            f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - started,
        )
    from causalab_mini.tools.builds import manifest_of

    built = manifest_of(path) or None
    try:
        model = StandardizedTransformer(path, enable_attention_probs=True)
    except Exception as exc:
        first = " ".join(str(exc).split())[:500]
        return Result(
            model_type,
            ArchitectureOutcome.UNLOADABLE,
            f"nnterp cannot load it: {type(exc).__name__}: {first}",
            seconds=time.perf_counter() - started,
            build=built,
        )
    result = Result(
        model_type,
        ArchitectureOutcome.CERTIFIED,
        model_class=model.internals.model_class,
        structure=model.block_structure,
        families=list(model.families),
        layers=model.internals.num_layers,
        build=built,
    )
    try:
        result.components = certify(model, cert.sample_inputs(model))
    except Exception as exc:
        result.outcome = ArchitectureOutcome.CRASHED
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        result.reason = " ".join(tb.split())[:500]
    else:
        judge_structure(result)
    result.seconds = time.perf_counter() - started
    return result


def untold(components: dict[str, dict[str, Any]]) -> list[str]:
    """The components refused (on every layer or some) only because no rule in
    registry/block_structures.yaml gives the model's block structure."""
    return sorted(
        name
        for name, item in components.items()
        if NO_STRUCTURE_RULE in (item.get("reason") or "")
        or NO_STRUCTURE_RULE in (item.get("refused_reason") or "")
    )


def judge_structure(result: Result) -> None:
    """A certified architecture with a component refused for want of a block-structure
    rule is ``unfinished``: the registry has not been told, the model lacks nothing."""
    names = untold(result.components)
    if result.outcome == ArchitectureOutcome.CERTIFIED and names:
        result.outcome = ArchitectureOutcome.UNFINISHED
        result.reason = (
            f"{len(names)} components refused only because {NO_STRUCTURE_RULE} gives "
            f"this model's block structure ({', '.join(names)}): add a rule naming its "
            "structure (or a family's structure_unknown_reason saying why none applies)"
        )


# ---------------------------------------------------------------------- the sweep


_PRELOAD = [
    "torch",
    "transformers",
    "nnsight",
    "nnterp",
    "causalab_mini.model",
    "causalab_mini.tools.sweep",
]


def _child(model_type: str, conn: Any) -> None:
    """In a forked worker: certify one architecture and send the result back."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch

        torch.set_num_threads(1)
        conn.send(json.dumps(run_one(model_type).__dict__))
    finally:
        conn.close()


def _worker(model_type: str, timeout: float, context: Any) -> Result:
    """Run one architecture in its own process (forked from a server that has torch
    and transformers imported already), with a timeout; a crash or a hang ends that
    process only."""
    started = time.perf_counter()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(model_type, send), daemon=True)
    process.start()
    send.close()
    answer: str | None = None
    try:
        if receive.poll(timeout):
            answer = receive.recv()
    except EOFError:
        answer = None
    process.join(5 if answer is not None else 0.1)
    if process.is_alive():
        process.kill()
        process.join()
        if answer is None:
            return Result(
                model_type,
                ArchitectureOutcome.TIMEOUT,
                f"no answer within {timeout:.0f} s",
                seconds=timeout,
            )
    if answer is None:
        return Result(
            model_type,
            ArchitectureOutcome.CRASHED,
            f"the process ended with exit code {process.exitcode}",
            seconds=time.perf_counter() - started,
        )
    return Result(**json.loads(answer))


def sweep(
    model_types: list[str],
    jobs: int,
    timeout: float,
    progress: Callable[[Result], None] | None = None,
    builds: tuple[str, ...] = ("default",),
) -> list[Result]:
    """Certify each of ``model_types`` in each of ``builds`` (tiny.py BUILDS), each in
    its own process; over several builds an architecture's result is their
    combination (tools/builds.py: a place is ok only where it holds on every build)."""
    import multiprocessing

    from causalab_mini.tools.builds import build_of, combined, spec_for

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    results: dict[str, dict[str, Result]] = {}
    specs = [spec_for(t, b) for t in model_types for b in builds]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(_worker, spec, timeout, context): spec for spec in specs}
        for future in as_completed(futures):
            spec = futures[future]
            result = future.result()
            if result.model_type == spec and "?" in spec:  # a timeout names the spec
                result.model_type = spec.removeprefix("tiny:").split("?")[0]
            results.setdefault(result.model_type, {})[build_of(spec)] = result
            if progress is not None:
                progress(result)
    out = []
    for by_build in results.values():
        if len(builds) > 1 and len(by_build) == len(builds):
            out.append(combined(by_build["default"], by_build["moved"]))
        else:
            out.extend(by_build.values())
    return sorted(out, key=lambda r: r.model_type)


def group_name(result: Result | dict[str, Any]) -> str:
    """The group of a result (a report without groups is the causal LMs')."""
    group = result.get("group") if isinstance(result, dict) else result.group
    return group or "causal_lm"


def summarize(results: list[Result]) -> dict[str, Any]:
    totals = {
        "architectures": len(results),
        **{outcome.value: 0 for outcome in ArchitectureOutcome},
        **{state.value: 0 for state in ComponentState},
    }
    for r in results:
        totals[r.outcome] += 1
        for key, value in r.counts().items():
            totals[key] += value
    return totals


def write_report(results: list[Result], path: Path, seconds: float) -> None:
    import transformers

    from causalab_mini.tools.tiny import group_model_types
    from causalab_mini.versions import installed_version

    every = group_model_types()
    data = {
        "transformers": transformers.__version__,
        "nnsight": installed_version("nnsight"),
        "nnterp": installed_version("nnterp"),
        "seconds": round(seconds, 1),
        "summary": summarize(results),
        "groups": {
            g: summarize([r for r in results if group_name(r) == g])
            for g in every
            if any(group_name(r) == g for r in results)
        },
        "all_model_types": sum(len(types) for types in every.values()),
        "group_model_types": {g: len(types) for g, types in every.items()},
        "results": [r.__dict__ for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _versions_of(report: dict[str, Any]) -> str:
    """``transformers 5.24.0, nnsight 0.7.0, nnterp 1.3.0`` (what the report records)."""
    return ", ".join(
        f"{package} {report[package]}"
        for package in ("transformers", "nnsight", "nnterp")
        if report.get(package)
    )


def _states(result: dict[str, Any]) -> dict[str, str]:
    return {name: item["state"] for name, item in result["components"].items()}


def _cell(text: str | None, limit: int = 240) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:limit]


def _why(result: dict[str, Any]) -> str:
    """An architecture's outcome in a cell: its counts where certified, else its reason."""
    if result["outcome"] in LOADED:
        states = list(_states(result).values())
        ok, refused = states.count(ComponentState.OK), states.count(ComponentState.REFUSED)
        return f"{result['outcome']}: {ok} ok, {refused} refused"
    return f"{result['outcome']}: {_cell(result['reason'])}"


def differences_markdown(report: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Where another sweep (another nnsight or transformers) differs from ``report``,
    architecture by architecture: its outcome, or the components whose state differs,
    with the reasons both runs give (one sentence where they agree)."""
    here, there = _versions_of(report), _versions_of(other)
    mine = {r["model_type"]: r for r in report["results"]}
    theirs = {r["model_type"]: r for r in other["results"]}
    s, o = report["summary"], other["summary"]
    rows: list[str] = []
    for name in sorted(set(mine) & set(theirs)):
        a, b = mine[name], theirs[name]
        if a["outcome"] != b["outcome"]:
            rows.append(f"| {name} | {a['outcome']} -> {b['outcome']} | {_why(a)} | {_why(b)} |")
            continue
        sa, sb = _states(a), _states(b)
        for component in sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k)):
            ia, ib = a["components"].get(component, {}), b["components"].get(component, {})
            rows.append(
                f"| {name} | {component}: {sa.get(component)} -> {sb.get(component)} | "
                f"{_cell(ia.get('reason'))} | {_cell(ib.get('reason'))} |"
            )
    only = sorted(set(mine) ^ set(theirs))
    lines = ["", f"## Against {there}", ""]
    if not rows and not only:
        return [
            *lines,
            f"The sweep under {there} gives the same outcome and the same state "
            "for every component of every architecture.",
        ]
    lines += [
        f"The same sweep under {there}: {o['certified']} certified (here {s['certified']}), "
        f"{o['ok']} ok ({s['ok']}), {o['refused']} refused ({s['refused']}), "
        f"{o['broken']} broken ({s['broken']}), {o['unloadable']} do not load "
        f"({s['unloadable']}), {o['crashed']} crashed ({s['crashed']}). Every architecture "
        "not listed here has the same outcome and the same state for every component; "
        "architectures that do not load under both are listed only where they load under "
        "one.",
        "",
        f"| architecture | what differs ({here} -> {there}) | here | there |",
        "|---|---|---|---|",
        *rows,
    ]
    if only:
        lines += ["", f"Swept in one run only: {', '.join(only)}."]
    return lines


def _lens(result: dict[str, Any]) -> str:
    """The lens identity's figure for one architecture (checks.lens_identity): ok or
    broken with the worst error, or refused with the family's reason."""
    return str(result.get("components", {}).get("logits", {}).get("lens", ""))


def _lens_summary(report: dict[str, Any]) -> str:
    from causalab_mini.tools.checks import LENS_IDENTITY

    states = [_lens(r).split(":", 1)[0] for r in report["results"] if _lens(r)]
    return (
        f"Lens identity `{LENS_IDENTITY}` (`model.lens`, the family's lens rows): "
        f"**{states.count(ComponentState.OK)} ok**, **{states.count(ComponentState.REFUSED)} "
        f"refused** with the family's reason, **{states.count(ComponentState.BROKEN)} broken** "
        "(column lens)."
    )


def coverage_markdown(report: dict[str, Any], against: dict[str, Any] | None = None) -> str:
    """docs/coverage.md from a sweep report and the registry's block structures; with
    ``against`` (another run's report), where that run differs."""
    from causalab_mini.generated import BLOCK_STRUCTURES
    from causalab_mini.generated.tiny import TINY_GROUPS

    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        by_group.setdefault(group_name(r), []).append(r)
    order = [g for g in TINY_GROUPS if g in by_group]
    order += sorted(g for g in by_group if g not in TINY_GROUPS)
    lines = [
        "<!-- DO NOT EDIT: written by `registry sweep --doc docs/coverage.md` from the sweep "
        "report and the registry. -->",
        "# Coverage",
        "",
    ]
    several = len(order) > 1
    if several:
        counts = ", ".join(f"{len(by_group[g])} {_group_label(g)}" for g in order)
        lines += [
            f"{_versions_of(report)}: {len(report['results'])} architectures swept in "
            f"{report['seconds']} s, in {len(order)} groups (registry/tiny.yaml groups), each "
            f"reported on its own below: {counts}.",
            "",
        ]
    structures = "Structures: " + ", ".join(f"`{k}`" for k in BLOCK_STRUCTURES) + "."
    if several:
        lines += [structures, ""]
    reasons: dict[str, int] = {}
    for group in order:
        part = _group_markdown(report, group, by_group[group], several, reasons)
        if not several:  # one group: the layout of a causal-LM sweep alone
            at = next(i for i, line in enumerate(part) if line.startswith("Lens identity"))
            part[at:at] = [structures, ""]
        lines += part
        lines += _engines_markdown(by_group[group])
    from causalab_mini.tools.builds import both_markdown

    lines += both_markdown(by_group, {g: _group_label(g) for g in by_group})
    lines += ["", "## Refusals, by reason", "", "| times | reason |", "|---|---|"]
    for text, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        cell = text[:400].replace("|", "\\|")
        lines.append(f"| {count} | {cell} |")
    if against is not None:
        lines += differences_markdown(report, against)
    return "\n".join(lines) + "\n"


def _engines_markdown(results: list[dict[str, Any]]) -> list[str]:
    """Per architecture, the certified components each engine serves (the sweep's
    hooks_engine check notes ``engines``; nothing where a report predates it)."""
    rows = []
    for r in results:
        ok = {k: i for k, i in r["components"].items() if i["state"] == "ok"}
        if not any("engines" in i for i in ok.values()):
            continue
        hooks = [k for k, i in ok.items() if "hooks" in i.get("engines", "")]
        reads = [k for k in hooks if "reads only" in ok[k]["engines"]]
        rest = [k for k in ok if k not in hooks]
        refused = "; ".join(f"{k}" for k in rest)
        rows.append(
            f"| {r['model_type']} | {', '.join(r.get('families') or [])} | {len(ok)} | "
            f"{len(hooks)} | {', '.join(reads)} | {_cell(refused, 300)} |"
        )
    if not rows:
        return []
    return [
        "",
        "Engines: of the components certified (ok), those the hooks engine "
        '(`engine="hooks"`) serves, certified torch.equal to the nnsight engine\'s by the '
        "sweep's hooks_engine check; the nnsight engine serves every ok component. The "
        "reasons of the hooks engine's refusals are in coverage.json (`hooks_refused`).",
        "",
        "| architecture | families | ok (nnsight) | hooks | hooks reads only | hooks refuses |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def _group_label(group: str) -> str:
    """``causal-LM`` for the causal LMs, else the group's name in words."""
    return "causal-LM" if group == "causal_lm" else group.replace("_", "-")


def _group_markdown(
    report: dict[str, Any],
    group: str,
    results: list[dict[str, Any]],
    several: bool,
    reasons: dict[str, int],
) -> list[str]:
    """One group's paragraph and table (its refusals counted into ``reasons``)."""
    from causalab_mini.generated.tiny import TINY_GROUPS

    s = summarize([Result(**r) for r in results])
    label = _group_label(group)
    lines: list[str] = []
    if several:
        lines += [f"## {label[0].upper()}{label[1:]} architectures", ""]
        if group in TINY_GROUPS:
            lines += [f"{TINY_GROUPS[group][2][0].upper()}{TINY_GROUPS[group][2][1:]}.", ""]
    swept = (
        f"{s['architectures']} {label} architectures swept"
        if several
        else f"{_versions_of(report)}: {s['architectures']} {label} architectures swept "
        f"in {report['seconds']} s"
    )
    lines += [
        f"{swept}. {s['certified']} loaded and certified component by component; "
        f"{s.get('unfinished', 0)} load but are unfinished (a place refused only because no "
        "block-structure rule gives their structure); "
        f"{s['unbuildable']} cannot be built tiny, {s['unloadable']} do not load, "
        f"{s['crashed']} crashed, {s['timeout']} timed out.",
        "",
        f"Components: **{s['ok']} ok** (certified on real tensors), **{s['refused']} refused** "
        f"with a reason, **{s['broken']} broken**.",
        "",
        _lens_summary({"results": results}),
        "",
        "| architecture | class | structure | ok | refused | broken | lens | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_group_row(r, reasons) for r in results]
    return lines


def _group_row(r: dict[str, Any], reasons: dict[str, int]) -> str:
    """One architecture's line of its group's table (its refusals counted into
    ``reasons``)."""
    counts = {state.value: 0 for state in ComponentState}
    for item in r["components"].values():
        counts[item["state"]] += 1
    note = r["reason"] or ""
    if r["outcome"] in LOADED:
        broken = [
            f"{k}: {i['reason']}"
            for k, i in r["components"].items()
            if i["state"] == ComponentState.BROKEN
        ]
        note = "; ".join(broken)[:300]
        if r["outcome"] == ArchitectureOutcome.UNFINISHED:
            note = "; ".join(x for x in (r["reason"], note) if x)
    note = note.replace("|", "\\|").replace("\n", " ")[:300]
    row = (
        f"| {r['model_type']} | {r['model_class'] or ''} | {r['structure'] or ''} | "
        f"{counts['ok']} | {counts['refused']} | {counts['broken']} | "
        f"{_cell(_lens(r), 120)} | "
        f"{'' if r['outcome'] == ArchitectureOutcome.CERTIFIED else r['outcome'] + ': '}{note} |"
    )
    for item in r["components"].values():
        if item["state"] == ComponentState.REFUSED:
            text = item["reason"].split("\n", 1)[0]
            reasons[text] = reasons.get(text, 0) + 1
    return row


@click.command("sweep")
@click.option("--only", default=None, help="Comma-separated model types (default: all).")
@click.option(
    "--group",
    "groups",
    default=None,
    help="Comma-separated groups of registry/tiny.yaml (causal_lm, image_text_to_text, "
    "audio_text_to_text, seq2seq; "
    "default: every group).",
)
@click.option("--jobs", type=int, default=2, show_default=True, help="Architectures at once.")
@click.option(
    "--timeout",
    type=float,
    default=240.0,
    show_default=True,
    help="Seconds one architecture may take.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the JSON report here.",
)
@click.option(
    "--doc",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the coverage table (markdown) here, e.g. docs/coverage.md.",
)
@click.option(
    "--against",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="With --doc: another run's report (--out of a sweep under another nnsight or "
    "transformers); the table lists where it differs.",
)
@click.option(
    "--build",
    "build",
    type=click.Choice(["default", "moved", "both"]),
    default="both",
    show_default=True,
    help="Which tiny build to certify: the default one, the moved one "
    "(tiny:<type>?build=moved: scales, caps, head and expert sizes, epsilons moved, norms "
    "drawn away from identity), or both (a place is ok only where it holds on both).",
)
@click.option(
    "--moved",
    "moved_report",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="With --doc: a report of the moved build alone (--build moved --out ...), joined "
    "architecture by architecture with this run's default build.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def sweep_command(
    only: str | None,
    jobs: int,
    timeout: float,
    out: Path | None,
    doc: Path | None,
    as_json: bool = False,
    against: Path | None = None,
    groups: str | None = None,
    build: str = "both",
    moved_report: Path | None = None,
) -> None:
    """Certify every causal-LM architecture of the installed transformers, and every
    architecture of the other groups registry/tiny.yaml names (image-text-to-text
    wrappers, on their text stacks): each component of the table ok (identities and
    oracles pass), refused (with the reason), or broken. Each architecture runs in
    its own process with a timeout; the report and the table give each group apart.

    \b
    Example:
      registry sweep --only llama,gpt2,bloom
      registry sweep --group image_text_to_text
      registry sweep --jobs 2 --out docs/coverage.json --doc docs/coverage.md
      registry sweep --doc docs/coverage.md --against nnsight-0.8.json
      registry sweep --build moved --jobs 1 --out moved.json
      registry sweep --build default --out docs/coverage.json --doc docs/coverage.md --moved moved.json
    """
    chosen = _chosen(only, groups)
    started = time.perf_counter()
    builds = ("default", "moved") if build == "both" else (build,)
    results = _swept(chosen, jobs, timeout, builds)
    seconds = time.perf_counter() - started
    _print_results(results, seconds, as_json)
    if out is not None:
        write_report(results, out, seconds)
    if doc is not None:
        report_path = out
        if report_path is None:
            import tempfile

            report_path = Path(tempfile.mkstemp(suffix=".json")[1])
            write_report(results, report_path, seconds)
        doc.parent.mkdir(parents=True, exist_ok=True)
        other = json.loads(against.read_text()) if against is not None else None
        report = json.loads(report_path.read_text())
        if moved_report is not None:
            report = joined_with_moved(report, json.loads(moved_report.read_text()))
        doc.write_text(coverage_markdown(report, other))


def _chosen(only: str | None, groups: str | None) -> list[str]:
    """The model types ``--only`` and ``--group`` pick (a usage error names any that is
    not a group of registry/tiny.yaml or a model type of the picked groups)."""
    from causalab_mini.tools.tiny import group_model_types

    by_group = group_model_types()
    picked = [g.strip() for g in groups.split(",") if g.strip()] if groups else list(by_group)
    wrong = [g for g in picked if g not in by_group]
    if wrong:
        raise click.UsageError(
            f"not groups of registry/tiny.yaml: {', '.join(wrong)} (its groups: "
            f"{', '.join(by_group)})"
        )
    every = [t for g in picked for t in by_group[g]]
    chosen = [t.strip() for t in only.split(",") if t.strip()] if only else every
    # a model type the picked groups hold only as <group>/<model_type> (the whole
    # encoder-decoder beside its decoder alone) names that member
    members = {t.partition("/")[2]: t for t in every if "/" in t}
    chosen = [members.get(t, t) if t not in every else t for t in chosen]
    unknown = [t for t in chosen if t not in every]
    if unknown:
        raise click.UsageError(
            f"not model types of the groups {', '.join(picked)} of this transformers: "
            f"{', '.join(unknown)}"
        )
    return chosen


def joined_with_moved(report: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """``report`` (a default-build sweep) with each architecture that ``moved`` (a
    moved-build sweep) also swept replaced by the two combined (tools/builds.py)."""
    from causalab_mini.tools.builds import combined

    theirs = {r["model_type"]: Result(**r) for r in moved["results"]}
    results = []
    for r in report["results"]:
        other = theirs.get(r["model_type"])
        if other is None or (r.get("build") or {}).get("outcomes"):
            results.append(r)
            continue
        results.append(combined(Result(**r), other).__dict__)
    return {**report, "results": results}


def _swept(
    chosen: list[str], jobs: int, timeout: float, builds: tuple[str, ...] = ("default",)
) -> list[Result]:
    """``sweep`` over ``chosen``, with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("sweeping", total=len(chosen) * len(builds))

        def advance(result: Result) -> None:
            bar.update(task, advance=1, description=f"{result.model_type}: {result.outcome}")

        results = sweep(chosen, jobs, timeout, advance, builds)
    return results


def _print_results(results: list[Result], seconds: float, as_json: bool) -> None:
    """The report as JSON (``--json``), or a table (a terminal) or a line an
    architecture (piped), then the summary."""
    from rich.console import Console
    from rich.table import Table

    if as_json:  # the report, as --out writes it, on stdout instead of the table
        report = {"seconds": round(seconds, 1), "summary": summarize(results)}
        report["results"] = [r.__dict__ for r in results]
        click.echo(json.dumps(report, indent=1, sort_keys=True))
    table = Table(title=f"registry sweep: {len(results)} architectures in {seconds:.0f} s")
    for column in ("architecture", "structure", "outcome", "ok", "refused", "broken"):
        table.add_column(column)
    for r in results:
        c = r.counts()
        table.add_row(
            r.model_type,
            r.structure or "",
            r.outcome,
            str(c["ok"]),
            str(c["refused"]),
            str(c["broken"]),
        )
    if not as_json and sys.stdout.isatty():  # a terminal: the table, in colour
        Console().print(table)
        click.echo(json.dumps(summarize(results)))
    elif not as_json:  # piped: plain text, a line an architecture
        click.echo(f"registry sweep: {len(results)} architectures in {seconds:.0f} s")
        width = max((len(r.model_type) for r in results), default=0)
        for r in results:
            c = r.counts()
            click.echo(
                f"{r.model_type:{width}}  {r.structure or '-':16} {r.outcome:11} "
                f"ok={c['ok']} refused={c['refused']} broken={c['broken']}"
            )
        click.echo(json.dumps(summarize(results)))


def main(argv: list[str] | None = None) -> None:
    """``python -m causalab_mini.tools.sweep TYPE``: one architecture, one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    result = run_one(args[0])
    sys.stdout.write("\n" + json.dumps(result.__dict__) + "\n")


if __name__ == "__main__":
    main()
