"""Remote execution on NDIF: what a request carries, what the server must have, and
plans sent as plain nnsight module accesses.

Two ways a trace of a causalab_mini model reaches a server:

1. **Your own trace** (``with model.trace(x, remote=True): model.layers_mid[1]``):
   the request pickles the model object and the places you touch by reference, so
   the server must have causalab_mini and nnterp installed at the client's versions.
   ``StandardizedTransformer.to_model_key`` checks that before anything is sent,
   where the server says what it has (``nnsight.ndif.get_remote_env``), and the
   model's pickled state carries what the server must run with (attention
   implementation, dtype, versions), checked when the server unpickles it.
2. **A plan** (``Plan.run(model, inputs, remote=True)``): the plan is lowered on the
   client to plain steps (nnsight Envoys, operation names, numbers, tensors) and run
   by the functions of ``causalab_mini.plain``, whose source travels with the
   request. The request names nothing of causalab_mini or nnterp, so a stock NDIF
   server (nnsight, transformers, torch) runs it. What it must run with travels as
   data and is checked first thing on the server.
"""

from __future__ import annotations

import builtins
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import compat
from . import plain as plain_module
from .errors import RemoteIncomplete, RemoteMismatch, RemoteRefused, WriteRefused
from .lower import Program, Target, lower
from .versions import installed_version

# What the server must have installed, by the way a request reaches it.
PACKAGES = ("causalab_mini", "nnterp")


# ---------------------------------------------------------------------- loading

NO_DISPATCH = (
    "this model was loaded with remote=True, which keeps its weights off this machine, and "
    "something asked to load them during construction; nothing should: please report it"
)

PROBS_DEFERRED = (
    "nnterp's check that attention probabilities sum to 1 and that writing them changes "
    "the logits runs a forward, and remote=True keeps the weights off this machine: their "
    "shape was checked with scan() on the meta model, and the server's forward is the one "
    "that runs them"
)


# ---------------------------------------------------------------------- what travels

# the key under which a pickled causalab_mini model carries what the server must run
EXPECTED = "_causalab_mini_expected"


def versions() -> dict[str, str | None]:
    """The installed versions a request of the first kind needs on the server too."""
    from causalab_mini import __version__

    return {"causalab_mini": __version__, "nnterp": installed_version("nnterp")}


def _dtype(model: Any) -> str | None:
    for parameter in model._module.parameters():
        return str(parameter.dtype)
    return None


def expected(model: Any, with_versions: bool = False) -> dict[str, Any]:
    """What the server's model must run with for places resolved on ``model`` to mean
    the same tensors there: its attention implementation and dtype (and, for a
    request that pickles causalab_mini objects, the packages' versions)."""
    config = model._module.config
    out: dict[str, Any] = {
        "attn_implementation": getattr(config, "_attn_implementation", None) or "eager",
        "dtype": _dtype(model),
    }
    if with_versions:
        out["versions"] = versions()
    return out


def check_arrival(model: Any, wanted: Mapping[str, Any]) -> None:
    """On the server, as a causalab_mini model is unpickled from a request: refuse a
    server whose model or packages differ from the client's."""
    try:
        plain_module.check_server(model, dict(wanted))
    except RuntimeError as exc:
        raise RemoteMismatch(str(exc)) from None
    here = versions()
    for package, version in dict(wanted.get("versions") or {}).items():
        if version is not None and here.get(package) != version:
            raise RemoteMismatch(
                f"causalab_mini: the request was made with {package} {version} and this "
                f"server has {here.get(package)}: install {_pip(package)}=={version} on the "
                "server, or send a Plan (Plan.run(..., remote=True)), which needs neither "
                "causalab_mini nor nnterp there"
            )


def _pip(package: str) -> str:
    return package.replace("_", "-")


# ---------------------------------------------------------------------- before sending


def require_ndif_client() -> None:
    """Refuse a remote run under an nnsight release whose NDIF client this module was
    not written against (``compat.NDIF_CLIENTS``: 0.6, 0.7 and 0.8, each through the
    spellings in ``compat``)."""
    from . import compat

    if compat.ndif_client() is None:
        raise RemoteRefused(
            f"remote runs (NDIF) are written against the NDIF clients of nnsight "
            f"{', '.join(compat.NDIF_CLIENTS)}, and nnsight {compat.nnsight_version()} is "
            "installed, whose client and request format this release has not been run "
            "against: install `pip install 'nnsight>=0.6,<0.9'` to run remotely, or run "
            "without remote=True (local traces and plans need no NDIF client)"
        )


def ensure_model_key(model: Any) -> None:
    """nnsight asks the Hugging Face Hub for a repo id's canonical spelling when it
    builds a model key; a local directory has none (the Hub refuses a path). Its key
    is its absolute path, which a server loads the checkpoint from: the server needs
    the same checkpoint at that path."""
    from . import compat

    require_ndif_client()
    repo_id = getattr(model, "repo_id", None)
    if isinstance(repo_id, str) and os.path.isdir(repo_id):
        compat.model_id_cache().setdefault(repo_id, os.path.abspath(repo_id))


_UNANSWERED: set[str] = set()
_ANSWERS: dict[str, dict[str, Any]] = {}


def _host(host: str | None = None) -> str:
    from nnsight import CONFIG

    return str(host or CONFIG.API.HOST)


def server_env(host: str | None = None) -> dict[str, Any] | None:
    """The packages of the server at ``host`` (default: nnsight's configured one) as
    NDIF reports them (its /env), or None where it does not say (no answer is not a
    refusal: the request itself then finds out). Each host is asked once in this
    process, answered or not (and nnsight's own answer, where it keeps one, first)."""
    from . import compat

    host = _host(host)
    known = compat.remote_env_known(host)
    if known is not None:
        return known
    if host in _ANSWERS:
        return _ANSWERS[host]
    if host in _UNANSWERED:
        return None
    try:
        env = compat.remote_env(host)
    except Exception:
        _UNANSWERED.add(host)
        return None
    if not isinstance(env, dict):
        _UNANSWERED.add(host)
        return None
    _ANSWERS.setdefault(host, env)
    return env


def preflight_packages(model: Any, host: str | None = None) -> None:
    """Refuse, before sending, a trace that pickles causalab_mini objects to a server
    (at ``host``, default nnsight's configured one) known to lack causalab_mini or
    nnterp at this client's versions."""
    env = server_env(host)
    if env is None:
        return
    packages = env.get("packages") or {}
    problems = []
    for package, version in versions().items():
        found = packages.get(package)
        if found != version:
            has = "does not have it" if found is None else f"has {found}"
            problems.append(f"{package} {version} (the server {has})")
    if problems:
        install = " ".join(f"{_pip(p)}=={v}" for p, v in versions().items())
        raise RemoteRefused(
            "a trace of a causalab_mini model sends the model and the places it touches by "
            "reference, which a server runs with its own installed copy, and the server "
            f"lacks {', '.join(problems)}. Install `pip install {install}` on the server, or "
            "send the reads and writes as a Plan (Plan.of(...).run(model, inputs, "
            "remote=True)): a plan reaches the server as plain nnsight module accesses and "
            "needs neither package there"
        )


def _lacking(text: str) -> str | None:
    """The package of ours a server's ModuleNotFoundError names, if any."""
    for package in PACKAGES:
        if f"No module named '{package}" in text:
            return package
    return None


def _server_says(text: str) -> str | None:
    """The message one of causalab_mini's server-side checks raised, if any."""
    for line in text.splitlines():
        at = line.find("causalab_mini: ")
        if at >= 0 and 'f"' not in line and 'f"' not in line:
            return line[at:]
    return None


def remote_host(remote: Any = None, backend: Any = None) -> str | None:
    """The host a ``remote=``/``backend=`` spelling names, if it names one: nnsight
    takes a URL as ``remote="http://host"`` (0.8) or ``backend="http://host"``
    (0.6/0.7); both go through :func:`backend` here, on every release."""
    for value in (backend, remote):
        if isinstance(value, str) and value != "local":
            if not value.startswith(("http://", "https://")):
                raise RemoteRefused(
                    f"remote={value!r} names no NDIF host: write remote=True (nnsight's "
                    "configured host), remote='http://host:port', or remote='local'"
                )
            return value
    return None


def wants_backend(remote: Any = None, backend: Any = None) -> bool:
    """Whether a ``trace``/``Plan.run`` spelling asks for NDIF through a backend this
    module builds: ``remote=True``, ``remote="http://host"`` or ``backend="http://host"``
    (not ``remote="local"``, nnsight's in-process simulation, nor a backend object the
    caller built)."""
    if isinstance(backend, str):
        return True
    return backend is None and bool(remote) and remote != "local"


def backend(
    model: Any,
    blocking: bool = True,
    host: str | None = None,
    job_id: str | None = None,
    verbose: bool = False,
) -> Any:
    """nnsight's RemoteBackend for ``model`` (at ``host``, default nnsight's
    configured one), built as the installed nnsight builds it
    (``compat.remote_backend``), whose failures name what the server lacks or runs
    differently (the check before sending only knows where the server says what it
    has)."""
    from nnsight.intervention.backends.remote import RemoteBackend

    from . import compat

    ensure_model_key(model)
    if hasattr(model, "internals"):  # a causalab_mini model: checked against host's /env
        key = model.to_model_key(host=host)
    else:
        key = model.to_model_key()

    class _Backend(RemoteBackend):  # type: ignore[misc]
        def __call__(self, tracer: Any = None) -> Any:
            try:
                return super().__call__(tracer)
            except Exception as exc:
                raise _explained(exc) from None

    return compat.remote_backend(
        _Backend, model, key, host=host, blocking=blocking, job_id=job_id, verbose=verbose
    )


def _explained(exc: Exception) -> Exception:
    text = str(exc)
    missing = _lacking(text)
    if missing is not None:
        install = " ".join(f"{_pip(p)}=={v}" for p, v in versions().items())
        return RemoteRefused(
            f"the server has no {missing}: a trace of a causalab_mini model sends the model "
            "and its places by reference, which the server runs with its own installed copy. "
            f"Install `pip install {install}` on the server, or send the reads and writes "
            "as a Plan (Plan.run(..., remote=True)), which needs neither package there"
        )
    said = _server_says(text)
    if said is not None and said.startswith(WRITE_REFUSED):
        return WriteRefused(said[len(WRITE_REFUSED) :])
    if said is not None:
        return RemoteMismatch(said)
    return exc


WRITE_REFUSED = "causalab_mini: write refused: "


# ---------------------------------------------------------------------- plain model


_OWN = ("causalab_mini", "nnterp")


def plain_model(model: Any) -> Any:
    """An nnsight ``LanguageModel`` over the same module tree, Envoys and interleaver
    as ``model``, without causalab_mini's or nnterp's attributes: what a request
    pickles of it is nnsight's own classes (made anew for each run, so it always
    sees the model's current state)."""
    from nnsight import LanguageModel

    clone = object.__new__(LanguageModel)
    for key, value in model.__dict__.items():
        if type(value).__module__.split(".")[0] not in _OWN:
            clone.__dict__[key] = value
    return clone


@functools.cache
def shipped() -> dict[str, Any]:
    """``causalab_mini.plain``'s functions, made from its source in a namespace no
    server can import by name: cloudpickle then sends each by value (nnsight sends a
    function as its source), so the server needs none of causalab_mini."""
    path = Path(plain_module.__file__)
    namespace: dict[str, Any] = {"__name__": "causalab_mini_plain", "__builtins__": builtins}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------- running


def run_plan(
    plan: Any,
    model: Any,
    inputs: Any,
    *,
    held: bool = False,
    remote: bool | str = False,
    backend: Any = None,
    blocking: bool = True,
    indices: Mapping[Any, Any] | None = None,
) -> dict[Any, Any]:
    """Run ``plan`` as plain nnsight module accesses in one trace: on NDIF with
    ``remote=True`` or ``remote="http://host"`` (or on ``backend``), else locally
    (``causalab_mini.engines.RemoteEngine``). Returns every read, by address, or raises:
    never an empty result for a plan that reads."""
    if not blocking:
        raise RemoteRefused(
            "Plan.run(remote=True) waits for its reads: blocking=False would return before "
            "they exist; submit a trace of your own with blocking=False instead"
        )
    program = lower(plan, model, held, indices, target=Target.REMOTE)
    reads = execute(model, program, inputs, remote=remote, backend=backend)
    return dict(zip(program.reads, reads, strict=True))


def execute(
    model: Any, program: Program, inputs: Any, *, remote: bool | str, backend: Any
) -> list[Any]:
    """Run a program lowered for a server (``Target.REMOTE``) in one trace of the plain
    model (``plain_model``): on NDIF, on ``backend``, or locally; the reads in program
    order, every one of them, or it raises."""
    wanted = expected(model)
    run = shipped()["run"]
    plain = plain_model(model)
    kwargs: dict[str, Any] = {}
    if wants_backend(remote, backend):
        kwargs["backend"] = globals()["backend"](plain, host=remote_host(remote, backend))
    elif backend is not None:
        require_ndif_client()
        kwargs["backend"] = backend
    elif remote:  # "local": nnsight's in-process simulation of the request
        kwargs["remote"] = remote
    # the server's nnsight makes the batch: on 0.6/0.7 the position ids the local
    # model would add are made here and sent with it (compat.supply_position_ids)
    inputs = compat.with_position_ids(model, inputs)
    try:
        reads = _execute(plain, inputs, program.steps, wanted, run, kwargs)
    except Exception as exc:
        raise _explained(exc) from None
    if not isinstance(reads, list) or len(reads) != len(program.reads):
        got = "nothing" if reads is None else f"{len(reads)} values"
        raise RemoteIncomplete(
            f"the plan read {len(program.reads)} places and the trace handed back {got}: "
            "the server's result did not hold the reads (was the request's result "
            "downloaded?)"
        )
    return reads


def _execute(
    plain: Any, inputs: Any, program: Any, wanted: Any, run: Any, kwargs: dict[str, Any]
) -> Any:
    reads = None  # bound before the trace: nnsight hands saved values back by name
    with plain.trace(inputs, **kwargs):
        reads = run(plain, program, wanted).save()
    return reads


__all__ = [
    "RemoteIncomplete",
    "RemoteMismatch",
    "RemoteRefused",
    "check_arrival",
    "execute",
    "expected",
    "plain_model",
    "preflight_packages",
    "remote_host",
    "require_ndif_client",
    "run_plan",
    "server_env",
    "shipped",
    "wants_backend",
]
