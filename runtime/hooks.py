"""A second engine: lowered plans (``causalab_mini.lower``'s programs) run with plain
``torch.nn.Module`` forward hooks and pre-hooks, no nnsight trace.

``Plan.run(model, inputs, engine="hooks")`` (and ``interchange(..., engine="hooks")``)
lower the plan as a remote run does and hand each step to a hook at its module: a step
at a module's input to a forward pre-hook (``with_kwargs=True``), one at its output to
a forward hook. What a step does with the tensor there (select, copy, scale, snapshot,
in-place writes, heads, streams, positions, the write checks) is ``causalab_mini.plain``'s
own functions, called on a stand-in for the Envoy (``_Call``), so the two engines run
the same code on the same tensors.

Interiors: where a module's forward calls its attention through transformers'
attention-function interface (``ALL_ATTENTION_FUNCTIONS.get_interface``), the steps
at that call (query, key, value, z) run in a wrapper of the function the interface
hands out, installed for the run; the probabilities are read where the function
returns its dropout's output as its second value (eager attention), and never
written (that needs the function's own source). Anything else that names an
operation inside a forward's source is refused with the reason: use
``engine="nnsight"``.

Every hook (and the interface wrapper) is removed when the run ends: on success, on
an error, on KeyboardInterrupt. A module run more than once in the forward, or a
step whose hook never fired, is refused rather than guessed at.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from . import compat, plain
from .errors import HooksRefused

if TYPE_CHECKING:
    from .plain import Step

INTERFACE = "attention_interface("
GET_INTERFACE = "ALL_ATTENTION_FUNCTIONS.get_interface("
DROPOUT = "nn.functional.dropout("
USE_NNSIGHT = "use engine='nnsight' (the default), which runs it"

_UNSET = object()


def refused(where: str, reason: str) -> HooksRefused:
    return HooksRefused(f"engine='hooks' does not run {where}: {reason}; {USE_NNSIGHT}")


# ---------------------------------------------------------------------- a call


class _Call:
    """One call of a module (or of the attention function) as ``plain``'s steps see an
    Envoy: ``inputs`` (args, kwargs), ``input`` (the first positional argument, else
    the first keyword one, as nnsight's), ``output``; what a write sets is kept and
    handed back by the hook."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any = _UNSET):
        self.args, self.kwargs, self._output = tuple(args), dict(kwargs), output
        self.changed = False

    @property
    def inputs(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return self.args, self.kwargs

    @inputs.setter
    def inputs(self, value: tuple[Any, Any]) -> None:
        self.args, self.kwargs = tuple(value[0]), dict(value[1])
        self.changed = True

    @property
    def input(self) -> Any:
        return self.args[0] if self.args else next(iter(self.kwargs.values()))

    @input.setter
    def input(self, value: Any) -> None:
        if self.args:
            self.args = (value, *self.args[1:])
        else:
            self.kwargs = {**self.kwargs, next(iter(self.kwargs)): value}
        self.changed = True

    @property
    def output(self) -> Any:
        assert self._output is not _UNSET, "a pre-hook has no output"
        return self._output

    @output.setter
    def output(self, value: Any) -> None:
        self._output = value
        self.changed = True

    # a module with a child named input/output has its boundary at nns_* (tree.boundary)
    nns_input = input
    nns_output = output


# ---------------------------------------------------------------------- steps


class _Env:
    """The model's internals as this engine's steps use them: the client's refusals,
    operations and views, and no trace body: a boundary is the call's own attribute,
    and a read is handed out as it is (an nnsight trace body hands out reads whose
    in-place edits are the place's write; here every read is handed out after the
    forward, where such an edit reaches nothing, as it does after a trace)."""

    __slots__ = ("internals", "write_error")

    def __init__(self, internals: Any) -> None:
        self.internals = internals
        self.write_error: type[Exception] = internals.write_error

    def refusal(self, kind: str, step: Step, reason: str) -> Exception:
        return self.internals.refusal(kind, step, reason)  # type: ignore[no-any-return]

    def operation(self, step: Step, target: Any) -> Any:
        return self.internals.operation(step, target)

    def flat_view(self, step: Step, raw: Any) -> Any:
        return self.internals.flat_view(step, raw)

    def fetch(self, step: Step, target: Any) -> Any:
        return getattr(target, step["attr"])

    def handed(self, step: Step, value: Any, target: Any, raw: Any) -> Any:
        return value


def _at_call(step: Step) -> Step:
    """A step as it runs at a call (the call stands in for its Envoy, set when the
    hook fires): made once per run, before the forward."""
    at = step.copy()
    at["ops"] = ()
    if step["write"] and step.get("edit") is not None:
        at["held"] = False
    return at


# a read whose place is the call's own input or output as it is (a select of it,
# copied where the row copies): made into a function of the call before the forward
_PLAIN_READ = {
    "take": None,
    "unflatten": False,
    "unmerge": None,
    "views": (),
    "scale": None,
    "heads_through": None,
    "held": False,
    "index": None,
    "head": None,
    "stream": None,
    "then": None,
    "edit": None,
}


def _fast_read(at: Step) -> Callable[[tuple[Any, ...], dict[str, Any], Any], Any] | None:
    """What ``plain.read`` does at ``at`` (a step at a call, ``_at_call``'s), as one
    function of the call's arguments and output, where that is picking the input or
    output (and a part of it) and copying it where the row says; None where the step
    needs ``plain.read``."""
    if at["write"] or at["layout"] is not None:
        return None
    if any(at.get(key) != want for key, want in _PLAIN_READ.items()):
        return None
    attr, select, copy = at["attr"], at["select"], at["copy"]
    if attr not in ("input", "output", "nns_input", "nns_output"):
        return None
    output = attr.endswith("output")
    # the common reads as one plain function each (a hook's work runs inside the
    # forward, where every Python frame it adds is paid per read)
    if not copy and select is None:
        return _the_output if output else _first_argument
    if not copy and output and select is not None and select[0] == "first":
        return _first_of_output

    def read(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        # the output, or the first positional argument, else the first keyword one
        value = out if output else (args[0] if args else next(iter(kwargs.values())))
        if select is not None:
            if select[0] == "first":
                value = value[0] if isinstance(value, (tuple, list)) else value
            else:
                value = value[select[1]]
        return value.clone() if copy else value

    return read


def _the_output(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    return out


def _first_argument(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    return args[0] if args else next(iter(kwargs.values()))


def _first_of_output(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _apply(at: Step, call: _Call, env: _Env) -> Any:
    """Run one step (``_at_call``'s) at ``call`` with ``causalab_mini.plain``'s read and
    write; a read returns what it read."""
    at["envoy"] = call
    if at["write"]:
        edit = at.get("edit")
        if edit is not None:  # the value made of the place's own tensor (interchange)
            at["value"] = edit(plain.read(None, at, env))
        plain.write(None, at, env)
        return None
    value = plain.read(None, at, env)
    then = at.get("then")
    return then(value) if then is not None else value


_ROUTED: dict[Any, str | None] = {}


def _routed(module: Any) -> str | None:
    """Why ``module``'s forward does not call its attention through transformers'
    interface exactly once (None where it does); read once per module class."""
    kind = type(module)
    if kind not in _ROUTED:
        _ROUTED[kind] = _routing(module)
    return _ROUTED[kind]


def _routing(module: Any) -> str | None:
    try:
        text = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return "its forward's source cannot be read to see how it calls attention"
    if GET_INTERFACE not in text:
        return (
            "its forward does not take its attention function from transformers' "
            "interface (ALL_ATTENTION_FUNCTIONS.get_interface), whose function this engine "
            "wraps; reaching the operation needs the forward's source"
        )
    calls = sum(
        1
        for i in range(len(text))
        if text.startswith(INTERFACE, i)
        and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_."))
    )
    if calls != 1:
        return f"its forward calls {INTERFACE!r} {calls} times, and this engine wraps one call"
    return None


_DROPOUT_RETURNED: dict[Any, str | None] = {}


def _returns_dropout(fn: Any) -> str | None:
    """Why the attention function ``fn`` does not return its dropout's output as its
    second value (None where it does: ``x = nn.functional.dropout(...)``, x never
    assigned again, ``return ..., x`` its last statement)."""
    key = getattr(fn, "__code__", fn)
    if key in _DROPOUT_RETURNED:
        return _DROPOUT_RETURNED[key]
    why = None
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body  # type: ignore[attr-defined]
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError) as exc:
        body, why = [], f"its source cannot be read ({type(exc).__name__})"

    def dropout_of(s: Any) -> str | None:
        if (
            isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name)
            and isinstance(s.value, ast.Call)
            and ast.unparse(s.value.func) + "(" == DROPOUT
        ):
            return s.targets[0].id
        return None

    at = [i for i, s in enumerate(body) if dropout_of(s) is not None]
    if why is None and len(at) != 1:
        why = f"it calls {DROPOUT!r} {len(at)} times (not once, as an assignment)"
    elif why is None:
        name, last = dropout_of(body[at[0]]), body[-1]
        if not (
            isinstance(last, ast.Return)
            and isinstance(last.value, ast.Tuple)
            and len(last.value.elts) >= 2
            and isinstance(last.value.elts[1], ast.Name)
            and last.value.elts[1].id == name
        ):
            why = f"it does not return {name} (its dropout's output) as its second value"
        elif any(
            isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
            for s in body[at[0] + 1 :]
            for n in ast.walk(s)
        ):
            why = f"it assigns {name} again after its dropout"
    if why is not None:
        why = f"the attention function {getattr(fn, '__qualname__', fn)!r}: {why}"
    _DROPOUT_RETURNED[key] = why
    return why


def _torch_module(model: Any, envoy: Any) -> Any:
    return model._module if envoy is None else envoy._module


def _side(step: Step) -> str:
    if step["take"] is not None:
        return "input" if step["take"][0] == "arg" else "output"
    return "input" if step["attr"] in ("input", "nns_input") else "output"


def _placed(model: Any, step: Step) -> tuple[str, Any, str]:
    """Where a step runs: ("module" | "call" | "probs", the torch module, side)."""
    where = step["where"]
    module = _torch_module(model, step["envoy"])
    ops = tuple(step["ops"])
    if not ops:
        return "module", module, _side(step)
    if ops[0] != INTERFACE:
        raise refused(
            where,
            f"it is the operation {' > '.join(ops)} inside a forward, which only the "
            "forward's source reaches",
        )
    why = _routed(module)
    if why is not None:
        raise refused(where, why)
    if len(ops) == 1:
        return "call", module, _side(step)
    if ops[1:] == (DROPOUT,) and step["attr"] == "output" and step["select"] is None:
        if step["write"]:
            raise refused(
                where,
                "a write of the probabilities must reach the product inside the attention "
                "function, which only the function's source reaches (this engine reads them "
                "as the function's second return value)",
            )
        return "probs", module, "output"
    raise refused(
        where,
        f"it is the operation {' > '.join(ops)} inside the attention function, which only "
        "the function's source reaches",
    )


# ---------------------------------------------------------------------- running


_Prepared = tuple[
    list["Step"],
    list[Callable[[tuple[Any, ...], dict[str, Any], Any], Any] | None],
    dict[tuple[str, int, str], list[int]],
    dict[int, Any],
    # per call, its fast reads (and their indices) where every step there is one (no
    # call object made)
    dict[tuple[str, int, str], tuple[list[tuple[int, Any]], list[int]] | None],
    # the hook functions at each module, made once (``_Hooks``)
    "_Hooks",
]
# a program handed again (the hooks engine's lowering keeps a plan of reads alone):
# its steps as they run at a call and where, made once, kept in the model's
# internals' engine_cache ("hooks": id(program) -> the program, the model's module
# then, and what was made), so that an id names them alone and they go with the model
_PREPARED_KEPT = 16


def _cache(model: Any, name: str) -> dict[Any, Any]:
    """The model's ``name`` cache (its internals' ``engine_cache``), or a new empty one
    each time for a model without internals (nothing kept)."""
    caches = getattr(getattr(model, "internals", None), "engine_cache", None)
    return {} if caches is None else caches.setdefault(name, {})


def _prepared(model: Any, program: tuple[Step, ...]) -> _Prepared:
    """The steps at a call (a read that can be, one function of the call), and the
    module and side each runs at: made once per program while it is kept."""
    module = getattr(model, "_model", None)
    cache = _cache(model, "hooks")
    kept = cache.get(id(program))
    if kept is not None and kept[0] is program and kept[1] is module:
        made = kept[2]
        # a run edits its steps at a call: each run its own copies of those (a fast
        # read never runs its step)
        return _own_copies(made[0], made[1]), *made[1:]
    local = [_at_call(step) for step in program]
    fast = [_fast_read(step) for step in local]
    at: dict[tuple[str, int, str], list[int]] = {}
    modules: dict[int, Any] = {}
    for i, step in enumerate(program):
        kind, placed, side = _placed(model, step)
        at.setdefault((kind, id(placed), side), []).append(i)
        modules[id(placed)] = placed
    groups = {key: _reads_only(fast, where) for key, where in at.items()}
    functions = _Hooks(groups, modules)
    if len(cache) >= _PREPARED_KEPT:
        cache.pop(next(iter(cache)))
    cache[id(program)] = (program, module, (local, fast, at, modules, groups, functions))
    return _own_copies(local, fast), fast, at, modules, groups, functions


def _reads_only(
    fast: list[Any], where: list[int]
) -> tuple[list[tuple[int, Any]], list[int]] | None:
    """The fast reads at one call (and their indices) where every step there is one,
    else None."""
    fasts = [(i, fast[i]) for i in where]
    return (fasts, list(where)) if all(f is not None for _, f in fasts) else None


def _own_copies(steps: list[Step], fast: list[Any]) -> list[Step]:
    """A run's steps: a copy of each that runs through ``plain`` (a run edits those),
    the kept one where a fast read runs instead (it never reads its step)."""
    if None not in fast:  # (every step a fast read: the kept list, nothing edits it)
        return steps
    return [s if f is not None else s.copy() for s, f in zip(steps, fast, strict=True)]


class _Run:
    """The hooks of one run: the steps by where they run, what they read, the calls
    seen (a module run twice is refused)."""

    def __init__(self, model: Any, program: tuple[Step, ...]):
        self.program = program
        self.env = _Env(model.internals)
        prepared = _prepared(model, program)
        self.local, self.fast, self.at, self.modules, self.groups, self.functions = prepared
        self.reads: dict[int, Any] = {}
        self.done: set[int] = set()
        self.fired: set[tuple[str, int, str]] = set()

    def _once(self, key: tuple[str, int, str]) -> None:
        if key in self.fired:
            self.twice(key)
        self.fired.add(key)

    def twice(self, key: tuple[str, int, str]) -> NoReturn:
        """Refuse a module that runs again in this forward (its steps were taken)."""
        step = self.program[self.at[key][0]]
        raise refused(
            step["where"],
            f"its module ({type(self.modules[key[1]]).__name__}) runs more than once in "
            "this forward, and hooks cannot tell which call the plan means",
        )

    def missing(self) -> list[int]:
        """The steps that did not run: a fast read is done when it is read (``reads``),
        any other step when ``steps`` took it (``done``)."""
        done = self.done.union(self.reads) if self.done else self.reads
        if len(done) == len(self.program):
            return []
        return [i for i in range(len(self.program)) if i not in done]

    def steps(self, key: tuple[str, int, str], call: _Call) -> None:
        self._once(key)
        for i in self.at[key]:
            fast = self.fast[i]
            if fast is not None:
                value = fast(call.args, call.kwargs, call._output)
            else:
                value = _apply(self.local[i], call, self.env)
            if not self.program[i]["write"]:
                self.reads[i] = value
            self.done.add(i)

    def attention(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The attention function's call for a module with steps at it."""
        module = args[0]
        key = ("call", id(module), "input")
        call = _Call(args, kwargs)
        if key in self.at:
            self.steps(key, call)
        out = fn(*call.args, **call.kwargs)
        key = ("call", id(module), "output")
        if key in self.at:
            done = _Call(call.args, call.kwargs, out)
            self.steps(key, done)
            out = done.output
        key = ("probs", id(module), "output")
        if key in self.at:
            why = _returns_dropout(fn)
            if why is not None:
                raise refused(self.program[self.at[key][0]]["where"], why)
            if not isinstance(out, (tuple, list)) or len(out) < 2 or out[1] is None:
                raise refused(
                    self.program[self.at[key][0]]["where"],
                    "the attention function returned no probabilities",
                )
            self.steps(key, _Call((), {}, out[1]))
        return out

    def wants_attention(self) -> set[int]:
        return {k[1] for k in self.at if k[0] in ("call", "probs")}


class _Hooks:
    """A program's hook functions at its modules, made once with the program: each
    hands what it sees to the run bound now (``run``), so a run registers them and
    makes none."""

    def __init__(
        self, groups: Mapping[tuple[str, int, str], Any], modules: Mapping[int, Any]
    ) -> None:
        self.run: _Run | None = None
        self.modules = modules
        # each hook with the module it goes on, its side (a pre-hook or not) and the
        # module's two tables for that side (``_put``), looked up once
        self.installs: list[_Install] = [
            _install_of(
                modules[key[1]],
                key[2] == "input",
                (_pre_hook if key[2] == "input" else _post_hook)(self, key, group),
            )
            for key, group in groups.items()
            if key[0] == "module"
        ]

    def bound(self, run: _Run) -> _Hooks:
        """These hooks bound to ``run`` (a fresh set where a run of the same program
        holds them now: one that re-enters it)."""
        hooks = self if self.run is None else _Hooks(run.groups, self.modules)
        hooks.run = run
        return hooks


# A hook is put in a module's hook table and its keyword-arguments table under a
# fresh id from torch's own counter, and taken out by that id: what
# ``register_forward_(pre_)hook(..., with_kwargs=True)`` and its handle's ``remove``
# do, without a handle and its weak references for each (in a run of 24 reads, about
# 60 us of a 3 ms forward on a CPU). Where torch keeps its hooks otherwise, the
# public registration is used.
_DIRECT_NAMES = {
    True: ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"),
    False: ("_forward_hooks", "_forward_hooks_with_kwargs"),
}


# a hook as it goes on: the module, whether it is a pre-hook, the hook, and the
# module's hook table and keyword-arguments table for that side (None where torch has
# no such attribute)
_Install = tuple[Any, bool, Callable[..., Any], Any, Any]


def _install_of(module: Any, pre: bool, hook: Callable[..., Any]) -> _Install:
    names = _DIRECT_NAMES[pre]
    return module, pre, hook, getattr(module, names[0], None), getattr(module, names[1], None)


# torch's hook-handle class, whose counter gives the ids (set by ``_torch_tables``)
_HANDLE: list[Any] = []


def _torch_tables() -> bool:
    """Whether this torch keeps hooks as ``_put`` puts them: checked once on a module,
    with a hook put in directly that must run as a registered one does."""
    import torch
    from torch.utils.hooks import RemovableHandle

    if not isinstance(getattr(RemovableHandle, "next_id", None), int):
        return False
    _HANDLE[:] = [RemovableHandle]
    probe = torch.nn.Identity()
    seen: list[Any] = []
    installs = [
        _install_of(probe, True, lambda m, a, k: seen.append(("pre", k))),
        _install_of(probe, False, lambda m, a, k, o: seen.append(("post", k))),
    ]
    if not all(isinstance(t, dict) for i in installs for t in i[3:]):
        return False
    placed: list[tuple[Any, Any, int]] = []
    try:
        _put(installs, placed)
        probe(torch.zeros(1))
        _take(placed)
        probe(torch.zeros(1))
    except Exception:
        return False
    return seen == [("pre", {}), ("post", {})] and not any(t for i in installs for t in i[3:])


def _put(installs: list[_Install], placed: list[tuple[Any, Any, int]]) -> None:
    """Put each hook in its module's tables (with its keyword arguments) under a fresh
    id from torch's counter, each listed in ``placed`` before it goes in, so ``_take``
    takes out whatever was put in."""
    counter = _HANDLE[0]
    for _, _, hook, table, kwargs_table in installs:
        i = counter.next_id
        counter.next_id = i + 1
        placed.append((table, kwargs_table, i))
        table[i] = hook
        kwargs_table[i] = True


def _take(placed: list[tuple[Any, Any, int]]) -> None:
    for table, kwargs_table, i in reversed(placed):
        table.pop(i, None)
        kwargs_table.pop(i, None)


_DIRECT: list[bool] = []  # (decided at the first run)


def _install(
    hooks: _Hooks, handles: list[Callable[[], None]], placed: list[tuple[Any, Any, int]]
) -> None:
    """Put ``hooks`` on their modules (with their keyword arguments): in the modules'
    tables directly, listed in ``placed`` (``_take`` takes them out), or, where torch
    keeps hooks otherwise, registered the public way, each handle's ``remove`` in
    ``handles``."""
    if not _DIRECT:
        _DIRECT.append(_torch_tables())
    if _DIRECT[0]:
        _put(hooks.installs, placed)
        return
    for module, pre, hook, _, _ in hooks.installs:
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        handles.append(register(hook, with_kwargs=True).remove)


def _fast_hook(
    hooks: _Hooks, key: tuple[str, int, str], fasts: list[tuple[int, Any]], output: bool
) -> Callable[..., Any]:
    """A hook whose every step is a fast read: each read put in the bound run's reads
    (one found there already is this module's second call in the forward)."""
    inline = _one_read_hook(hooks, key, *fasts[0], output) if len(fasts) == 1 else None
    if inline is not None:
        return inline
    first = fasts[0][0]

    def all_in(_module: Any, args: Any, kwargs: Any) -> None:
        all_out(_module, args, kwargs, _UNSET)

    def all_out(_module: Any, args: Any, kwargs: Any, out: Any) -> None:
        run = hooks.run
        assert run is not None
        got = run.reads
        if first in got:
            run.twice(key)
        for i, fast in fasts:
            got[i] = fast(args, kwargs, out)

    return all_out if output else all_in


def _one_read_hook(
    hooks: _Hooks, key: tuple[str, int, str], i: int, fast: Any, output: bool
) -> Callable[..., Any] | None:
    """``_fast_hook`` of one of the common reads (the first argument, the output or its
    first element), made in the hook itself, no function called for it; None for any
    other read."""
    if fast is _first_argument and not output:

        def argument(_module: Any, args: Any, kwargs: Any) -> None:
            run = hooks.run
            assert run is not None
            got = run.reads
            if i in got:
                run.twice(key)
            got[i] = args[0] if args else next(iter(kwargs.values()))

        return argument
    if output and (fast is _the_output or fast is _first_of_output):
        whole = fast is _the_output

        def result(_module: Any, args: Any, kwargs: Any, out: Any) -> None:
            run = hooks.run
            assert run is not None
            got = run.reads
            if i in got:
                run.twice(key)
            got[i] = out if whole or not isinstance(out, (tuple, list)) else out[0]

        return result
    return None


def _pre_hook(hooks: _Hooks, key: tuple[str, int, str], group: Any) -> Callable[..., Any]:
    if group is not None:
        return _fast_hook(hooks, key, group[0], output=False)

    def hook(_module: Any, args: Any, kwargs: Any) -> Any:
        assert hooks.run is not None
        call = _Call(args, kwargs)
        hooks.run.steps(key, call)
        return (call.args, call.kwargs) if call.changed else None

    return hook


def _post_hook(hooks: _Hooks, key: tuple[str, int, str], group: Any) -> Callable[..., Any]:
    if group is not None:
        return _fast_hook(hooks, key, group[0], output=True)

    def hook(_module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        assert hooks.run is not None
        call = _Call(args, kwargs, output)
        hooks.run.steps(key, call)
        return call.output if call.changed else None

    return hook


def _install_interface(run: _Run, handles: list[Callable[[], None]]) -> None:
    """Wrap what ``ALL_ATTENTION_FUNCTIONS.get_interface`` hands out, for this run."""
    wanted = run.wants_attention()
    if not wanted:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as interface

    before = interface.__dict__.get("get_interface", _UNSET)
    original = interface.get_interface

    def get_interface(implementation: Any, default: Any) -> Any:
        fn = original(implementation, default)

        def attention(*args: Any, **kwargs: Any) -> Any:
            if args and id(args[0]) in wanted and args[0] is run.modules.get(id(args[0])):
                return run.attention(fn, args, kwargs)
            return fn(*args, **kwargs)

        return attention

    setattr(interface, "get_interface", get_interface)  # noqa: B010 - for this run only

    def restore() -> None:
        if before is _UNSET:
            interface.__dict__.pop("get_interface", None)
        else:
            setattr(interface, "get_interface", before)  # noqa: B010

    handles.append(restore)


def _moved(value: Any, device: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, Mapping):
        return type(value)({k: _moved(v, device) for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device) for v in value)
    return value


def forward_inputs(
    model: Any, inputs: Any
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The call ``model.trace(inputs)`` makes of the model: nnsight's own batching of
    one input (tokenizing, padding, position ids), on the model's device, and what it
    calls with them (each nnsight release its own way: ``compat.prepared_call``). A
    batch of tensors run again unchanged (the same tensors, none edited in place since,
    the same model, device and padding side) is batched once: the runs of a loop over
    places on one batch pay nnsight's batching once (about 0.1 ms a run, 3-4 % of a
    forward of 16 tokens on the bench's 4-layer Llama)."""
    key = _batch_key(model, inputs)
    batched = _cache(model, "batched") if key is not None else {}
    if key is not None:
        hit = batched.get(id(inputs))
        if hit is not None and hit.inputs is inputs and hit.holds(key):
            return hit.call, hit.args, dict(hit.kwargs)
    call, args, kwargs = compat.prepared_call(model, inputs)
    device = getattr(model, "device", None)
    if device is not None:
        args, kwargs = _moved(args, device), _moved(kwargs, device)
    if key is not None:
        if len(batched) >= _BATCHED_KEPT:
            batched.pop(next(iter(batched)))
        made = _versions([*args, *kwargs.values()])
        batched[id(inputs)] = _Batched(inputs, key, call, args, dict(kwargs), made)
    return call, args, kwargs


@dataclass(frozen=True)
class _Batched:
    """A batch of tensors batched once for a forward: the inputs, what they were
    batched by (``_batch_key``), the call and its arguments, and the arguments'
    tensors with their in-place versions then."""

    inputs: Any
    key: tuple[Any, ...]
    call: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    made: tuple[tuple[Any, int], ...]

    def holds(self, key: tuple[Any, ...]) -> bool:
        """Whether the batch is still this one: the same context, the same tensor
        objects at the same versions, and no argument edited in place since (a
        forward that edits its input ids, a caller that edits the batch)."""
        context, tensors = self.key
        now_context, now_tensors = key
        return (
            context[0] is now_context[0]
            and context[1:] == now_context[1:]
            and len(tensors) == len(now_tensors)
            and all(
                n == m and t is u and v == w
                for (n, t, v), (m, u, w) in zip(tensors, now_tensors, strict=True)
            )
            and all(t._version == v for t, v in self.made)
        )


# batches of tensors already batched for a forward, by id(inputs), in the model's
# engine_cache ("batched"); a few kept
_BATCHED_KEPT = 4


def _versions(values: Any) -> tuple[tuple[Any, int], ...]:
    import torch

    return tuple((v, v._version) for v in values if isinstance(v, torch.Tensor))


def _batch_key(model: Any, inputs: Any) -> tuple[Any, ...] | None:
    """What a batch of tensors is batched by: (the model, its device and tokenizer's
    padding side), and each (name, tensor, in-place version) — the tensor
    object itself, which the kept entry holds alive; None for anything else (text is
    tokenized again each run)."""
    import torch

    if not isinstance(inputs, Mapping) or not inputs:
        return None
    tensors = []
    for name, value in inputs.items():
        if not isinstance(value, torch.Tensor):
            return None
        tensors.append((str(name), value, int(value._version)))
    side = getattr(getattr(model, "tokenizer", None), "padding_side", None)
    return (model, str(getattr(model, "device", None)), side), tuple(tensors)


@dataclass(frozen=True)
class Prepared:
    """A batch prepared once for many runs on subsets of its rows: what
    ``forward_inputs`` makes of it (the callable and its keyword arguments), every
    argument a batch-first tensor of the batch's rows, so the batch's rows at an index
    are each argument's rows there (nnsight's batching of one tokenized input is row by
    row)."""

    call: Callable[..., Any]
    kwargs: Mapping[str, Any]

    def select(self, index: Any) -> Prepared:
        """The rows at ``index`` (a 1-D index tensor), in that order."""
        return Prepared(self.call, {key: value[index] for key, value in self.kwargs.items()})


def prepared(model: Any, inputs: Any) -> Prepared | None:
    """``inputs`` (a tokenized batch) prepared once, as ``run`` prepares it; None where
    the call takes anything but batch-first tensors of one row count (each run then
    prepares its own rows)."""
    import torch

    call, args, kwargs = forward_inputs(model, inputs)
    ids = kwargs.get("input_ids")
    if args or not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return None
    rows = ids.shape[0]
    for value in kwargs.values():
        if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.shape[0] != rows:
            return None
    return Prepared(call, kwargs)


# per root module: nnsight's controllers a hooks run sets aside (``compat.controllers``)
_ASIDE: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, Any, Any, Any, Any], ...]] = (
    weakref.WeakKeyDictionary()
)


def _set_aside(root: Any, restore: list[Callable[[], None]]) -> None:
    """Run ``root``'s forward as the model's own, nnsight's controllers set aside
    until ``restore`` runs: outside a trace each one only calls the module's body
    (``compat.controllers``), so the forward computes the same tensors, and the
    hooks run at the same modules. Nothing is set aside while a trace interleaves
    this model (it needs them); a controller found replaced since (a module whose
    forward was reassigned, one dispatched again, a body changed) is left running,
    and the modules are listed again next run."""
    if root is None or compat.trace_running(root):
        return
    found = _ASIDE.get(root)
    if found is None:
        found = _ASIDE[root] = compat.controllers(root)
    swapped = []
    for own, controller, state, body, bind in found:
        if own.get("forward") is not controller or state.original is not body:
            _ASIDE.pop(root, None)  # listed again next run
            continue
        if bind is None:
            del own["forward"]  # the class's forward
        else:
            module = bind()
            if module is None:
                continue
            own["forward"] = types.MethodType(body, module)
        swapped.append((own, controller))

    def put_back() -> None:
        for own, controller in swapped:
            own["forward"] = controller

    restore.append(put_back)


def dispatched(model: Any) -> None:
    """Load the real weights where nnsight has not yet (a hook on a meta module would
    never fire: dispatch replaces the modules)."""
    if not getattr(model, "dispatched", True):
        model.dispatch()


def run(model: Any, program: tuple[Step, ...], inputs: Any) -> list[Any]:
    """Run ``program`` (``lower``'s steps, in forward order; a step may carry ``edit``,
    a write's value made of the place's handed tensor, and ``then``, applied to a read
    in its hook) in one forward of ``model`` on ``inputs`` (or a ``Prepared`` batch's
    rows); return the reads in program order. Every hook is removed before this
    returns or raises."""
    dispatched(model)
    run_ = _Run(model, program)
    if isinstance(inputs, Prepared):
        call, args, kwargs = inputs.call, (), dict(inputs.kwargs)
    else:
        call, args, kwargs = forward_inputs(model, inputs)
    if not compat.is_08():  # (0.8 leaves none: the loop is not run there)
        for module in run_.modules.values():
            compat.clear_pending_operations(module)
    handles: list[Callable[[], None]] = []
    placed: list[tuple[Any, Any, int]] = []
    bound = run_.functions.bound(run_)
    try:
        _install(bound, handles, placed)
        _install_interface(run_, handles)
        _set_aside(getattr(model, "_model", None), handles)
        # (a flat place is refused for this engine at lowering: nothing here reads the
        # layers' token shapes, and their hooks would only slow each layer's call)
        run_.env.internals.tokens_aside(handles)
        call(*args, **kwargs)
    finally:
        for remove in reversed(handles):
            remove()
        _take(placed)
        bound.run = None
    missing = run_.missing()
    if missing:
        raise refused(
            program[missing[0]]["where"],
            "its hook never fired: the module (or the attention call) did not run in this "
            "forward the way a hook reaches it",
        )
    return [run_.reads[i] for i in range(len(program)) if not program[i]["write"]]


def run_plan(
    plan: Any,
    model: Any,
    inputs: Any,
    held: bool = False,
    indices: Mapping[Any, Any] | None = None,
) -> dict[Any, Any]:
    """``Plan.run(..., engine="hooks")``: the plan's reads by address."""
    from .lower import Target, lower

    dispatched(model)
    program = lower(plan, model, held, indices, target=Target.HOOKS)
    return dict(zip(program.reads, run(model, program.steps, inputs), strict=True))


__all__ = ["HooksRefused", "Prepared", "forward_inputs", "prepared", "run", "run_plan"]
