"""What differs between the nnsight releases the project supports (0.6, 0.7, 0.8).

Two kinds of thing live here, and nothing else does:

* **Shims** (``install()``): where nnterp 1.3 (which has no release for nnsight 0.8)
  or nnsight itself breaks on 0.8, the smallest bridge for that one break, each naming
  the upstream line it bridges and the versions that need it. ``install()`` runs
  before nnterp is imported (``causalab_mini.model`` calls it first) and does nothing
  on nnsight 0.6 and 0.7. Each shim checks that the thing it bridges is still broken,
  so a fixed upstream release turns it off by itself.
* **Spellings**: the few nnsight internals the runtime reads, one function each,
  answered for the installed version (the alias map, a child module named after an
  nnsight attribute, a forward's parsed source, the function a forward's operations
  are named from, the order in which an operation hands over its inputs and its
  callee, the trace body running now and the forward pass it is at, a first input
  written by keyword, an invoke's rows of a value 0.6/0.7 do not narrow), and the
  NDIF client's (its series, the Hub-id table a model key is made
  from, the server's ``/env``, the backend's constructor).

No shim touches nnsight's ``Envoy`` or tracing: the runtime asks here instead.

Not bridged, on purpose (0.8 is stricter, and right): a ``rename`` alias that would
hide a child or attribute raises on 0.8 where 0.6/0.7 silently ignored the alias
(bert_generation.yaml no longer asks for one; where nnterp's own built-in table
would make such an alias, the family leaves that key unbound, ``unbound_defaults``:
modernbert_decoder.yaml, musicgen.yaml, prophetnet.yaml); and 0.8 serves a module's calls in
order, so a module that runs more than once per forward (NanoChat's final norm,
GPT-1's activation shared by every layer) cannot be read at a later call. The rows say
so (nanochat.yaml, openai_gpt.yaml), a place on a module shared by several layers is
refused past its first path (``shared_path``), and the sweep reports a whole-model
place that depends on the trace as broken on both.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from packaging.version import Version


@functools.cache
def nnsight_version() -> Version:
    """The installed nnsight's version (read from its metadata, without importing it)."""
    from importlib.metadata import version

    return Version(version("nnsight"))


_NNSIGHT_08 = Version("0.8.0.dev0")


def is_08() -> bool:
    """Whether the installed nnsight is 0.8 or later (the releases with ``Source`` /
    ``Compiled``, ``_aliases`` and ``E_``-mounted children). Asked several times per
    read: answered once per version object (comparing versions costs ~5 us)."""
    version = nnsight_version()
    if _IS_08[0] is not version:
        _IS_08[0], _IS_08[1] = version, version >= _NNSIGHT_08
    return bool(_IS_08[1])


# the version is_08 last answered for, and its answer
_IS_08: list[Any] = [None, False]


# ---------------------------------------------------------------------- shims

_INSTALLED = False


def install() -> None:
    """Install the shims the installed nnsight needs (none before 0.8). Idempotent;
    call it before the first ``import nnterp``."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    if not is_08():
        return
    _nnterp_object_import()
    _nnsight_tokenizer_lookup()
    _nnterp_model_alias()


_GLOBALS = "nnsight.intervention.tracing.globals"


class _ObjectModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``nnsight.intervention.tracing`` and ``…tracing.globals`` (only those two
    names, and only where no other finder can) as modules holding ``Object``."""

    names = ("nnsight.intervention.tracing", _GLOBALS)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=fullname != _GLOBALS)

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        from nnsight.tracing.hint import Object

        module.Object = Object
        if module.__name__ != _GLOBALS:
            module.__path__ = []


def _nnterp_object_import() -> None:
    """nnterp 1.3.0 ``utils.py:8`` and ``nnsight_utils.py:10``: ``from
    nnsight.intervention.tracing.globals import Object``, a type hint. nnsight 0.8
    moved it to ``nnsight.tracing.hint.Object`` and removed the module, so ``import
    nnterp`` fails. Bridged by an import finder placed last on ``sys.meta_path``: it
    answers those two module names only, and only when nnsight has no such module."""
    try:
        importlib.util.find_spec(_GLOBALS)
    except ModuleNotFoundError:
        pass
    else:
        return  # the module exists: nothing to bridge
    if not any(isinstance(f, _ObjectModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_ObjectModuleFinder())


_PREPROCESSOR_FLAGS = {
    "tokenizer": "_load_tokenizer",
    "image_processor": "_load_image_processor",
    "feature_extractor": "_load_feature_extractor",
    "processor": "_load_processor",
}


def _nnsight_tokenizer_lookup() -> None:
    """nnsight 0.8.1 ``modeling/transformers.py`` ``TransformersModel._loaded_preprocessors``
    reads ``getattr(check_task(task)[1]["impl"], "_load_tokenizer")``; transformers
    5.23 made ``impl`` a dotted-path string, so no preprocessor is sourced and the meta
    pipeline fails with "Impossible to guess which tokenizer to use" (a plain
    ``LanguageModel(path)`` too). Bridged by resolving a string ``impl`` to its class
    and adding what that class loads; a class ``impl`` (transformers < 5.23) is left
    to nnsight."""
    from nnsight.modeling.transformers import TransformersModel

    original = TransformersModel.__dict__.get("_loaded_preprocessors")
    if original is None or getattr(original, "_causalab_mini_shim", False):
        return

    @functools.wraps(original)
    def _loaded_preprocessors(self: Any) -> set[str]:
        found: set[str] = set(original(self))
        try:
            from transformers.pipelines import check_task

            impl = check_task(self.task)[1]["impl"]
        except Exception:
            return found  # nnsight's own answer (every preprocessor, for an unknown task)
        if isinstance(impl, str):
            module, _, name = impl.rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            found |= {
                attr for attr, flag in _PREPROCESSOR_FLAGS.items() if getattr(cls, flag, False)
            }
        return found

    _loaded_preprocessors._causalab_mini_shim = True  # type: ignore[attr-defined]
    TransformersModel._loaded_preprocessors = _loaded_preprocessors


def _nnterp_model_alias() -> None:
    """nnterp 1.3.0 ``standardized_transformer.py:133-153`` and ``rename_utils.py:432``
    read ``model._model``, the alias nnsight 0.6/0.7 kept of ``model._module``; nnsight
    0.8 removed it. Bridged by a read-only ``_model`` property on nnterp's
    ``StandardizedTransformer`` only (not on nnsight's classes)."""
    import nnterp
    from nnsight import LanguageModel

    cls = nnterp.StandardizedTransformer
    if "_model" in vars(cls) or hasattr(LanguageModel, "_model"):
        return
    cls._model = property(lambda self: self._module, doc="nnsight < 0.8's alias of _module")


# ---------------------------------------------------------------------- spellings


def auto_class_kwargs(auto_class: str, traced_module: str | None = None) -> dict[str, Any]:
    """The keyword arguments that make nnsight's ``LanguageModel`` load a checkpoint
    with the transformers auto class ``auto_class`` (a name such as
    ``AutoModelForImageTextToText``) instead of ``AutoModelForCausalLM``, on the meta
    build and at dispatch alike. nnsight 0.6/0.7 take it as ``automodel=`` (and then
    skip 0.7's refusal of a model type registered for image-text-to-text); 0.8 loads
    through a ``transformers.pipeline`` whose task decides the class, so the class is
    given as a text-generation task of its own (``_text_task``). ``traced_module``: the
    family traces that submodule of the model the class loads (``traced``), and the
    class given loads the whole model and returns the submodule."""
    if not is_08():
        if traced_module:
            from .traced import traced_auto_class

            return {"automodel": traced_auto_class(loading_class(auto_class), traced_module)}
        return {"automodel": loading_class(auto_class)}
    return {"task": _text_task(auto_class, traced_module)}


def causal_lm_kwargs(model_type: str | None) -> dict[str, Any]:
    """nnsight 0.6/0.7 refuse, when they load with their default
    ``AutoModelForCausalLM``, a checkpoint whose model type transformers registers for
    image-text-to-text (``LanguageModel._check_is_text_only``): a causal LM saved with
    such a composite config (Mllama's text model under ``MllamaConfig``). There the
    same auto class is given behind a loader of its own, which that check lets through;
    nothing elsewhere, nor on 0.8 (it loads through a pipeline task)."""
    if is_08() or not model_type:
        return {}
    try:
        from transformers.models.auto.modeling_auto import (
            MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as image_text,
        )
    except ImportError:
        return {}
    if model_type not in image_text:
        return {}
    return {"automodel": _causal_lm_loader()}


@functools.cache
def _causal_lm_loader() -> Any:
    """``AutoModelForCausalLM``'s two class methods nnsight calls, on a class of its own."""
    from transformers import AutoModelForCausalLM

    def from_config(_: Any, /, *args: Any, **kwargs: Any) -> Any:
        return AutoModelForCausalLM.from_config(*args, **kwargs)  # type: ignore[no-untyped-call]

    def from_pretrained(_: Any, /, *args: Any, **kwargs: Any) -> Any:
        return AutoModelForCausalLM.from_pretrained(*args, **kwargs)

    return type(
        "LoadingAutoModelForCausalLM",
        (),
        {
            "from_config": classmethod(from_config),
            "from_pretrained": classmethod(from_pretrained),
            "__doc__": "AutoModelForCausalLM, past nnsight 0.6/0.7's image-text refusal",
        },
    )


@functools.cache
def loading_class(name: str) -> Any:
    """The transformers class ``name`` as nnsight loads with it: an auto class itself; a
    concrete model class (a family's ``model_class``, where no auto class loads the
    config) behind the two class methods nnsight calls on an auto class,
    ``from_config`` (the meta build: the class's ``_from_config``, without the
    auto-only ``trust_remote_code``) and ``from_pretrained``."""
    import transformers

    from .classes import is_auto_class

    cls = getattr(transformers, name)
    if is_auto_class(cls):
        return cls

    def from_config(_: Any, /, config: Any, **kwargs: Any) -> Any:
        kwargs.pop("trust_remote_code", None)
        return cls._from_config(config, **kwargs)

    def from_pretrained(_: Any, /, *args: Any, **kwargs: Any) -> Any:
        return cls.from_pretrained(*args, **kwargs)

    return type(
        f"Loading{name}",
        (),
        {
            "from_config": classmethod(from_config),
            "from_pretrained": classmethod(from_pretrained),
            "model_class": cls,
            "__doc__": f"{name}, loaded the way an auto class is",
        },
    )


@functools.cache
def _text_task(auto_class: str, traced_module: str | None = None) -> str:
    """A pipeline task registered with transformers (its public ``PIPELINE_REGISTRY``)
    that is text generation loaded with ``auto_class``: tokenizer-only preprocessing,
    the model class the caller names. A subclass of ``TextGenerationPipeline`` is
    registered, not the class itself (registration marks the class it is given).
    With ``traced_module``, the class loads the whole model and the task's model is
    its submodule at that path (``traced.traced_auto_class``)."""
    from transformers.pipelines import (  # type: ignore[attr-defined]  # not in its __all__
        PIPELINE_REGISTRY,
        TextGenerationPipeline,
    )

    task = f"text-generation-{auto_class}"
    auto = loading_class(auto_class)
    table = getattr(getattr(auto, "_model_mapping", None), "_model_mapping", None)
    if traced_module:
        from .traced import traced_auto_class

        task = f"{task}-{traced_module}"
        auto = traced_auto_class(auto, traced_module)

    def check_model_type(self: Any, supported_models: Any) -> None:
        # the models this task loads are the auto class's (its config type -> class
        # name table), or the one concrete class it stands for, not the causal LMs;
        # with a traced submodule, the submodule the family names (whatever class
        # sits at that path)
        names: list[str] = [auto_class] if table is None else []
        for value in (table or {}).values():
            names.extend(value if isinstance(value, tuple) else (value,))
        if traced_module:
            names.append(type(self.model).__name__)
        TextGenerationPipeline.check_model_type(self, names)

    cls = type(
        f"TextGenerationWith{auto_class}",
        (TextGenerationPipeline,),
        {"check_model_type": check_model_type},
    )
    PIPELINE_REGISTRY.register_pipeline(task, pipeline_class=cls, pt_model=auto, type="text")
    return task


#: nnsight 0.8 mounts a child module named after one of its own attributes (a BERT
#: layer's ``output``) at ``E_<name>``; 0.6/0.7 mount it at ``<name>`` and move the
#: module's own boundary to ``nns_<name>``.
OVERLOAD_PREFIX = "E_"


def child_attribute(envoy: Any, name: str) -> str:
    """The attribute of ``envoy`` that holds its child module ``name`` (``E_output``
    for a child called ``output`` on nnsight 0.8; ``name`` elsewhere)."""
    overloaded = OVERLOAD_PREFIX + name
    if overloaded in envoy.__dict__ and is_08():
        return overloaded
    return name


def container_path(path: str) -> str:
    """A container's module path as the installed nnsight mounts it, for a ``rename``
    alias: on 0.8 a module named after a value nnsight serves on every Envoy (an
    unembedding that is a root child called ``output``) sits at ``E_<name>``, and an alias
    spelled with the bare name would be looked up as that value on every module; on
    0.6/0.7 the path as written."""
    if not is_08():
        return path
    import inspect

    from nnsight.intervention.envoy import Envoy

    return ".".join(
        OVERLOAD_PREFIX + part
        if not part.startswith("_") and inspect.isdatadescriptor(getattr(Envoy, part, None))
        else part
        for part in path.split(".")
    )


def alias_target(envoy: Any, name: str) -> str | None:
    """The module path an alias ``name`` of ``envoy`` stands for, or None.
    (``_alias.alias_to_name`` on nnsight 0.6/0.7; ``_aliases`` on 0.8.)"""
    d = envoy.__dict__
    alias = d.get("_alias")
    target: str | None = None
    if alias is not None:
        target = alias.alias_to_name.get(name)
    elif not name.startswith(OVERLOAD_PREFIX):
        target = (d.get("_aliases") or {}).get(name)
    return target


def aliases_of(envoy: Any) -> dict[str, list[str]]:
    """Module name -> its aliases on ``envoy`` (``_alias.name_to_aliases`` on nnsight
    0.6/0.7; ``_aliases`` inverted on 0.8, without the ``E_`` mounts)."""
    d = envoy.__dict__
    alias = d.get("_alias")
    if alias is not None:
        return dict(alias.name_to_aliases)
    out: dict[str, list[str]] = {}
    for name, target in (d.get("_aliases") or {}).items():
        if not name.startswith(OVERLOAD_PREFIX):
            out.setdefault(target, []).append(name)
    return out


def shared_path(envoy: Any, name: str) -> str | None:
    """Where the child ``name`` of ``envoy`` is a second path to a module the tree
    already holds (one module object in every layer, as GPT-1's activation), the first
    path; else None. nnsight 0.8 gives such a module one envoy, at its first path, and
    serves its calls in order, so a read through the second path sees the first call;
    0.6/0.7 give each path its own envoy."""
    if not is_08():
        return None
    d = envoy.__dict__
    attribute = child_attribute(envoy, name)
    first = (d.get("_aliases") or {}).get(attribute)
    sub = d.get(attribute)
    if first is None or getattr(sub, "path", None) != first:
        return None  # not shared, or a rename alias (its target is a relative path)
    return None if first == f"{envoy.path}.{name}" else str(first)


def forward_key(module: Any) -> Any | None:
    """The function whose source nnsight parses for ``module``'s ``.source``: modules
    sharing it have the same operations under the same names (None where that cannot
    be said). nnsight 0.6 parses the class's forward (``Envoy.source``:
    ``inject(type(self._module).forward, ...)``); 0.7 ``resolve_true_forward``; 0.8
    the body its controller runs (``module_body``), as it was before instrumentation."""
    if not is_08():
        try:
            from nnsight.intervention.source import resolve_true_forward
        except ImportError:
            return type(module).forward
        try:
            return resolve_true_forward(module)
        except Exception:
            return None
    try:
        from nnsight.intervention import source
    except ImportError:
        return None
    state = module.__dict__.get(getattr(source, "STATE", None))
    if state is not None:
        return state.original
    try:
        return source.module_body(module)
    except Exception:
        return None


def parsed_source(accessor: Any) -> tuple[str, dict[str, int]]:
    """A parsed forward's text and, per operation name, the 0-based index of its line
    in ``text.split("\\n")``. nnsight 0.8: ``Source.compiled`` (``.source``, ``.names``,
    ``.lines`` 1-based); 0.6/0.7: ``.source`` and ``.line_numbers`` (0-based within the
    body, after the ``def`` line)."""
    compiled = getattr(accessor, "__dict__", {}).get("compiled")  # never an op name
    if compiled is not None:
        return compiled.source, {name: compiled.lines[name] - 1 for name in compiled.names}
    return accessor.source, {name: line + 1 for name, line in accessor.line_numbers.items()}


def source_identity(source_envoy: Any) -> Any:
    """The object a parsed forward lives on, stable across ``.source`` reads and
    weakly referenceable: 0.8 builds a new ``Source`` on each read around one
    ``Compiled`` (a tuple), whose code object is the key; 0.7 its accessor, 0.6 the
    source envoy."""
    compiled = getattr(source_envoy, "__dict__", {}).get("compiled")
    if compiled is not None:
        return compiled.code
    return getattr(source_envoy, "accessor", source_envoy)


def _pass_value(value: Any) -> None:
    """An operation hook that never changes the value (returns None) and never removes
    itself: it only keeps its operation wrapped (``keep_operations_wrapped``)."""
    return None


_SERIES_07 = (Version("0.7.0.dev0"), Version("0.8.0.dev0"))


def keep_operations_wrapped(source_envoy: Any) -> None:
    """Keep every operation of a forward whose ``.source`` is open wrapped on nnsight
    0.7, which decides whether to wrap an operation's call when the call's function is
    looked up (``SourceAccessor.wrap``: unwrapped where no hook waits for it then). Python
    looks the function up before it evaluates the arguments, so a trace body that reads
    an argument first (``F.silu(self.w1(x))``: ``self_w1_0``'s output, then ``F_silu_0``'s,
    LFM2's MLP) asks for the outer operation only after its call went by unwrapped, and
    0.7 raises MissedProviderError. A hook of our own that passes the value on keeps the
    call wrapped, so a wait the body registers during the call is served, as 0.6 and 0.8
    (which wrap every call) serve it. Idempotent; nothing on 0.6 and 0.8."""
    if not _SERIES_07[0] <= nnsight_version() < _SERIES_07[1]:
        return
    accessor = getattr(source_envoy, "accessor", None)
    for op in getattr(accessor, "operations", {}).values():
        hooks = getattr(op, "post_hooks", None)
        if isinstance(hooks, list) and _pass_value not in hooks:
            hooks.append(_pass_value)


def callee_after_inputs() -> bool:
    """Whether an operation hands over its callee (what a nested ``.source`` waits for)
    after its inputs: nnsight 0.8's ``run_op`` emits input, skip, fn, output; 0.6/0.7
    hand the fn over first. A trace must open a nested ``.source`` after reading the
    operation's inputs on 0.8 and before on 0.6/0.7, or nnsight raises OutOfOrderError."""
    return is_08()


def body_step(body: Any) -> Any:
    """A token of the forward pass (the generation step) the trace body ``body`` is
    at, which changes when the model starts another: nnsight 0.8's
    ``mediator.iteration``; 0.6/0.7 count passes per location in
    ``mediator.iteration_tracker`` (bumped after each pass in a ``tracer.iter`` loop;
    their ``iteration`` is unset there after the first step), so their sum."""
    if body is None:
        return None
    if is_08():
        return getattr(body, "iteration", None)
    tracker = getattr(body, "iteration_tracker", None)
    return None if tracker is None else sum(tracker.values())


def call_of_result_name() -> str:
    """The name stem nnsight gives a call of what a call returns (``nn.Softmax(dim=-1)(x)``,
    a module built and called in one expression): ``call`` on 0.8 (its
    ``source.py``), ``unknown`` on 0.6 (``inject.py``) and 0.7 (``source.py``)."""
    return "call" if is_08() else "unknown"


def invoke_rows(value: Any) -> Any:
    """``value`` as the running invoke sees it: its own rows of every (batch, ...)
    tensor. nnsight narrows a value to an invoke's rows through its containers; 0.6
    and 0.7 go only through a plain ``dict``, ``list`` or ``tuple`` (``type(x) ==
    dict``), so a model's own output (transformers' ``ModelOutput``, an ``OrderedDict``
    subclass) or a named tuple reaches every invoke whole: there its tensors are
    narrowed here as nnsight narrows a plain container's (``batcher._narrow``). 0.8
    descends into every mapping and tuple: the value as it is."""
    if is_08() or type(value) in (dict, list, tuple):
        return value
    from collections.abc import Mapping

    if not isinstance(value, (Mapping, list, tuple)):
        return value
    body = running_body()
    batcher = getattr(getattr(body, "interleaver", None), "batcher", None)
    group = getattr(body, "batch_group", None)
    if batcher is None or not getattr(batcher, "needs_batching", False) or not group:
        return value
    if group[0] == -1:  # an invoke without inputs: the whole batch
        return value
    import torch
    from nnsight.util import apply

    def rows(part: Any) -> Any:
        return apply(part, functools.partial(batcher._narrow, group), torch.Tensor)

    if isinstance(value, Mapping):
        return type(value)(**{key: rows(part) for key, part in value.items()})
    items = [rows(part) for part in value]
    return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)


def first_input_setter_keeps_keywords() -> bool:
    """Whether nnsight's ``envoy.input = v`` replaces the first keyword argument of a
    call made with keywords only (0.8's ``replace_first_input``). nnsight 0.6 and 0.7
    put ``v`` first among the positional arguments and keep every keyword, so a module
    called as ``attn(hidden_states=x, ...)`` gets its first argument twice (TypeError:
    got multiple values); there a write of a first input goes through ``inputs``
    (``causalab_mini.plain``, the step's ``first_input_via``)."""
    return is_08()


def several_invokes(model: Any) -> bool | None:
    """Whether the running trace batches several invokes' inputs into one forward (each
    invoke then reads its own rows of a (batch, ...) tensor, narrowed by nnsight), or
    None where this nnsight does not say. Every release keeps it on the model's
    interleaver's batcher (``_interleaver`` on 0.6, ``interleaver`` since):
    ``needs_batching`` on 0.6 and 0.7, ``batching`` on 0.8."""
    interleaver = vars(model).get("_interleaver") or getattr(model, "interleaver", None)
    batcher = getattr(interleaver, "batcher", None)
    answer = getattr(batcher, "batching" if is_08() else "needs_batching", None)
    return answer if isinstance(answer, bool) else None


def invokes_narrowed_off_the_graph(model: Any) -> bool:
    """Whether, in the running trace, an invoke's read is its rows cut off the batch's
    tensor, a view the forward does not go on with: on 0.6 and 0.7 with several invokes
    (a gradient hook on it never fires, and their backward never serves its ``.grad``,
    raising "Execution complete but ... .grad was not provided"). 0.8 serves both
    (checked in tests/test_attribution.py)."""
    return not is_08() and several_invokes(model) is True


# ---------------------------------------------------------------------- NDIF client

#: The nnsight releases whose NDIF client ``causalab_mini.remote`` is written against:
#: 0.6/0.7 (Socket.IO, headers naming the model, ``ndif.NDIF_ENV``) and 0.8 (one
#: ``/subscribe`` websocket, a multipart ``POST /request`` whose JSON envelope names
#: the model and carries ``env``, statuses as frames, ``blocking=False`` polling
#: ``GET /response/{id}``).
NDIF_CLIENTS = ("0.6", "0.7", "0.8")


def ndif_client() -> str | None:
    """The installed nnsight's NDIF client series (``"0.7"`` for 0.7.x), or None for a
    release outside ``NDIF_CLIENTS``."""
    version = nnsight_version()
    series = f"{version.major}.{version.minor}"
    return series if series in NDIF_CLIENTS else None


def model_id_cache() -> dict[str, str]:
    """nnsight's table of canonical Hub ids, by the repo id a model was loaded with,
    which it fills from the Hub when it builds a model key: ``huggingface.ID_CACHE``
    on 0.6/0.7, ``huggingface._ID_CACHE`` on 0.8."""
    from nnsight.modeling import huggingface

    table: dict[str, str] = getattr(huggingface, "_ID_CACHE" if is_08() else "ID_CACHE")
    return table


def remote_env_known(host: str) -> dict[str, Any] | None:
    """What nnsight already holds of the ``/env`` of the server at ``host``, without
    asking: nnsight 0.6/0.7 keep the configured host's answer in ``ndif.NDIF_ENV``;
    0.8 removed it (its ``get_remote_env`` keeps one answer for whichever host was
    asked first, so nothing it holds is known to be ``host``'s)."""
    if is_08():
        return None
    from nnsight import CONFIG, ndif

    env = ndif.NDIF_ENV if host == str(CONFIG.API.HOST) else None
    return env if isinstance(env, dict) else None


def remote_env(host: str) -> Any:
    """Ask the NDIF server at ``host`` what it has installed (its ``/env``: python
    version and packages); raises where it does not answer. The configured host on
    nnsight 0.6/0.7 through ``ndif.get_remote_env()`` (which fills ``NDIF_ENV``);
    otherwise ``GET {host}/env``, the request ``get_remote_env`` makes."""
    from nnsight import CONFIG

    if not is_08() and host == str(CONFIG.API.HOST):
        from nnsight import ndif

        return ndif.get_remote_env()
    import httpx

    response = httpx.get(f"{host}/env", timeout=httpx.Timeout(5.0, read=60.0))
    response.raise_for_status()
    return response.json()


def remote_backend(
    cls: Any,
    model: Any,
    model_key: str,
    *,
    host: str | None,
    blocking: bool,
    job_id: str | None = None,
    verbose: bool = False,
) -> Any:
    """``cls`` (nnsight's ``RemoteBackend`` or a subclass) built for ``model`` the way
    the installed nnsight builds it for ``trace(remote=...)``: 0.8 passes the model's
    per-request environment (``env=model._remoteable_get_env()``: the attention
    implementation the server switches to, a PEFT adapter), which 0.6/0.7's
    constructor does not take."""
    kwargs: dict[str, Any] = {"host": host, "blocking": blocking}
    if job_id is not None:
        kwargs["job_id"] = job_id
    if verbose:
        kwargs["verbose"] = verbose
    if is_08():
        kwargs["env"] = model._remoteable_get_env()
    return cls(model_key, **kwargs)


def location(envoy: Any, attr: str) -> str | None:
    """The location nnsight parks on to read ``envoy``'s ``attr`` (``model.layers.1.
    input``, an operation's ``...source.attention_interface_0.output``): 0.8 names it
    by the descriptor (``eproperty``) that serves it; None where this nnsight does not
    say."""
    for klass in type(envoy).__mro__:
        descriptor = vars(klass).get(attr)
        if descriptor is not None:
            where = getattr(descriptor, "_location", None)
            if callable(where):
                try:
                    return str(where(envoy))
                except Exception:
                    return None
            return None
    return None


def out_of_order_error() -> type[BaseException] | None:
    """nnsight's error for a location the model already ran past (0.8's
    ``OutOfOrderError``), or None where this nnsight has none of that name."""
    try:
        from nnsight.intervention.interleaver import OutOfOrderError
    except ImportError:
        # nnsight 0.6/0.7 nest it in their Mediator
        from nnsight.intervention.interleaver import Mediator

        nested = getattr(Mediator, "OutOfOrderError", None)
        return nested if isinstance(nested, type) else None
    return OutOfOrderError  # type: ignore[no-any-return]


def missed_value_error() -> type[BaseException] | None:
    """nnsight 0.6/0.7's error for a value the trace body waited for until the forward
    ended (``Mediator.MissedProviderError``): how those releases answer a location the
    model had already run past, where 0.8 raises its ``OutOfOrderError`` at once; None
    on 0.8."""
    if is_08():
        return None
    from nnsight.intervention.interleaver import Mediator

    missed = getattr(Mediator, "MissedProviderError", None)
    return missed if isinstance(missed, type) else None


def backward_running() -> bool:
    """Whether an nnsight backward trace (``with loss.backward():``) runs now: while it
    does, nnsight replaces ``torch.Tensor.grad`` with a property of its own, which parks
    the body until autograd reaches the tensor (torch's own is a C descriptor)."""
    global _TENSOR_ATTRIBUTES
    if _TENSOR_ATTRIBUTES is None:
        import torch

        _TENSOR_ATTRIBUTES = torch.Tensor.__dict__  # (a live view of the class's own)
    return isinstance(_TENSOR_ATTRIBUTES.get("grad"), property)


_TENSOR_ATTRIBUTES: Any = None


def backward_opener() -> Any:
    """Inside nnsight 0.8's ``with loss.backward():``, the mediator of the trace body
    that opened it (the greenlet the backward's body runs under); None elsewhere and on
    0.6/0.7."""
    if not is_08():
        return None
    from greenlet import getcurrent

    here = getcurrent()
    outer = here.parent
    while outer is not None:
        ref = getattr(outer, "mediator", None)
        if ref is not None:
            return ref()
        outer = outer.parent
    return None


#: 0.6/0.7: worker thread -> a weak reference to the mediator whose trace body it runs
_BODIES: Any = None

#: the parameter nnsight 0.6/0.7 compile every trace body (an invoke's, an iteration's)
#: with, holding the body's mediator
_MEDIATOR_PARAMETER = "__nnsight_mediator__"


# greenlet's getcurrent, imported once (running_body is asked on every read)
_GETCURRENT: Any = None


def running_body() -> Any:
    """The mediator of the trace body running now (the code of one invoke), or None in
    the model's forward and outside any trace. nnsight 0.8 runs a body in a greenlet
    that holds a weak reference to its mediator (``mediator``); 0.6 and 0.7 run it in a
    thread of its own (``Mediator.worker``), whose compiled body function takes the
    mediator as its first parameter (``__nnsight_mediator__``): found on the thread's
    stack once, then remembered for that thread (a worker runs one body for its life;
    the model's forward runs on the thread that opened the trace, never a worker)."""
    if is_08():
        return _running_body_08()
    import threading
    import weakref

    global _BODIES
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return None
    if _BODIES is None:
        _BODIES = weakref.WeakKeyDictionary()
    ref = _BODIES.get(thread)
    if ref is not None:
        return ref()
    frame: Any = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if _MEDIATOR_PARAMETER in code.co_varnames[: code.co_argcount]:
            mediator = frame.f_locals.get(_MEDIATOR_PARAMETER)
            if getattr(mediator, "worker", None) is thread:
                _BODIES[thread] = weakref.ref(mediator)
                return mediator
        frame = frame.f_back
    return None


def _running_body_08() -> Any:
    """``running_body`` on nnsight 0.8: the mediator the running greenlet holds."""
    global _GETCURRENT
    if _GETCURRENT is None:
        from greenlet import getcurrent

        _GETCURRENT = getcurrent
    ref = getattr(_GETCURRENT(), "mediator", None)
    return None if ref is None else ref()


def body_reader() -> Callable[[], Any]:
    """``running_body`` as one function of the installed nnsight, for a read made
    many times a trace: on 0.8 without the release check."""
    return _running_body_08 if is_08() else running_body


def clear_pending_operations(module: Any) -> None:
    """Drop the one-shot function replacements nnsight 0.7 leaves pending on
    ``module``'s operations after a trace that read inside an operation's own source
    (its attention function's probabilities): the next forward, run outside nnsight,
    would call nnsight's copy of that function instead of the one the model's code
    hands out (the hooks engine's wrapper of transformers' attention interface never
    runs). A trace that reads there installs its own again; 0.6 and 0.8 leave none."""
    if is_08():
        return
    stack = [getattr(module, "__source_accessor__", None)]
    while stack:
        accessor = stack.pop()
        for op in getattr(accessor, "operations", {}).values():
            if getattr(op, "fn_replacement", None) is not None:
                op.fn_replacement = None
            stack.append(getattr(op, "_source_accessor", None))


def controllers(root: Any) -> tuple[tuple[dict[str, Any], Any, Any, Any, Any], ...]:
    """The nnsight 0.8 controllers installed on ``root``'s modules that a forward run
    outside any trace can set aside: (the module's ``__dict__``, its controller, its
    state, the body the state runs, and None where that body is the class's forward,
    else a weak reference to the module, to bind the body to). A controller left in
    place outside a trace only calls the module's own body (the forward it found there,
    ``State.original``) after asking whether a trace is running: two Python frames on
    every module call (about 2 us each, 4 % of a forward of 16 tokens on a 4-layer
    Llama). Modules with accelerate's device-alignment hook (the controller re-applies
    it) or a forward another library owns around the controller are left alone; so is
    every module on 0.6 / 0.7 (no controllers). Nothing returned holds a module
    strongly (a cache keyed weakly by ``root`` may keep it)."""
    if not is_08():
        return ()
    try:
        from nnsight.intervention.source import BODY_FORWARD, STATE, Controller
    except ImportError:  # a 0.8 release without the controller: nothing to set aside
        return ()
    import weakref

    found = []
    for module in root.modules():
        own = module.__dict__
        controller, state = own.get("forward"), own.get(STATE)
        if type(controller) is not Controller or state is None:
            continue
        if "_hf_hook" in own or own.get(BODY_FORWARD):
            continue
        body = state.original
        bind = None if body is type(module).forward else weakref.ref(module)
        found.append((own, controller, state, body, bind))
    return tuple(found)


def trace_running(module: Any) -> bool:
    """Whether an nnsight trace is interleaving ``module``'s forward now (0.8: its
    controller's state has an active route; 0.6 / 0.7: never asked)."""
    if not is_08():
        return False
    state = module.__dict__.get("__nnsight__")
    return state is not None and state.active()[0] is not None


# what a text batch's forward may be given beside its token rows, for the position ids
# below to be supplied (a batch with anything else is not a plain text batch)
_TEXT_BATCH_KEYS = frozenset(
    {"input_ids", "inputs_embeds", "attention_mask", "token_type_ids", "labels"}
)


def supply_position_ids(model: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The forward's keyword arguments for a text batch, with position ids where nnsight
    0.8 supplies them: 0.8 counts each left-padded row from its first real token (so
    left padding moves no token of an absolute-position or rotary model), and 0.6 and
    0.7 pass the batch as given, the model then counting the pads too. On those, the
    same position ids are added here, so a trace computes the same places on every
    nnsight. Only where 0.8 adds them: a tokenizer padding on the left, no position ids
    given, a mask as wide as the tokens with padding in it, nothing in the batch but
    token rows, and a row padded on the left (rows padded otherwise count from 0, as the
    model does). Unchanged on 0.8 and under ``scan`` (fake tensors have no values)."""
    if is_08() or kwargs.get("position_ids") is not None:
        return kwargs
    mask = kwargs.get("attention_mask")
    ids = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    tokenizer = getattr(model, "tokenizer", None)
    if (
        mask is None
        or ids is None
        or getattr(tokenizer, "padding_side", None) != "left"
        or any(v is not None for k, v in kwargs.items() if k not in _TEXT_BATCH_KEYS)
        or tuple(mask.shape) != tuple(ids.shape[:2])
        or mask.device.type == "meta"
    ):
        return kwargs
    from torch._guards import detect_fake_mode

    if detect_fake_mode() is not None or bool(mask.all()):
        return kwargs
    import torch

    from .positions import position_ids_of

    mask = mask.long()
    counted = position_ids_of(mask)
    plain = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    left_padded = (mask.diff(dim=-1) >= 0).all(-1, keepdim=True)
    positions = torch.where(left_padded, counted, plain)
    if bool((positions == plain).all()):
        return kwargs
    return {**kwargs, "position_ids": positions}


def with_position_ids(model: Any, inputs: Any) -> Any:
    """``inputs`` for a trace of another model than ``model`` (the plain one a plan is
    sent through to a server, whose nnsight makes the batch): on 0.6/0.7, where
    ``supply_position_ids`` adds position ids to the batch ``model`` makes of
    ``inputs``, that batch with them (made here, as the other trace would make it);
    else ``inputs`` as given."""
    if is_08():
        return inputs
    try:
        args, kwargs, _ = model._prepare_input(inputs)
    except Exception:
        return inputs  # not a batch nnsight tokenizes here: the trace says why
    supplied = supply_position_ids(model, dict(kwargs))
    if args or "position_ids" not in supplied or "position_ids" in kwargs:
        return inputs
    return {key: value for key, value in supplied.items() if value is not None}


def prepared_call(model: Any, inputs: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """What ``model.trace(inputs)`` calls for one input, outside a trace: the callable
    and the arguments nnsight's batching makes of ``inputs`` (tokenizing, padding,
    position ids). 0.8 has a batcher per trace and calls ``model._call``; 0.6 and 0.7
    prepare the input on the envoy (``_prepare_input``) and call the module itself,
    given the position ids 0.8 would add (``supply_position_ids``)."""
    if is_08():
        batcher = model._batcher_class(model, {})
        batcher.add(inputs)  # as model.trace(inputs) adds its one input
        args, kwargs = batcher.assemble(model._call)
        return model._call, tuple(args), dict(kwargs)
    args, kwargs, _ = model._prepare_input(inputs)
    return model._module, tuple(args), supply_position_ids(model, dict(kwargs))


__all__ = [
    "NDIF_CLIENTS",
    "OVERLOAD_PREFIX",
    "alias_target",
    "aliases_of",
    "auto_class_kwargs",
    "backward_opener",
    "backward_running",
    "body_step",
    "call_of_result_name",
    "callee_after_inputs",
    "child_attribute",
    "clear_pending_operations",
    "container_path",
    "controllers",
    "first_input_setter_keeps_keywords",
    "forward_key",
    "install",
    "invoke_rows",
    "invokes_narrowed_off_the_graph",
    "is_08",
    "keep_operations_wrapped",
    "loading_class",
    "location",
    "model_id_cache",
    "ndif_client",
    "nnsight_version",
    "out_of_order_error",
    "parsed_source",
    "prepared_call",
    "remote_backend",
    "remote_env",
    "remote_env_known",
    "running_body",
    "several_invokes",
    "shared_path",
    "source_identity",
    "supply_position_ids",
    "trace_running",
    "with_position_ids",
]
