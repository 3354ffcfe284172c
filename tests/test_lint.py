"""One golden case per lint code: the exact message and its position."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from causalab_mini.address import IOType
from causalab_mini.codegen.diagnostics import CODES
from causalab_mini.codegen.lint import lint

from .conftest import cli, edit

# code -> (edits to the registry copy, the diagnostics expected, paths relative to it)
CASES: dict[str, tuple[list[tuple[str, str | None, str | bytes | None]], list[str]]] = {
    "F001": (
        [("components.yaml", None, None)],
        [
            "components.yaml:1:1: F001 [-] components.yaml is missing from the registry; every registry holds places.yaml, block_structures.yaml, structural.yaml, interiors.yaml, components.yaml (copy it from the package's registry/)",
        ],
    ),
    "F002": (
        [("extra.yaml", None, "a: 1\n")],
        [
            "extra.yaml:1:1: F002 [-] extra.yaml is not a registry file; the registry holds places.yaml, block_structures.yaml, structural.yaml, interiors.yaml, components.yaml and families/*.yaml. Move or rename it",
        ],
    ),
    "F003": (
        [("families/bad.yaml", None, b"\xff\xfe not utf-8")],
        [
            "families/bad.yaml:1:1: F003 [-] cannot read the file: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte",
        ],
    ),
    "Y001": (
        [("places.yaml", "places:\n", "places: [\n")],
        [
            "places.yaml:37:3: Y001 [-] YAML syntax error: expected the node content, but found '-'",
        ],
    ),
    "Y002": (
        [("families/llama.yaml", "family: llama", "family: !!python/object:os.system llama")],
        [
            "families/llama.yaml:7:9: Y002 [-] the tag '!!python/object:os.system' is not allowed: registry files hold plain strings, numbers, booleans, null, lists and mappings. Remove the tag.",
        ],
    ),
    "Y003": (
        [("families/llama.yaml", "doc: Llama and", "doc: x\ndoc: Llama and")],
        [
            "families/llama.yaml:9:1: Y003 [-] the key 'doc' appears twice in this mapping; keep one",
        ],
    ),
    "Y004": (
        [
            (
                "families/deep.yaml",
                None,
                "a: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
            )
        ],
        [
            "families/deep.yaml:1:68: Y004 [-] nesting deeper than 64 levels; flatten the file",
        ],
    ),
    "Y005": (
        [("families/llama.yaml", "family: llama", "family: llama\ntrue: 1")],
        [
            "families/llama.yaml:8:1: Y005 [-] the key 'true' is read as bool; quote it to make it a string",
        ],
    ),
    "S001": (
        [("places.yaml", "  - name: layers_input\n", "  - name: layers_input\n    bogus: 1\n")],
        [
            "places.yaml:52:5: S001 [layers_input] unknown key 'bogus' in the row; allowed here: before_layers, doc, flat_tokens, heads_through, io, layer_list, leading_positions, merged_heads, module, name, order, per_layer, read_only, replaces_accessor, routing, scale, select, seq_first, snapshot, source, spelled, streams, trailing_streams, unavailable, versions, write",
        ],
    ),
    "S002": (
        [("places.yaml", "    doc: The residual stream entering the block.\n", "")],
        [
            "places.yaml:51:5: S002 [layers_input] the row lacks the required key 'doc'; add it",
        ],
    ),
    "S003": (
        [("places.yaml", "    order: 0\n", "    order: zero\n")],
        [
            "places.yaml:55:12: S003 [layers_input] order must be a number, not str ('zero')",
        ],
    ),
    "S004": (
        [("places.yaml", "    io: module\n    order: 8", "    io: sideways\n    order: 8")],
        [
            "places.yaml:66:9: S004 [attentions] io: 'sideways' is not one of 'input', 'output', 'module'",
        ],
    ),
    "S005": (
        [("places.yaml", "schema_version: 1", "schema_version: 2")],
        [
            "places.yaml:35:17: S005 [-] schema_version is 2; this tool reads version 1. Write schema_version: 1 and the fields of that version",
        ],
    ),
    "X001": (
        [("places.yaml", "  - name: attentions\n", "  - name: layers_input\n")],
        [
            "families/dbrx.yaml:22:3: X017 [dbrx:attentions] 'attentions' is not a default place: did you mean 'attentions_input'? A row here replaces a default place of the same name; to add a place of the family's own, say 'add: true' and give module, io, order and doc",
            "interiors.yaml:29:13: X007 [attention_query] within names 'attentions', which is not a module row of places.yaml (a row with io: module, such as attentions)",
            "interiors.yaml:37:13: X007 [attention_key] within names 'attentions', which is not a module row of places.yaml (a row with io: module, such as attentions)",
            "interiors.yaml:45:13: X007 [attention_scores] within names 'attentions', which is not a module row of places.yaml (a row with io: module, such as attentions)",
            "interiors.yaml:54:13: X007 [attention_z] within names 'attentions', which is not a module row of places.yaml (a row with io: module, such as attentions)",
            "places.yaml:63:11: X001 [layers_input] a row named 'layers_input' is already defined above; rename one",
        ],
    ),
    "X002": (
        [("interiors.yaml", "    order: 12\n", "    order: 20\n")],
        [
            "interiors.yaml:40:12: X002 [attention_key] order 20 is already taken by 'attention_probabilities' inside a layer; interiors go in the gaps the rows leave",
        ],
    ),
    "X003": (
        [("structural.yaml", "    post_norm: {candidates: [mlp]}\n", "")],
        [
            "structural.yaml:34:3: X003 [layers_mid] structure 'post_norm' has neither candidates nor a reason for layers_mid; add 'post_norm: {candidates: [...]}' or 'post_norm: {reason: ...}'",
        ],
    ),
    "X004": (
        [
            (
                "interiors.yaml",
                'needles: ["attention_interface("]\n    take: {arg: 2}',
                'needles: ["attention_interface"]\n    take: {arg: 2}',
            )
        ],
        [
            "interiors.yaml:38:15: X004 [attention_key] needle 'attention_interface' is not call-shaped: write the callable as it is called in the source, ending in '(' (e.g. 'attention_interface('), so an assignment that shares the name is not matched",
        ],
    ),
    "X005": (
        [
            (
                "families/olmo2.yaml",
                "  mlps_output:\n",
                "  olmo_gate:\n    add: true\n    doc: A gate.\n    module: mlp\n  mlps_output:\n",
            )
        ],
        [
            "families/olmo2.yaml:24:3: X005 [olmo2:olmo_gate] 'add: true' makes 'olmo_gate' a new place, which must give io, order; or replace one of: embeddings_input, embeddings_output, layers_input, attentions_norm_output, attentions, attentions_input, attention_probabilities, attentions_premix, attentions_output, layers_mid, mlps_norm_output, mlps, mlps_input, mlps_activation, mlps_neurons, mlps_output, layers_output, ln_final_output, lm_head_output, logits",
        ],
    ),
    "X006": (
        [
            (
                "families/gpt2.yaml",
                '    versions: {transformers: ">=5.0"}',
                '    versions: {transformers: "five or later"}',
            )
        ],
        [
            "families/gpt2.yaml:39:30: X006 [gpt2:attention_probabilities] version range 'five or later' for transformers does not parse; write a PEP 440 range such as '>=5.0,<6'",
        ],
    ),
    "X007": (
        [("block_structures.yaml", "  - structure: post_norm\n", "  - structure: postnorm\n")],
        [
            "block_structures.yaml:95:16: X007 [rules[9]] structure 'postnorm' is not defined; use one of pre_norm, sandwich_norm, post_norm, parallel, residual_inside or define it under structures",
        ],
    ),
    "X008": (
        [("families/gemma2.yaml", "  mlps_output:\n", "  mlps_neurons:\n")],
        [
            "block_structures.yaml:93:5: X008 [rules[8]] gemma2, gemma3_text: the block is sandwich_norm, where the default mlps_output names a different tensor; a family file matching gemma2, gemma3_text must replace mlps_output (see families/gemma2.yaml)",
        ],
    ),
    "X009": (
        [("families/olmo2.yaml", "family: olmo2", "family: olmo")],
        [
            "families/olmo2.yaml:7:9: X009 [olmo] family 'olmo' is in olmo2.yaml; name the file olmo.yaml or write family: olmo2",
        ],
    ),
    "X010": (
        [
            (
                "families/gpt2.yaml",
                "{place} is not addressable on this GPT-2",
                "{row} is not addressable on this GPT-2",
            )
        ],
        [
            "families/gpt2.yaml:46:17: X010 [gpt2:attention_probabilities] the reason uses {row}; only {place} (the row's name) is filled in. Write the text itself instead",
        ],
    ),
    "X011": (
        [("places.yaml", "    order: 1001\n", "    order: 999\n")],
        [
            "places.yaml:172:12: X011 [lm_head_output] order 999 comes after 1000 in the file; rows are listed in forward order, so move the row or fix its order",
        ],
    ),
    "X012": (
        [
            (
                "structural.yaml",
                "  mlps_neurons:\n",
                "  mlps_output:\n    pre_norm: {candidates: [mlp]}\n  mlps_neurons:\n",
            )
        ],
        [
            "structural.yaml:66:3: X012 [mlps_output] row 'mlps_output' names a fixed module ('mlp'); write module: \"{name}\" in places.yaml or drop this entry",
        ],
    ),
    "X013": (
        [
            (
                "components.yaml",
                "name: block_mid, row: layers_mid, per_layer: true",
                "name: block_mid, row: layers_mid, per_layer: false",
            )
        ],
        [
            "components.yaml:44:51: X013 [block_mid] per_layer is False but layers_mid is per layer; the component table is what to fix",
        ],
    ),
    "X014": (
        [
            (
                "families/zeta.yaml",
                None,
                "schema_version: 1\nfamily: zeta\ndoc: A family no rule covers.\nmatch:\n  model_types: [zeta]\n",
            )
        ],
        [
            "families/zeta.yaml:5:16: X014 [zeta] no rule in block_structures.yaml gives zeta a block structure, so every structural place is refused on it; add a rule (`registry new-family <model_type>` verifies which structure holds)",
        ],
    ),
    "X015": (
        [
            (
                "families/zeta.yaml",
                None,
                "schema_version: 1\nfamily: zeta\ndoc: A family without a final norm.\n"
                "match:\n  model_types: [llama]\nrename:\n  ignore_ln_final: true\n",
            )
        ],
        [
            "families/zeta.yaml:7:20: X015 [zeta] ignore_ln_final says the model has no final norm, so ln_final_output must be refused: give it 'unavailable: [{when: always, reason: ...}]' under addresses, naming what to read instead",
        ],
    ),
    "X017": (
        [
            (
                "families/olmo2.yaml",
                "  attentions_output:\n",
                "  attentions_outptu:\n    io: output\n    order: 30\n",
            ),
            (
                "families/gpt2.yaml",
                "  attention_probabilities:\n",
                "  attention_probabilities:\n    add: true\n",
            ),
        ],
        [
            "block_structures.yaml:95:5: X008 [rules[9]] olmo2: the block is post_norm, where the default attentions_output names a different tensor; a family file matching olmo2 must replace attentions_output (see families/gemma2.yaml)",
            "families/gpt2.yaml:37:3: X017 [gpt2:attention_probabilities] 'attention_probabilities' is a default place, so this row replaces it field by field; drop 'add: true' (or give the new place a name of its own)",
            "families/olmo2.yaml:20:3: X017 [olmo2:attentions_outptu] 'attentions_outptu' is not a default place: did you mean 'attentions_output'? A row here replaces a default place of the same name; to add a place of the family's own, say 'add: true' and give module, io, order and doc",
        ],
    ),
    "X018": (
        [
            (
                "tiny.yaml",
                None,
                "schema_version: 1\n"
                "sizes: {hidden: 64, heads: 4, kv_heads: 3, head_dim: 16, intermediate: 128,\n"
                "  layers: 3, vocab: 512, reserved_ids: 16, max_positions: 128, experts: 4,\n"
                "  experts_per_token: 2, expert_intermediate: 32, pad_id: 0, bos_id: 1, eos_id: 2}\n"
                "generic: {hidden_size: 64}\nkeep_off: []\noverrides: {}\nnot_buildable: {}\n"
                "vision_extra: {}\n",
            )
        ],
        [
            "tiny.yaml:2:41: X018 [sizes] heads (4) is not a multiple of kv_heads (3): grouped-query attention shares each key/value head among a whole number of query heads; pick a divisor of heads",
        ],
    ),
    "X019": (
        [
            (
                "block_structures.yaml",
                "      - layers_output == layers_input + attentions_output + mlps_output\n",
                "      - layers_output == layers_input + attention_output + mlps_output\n"
                "      - layers_output - layers_input == mlps_output\n",
            )
        ],
        [
            "block_structures.yaml:58:9: X019 [parallel] identity 'layers_output == layers_input + attention_output + mlps_output' names 'attention_output', which no parallel block has (a default row of places.yaml or a row under parallel's places): fix the name, or declare the row",
            "block_structures.yaml:59:9: X019 [parallel] identity 'layers_output - layers_input == mlps_output' is not of the form 'a == b + c'; see the file's header",
        ],
    ),
    "X020": (
        [
            (
                "tiny.yaml",
                None,
                "schema_version: 1\n"
                "sizes: {hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 128,\n"
                "  layers: 3, vocab: 512, reserved_ids: 16, max_positions: 128, experts: 4,\n"
                "  experts_per_token: 2, expert_intermediate: 32, pad_id: 0, bos_id: 1, eos_id: 2}\n"
                "generic: {hidden_size: 64}\nkeep_off: []\noverrides: {}\n"
                "not_buildable: {drafty: a drafter written for this test only}\n"
                "side_inputs:\n"
                "  drafty:\n"
                "    states: {why: the target's states, shape: [batch, seq, {config: hidden_size}]}\n"
                "  drafter:\n"
                "    kv:\n"
                "      why: the target's keys, per layer type\n"
                "      shape: [batch, {config: per_layer_config.@layer.head_dim}]\n"
                "vision_extra: {}\n",
            )
        ],
        [
            "tiny.yaml:10:3: X020 [drafty] drafty has side inputs and is in not_buildable: a type the tiny builder refuses is never fed them; drop one of the two rows",
            "tiny.yaml:15:14: X020 [drafter] side input 'kv' reads 'per_layer_config.@layer.head_dim', whose @layer indexes the first layer of each layer type: only a shape under per_layer_type may use it (the per_layer_type path itself names the whole list)",
        ],
    ),
    "X021": (
        [
            (
                "tiny.yaml",
                None,
                "schema_version: 1\n"
                "sizes: {hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 128,\n"
                "  layers: 3, vocab: 512, reserved_ids: 16, max_positions: 128, experts: 4,\n"
                "  experts_per_token: 2, expert_intermediate: 32, pad_id: 0, bos_id: 1, eos_id: 2}\n"
                "generic: {hidden_size: 64}\nkeep_off: []\noverrides: {}\nnot_buildable: {}\n"
                "groups:\n"
                "  vlm:\n"
                "    doc: image-text-to-text wrappers\n"
                "    mapping: MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES\n"
                "    auto_class: AutoModelForImageTextToText\n"
                "  pictures:\n"
                "    doc: the same mapping again\n"
                "    mapping: MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES\n"
                "    auto_class: AutoModelForImageTextToText\n"
                "vision_extra: {}\n",
            )
        ],
        [
            "tiny.yaml:13:17: X021 [vlm] the first group (vlm) is built with AutoModelForImageTextToText: the first group is the causal LMs (AutoModelForCausalLM, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), whose model types every later group leaves to it; put that group first",
            "tiny.yaml:16:14: X021 [pictures] group pictures takes the model types of MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES, which group vlm already takes: a model type is in the first group whose mapping has it, so pictures would be empty; name another mapping or drop the group",
        ],
    ),
    "X022": (
        [
            (
                "families/zeta.yaml",
                None,
                "schema_version: 1\nfamily: zeta\ndoc: A family whose lens applies a layer's place.\n"
                "match:\n  model_types: [llama]\n"
                "lens:\n  steps:\n    - apply: layers_output\n",
            )
        ],
        [
            "families/zeta.yaml:8:14: X022 [zeta] the lens applies 'layers_output', which is not a whole-model row (a lens calls the module of a whole-model place: embeddings_input, embeddings_output, lm_head_output, ln_final_output, logits); name one of those",
        ],
    ),
    "X023": (
        [
            (
                "tiny.yaml",
                None,
                "schema_version: 1\n"
                "sizes: {hidden: 64, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 128,\n"
                "  layers: 3, vocab: 512, reserved_ids: 16, max_positions: 128, experts: 4,\n"
                "  experts_per_token: 2, expert_intermediate: 32, pad_id: 0, bos_id: 1, eos_id: 2}\n"
                "generic: {hidden_size: 64}\nkeep_off: []\noverrides: {}\nnot_buildable: {}\n"
                "vision_extra: {}\n"
                "tokenizer_default: {adds: bos}\n"
                "tokenizers:\n"
                "  gpt2: {adds: nothing}\n"
                "  pegasus: {adds: eos_bos}\n"
                "  qwen2: {adds: none, chat_template: chatml}\n"
                "chat_templates:\n"
                "  gemma: \"{% for message in messages %}{{ message['content'] }}{% endfor %}\"\n",
            )
        ],
        [
            "tiny.yaml:12:16: X023 [gpt2] adds 'nothing', which is not a kind of tiny tokenizer (did you mean 'none'?); write one of none (adds nothing), bos (a BOS token before the text), eos (an EOS token after it), bos_eos (both)",
            "tiny.yaml:13:19: X023 [pegasus] adds 'eos_bos', which is not a kind of tiny tokenizer (did you mean 'bos_eos'?); write one of none (adds nothing), bos (a BOS token before the text), eos (an EOS token after it), bos_eos (both)",
            "tiny.yaml:14:38: X023 [qwen2] chat_template 'chatml' is not a template of chat_templates (it holds: gemma); add it there or name one of those",
        ],
    ),
    "X016": (
        [
            (
                "families/zeta.yaml",
                None,
                "schema_version: 1\nfamily: zeta\ndoc: A family a rule covers.\n"
                "match:\n  model_types: [llama]\n"
                "structure_unknown_reason: '{place} is refused: no structure applies.'\n",
            )
        ],
        [
            "families/zeta.yaml:6:27: X016 [zeta] structure_unknown_reason says no block structure applies, and a rule in block_structures.yaml gives llama one; drop the reason or the rule",
        ],
    ),
    "X024": (
        [
            (
                "families/zeta.yaml",
                None,
                "schema_version: 1\nfamily: zeta\ndoc: A family that traces a submodule.\n"
                "match:\n  model_types: [zeta]\n"
                "rename:\n  traced_module: thinker\n  layers_name: thinker.model.layers\n",
            )
        ],
        [
            "families/zeta.yaml:7:18: X024 [zeta] traced_module without traced_config: a traced submodule is named by its path (traced_module) and its config's attribute of the checkpoint's config (traced_config); give both or neither",
            "families/zeta.yaml:8:16: X024 [zeta] the family traces the submodule 'thinker', whose own families give its containers and rows, and it names layers_name, which would not apply: move them to the family the submodule matches",
        ],
    ),
    "X025": (
        [
            (
                "transformer_lens.yaml",
                None,
                "schema_version: 1\nhooks:\n"
                "  - name: blocks.{layer}.hook_resid_post\n    component: block_outptu\n"
                "  - name: hook_embed\n    component: block_input\n"
                "  - name: blocks.{layer}.hook_resid_pre\n"
                '    aliases: ["blocks.{layer}.hook_resid_pre"]\n    component: block_input\n'
                "families:\n  zeta:\n    - name: ln_final.hook_out\n      component: ln_final\n",
            )
        ],
        [
            "transformer_lens.yaml:4:16: X025 [blocks.{layer}.hook_resid_post] component 'block_outptu' is no component of components.yaml: name one it has",
            "transformer_lens.yaml:5:11: X025 [hook_embed] 'hook_embed' names block_input, whose name has {layer} (it is per layer): fix the name",
            "transformer_lens.yaml:8:15: X025 [blocks.{layer}.hook_resid_pre] 'blocks.{layer}.hook_resid_pre' is given twice here; keep one",
            "transformer_lens.yaml:11:3: X025 [zeta] 'zeta' is no family of the registry (families/*.yaml): name one it has",
        ],
    ),
}


def _apply(root: Path, edits: list[tuple[str, str | None, str | bytes | None]]) -> None:
    for rel, old, new in edits:
        path = root / rel
        if old is None and new is None:
            path.unlink()
        elif old is None:
            assert new is not None
            path.write_bytes(new if isinstance(new, bytes) else new.encode())
        else:
            assert isinstance(new, str)
            edit(path, old, new)


def test_every_code_has_a_golden_case() -> None:
    assert sorted(CASES) == sorted(CODES)


def test_package_registry_and_fixture_are_clean() -> None:
    from .conftest import FIXTURE

    assert lint()[1] == []
    assert lint(FIXTURE)[1] == []


def test_a_family_that_says_why_no_structure_applies_needs_no_rule(registry_copy: Path) -> None:
    # X014's family, with the reason every structural place is refused for
    _apply(registry_copy, CASES["X014"][0])
    edit(
        registry_copy / "families/zeta.yaml",
        "  model_types: [zeta]\n",
        "  model_types: [zeta]\nstructure_unknown_reason: >-\n  {place} is refused: no structure applies.\n",
    )
    assert lint(registry_copy)[1] == []
    edit(registry_copy / "families/zeta.yaml", "{place} is refused", "{row} is refused")
    assert [d.code for d in lint(registry_copy)[1]] == ["X010"]


@pytest.mark.parametrize("code", sorted(CASES))
def test_golden(code: str, registry_copy: Path) -> None:
    edits, expected = CASES[code]
    _apply(registry_copy, edits)
    _, diags = lint(registry_copy)
    shown = [str(d).replace(f"{registry_copy}/", "") for d in diags]
    assert shown == expected
    assert code in {d.code for d in diags}


def test_cli_text_exit_codes(registry_copy: Path) -> None:
    assert cli("lint", "--registry", str(registry_copy)).exit_code == 0
    _apply(registry_copy, CASES["S003"][0] + CASES["X004"][0])
    result = cli("lint", "--registry", str(registry_copy))
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if ": S0" in line or ": X0" in line]
    assert [line.split(": ", 2)[1].split()[0] for line in lines] == ["X004", "S003"]
    assert "Traceback" not in result.output


def test_cli_json(registry_copy: Path) -> None:
    _apply(registry_copy, CASES["X010"][0])
    result = cli("lint", "--registry", str(registry_copy), "--format", "json")
    assert result.exit_code == 1
    (item,) = json.loads(result.output)
    assert item["code"] == "X010" and item["line"] == 46 and item["col"] == 17
    assert item["row"] == "gpt2:attention_probabilities"


def test_cli_usage_error_exits_2() -> None:
    assert cli("lint", "--format", "xml").exit_code == 2
    assert cli("no-such-command").exit_code == 2


def test_missing_registry_directory(tmp_path: Path) -> None:
    result = cli("lint", "--registry", str(tmp_path / "nope"))
    assert result.exit_code == 1
    assert "F001" in result.output and "does not exist" in result.output


def test_a_component_cannot_take_writes_its_row_refuses(package_registry_copy: Path) -> None:
    edit(
        package_registry_copy / "components.yaml",
        "width: vocab_size,\n     writable: false, why_read_only: \"the model's output",
        "width: vocab_size,\n     writable: true, why_read_only: \"the model's output",
    )
    diags = [d for d in lint(package_registry_copy)[1] if d.code == "X013"]
    assert [d.row for d in diags] == ["logits"]
    assert "writable is true but logits refuses writes (the model's own output" in diags[0].message


# A structure's own rows (block_structures.yaml, `places:` under a structure): the
# frozen fixture has none, so these cases add one to its parallel structure (and its
# structural entry) and break it. Existing codes, exact messages and positions.
_PARALLEL_ROW = (
    "      - layers_output == layers_input + attentions_output + mlps_output\n",
    "      - layers_output == layers_input + attentions_output + mlps_output\n"
    "    places:\n"
    "      - name: parallel_sum\n"
    "        doc: The sum of both sublayers' outputs before it is added.\n"
    '        module: "{name}"\n'
    "        io: input\n"
    "        order: 52\n",
)
_PARALLEL_ENTRY = (
    "    residual_inside: *down\n",
    "    residual_inside: *down\n\n  parallel_sum:\n    parallel: {candidates: [mlp.fc_out]}\n",
)

_RESIDUAL_INSIDE_ROW = (
    "      family file says (and the identities hold it to that).\n"
    "    identities:\n"
    "      - layers_mid == layers_input + attentions_output\n"
    "      - layers_output == layers_mid + mlps_output\n"
    "      - mlps_norm_output == mlps_input\n",
    "      family file says (and the identities hold it to that).\n"
    "    identities:\n"
    "      - layers_mid == layers_input + attentions_output\n"
    "      - layers_output == layers_mid + mlps_output\n"
    "      - mlps_norm_output == mlps_input\n"
    "    places:\n"
    "      - name: parallel_sum\n"
    "        doc: The sum of both sublayers' outputs before it is added.\n"
    '        module: "{name}"\n'
    "        io: input\n"
    "        order: 52\n",
)
_TWO_STRUCTURES_ENTRY = (
    _PARALLEL_ENTRY[0],
    _PARALLEL_ENTRY[1] + "    residual_inside: {candidates: [mlp.fc_out]}\n",
)

STRUCTURE_ROW_CASES: dict[
    str, tuple[list[tuple[str, str | None, str | bytes | None]], list[str]]
] = {
    "clean": (
        [("block_structures.yaml", *_PARALLEL_ROW), ("structural.yaml", *_PARALLEL_ENTRY)],
        [],
    ),
    "X001 default name": (
        [
            (
                "block_structures.yaml",
                _PARALLEL_ROW[0],
                _PARALLEL_ROW[1].replace("parallel_sum", "layers_mid"),
            ),
        ],
        [
            "block_structures.yaml:60:15: X001 [layers_mid] 'layers_mid' is a default row of places.yaml; a structure's row adds a place the defaults do not have: rename it, or replace the default row in a family file",
        ],
    ),
    "X002 default order": (
        [
            (
                "block_structures.yaml",
                _PARALLEL_ROW[0],
                _PARALLEL_ROW[1].replace("order: 52", "order: 50"),
            ),
            ("structural.yaml", *_PARALLEL_ENTRY),
        ],
        [
            "block_structures.yaml:64:16: X002 [parallel_sum] order 50 is already taken by 'mlps_output' (inside a layer); a structure's row goes in a gap the default rows leave",
        ],
    ),
    # a row several structures have: declared alike under each (a YAML alias does it)
    "clean, one row of two structures": (
        [
            ("block_structures.yaml", *_PARALLEL_ROW),
            ("block_structures.yaml", *_RESIDUAL_INSIDE_ROW),
            ("structural.yaml", *_TWO_STRUCTURES_ENTRY),
        ],
        [],
    ),
    "X001 one row declared unlike by two structures": (
        [
            ("block_structures.yaml", *_PARALLEL_ROW),
            (
                "block_structures.yaml",
                _RESIDUAL_INSIDE_ROW[0],
                _RESIDUAL_INSIDE_ROW[1].replace("order: 52", "order: 53"),
            ),
            ("structural.yaml", *_TWO_STRUCTURES_ENTRY),
        ],
        [
            "block_structures.yaml:76:15: X001 [parallel_sum] a row named 'parallel_sum' is already declared by structure 'parallel' with other fields; a row several structures have is declared alike by each (a YAML alias), so make them equal or rename one",
            "structural.yaml:75:5: X012 [parallel_sum] parallel_sum is a row of parallel only (block_structures.yaml declares it under parallel's places), so a residual_inside block never has it; drop the residual_inside entry",
        ],
    ),
    "X012 entry for another structure": (
        [
            ("block_structures.yaml", *_PARALLEL_ROW),
            (
                "structural.yaml",
                _PARALLEL_ENTRY[0],
                _PARALLEL_ENTRY[1] + "    pre_norm: {candidates: [mlp]}\n",
            ),
        ],
        [
            "structural.yaml:75:5: X012 [parallel_sum] parallel_sum is a row of parallel only (block_structures.yaml declares it under parallel's places), so a pre_norm block never has it; drop the pre_norm entry",
        ],
    ),
    "X012 no entry": (
        [("block_structures.yaml", *_PARALLEL_ROW)],
        [
            "block_structures.yaml:62:17: X012 [parallel_sum] parallel_sum is resolved from the module tree but structural.yaml has no entry for it; add its candidates on parallel there",
        ],
    ),
    "X017 add on a structure row": (
        [
            ("block_structures.yaml", *_PARALLEL_ROW),
            ("structural.yaml", *_PARALLEL_ENTRY),
            (
                "families/gemma2.yaml",
                "addresses:\n",
                "addresses:\n  parallel_sum:\n    add: true\n    doc: again\n",
            ),
        ],
        [
            "families/gemma2.yaml:20:3: X017 [gemma2:parallel_sum] 'parallel_sum' is a place of parallel blocks (block_structures.yaml), so this row replaces it field by field; drop 'add: true' (or give the new place a name of its own)",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(STRUCTURE_ROW_CASES))
def test_a_structures_rows(case: str, registry_copy: Path) -> None:
    edits, expected = STRUCTURE_ROW_CASES[case]
    _apply(registry_copy, edits)
    registry, diags = lint(registry_copy)
    assert [str(d).replace(f"{registry_copy}/", "") for d in diags] == expected
    if case == "clean, one row of two structures":
        both = [
            registry.structure_places[s]["parallel_sum"] for s in ("parallel", "residual_inside")
        ]
        assert both[0] == both[1] and set(registry.structural["parallel_sum"]) == {
            "parallel",
            "residual_inside",
        }
    if case == "clean":
        row = registry.structure_places["parallel"]["parallel_sum"]
        assert (row.order, row.module) == (52, "{name}")
        assert "parallel_sum" not in registry.places
        assert registry.structural["parallel_sum"] == {
            "parallel": registry.structural["parallel_sum"]["parallel"]
        }


def test_a_family_may_replace_a_structures_row(registry_copy: Path) -> None:
    _apply(registry_copy, STRUCTURE_ROW_CASES["clean"][0])
    edit(
        registry_copy / "families/gemma2.yaml",
        "addresses:\n",
        "addresses:\n  parallel_sum:\n    module: mlp\n    io: output\n",
    )
    registry, diags = lint(registry_copy)
    assert diags == []
    (family,) = [f for f in registry.families if f.name == "gemma2"]
    assert ("parallel_sum", (("module", "mlp"), ("io", IOType.OUTPUT))) in family.overrides
    from causalab_mini.codegen.generate import render

    text = render(registry)["families.py"]
    assert (
        'replace(\n                        STRUCTURE_ADDRESSES["parallel"]["parallel_sum"],' in text
    )


def test_a_gate_needle_must_be_call_shaped(package_registry_copy: Path) -> None:
    edit(
        package_registry_copy / "interiors.yaml",
        '{kind: softplus, needle: "F.softplus("}',
        '{kind: softplus, needle: "F.softplus"}',
    )
    diags = [d for d in lint(package_registry_copy)[1] if d.code == "X004"]
    assert [(d.row, d.message.split(":")[0]) for d in diags] == [
        ("gates[3]", "gate needle 'F.softplus' is not call-shaped")
    ]


def test_tiny_settings_keys_reasons_and_keep_off(package_registry_copy: Path) -> None:
    # an override of a model type this transformers lacks is fine; keys must be
    # identifiers, reasons sentences, and keep_off names generic keys
    path = package_registry_copy / "tiny.yaml"
    edit(path, "  mpt:\n", "  some_future_model:\n    hidden_size: 32\n  mpt:\n")
    assert lint(package_registry_copy)[1] == []
    edit(path, "    hidden_size: 32\n", "    hidden-size: 32\n")
    edit(path, "not_buildable:\n", "not_buildable:\n  gemma4_assistant: ''\n")
    edit(path, "keep_off:\n", "keep_off:\n  - no_such_generic_key\n")
    diags = lint(package_registry_copy)[1]
    shown = [str(d).replace(f"{package_registry_copy}/", "") for d in diags]
    assert shown[0].endswith(
        ": S004 [some_future_model] overrides.some_future_model: 'hidden-size' does not have "
        "the form '^[a-z_][a-z0-9_]*$'"
    )
    assert shown[1].endswith(
        ": S004 [gemma4_assistant] not_buildable.gemma4_assistant: '' is too short (at least 10)"
    )
    assert len(diags) == 2  # the file fails its schema: its cross-row rules wait
    edit(path, "    hidden-size: 32\n", "    hidden_size: 32\n")
    edit(path, "not_buildable:\n  gemma4_assistant: ''\n", "not_buildable:\n")
    (diag,) = lint(package_registry_copy)[1]
    assert (diag.code, diag.row) == ("X007", "keep_off")
    assert "'no_such_generic_key', which is not a key of generic" in diag.message


def test_tiny_side_inputs_are_shapes_read_from_the_config(package_registry_copy: Path) -> None:
    # a side input says why the forward reads it; each dimension is a count, the
    # token batch's batch or seq, or a config path (identifiers and @layer)
    path = package_registry_copy / "tiny.yaml"
    edit(
        path,
        "      shape: [batch, 1, {config: backbone_hidden_size, times: 2}]\n",
        "      shape: [batch, tokens, {config: backbone-hidden-size}]\n",
    )
    diags = lint(package_registry_copy)[1]
    shown = [str(d).replace(f"{package_registry_copy}/", "") for d in diags]
    assert any(
        ": S003 [gemma4_assistant] side_inputs.gemma4_assistant.inputs_embeds.shape.1 " in s
        for s in shown
    ), shown
    assert any(
        ": S003 [gemma4_assistant] side_inputs.gemma4_assistant.inputs_embeds.shape.2 " in s
        for s in shown
    ), shown
    edit(
        path,
        "      shape: [batch, tokens, {config: backbone-hidden-size}]\n",
        "      shape: [batch, 1, {config: backbone_hidden_size, times: 2}]\n",
    )
    assert lint(package_registry_copy)[1] == []
    edit(path, "    inputs_embeds:\n      why: >-\n", "    inputs_embeds:\n      because: >-\n")
    shown = [str(d) for d in lint(package_registry_copy)[1]]
    assert any(
        "side_inputs.gemma4_assistant.inputs_embeds" in s and "lacks the required key 'why'" in s
        for s in shown
    ), shown


def test_a_side_input_dimension_is_a_product_of_seq_a_config_value_and_a_count(
    package_registry_copy: Path,
) -> None:
    # {seq: true, config: ..., times: n} multiplies what it names (Voxtral-Realtime's
    # frames per text position); an object naming neither seq nor a config path, or seq
    # other than true, is refused by the schema
    path = package_registry_copy / "tiny.yaml"
    frames = "        - {seq: true, config: downsample_factor, times: 2}\n"
    assert frames in path.read_text()
    edit(path, frames, "        - {seq: true}\n")
    assert lint(package_registry_copy)[1] == []
    for wrong in ("{times: 2}", "{seq: false, times: 2}"):
        edit(path, "        - {seq: true}\n", f"        - {wrong}\n")
        shown = [str(d) for d in lint(package_registry_copy)[1]]
        assert any(
            "[voxtral_realtime] side_inputs.voxtral_realtime.input_features.shape.2" in s
            for s in shown
        ), shown
        edit(path, f"        - {wrong}\n", "        - {seq: true}\n")


def test_code_channels_extend_a_tensor_of_the_token_batch(package_registry_copy: Path) -> None:
    # channels (Kyutai-STT's audio codes beside each text token) follow the token
    # batch's own tensor on a new axis: a row that makes a tensor of its own shape
    # instead (no from) has nothing to extend, and the schema refuses it
    path = package_registry_copy / "tiny.yaml"
    coded = "      from: input_ids\n      channels:\n"
    assert coded in path.read_text()
    edit(path, coded, "      shape: [batch, seq]\n      channels:\n")
    shown = [str(d) for d in lint(package_registry_copy)[1]]
    assert any(
        "[kyutai_speech_to_text] side_inputs.kyutai_speech_to_text.input_ids" in s
        and "channels" in s
        for s in shown
    ), shown
    edit(path, "      shape: [batch, seq]\n      channels:\n", coded)
    assert lint(package_registry_copy)[1] == []


def test_each_cross_row_code_belongs_to_a_rule_module() -> None:
    """hassfest-style: the cross-row pass is codegen/rules/, one module per group of
    codes, run by one loop; lint.py itself raises only file, YAML and schema codes."""
    from causalab_mini.codegen import rules

    root = Path(rules.__file__).parent
    sources = {p.stem: p.read_text() for p in root.glob("*.py") if p.stem != "__init__"}
    for code in (c for c in CODES if c.startswith("X")):
        owners = [name for name, text in sources.items() if f'"{code}"' in text]
        assert owners, f"no rule module raises {code}"
    lint_source = (root.parent / "lint.py").read_text()
    assert not [c for c in CODES if c.startswith("X") and f'"{c}"' in lint_source]
    assert all(callable(rule) for rule in rules.RULES) and len(rules.RULES) >= 7


def test_a_familys_own_interiors_are_checked(package_registry_copy: Path) -> None:
    # a family that refuses every interior cannot also say where one is (X017), and a
    # family's interior and operand needles are call-shaped like every needle (X004)
    edit(
        package_registry_copy / "families/diffllama.yaml",
        "interiors_unavailable: >-\n",
        "interiors:\n  attention_query:\n    needles: [torch.matmul]\n"
        "operands:\n  value: {needle: self.attn, arg: 2}\ninteriors_unavailable: >-\n",
    )
    _, diags = lint(package_registry_copy)
    shown = [str(d).replace(f"{package_registry_copy}/", "") for d in diags]
    assert shown == [
        "families/diffllama.yaml:35:3: X017 [diffllama:attention_query] the family refuses every interior "
        "(interiors_unavailable) and also says where this one is: drop one of the two",
        "families/diffllama.yaml:36:15: X004 [diffllama] needle 'torch.matmul' is not call-shaped: write the "
        "callable as it is called in the source, ending in '(' (e.g. 'torch.matmul('), so an "
        "assignment that shares the name is not matched",
        "families/diffllama.yaml:38:19: X004 [diffllama] needle 'self.attn' is not call-shaped: write the "
        "callable as it is called in the source, ending in '(' (e.g. 'self.attn('), so an "
        "assignment that shares the name is not matched",
    ]


def test_a_familys_interiors_replace_the_defaults_fields(package_registry_copy: Path) -> None:
    registry, diags = lint(package_registry_copy)
    assert diags == []
    (neo,) = [f for f in registry.families if f.name == "gpt_neo"]
    fields = dict(neo.interiors)["attention_z"]
    assert dict(fields)["layout"] == "bhsd" and dict(fields)["returns"] == 0
    assert dict(neo.operands)["scaling"].value == 1.0
    from causalab_mini.codegen.generate import render

    text = render(registry)["families.py"]
    assert 'INTERIORS["attention_z"]' in text


def test_a_needle_may_name_the_call_of_a_calls_result(monkeypatch: pytest.MonkeyPatch) -> None:
    # BLIP's attention builds its Softmax module and calls it in one expression:
    # nnsight names the second call call_<n> (0.8; unknown_<n> on 0.6/0.7), which the
    # needle names by the whole first call and "("
    from causalab_mini import compat
    from causalab_mini.codegen.rules.context import NEEDLE
    from causalab_mini.ops import _calls, needle_prefix

    assert NEEDLE.match("nn.Softmax(dim=-1)(")
    assert not NEEDLE.match("nn.Softmax(dim=-1)")
    assert not NEEDLE.match("nn.Softmax(f(x))(")
    for is_08, stem in ((True, "call"), (False, "unknown")):
        monkeypatch.setattr(compat, "is_08", lambda is_08=is_08: is_08)
        assert needle_prefix("nn.Softmax(dim=-1)(") == stem
    monkeypatch.undo()
    assert needle_prefix("nn.functional.softmax(") == "nn_functional_softmax"
    line = "        attention_probs = nn.Softmax(dim=-1)(attention_scores)"
    assert _calls(line, "nn.Softmax(dim=-1)(")
    assert not _calls("        probs = nn.Softmax(dim=1)(scores)", "nn.Softmax(dim=-1)(")


def test_a_needle_may_name_a_method_called_on_an_expressions_result() -> None:
    # Step-3.7's output gate is gate_states.unsqueeze(-1).sigmoid(): a method called on
    # a call's result, which nnsight names by the method alone (sigmoid_0), where a
    # method on a name is named with it (gate.sigmoid() -> gate_sigmoid_0)
    from types import SimpleNamespace

    from causalab_mini import plain
    from causalab_mini.codegen.rules.context import NEEDLE
    from causalab_mini.ops import candidates, needle_prefix

    assert NEEDLE.match(".sigmoid(")
    assert not NEEDLE.match("..sigmoid(")
    assert not NEEDLE.match(".a.sigmoid(")
    assert needle_prefix(".sigmoid(") == "sigmoid"
    assert needle_prefix("gate.sigmoid(") == "gate_sigmoid"
    text = "\n".join(
        [
            "def forward(self, hidden_states):",
            "    gate = self.g_proj(hidden_states).sigmoid()",
            "    out = out * gate_states.unsqueeze(-1).sigmoid()",
            "    scale = gate.sigmoid()",
        ]
    )
    # 0.6/0.7's accessor: line numbers counted after the def line
    lines = {"self_g_proj_0": 0, "sigmoid_0": 0, "sigmoid_1": 1, "gate_sigmoid_0": 2}
    source = SimpleNamespace(source=text, line_numbers=lines, sigmoid_1="the gate")
    # both sigmoid_0 and sigmoid_1 are methods on a call's result: two calls, no one gate
    assert candidates(source, ".sigmoid(") == ["sigmoid_0", "sigmoid_1"]
    assert candidates(source, "gate.sigmoid(") == ["gate_sigmoid_0"]
    del lines["sigmoid_0"]
    assert candidates(source, ".sigmoid(") == ["sigmoid_1"]
    assert plain._find(source, ".sigmoid(", "layers.0.self_attn") == "the gate"


def test_a_needle_may_name_the_arguments_up_to_the_one_that_differs() -> None:
    # XLNet's attention calls post_attention three times, each with h first: the
    # needle names the arguments up to the one that tells them apart
    from causalab_mini.codegen.rules.context import NEEDLE
    from causalab_mini.ops import _calls

    assert NEEDLE.match("self.post_attention(h, attn_vec")
    assert NEEDLE.match("attention_interface(")
    assert not NEEDLE.match("self.post_attention(h,attn_vec")
    assert not NEEDLE.match("self.post_attention(h, 1")
    line = "            output_h = self.post_attention(h, attn_vec)"
    assert _calls(line, "self.post_attention(h, attn_vec")
    assert not _calls(
        "output_h = self.post_attention(h, attn_vec_h)", "self.post_attention(h, attn_vec"
    )


def test_a_family_or_rule_may_match_only_some_releases(package_registry_copy: Path) -> None:
    # match.versions (a family) and versions (a rule): PEP 440 ranges, checked as every
    # row's (X006), emitted into the family's and the rule's FamilyMatch
    registry, diags = lint(package_registry_copy)
    assert diags == []
    (inline,) = [f for f in registry.families if f.name == "falcon_inline"]
    assert inline.match.versions == (("transformers", "<5.25"),)
    edit(package_registry_copy / "families/falcon_inline.yaml", '"<5.25"', '"before 5.25"')
    edit(
        package_registry_copy / "block_structures.yaml",
        "  - structure: mixer_only\n",
        '  - structure: mixer_only\n    versions: {transformers: "5.x"}\n',
    )
    _, diags = lint(package_registry_copy)
    shown = sorted(str(d).replace(f"{package_registry_copy}/", "") for d in diags)
    assert [d.code for d in diags] == ["X006", "X006"], shown
    assert any(
        s.startswith("families/falcon_inline.yaml:")
        and "[falcon_inline] version range 'before 5.25' for transformers does not parse" in s
        for s in shown
    ), shown
    assert any(
        s.startswith("block_structures.yaml:") and "version range '5.x' for transformers" in s
        for s in shown
    ), shown


def test_a_familys_release_range_decides_whether_it_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from causalab_mini import versions
    from causalab_mini.address import FamilyMatch

    match = FamilyMatch(model_types=("falcon",), versions=(("transformers", "<5.25"),))
    for installed, expected in (("5.24.0", True), ("5.25.0", False), ("5.26.1", False)):
        monkeypatch.setattr(versions, "installed_version", lambda package, v=installed: v)
        assert match.matches(("FalconForCausalLM",), "falcon", object()) is expected, installed
    # the other parts still decide first
    assert not match.matches(("LlamaForCausalLM",), "llama", object())
    # a package that is not installed is not held against the family
    monkeypatch.setattr(versions, "installed_version", lambda package: None)
    assert match.matches(("FalconForCausalLM",), "falcon", object())


def test_a_needle_with_a_leading_dot_is_a_method_on_a_calls_result() -> None:
    # FSMT's attention hands on its query as query_states.view(...).transpose(0, 1):
    # nnsight names the chained call transpose_N, and ".transpose(" names it, never a
    # method called on a name (key_states.transpose(1, 2), a stem of its own)
    from causalab_mini.codegen.rules.context import NEEDLE
    from causalab_mini.ops import _calls, needle_prefix

    assert NEEDLE.match(".transpose(")
    assert not NEEDLE.match("..transpose(")
    assert needle_prefix(".transpose(") == "transpose"
    line = "    query_states = query_states.view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)"
    assert _calls(line, ".transpose(")
    assert not _calls("    attn_weights = torch.bmm(q, key_states.transpose(1, 2))", ".transpose(")
    assert not _calls("    x = transpose(y)", ".transpose(")
