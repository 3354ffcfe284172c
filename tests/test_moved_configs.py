"""The moved tiny build (``tiny:<model_type>?build=moved``, registry/tiny.yaml
``moved``) and what it found (issue 33).

The default tiny build leaves multipliers at 1, soft-caps off, heads x head size equal
to the hidden size and every norm the identity, so a constant factor, a width mix-up
or a norm applied twice passes every identity. The moved build moves those fields
(found by name, not listed per family) and draws the norms away from identity; each
test here fails on what the default build cannot see."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from causalab_mini.components import ComponentError, Plan, locate
from causalab_mini.internals import child
from causalab_mini.tools import certify as cert
from causalab_mini.tools.tiny import TINY_MOVED, draw_norms, moved_fields, resolve_model_spec

MOVED = "?build=moved"


def _manifest(spec: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (Path(resolve_model_spec(spec)) / "tiny_build.json").read_text()
    )
    return data


# ------------------------------------------------------------ the moved fields


def test_fields_are_found_by_their_names_on_any_config() -> None:
    """The rules are name patterns: a config class nobody listed has its multipliers,
    caps, head size, epsilons and expert widths moved, each away from its value, the
    factors apart from each other; a list of factors element by element; a nested
    config's fields too; names the exclude pattern finds, and flags, stay."""
    from transformers import PretrainedConfig

    class Inner(PretrainedConfig):
        def __init__(self, softmax_scale: float | None = None, **kw: Any) -> None:
            self.softmax_scale = softmax_scale
            super().__init__(**kw)

    class Made(PretrainedConfig):
        def __init__(self, **kw: Any) -> None:
            self.residual_multiplier = 1.0
            self.embedding_multiplier = 1.0
            self.mlp_multipliers = [1.0, 1.0]
            self.attn_logit_softcapping = None
            self.head_dim = 16
            self.rms_norm_eps = 1e-6
            self.moe_intermediate_size = 32
            self.shared_expert_intermediate_size = 32
            self.rotary_scaling_factor = 2.0  # excluded by name
            self.tie_word_embeddings = True
            self.scale_attn_weights = True  # excluded by name
            self.initializer_range = 0.02  # no rule
            self.attn_config = Inner()
            super().__init__(**kw)

    found = {m.path: m for m in moved_fields(Made())}
    assert set(found) == {
        "residual_multiplier",
        "embedding_multiplier",
        "mlp_multipliers",
        "attn_logit_softcapping",
        "head_dim",
        "rms_norm_eps",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "attn_config.softmax_scale",
        "tie_word_embeddings",
    }, sorted(found)
    assert all(m.new != m.old for m in found.values())
    factors = [found["residual_multiplier"].new, found["embedding_multiplier"].new]
    assert len(set(factors)) == 2 and 1.0 not in factors
    gate, down = found["mlp_multipliers"].new
    assert gate != down and 1.0 not in (gate, down)
    assert found["head_dim"].new * 4 != 64  # heads x head size apart from the width
    widths = {found[k].new for k in ("moe_intermediate_size", "shared_expert_intermediate_size")}
    assert len(widths) == 2 and 32 not in widths
    assert found["attn_logit_softcapping"].old is None
    assert found["attn_config.softmax_scale"].new is not None


def test_norms_are_drawn_away_from_identity_the_same_way_each_time() -> None:
    def made() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))

    first, second = made(), made()
    linear_before = first[0].weight.detach().clone()
    assert draw_norms(first) == 2  # the LayerNorm's weight and bias
    draw_norms(second)
    norm = first[1]
    assert float((norm.weight - 1).abs().min()) > 0 and float(norm.bias.abs().min()) > 0
    assert abs(float(norm.weight.std()) - TINY_MOVED["norms"]["weight_std"]) < 0.3
    assert torch.equal(first[0].weight, linear_before)  # not a norm: untouched
    assert torch.equal(norm.weight, second[1].weight) and torch.equal(norm.bias, second[1].bias)


def test_the_build_records_what_moved_and_what_changes_nothing() -> None:
    """Gemma-3's config states attn_logit_softcapping, which its forward never
    applies: the moved build finds it changes no logit; its final soft-cap does."""
    manifest = _manifest(f"tiny:gemma3_text{MOVED}")
    assert manifest["build"] == "moved"
    assert {"attn_logit_softcapping", "final_logit_softcapping", "head_dim"} <= set(
        manifest["moved"]
    )
    assert "attn_logit_softcapping" in manifest["no_effect"]
    assert "final_logit_softcapping" not in manifest["no_effect"]
    assert manifest["norms_drawn"] > 0


def test_an_unknown_build_is_refused_with_the_spelling() -> None:
    from causalab_mini.tools.tiny import TinyBuildError

    with pytest.raises(TinyBuildError, match=r"tiny:llama\?build=moved"):
        resolve_model_spec("tiny:llama?build=shifted")


# ------------------------------------------------------------------- X-MOD lens


def _lens_and_logits(model: Any) -> tuple[Any, Any, Any]:
    last = model.internals.num_layers - 1
    with model.trace(cert.sample_inputs(model)):  # side inputs where a forward needs them
        hidden = model.layers_output[last].save()
        lens = model.lens(hidden).save()
        logits = model.logits.save()
    return hidden, lens, logits


def test_xmod_lens_is_the_head_alone_once_norms_are_not_identity(
    tiny_model: Callable[..., Any],
) -> None:
    """X-MOD's LM head applies its layer norm itself: the lens that normalizes first
    and then calls the head normalizes twice, which the default build (the last
    layer's LayerNorm at weight 1, bias 0) cannot tell apart."""
    default, moved = tiny_model("tiny:xmod"), tiny_model(f"tiny:xmod{MOVED}")
    errors = []
    for model in (default, moved):
        hidden, lens, logits = _lens_and_logits(model)
        assert torch.allclose(lens, logits, atol=1e-5, rtol=0), (lens - logits).abs().max()
        head = model.lm_head._module
        twice = head(model.ln_final._module(hidden))  # the lens that was the default
        errors.append(float((twice - logits).abs().max()))
    assert errors[0] < 1e-4 < 0.01 < errors[1], errors


@pytest.mark.parametrize(
    ("model_type", "field"),
    [
        pytest.param("t5gemma2", "final_logit_softcapping", marks=pytest.mark.wide),
        pytest.param("hyperclovax_vision_v2", "logits_scaling", marks=pytest.mark.wide),
        pytest.param("cohere_compass", "logit_scale", marks=pytest.mark.wide),
    ],
)
def test_the_lens_applies_the_factor_the_head_applies(
    model_type: str, field: str, tiny_model: Callable[..., Any]
) -> None:
    """A head that soft-caps or scales its logits by a config field left at its default
    (None, 1) on the default build: the lens rows apply it, so lens == logits on the
    moved build too, where the field moves (and the head without it is off)."""
    spec = f"tiny:{model_type}{MOVED}"
    assert field in _manifest(spec)["moved"]
    model = tiny_model(spec)
    hidden, lens, logits = _lens_and_logits(model)
    ok, detail = cert.close(lens, logits)
    assert ok, detail
    with torch.no_grad():
        bare = model.lm_head._module(model.ln_final._module(hidden))
    assert not cert.close(bare, logits)[0]


# ---------------------------------------------------------------- head sizes


@pytest.mark.parametrize(
    "model_type",
    [
        "cpmant",
        pytest.param("reformer", marks=pytest.mark.wide),
        pytest.param("switch_transformers", marks=pytest.mark.wide),
        pytest.param("udop", marks=pytest.mark.wide),
    ],
)
def test_a_family_states_its_head_size(model_type: str, tiny_model: Callable[..., Any]) -> None:
    """CPM-Ant (dim_head), Reformer (attention_head_size) and Switch Transformers (d_kv)
    state a head size apart
    from hidden / heads: attention_premix is heads x that wide, a head is that wide,
    and writing one head changes the output projection by that head's columns only
    (read before, write, read after)."""
    model = tiny_model(f"tiny:{model_type}{MOVED}")
    moved = _manifest(f"tiny:{model_type}{MOVED}")["moved"]
    keys = ("dim_head", "attention_head_size", "d_kv")
    size = next(v[1] for k, v in moved.items() if k.endswith(keys))
    whole, one = locate(model, "attention_premix", 0), locate(model, "attention_premix", 0, head=1)
    heads = whole.heads
    assert whole.width == heads * size != model.hidden_size and one.width == size
    out = locate(model, "attention_output", 0)
    inputs = cert.sample_inputs(model)
    before = Plan.of(reads=[whole, one, out]).run(model, inputs)
    assert torch.equal(before[one], before[whole][..., size : 2 * size])
    zeros = torch.zeros_like(before[one])
    after = Plan.of(reads=[whole, out], writes=[(one, zeros)]).run(model, inputs)
    assert float(before[one].abs().max()) > 0  # the read saved before keeps its value
    assert torch.equal(after[whole][..., size : 2 * size], zeros)
    proj = child(model.layers[0], whole.module)  # the tree walk the rows use
    cleared = before[whole].clone()
    cleared[..., size : 2 * size] = 0
    with torch.no_grad():
        expected = before[out] + proj._module(cleared) - proj._module(before[whole])
    assert not torch.allclose(after[out], before[out])
    ok, detail = cert.close(after[out], expected)  # relative to its largest magnitude
    assert ok, detail


# ------------------------------------------------------------ the certifier


@pytest.mark.parametrize(
    ("model_type", "field", "components"),
    [
        # scores soft-capped only where the attention call is given a cap
        ("gemma3_text", "attn_logit_softcapping", ["attention_query", "attention_key"]),
        # the MLP's down projection times its multiplier
        pytest.param("falcon_h1", "mlp_multipliers", ["mlp_neuron_output"], marks=pytest.mark.wide),
        # the hybrid layers read the word embeddings beside the stream: interchange at
        # block_input[0] is refused with that reason (at init scale it seemed to hold)
        pytest.param("zamba", "attention_head_dim", ["block_input"], marks=pytest.mark.wide),
        # q·kᵀ times attn_config.softmax_scale
        pytest.param(
            "mpt",
            "attn_config.softmax_scale",
            ["attention_query", "attention_key"],
            marks=pytest.mark.wide,
        ),
    ],
)
def test_the_certifier_recomputes_with_the_operands_the_forward_uses(
    model_type: str, field: str, components: list[str], certified: Callable[[str], Any]
) -> None:
    spec = f"tiny:{model_type}{MOVED}"
    assert field in _manifest(spec)["moved"]
    result = certified(spec)
    states = {k: (i["state"], i.get("reason")) for k, i in result.components.items()}
    assert result.outcome == "certified", result.reason
    for name in components:
        assert states[name][0] == "ok", (name, states[name])


def test_the_embeddings_oracle_is_the_table_the_decoder_stack_reads(
    tiny_model: Callable[..., Any],
) -> None:
    """Florence-2 wraps BART: its get_decoder() is the whole BART, whose
    get_input_embeddings() is the shared table. The moved build unties the text
    config's embeddings, and the shared, the encoder's and the decoder's tables are
    three: the place reads the decoder's (the one its layers are fed), and the oracle
    must be that one, not the shared table (on it the place was off by 0.604)."""
    from causalab_mini.tools.checks import input_embeddings

    spec = f"tiny:florence2{MOVED}"
    assert _manifest(spec)["moved"]["tie_word_embeddings"] == [True, False]
    model = tiny_model(spec)
    inputs = cert.sample_inputs(model)
    address = locate(model, "embeddings", None)
    read = Plan.of(reads=[address]).run(model, inputs)[address]  # the weights loaded
    hf, ids = model._model, inputs["input_ids"]
    shared = hf.get_decoder().get_input_embeddings()
    table = input_embeddings(hf)
    assert table is not shared
    with torch.no_grad():
        assert cert.close(read, table(ids))[0]
        assert not cert.close(read, shared(ids))[0]


# ------------------------------------------------------------ attention sinks


@pytest.mark.parametrize(
    "model_type", ["mimo_v2_flash", pytest.param("deepseek_v4", marks=pytest.mark.wide)]
)
def test_scores_of_an_attention_with_sinks_are_refused_with_the_reason(
    model_type: str, tiny_model: Callable[..., Any]
) -> None:
    """The softmax there reads the scores with the sink logits appended (and shifted
    by the row's maximum): attention_scores is refused at locate, before any trace,
    and the other interiors still locate and read."""
    model = tiny_model(f"tiny:{model_type}", probs=True)
    with pytest.raises(ComponentError, match="sink"):
        locate(model, "attention_scores", 0)
    query = locate(model, "attention_query", 0)
    out = Plan.of(reads=[query]).run(model, cert.sample_inputs(model))
    assert out[query].shape[-1] == query.width


# ------------------------------------------------------------ the two builds


def test_a_place_is_ok_only_where_it_holds_on_both_builds() -> None:
    from causalab_mini.tools.builds import build_of, combined, spec_for
    from causalab_mini.tools.sweep import Result

    assert (
        build_of(spec_for("llama", "moved")) == "moved" and spec_for("llama", "default") == "llama"
    )
    ok = {"state": "ok", "checks": ["a"]}
    default = Result(
        "llama",
        "certified",
        components={"x": ok, "y": ok, "z": {"state": "refused", "reason": "r"}},
    )
    moved = Result(
        "llama",
        "certified",
        components={"x": ok, "y": {"state": "broken", "reason": "off by 0.3"}, "z": ok},
        build={"moved": {"head_dim": [16, 24]}, "skipped": {}, "no_effect": []},
    )
    both = combined(default, moved)
    assert both.components["x"]["state"] == "ok"
    assert both.components["y"]["state"] == "broken"
    assert both.components["y"]["reason"] == "moved build: off by 0.3"
    assert (
        both.components["z"]["state"] == "refused"
        and "default build" in both.components["z"]["reason"]
    )
    assert both.build["outcomes"] == {"default": "certified", "moved": "certified"}
    assert both.build["moved"] == {"head_dim": [16, 24]}


def test_a_sweep_of_both_builds_writes_each_builds_report_and_the_joined_doc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``registry sweep --out PATH`` over both builds writes the default build's report at
    PATH and the moved build's beside it (as docs/coverage.json, docs/coverage-moved.json
    are kept), each with its own states; its --doc is the table of the two joined, the
    same as the one made from the combined results."""
    from causalab_mini.tools.builds import combined
    from causalab_mini.tools.sweep import Result, cli, coverage_markdown, joined_with_moved
    from causalab_mini.tools.sweep.report import write_report

    from .conftest import cli as run_cli

    ok = {"state": "ok", "checks": ["a"]}
    default = Result("llama", "certified", components={"x": ok, "y": ok}, group="causal_lm")
    moved = Result(
        "llama",
        "certified",
        components={"x": ok, "y": {"state": "broken", "reason": "off by 0.3"}},
        group="causal_lm",
        build={"moved": {"head_dim": [16, 24]}, "skipped": {}, "no_effect": []},
    )

    def fake(chosen: Any, jobs: Any, timeout: Any, progress: Any, builds: Any, per: Any) -> Any:
        assert chosen == ["llama"] and builds == ("default", "moved")
        per.update({"default": [default], "moved": [moved]})
        return [combined(default, moved)]

    monkeypatch.setattr(cli, "sweep", fake)
    out, doc = tmp_path / "cov.json", tmp_path / "cov.md"
    result = run_cli("sweep", "--only", "llama", "--out", str(out), "--doc", str(doc))
    assert result.exit_code == 0, result.output
    mine = json.loads(out.read_text())
    theirs = json.loads((tmp_path / "cov-moved.json").read_text())
    assert mine["results"][0]["components"]["y"] == ok and mine["results"][0]["build"] is None
    assert theirs["results"][0]["components"]["y"]["reason"] == "off by 0.3"
    joined = coverage_markdown(joined_with_moved(mine, theirs))
    write_report([combined(default, moved)], tmp_path / "both.json", mine["seconds"])
    assert doc.read_text() == joined
    assert joined == coverage_markdown(json.loads((tmp_path / "both.json").read_text()))
    assert "moved build: off by 0.3" in joined


def test_the_readme_figures_of_both_builds_are_the_reports() -> None:
    """README's "N of M hold on both builds" per group are docs/coverage.json joined
    with docs/coverage-moved.json (the moved build's sweep)."""
    import re

    from causalab_mini.tools.builds import holds
    from causalab_mini.tools.sweep import group_name, joined_with_moved

    repo = Path(__file__).resolve().parents[1]
    report = json.loads((repo / "docs" / "coverage.json").read_text())
    moved = json.loads((repo / "docs" / "coverage-moved.json").read_text())
    joined = [r for r in joined_with_moved(report, moved)["results"] if r.get("build")]
    found = re.findall(
        r"\*\*([a-z0-9_]+)\*\*\s+(\d+)\s+of\s+(\d+)\s+hold\s+on\s+both\s+builds",
        (repo / "README.md").read_text(),
    )
    assert len(found) == 4, found
    for group, held, swept in found:
        mine = [r for r in joined if group_name(r) == group]
        assert (int(held), int(swept)) == (sum(map(holds, mine)), len(mine)), group
