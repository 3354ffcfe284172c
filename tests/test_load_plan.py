"""The load plan (``causalab_mini.load_plan``): what ``StandardizedTransformer``
decides at load, built from a spec, the caller's kwargs and the registry's answer,
without nnterp and without loading anything (issue 31)."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from causalab_mini.family import Resolution, resolve
from causalab_mini.load_plan import LoadPlan, Seen, plan_load


def _before(model_type: str) -> tuple[Resolution, Seen]:
    """The registry's answer and what is seen before the load of a checkpoint of
    ``model_type`` saved by its causal-LM class (else by nothing the tables name)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.for_model(model_type)
    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    names = (mapped,) if isinstance(mapped, str) else ()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    seen = Seen(names, model_type, text, names)
    return resolve(names, model_type, text), seen


def _plan(model_type: str, kwargs: dict[str, Any], **options: Any) -> LoadPlan:
    family, seen = _before(model_type)
    given = copy.deepcopy(kwargs)
    plan = plan_load(options.pop("spec", "/ckpt"), kwargs, family, seen, **options)
    assert kwargs == given, "plan_load changed the kwargs it was given"
    return plan


def test_plain_decoder_plan() -> None:
    plan = _plan("llama", {"torch_dtype": "float32", "rename": {"a.b": "c"}})
    assert plan.kwargs["device_map"] == "cpu"
    assert plan.kwargs["torch_dtype"] == "float32"
    for key in ("dispatch", "allow_multimodal", "check_renaming", "attn_implementation"):
        assert key not in plan.kwargs
    assert "rename" not in plan.kwargs  # it goes to nnterp as its own argument
    assert plan.rename["a.b"] == "c"
    assert plan.rename["model.embed_tokens"] == "embed_tokens"
    assert plan.containers["layers_name"] == "model.layers"
    assert plan.install_sources and plan.no_dispatch is None and not plan.deferred
    assert plan.model_class == "LlamaForCausalLM"
    assert not plan.nnterp_probs and plan.traced_module is None
    assert not plan.hidden_states_are_block_outputs and plan.text_config_name is None


def test_device_map_given_is_kept() -> None:
    assert _plan("llama", {"device_map": "meta"}).kwargs["device_map"] == "meta"


def test_attention_probabilities_vouched_by_the_row() -> None:
    plan = _plan("llama", {"attn_implementation": "eager"}, enable_attention_probs=True)
    # the row holds the probabilities: nnterp checks them (and sets eager itself)
    assert plan.nnterp_probs
    assert plan.probabilities is not None and plan.probabilities.source
    assert "attn_implementation" not in plan.kwargs


def test_attention_probabilities_refuse_another_implementation() -> None:
    with pytest.raises(ValueError, match="needs eager attention"):
        _plan("llama", {"attn_implementation": "sdpa"}, enable_attention_probs=True)


def test_remote_defers_and_never_dispatches() -> None:
    plan = _plan("llama", {"remote": True}, enable_attention_probs=True)
    assert set(plan.deferred) == {"attention_probabilities"}
    assert plan.kwargs["check_attn_probs_with_trace"] is False
    assert plan.no_dispatch and not plan.install_sources
    with pytest.raises(ValueError, match="dispatch=True loads them"):
        _plan("llama", {"remote": True, "dispatch": True})


def test_mixed_layers_allow_multimodal_unless_told() -> None:
    plan = _plan("zamba", {})
    assert plan.kwargs["allow_multimodal"] is True
    assert plan.containers["ignore_attn"] is True and plan.containers["ignore_mlp"] is True
    # attention is not on every layer: our own row serves the probabilities, eager
    probs = _plan("zamba", {}, enable_attention_probs=True)
    assert not probs.nnterp_probs and probs.kwargs["attn_implementation"] == "eager"
    assert _plan("zamba", {"allow_multimodal": False}).kwargs["allow_multimodal"] is False


def test_no_final_norm_skips_nnterps_checks() -> None:
    plan = _plan("openai-gpt", {}, enable_attention_probs=True)
    assert plan.kwargs["check_renaming"] is False
    assert not plan.nnterp_probs and plan.kwargs["attn_implementation"] == "eager"


def test_meta_build_unavailable_dispatches_or_refuses_remote() -> None:
    plan = _plan("qianfan_ocr", {})
    assert plan.kwargs["dispatch"] is True
    assert _plan("qianfan_ocr", {"dispatch": False}).kwargs["dispatch"] is False
    with pytest.raises(ValueError, match="cannot be built on the meta device"):
        _plan("qianfan_ocr", {"remote": True})


def test_wrapper_loads_with_its_auto_class() -> None:
    from causalab_mini import compat

    plan = _plan("gemma3", {})
    wanted = compat.auto_class_kwargs("AutoModelForImageTextToText")
    for key, value in wanted.items():
        assert plan.kwargs[key] == value
    # a loaded module is not loaded again; a class the caller chose is kept
    module = _plan("gemma3", {}, spec=object())
    assert not set(wanted) & set(module.kwargs)
    chosen = _plan("gemma3", {"automodel": "mine"})
    assert chosen.kwargs["automodel"] == "mine" and "task" not in chosen.kwargs


def test_key_mapping_goes_to_from_pretrained() -> None:
    plan = _plan("shieldgemma2", {})
    mapping = plan.kwargs["key_mapping"]
    assert isinstance(mapping, dict) and mapping
    assert _plan("shieldgemma2", {"key_mapping": {"x": "y"}}).kwargs["key_mapping"] == {"x": "y"}
    assert "key_mapping" not in _plan("shieldgemma2", {}, spec=object()).kwargs


def test_the_plan_is_frozen() -> None:
    plan = _plan("llama", {})
    with pytest.raises(AttributeError):
        plan.nnterp_probs = True
    with pytest.raises(TypeError):
        plan.kwargs["dispatch"] = True


def test_planning_imports_no_nnterp() -> None:
    code = (
        "import sys\n"
        "from causalab_mini.family import resolve\n"
        "from causalab_mini.load_plan import Seen, plan_load\n"
        "names = ('LlamaForCausalLM',)\n"
        "from transformers import LlamaConfig\n"
        "config = LlamaConfig()\n"
        "plan = plan_load('/ckpt', {}, resolve(names, 'llama', config), "
        "Seen(names, 'llama', config, names))\n"
        "assert plan.kwargs['device_map'] == 'cpu'\n"
        "assert 'nnterp' not in sys.modules, 'planning imported nnterp'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
