"""The data types of the Address table: pure data, no torch.

Generated modules (``causalab_mini.generated``) build their tables from these types, so
this module must stay importable without torch, nnsight or transformers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Literal

from .plain import replace_part

Scalar = str | int | float | bool | None


class IOType(Enum):
    """Which side of a module a place is on (or the module itself)."""

    INPUT = "input"
    OUTPUT = "output"
    MODULE = "module"


@dataclass(frozen=True)
class FirstIfTuple:
    """The tensor is the value itself, or its first element when the value is a tuple
    (or a list: GPT-1's blocks and attention return lists)."""

    def get(self, value: Any) -> Any:
        return value[0] if isinstance(value, (tuple, list)) else value

    def put(self, value: Any, new: Any) -> Any:
        """Hand back ``value`` with its tensor replaced by ``new``."""
        return replace_part(value, 0, new) if isinstance(value, (tuple, list)) else new

    def __repr__(self) -> str:
        return "FirstIfTuple()"


@dataclass(frozen=True)
class Index:
    """The tensor is ``value[key]``: a position in a sequence or a field of a mapping."""

    key: int | str

    def get(self, value: Any) -> Any:
        return value[self.key]

    def put(self, value: Any, new: Any) -> Any:
        return replace_part(value, self.key, new)


Select = FirstIfTuple | Index


ConditionKind = Literal[
    "always", "attention_probs_disabled", "structure_unknown", "layer_kind", "config"
]


@dataclass(frozen=True)
class Condition:
    """When a reason for unavailability applies.

    ``always``; ``attention_probs_disabled`` (the model was loaded without
    ``enable_attention_probs``); ``structure_unknown`` (no block-structure rule
    matches the model); ``layer_kind`` (the layer's module tree is of that
    kind, see ``LAYER_KINDS``); ``config`` (every ``config`` item equals the model's
    config attribute and no ``config_not`` item does).
    """

    kind: ConditionKind
    layer_kind: str | None = None
    config: tuple[tuple[str, Scalar], ...] = ()
    config_not: tuple[tuple[str, Scalar], ...] = ()

    def holds_for_config(self, config: Any) -> bool:
        """Whether a ``config`` condition holds for this model config."""
        missing = object()
        for key, expected in self.config:
            if getattr(config, key, missing) != expected:
                return False
        return all(getattr(config, key, missing) != value for key, value in self.config_not)


@dataclass(frozen=True)
class Unavailable:
    """A reason a place does not exist, and when it applies.

    ``{place}`` in the reason stands for the row's name.
    """

    when: Condition
    reason: str

    def message(self, place: str) -> str:
        return self.reason.replace("{place}", place)


WriteMode = Literal["replace", "in_place"]

# How a place that carries several residual streams holds them: b batch, s sequence,
# n stream, h hidden; f the n streams' hidden vectors concatenated on the last axis.
StreamLayout = Literal["bsnh", "bsf", "nbsh"]


@dataclass(frozen=True)
class Streams:
    """A place that carries ``n`` residual streams side by side (hyper-connections,
    AltUp), not one: how the model holds them (``layout``) and the config attribute
    that says how many there are (``count``).

    Components hand such a place on flat, like heads: (batch, seq, n x hidden), stream
    i the slice i*hidden .. (i+1)*hidden of the last axis; ``canonical`` gives the
    (batch, seq, n, hidden) view the identities are stated on."""

    layout: StreamLayout
    count: str

    def canonical(self, value: Any, n: int) -> Any:
        """``value`` as held -> (batch, seq, n, hidden)."""
        if self.layout == "bsnh":
            return value
        if self.layout == "nbsh":
            return value.permute(1, 2, 0, 3)
        return value.unflatten(-1, (n, value.shape[-1] // n))

    def flat(self, value: Any) -> Any:
        """``value`` as held -> (batch, seq, n x hidden), as components hand it on."""
        if self.layout == "bsnh":
            return value.flatten(2)
        if self.layout == "nbsh":
            return value.permute(1, 2, 0, 3).flatten(2)
        return value

    def held(self, flat: Any, like: Any) -> Any:
        """The inverse of ``flat``: back to how the model holds it, shaped like ``like``."""
        if self.layout == "bsnh":
            return flat.reshape(like.shape)
        if self.layout == "nbsh":
            n, b, s, h = like.shape
            return flat.reshape(b, s, n, h).permute(2, 0, 1, 3)
        return flat


@dataclass(frozen=True)
class LeadingPositions:
    """Positions a forward puts before the tokens on the sequence axes of a place (a
    prompt of its own, as CPM-Ant prepends prompt_length learned prompt tokens): their
    count is the config attribute ``config``, ``axes`` the value's sequence axes. A
    read leaves them out, so position i is token i as on every other model; a write
    replaces the tokens' positions and keeps the model's own leading ones."""

    config: str
    axes: tuple[int, ...] = (1,)

    def tokens(self, value: Any, count: int) -> Any:
        """``value`` without its first ``count`` positions on each sequence axis (a
        view: writing into it writes the tokens' positions of ``value``)."""
        for axis in self.axes:
            value = value.narrow(axis, count, value.shape[axis] - count)
        return value


@dataclass(frozen=True)
class TrailingStreams:
    """More streams of the tokens' length after the tokens' own on the sequence axes of
    a place (ProphetNet's predicting streams, one per n-gram, concatenated after the
    main stream): their number is the config attribute ``config``, ``axes`` the value's
    sequence axes. A read keeps the first stream, the tokens' own; a write replaces it
    and keeps the others."""

    config: str
    axes: tuple[int, ...] = (1,)

    def tokens(self, value: Any, count: int) -> Any:
        """The first of the ``1 + count`` equal blocks of each sequence axis (a view)."""
        for axis in self.axes:
            value = value.narrow(axis, 0, value.shape[axis] // (1 + count))
        return value


@dataclass(frozen=True)
class Address:
    """One place: a module path in standardized names and which side of it.

    ``module`` is relative to ``layers[i]`` for a per-layer row and to the model for a
    whole-model one (``""`` is the layer or the model itself); ``"{name}"`` is
    resolved from the module tree (``STRUCTURAL_ADDRESSES``). ``source`` holds
    call-shaped needles descended through nnsight's ``.source``; ``select`` is where
    the tensor is inside the value there. ``snapshot`` marks a tensor the forward
    modifies in place after the place, so a read takes a copy (and a write hands the
    model a copy of the value). ``read_only`` is the reason a write there is refused
    (token ids, the model's own output), None where a place takes writes. ``streams``
    marks a place that carries several residual streams side by side (``Streams``).
    ``flat_tokens`` marks a per-layer tensor the block holds with batch and sequence
    flattened into one axis (tokens, ...): a read views it as (batch, seq, ...) with
    the batch and sequence of the layer's input, and a write goes back through the
    same view. ``merged_heads`` marks a per-layer tensor held with batch and heads
    merged into one axis, (batch*heads, ...): a read views it as (batch, heads, ...)
    with the layer's attention head count, a write goes back through the same view.
    ``leading_positions`` names positions the forward puts before the tokens there,
    which reads leave out and writes keep; ``trailing_streams`` other streams after the
    tokens' own, likewise; ``layer_list`` (a per-layer row) names a ModuleList of the
    model, in standardized names, whose entry at the layer's index the module is
    relative to, instead of ``layers[i]`` (a model that keeps each sublayer in a list
    of its own: XLM); ``before_layers`` says that list is another stack, run wholly
    before the registry's layers (an encoder-decoder's encoder), so the row ranks
    before every layer; ``seq_first`` says the tensor there is (seq, batch, ...) (XLNet),
    read and written as (batch, seq, ...) through a transposed view. ``spelled`` is
    the model attribute a whole-model place is read and written as where that is not
    its name (``token_embeddings``); ``replaces_accessor`` says nnterp has an accessor
    of the row's name, which the row is mounted in place of. ``heads_through`` marks a
    computed place: the tensor of the row it names (the heads' outputs concatenated, at
    this row's module), sent head by head through the module's weight, bias left out
    (``causalab_mini.heads``); refused wherever that row is.
    """

    module: str
    io: IOType = IOType.OUTPUT
    source: tuple[str, ...] = ()
    select: Select | None = None
    order: int | float = 0
    per_layer: bool = True
    write: WriteMode = "replace"
    scale: str | float | None = None
    layer_list: str | None = None
    before_layers: bool = False
    seq_first: bool = False
    leading_positions: LeadingPositions | None = None
    trailing_streams: TrailingStreams | None = None
    snapshot: bool = False
    read_only: str | None = None
    flat_tokens: bool = False
    merged_heads: bool = False
    heads_through: str | None = None
    # a mixture of experts' router weights: how the family makes them from the logits,
    # where the sweep's default does not give it (("renormalize", False), ...)
    routing: tuple[tuple[str, Any], ...] = ()
    spelled: str | None = None
    replaces_accessor: bool = False
    unavailable: tuple[Unavailable, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()
    streams: Streams | None = None
    doc: str = field(default="", compare=False)

    @property
    def views_tokens(self) -> bool:
        """Whether the place is a view of the value there: sequence first, or with
        positions besides the tokens' own."""
        return (
            self.seq_first
            or self.leading_positions is not None
            or self.trailing_streams is not None
        )

    def token_positions(self, value: Any, count: Any) -> Any:
        """The place as a view of ``value``: batch first, with the tokens' own positions
        only (``count`` gives a config attribute's value as a count)."""
        if self.seq_first:
            value = value.transpose(0, 1)
        for view in (self.leading_positions, self.trailing_streams):
            if view is not None:
                value = view.tokens(value, count(view.config))
        return value

    @property
    def is_structural(self) -> bool:
        return "{name}" in self.module

    def describe(self) -> str:
        """``self_attn.q_proj.output``-style text for reprs and messages; the layer or
        the model itself is ``layer`` or ``model``, and a select shows as an index."""
        parts = [self.module or ("layer" if self.per_layer else "model")]
        parts.extend(self.source)
        if self.io is not IOType.MODULE:
            parts.append(self.io.value)
        text = ".".join(parts)
        if isinstance(self.select, Index):
            text += f"[{self.select.key!r}]"
        return text


@dataclass(frozen=True)
class LensStep:
    """One step of what a model applies to the last block's output to make its logits
    (the ``lens`` of places.yaml or a family file): ``apply`` the module of a
    whole-model row (``ln_final_output``, ``lm_head_output``), ``multiply`` or
    ``divide`` by a config attribute, ``softcap`` by one (``c * tanh(x / c)``), or
    keep the first ``vocab`` logits (nothing where the attribute is None)."""

    kind: str  # apply | multiply | divide | softcap | vocab
    arg: str  # the row name (apply) or the config attribute


@dataclass(frozen=True)
class Lens:
    """The steps from ``layers_output[last]`` to the logits, in order, or why the
    family's head reads more than that stream (``unavailable``)."""

    steps: tuple[LensStep, ...] = ()
    unavailable: str | None = None


@dataclass(frozen=True)
class FamilyMatch:
    """Which models a family file applies to: every given part must hold. ``versions``
    (package, PEP 440 range) holds where each installed package is inside its range:
    a family whose model changed its forward in a release (Falcon's attention before
    transformers 5.25) matches only the releases it describes."""

    model_types: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    config: tuple[tuple[str, Scalar], ...] = ()
    versions: tuple[tuple[str, str], ...] = ()

    def matches(self, class_names: tuple[str, ...], model_type: str | None, config: Any) -> bool:
        """``class_names`` is the model class and its bases' names (MRO order)."""
        if self.model_types and model_type not in self.model_types:
            return False
        if self.classes and not set(self.classes) & set(class_names):
            return False
        if self.versions:
            # packaging only where a family names releases: the generated tables
            # import this module and must import with nothing but the standard library
            from .versions import outside_versions

            if outside_versions(self.versions) is not None:
                return False
        missing = object()
        return all(getattr(config, key, missing) == value for key, value in self.config)


# A container's path, or several: one family may cover model types whose containers
# differ only in the base model's attribute (bert.encoder.layer, ernie.encoder.layer);
# the paths a model does not have are not renamed.
Names = str | tuple[str, ...]


def names(value: Names | None) -> tuple[str, ...]:
    """The paths ``value`` names, as a tuple (none for None)."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Containers:
    """Where a family keeps its modules and widths, as nnterp is told them.

    The container fields are nnterp's (``attn_name`` … ``layers_name``) with
    ``embed_name`` beside them; each may be a tuple of paths (the ones a model has are
    renamed). ``attn_head_config_key`` names the config attribute holding the layers'
    head count where nnterp's defaults miss it (an encoder-decoder's
    decoder_attention_heads); ``hidden_size_config_key`` the one holding the stream's
    width where they miss it (Kosmos-2's embed_dim); ``head_size_config_key`` the
    attribute under which the family's attention module and config state the head
    size where it is not head_dim (CPM-Ant's dim_head, Reformer's
    attention_head_size): the head geometry reads it before hidden / heads.
    ``ignore_mlp`` / ``ignore_attn`` say a layer has no MLP / attention container of
    its own; ``ignore_ln_final`` says the model has no final norm (the last block's
    output goes straight to the unembedding), which nnterp's load-time checks cannot
    accept; ``mixed_layers`` says the layers are not all of one class (hybrid
    attention / state-space stacks), which nnterp refuses unless told;
    ``unbound_defaults`` lists keys of nnterp's built-in rename table that stay
    unbound on the family (each is bound to its own name, which binds nothing): an
    alias it would make hides a child or another alias the family relies on, which
    nnsight 0.8 refuses at load and 0.6/0.7 resolved silently."""

    model_name: Names | None = None
    layers_name: Names | None = None
    embed_name: Names | None = None
    attn_name: Names | None = None
    mlp_name: Names | None = None
    ln_final_name: Names | None = None
    lm_head_name: Names | None = None
    attn_head_config_key: str | None = None
    hidden_size_config_key: str | None = None
    head_size_config_key: str | None = None
    ignore_mlp: bool | None = None
    ignore_attn: bool | None = None
    ignore_ln_final: bool | None = None
    mixed_layers: bool | None = None
    unbound_defaults: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Loading:
    """How a family's checkpoint is loaded and its model constructed.

    ``auto_class`` names the transformers auto class that loads the checkpoint where
    it is not ``AutoModelForCausalLM`` (``AutoModelForImageTextToText``: a language
    model inside a multimodal wrapper, which nnsight's LanguageModel refuses under its
    default class; ``tiny:`` builds with it too); ``model_class`` names the concrete
    transformers class that loads (and ``tiny:`` builds) the checkpoint where no auto
    class loads its config (the auto tables map the config class to a model type no
    model table lists); it stands in for ``auto_class``; ``key_mapping`` gives
    checkpoint key renamings (pattern, replacement) the loader hands to
    ``from_pretrained`` where the class that loads a checkpoint would leave weights
    missing (a checkpoint written by another class, a classifier around the language
    model); ``text_config_name`` names the config attribute holding the decoder
    stack's own config where the model's config nests it under another name than
    text_config (an encoder-decoder config with encoder and decoder sub-configs): the
    text config, its widths and head counts are read from it; ``traced_module`` names
    the submodule (a path) of the model the checkpoint loads as that is traced and
    addressed as the model (its forward, config, layers), where the class has no
    forward of its own that runs the text decoder (a speech-and-text model's
    "thinker"), and ``traced_config`` the attribute of the checkpoint's config that is
    the submodule's config: the checkpoint is loaded whole with its own class, the rows
    are those of the families the submodule matches (``runtime/traced.py``);
    ``meta_build_unavailable`` says why the model class cannot be built on the meta
    device (its construction reads a tensor's value): it is loaded with its weights at
    construction, and ``remote=True`` (which never loads them here) is refused with it;
    ``skip_nnterp_checks`` skips nnterp's load-time checks where they read a tensor
    nnterp cannot reach (a layer with a child module named ``output``, whose own output
    nnsight mounts at ``nns_output``); the identities and oracles still certify every
    row."""

    auto_class: str | None = None
    model_class: str | None = None
    key_mapping: tuple[tuple[str, str], ...] | None = None
    text_config_name: str | None = None
    traced_module: str | None = None
    traced_config: str | None = None
    meta_build_unavailable: str | None = None
    skip_nnterp_checks: bool | None = None


@dataclass(frozen=True)
class ForwardFacts:
    """Facts of a family's forward that the runtime acts on.

    ``left_padding_unavailable`` / ``right_padding_unavailable`` say why a row padded
    on that side is not computed as the row alone (the sweep's ragged-batch check
    measures it): the runtime pads on the other side, or refuses;
    ``decoder_start_config`` is, for an encoder-decoder whose config has no
    decoder_start_token_id, the config attribute (dotted) its own right shift starts
    the decoder from."""

    left_padding_unavailable: str | None = None
    right_padding_unavailable: str | None = None
    decoder_start_config: str | None = None


@dataclass(frozen=True)
class CheckFacts:
    """Facts of a family's forward that only the sweep's checks and oracles read.

    ``hidden_states_are_block_outputs`` says transformers' ``output_hidden_states``
    for the model has no entry for the embeddings: entry i is block i's output, the
    last the final norm's (Mamba, RWKV); ``oracles_from_last_calls`` says those outputs
    (and ``output_attentions``) hold an entry per call of the layer class, other calls
    first (a second stack of the same class, earlier cycles), so the oracles are the
    last entries, each a layer's output (none is a layer's input: something may run
    between two layers); ``oracle_module`` names the submodule (a path) whose own
    output holds the language model's hidden states and attentions, where the
    wrapper's output drops them (BLIP's text_decoder) or nests them (BLIP-2's
    language_model): the oracles read that module's output in the same forward;
    ``merged_cross_attention`` (a reason) says the decoder's attention is self- and
    cross-attention in one softmax, so its probabilities' oracle is transformers'
    decoder_attentions and cross_attentions side by side on the key axis (T5Gemma 2);
    ``attends_ahead`` (a reason) says tokens attend to later tokens (a write at one
    token reaches earlier ones); ``interchange_unavailable`` (a reason) says the
    forward reads more of the input than the stream carries (the interchange
    identities do not hold there)."""

    hidden_states_are_block_outputs: bool | None = None
    oracles_from_last_calls: bool | None = None
    oracle_module: str | None = None
    merged_cross_attention: str | None = None
    attends_ahead: str | None = None
    interchange_unavailable: str | None = None


# the parts of a family's facts, by the name each hangs under (``family.containers``,
# ``resolution.loading``, ``RenameConfig.checks``, ...); a family file's ``rename:``
# section says them flat, each key in the one part that has it
PARTS: Mapping[str, type] = {
    "containers": Containers,
    "loading": Loading,
    "forward": ForwardFacts,
    "checks": CheckFacts,
}


def part_of(key: str) -> str:
    """The part (``PARTS``' name) a flat ``rename:`` key belongs to."""
    for part, kind in PARTS.items():
        if any(f.name == key for f in fields(kind)):
            return part
    raise TypeError(
        f"{key!r} is not a key of a family's rename section; the keys are those of "
        + ", ".join(f"{kind.__name__} ({part})" for part, kind in PARTS.items())
    )


@dataclass(frozen=True)
class RenameConfig:
    """What a caller (or a family) says of a model, in its parts: ``containers``,
    ``loading``, ``forward`` facts, ``checks`` facts, plus ``addresses``: rows that
    replace where an existing accessor reads or add new ones. Later configs win, the
    user's last (field by field: a field left None says nothing).
    ``RenameConfig.of(**flat)`` takes the fields flat, as a family file's ``rename:``
    section writes them."""

    containers: Containers = field(default_factory=Containers)
    loading: Loading = field(default_factory=Loading)
    forward: ForwardFacts = field(default_factory=ForwardFacts)
    checks: CheckFacts = field(default_factory=CheckFacts)
    addresses: Mapping[str, Address] = field(default_factory=dict)

    @classmethod
    def of(cls, addresses: Mapping[str, Address] | None = None, **flat: Any) -> RenameConfig:
        """A config from flat fields (``RenameConfig.of(hidden_states_are_block_outputs=
        True)``), each put in its part; TypeError names a key no part has."""
        grouped: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
        for key, value in flat.items():
            grouped[part_of(key)][key] = value
        parts = {part: PARTS[part](**values) for part, values in grouped.items()}
        return cls(**parts, addresses=dict(addresses or {}))


@dataclass(frozen=True)
class Family:
    """One family file of the registry as the runtime uses it: which models it
    ``match``es, where its ``containers`` are, how it is ``loading``, the facts of its
    ``forward`` the runtime acts on and those its ``checks`` read (each a part of its
    file's ``rename:`` section), its ``addresses`` (rows replacing or adding to the defaults), and what it says of its
    attention's interiors (why there are none: ``interiors_unavailable``; its own
    forward's ``interiors``; where it keeps the ``operands``), of its block structure
    (why none applies: ``structure_unknown``), of its ``lens`` (the steps from the last
    block's output to its logits, where they are not the default's) and of where media
    enter its inputs (``media_tokens``: the config attributes of each medium's
    placeholder token id)."""

    name: str
    match: FamilyMatch
    containers: Containers = field(default_factory=Containers)
    loading: Loading = field(default_factory=Loading)
    forward: ForwardFacts = field(default_factory=ForwardFacts)
    checks: CheckFacts = field(default_factory=CheckFacts)
    addresses: Mapping[str, Address] = field(default_factory=dict)
    interiors_unavailable: str | None = None
    interiors: Mapping[str, Interior] = field(default_factory=dict)
    operands: Mapping[str, Operand] = field(default_factory=dict)
    structure_unknown: str | None = None
    lens: Lens | None = None
    # medium (image, audio, video) -> the config attributes that may hold its placeholder id
    media_tokens: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class BlockStructure:
    """How a block combines its sublayers with the residual stream: its identities,
    the rows a family of it must replace, and what the tools draw and check by it
    (``parallel``: attention and the MLP read the same block input and both add at
    once; ``norm_after_add``: a norm follows each residual add; ``residual_inside``: a
    sublayer module adds the residual itself; ``output_scale``: the path, relative to
    the layer, of a per-layer weight the block multiplies its whole output by, so an
    identity whose left side is layers_output holds with its right side times it)."""

    name: str
    doc: str
    identities: tuple[str, ...]
    requires_rows: tuple[str, ...] = ()
    parallel: bool = False
    norm_after_add: bool = False
    residual_inside: bool = False
    output_scale: str | None = None


@dataclass(frozen=True)
class StructureRule:
    """``structure`` applies to models matching ``match`` (first rule that matches)."""

    structure: str
    match: FamilyMatch


@dataclass(frozen=True)
class LayerKind:
    """A property of one layer's module tree: any of ``present`` (if given) exists,
    and none of ``absent`` does. ``skipped_on_text_input``: the model does not run a
    layer of this kind on a text-only input (transformers' per-layer outputs have no
    entry for it)."""

    name: str
    doc: str
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    skipped_on_text_input: bool = False


@dataclass(frozen=True)
class StructuralEntry:
    """For one structural place on one block structure: the candidate child paths, or
    the reason the structure has no such place."""

    candidates: tuple[str, ...] = ()
    reason: str | None = None


@dataclass(frozen=True)
class Interior:
    """A tensor inside a module's forward, reached through ``.source``; ``within`` is
    the module row (``attentions``) whose forward holds the call, or ``module`` (a
    path below the layer) where a family's attention computes inside a child of it
    (GPT-Neo's ``self_attn.attention``). ``layout`` replaces the component's stated
    layout where a family holds the tensor otherwise (heads merged: ``bsf``);
    ``note`` says what the tensor holds on a family where that differs from the
    interior's doc (a query scaled before the call, ALiBi in the scores);
    ``merged_heads`` that the call holds it with batch and heads merged into one axis,
    (batch*heads, ...), which a read views apart (XGLM's torch.bmm operands);
    ``unavailable`` why a family has no such tensor (``{place}`` is the component),
    where its other interiors are offered (a softmax over the scores and attention
    sinks together: no tensor is the scores as the softmax reads them)."""

    name: str
    within: str
    needles: tuple[str, ...]
    order: int | float
    arg: int | None = None
    returns: int | None = None
    eager_only: bool = False
    versions: tuple[tuple[str, str], ...] = ()
    module: str | None = None
    layout: str | None = None
    merged_heads: bool = False
    note: str = field(default="", compare=False)
    doc: str = field(default="", compare=False)
    unavailable: str | None = field(default=None, compare=False)
    # why a forward that makes no such call has no such tensor (no rotary embedding)
    missing: str | None = field(default=None, compare=False)
    # the interior (attention_query) whose call must receive, unchanged, what this
    # interior's call returns in this argument's place (flow.flow_refusal)
    reaches: str | None = None


@dataclass(frozen=True)
class Operand:
    """A tensor or number the attention computes with, which the sweep's interior
    checks read beside the interiors (the values, the mask, the scaling, an additive
    bias such as ALiBi). Taken from the call ``needle`` names in the attention's
    forward (its positional ``arg``, else its keyword ``kwarg``; or what it
    ``returns``), from the attention module's keyword argument ``input`` (or its
    positional ``arg``), from an attribute of the attention module such as a buffer
    (``attribute``), or given as a number (``value``)."""

    needle: str | None = None
    arg: int | None = None
    kwarg: str | None = None
    returns: int | None = None
    input: str | None = None
    attribute: str | None = None
    value: float | None = None


PerHead = Literal["q", "kv", "none"]
# How a per-head place's tensor is held: b batch, h head, s sequence, d head_dim,
# k keys, f heads x head_dim concatenated (bhds: a key transposed for q·kᵀ, as a
# family's own matmul takes it).
Layout = Literal["bhsd", "bshd", "bsf", "bhsk", "bhds"]
Width = Literal[
    "hidden_size",
    "intermediate_size",
    "q_width",
    "kv_width",
    "z_width",
    "value_width",
    "heads_hidden",
    "num_experts",
    "experts_per_token",
    "vocab_size",
]


@dataclass(frozen=True)
class Component:
    """A name research code uses, and the policy kept beside its place."""

    name: str
    kind: Literal["boundary", "interior"]
    target: str
    per_layer: bool
    default_rank: int
    sequence_axis: int | None
    per_head: PerHead
    layout: Layout | None
    keys_axis: int | None
    width: Width | None
    writable: bool
    why_read_only: str | None = None
    doc: str = field(default="", compare=False)


# ------------------------------------------------------------------ identities
# The grammar of block_structures.yaml's identities: "left == term + term ...", each
# term a row, "w * a" (per-stream weights times a one-stream tensor, one copy per
# stream), "m @ x" (streams x mixed by m), "k * a" (a number times a row), or, alone,
# "module(b)" (the left side's module fed b).

IdentityTerm = tuple[
    str, ...
]  # ("row", a) | ("*", w, a) | ("@", m, x) | ("k", c, a) | ("module", b)
_TERM = re.compile(r"^(?:(\w+|\d*\.\d+)\s*([*@])\s*(\w+)|module\((\w+)\)|(\w+))$")
_NUMBER = re.compile(r"\d*\.?\d+")


def parse_identity_terms(text: str) -> tuple[str, tuple[IdentityTerm, ...]]:
    """``"a == m @ x + w * b"`` -> ``("a", (("@", "m", "x"), ("*", "w", "b")))``;
    ValueError on text outside the grammar."""
    left, sep, right = text.partition("==")
    if not sep or not re.fullmatch(r"\s*\w+\s*", left):
        raise ValueError(f"identity {text!r} is not of the form 'a == b + c'")
    terms: list[IdentityTerm] = []
    for part in right.split("+"):
        match = _TERM.match(part.strip())
        if match is None:
            raise ValueError(
                f"identity {text!r}: {part.strip()!r} is not a row, 'w * a', 'm @ x', "
                "'k * a' (k a number) or 'module(b)'"
            )
        weights, op, other, fed, row = match.groups()
        if weights is not None and _NUMBER.fullmatch(weights):
            if op != "*":
                raise ValueError(f"identity {text!r}: a number only multiplies ({part.strip()!r})")
            terms.append(("k", weights, other))
        elif row is not None:
            terms.append(("row", row))
        elif fed is not None:
            terms.append(("module", fed))
        else:
            terms.append((op, weights, other))
    if any(t[0] == "module" for t in terms) and len(terms) != 1:
        raise ValueError(f"identity {text!r}: 'module(b)' stands alone on the right side")
    return left.strip(), tuple(terms)


def identity_term_rows(term: IdentityTerm) -> tuple[str, ...]:
    """The rows a term names (a number is none)."""
    return term[2:] if term[0] == "k" else term[1:]
