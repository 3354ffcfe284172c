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

from causalab_mini.address import Address, FamilyMatch, IOType, RenameConfig  # noqa: E402
from causalab_mini.address import names as container_paths  # noqa: E402

from . import remote as _remote  # noqa: E402
from .classes import auto_class_maps, group_auto_class  # noqa: E402
from .family import Resolution, families_for, resolve, resolve_traced  # noqa: E402
from .internals import Internals, Place, RenameError, has_attr  # noqa: E402
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


def _versions_hold(row: Address) -> bool:
    from .internals import outside_versions

    return outside_versions(row.versions) is None


def _refused_by_config(row: Address, config: Any) -> bool:
    """Whether the row is refused on every layer of a model with this config before it
    is loaded: an ``always`` reason, or a config reason that holds."""
    for item in row.unavailable:
        kind = item.when.kind
        if kind == "always" or (kind == "config" and item.when.holds_for_config(config)):
            return True
    return False


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
        """Construction in four steps: what is loaded and how (``_load_arguments``),
        what the registry makes of it before the load (``resolve``, from its config),
        what nnterp is told (``_nnterp_arguments``), nnterp's own construction
        (``_construct``), and the rows resolved on the loaded model (``_settle``)."""
        model = self._load_arguments(model, enable_attention_probs, kwargs)
        # remote=True keeps the checkpoint off this machine whatever else is asked: a
        # load-time check that needs a forward is deferred to the server, with why
        deferred = _remote.defer_checks(kwargs, enable_attention_probs)
        class_names, model_type, config, architectures = _class_names_before_load(model, kwargs)
        self._causalab.architectures = tuple(architectures or ())
        before = resolve(class_names, model_type, config, rename_config)
        if before.rename.traced_module:  # the family traces a submodule of the model
            self._causalab.traced_from = before
            model, class_names, config, before = _traced_before_load(
                model, before, class_names, rename_config, kwargs
            )
        nnterp_config, nnterp_probs = self._nnterp_arguments(
            model,
            before,
            (class_names, model_type, config, architectures),
            enable_attention_probs,
            kwargs,
        )
        self._construct(model, nnterp_config, nnterp_probs, _renames(before.rename, kwargs), kwargs)
        self._settle(before.rename, rename_config, deferred, enable_attention_probs, kwargs)

    @staticmethod
    def _load_arguments(model: Any, enable_attention_probs: bool, kwargs: dict[str, Any]) -> Any:
        """``model`` as ``from_pretrained`` takes it (a spec built or checked), with the
        keyword arguments it adds, and the attention implementation the probabilities
        imply."""
        if isinstance(model, str):
            model, extra = prepare_model_spec(model, kwargs)
            kwargs.update(extra)
        if enable_attention_probs and "attn_implementation" in kwargs:
            # nnterp 1.3.0 checks this value and then passes it to nnsight a second
            # time beside its own "eager" (a TypeError); the probabilities imply eager
            implementation = kwargs.pop("attn_implementation")
            if implementation != "eager":
                raise ValueError(
                    f"enable_attention_probs=True needs eager attention, and "
                    f"attn_implementation={implementation!r} was given: drop "
                    "attn_implementation (the probabilities imply 'eager') or pass "
                    "enable_attention_probs=False"
                )
        kwargs.setdefault("device_map", "cpu")
        return model

    @staticmethod
    def _nnterp_arguments(
        model: Any,
        before: Resolution,
        seen: tuple[tuple[str, ...], str | None, Any, tuple[str, ...]],
        enable_attention_probs: bool,
        kwargs: dict[str, Any],
    ) -> tuple[Any, bool]:
        """nnterp's RenameConfig and whether nnterp checks the probabilities, from the
        families' containers and our probabilities row (``seen``: the class names, model
        type, config and architectures of what is loaded); the loading keyword arguments
        they imply (auto class, eager attention, skipped checks) go into ``kwargs``."""
        class_names, model_type, config, architectures = seen
        merged = before.rename
        nnterp_config = NnterpRenameConfig(
            **{k: _mounted(getattr(merged, k)) for k in _NNTERP_CONTAINERS},
        )
        probs = _vouched_probabilities(before.rows.get("attention_probabilities"), config)
        if probs is None and enable_attention_probs:
            kwargs["attn_implementation"] = "eager"
        if probs is not None and probs.source:
            model_class = class_names[0] if class_names else "model"
            nnterp_config.attn_prob_source = _RowAttnProbs(probs, model_class)
        if merged.mixed_layers:
            kwargs.setdefault("allow_multimodal", True)
        _auto_class_arguments(model, merged, model_type, architectures, kwargs)
        _dispatch_arguments(merged, class_names, kwargs)
        # nnterp checks attention probabilities on layer 0; where attention is not on
        # every layer (ignore_attn) our own row serves them, under eager attention
        nnterp_probs = enable_attention_probs and probs is not None and not merged.ignore_attn
        if merged.ignore_ln_final or merged.skip_nnterp_checks:
            # nnterp 1.3.0's load-time checks require a final norm and cannot be told a
            # model has none, and read .output where nnsight mounts it elsewhere; the
            # family says so, and they are skipped (with its probability check). Every
            # place is still certified by our identities and transformers' oracles.
            kwargs["check_renaming"] = False
            nnterp_probs = False
        if enable_attention_probs and not nnterp_probs:
            kwargs["attn_implementation"] = "eager"
        return nnterp_config, bool(nnterp_probs)

    def _construct(
        self,
        model: Any,
        nnterp_config: Any,
        nnterp_probs: bool,
        rename: dict[str, str],
        kwargs: dict[str, Any],
    ) -> None:
        """nnterp's construction, quiet, and never loading a remote model's weights."""
        # (torch's fake-tensor log during nnterp's scan() is silenced by quiet(), even
        # when verbose: the fallback to a trace is nnterp's to make, the log is noise)
        fake_log = logging.getLogger("torch._subclasses.fake_tensor")
        level = fake_log.level
        fake_log.setLevel(logging.CRITICAL)
        # nothing during construction may load the weights of a remote model
        self._causalab.no_dispatch = _remote.NO_DISPATCH if kwargs.get("remote") else None
        try:
            super().__init__(
                model,
                rename_config=nnterp_config,
                enable_attention_probs=nnterp_probs,
                rename=rename or None,
                **kwargs,
            )
        finally:
            fake_log.setLevel(level)
            self._causalab.no_dispatch = None

    def _settle(
        self,
        merged: RenameConfig,
        rename_config: RenameConfig | None,
        deferred: dict[str, str],
        enable_attention_probs: bool,
        kwargs: dict[str, Any],
    ) -> None:
        """The model's own attributes, and its rows resolved again on the loaded class
        (``model.resolution``), attached as ``model.internals``."""
        self.deferred_checks: dict[str, str] = deferred
        self._attention_probs_enabled = bool(enable_attention_probs)
        # transformers' output_hidden_states lists the blocks' outputs, not their inputs
        self.hidden_states_are_block_outputs = bool(merged.hidden_states_are_block_outputs)
        # ... and where they (and output_attentions) count every call of the layer
        # class, the layers' own calls last
        self.oracles_from_last_calls = bool(merged.oracles_from_last_calls)
        # ... and where the wrapper drops or nests its language model's own output
        self.oracle_module: str | None = merged.oracle_module
        self.model_type: str | None = getattr(self._model.config, "model_type", None)
        self._causalab.text_config_name = merged.text_config_name
        if merged.text_config_name:
            self._widths_from_text_config()
        names = tuple(c.__name__ for c in type(self._model).__mro__)
        outer = self._causalab.traced_from
        self.resolution = (
            resolve_traced(outer, names, self.model_type, self.text_config, rename_config)
            if outer is not None
            else resolve(names, self.model_type, self.text_config, rename_config)
        )
        # the submodule of the checkpoint's model traced as this model (its family's)
        self.traced_module: str | None = merged.traced_module
        self.families: tuple[str, ...] = self.resolution.families
        self.block_structure: str | None = self.resolution.structure
        self.internals = Internals(self, dict(self.resolution.rows))
        self._causalab.attached = True
        self._attach(self.internals)
        self._pad_exactly()
        if not kwargs.get("remote"):
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


# the RenameConfig fields nnterp's own RenameConfig takes
_NNTERP_CONTAINERS = (
    "model_name",
    "layers_name",
    "attn_name",
    "mlp_name",
    "ln_final_name",
    "lm_head_name",
    "attn_head_config_key",
    "hidden_size_config_key",
    "ignore_mlp",
    "ignore_attn",
)


def _vouched_probabilities(probs: Address | None, config: Any) -> Address | None:
    """Our attention-probabilities row where nnterp's load-time check may read it: it
    holds for the installed versions, is not refused on this model, and holds the
    probabilities as an operation's output of (batch, heads, queries, keys), which is
    what nnterp's check reads. None otherwise: nnterp is not asked to check a path we
    do not vouch for."""
    if probs is None or (
        not _versions_hold(probs)
        or _refused_by_config(probs, config)
        or probs.io is not IOType.OUTPUT
        or probs.merged_heads
        or probs.flat_tokens
    ):
        return None
    return probs


def _auto_class_arguments(
    model: Any,
    merged: RenameConfig,
    model_type: str | None,
    architectures: tuple[str, ...],
    kwargs: dict[str, Any],
) -> None:
    """The family's transformers class (its model_class, else its auto_class: a
    language model inside a multimodal wrapper), else its group's auto class, said the
    way the installed nnsight takes it; not for a checkpoint its config says the
    causal-LM class saved, nor where the caller chose. The family's key_mapping goes to
    from_pretrained with any class. Where the family traces a submodule
    (traced_module), the class loads the whole model and returns the submodule."""
    if merged.key_mapping and isinstance(model, str):
        kwargs.setdefault("key_mapping", dict(merged.key_mapping))
    auto_class = (
        merged.model_class or merged.auto_class or group_auto_class(model_type, architectures)
    )
    traced = merged.traced_module
    if traced and not auto_class:  # a submodule of a causal LM's checkpoint
        from .classes import DEFAULT_AUTO_CLASS

        auto_class = DEFAULT_AUTO_CLASS
    if not auto_class or not isinstance(model, str) or "automodel" in kwargs:
        return
    if not auto_class_maps(auto_class, architectures):
        return
    for key, value in compat.auto_class_kwargs(auto_class, traced).items():
        kwargs.setdefault(key, value)


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

    path = str(outer.rename.traced_module)
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
        config = sub_config(whole, str(outer.rename.traced_config), path)
        names = mapped_classes(config.model_type)
    else:
        model = submodule(model, path)
        config = model.config
        names = tuple(c.__name__ for c in type(model).__mro__)
    text = _text_config(config)
    model_type = getattr(config, "model_type", None)
    return model, names, text, resolve_traced(outer, names, model_type, text, user)


def _dispatch_arguments(
    merged: RenameConfig, class_names: tuple[str, ...], kwargs: dict[str, Any]
) -> None:
    """Where the family says its class cannot be built on the meta device (its
    construction reads a tensor's value), the weights are loaded at construction
    (nnsight's ``dispatch=True``) instead of at the first trace; ``remote=True``, which
    builds on meta and never loads them here, is refused with the family's reason."""
    why = merged.meta_build_unavailable
    if not why:
        return
    model_class = class_names[0] if class_names else "this model"
    if kwargs.get("remote"):
        raise ValueError(
            f"{model_class} cannot be built on the meta device, which remote=True needs "
            f"(the weights stay on the server): {why}"
        )
    kwargs.setdefault("dispatch", True)


def _renames(merged: RenameConfig, kwargs: dict[str, Any]) -> dict[str, str]:
    """nnterp's ``rename`` table: the caller's, the family's embedding path bound to
    ``embed_tokens``, and the keys of nnterp's own table the family leaves unbound (each
    bound to its own name: no alias, nnterp's table updated with this one)."""
    rename = dict(kwargs.pop("rename", None) or {})
    for embed in container_paths(merged.embed_name):
        rename.setdefault(compat.container_path(embed), "embed_tokens")
    for key in merged.unbound_defaults or ():
        rename.setdefault(key, key)
    return rename


def _mounted(value: Any) -> Any:
    """Container names as the installed nnsight mounts their modules (a module named
    after an nnsight attribute, such as a root child ``output``, differs on 0.8)."""
    if isinstance(value, str):
        return compat.container_path(value)
    if isinstance(value, (tuple, list)):
        return [compat.container_path(v) if isinstance(v, str) else v for v in value]
    return value


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
