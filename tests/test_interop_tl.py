"""TransformerLens hook names as places (causalab_mini.interop.transformer_lens): the
table generated from registry/transformer_lens.yaml, read on real models. The
comparison with TransformerLens itself needs it installed and runs in its own venv
(``nox -s transformer_lens``, tests/interop/tl_bridge.py); here the table is held to
the registry and to the tensors of this project."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from causalab_mini import Plan, StandardizedTransformer, locate
from causalab_mini.generated import COMPONENTS
from causalab_mini.generated.transformer_lens import TL_HOOKS
from causalab_mini.interop.transformer_lens import (
    HookNameRefused,
    hook_name_of,
    hook_table,
    place_of,
    split,
)

TEXT = ["The quick brown fox jumps"]


@pytest.fixture(scope="module")
def llama() -> Any:
    return StandardizedTransformer("tiny:llama")


@pytest.fixture(scope="module")
def gemma2() -> Any:
    return StandardizedTransformer("tiny:gemma2")


@pytest.fixture(scope="module")
def neox() -> Any:
    return StandardizedTransformer("tiny:gpt_neox")


def test_every_entry_names_a_component_or_a_refusal_with_its_nearest() -> None:
    for scope, hooks in TL_HOOKS.items():
        for name, entry in hooks.items():
            target = entry.get("component") or entry["nearest"]
            assert target in COMPONENTS, (scope, name)
            assert ("{layer}" in name) == COMPONENTS[target].per_layer, (scope, name)
            assert ("component" in entry) != ("refused" in entry), (scope, name)


def test_split_reads_the_layer_out_of_a_name() -> None:
    assert split("blocks.12.attn.hook_z") == ("blocks.{layer}.attn.hook_z", 12)
    assert split("ln_final.hook_out") == ("ln_final.hook_out", None)


@pytest.mark.parametrize("fixture", ["llama", "gemma2", "neox"])
def test_each_mapped_name_is_its_components_address(fixture: str, request: Any) -> None:
    model = request.getfixturevalue(fixture)
    served = 0
    for pattern, entry in hook_table(model).items():
        name = pattern.replace("{layer}", "1")
        if "refused" in entry:
            with pytest.raises(HookNameRefused, match=entry["nearest"]):
                place_of(model, name)
            continue
        layer = 1 if "{layer}" in pattern else None
        try:
            expected = locate(model, entry["component"], layer)
        except Exception:  # the model lacks the place: the hook is refused with its reason
            with pytest.raises(HookNameRefused, match=entry["component"]):
                place_of(model, name)
            continue
        assert place_of(model, name) == expected
        served += 1
    assert served >= 20


def test_the_meaning_follows_the_block(llama: Any, gemma2: Any, neox: Any) -> None:
    # pre-norm: the attention module's own output is its contribution
    assert place_of(llama, "blocks.1.attn.hook_out") == locate(llama, "attention_output", 1)
    # sandwich norm: before the post-norm it is not; the post-norm's output is
    with pytest.raises(HookNameRefused, match=r"gemma2 \(sandwich_norm\).*before the post"):
        place_of(gemma2, "blocks.1.attn.hook_out")
    assert place_of(gemma2, "blocks.1.ln1_post.hook_out") == locate(gemma2, "attention_output", 1)
    assert place_of(gemma2, "blocks.1.hook_attn_out") == locate(gemma2, "attention_output", 1)
    # parallel: no mid-stream
    with pytest.raises(HookNameRefused, match=r"parallel block.*nearest is block_input"):
        place_of(neox, "blocks.1.hook_resid_mid")


def test_a_family_row_wins_over_the_default() -> None:
    gpt2 = StandardizedTransformer("tiny:gpt2")
    assert place_of(gpt2, "blocks.0.attn.hook_q") == locate(gpt2, "attention_query", 0)
    llama = StandardizedTransformer("tiny:llama")
    with pytest.raises(HookNameRefused, match="before the rotary embedding"):
        place_of(llama, "blocks.0.attn.hook_q")


def test_a_model_types_row_wins_over_the_default(llama: Any) -> None:
    # multi-head latent attention: TransformerBridge's rotated query is the rotary part
    mla = StandardizedTransformer("tiny:deepseek_v3")
    with pytest.raises(HookNameRefused, match="rotary part of each head alone"):
        place_of(mla, "blocks.0.attn.hook_rot_q")
    assert place_of(llama, "blocks.0.attn.hook_rot_q") == locate(llama, "attention_query", 0)


def test_the_hooks_tensor_is_the_places(gemma2: Any) -> None:
    # two spellings of the sandwich block's MLP contribution, and the identity they obey
    a = place_of(gemma2, "blocks.1.hook_mlp_out")
    mid, out = (
        place_of(gemma2, "blocks.1.hook_resid_mid"),
        place_of(gemma2, "blocks.1.hook_resid_post"),
    )
    got = Plan.of(reads=[a, mid, out]).run(gemma2, TEXT)
    assert torch.allclose(got[mid] + got[a], got[out], atol=1e-5)


def test_refusals_say_what_the_tensor_is_and_what_to_write(llama: Any) -> None:
    with pytest.raises(HookNameRefused) as caught:
        place_of(llama, "blocks.1.ln2.hook_normalized")
    message = str(caught.value)
    assert "before the second norm's gain" in message
    assert "llama (pre_norm)" in message
    assert "locate(model, 'mlp_input_norm', 1)" in message
    with pytest.raises(HookNameRefused, match=r"Did you mean blocks\.1\.hook_resid_post"):
        place_of(llama, "blocks.1.hook_resid_pots")
    with pytest.raises(HookNameRefused, match="out of range"):
        place_of(llama, "blocks.99.hook_resid_post")


def test_hook_name_of_round_trips(llama: Any, gemma2: Any) -> None:
    for model in (llama, gemma2):
        named = 0
        for component, spec in COMPONENTS.items():
            layer = 1 if spec.per_layer else None
            try:
                address = locate(model, component, layer)
                name = hook_name_of(address, model)
            except Exception:  # a place with no hook name, or none on this model
                continue
            assert place_of(model, name) == address, name
            named += 1
        assert named >= 12
    assert hook_name_of(locate(llama, "block_output", 2)) == "blocks.2.hook_resid_post"
    assert hook_name_of(locate(llama, "attention_output", 0)) == "blocks.0.hook_attn_out"
    with pytest.raises(HookNameRefused, match="no hook whose tensor is input_ids"):
        hook_name_of(locate(llama, "input_ids"))


# ---------------------------------------------------------------------- documents


def _document(tmp_path: Any, site: str) -> Any:
    """documents/activation_patching.yaml with its site written as ``site`` (YAML)."""
    from causalab_mini.documents.source import load

    from .conftest import REPO

    text = (REPO / "documents" / "activation_patching.yaml").read_text(encoding="utf-8")
    old = "  stream:\n    component: block_input\n    layers: all\n"
    assert old in text
    path = tmp_path / "doc.yaml"
    path.write_text(text.replace(old, f"  stream:\n{site}"), encoding="utf-8")
    return load(path)


def test_a_documents_site_may_be_a_hook_name(tmp_path: Any, neox: Any) -> None:
    from causalab_mini.documents.experiment import resolve_sites
    from causalab_mini.documents.validate import hook_sites, static_issues

    source = _document(tmp_path, "    hook: blocks.1.hook_resid_mid\n")
    assert hook_sites(source) == []
    site = source.data["sites"]["stream"]
    assert (site["component"], site["layers"]) == ("block_mid", [1])
    assert static_issues(source)[0] == []
    _, issues = resolve_sites(source, neox)  # a parallel block has no mid-stream
    assert [i.code for i in issues] == ["D046"] and "parallel block" in issues[0].message


@pytest.mark.parametrize(
    ("site", "says"),
    [
        ("    hook: blocks.1.hook_resid_pots\n", "did you mean blocks.{layer}.hook_resid_post"),
        ("    hook: blocks.1.ln2.hook_normalized\n", "nearest is component 'mlp_input_norm'"),
        ("    hook: blocks.1.hook_resid_post\n    layers: all\n", "give one or the other"),
    ],
)
def test_a_hook_site_without_a_place_is_a_d019(tmp_path: Any, site: str, says: str) -> None:
    from causalab_mini.documents.validate import hook_sites

    issues = hook_sites(_document(tmp_path, site))
    assert [i.code for i in issues] == ["D019"] and says in issues[0].message
