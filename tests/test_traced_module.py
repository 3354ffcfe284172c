"""A family that traces a submodule (``rename: traced_module``): the checkpoint loads
whole with its own class, and the submodule (Qwen2.5-Omni's and Qwen3-Omni's thinker)
is traced and addressed as the model: its forward gives the model's logits, a write
through a place reaches the later logits and no earlier read, something the model
lacks is refused by name, and remote=True is refused with why."""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.generated import FAMILIES, FAMILY_LOADING, FAMILY_MATCH

pytestmark = pytest.mark.slow

# (model type, family, traced submodule, its config's attribute) of every family that
# traces a submodule: read from the generated tables, never listed here
TRACED = sorted(
    (model_type, family, str(loading.traced_module), str(loading.traced_config))
    for family, loading in FAMILY_LOADING.items()
    if loading.traced_module
    for model_type in FAMILY_MATCH[family].model_types
)
IDS = [case[0] for case in TRACED]
FIRST = TRACED[:1]  # the README's tier; the rest run with -m "" (wide)


def _params(cases: list[tuple[str, str, str, str]]) -> list[Any]:
    return [
        pytest.param(*case, id=case[0], marks=[] if case in FIRST else [pytest.mark.wide])
        for case in cases
    ]


def _whole(model_type: str, family: str) -> Any:
    """The tiny checkpoint loaded whole with its family's auto class, as a user would
    load the real one, outside nnsight."""
    import transformers

    from causalab_mini.tools.tiny import resolve_model_spec

    auto = getattr(transformers, str(FAMILY_LOADING[family].auto_class))
    return auto.from_pretrained(resolve_model_spec(f"tiny:{model_type}")).eval()


def _batch(model: Any) -> dict[str, Any]:
    from causalab_mini.tools.tiny import side_inputs

    batch = dict(model.tokenizer(["The quick brown fox jumps"], return_tensors="pt"))
    batch.update(side_inputs(model._model.config, *batch["input_ids"].shape, tokens=batch))
    return batch


def test_the_registry_traces_some_submodule() -> None:
    assert TRACED, "no family names a traced_module"
    for _, family, _, config in TRACED:
        assert config, f"{family} names traced_module without traced_config"


@pytest.mark.parametrize(("model_type", "family", "path", "config_name"), _params(TRACED))
def test_the_traced_forward_is_the_submodules_own(
    model_type: str, family: str, path: str, config_name: str
) -> None:
    """The model is the submodule of the checkpoint's model: its class, its config
    (the checkpoint config's sub-config), the checkpoint's tokenizer; its logits in a
    trace equal the submodule's own forward on the whole model loaded outside
    nnsight, and its families are the submodule's with the traced family beside."""
    import torch

    from causalab_mini import StandardizedTransformer

    model = StandardizedTransformer(f"tiny:{model_type}")
    whole = _whole(model_type, family)
    sub = whole.get_submodule(path)
    assert type(model._model) is type(sub)
    assert model._model.config.model_type == getattr(whole.config, config_name).model_type
    assert model.traced_module == path
    assert family in model.families and len(model.families) > 1
    assert model.tokenizer.name_or_path == whole.config._name_or_path
    # the media placeholders are read from the submodule's config (the traced family's
    # audio, the submodule's own families' image)
    from causalab_mini.positions import media_token_ids

    found, _ = media_token_ids(model)
    sub_config = getattr(whole.config, config_name)
    for medium, names in FAMILIES[family].media_tokens.items():
        assert found[medium] in {getattr(sub_config, n, None) for n in names}
    batch = _batch(model)
    with model.trace(**batch):
        logits = model.logits.save()
    with torch.no_grad():
        want = sub(**batch).logits
    assert logits.shape == want.shape
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("model_type", "family", "path", "config_name"), _params(TRACED))
def test_a_write_reaches_later_logits_and_no_earlier_read(
    model_type: str, family: str, path: str, config_name: str
) -> None:
    """layers_mid[1] read and saved, then written as zeros: the saved read keeps the
    value it had (the clean run's), the block carries the write on (layers_output[1]
    is the MLP's output alone), and the logits change."""
    import torch

    from causalab_mini import StandardizedTransformer

    model = StandardizedTransformer(f"tiny:{model_type}")
    batch = _batch(model)
    with model.trace(**batch):
        clean_mid = model.layers_mid[1].save()
        clean_logits = model.logits.save()
    with model.trace(**batch):
        mid = model.layers_mid[1].save()
        model.layers_mid[1] = mid * 0
        mlp = model.mlps_output[1].save()
        out = model.layers_output[1].save()
        logits = model.logits.save()
    assert torch.equal(mid, clean_mid)  # the earlier read is unchanged by the write
    assert mid.abs().sum() > 0
    torch.testing.assert_close(out, mlp)  # 0 + the MLP's contribution: the write reached
    assert not torch.allclose(logits, clean_logits)


def test_a_submodule_the_model_lacks_is_refused_by_name() -> None:
    """A traced_module naming a child the model does not have is refused with the
    class, the missing part and the children it has; a traced_config naming a
    sub-config the checkpoint's config lacks, with the sub-configs it has."""
    from causalab_mini import RenameConfig, StandardizedTransformer
    from causalab_mini.traced import TracedModuleMissing

    model_type, _, path, config_name = TRACED[0]
    wrong = RenameConfig.of(traced_module="narrator", traced_config=config_name)
    with pytest.raises(TracedModuleMissing, match="has no child 'narrator'") as refused:
        StandardizedTransformer(f"tiny:{model_type}", rename_config=wrong)
    assert f"its children: {path}" in str(refused.value) or f", {path}" in str(refused.value)
    wrong = RenameConfig.of(traced_module=path, traced_config="narrator_config")
    with pytest.raises(TracedModuleMissing, match="narrator_config") as refused:
        StandardizedTransformer(f"tiny:{model_type}", rename_config=wrong)
    assert config_name in str(refused.value)


def test_remote_is_refused_with_why() -> None:
    """remote=True is refused before anything is sent: a server builds the whole class
    from the model key, whose forward is not the traced submodule's."""
    from causalab_mini import StandardizedTransformer

    model_type, family, path, _ = TRACED[0]
    with pytest.raises(ValueError, match="remote=True cannot trace this model") as refused:
        StandardizedTransformer(f"tiny:{model_type}", remote=True)
    assert repr(path) in str(refused.value)
    # a model loaded here is refused the same way when a trace asks for its model key
    model = StandardizedTransformer(f"tiny:{model_type}")
    with pytest.raises(ValueError, match="remote=True cannot trace this model") as refused:
        model.to_model_key()
    assert repr(path) in str(refused.value)
    whole = type(_whole(model_type, family)).__name__
    assert whole in str(refused.value)


def test_the_meta_build_yields_the_submodule_and_dispatches_at_the_first_trace() -> None:
    """Built on the meta device first (dispatch=False), the model is the submodule
    already; its first trace loads the weights (the whole checkpoint, checked) and
    reads the submodule's logits."""
    import torch

    from causalab_mini import StandardizedTransformer

    model_type, family, path, _ = TRACED[0]
    model = StandardizedTransformer(f"tiny:{model_type}", dispatch=False)
    sub = _whole(model_type, family).get_submodule(path)
    assert type(model._model) is type(sub)
    batch = _batch(model)
    with model.trace(**batch):
        logits = model.logits.save()
    assert model.dispatched and model.load_reports
    with torch.no_grad():
        torch.testing.assert_close(logits, sub(**batch).logits, rtol=1e-5, atol=1e-5)


def test_a_loaded_whole_model_is_traced_as_its_submodule() -> None:
    """A model loaded by the caller (the whole class) is given as it is: the registry
    traces its submodule, with the tokenizer the caller gives."""
    import torch
    from transformers import AutoTokenizer

    from causalab_mini import StandardizedTransformer
    from causalab_mini.tools.tiny import resolve_model_spec

    model_type, family, path, _ = TRACED[0]
    whole = _whole(model_type, family)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_spec(f"tiny:{model_type}"))
    model = StandardizedTransformer(whole, tokenizer=tokenizer)
    assert model._model is whole.get_submodule(path)
    batch = _batch(model)
    with model.trace(**batch):
        logits = model.logits.save()
    with torch.no_grad():
        torch.testing.assert_close(logits, model._model(**batch).logits)
