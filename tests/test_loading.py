"""Every load loads the checkpoint's own weights, or is refused (issue 20, item 3).

A wrapper family (one with an ``auto_class``: a language model inside a multimodal
class) loads a checkpoint saved by its text class with that class, and every load is
checked against transformers' own loading report: every tensor of the checkpoint is
loaded into the model and every parameter comes from it, or the load is refused
listing what is missing and unexpected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from causalab_mini.generated import FAMILY_LOADING, FAMILY_MATCH

# the model types of the families that load with an auto class of their own
WRAPPERS = sorted(
    t
    for name, match in FAMILY_MATCH.items()
    if FAMILY_LOADING[name].auto_class
    for t in match.model_types
)
FIRST = "mllama"  # the README tier's representative (text class beside the wrapper's)


def _causal_types() -> set[str]:
    from causalab_mini.tools.tiny import causal_lm_model_types

    return set(causal_lm_model_types())


def _text_class(model_type: str, config: Any) -> str | None:
    """The causal-LM class that saves the text stack of ``model_type``'s wrapper: the
    model type's own causal-LM class where it is not the wrapper (MllamaForCausalLM),
    else the text sub-config's model type's (Gemma3ForCausalLM, Qwen2ForCausalLM)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    own = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if own is not None and own not in (config.architectures or ()):
        return str(own)
    found = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get_text_config().model_type)
    return str(found) if found is not None else None


def _checkpoints(model_type: str, root: Path) -> list[tuple[str, str]]:
    """(directory, the class that saved it): the tiny wrapper checkpoint, its text
    stack saved by the text class, and (where the text class is the model type's own
    causal-LM class) the same weights under the wrapper's composite config whose
    architectures name the text class."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    from causalab_mini.tools.tiny import resolve_model_spec

    wrapper = resolve_model_spec(f"tiny:{model_type}")
    config = AutoConfig.from_pretrained(wrapper)
    out = [(wrapper, str(config.architectures[0]))]
    text_class = _text_class(model_type, config)
    if text_class is None:
        return out
    torch.manual_seed(0)
    text = getattr(transformers, text_class)(config.get_text_config())
    plain = root / f"{model_type}-text"
    shutil.rmtree(plain, ignore_errors=True)
    text.save_pretrained(plain)
    AutoTokenizer.from_pretrained(wrapper).save_pretrained(plain)
    out.append((str(plain), text_class))
    if (
        transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        == text_class
    ):
        composite = root / f"{model_type}-text-composite"
        shutil.copytree(plain, composite, dirs_exist_ok=True)
        raw = json.loads((Path(wrapper) / "config.json").read_text())
        raw["architectures"] = [text_class]
        (composite / "config.json").write_text(json.dumps(raw))
        out.append((str(composite), text_class))
    return out


def _logits_of(model: Any, ids: Any) -> Any:
    with model.trace(ids):
        logits = model.logits.save()
    return logits


def _check_loads_its_own(path: str, saved_by: str) -> None:
    import transformers

    from causalab_mini.model import StandardizedTransformer

    model = StandardizedTransformer(path)
    assert model.load_reports == []  # built on the meta device: nothing loaded yet
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    got = _logits_of(model, ids)
    assert type(model._model).__name__ == saved_by, path
    (report,) = model.load_reports
    assert report.ok and report.model_class == saved_by, report
    reference = getattr(transformers, saved_by).from_pretrained(path)
    with torch.no_grad():
        expected = reference(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5), (path, (got - expected).abs().max())


@pytest.mark.parametrize("model_type", [FIRST])
def test_a_wrapper_family_loads_each_checkpoint_with_the_class_that_saved_it(
    model_type: str, tmp_path: Path
) -> None:
    for path, saved_by in _checkpoints(model_type, tmp_path):
        _check_loads_its_own(path, saved_by)


@pytest.mark.wide
@pytest.mark.parametrize("model_type", [t for t in WRAPPERS if t != FIRST])
def test_every_wrapper_family_loads_each_checkpoint_with_the_class_that_saved_it(
    model_type: str, tmp_path: Path
) -> None:
    if model_type not in _causal_types():
        pytest.skip(f"{model_type} is not a causal-LM model type of this transformers")
    for path, saved_by in _checkpoints(model_type, tmp_path):
        _check_loads_its_own(path, saved_by)


def test_a_checkpoint_with_a_renamed_tensor_is_refused_listing_it(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from causalab_mini.model import LoadRefused, StandardizedTransformer
    from causalab_mini.tools.tiny import resolve_model_spec

    source = Path(resolve_model_spec("tiny:llama"))
    broken = tmp_path / "llama-renamed"
    shutil.copytree(source, broken)
    (weights,) = broken.glob("*.safetensors")
    tensors = load_file(weights)
    before = "model.layers.1.mlp.down_proj.weight"
    after = "model.layers.1.mlp.down_projection.weight"
    tensors[after] = tensors.pop(before)
    save_file(tensors, weights, metadata={"format": "pt"})

    fine = StandardizedTransformer(str(source))  # the same checkpoint, unrenamed
    fine.dispatch()
    assert [r.ok for r in fine.load_reports] == [True]

    model = StandardizedTransformer(str(broken))
    with pytest.raises(LoadRefused) as refused:
        model.dispatch()
    text = str(refused.value)
    assert before in text and after in text, text
    assert "LlamaForCausalLM" in text and "llama" in text, text
    assert not model.dispatched  # nothing of the random weights is left to trace


def test_a_class_that_cannot_be_built_on_meta_loads_its_weights_at_construction() -> None:
    # a family's meta_build_unavailable (Qianfan-OCR's vision tower reads tensor values
    # in its constructor): the model is loaded, and its load checked, at construction,
    # not built on the meta device; remote=True, which needs the meta build, is refused
    from causalab_mini import RenameConfig, StandardizedTransformer

    why = "its constructor reads the values of a tensor, which no meta tensor has"
    told = RenameConfig.of(meta_build_unavailable=why)
    lazy = StandardizedTransformer("tiny:llama")
    assert not lazy.dispatched and not lazy.load_reports
    model = StandardizedTransformer("tiny:llama", rename_config=told)
    assert model.dispatched and [r.ok for r in model.load_reports] == [True]
    assert model._module.lm_head.weight.device.type == "cpu"
    with model.trace("The fox"):
        logits = model.logits.save()
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="cannot be built on the meta device.*" + why):
        StandardizedTransformer("tiny:llama", remote=True, rename_config=told)


# ------------------------------------------------ a family's model_class, key_mapping

# the families that name a concrete class (no auto class loads their config), and the
# model types registry/tiny.yaml saved_by says another class writes
MODEL_CLASSES = sorted(
    (t, str(FAMILY_LOADING[name].model_class))
    for name, match in FAMILY_MATCH.items()
    if FAMILY_LOADING[name].model_class
    for t in match.model_types
)


def _saved_by() -> list[str]:
    from causalab_mini.generated.tiny import TINY_SAVED_BY

    return sorted(TINY_SAVED_BY)


def test_loading_class_gives_a_concrete_class_the_auto_class_methods() -> None:
    # what nnsight calls on the class it loads with: from_config (the meta build,
    # given trust_remote_code as an auto class is) and from_pretrained
    import transformers

    from causalab_mini.compat import loading_class
    from causalab_mini.tools.tiny import tiny_config

    assert loading_class("AutoModelForCausalLM") is transformers.AutoModelForCausalLM
    shim = loading_class("LlamaForCausalLM")
    assert shim.model_class is transformers.LlamaForCausalLM
    built = shim.from_config(tiny_config("llama"), trust_remote_code=False)
    assert type(built) is transformers.LlamaForCausalLM


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "model_class"), MODEL_CLASSES)
def test_a_family_model_class_builds_and_loads_the_checkpoint(
    model_type: str, model_class: str
) -> None:
    # no auto class loads the config (Evolla's: the auto tables map EvollaConfig to a
    # second model type no model table lists); the family's model_class builds the tiny
    # checkpoint and loads it, every weight its own, with the class's own logits
    import transformers

    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools import tiny

    assert tiny.build_class(model_type) == model_class
    path = tiny.resolve_model_spec(f"tiny:{model_type}")
    config = transformers.AutoConfig.from_pretrained(path)
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        transformers.AutoModelForImageTextToText.from_config(config)
    _check_loads_its_own(path, model_class)
    model = StandardizedTransformer(path)
    assert type(model._model).__name__ == model_class


def _older_layout(tensors: dict[str, Any]) -> dict[str, Any]:
    """A ShieldGemma-2 classifier's tensors (transformers 5.25's save) as transformers
    4.50's classifier named them."""
    moves = (
        ("model.model.language_model.model.", "model.language_model.model."),
        ("model.model.vision_tower.", "model.vision_tower.vision_model."),
        ("model.model.", "model."),
    )
    out = {}
    for key, value in tensors.items():
        new = next((n + key[len(o) :] for o, n in moves if key.startswith(o)), key)
        out[new] = value
    assert set(out) != set(tensors)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("model_type", _saved_by())
def test_a_checkpoint_saved_by_another_class_loads_every_weight(model_type: str) -> None:
    # registry/tiny.yaml saved_by: the tiny checkpoint is written as the real one is (by
    # the classifier around the model), and the model type's own class loads it with
    # the family's key_mapping: nothing missing or unexpected, the logits the saving
    # class's inner model gives. Without the mapping transformers leaves weights out.
    import transformers

    from causalab_mini.generated.tiny import TINY_SAVED_BY
    from causalab_mini.tools import tiny

    saver, module, _ = TINY_SAVED_BY[model_type]
    path = tiny.resolve_model_spec(f"tiny:{model_type}")
    assert json.loads((Path(path) / "config.json").read_text())["architectures"] == [saver]
    auto = getattr(transformers, tiny.build_class(model_type))
    mapping = tiny.build._load_kwargs(model_type)
    assert mapping, f"{model_type}: its family gives no key_mapping"
    _, bare = auto.from_pretrained(path, output_loading_info=True)
    assert bare["missing_keys"], "the checkpoint loads without the key mapping"
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    inner = getattr(transformers, saver).from_pretrained(path).eval().get_submodule(module)
    with torch.no_grad():
        expected = inner(input_ids=ids).logits
    _loads_every_weight(model_type, [path], expected)


def _loads_every_weight(model_type: str, checkpoints: list[str], expected: Any) -> None:
    """Each checkpoint loads into ``model_type``'s own class with the family's
    key_mapping (nothing missing or unexpected), by transformers and by the runtime's
    loader, whose logits are ``expected``."""
    import transformers

    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools import tiny

    auto = getattr(transformers, tiny.build_class(model_type))
    mapping = tiny.build._load_kwargs(model_type)
    ids = torch.tensor([[5, 9, 17, 33, 2]])
    for checkpoint in checkpoints:
        loaded, info = auto.from_pretrained(checkpoint, output_loading_info=True, **mapping)
        assert not info["missing_keys"] and not info["unexpected_keys"], (checkpoint, info)
        model = StandardizedTransformer(checkpoint)
        got = _logits_of(model, ids)
        (report,) = model.load_reports
        assert report.ok and report.model_class == type(loaded).__name__, report
        assert torch.allclose(got, expected, atol=1e-5), (checkpoint, (got - expected).abs())


@pytest.mark.slow
def test_shieldgemma2_loads_the_layout_transformers_4_50_wrote(tmp_path: Path) -> None:
    # the real checkpoints were written by transformers 4.50's classifier: its model
    # held the text stack as a causal LM (model.language_model.model.*) and the SigLIP
    # tower's vision_model; they load as the 5.25 classifier's save does, with or
    # without the text head saved
    import transformers
    from safetensors.torch import load_file, save_file

    from causalab_mini.tools import tiny

    path = tiny.resolve_model_spec("tiny:shieldgemma2")
    inner = transformers.ShieldGemma2ForImageClassification.from_pretrained(path).eval().model
    with torch.no_grad():
        expected = inner(input_ids=torch.tensor([[5, 9, 17, 33, 2]])).logits
    checkpoints = []
    for head in (False, True):
        older = tmp_path / f"older-layout-{head}"
        shutil.copytree(path, older)
        (weights,) = older.glob("*.safetensors")
        renamed = _older_layout(load_file(weights))
        if head:
            embed = renamed["model.language_model.model.embed_tokens.weight"]
            renamed["model.language_model.lm_head.weight"] = embed.clone()
        save_file(renamed, weights, metadata={"format": "pt"})
        checkpoints.append(str(older))
    _loads_every_weight("shieldgemma2", checkpoints, expected)


def test_a_causal_lm_under_an_image_text_config_loads_past_nnsight_0_7s_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nnsight 0.6/0.7 refuse a model type registered for image-text-to-text when they
    load with AutoModelForCausalLM itself: the causal-LM class is given behind a loader
    of its own there (Mllama's text model saved under MllamaConfig loads as
    MllamaForCausalLM); nothing for a text model type, nor on 0.8."""
    from transformers import AutoModelForCausalLM

    from causalab_mini import compat

    composite = next(p for p, _ in _checkpoints("mllama", tmp_path) if "composite" in str(p))
    on_08 = compat.is_08()
    monkeypatch.setattr(compat, "is_08", lambda: False)
    assert compat.causal_lm_kwargs("llama") == {} and compat.causal_lm_kwargs(None) == {}
    loader = compat.causal_lm_kwargs("mllama")["automodel"]
    assert loader is not AutoModelForCausalLM
    assert type(loader.from_pretrained(composite)).__name__ == "MllamaForCausalLM"
    monkeypatch.undo()
    if on_08:
        assert compat.causal_lm_kwargs("mllama") == {}
