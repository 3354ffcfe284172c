"""Tiny random checkpoints of transformers causal-LM families, built locally.

No machine here reaches a model hub. A model spec ``tiny:<model_type>`` names a tiny
random checkpoint of any transformers causal-LM family: its config class is shrunk
(few layers, small widths, head counts that divide, a small vocabulary with valid
special ids, few experts, enough layers that families whose layers differ show every
kind), a small byte-level BPE tokenizer is trained in-process on a fixed corpus (it
adds the special tokens the model type's real tokenizer adds, registry/tiny.yaml
tokenizers, and carries its chat template where it has one), and the result is
written with ``save_pretrained`` to a cache directory keyed by model type and
transformers version. Callers then load it through the real
``from_pretrained`` path, like any local directory.

Builds are offline, deterministic (seeded) and take a few seconds. Hub ids and local
directories pass through :func:`resolve_model_spec` unchanged.

The package along its seams: ``config`` (what a tiny model type is and its shrunk
config), ``tokenizer`` (the tiny tokenizer), ``build`` (building, the moved build,
the cache, loading back) and ``inputs`` (the side inputs a forward needs). Their
public names are importable from here, with the registry tables the tests read."""

from causalab_mini.generated.tiny import TINY_CHECKPOINT_FILES, TINY_MOVED
from causalab_mini.tools.tiny.build import (
    BUILDER_VERSION,
    BUILDS,
    CACHE_ENV,
    MANIFEST,
    Move,
    build_tiny,
    cache_root,
    draw_norms,
    moved_fields,
    resolve_model_spec,
    scale_weights,
)
from causalab_mini.tools.tiny.config import (
    BOS,
    BOS_ID,
    BUILD_FROM,
    BUILD_KEY,
    EOS,
    EOS_ID,
    HEADS,
    LAYERS,
    MAX_POSITIONS,
    PAD,
    PAD_ID,
    RESERVED_IDS,
    SIDE_INPUTS,
    TINY_PREFIX,
    UNK,
    UNK_ID,
    VOCAB,
    TinyBuildError,
    apply_overrides,
    build_class,
    builds_outside,
    causal_lm_model_types,
    check_model_type,
    first_line,
    group_model_types,
    group_of,
    parse_tiny_spec,
    recipe_of,
    split_member,
    thaw,
    tiny_config,
    tokenizer_row,
)
from causalab_mini.tools.tiny.inputs import side_inputs
from causalab_mini.tools.tiny.tokenizer import tiny_tokenizer

__all__ = [
    "BOS",
    "BOS_ID",
    "BUILDER_VERSION",
    "BUILDS",
    "BUILD_FROM",
    "BUILD_KEY",
    "CACHE_ENV",
    "EOS",
    "EOS_ID",
    "HEADS",
    "LAYERS",
    "MANIFEST",
    "MAX_POSITIONS",
    "PAD",
    "PAD_ID",
    "RESERVED_IDS",
    "SIDE_INPUTS",
    "TINY_CHECKPOINT_FILES",
    "TINY_MOVED",
    "TINY_PREFIX",
    "UNK",
    "UNK_ID",
    "VOCAB",
    "Move",
    "TinyBuildError",
    "apply_overrides",
    "build_class",
    "build_tiny",
    "builds_outside",
    "cache_root",
    "causal_lm_model_types",
    "check_model_type",
    "draw_norms",
    "first_line",
    "group_model_types",
    "group_of",
    "moved_fields",
    "parse_tiny_spec",
    "recipe_of",
    "resolve_model_spec",
    "scale_weights",
    "side_inputs",
    "split_member",
    "thaw",
    "tiny_config",
    "tiny_tokenizer",
    "tokenizer_row",
]
