"""The engines a lowered program runs on, behind one interface.

Every verb (``Plan.run``, ``interchange``, ``Plan.generate`` and what is built on them)
does the same three things: resolve its inputs, *lower* what it wants into a
``Program`` (``causalab_mini.lower``: typed steps, ``causalab_mini.plain.Step``), and
hand that program to an ``Engine``, which runs it in one forward and returns the reads
in program order. The verb is written once; which engine runs it is one argument:

- ``NnsightEngine``: an nnsight trace of the model here, with its internals (every
  place; a refusal raised inside the trace is handed back as it was written);
- ``RemoteEngine``: the same program as plain nnsight module accesses, on NDIF (or on
  any nnsight backend), ``causalab_mini.remote``;
- ``HooksEngine``: the plain steps run with torch forward hooks here, no trace
  (``causalab_mini.hooks``).

``engine_for(engine, remote=..., backend=...)`` is the one place an entry point's
``engine=`` and ``remote=`` become an engine.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from . import hooks, plain
from . import remote as remote_runs
from .errors import CausalabError, RemoteRefused
from .lower import Program, Target, lower, prepare_sources

if TYPE_CHECKING:
    from .plain import Step

ENGINES = ("nnsight", "hooks")


# per model (its internals' engine_cache), the hooks programs of plans of reads alone,
# a few kept
_PROGRAMS_KEPT = 16


class Engine(ABC):
    """Runs lowered programs: ``lower`` a plan for this engine's target, ``run`` the
    program in one forward of the model on its inputs."""

    name: ClassVar[str]
    target: ClassVar[Target]
    keeps_programs: ClassVar[bool] = False  # (the hooks engine: see ``lower``)

    def lower(
        self,
        plan: Any,
        model: Any,
        held: bool = False,
        indices: Mapping[Any, Any] | None = None,
        edits: Sequence[tuple[Any, Any]] | None = None,
    ) -> Program:
        """``plan`` lowered for this engine (``causalab_mini.lower.lower``). Where the
        engine ``keeps_programs``, a plan of reads alone (no indices, no edits: nothing
        in its steps changes from one run to the next) is lowered once per model and the
        same program handed back, so that what a run prepares of it is made once too."""
        self.prepare(model)
        kept = self.keeps_programs and not indices and edits is None
        if not kept:
            return lower(plan, model, held, indices, target=self.target, edits=edits)
        cache = model.internals.engine_cache.setdefault("programs", {})
        # the same plan object handed again is found by its id first (hashing a plan
        # hashes every address in it: ~1 us a read, each run); only a plan of reads
        # alone is ever kept
        same = cache.get((id(plan), held))
        if same is not None and same[0] is plan:
            found: Program = same[1]
            return found
        if any(s.write for s in plan.steps):
            return lower(plan, model, held, indices, target=self.target, edits=edits)
        program: Program | None = cache.get((plan, held))
        if program is None:
            program = lower(plan, model, held, None, target=self.target)
        while len(cache) >= 2 * _PROGRAMS_KEPT:  # two entries a plan: drop the oldest
            del cache[next(iter(cache))]
        cache[(plan, held)] = program
        cache[(id(plan), held)] = (plan, program)
        return program

    def prepare(self, model: Any) -> None:
        """What the engine needs of the model before lowering (nothing by default)."""
        return None

    @abstractmethod
    def run(self, model: Any, program: Program, inputs: Any) -> list[Any]:
        """Run ``program`` in one forward of ``model`` on ``inputs`` (what nnsight's
        ``trace`` takes: text, or the batch ``positions.trace_inputs`` makes); return
        its reads in program order, as tensors (a read's ``then`` may make a list)."""

    def batched(self, model: Any, inputs: Mapping[str, Any]) -> Callable[[Any], Any]:
        """For a verb that runs many subsets of one tokenized batch (a patching grid's
        chunks of cells): a function of row indices (a 1-D index tensor) giving the
        batch's rows there, as ``run`` takes them. By default each tensor's rows."""
        return lambda index: select_rows(inputs, index)

    def reads(self, model: Any, program: Program, inputs: Any) -> dict[Any, Any]:
        """``run``'s reads by address."""
        return dict(zip(program.reads, self.run(model, program, inputs), strict=True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def select_rows(inputs: Mapping[str, Any], index: Any) -> dict[str, Any]:
    """A tokenized batch's rows at ``index``, in that order (every tensor is
    batch-first; anything else is kept as it is)."""
    return {
        key: value[index] if hasattr(value, "shape") else value for key, value in inputs.items()
    }


def unwrapped(exc: BaseException) -> BaseException:
    """What the caller is handed for ``exc``, raised inside an nnsight trace: nnsight
    wraps what a trace body raises in its own traceback text and keeps the exception
    it caught as ``original``; a refusal of this library is handed back as written."""
    original = getattr(exc, "original", None)
    if isinstance(original, CausalabError) and original is not exc:
        return original
    return exc


def _saved(value: Any) -> Any:
    if isinstance(value, list):
        return [_saved(v) for v in value]
    return value.save()


def _value(value: Any) -> Any:
    """A saved read after the trace: the tensor it was made of, as the hooks engine
    hands it back (the model's own where the place holds it as is: autograd reaches
    it from the output on both engines)."""
    from .edits import handed_back

    if isinstance(value, list):
        return [_value(v) for v in value]
    return handed_back(getattr(value, "value", value))


def open_sources(model: Any, steps: Sequence[Step]) -> None:
    """Touch the ``.source`` of every module a step reaches operations under, before
    the trace (nnsight needs it first)."""
    for step in steps:
        if step["ops"]:
            (model if step["envoy"] is None else step["envoy"]).source  # noqa: B018


class NnsightEngine(Engine):
    """An nnsight trace of the model here, with the model's internals."""

    name = "nnsight"
    target = Target.TRACE

    def run(self, model: Any, program: Program, inputs: Any) -> list[Any]:
        open_sources(model, program.steps)
        saved: list[Any] = []  # bound before the trace: nnsight hands saves back
        try:
            with model.trace(inputs):
                values = plain.run(model, program.steps, None, model.internals)
                saved.extend(_saved(v) for v in values)
        except CausalabError as exc:
            raise unwrapped(exc) from None
        return [_value(v) for v in saved]

    def generate(
        self,
        model: Any,
        programs: tuple[Program, Program],
        batch: Mapping[str, Any],
        at_step: Any,
        max_new_tokens: int,
        generate_kwargs: Mapping[str, Any],
    ) -> tuple[list[list[Any]], Any]:
        """Run ``programs[0]`` at the first step of ``model.generate`` on ``batch`` and
        ``programs[1]`` at each later one (``at_step(step)`` first, where given); per
        step its reads, and the generated sequences (None where generate returned
        none)."""
        first, later = programs
        open_sources(model, first.steps)
        saved: list[list[Any]] = []  # bound before the trace: values saved in it stay
        result: list[Any] = []
        try:
            with warnings.catch_warnings():
                # a run that stops before max_new_tokens (EOS, a stopping criterion) ends
                # the step loop early, and nnsight warns of the steps it did not reach:
                # that is what a generation that stops means here
                warnings.filterwarnings("ignore", message=".*was never reached.*")
                with model.generate(max_new_tokens=max_new_tokens, **generate_kwargs) as tracer:
                    with tracer.invoke(dict(batch)):
                        for step in tracer.iter[:max_new_tokens]:
                            if step and at_step is not None:
                                at_step(step)
                            program = later if step else first
                            values = plain.run(model, program.steps, None, model.internals)
                            saved.append([_saved(v) for v in values])
                    # an invoke of its own: it runs however many steps the loop made
                    with tracer.invoke():
                        result.append(tracer.result.save())
        except CausalabError as exc:
            raise unwrapped(exc) from None
        steps = [[_value(v) for v in values] for values in saved]
        return steps, (_value(result[0]) if result else None)


class HooksEngine(Engine):
    """The plain steps run with torch forward hooks and pre-hooks here, no trace."""

    name = "hooks"
    target = Target.HOOKS

    def prepare(self, model: Any) -> None:
        hooks.dispatched(model)  # a hook on a meta module would never fire

    keeps_programs = True

    def run(self, model: Any, program: Program, inputs: Any) -> list[Any]:
        return hooks.run(model, program.steps, inputs)

    def batched(self, model: Any, inputs: Mapping[str, Any]) -> Callable[[Any], Any]:
        """The batch prepared for the forward once (nnsight's batching of the whole
        batch, ``hooks.prepared``), each subset its rows of that: no per-run batching."""
        self.prepare(model)
        ready = hooks.prepared(model, inputs)
        return super().batched(model, inputs) if ready is None else ready.select


class RemoteEngine(Engine):
    """The program as plain nnsight module accesses, on NDIF with ``remote=True`` (or
    ``remote="http://host"``), on an nnsight ``backend``, or ``remote="local"``:
    nnsight's in-process simulation of a request."""

    name = "nnsight"
    target = Target.REMOTE

    def __init__(self, remote: bool | str = True, backend: Any = None, blocking: bool = True):
        if not blocking:
            raise RemoteRefused(
                "Plan.run(remote=True) waits for its reads: blocking=False would return "
                "before they exist; submit a trace of your own with blocking=False instead"
            )
        self.remote, self.backend = remote, backend

    def run(self, model: Any, program: Program, inputs: Any) -> list[Any]:
        return remote_runs.execute(model, program, inputs, remote=self.remote, backend=self.backend)

    def __repr__(self) -> str:
        return f"RemoteEngine(remote={self.remote!r}, backend={self.backend!r})"


def engine_for(
    engine: str | Engine = "nnsight",
    *,
    remote: bool | str | None = None,
    backend: Any = None,
    blocking: bool = True,
) -> Engine:
    """The engine an entry point's ``engine=`` and ``remote=`` / ``backend=`` name: an
    ``Engine`` as given, ``"hooks"`` (here, torch hooks), or ``"nnsight"`` (a trace
    here, or a remote run where ``remote`` or ``backend`` is given)."""
    wants_remote = bool(remote) or backend is not None
    if isinstance(engine, Engine):
        if wants_remote:
            raise ValueError(
                f"engine={engine!r} is an engine already: give remote=/backend= to "
                "RemoteEngine(...) instead"
            )
        return engine
    if engine not in ENGINES:
        raise ValueError(f"engine is one of {', '.join(map(repr, ENGINES))}, not {engine!r}")
    if engine == "hooks" and wants_remote:
        raise RemoteRefused(
            "engine='hooks' runs the model here, with torch hooks, and a remote run is "
            "nnsight's (the server runs the plan in an nnsight trace): drop engine='hooks' "
            "to run remotely, or drop remote=/backend= to run here with hooks"
        )
    if engine == "hooks":
        return HooksEngine()
    if wants_remote:
        return RemoteEngine(remote if remote else False, backend, blocking)
    return NnsightEngine()


__all__ = [
    "ENGINES",
    "Engine",
    "HooksEngine",
    "NnsightEngine",
    "RemoteEngine",
    "engine_for",
    "open_sources",
    "prepare_sources",
    "select_rows",
    "unwrapped",
]
