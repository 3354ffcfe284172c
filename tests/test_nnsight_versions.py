"""What differs between nnsight 0.6, 0.7 and 0.8, and what must not: the bridges of
``causalab_mini.compat`` (only on 0.8), op names found by call site whatever nnsight
numbers them, op names resolved once per forward, BERT's ``output`` child, eager
probabilities asked for twice, and what a place holds on a left-padded batch.

Part of the semantic suite: ``nox -s drift`` runs it under every supported nnsight."""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from causalab_mini import compat, ops
from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools import certify as c
from causalab_mini.tools.cli import main
from causalab_mini.tools.tiny import resolve_model_spec

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


@functools.cache
def load(spec: str) -> StandardizedTransformer:
    return StandardizedTransformer(spec)


def test_the_bridges_are_installed_on_nnsight_08_only() -> None:
    import nnterp

    finders = [f for f in sys.meta_path if isinstance(f, compat._ObjectModuleFinder)]
    model = load("tiny:llama")
    if compat.is_08():
        # nnterp's `from nnsight.intervention.tracing.globals import Object`
        from nnsight.intervention.tracing.globals import Object
        from nnsight.tracing.hint import Object as hint

        assert len(finders) == 1 and Object is hint
        assert isinstance(vars(nnterp.StandardizedTransformer)["_model"], property)
    else:
        assert not finders
        assert "_model" not in vars(nnterp.StandardizedTransformer)
    assert model._model is model._module  # what nnterp reads, on every version


def test_a_plain_language_model_gets_its_tokenizer() -> None:
    # nnsight 0.8.1 under transformers >= 5.23: "Impossible to guess which tokenizer
    # to use", bridged by compat; 0.6/0.7 find it themselves
    from nnsight import LanguageModel

    compat.install()
    model = LanguageModel(resolve_model_spec("tiny:llama"))
    assert model.tokenizer is not None
    assert model.tokenizer("The quick brown fox")["input_ids"]


def test_eager_attention_may_be_asked_for_beside_the_probabilities() -> None:
    # nnterp 1.3.0 checks attn_implementation and then passes it twice (TypeError)
    model = StandardizedTransformer(
        "tiny:llama", enable_attention_probs=True, attn_implementation="eager"
    )
    assert model.attention_probs_enabled
    assert model._module.config._attn_implementation == "eager"
    assert model.internals.status()["attention_probabilities"] is None
    with pytest.raises(ValueError, match=r"attn_implementation='sdpa'.*drop attn_implementation"):
        StandardizedTransformer(
            "tiny:llama", enable_attention_probs=True, attn_implementation="sdpa"
        )


def _parsed(envoy: Any) -> tuple[list[str], dict[str, int]]:
    source = envoy.source
    text, line_of = compat.parsed_source(getattr(source, "accessor", source))
    return text.split("\n"), line_of


def test_a_call_shaped_needle_picks_the_call_whatever_its_number() -> None:
    model = load("tiny:llama")
    lines, line_of = _parsed(model.internals.layer_envoy(0).self_attn)
    hits = ops.candidates(
        getattr(model.layers[0].self_attn.source, "accessor", model.layers[0].self_attn.source),
        "attention_interface(",
    )
    assert len(hits) == 1
    assert "attention_interface(" in lines[line_of[hits[0]]]
    same_stem = sorted(n for n in line_of if re.fullmatch(r"attention_interface_\d+", n))
    if compat.is_08():
        # 0.8 numbers assignments and calls on one counter: the assignment that picks
        # the attention function is attention_interface_0, the call _1
        assert hits == ["attention_interface_1"]
        assert same_stem == ["attention_interface_0", "attention_interface_1"]
        assert "attention_interface(" not in lines[line_of["attention_interface_0"]]
        assert "attention_interface" in lines[line_of["attention_interface_0"]]
    else:
        assert hits == ["attention_interface_0"] and same_stem == hits


def test_op_names_are_resolved_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    model = load("tiny:llama")
    envoys = [model.internals.layer_envoy(i).self_attn for i in range(model.num_layers)]
    before = [compat.forward_key(e._module) for e in envoys]
    envoys[0].source  # noqa: B018 - opening a source must not change the key
    after = [compat.forward_key(e._module) for e in envoys]
    assert before == after and before[0] is not None and len(set(before)) == 1
    ops._OP_NAMES.clear()
    searched: list[Any] = []
    find_op = ops.find_op

    def counted(*args: Any, **kwargs: Any) -> Any:
        searched.append(args[0])
        return find_op(*args, **kwargs)

    monkeypatch.setattr(ops, "find_op", counted)
    names = {
        ops.op_name(e, "attention_interface(", row="attention_query", module="m", model_class="c")
        for e in envoys
    }
    assert len(names) == 1 and len(searched) == 1, "every layer after the first hits the cache"


def _components(*args: str) -> dict[str, dict[str, Any]]:
    result = CliRunner().invoke(main, ["model", "tiny:bert", "--json", *args])
    assert result.exit_code == 0, result.output
    return {row["name"]: row for row in json.loads(result.output)["components"]}


def test_bert_keeps_its_components_though_a_child_is_named_output() -> None:
    # a BERT layer has a child module named `output`: nnsight 0.6/0.7 mount it at
    # `output` (the layer's own output at nns_output), 0.8 at E_output
    # post_ln: no such norm; an MLP of one input projection: no gate, no up; absolute
    # positions: no rotary call to read before; a dense MLP: no router, no experts
    structural = {
        "attention_input_norm",
        "mlp_input_norm",
        "mlp_gate",
        "mlp_up",
        "attention_query_pre_rope",
        "attention_key_pre_rope",
        "router_logits",
        "router_weights",
        "router_indices",
        "expert_output",
        "shared_expert_output",
    }
    sdpa = _components()
    assert {n for n, row in sdpa.items() if not row["ok"]} == structural | {
        "attention_scores",  # eager only
        "attention_probs",
    }
    eager = _components("--eager")
    assert {n for n, row in eager.items() if not row["ok"]} == structural
    assert eager["attention_output"]["where"] == "self_attn.output.dense"
    assert eager["mlp_output"]["where"] == "output.dense"


def test_bert_reads_the_output_child_and_the_layers_own_output() -> None:
    model = load("tiny:bert")
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs, ["mlps_output", "layers_output"])
    layer = model._module.bert.encoder.layer[1]
    seen: dict[str, Any] = {}
    hooks = [
        layer.output.dense.register_forward_hook(lambda m, a, o: seen.setdefault("dense", o)),
        layer.register_forward_hook(lambda m, a, o: seen.setdefault("layer", o)),
    ]
    try:
        with torch.no_grad():
            model._module(**c.forward_inputs(model, inputs))
    finally:
        for hook in hooks:
            hook.remove()
    layer_out = seen["layer"][0] if isinstance(seen["layer"], tuple) else seen["layer"]
    assert c.compare("mlps_output", 1, values[("mlps_output", 1)], seen["dense"]).ok
    assert c.compare("layers_output", 1, values[("layers_output", 1)], layer_out).ok
    assert not c.compare("different", 1, values[("mlps_output", 1)], layer_out).ok


# ---------------------------------------------------------------- left padding
#
# The decision: a place holds what the trace's own forward computes, and that forward
# is the same on every nnsight. On a left-padded text batch without position ids,
# nnsight 0.8 adds position ids counted from each row's first real token; on 0.6/0.7
# the model (causalab_mini.compat.supply_position_ids) adds the same ones, where the
# model would otherwise count positions itself (GPT-2 over the padded width, OPT from
# the attention mask). The oracles are fed what the trace's forward got
# (certify.forward_inputs); position ids given by the caller are used as given.


@pytest.mark.parametrize(
    "spec", ["tiny:gpt2", "tiny:opt"]
)  # positions: over the width, from the mask
def test_left_padded_places_hold_what_the_traced_forward_computes(spec: str) -> None:
    model = load(spec)
    texts = ("The quick brown fox", "A much longer sentence about the quick brown fox and a dog")
    inputs = c.sample_inputs(model, texts)
    mask = inputs["attention_mask"]
    assert mask[0, 0] == 0 and bool(mask[1].all()), "row 0 left-padded, row 1 not"
    from_first_token = (mask.cumsum(-1) - 1).clamp(min=0)

    fed = c.forward_inputs(model, inputs)
    assert torch.equal(fed["position_ids"], from_first_token)  # on every nnsight

    # the oracle fed the same inputs agrees with every layer, the final norm, the logits
    values = c.read_places(model, inputs, ["layers_input", "ln_final_output", "logits"])
    checks = c.hidden_state_oracle(model, inputs, values)
    assert len(checks) == model.num_layers + 2 and all(ch.ok for ch in checks), checks
    # ... and fed the batch as given it would not: the trace added position ids
    with torch.no_grad():
        raw = model._module(**inputs).logits
    assert not c.compare("logits", None, values[("logits", None)], raw).ok

    # the padded row's real tokens against the prompt alone
    n = int(mask[0].sum())
    alone = c.read_places(model, c.sample_inputs(model, texts[:1]), ["layers_output"])
    explicit = c.read_places(model, {**inputs, "position_ids": from_first_token}, ["layers_output"])
    plain = c.read_places(model, inputs, ["layers_output"])
    for layer in range(model.num_layers):
        want = alone[("layers_output", layer)][0]
        got = explicit[("layers_output", layer)][0, -n:]
        assert c.compare("explicit position ids", layer, got, want).ok
        same = c.compare("as given", layer, plain[("layers_output", layer)][0, -n:], want).ok
        assert same  # as the prompt alone, on every nnsight


def test_the_coverage_doc_lists_where_another_nnsight_differs() -> None:
    from causalab_mini.tools.sweep import coverage_markdown

    def run(nnsight: str, results: list[dict[str, Any]]) -> dict[str, Any]:
        summary = {"architectures": len(results), "unbuildable": 0, "timeout": 0, "broken": 0}
        for key in ("certified", "unloadable", "crashed"):
            summary[key] = sum(r["outcome"] == key for r in results)
        for key in ("ok", "refused"):
            summary[key] = sum(c["state"] == key for r in results for c in r["components"].values())
        return {
            "transformers": "5.24.0",
            "nnsight": nnsight,
            "seconds": 1.0,
            "summary": summary,
            "results": results,
        }

    def arch(name: str, outcome: str, reason: str | None = None, **states: str) -> dict[str, Any]:
        components = {
            k: {"state": v, "reason": None if v == "ok" else f"{k} {v} on {name}", "checks": []}
            for k, v in states.items()
        }
        return {
            "model_type": name,
            "model_class": None,
            "structure": None,
            "outcome": outcome,
            "reason": reason,
            "components": components,
        }

    old = run(
        "0.7.0",
        [
            arch("llama", "certified", block_input="ok", lm_head="ok"),
            arch("vlm", "unloadable", "LanguageModel(...) can't load it"),
            arch("gpt1", "certified", mlp_activation="ok"),
        ],
    )
    new = run(
        "0.8.1",
        [
            arch("llama", "certified", block_input="ok", lm_head="ok"),
            arch("vlm", "certified", block_input="ok", lm_head="refused"),
            arch("gpt1", "certified", mlp_activation="refused"),
        ],
    )
    text = coverage_markdown(old, new)
    assert "transformers 5.24.0, nnsight 0.7.0: 3 causal-LM architectures" in text
    section = text.split("## Against transformers 5.24.0, nnsight 0.8.1\n", 1)[1]
    assert "3 certified (here 2), 3 ok (3), 2 refused (0)" in section
    assert (
        "| vlm | unloadable -> certified | unloadable: LanguageModel(...) can't load it | "
        "certified: 1 ok, 1 refused |" in section
    )
    assert "| gpt1 | mlp_activation: ok -> refused |  | mlp_activation refused on gpt1 |" in section
    assert "| llama |" not in section
    same = coverage_markdown(old, old)
    assert "gives the same outcome and the same state for every component" in same
    assert "## Against" not in coverage_markdown(old)


def test_a_module_shared_by_every_layer_is_read_per_layer_or_refused() -> None:
    # GPT-1's activation is one module object in every layer (modeling_openai's
    # ACT_FNS). nnsight 0.8 wraps it once, at layer 0's path, and serves its calls in
    # order: the default row (mlp.act's output) would read layer 0's call at every
    # layer, so it is refused past layer 0 there; the family reads mlp.c_proj's input
    from causalab_mini import RenameConfig
    from causalab_mini.generated import DEFAULT_ADDRESSES

    default = StandardizedTransformer(
        "tiny:openai-gpt",
        rename_config=RenameConfig(
            addresses={"mlps_activation": DEFAULT_ADDRESSES["mlps_activation"]}
        ),
    )
    status = default.internals.status()["mlps_activation"]
    if compat.is_08():
        assert status is not None and status.startswith("available on layers [0] only")
        assert "the module object at model.transformer.h.0.mlp.act" in status
    else:
        assert status is None
    model = load("tiny:openai-gpt")
    assert model.internals.status()["mlps_activation"] is None
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs, ["mlps_input", "mlps_activation"])
    for layer in range(model.num_layers):
        mlp = model._module.transformer.h[layer].mlp
        with torch.no_grad():
            want = mlp.act(mlp.c_fc(values[("mlps_input", layer)]))
        assert c.compare("act(c_fc(x))", layer, values[("mlps_activation", layer)], want).ok


def test_the_running_trace_body_is_told_apart_on_every_nnsight() -> None:
    # compat.running_body: a trace body's mediator (0.8: its greenlet's; 0.6/0.7: the
    # worker thread's compiled body), None in the model's forward and outside a trace.
    # In-place edits of a read are the place's write only where it is told (edits.py)
    from causalab_mini.hooks import dispatched

    model = load("tiny:llama")
    dispatched(model)  # the real modules, which the forward runs
    seen: list[Any] = []
    hook = model.layers[1]._module.register_forward_hook(
        lambda *_: seen.append(compat.running_body())
    )
    box: list[Any] = []
    try:
        with model.trace() as tracer:
            with tracer.invoke("The quick brown fox"):
                box.append(compat.running_body())
                model.layers_mid[1].save()
                box.append(compat.running_body())
            with tracer.invoke("A lazy dog"):
                box.append(compat.running_body())
    finally:
        hook.remove()
    assert compat.running_body() is None
    assert seen == [None]  # the model's forward is no trace body
    first, again, other = box
    assert None not in (first, again, other) and other is not again  # one per invoke


@pytest.mark.parametrize("name", ["layers_input", "layers_mid", "mlps_input", "attentions_premix"])
def test_a_saved_read_keeps_its_value_and_an_edit_of_a_later_read_is_the_write(
    name: str,
) -> None:
    # the sweep's in-place-edit check (read and save; edit a second read in place; read
    # again; logits): at a module's input (the read is the model's tensor) a saved read
    # must not follow the edit, and at a copied row (layers_mid) the edit must reach the
    # model. nnsight 0.6/0.7 once handed every read out unwrapped: broken on both
    model = load("tiny:llama")
    checks = c.in_place_edit(model, c.sample_inputs(model), name, 1)
    assert len(checks) == 3 and all(check.ok for check in checks), checks


def test_a_first_input_given_by_keyword_is_written() -> None:
    # Llama calls its attention as self_attn(hidden_states=..., ...): nnsight 0.6/0.7's
    # own `input` setter adds a positional argument beside the keyword (TypeError: got
    # multiple values); a write there replaces the keyword (plain._put_first_input)
    model = load("tiny:llama")
    box: dict[str, Any] = {}
    with model.trace("The quick brown fox"):
        box["clean"] = model.internals["attentions_input"][1].save()
    with model.trace("The quick brown fox"):
        before = model.internals["attentions_input"][1]
        box["before"] = before.save()
        model.internals["attentions_input"][1] = before * 0
        box["after"] = model.internals["attentions_input"][1].save()
        box["out"] = model.internals["attentions_output"][1].save()
    # the read saved before the write keeps the clean run's value; the write is there
    assert box["clean"].abs().sum() > 0 and torch.equal(box["before"], box["clean"])
    assert box["after"].abs().sum() == 0
    # no bias in the tiny Llama's attention: a zero input mixes to a zero output
    assert box["out"].abs().sum() == 0


def test_a_family_auto_class_reaches_every_nnsight_its_own_way() -> None:
    """A language model inside a multimodal wrapper loads with its family's auto class
    on every release: 0.6/0.7 take the class as automodel=, 0.8 a registered
    text-generation task whose model class it is (and whose preprocessing stays the
    tokenizer's); the loaded model is the image-text-to-text class, vision included."""
    import transformers
    from transformers.pipelines import check_task

    kwargs = compat.auto_class_kwargs("AutoModelForImageTextToText")
    if compat.is_08():
        assert set(kwargs) == {"task"}
        _, target, _ = check_task(kwargs["task"])
        assert target["pt"] == (transformers.AutoModelForImageTextToText,)
        assert issubclass(target["impl"], transformers.TextGenerationPipeline)
    else:
        assert kwargs == {"automodel": transformers.AutoModelForImageTextToText}
    model = load("tiny:mllama")
    assert type(model._model).__name__ == "MllamaForConditionalGeneration"
    assert hasattr(model._model.model, "vision_model")
    assert model.tokenizer is not None


def test_a_family_model_class_reaches_every_nnsight_its_own_way() -> None:
    """A family's model_class (a concrete class, where no auto class loads the config:
    Evolla's) reaches every release as an auto class would, behind the class methods
    nnsight calls on one (from_config for the meta build, from_pretrained): 0.6/0.7 as
    automodel=, 0.8 as the model class of a registered text-generation task."""
    import transformers
    from transformers.pipelines import check_task

    kwargs = compat.auto_class_kwargs("EvollaForProteinText2Text")
    if compat.is_08():
        _, target, _ = check_task(kwargs["task"])
        (loader,) = target["pt"]
    else:
        loader = kwargs["automodel"]
    assert loader.model_class is transformers.EvollaForProteinText2Text
    model = load("tiny:evolla")
    assert type(model._model).__name__ == "EvollaForProteinText2Text"
    assert model.tokenizer is not None


def test_a_root_child_named_output_is_renamed_where_nnsight_mounts_it() -> None:
    """GIT's unembedding is the root's child ``output``: 0.8 mounts it at E_output, and
    a rename alias must name that (the bare name is nnsight's .output on every module);
    on 0.6/0.7 the path as written. Either way lm_head is that Linear."""
    assert compat.container_path("output") == ("E_output" if compat.is_08() else "output")
    assert compat.container_path("model.layers") == "model.layers"
    model = load("tiny:git")
    assert model.lm_head._module is model._model.get_output_embeddings()
    with model.trace(c.sample_inputs(model)):
        head = model.internals["lm_head_output"]().save()
        logits = model.internals["logits"]().save()
    assert torch.equal(getattr(head, "value", head), getattr(logits, "value", logits))


def _unbound_cases() -> list[Any]:
    from causalab_mini.generated import FAMILY_CONTAINERS
    from tests.registry_cases import family_cases

    return [
        case.param(case, FAMILY_CONTAINERS[family].unbound_defaults, id=f"{family}-{case.id}")
        for family, case in family_cases()
        if FAMILY_CONTAINERS[family].unbound_defaults
    ]


@pytest.mark.parametrize(("case", "keys"), _unbound_cases())
def test_unbound_defaults_bind_nothing_and_the_embedding_is_the_familys(
    case: Any, keys: tuple[str, ...]
) -> None:
    # nnterp's built-in rename keys a family leaves unbound make no alias on any
    # release (0.8 would refuse the load; 0.6/0.7 let a child or a later alias win),
    # and embed_tokens is the module the family names
    from causalab_mini.address import names as container_paths
    from causalab_mini.generated import FAMILY_CONTAINERS
    from causalab_mini.internals import child

    model = load(case.spec)
    aliases = compat.aliases_of(model)
    for key in keys:
        assert set(aliases.get(key, [])) <= {key}, (key, aliases.get(key))
    family = next(f for f in model.families if FAMILY_CONTAINERS[f].unbound_defaults == keys)
    (embed,) = container_paths(FAMILY_CONTAINERS[family].embed_name)
    assert model.embed_tokens._module is child(model, compat.container_path(embed))._module
