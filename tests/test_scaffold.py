"""`registry new-family`: a family the registry does not have, scaffolded in one command,
lints clean, and its verified rows pass the identities through the runtime."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from ruamel.yaml import YAML

from causalab_mini.address import Address, RenameConfig
from causalab_mini.codegen.lint import lint
from causalab_mini.generated import DEFAULT_ADDRESSES, FAMILIES
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools import scaffold as s
from causalab_mini.tools.cli import main

pytestmark = pytest.mark.slow


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def load_yaml(text: str) -> Any:
    return YAML(typ="safe", pure=True).load(text)


@pytest.fixture(scope="session")
def found() -> Callable[[str], s.Scaffold]:
    """``found(spec)``: the scaffold of ``spec``, made once per session (tests copy
    before they change one)."""
    made: dict[str, s.Scaffold] = {}

    def get(spec: str) -> s.Scaffold:
        if spec not in made:
            made[spec] = s.scaffold(spec)
        return made[spec]

    return get


def _typed_rows(registry_root: Path, family: str) -> tuple[dict[str, Address], dict[str, Any]]:
    """The rows and containers a family file in ``registry_root`` gives, as the
    generated tables would (replace() on the defaults)."""
    registry, diags = lint(registry_root)
    assert not diags, diags
    fam = next(f for f in registry.families if f.name == family)
    rows = {
        name: dataclasses.replace(DEFAULT_ADDRESSES[name], **dict(fields))
        for name, fields in fam.overrides
    }
    return rows, dict(fam.rename)


def _structure(registry_root: Path, model_type: str) -> str:
    registry, _ = lint(registry_root)
    return next(r.structure for r in registry.rules if model_type in r.match.model_types)


def _prove(spec: str, registry_root: Path, family: str, model_type: str) -> list[c.CheckResult]:
    """Load the model with the written rows and run certify over them."""
    rows, rename = _typed_rows(registry_root, family)
    config = RenameConfig.of(**rename, addresses={**DEFAULT_ADDRESSES, **rows})
    model = StandardizedTransformer(spec, rename_config=config, enable_attention_probs=True)
    s.force_structure(model, _structure(registry_root, model_type))
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs)
    checks = c.identities(model, values)
    assert checks, "the identities ran"
    checks += c.hidden_state_oracle(model, inputs, values)
    checks += c.attention_oracle(model, inputs)
    write = c.write_reaches_stream(model, inputs)
    assert write is not None
    return [*checks, write]


# families of transformers that no family file covers, one per structure they show;
# glm4's norms have names no structural candidate lists (found by what reads them)
NEW = {
    "glm4": (
        "tiny:glm4",
        "sandwich_norm",
        {
            "attentions_output": {"module": "post_self_attn_layernorm", "select": None},
            "layers_mid": {"module": "post_attention_layernorm"},
            "mlps_norm_output": {"module": "post_attention_layernorm"},
            "mlps_output": {"module": "post_mlp_layernorm", "select": None},
        },
        # a fused gate_up_proj: what the down projection reads is act(gate) * up with
        # `up` a slice of one module's output, so no module is the activation's check
        {"mlps_activation"},
    ),
    "phi3": ("tiny:phi3", "pre_norm", {}, {"mlps_activation"}),  # fused gate_up_proj too
    "cohere": ("tiny:cohere", "parallel", {}, set()),
}


@pytest.mark.parametrize("model_type", sorted(NEW))
def test_one_command_adds_a_family_that_lints_clean_and_proves(
    model_type: str, package_registry_copy: Path
) -> None:
    spec, structure, rows, decide = NEW[model_type]
    family = f"new_{model_type}"  # a name no family file has, whatever the registry holds
    had_rule = any(model_type in r.match.model_types for r in lint(package_registry_copy)[0].rules)
    result = cli(
        "new-family", spec, "--registry", str(package_registry_copy), "--family", family, "--force"
    )
    assert result.exit_code == 0, result.output
    written = package_registry_copy / "families" / f"{family}.yaml"
    assert f"wrote {written}" in result.output
    assert f"block {structure} (verified)" in result.output.splitlines()[0]
    assert "registry lint: clean" in result.output
    text = written.read_text()
    assert text.startswith("# yaml-language-server: $schema=../../schema/family.schema.json\n")
    decided = {line.split(":")[0].split()[-1] for line in text.splitlines() if "# DECIDE " in line}
    assert decided == decide, decided
    assert "registry lint: clean" in result.output  # a choice left to a person is a comment
    data = load_yaml(text)
    assert data["family"] == family and data["match"]["model_types"] == [model_type]
    assert (data.get("addresses") or {}) == rows
    lines = text.splitlines()
    for row in rows:  # every written row says which check proved it
        block = lines[: lines.index(f"  {row}:")]
        assert any(line.startswith("  # verified: ") for line in block[-3:]), row
    rules = (package_registry_copy / "block_structures.yaml").read_text()
    added = f"  - structure: {structure}  # verified by `registry new-family {spec}`"
    if had_rule:  # the registry's rule (verified by the sweep) agrees with the scaffold
        assert added not in rules and "block_structures.yaml already gives this structure" in text
    else:
        assert added in rules and f"added a rule to {package_registry_copy}" in result.output
    assert _structure(package_registry_copy, model_type) == structure
    checks = _prove(spec, package_registry_copy, family, model_type)
    failed = [check for check in checks if not check.ok]
    assert not failed, failed


# families the registry has: the scaffold, run blind, finds the rows people wrote
KNOWN = [
    ("gemma2", "tiny:gemma2"),
    ("bloom", "tiny:bloom"),
    ("granite", "tiny:granite?residual_multiplier=0.37"),
    ("falcon", "tiny:falcon"),
    ("olmo2", "tiny:olmo2"),
    ("olmo2", "tiny:olmo3"),
]


@pytest.mark.parametrize(("family", "spec"), KNOWN)
def test_blind_scaffold_reproduces_the_registry_rows(
    family: str, spec: str, found: Callable[[str], s.Scaffold]
) -> None:
    sc = found(spec)
    assert sc.structure == sc.existing_rule
    theirs = dict(FAMILIES[family].addresses)
    ours = s.rows_for(sc.verdicts)
    # what a scaffold can find on one instance (not refusals under other configs)
    found_fields = ("module", "io", "select", "scale", "snapshot", "source")

    def fields(row: Address) -> tuple[Any, ...]:
        return tuple(getattr(row, f) for f in found_fields)

    differ = {n for n, row in ours.items() if fields(row) != fields(DEFAULT_ADDRESSES[n])}
    assert differ, "the family differs from the defaults somewhere"
    for name in differ:
        assert name in theirs and fields(theirs[name]) == fields(ours[name]), name
    for name, row in theirs.items():
        if name in ours and fields(row) != fields(DEFAULT_ADDRESSES[name]):
            verdict = sc.verdicts[name]  # a structural default resolves to a module
            resolved = (
                verdict.chosen.module if verdict.status == "default" and verdict.chosen else None
            )
            assert (resolved or ours[name].module, *fields(ours[name])[1:]) == fields(row), name
    assert not sc.failures


def test_structures_are_told_apart_with_reasons(found: Callable[[str], s.Scaffold]) -> None:
    sc = found("tiny:phi3")
    trials = {t.name: t for t in sc.trials}
    assert trials["pre_norm"].passed and not trials["pre_norm"].ruled_out
    # a parallel identity holds on a pre-norm block; its own claim (no mid-stream) does not
    assert trials["parallel"].passed
    assert trials["parallel"].ruled_out.startswith("it has no layers_mid, yet layers_mid ==")
    assert trials["residual_inside"].ruled_out == (
        "neither sublayer module returns the stream itself"
    )
    assert not trials["sandwich_norm"].passed and "holds for no candidate" in (
        trials["sandwich_norm"].evidence
    )
    bloom = {t.name: t for t in found("tiny:bloom").trials}
    assert "return the stream itself" in str(bloom["sandwich_norm"].ruled_out)


def test_undecided_places_are_comments_and_lint_says_what_is_missing(
    package_registry_copy: Path, found: Callable[[str], s.Scaffold]
) -> None:
    sc = dataclasses.replace(found("tiny:phi3"), family="zeta", model_type="zeta", structure=None)
    sc.structure_evidence = "several structures pass and none is ruled out: a, b"
    verdicts = dict(sc.verdicts)
    verdicts["attentions_output"] = s.Verdict(
        "attentions_output",
        "ambiguous",
        "layers_mid == layers_input + attentions_output on layers 0-2",
        choices=[s.Candidate("self_attn.dense", "output"), s.Candidate("self_attn.drop", "output")],
    )
    verdicts["mlps_activation"] = s.Verdict("mlps_activation", "missing", "nothing passes")
    sc.verdicts = verdicts
    written = s.write_scaffold(sc, registry_dir=package_registry_copy, out=None, force=False)
    assert written.rule_file is None  # no structure, no rule
    text = written.text
    assert "# DECIDE the block structure: several structures pass" in text
    assert "  # DECIDE attentions_output: 2 candidates pass" in text
    assert "  # attentions_output:\n  #   module: self_attn.dense\n  #   select: null\n" in text
    assert "  # DECIDE mlps_activation: no candidate passes (nothing passes)." in text
    data = load_yaml(text)
    assert "addresses" not in data  # nothing undecided is a row
    _, diags = lint(package_registry_copy)
    assert [(d.code, d.row) for d in diags] == [("X014", "zeta")]
    # a person decides: the first choice, and the refusal stub, uncommented as written
    lines = text.splitlines()
    start = lines.index("  # attentions_output:")
    chosen = [line.replace("  # ", "  ", 1) for line in lines[start : start + 3]]
    stub = lines.index("  #   unavailable:") - 1
    refusal = [line.replace("  # ", "  ", 1) for line in lines[stub : stub + 6]]
    refusal[-1] = refusal[-1].replace("<why>", "its MLP has no separate activation")
    decided = "\n".join([text, "addresses:", *chosen, *refusal]) + "\n"
    assert written.family_file is not None
    written.family_file.write_text(decided)
    data = load_yaml(decided)
    assert data["addresses"]["attentions_output"] == {"module": "self_attn.dense", "select": None}
    assert data["addresses"]["mlps_activation"]["unavailable"][0]["when"] == "always"
    _, diags = lint(package_registry_copy)
    assert [(d.code, d.row) for d in diags] == [("X014", "zeta")]


def test_out_dash_prints_the_file_and_json_says_everything() -> None:
    result = cli("new-family", "tiny:cohere", "--out", "-", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    text = report["written"]["text"]
    data = load_yaml(text)
    assert data["family"] == "cohere" and data["rename"]["layers_name"] == "model.layers"
    assert (  # the rule to add, or the registry's agreeing one
        "#  - structure: parallel  # verified by `registry new-family tiny:cohere`" in text
        or "# block_structures.yaml already gives this structure." in text
    )
    assert report["block_structure"] == "parallel"
    assert report["written"]["family_file"] is None
    places = {p["place"]: p for p in report["places"]}
    assert places["layers_mid"]["status"] == "refused"
    assert "its block is 'parallel'" in places["layers_mid"]["evidence"]
    assert places["attentions_output"]["check"] == (
        "layers_output == layers_input + attentions_output + mlps_output"
    )


def test_refuses_to_overwrite_or_to_shadow_a_family(package_registry_copy: Path) -> None:
    result = cli("new-family", "tiny:gemma2", "--registry", str(package_registry_copy))
    assert result.exit_code == 1
    assert "exists; pass --force" in result.output
    result = cli(
        "new-family", "tiny:gemma2", "--registry", str(package_registry_copy), "--family", "g2"
    )
    assert result.exit_code == 1
    assert "already has family gemma2 for model type 'gemma2'" in result.output


def test_a_checkpoint_directory_keeps_its_structural_config(tmp_path: Path) -> None:
    from causalab_mini.tools.tiny import build_tiny

    path = build_tiny("gpt_neox", overrides={"use_parallel_residual": False})
    assert s.resolve_spec(str(path)) == ("tiny:gpt_neox?use_parallel_residual=false", "gpt_neox")
    assert s.resolve_spec("starcoder2") == ("tiny:starcoder2", "starcoder2")
    with pytest.raises(s.ScaffoldError, match="no model hub is reachable"):
        s.resolve_spec("bigcode/starcoder2-3b")
