"""`registry model SPEC`: every place as ok or refused, as text or JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from causalab_mini.generated import COMPONENTS, DEFAULT_ADDRESSES
from causalab_mini.tools.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_text_lists_every_component() -> None:
    code, out = run("model", "tiny:gpt_neox")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("tiny:gpt_neox via nnterp: 3 layers, padding_side=left")
    assert "block parallel" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == list(COMPONENTS)
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert " -- " in by_name["block_mid"] and "its block is 'parallel'" in by_name["block_mid"]
    assert "ok   width=64  op=attention_interface_" in by_name["attention_query"]
    assert "only under 'eager' attention, and this model runs 'sdpa'" in by_name["attention_scores"]
    assert 'attn_implementation="eager"' in by_name["attention_scores"]


def test_places_lists_every_row_in_forward_order() -> None:
    code, out = run("model", "tiny:gpt_neox", "--places")
    assert code == 0, out
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == list(DEFAULT_ADDRESSES)
    premix = next(line for line in lines if line.split()[0] == "attentions_premix")
    assert " ok " in premix and "self_attn.dense.input" in premix


def test_json_and_layer() -> None:
    code, out = run("model", "tiny:deepseek_v3", "--layer", "1", "--json")
    assert code == 0
    data = json.loads(out[out.index("{") :])
    assert data["layer"] == 1 and data["block_structure"] == "pre_norm"
    by_name = {p["name"]: p for p in data["components"]}
    assert not by_name["mlp_activation"]["ok"]
    assert "mixture-of-experts" in by_name["mlp_activation"]["reason"]
    code, out = run("model", "tiny:deepseek_v3", "--layer", "0", "--json", "--places")
    places = {p["name"]: p for p in json.loads(out[out.index("{") :])["places"]}
    assert (
        places["mlps_activation"]["ok"]
        and places["mlps_activation"]["where"] == "mlp.act_fn.output"
    )
    code, out = run("model", "tiny:deepseek_v3", "--json")
    whole = {p["name"]: p for p in json.loads(out[out.index("{") :])["components"]}
    assert whole["mlp_activation"]["reason"].startswith(
        "component 'mlp_activation' is available on layers [0] only; on layers [1, 2]"
    )


def test_strict_exits_1_on_a_refusal_and_eager_enables_probabilities() -> None:
    code, out = run("model", "tiny:llama", "--strict")
    assert code == 1  # attention probabilities are refused without --eager
    assert (
        "registry model --strict: 8 of 33 components refused on tiny:llama (every layer): "
        "attention_scores, attention_probs, shared_expert_output, router_logits, "
        "router_weights, router_indices, expert_output, mlp_pre"
    ) in out
    code, out = run("model", "tiny:llama", "--strict", "--eager")
    # a gated MLP has no single input projection, a dense one no router: those stay
    # refused, with their reasons
    assert code == 1, out
    assert (
        "6 of 33 components refused on tiny:llama (every layer): shared_expert_output, "
        "router_logits, router_weights, router_indices, expert_output, mlp_pre"
    ) in out


def test_bad_layer_and_unknown_type() -> None:
    code, out = run("model", "tiny:llama", "--layer", "7")
    assert code == 2 and "layers 0..2" in out
    code, out = run("model", "tiny:not_a_model")
    assert code == 1 and "cannot load tiny:not_a_model" in out


def test_a_negative_layer_says_which_layer_it_answered_for() -> None:
    code, out = run("model", "tiny:llama", "--layer", "-1")
    assert code == 0, out
    assert out.splitlines()[0].endswith("answered for layer 2 (--layer -1 counts from the end)")
    code, out = run("model", "tiny:llama", "--layer", "-1", "--json")
    data = json.loads(out[out.index("{") :])
    assert data["layer"] == 2 and data["answered_for"].startswith("layer 2 ")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("/nonexistent/dir", "the directory '/nonexistent/dir' does not exist"),
        ("README.md", "'README.md' is a file; give the checkpoint's directory"),
        ("tests", "holds no config.json"),
        (
            "tiny:llama?hidden_size=abc",
            "config override hidden_size=abc for tiny 'llama': hidden_size takes an integer, "
            "and 'abc' is not one (it is 64 by default); write e.g. tiny:llama?hidden_size=64",
        ),
    ],
)
def test_a_spec_that_names_nothing_says_so_in_one_line(spec: str, message: str) -> None:
    code, out = run("model", spec)
    assert code == 1
    assert message in out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1


def test_a_model_type_without_tiny_fails_fast_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub's own offline mode (HF_HUB_OFFLINE) answers at once, no retries, and a
    model type gets tiny:<model_type> suggested."""
    import time

    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    started = time.perf_counter()
    code, out = run("model", "llama")
    assert time.perf_counter() - started < 5
    assert code == 1
    assert "the hub's offline mode is on (HF_HUB_OFFLINE)" in out
    assert "write tiny:llama for a tiny random checkpoint" in out
