"""``StandardizedTransformer``: nnterp's model with the Address table on top."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from causalab_mini import compat

compat.install()  # before nnterp is imported: its nnsight 0.8 bridges (none on 0.6/0.7)

import nnterp  # noqa: E402
from nnterp.rename_utils import AttnProbFunction  # noqa: E402
from nnterp.rename_utils import RenameConfig as NnterpRenameConfig  # noqa: E402

from causalab_mini.address import Address, FamilyMatch, RenameConfig  # noqa: E402

from . import remote as _remote  # noqa: E402
from .family import Resolution, families_for, resolve, resolve_traced  # noqa: E402
from .internals import Internals, Place, RenameError, has_attr  # noqa: E402
from .load_plan import LoadPlan, Seen, plan_load  # noqa: E402
from .load_plan import check_arguments as check_load_arguments  # noqa: E402
from .loading import LoadRefused, LoadReport  # noqa: E402
from .loading import check as check_load  # noqa: E402
from .loading import recorded as recorded_loads  # noqa: E402
from .ops import find_op  # noqa: E402
from .quiet import quiet  # noqa: E402
from .spec import prepare_model_spec  # noqa: E402


def _text_config(config: Any, name: str | None = None) -> Any:
    """The config of the text stack: the sub-config a family names
    (``text_config_name``), else transformers' text config where the config nests one
    under text_config, else the config itself."""
    named = getattr(config, name, None) if name else None
    if named is not None:
        return named
    text = getattr(config, "text_config", None)
    if text is not None and hasattr(config, "get_text_config"):
        return config.get_text_config()
    decoder = getattr(config, "decoder", None)
    if getattr(config, "is_encoder_decoder", False) and hasattr(decoder, "model_type"):
        return decoder
    return config


def _class_names_before_load(
    model: Any, kwargs: dict[str, Any]
) -> tuple[tuple[str, ...], str | None, Any, tuple[str, ...]]:
    """Class names, model type, text config and the config's ``architectures`` of
    what is about to be loaded."""
    if not isinstance(model, str):
        names = tuple(c.__name__ for c in type(model).__mro__)
        config = getattr(model, "config", None)
        return names, getattr(config, "model_type", None), _text_config(config), names
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(
        model,
        trust_remote_code=kwargs.get("trust_remote_code", False),
        local_files_only=kwargs.get("local_files_only", False),
    )
    architectures = tuple(config.architectures or ())
    names = architectures
    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if isinstance(mapped, str):
        names = (*names, mapped)
    return names, config.model_type, _text_config(config), architectures


class _RowAttnProbs(AttnProbFunction):  # type: ignore[misc]
    """nnterp's attention-probability hook, answered by our row (so nnterp's own
    load-time check runs on the same place ``model.attention_probabilities`` reads)."""

    def __init__(self, row: Address, model_class: str) -> None:
        self.row = row
        self.model_class = model_class

    def get_attention_prob_source(
        self, attention_module: Any, return_module_source: bool = False
    ) -> Any:
        # nnterp hands us layers[i].self_attn; the row's module is relative to the layer
        envoy = attention_module
        parts = self.row.module.split(".")
        if parts[0] != "self_attn":
            raise ValueError(
                f"attention_probabilities reads {self.row.module!r}, outside self_attn; "
                "nnterp's load-time check cannot reach it"
            )
        for part in parts[1:]:
            envoy = getattr(envoy, part)
        source = envoy.source
        op = None
        for i, needle in enumerate(self.row.source):
            if op is not None:
                source = op.source
            if return_module_source and i == len(self.row.source) - 1:
                return source
            op = find_op(
                source,
                needle,
                row="attention_probabilities",
                module=str(getattr(envoy, "path", self.row.module)),
                model_class=self.model_class,
            )
        return op


@dataclass
class LoadState:
    """What the model keeps of its own construction, in one slot (``model._causalab``,
    set before nnsight's constructor runs, so that a read of it never reaches
    nnsight's attribute forwarding to the module): the quiet setting, the checkpoint's
    architectures, the outer family of a traced submodule, why the weights must not be
    loaded here (remote), the sub-config the stack's widths are in, and whether
    ``internals`` is attached yet (nnterp's load-time checks run before)."""

    verbose: bool = False
    architectures: tuple[str, ...] = ()
    traced_from: Resolution | None = None
    no_dispatch: str | None = None
    text_config_name: str | None = None
    attached: bool = False
    load_reports: list[LoadReport] = field(default_factory=list)


class StandardizedTransformer(nnterp.StandardizedTransformer):  # type: ignore[misc]
    """nnterp's ``StandardizedTransformer`` with ``model.internals``: every Address row
    of the registry, resolved for this model's family and block structure.

    ``model`` may be ``tiny:<model_type>`` (a tiny random checkpoint built locally), a
    hub id, a local directory or a loaded module. ``rename_config`` is
    causalab-mini's ``RenameConfig``: container names plus ``addresses`` of your own,
    applied after the families'. Loading prints nothing but warnings; ``verbose=True``
    shows nnterp's INFO lines and transformers' progress bars.
    """

    _causalab: LoadState  # set first thing in __init__ (a plain attribute from then on)

    def __init__(
        self,
        model: Any,
        *,
        rename_config: RenameConfig | None = None,
        enable_attention_probs: bool = False,
        verbose: bool = False,
        **kwargs: Any,
    ) -> None:
        self.__dict__["_causalab"] = LoadState(verbose=verbose)  # before nnsight's own
        with quiet(verbose):
            self._causalab_init(model, rename_config, enable_attention_probs, kwargs)

    def _load(self, *args: Any, **kwargs: Any) -> Any:
        """nnsight's load of the real weights, refused (``LoadRefused``) unless every
        tensor of the checkpoint went into the model and every parameter of the model
        came from the checkpoint (transformers' own loading report; tied weights and
        the keys the class declares ignorable aside). The reports are kept in
        ``load_reports``; a model on the meta device (remote=True) has none."""
        with recorded_loads() as reports:
            module = super()._load(*args, **kwargs)
        names = tuple(c.__name__ for c in type(module).__mro__)
        config = getattr(module, "config", None)
        model_type = getattr(config, "model_type", None)
        families = tuple(families_for(names, model_type, _text_config(config)))
        check_load(reports, families, list(self._causalab.architectures))
        self._causalab.load_reports = reports
        return module

    def dispatch(self) -> None:
        """nnsight's dispatch (the real weights loaded at the first trace of a model
        built on the meta device), as quiet as the load was. Never while a remote model
        is being built: remote=True keeps the weights off this machine."""
        why = self._causalab.no_dispatch
        if why:
            raise RuntimeError(why)
        with quiet(self._causalab.verbose):
            super().dispatch()
        if self._causalab.attached:  # the loaded modules replace the meta ones: hook them
            self.internals.layers_swapped()
            # nnsight sets the tokenizer's side again as it dispatches (left for a
            # causal LM): the family's exact side again, as at the load
            self._pad_exactly()

    def _causalab_init(
        self,
        model: Any,
        rename_config: RenameConfig | None,
        enable_attention_probs: bool,
        kwargs: dict[str, Any],
    ) -> None:
        """Construction in four steps: what is loaded (the spec prepared, its config
        read, the registry's answer for it before the load: ``resolve``), what is
        decided of the load (``plan_load``, a pure function of those), nnterp's own
        construction as planned (``_construct``), and the rows resolved on the loaded
        model (``_settle``)."""
        if isinstance(model, str):
            model, extra = prepare_model_spec(model, kwargs)
            kwargs = {**kwargs, **extra}
        check_load_arguments(kwargs, enable_attention_probs)  # before the config is read
        class_names, model_type, config, architectures = _class_names_before_load(model, kwargs)
        self._causalab.architectures = tuple(architectures or ())
        before = resolve(class_names, model_type, config, rename_config)
        if before.loading.traced_module:  # the family traces a submodule of the model
            self._causalab.traced_from = before
            model, class_names, config, before = _traced_before_load(
                model, before, class_names, rename_config, kwargs
            )
        seen = Seen(class_names, model_type, config, architectures)
        plan = plan_load(model, kwargs, before, seen, enable_attention_probs=enable_attention_probs)
        self._construct(model, plan)
        self._settle(plan, rename_config, enable_attention_probs)

    def _construct(self, model: Any, plan: LoadPlan) -> None:
        """nnterp's construction as the plan says, quiet, and never loading a remote
        model's weights."""
        nnterp_config = NnterpRenameConfig(**plan.containers)
        if plan.probabilities is not None:
            nnterp_config.attn_prob_source = _RowAttnProbs(plan.probabilities, plan.model_class)
        # (torch's fake-tensor log during nnterp's scan() is silenced by quiet(), even
        # when verbose: the fallback to a trace is nnterp's to make, the log is noise)
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)
        # nothing during construction may load the weights of a remote model
        self._causalab.no_dispatch = plan.no_dispatch
        try:
            super().__init__(
                model,
                rename_config=nnterp_config,
                enable_attention_probs=plan.nnterp_probs,
                rename=dict(plan.rename) or None,
                **plan.kwargs,
            )
        finally:
            fake_log.setLevel(level)
            self._causalab.no_dispatch = None

    def _settle(
        self,
        plan: LoadPlan,
        rename_config: RenameConfig | None,
        enable_attention_probs: bool,
    ) -> None:
        """The model's own attributes, and its rows resolved again on the loaded class
        (``model.resolution``), attached as ``model.internals``."""
        self.deferred_checks: dict[str, str] = dict(plan.deferred)
        self._attention_probs_enabled = bool(enable_attention_probs)
        # transformers' output_hidden_states lists the blocks' outputs, not their inputs
        self.hidden_states_are_block_outputs = plan.hidden_states_are_block_outputs
        # ... and where they (and output_attentions) count every call of the layer
        # class, the layers' own calls last
        self.oracles_from_last_calls = plan.oracles_from_last_calls
        # ... and where the wrapper drops or nests its language model's own output
        self.oracle_module: str | None = plan.oracle_module
        self.model_type: str | None = getattr(self._model.config, "model_type", None)
        self._causalab.text_config_name = plan.text_config_name
        if plan.text_config_name:
            self._widths_from_text_config()
        names = tuple(c.__name__ for c in type(self._model).__mro__)
        outer = self._causalab.traced_from
        self.resolution = (
            resolve_traced(outer, names, self.model_type, self.text_config, rename_config)
            if outer is not None
            else resolve(names, self.model_type, self.text_config, rename_config)
        )
        # the submodule of the checkpoint's model traced as this model (its family's)
        self.traced_module: str | None = plan.traced_module
        self.families: tuple[str, ...] = self.resolution.families
        self.block_structure: str | None = self.resolution.structure
        self.internals = Internals(self, dict(self.resolution.rows))
        self._causalab.attached = True
        self._attach(self.internals)
        self._pad_exactly()
        if plan.install_sources:
            self.internals.install_sources()

    def _pad_exactly(self) -> None:
        """Pad on a side where a row of a batch is computed as it would be alone on this
        family (``causalab_mini.padding``): nnsight pads a causal LM on the left, and a
        family whose forward ignores position_ids there (its file's
        left_padding_unavailable) is padded on the right instead."""
        tokenizer: Any = getattr(self, "tokenizer", None)
        side = getattr(tokenizer, "padding_side", None)
        if tokenizer is not None and side in ("left", "right"):
            from .padding import exact_side

            tokenizer.padding_side = exact_side(self, side)

    def _widths_from_text_config(self) -> None:
        """nnterp reads the widths off the top-level config; where a family names the
        sub-config its stack's are in (``text_config_name``), the ones nnterp did not
        find are read from there."""
        text = self.text_config
        for attribute, key in (
            ("hidden_size", "hidden_size"),
            ("num_heads", "num_attention_heads"),
            ("vocab_size", "vocab_size"),
        ):
            value = getattr(text, key, None)
            if getattr(self, attribute, None) is None and isinstance(value, int):
                setattr(self, attribute, value)

    def _attach(self, internals: Internals) -> None:
        for name in internals:
            row = internals[name].row
            if row.spelled is not None:
                continue
            if not row.replaces_accessor and _has(self, name):
                raise RenameError(
                    f"a row is named {name!r}, which this model already uses for "
                    f"{type(_get(self, name)).__name__}; rename the row (e.g. "
                    f"RenameConfig(addresses={{'my_{name}': ...}}))"
                )
            object.__setattr__(self, name, internals[name])

    # ------------------------------------------------------------ assignment

    def __setattr__(self, name: str, value: Any) -> None:
        """An assignment to a place name writes the place (its write contract); one to a
        spelling of a place, a component name or, inside a trace body, a name the model
        does not have raises with what to write (``assignment_guidance``)."""
        import torch

        state = self.__dict__.get("_causalab")
        internals = self.__dict__.get("internals") if state is not None and state.attached else None
        if (
            internals is None
            or name.startswith("_")
            or isinstance(value, torch.nn.Module)
            or name in internals.spellings.values()  # a property whose setter writes the place
        ):
            super().__setattr__(name, value)  # construction, private state, a module
            return
        in_trace = _in_trace_body()
        known = name in self.__dict__ or has_attr(self, name)
        guidance = assignment_guidance(internals, name, in_trace=in_trace, known=known)
        if guidance is not None:
            raise AttributeError(guidance)
        if name in internals and name not in internals.spellings:
            internals[name].set(None, value)  # a whole-model place, in a trace body
            return
        super().__setattr__(name, value)

    # ------------------------------------------------------------ remote

    def trace(self, *inputs: Any, **kwargs: Any) -> Any:
        remote, backend = kwargs.get("remote"), kwargs.get("backend")
        if _remote.wants_backend(remote, backend):
            # nnsight's RemoteBackend (at the host a string names), whose failures say
            # what the server lacks
            kwargs["backend"] = _remote.backend(
                self,
                kwargs.get("blocking", True),
                host=_remote.remote_host(remote, backend),
                job_id=kwargs.get("job_id"),
                verbose=kwargs.get("verbose", False),
            )
        return super().trace(*inputs, **kwargs)

    def interleave(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """nnsight 0.6/0.7 run a trace's forward here with the batch as given: a left-padded
        text batch is given the position ids nnsight 0.8 adds (``compat.
        supply_position_ids``), so its places are the same on every nnsight."""
        # the forward: this model's __call__, or its name (a request a server runs)
        if not compat.is_08() and (fn == "__call__" or fn == self.__call__):
            kwargs = compat.supply_position_ids(self, kwargs)
        return super().interleave(fn, *args, **kwargs)

    def to_model_key(self, host: str | None = None) -> str:
        """The model key a remote request names (nnsight's), after checking that the
        server (at ``host``, default nnsight's configured one) has what a trace of
        this model's places needs (where it says). Refused where the family traces a
        submodule (``traced_module``): a server would run the whole class."""
        traced = self.traced_module if self._causalab.attached else None
        if traced:
            from .traced import refuse_remote

            whole = ", ".join(self._causalab.architectures) or "its checkpoint's class"
            refuse_remote(whole, traced)
        _remote.ensure_model_key(self)
        _remote.preflight_packages(self, host)
        key: str = super().to_model_key()
        return key

    def __getstate__(self) -> dict[str, Any]:
        # what the server's model must run with travels with the pickled model
        state: dict[str, Any] = super().__getstate__()
        state[_remote.EXPECTED] = _remote.expected(self, with_versions=True)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        wanted = state.pop(_remote.EXPECTED, None)
        super().__setstate__(state)
        if wanted is not None:
            _remote.check_arrival(self, wanted)

    def lens(self, hidden: Any) -> Any:
        """The logits the model makes from ``hidden`` taken as its last block's output
        (``layers_output[last]``): exactly what it applies after the last block (final
        norm, head, soft-capping, logit scales: the family's ``lens`` rows), inside a
        trace or outside one. ``LensRefused`` (with the family's reason) where the head
        reads more than the stream."""
        from .logit_lens import apply

        return apply(self, hidden)

    # ------------------------------------------------------------ properties

    @property
    def text_config(self) -> Any:
        return _text_config(self._model.config, self._causalab.text_config_name)

    @property
    def load_reports(self) -> list[LoadReport]:
        """transformers' loading report of each load of the real weights (none while
        the model is on the meta device)."""
        return self._causalab.load_reports

    @property
    def attention_probs_enabled(self) -> bool:
        return self._attention_probs_enabled

    @property
    def logits(self) -> Any:
        """The logits of the model's own output (the ``logits`` row)."""
        if not self._causalab.attached:  # nnterp's load-time checks
            return super().logits
        return self.internals["logits"]()

    @logits.setter
    def logits(self, value: Any) -> None:
        """Refused like every write at the ``logits`` row (the model's own output)."""
        self.internals["logits"].set(None, value)

    @property
    def token_embeddings(self) -> Any:
        """The token embeddings (the ``embeddings_output`` row)."""
        if not self._causalab.attached:  # nnterp's load-time checks
            return super().token_embeddings
        return self.internals["embeddings_output"]()

    @token_embeddings.setter
    def token_embeddings(self, value: Any) -> None:
        if not self._causalab.attached:
            self.embed_tokens.output = value
            return
        self.internals["embeddings_output"].set(None, value)


def assignment_guidance(
    internals: Internals, name: str, *, in_trace: bool, known: bool
) -> str | None:
    """Why ``model.<name> = v`` is refused, with what to write instead (None where the
    assignment goes ahead: a whole-model place written in a trace body, or an ordinary
    attribute): a place spelled otherwise on the model, a place per layer, a place
    outside a trace, a component (not an attribute), or inside a trace body a name that
    is neither a place, a spelling nor an attribute (``known``: the model has it)."""
    spellings = internals.spellings
    spelled = {row: spelling for row, spelling in spellings.items() if row != spelling}
    if name in spelled:
        return (
            f"the place {name!r} is spelled model.{spelled[name]} on the model: write "
            f"model.{spelled[name]} = v inside a trace"
        )
    if name in internals and name not in spellings:
        if internals[name].per_layer:
            return (
                f"{name} is a place per layer: write model.{name}[layer] = v inside a "
                "trace (model.internals[name] is the place itself and is not replaced)"
            )
        if not in_trace:
            return f"{name} is a place of the model: write model.{name} = v inside a trace"
        return None
    from causalab_mini.generated import COMPONENTS

    spec = COMPONENTS.get(name)
    if spec is not None:
        target = spec.target if spec.kind == "boundary" else None
        per_layer = "[layer]" if spec.per_layer else ""
        via = f"model.{target}{per_layer} = v, or " if target in internals else ""
        return (
            f"{name!r} is a component, not an attribute of the model: write {via}"
            f"write(model, locate(model, {name!r}{', layer' if spec.per_layer else ''}), v) "
            "(from causalab_mini.components import locate, write) inside a trace"
        )
    if in_trace and not known:
        import difflib

        close = difflib.get_close_matches(name, [*internals, *spellings.values()], n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        return (
            f"model.{name} = ... inside a trace would set a new attribute on the model, "
            f"which the forward never reads: {name!r} is neither a place, a spelling of "
            f"one nor an attribute of the model.{hint}"
        )
    return None


def _traced_before_load(
    model: Any,
    outer: Resolution,
    class_names: tuple[str, ...],
    user: RenameConfig | None,
    kwargs: dict[str, Any],
) -> tuple[Any, tuple[str, ...], Any, Resolution]:
    """Where the families of what is loaded trace a submodule (``traced_module``, its
    config ``traced_config``): the model as nnsight is given it (a loaded module: its
    submodule), the submodule's class names and text config before the load, and the
    registry's answer for it (``resolve_traced``). ``remote=True`` is refused (a server
    would run the whole class)."""
    from .traced import refuse_remote, sub_config, submodule

    path = str(outer.loading.traced_module)
    model_class = class_names[0] if class_names else "this model"
    if kwargs.get("remote"):
        refuse_remote(model_class, path)
    if isinstance(model, str):
        from transformers import AutoConfig

        from .classes import mapped_classes

        whole = AutoConfig.from_pretrained(
            model,
            trust_remote_code=kwargs.get("trust_remote_code", False),
            local_files_only=kwargs.get("local_files_only", False),
        )
        config = sub_config(whole, str(outer.loading.traced_config), path)
        names = mapped_classes(config.model_type)
    else:
        model = submodule(model, path)
        config = model.config
        names = tuple(c.__name__ for c in type(model).__mro__)
    text = _text_config(config)
    model_type = getattr(config, "model_type", None)
    return model, names, text, resolve_traced(outer, names, model_type, text, user)


def _in_trace_body() -> bool:
    """Whether a trace body is running now (nnsight's worker)."""
    from .edits import edit_runner

    return edit_runner() is not None


def _has(obj: Any, name: str) -> bool:
    try:
        _get(obj, name)
    except AttributeError:
        return False
    return True


def _get(obj: Any, name: str) -> Any:
    return getattr(obj, name)


__all__ = ["FamilyMatch", "LoadRefused", "LoadReport", "Place", "StandardizedTransformer"]
