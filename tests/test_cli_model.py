"""`registry model SPEC`: every place as ok or refused, as text or JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from causalab_mini.cli import main
from causalab_mini.generated import DEFAULT_ADDRESSES

pytestmark = pytest.mark.slow


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_text_lists_every_place_in_forward_order() -> None:
    code, out = run("model", "tiny:gpt_neox")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(
        "tiny:gpt_neox via nnterp: GPTNeoXForCausalLM, 3 layers, block parallel"
    )
    assert "padding_side=left" in lines[0]
    names = [line.split()[0] for line in lines[1:]]
    assert names == list(DEFAULT_ADDRESSES)
    mid = next(line for line in lines if line.split()[0] == "layers_mid")
    assert " -- " in mid and "its block is 'parallel'" in mid
    premix = next(line for line in lines if line.split()[0] == "attentions_premix")
    assert " ok " in premix and "self_attn.dense.input" in premix


def test_json_and_layer() -> None:
    code, out = run("model", "tiny:deepseek_v3", "--layer", "1", "--json")
    assert code == 0
    data = json.loads(out[out.index("{") :])
    assert data["layer"] == 1 and data["block_structure"] == "pre_norm"
    by_name = {p["place"]: p for p in data["places"]}
    assert not by_name["mlps_activation"]["ok"]
    assert "mixture-of-experts" in by_name["mlps_activation"]["reason"]
    code, out = run("model", "tiny:deepseek_v3", "--layer", "0", "--json")
    places = {p["place"]: p for p in json.loads(out[out.index("{") :])["places"]}
    assert (
        places["mlps_activation"]["ok"]
        and places["mlps_activation"]["where"] == "mlp.act_fn.output"
    )


def test_strict_exits_1_on_a_refusal_and_eager_enables_probabilities() -> None:
    code, _ = run("model", "tiny:llama", "--strict")
    assert code == 1  # attention probabilities are refused without --eager
    code, out = run("model", "tiny:llama", "--strict", "--eager")
    assert code == 0, out


def test_bad_layer_and_unknown_type() -> None:
    code, out = run("model", "tiny:llama", "--layer", "7")
    assert code == 2 and "layers 0..2" in out
    code, out = run("model", "tiny:not_a_model")
    assert code == 1 and "cannot load tiny:not_a_model" in out
