"""Tiny random checkpoints: `tiny:<model_type>` builds, caches and loads for real."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from causalab_mini.tools import tiny
from causalab_mini.tools.tiny import (
    TINY_PREFIX,
    TinyBuildError,
    build_tiny,
    cache_root,
    causal_lm_model_types,
    parse_tiny_spec,
    resolve_model_spec,
    tiny_config,
    tiny_tokenizer,
)
from causalab_mini.tools.tiny import build as tiny_build
from causalab_mini.tools.tiny import config as tiny_cfg

from .registry_cases import language_config, model_types

# Every model type the registry names (block-structure rules and family files): the
# first of each structure in the README's test command, the rest in CI (marker `wide`).
FAMILIES = [case.param(case.model_type) for case in model_types()]

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello there!"]


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache for the session, so each family is built once."""
    root = tmp_path_factory.mktemp("tiny-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CAUSALAB_MINI_CACHE", str(root))
        yield root


# ----------------------------------------------------------------- fast checks


def test_cache_root_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAUSALAB_MINI_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("CAUSALAB_MINI_CACHE")
    assert cache_root() == Path.home() / ".cache" / "causalab_mini"


def test_non_tiny_specs_pass_through(tmp_path: Path) -> None:
    assert resolve_model_spec("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
    assert resolve_model_spec(str(tmp_path)) == str(tmp_path)
    # only a spec that starts with the prefix names a tiny model
    assert resolve_model_spec(f"x{TINY_PREFIX}llama") == f"x{TINY_PREFIX}llama"
    assert parse_tiny_spec(f"{TINY_PREFIX}llama") == ("llama", {})


def test_unknown_model_type_names_close_matches() -> None:
    with pytest.raises(TinyBuildError, match=r"unknown model type 'lama'.*llama"):
        tiny_config("lama")
    with pytest.raises(TinyBuildError, match=r"close matches: .*gpt2"):
        build_tiny("gtp2")
    with pytest.raises(TinyBuildError, match="unknown model type"):
        resolve_model_spec("tiny:definitely_not_a_model")


def test_non_causal_model_type_is_refused() -> None:
    # a config type of no group (t5 is in the seq2seq group)
    with pytest.raises(TinyBuildError, match="not a causal LM"):
        tiny_config("vit")


def test_causal_lm_model_types_sorted() -> None:
    types = causal_lm_model_types()
    assert types == sorted(types)
    assert {"llama", "gpt2", "deepseek_v3", "jamba"} <= set(types)
    assert "t5" not in types


def test_tokenizer_is_small_deterministic_and_llama_like() -> None:
    tok = tiny_tokenizer()
    assert tiny_tokenizer().backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert len(tok) <= tiny.VOCAB - tiny.RESERVED_IDS
    assert tok.padding_side == "left"
    ids = tok("The capital of France is Paris.")["input_ids"]
    assert ids[0] == tok.bos_token_id == tiny.BOS_ID
    assert len(ids) >= 5
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 2, 3)
    batch = tok(TEXTS, padding=True)
    assert batch["input_ids"][1][0] == tok.pad_token_id  # padded on the left


@pytest.mark.parametrize("model_type", FAMILIES)
def test_tiny_config_is_consistent_and_has_the_registrys_sizes(model_type: str) -> None:
    from causalab_mini.generated.tiny import TINY_OVERRIDES, TINY_SIZES

    config = tiny_config(model_type)
    overridden = dict(TINY_OVERRIDES.get(model_type, {}))
    for text in _stack_configs(model_type, config):
        _check_sizes(text, overridden, TINY_SIZES)


def _stack_configs(model_type: str, config: Any) -> list[Any]:
    """The configs that size the language model's stacks: its text config (or the
    sub-config its causal LM is built from), or, where that states no width (BLT keeps
    one config per stack: encoder, global, decoder), each of its sub-configs that
    does."""
    text = language_config(model_type, config)
    if hasattr(text, "hidden_size"):
        return [text]
    subs = [getattr(text, name) for name in getattr(text, "sub_configs", {})]
    return [sub for sub in subs if hasattr(sub, "hidden_size")]


def _check_sizes(text: Any, overridden: dict[str, Any], sizes: Any) -> None:
    # the sizes of registry/tiny.yaml, unless the model type's row overrides them
    assert text.hidden_size == overridden.get("hidden_size", sizes["hidden"])
    # a few configs derive their depth (a hybrid's layer pattern; LongCat-Flash counts
    # two sublayers a layer in num_hidden_layers and keeps its depth in num_layers; a
    # cycled stack, HRM-Text, counts layer calls there and keeps its depth per stack)
    depth = getattr(text, "num_layers", getattr(text, "num_layers_per_stack", None))
    depth = text.num_hidden_layers if depth is None else depth
    assert depth <= max(overridden.get("num_hidden_layers", 0), sizes["layers"] + 1)
    vocab = getattr(text, "vocab_size", None)  # none on a stack that reads no tokens
    if vocab is not None:
        assert vocab == sizes["vocab"]
        assert vocab >= len(tiny_tokenizer())
    # and what a model needs of them
    heads = getattr(text, "num_attention_heads", None)  # none on an attention-free model
    if heads is not None:
        assert text.hidden_size % heads == 0
        kv = getattr(text, "num_key_value_heads", None)
        if isinstance(kv, int):
            assert heads % kv == 0
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(text, key, None)
        if isinstance(value, int) and vocab is not None:
            assert 0 <= value < vocab, key


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_generic_key_the_class_knows_reaches_the_config(model_type: str) -> None:
    """The shrink table as the builder applies it: every key of the registry's generic
    table that the config class has as a field is set to the table's value, unless the
    key is kept off (and off by default), the model type overrides it, the builder fits
    it to the class (latent attention), or the class derives it itself."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = tiny_config(model_type)
    # the language model's config: a composite one (a vision-language checkpoint's)
    # holds it as its text config, which the table shrinks (or one config per stack)
    checked = 0
    stacks = _stack_configs(model_type, config)
    for text in stacks:
        # a per-stack config may be handed a kept-off key by its parent (BLT's
        # sliding_window): only the text config's own defaults are held to "off"
        checked += _generic_keys_checked(
            text, model_type, config, own=stacks == [language_config(model_type, config)]
        )
    assert checked >= 5
    # the class itself, not a default instance: a drafter's default config
    # (Gemma4AssistantConfig()) fails its own validate_architecture
    assert isinstance(config, CONFIG_MAPPING[model_type])


def _generic_keys_checked(text: Any, model_type: str, config: Any, own: bool = True) -> int:
    """How many generic keys the config class of ``text`` keeps, each checked."""
    from causalab_mini.generated.tiny import TINY_GENERIC, TINY_KEEP_OFF, TINY_OVERRIDES

    config_cls = type(text)
    defaults = tiny_cfg._field_defaults(config_cls)
    # overridden: by the model type's row, by the row of its text config's own type
    # (a wrapper's gemma4_text), or under the text config's name in the type's row
    row = dict(TINY_OVERRIDES.get(model_type, {}))
    skipped = set(row) | set(dict(TINY_OVERRIDES.get(str(text.model_type), {})))
    for name, sub in row.items():
        if getattr(config, name, None) is text and isinstance(sub, Mapping):
            skipped |= set(sub)
    if "kv_lora_rank" in defaults:
        skipped |= {"num_key_value_heads", "head_dim"}
    checked = 0
    for key, value in TINY_GENERIC.items():
        if key not in defaults or key in skipped or key.endswith("_token_id"):
            continue
        if key in TINY_KEEP_OFF and defaults[key] in (None, 0):
            if own and getattr(config_cls(), key) == defaults[key]:  # not derived by the class
                assert getattr(text, key) == defaults[key], key
            continue
        try:  # a class that derives the field itself (Qwen2's sliding_window) is skipped
            kept = getattr(config_cls(**{key: tiny.thaw(value)}), key) == tiny.thaw(value)
        except Exception:
            kept = False
        if kept:
            assert getattr(text, key) == tiny.thaw(value), key
            checked += 1
    return checked


@pytest.mark.parametrize(
    ("model_type", "field", "kinds"),
    [
        ("gemma2", "layer_types", {"sliding_attention", "full_attention"}),
        ("gemma3_text", "layer_types", {"sliding_attention", "full_attention"}),
        ("qwen3_next", "layer_types", {"linear_attention", "full_attention"}),
        ("jamba", "layers_block_type", {"mamba", "attention"}),
        ("bamba", "layers_block_type", {"linear_attention", "full_attention"}),
        ("granitemoehybrid", "layer_types", {"linear_attention", "full_attention"}),
        ("lfm2", "layer_types", {"conv", "full_attention"}),
        ("zamba", "layers_block_type", {"linear_attention", "hybrid"}),
    ],
)
def test_layer_patterns_keep_every_kind(model_type: str, field: str, kinds: set[str]) -> None:
    assert set(getattr(tiny_config(model_type), field)) == kinds


def test_multimodal_placeholder_ids_fit_the_reserved_vocab() -> None:
    config = tiny_config("gemma3")
    top = range(tiny.VOCAB - tiny.RESERVED_IDS, tiny.VOCAB)
    assert {config.image_token_id, config.boi_token_id, config.eoi_token_id} <= set(top)
    assert config.text_config.vocab_size == tiny.VOCAB
    assert config.vision_config.hidden_size <= 64


def _tables_from(registry: Path, tmp_path: Path) -> ModuleType:
    """The generated tiny tables of ``registry`` (lint + gen, as `registry gen` does)."""
    import importlib.util

    from causalab_mini.codegen.generate import render
    from causalab_mini.codegen.lint import lint

    reg, diags = lint(registry)
    assert diags == []
    path = tmp_path / "tiny_tables.py"
    path.write_text(render(reg)["tiny.py"])
    spec = importlib.util.spec_from_file_location("tiny_tables_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _use(tables: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the builder at other generated tables (as a rebuilt package would)."""
    monkeypatch.setattr(tiny_cfg, "TINY_OVERRIDES", tables.TINY_OVERRIDES)
    monkeypatch.setattr(tiny_cfg, "_GENERIC", tiny.thaw(tables.TINY_GENERIC))
    monkeypatch.setattr(tiny_cfg, "_KEEP_OFF", frozenset(tables.TINY_KEEP_OFF))
    monkeypatch.setattr(tiny_cfg, "_NOT_BUILDABLE", tables.TINY_NOT_BUILDABLE)


def test_an_override_in_the_registry_reaches_the_built_config(
    package_registry_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import edit

    edit(
        package_registry_copy / "tiny.yaml",
        "  mpt:\n    expansion_ratio: 2\n",
        "  mpt:\n    expansion_ratio: 2\n  llama:\n    num_hidden_layers: 2\n"
        "    rope_parameters: {rope_type: default, rope_theta: 500.0}\n",
    )
    before = tiny_config("llama")
    _use(_tables_from(package_registry_copy, tmp_path), monkeypatch)
    after = tiny_config("llama")
    assert (before.num_hidden_layers, after.num_hidden_layers) == (tiny.LAYERS, 2)
    assert after.rope_parameters["rope_theta"] == 500.0
    assert isinstance(after.rope_parameters, dict)  # plain data again, not a read-only view
    assert after.hidden_size == before.hidden_size


def test_a_size_in_the_registry_reaches_every_key_that_names_it(
    package_registry_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import edit

    edit(package_registry_copy / "tiny.yaml", "  hidden: &hidden 64\n", "  hidden: &hidden 32\n")
    edit(
        package_registry_copy / "tiny.yaml",
        "  head_dim: &head_dim 16\n",
        "  head_dim: &head_dim 8\n",
    )
    tables = _tables_from(package_registry_copy, tmp_path)
    assert tables.TINY_SIZES["hidden"] == 32 and tables.TINY_GENERIC["n_embd"] == 32
    _use(tables, monkeypatch)
    for model_type in ("llama", "gpt2"):
        text = tiny_config(model_type).get_text_config()
        assert text.hidden_size == 32
        assert text.hidden_size // text.num_attention_heads == 8


def test_a_model_type_the_registry_says_cannot_be_built_is_refused_with_its_reason(
    package_registry_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .conftest import edit

    edit(
        package_registry_copy / "tiny.yaml",
        "not_buildable:\n",
        "not_buildable:\n  llama: a reason written for this test, and only here\n",
    )
    tiny_config("llama")
    _use(_tables_from(package_registry_copy, tmp_path), monkeypatch)
    with pytest.raises(TinyBuildError, match="cannot be built tiny: a reason written for this"):
        tiny_config("llama")


def test_deepseek_v3_config_mixes_dense_and_moe() -> None:
    # a dense first layer and routed experts after it (what the layer-0/1 test builds)
    config = tiny_config("deepseek_v3")
    assert 0 < config.first_k_dense_replace < config.num_hidden_layers
    assert config.num_experts_per_tok < config.n_routed_experts


# ---------------------------------------------------------------- model builds


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_build_load_and_forward(model_type: str, tiny_cache: Path) -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    path = build_tiny(model_type)
    assert path.parent == tiny_cache / "tiny"
    assert path.name.startswith(f"{model_type}-transformers")
    manifest = json.loads((path / tiny.MANIFEST).read_text())
    assert manifest["model_type"] == model_type
    assert manifest["build_class"] == tiny.build_class(model_type)

    # the auto class the family names (a multimodal wrapper's image-text-to-text one);
    # a decoder saved from its sub-config (MusicGen's) is mapped to its causal-LM class
    # as the runtime's spec preparation maps it, so the test does not depend on another
    # test having loaded one first
    from causalab_mini.spec import _load_class

    _load_class(str(path), {})
    auto = getattr(transformers, tiny.build_class(model_type))
    # with the key renamings the loader gives (a checkpoint another class saved)
    model = auto.from_pretrained(path, **tiny_build._load_kwargs(model_type)).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.dtype == torch.float32
    # where the family traces a submodule (traced_module: a class with no forward of
    # its own that runs the text decoder), the forward is that submodule's
    from causalab_mini.classes import traced_module_for

    traced = traced_module_for(model_type)
    if traced:
        model = model.get_submodule(traced)
    batch = dict(tokenizer(TEXTS, return_tensors="pt", padding=True))
    # a forward that reads more than token ids (a drafter) gets its side inputs
    batch.update(tiny.side_inputs(model.config, *batch["input_ids"].shape, tokens=batch))
    with torch.no_grad():
        logits = model(**batch).logits
    # one logit row per position the forward runs: the token ids', or the positions
    # of the embeddings it is given in their stead
    seq = batch.get("inputs_embeds", batch["input_ids"]).shape[1]
    assert tuple(logits.shape) == (2, seq, model.config.get_text_config().vocab_size)
    assert torch.isfinite(logits).all()


def test_a_config_another_groups_class_maps_is_not_registered_for_causal_lm(
    tmp_path: Path,
) -> None:
    # PP-Chart2Table's config names GOT-OCR2's class, a causal LM's too; its config
    # class is not GOT-OCR2's, so AutoModelForCausalLM.register would refuse the pair.
    # The image-text-to-text auto class maps the model type and loads it: nothing is
    # registered, nothing raised
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto import modeling_auto

    from causalab_mini.spec import _load_class

    if "pp_chart2table" not in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        pytest.skip("this transformers has no pp_chart2table")
    config = {"model_type": "pp_chart2table", "architectures": ["GotOcr2ForConditionalGeneration"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _load_class(str(tmp_path), {}) == {}
    config_class = type(AutoConfig.for_model("pp_chart2table"))
    assert config_class not in AutoModelForCausalLM._model_mapping._extra_content


@pytest.mark.slow
def test_resolve_model_spec_builds(tiny_cache: Path) -> None:
    resolved = resolve_model_spec("tiny:llama")
    assert resolved == str(build_tiny("llama"))
    assert Path(resolved, "config.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
def test_builds_are_deterministic(model_type: str, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    first = build_tiny(model_type, cache_dir=tmp_path / "a")
    second = build_tiny(model_type, cache_dir=tmp_path / "b")
    assert first != second
    a = load_file(str(first / "model.safetensors"))
    b = load_file(str(second / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].equal(b[key]), key
    assert (first / "tokenizer.json").read_bytes() == (second / "tokenizer.json").read_bytes()
    other = load_file(
        str(build_tiny(model_type, cache_dir=tmp_path / "c", seed=1) / "model.safetensors")
    )
    assert any(not a[key].equal(other[key]) for key in a)


@pytest.mark.slow
def test_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = build_tiny("gpt2", cache_dir=tmp_path)
    stamp = (path / tiny.MANIFEST).stat().st_mtime_ns

    def no_rebuild(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt a cached checkpoint")

    monkeypatch.setattr(tiny_build, "_materialize", no_rebuild)
    assert build_tiny("gpt2", cache_dir=tmp_path) == path
    assert (path / tiny.MANIFEST).stat().st_mtime_ns == stamp
    leftovers = [p.name for p in (tmp_path / "tiny").iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_a_types_side_inputs_are_part_of_its_checkpoints_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a checkpoint is verified with the side inputs its forward is fed: another side
    # input row is another checkpoint (not one built and verified under the old row),
    # and a type's side inputs leave every other type's name alone
    fed = next(iter(tiny.SIDE_INPUTS))
    before = {t: tiny_build._checkpoint_name(t, 0) for t in (fed, "gpt2")}
    changed = dict(tiny.SIDE_INPUTS)
    changed[fed] = {**tiny.thaw(changed[fed]), "extra_input": {"why": "x", "shape": ["batch"]}}
    monkeypatch.setattr(tiny_cfg, "SIDE_INPUTS", changed)
    assert tiny_build._checkpoint_name(fed, 0) != before[fed]
    assert tiny_build._checkpoint_name("gpt2", 0) == before["gpt2"]


@pytest.mark.slow
def test_concurrent_builders_do_not_race(tmp_path: Path) -> None:
    results: list[Path] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(build_tiny("gpt_neox", cache_dir=tmp_path))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1
    assert sorted(os.listdir(tmp_path / "tiny")) == sorted(
        [results[0].name, results[0].name + ".lock"]
    )


@pytest.mark.slow
def test_deepseek_v3_layer0_dense_layer1_moe(tiny_cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny("deepseek_v3"))
    layers = model.model.layers
    assert not hasattr(layers[0].mlp, "experts")
    assert hasattr(layers[1].mlp, "experts")
    assert hasattr(layers[1].mlp, "gate")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_nnterp_loads_tiny(model_type: str, tiny_cache: Path) -> None:
    import torch

    from causalab_mini import compat

    compat.install()  # nnterp 1.3 imports under nnsight 0.8 only with the bridges
    from nnterp import StandardizedTransformer

    model = StandardizedTransformer(str(build_tiny(model_type)), device_map="cpu")
    assert model.num_layers == tiny.LAYERS
    with torch.no_grad(), model.trace("The quick brown fox"):
        out = model.logits.save()
    assert out.shape[-1] == model.config.vocab_size


def test_spec_config_overrides_parse() -> None:
    assert parse_tiny_spec("tiny:llama") == ("llama", {})
    assert parse_tiny_spec(
        "tiny:gpt_neox?use_parallel_residual=false&rotary_pct=0.5&x=none&n=3"
    ) == (
        "gpt_neox",
        {"use_parallel_residual": False, "rotary_pct": 0.5, "x": None, "n": 3},
    )
    with pytest.raises(TinyBuildError, match="is not key=value"):
        parse_tiny_spec("tiny:llama?oops")
    with pytest.raises(TinyBuildError, match="empty model type"):
        parse_tiny_spec("tiny:?a=1")


@pytest.mark.slow
def test_overrides_are_part_of_the_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoConfig

    plain = build_tiny("gpt_neox", cache_dir=tmp_path)
    sequential = build_tiny(
        "gpt_neox", cache_dir=tmp_path, overrides={"use_parallel_residual": False}
    )
    assert plain != sequential
    assert AutoConfig.from_pretrained(plain).use_parallel_residual is True
    assert AutoConfig.from_pretrained(sequential).use_parallel_residual is False
    with pytest.raises(TinyBuildError, match="no config attribute 'no_such_key'"):
        build_tiny("gpt_neox", cache_dir=tmp_path, overrides={"no_such_key": 1})


def test_an_override_of_a_declared_type_is_taken_whatever_the_default() -> None:
    """LagunaConfig.gating is typed bool | str: a string is taken though the default is
    a bool; an integer field still refuses a string."""
    text = tiny_config("laguna").get_text_config()
    tiny_cfg._set_override("laguna", text, "gating", "per-element")
    assert text.gating == "per-element"
    llama = tiny_config("llama").get_text_config()
    with pytest.raises(TinyBuildError, match="hidden_size takes an integer"):
        tiny_cfg._set_override("llama", llama, "hidden_size", "abc")


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type", sorted(tiny.TINY_CHECKPOINT_FILES) or [pytest.param("", marks=pytest.mark.skip)]
)
def test_a_checkpoint_file_is_written_beside_the_weights(model_type: str, tiny_cache: Path) -> None:
    """registry/tiny.yaml checkpoint_files: each file a class's from_pretrained reads
    beside the weights (Qwen2.5-Omni's speaker table) is in the tiny checkpoint, holding
    what the row says, and is part of the cache key."""
    import torch

    path = build_tiny(model_type)
    for name, content in tiny.TINY_CHECKPOINT_FILES[model_type].items():
        assert torch.load(path / name, weights_only=True) == tiny.thaw(content)
    assert "checkpoint_files" in tiny.recipe_of(model_type)
