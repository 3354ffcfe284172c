"""The sweep's runner: one architecture built, loaded and certified in this process
(``run_one``), or each in its own forked process with a timeout (``sweep``), and the
``Result`` it reports."""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from causalab_mini.internals import NO_STRUCTURE_RULE
from causalab_mini.tools import certify as cert
from causalab_mini.tools.verdicts import ArchitectureOutcome, ComponentState

from .certification import certify


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
    per_build: dict[str, list[Result]] | None = None,
) -> list[Result]:
    """Certify each of ``model_types`` in each of ``builds`` (tiny/build.py BUILDS), each in
    its own process; over several builds an architecture's result is their
    combination (tools/builds.py: a place is ok only where it holds on every build),
    and ``per_build`` (where given) gets each build's own results."""
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
    if per_build is not None:
        for by_build in results.values():
            for build, result in by_build.items():
                per_build.setdefault(build, []).append(result)
        for listed in per_build.values():
            listed.sort(key=lambda r: r.model_type)
    out = []
    for by_build in results.values():
        if len(builds) > 1 and len(by_build) == len(builds):
            out.append(combined(by_build["default"], by_build["moved"]))
        else:
            out.extend(by_build.values())
    return sorted(out, key=lambda r: r.model_type)
