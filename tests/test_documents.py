"""Experiments as documents: every document of documents/ validated, explained and
run on two families (one whose tokenizer adds a BOS, one that adds nothing), with
what its results must show; bad documents refused before anything runs, each with
its code, place and hint; the run's folder, receipt, plots and resume."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from causalab_mini.documents import DocumentError, load
from causalab_mini.documents.cells import forwards
from causalab_mini.documents.experiment import Experiment, build
from causalab_mini.documents.explain import explain
from causalab_mini.documents.run import run
from causalab_mini.documents.validate import static_issues

from .conftest import REPO, cli, load_model

pytestmark = [pytest.mark.slow]

DOCS = REPO / "documents"
DOCUMENTS = sorted(p.stem for p in DOCS.glob("*.yaml"))
# a tokenizer that puts <s> first, and one that adds nothing (registry/tiny.yaml)
FAMILIES = ["tiny:llama", "tiny:gpt2"]


def _model(source: Any, spec: str) -> Any:
    probs = bool(source.data["model"].get("enable_attention_probs", False))
    return load_model(spec, probs)


def _built(name: str, spec: str) -> Experiment:
    source = load(DOCS / f"{name}.yaml")
    return build(source, model=_model(source, spec), spec=spec)


def _counted(model: Any) -> Iterator[list[int]]:
    from causalab_mini.hooks import dispatched

    dispatched(model)
    count = [0]
    handle = model._model.register_forward_pre_hook(lambda *a: count.__setitem__(0, count[0] + 1))
    try:
        yield count
    finally:
        handle.remove()


def _cells(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["key"]: c for c in results["cells"]}


def test_the_two_families_differ_by_their_bos() -> None:
    from causalab_mini.generated.tiny import TINY_TOKENIZER_KINDS, TINY_TOKENIZERS

    kinds = [TINY_TOKENIZER_KINDS[TINY_TOKENIZERS[s[5:]]["adds"]]["bos"] for s in FAMILIES]
    assert kinds == [True, False]


def test_the_library_has_the_documents_the_tests_run() -> None:
    assert set(DOCUMENTS) >= {
        "activation_patching",
        "head_patching",
        "ablation",
        "logit_lens",
        "attention_knockout",
        "attention_pattern_patching",
        "neuron_patching",
        "attribution_patching",
        "steering",
        "das_fit",
        "dbm_fit",
        "pca_control",
        "sae_ablation",
    }


@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_document_is_valid_without_a_model(name: str) -> None:
    issues, rows = static_issues(load(DOCS / f"{name}.yaml"))
    assert issues == [] and rows is not None and rows.rows


@pytest.mark.parametrize("path", sorted(DOCS.rglob("*.yaml")), ids=lambda p: p.stem)
def test_each_document_names_its_schema_for_editors(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    schema = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert schema == (REPO / "schema" / "document.schema.json").resolve()
    assert static_issues(load(path))[0] == []


@pytest.mark.parametrize("name", DOCUMENTS)
def test_each_document_names_its_model_on_one_line(name: str) -> None:
    # only the model line changes for a real checkpoint
    text = (DOCS / f"{name}.yaml").read_text()
    assert [line.strip() for line in text.splitlines() if "tiny:" in line] == [
        "checkpoint: tiny:llama"
    ]


@pytest.mark.parametrize("spec", FAMILIES)
@pytest.mark.parametrize("name", DOCUMENTS)
def test_explain_says_places_frames_cells_and_forwards(name: str, spec: str) -> None:
    exp = _built(name, spec)
    text = explain(exp)
    assert f"model: {spec}:" in text
    for site in exp.doc["sites"]:
        assert f"  {site}: {exp.doc['sites'][site]['component']}" in text
    assert f"forwards: {forwards(exp)} " in text
    # the frame: llama's <s> is an anchor outside the content, gpt2 has none
    first = exp.rows.rows[0]["base"]
    assert f"row 0 base: {first!r}" in text
    assert ("anchor bos" in text) == (spec == "tiny:llama")
    assert "<- " in text  # positions marked


def test_explain_runs_no_forward() -> None:
    exp = build(load(DOCS / "activation_patching.yaml"))  # its own model, fresh
    assert "cells: 18 (18 to run, 0 refused)" in explain(exp)
    assert not exp.model.dispatched  # nothing ran: the weights are not even loaded


def _run(name: str, spec: str, out: Path) -> tuple[Experiment, dict[str, Any], int]:
    source = load(DOCS / f"{name}.yaml")
    model = _model(source, spec)
    counted = _counted(model)
    count = next(counted)
    results = run(source, out, model=model, spec=spec)
    counted.close()
    exp = build(source, model=model, spec=spec)
    return exp, results, count[0]


def _files_ok(out: Path, results: dict[str, Any]) -> None:
    for label in results["metrics"]:
        rows = (out / "metrics" / f"{label.replace('[', '_').rstrip(']')}.csv").read_text()
        assert len(rows.splitlines()) == len(results["cells"]) + 1
    pngs = sorted((out / "plots").glob("*.png"))
    assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert json.loads((out / "results.json").read_text())["digest"] == results["digest"]
    assert not list(out.rglob(".*.tmp*"))


@pytest.mark.parametrize("spec", FAMILIES)
def test_activation_patching_full_patch_at_layer_0_is_the_source(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("activation_patching", spec, tmp_path)
    layers = exp.model.internals.num_layers
    cells = _cells(results)
    assert len(cells) == layers * 6 and all(c["status"] == "ok" for c in cells.values())
    assert count == forwards(exp) == results["forwards"]
    source, base = results["clean"]["source"], results["clean"]["base"]
    # every content token of layer 0's input from the source: the source's logits
    full = cells['patched|layer=0|position="all"']
    assert full["metrics"]["kl[source]"] == 0.0
    assert full["metrics"]["logit_diff"] == source["metrics"]["logit_diff"]
    # read before, write, read after: the clean base is not the source, a patch at
    # the first name changes the base, and at layer 0 the last token (the same token
    # at the same place in both prompts) changes nothing
    assert base["metrics"]["kl[source]"] > 0
    first = cells['patched|layer=0|position={"index": 2}']["metrics"]
    assert first["logit_diff"] != base["metrics"]["logit_diff"]
    last = cells['patched|layer=0|position={"index": -1}']["metrics"]
    assert last == base["metrics"]
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_head_patching_is_a_layer_by_head_grid(spec: str, tmp_path: Path) -> None:
    from causalab_mini.geometry import num_heads

    exp, results, count = _run("head_patching", spec, tmp_path)
    heads, layers = num_heads(exp.model, 0), exp.model.internals.num_layers
    cells = results["cells"]
    assert [(c["layer"], c["head"]) for c in cells] == [
        (layer, head) for layer in range(layers) for head in range(heads)
    ]
    assert all(c["status"] == "ok" for c in cells) and count == forwards(exp)
    base = results["clean"]["base"]["metrics"]["logit_diff"]
    # one head's write moves the logits, and no head alone is the whole source
    assert any(c["metrics"]["logit_diff"] != base for c in cells)
    assert all(c["metrics"]["kl"] > 0 for c in cells)
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_zero_and_mean_ablation_move_the_logits(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("ablation", spec, tmp_path)
    cells = _cells(results)
    layers = exp.model.internals.num_layers
    assert len(cells) == 2 * layers and count == forwards(exp)
    for kind in ("zero_ablated", "mean_ablated"):
        for layer in range(layers):
            metrics = cells[f"{kind}|layer={layer}"]["metrics"]
            assert metrics["kl"] > 0 and math.isfinite(metrics["logprob"])
    assert all(
        cells[f"zero_ablated|layer={n}"]["metrics"] != cells[f"mean_ablated|layer={n}"]["metrics"]
        for n in range(layers)
    )
    assert results["clean"]["base"]["metrics"]["kl"] == 0.0
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_logit_lens_at_the_last_layer_is_the_model(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("logit_lens", spec, tmp_path)
    layers = exp.model.internals.num_layers
    cells = [c for c in results["cells"]]
    assert [c["layer"] for c in cells] == list(range(layers)) and count == forwards(exp)
    last = cells[-1]["metrics"]
    clean = results["clean"]["base"]["metrics"]
    assert abs(last["kl"]) < 1e-5
    assert last["logprob"] == pytest.approx(clean["logprob"], abs=1e-4)
    assert all(c["metrics"]["kl"] > 1e-5 for c in cells[:-1])
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_attention_pattern_patching_is_a_layer_by_head_grid(spec: str, tmp_path: Path) -> None:
    from causalab_mini.geometry import num_heads

    exp, results, count = _run("attention_pattern_patching", spec, tmp_path)
    heads, layers = num_heads(exp.model, 0), exp.model.internals.num_layers
    cells = results["cells"]
    assert [(c["layer"], c["head"]) for c in cells] == [
        (layer, head) for layer in range(layers) for head in range(heads)
    ]
    assert all(c["status"] == "ok" for c in cells) and count == forwards(exp)
    base = results["clean"]["base"]["metrics"]["logit_diff"]
    assert all(c["metrics"]["logit_diff"] != base for c in cells)  # every write moves it
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_neuron_patching_is_a_layer_by_unit_grid_and_all_units_is_the_place(
    spec: str, tmp_path: Path
) -> None:
    exp, results, count = _run("neuron_patching", spec, tmp_path)
    layers = exp.model.internals.num_layers
    cells = results["cells"]
    assert [(c["layer"], c["unit"]) for c in cells] == [
        (layer, unit) for layer in range(layers) for unit in range(16)
    ]
    assert all(c["status"] == "ok" for c in cells) and count == forwards(exp)
    base = results["clean"]["base"]["per_row"]["logit_diff"]
    assert any(c["per_row"]["logit_diff"] != base for c in cells)
    _files_ok(tmp_path, results)
    # every unit patched from the source (a plan: the source read, the base written) is
    # the whole place patched by an interchange
    text = (
        (DOCS / "neuron_patching.yaml")
        .read_text()
        .replace("axes: [layers, units]", "axes: [layers]")
    )
    whole = run(
        _doc(tmp_path, text.replace("units: {start: 0, stop: 16}", "units: all"), "all.yaml"),
        tmp_path / "all",
        model=exp.model,
        spec=spec,
    )
    place = run(
        _doc(tmp_path, text.replace("    units: {start: 0, stop: 16}\n", ""), "place.yaml"),
        tmp_path / "place",
        model=exp.model,
        spec=spec,
    )
    for a, b in zip(whole["cells"], place["cells"], strict=True):
        assert a["per_row"]["logit_diff"] == pytest.approx(b["per_row"]["logit_diff"], abs=1e-5)
        assert a["per_row"]["logit_diff"] != base


@pytest.mark.parametrize("spec", FAMILIES)
def test_attribution_patching_estimates_the_patches_beside_it(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("attribution_patching", spec, tmp_path)
    assert all(c["status"] == "ok" for c in results["cells"]) and count == forwards(exp)
    layers = exp.model.internals.num_layers
    assert results["backwards"] == layers * 4  # one per cell (one batch each)
    base = results["clean"]["base"]["metrics"]["logit_diff"]
    cells = _cells(results)

    def pair(layer: int, index: int) -> tuple[float, float]:
        at = f"layer={layer}|position={json.dumps({'index': index})}"
        patched = cells[f"patched|{at}"]["metrics"]["logit_diff"] - base
        return patched, cells[f"estimated|{at}"]["metrics"]["atp[logit_diff]"]

    # the same token at the same place of both prompts: nothing to patch, nothing to score
    assert pair(0, -1) == (0.0, 0.0)
    # one block before the logits, the first-order estimate is close to the patch
    patched, estimated = pair(layers - 1, -1)
    assert patched != 0 and estimated == pytest.approx(patched, rel=0.1)
    assert sorted(p.name for p in (tmp_path / "plots").glob("*.png")) == [
        "estimated_atp_logit_diff.png",
        "patched_logit_diff.png",
    ]


def test_an_attribution_is_checked(tmp_path: Path) -> None:
    text = (DOCS / "attribution_patching.yaml").read_text()
    issues, _ = static_issues(
        _doc(tmp_path, text.replace("metric: logit_diff, method", "metric: logprob, method"))
    )
    assert [i.code for i in issues] == ["D012"] and "logprob" in issues[0].message
    both = text.replace(
        "{attribute: {site: stream,", "{writes: [from_source], attribute: {site: stream,"
    )
    issues, _ = static_issues(_doc(tmp_path, both))
    assert [i.code for i in issues] == ["D016"]


def test_units_need_a_width_and_stay_inside_it(tmp_path: Path) -> None:
    text = (DOCS / "neuron_patching.yaml").read_text()
    issues = _issues(tmp_path, text.replace("units: {start: 0, stop: 16}", "units: [0, 100000]"))
    assert [i.code for i in issues] == ["D044"] and "units [100000] beyond" in issues[0].message
    probs = text.replace("component: mlp_activation", "component: attention_probs")
    issues, _ = static_issues(_doc(tmp_path, probs))
    assert issues == []  # the width is the model's to say: checked with it
    with pytest.raises(DocumentError) as caught:
        build(_doc(tmp_path, probs), model=load_model("tiny:llama", True))
    assert [i.code for i in caught.value.issues] == ["D018"]


@pytest.mark.parametrize("spec", FAMILIES)
def test_attention_knockout_moves_the_last_token(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("attention_knockout", spec, tmp_path)
    cells = results["cells"]
    assert len(cells) == exp.model.internals.num_layers and count == forwards(exp)
    assert all(c["status"] == "ok" and c["metrics"]["kl"] > 0 for c in cells)


# ------------------------------------------------------------------ refused cells

MID = """\
document: 1
name: mid-ablation
model: {checkpoint: tiny:llama, engine: hooks}
data:
  rows: [{base: "Mary and John ran to his door", answer: " the"}]
sites:
  mid: {component: block_mid, layers: all, positions: {index: -1}}
writes:
  zero: {site: mid, value: zero}
interventions:
  ablated: {writes: [zero]}
metrics: [{metric: kl}]
sweep: {site: mid, axes: [layers]}
"""


def _doc(tmp_path: Path, text: str, name: str = "doc.yaml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return load(path)


def test_a_place_the_family_lacks_is_a_refused_cell_not_an_error(tmp_path: Path) -> None:
    source = _doc(tmp_path, MID)
    out = tmp_path / "out"
    results = run(source, out, model=load_model("tiny:gpt_neox"), spec="tiny:gpt_neox")
    cells = results["cells"]
    assert cells and all(c["status"] == "refused" for c in cells)
    assert all("parallel" in c["reason"] for c in cells)
    assert "refused" in (out / "metrics" / "kl.csv").read_text()
    # the same document on a family that has the place runs every cell
    fine = run(source, tmp_path / "llama", model=load_model("tiny:llama"), spec="tiny:llama")
    assert all(c["status"] == "ok" for c in fine["cells"])


# ------------------------------------------------------------------ bad documents

GOOD = (DOCS / "logit_lens.yaml").read_text()


def _issues(tmp_path: Path, text: str, spec: str = "tiny:llama") -> list[Any]:
    source = _doc(tmp_path, text)
    out = tmp_path / "out"
    with pytest.raises(DocumentError) as caught:
        run(source, out, model=load_model(spec), spec=spec)
    assert not out.exists(), "a refused document wrote something"
    return caught.value.issues


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(
    ("old", "new", "code", "hint"),
    [
        (
            "component: block_output",
            "component: block_ouput",
            "D010",
            "did you mean 'block_output'",
        ),
        ("metrics:", "metircs:", "D002", "did you mean 'metrics'"),
        ("{metric: logprob}", "{metric: log_prob}", "D011", "did you mean 'logprob'"),
        ("layers: all", "layers: [0, 7]", "D040", "layers [7] beyond the model"),
        (
            "positions: {index: -1}",
            "positions: {index: 40}",
            "D042",
            "is outside row 0: 'When Mary",
        ),
        ('answer: " the"}', 'answer: " Paris"}', "D043", "' Paris' is 3 tokens"),
        (
            "  engine: hooks",
            "  engine: hooks\n  trust_remote_code: true",
            "D021",
            "--trust-remote-code",
        ),
        ("sweep:", "save: {path: ../elsewhere}\nsweep:", "D020", "leaves the --out folder"),
        ("sweep:", "save: {path: /tmp/elsewhere}\nsweep:", "D020", "it is absolute"),
        (
            "sweep:",
            "train: {objective: kl, featurizer: das, labels: source}\nsweep:",
            "D012",
            "names no featurizer",
        ),
        (
            "sweep:",
            "featurizers: {f: {kind: subspac}}\nsweep:",
            "D013",
            "causalab_mini.featurizers",
        ),
    ],
)
def test_a_bad_document_is_refused_before_anything_runs(
    tmp_path: Path, old: str, new: str, code: str, hint: str
) -> None:
    assert GOOD.count(old) == 1, old
    text = GOOD.replace(old, new)
    issues = _issues(tmp_path, text)
    found = [i for i in issues if i.code == code]
    assert found, [str(i) for i in issues]
    assert hint in found[0].message or (code == "D013" and "featurizer" in found[0].message)
    # the place: the line the change is on
    changed = next(line for line in new.splitlines() if line not in old.splitlines())
    assert found[0].line == _line_of(text, changed.strip()[:12]), str(found[0])
    assert str(found[0]).startswith(f"{tmp_path / 'doc.yaml'}:{found[0].line}:")


def test_a_head_beyond_the_model_is_refused(tmp_path: Path) -> None:
    text = (DOCS / "head_patching.yaml").read_text().replace("heads: all", "heads: [1, 9]")
    issues = _issues(tmp_path, text)
    assert [i.code for i in issues] == ["D041"] and "heads [9] beyond" in issues[0].message


def test_every_problem_is_said_at_once(tmp_path: Path) -> None:
    text = GOOD.replace("block_output", "block_ouput").replace("{metric: kl}", "{metric: kll}")
    text = text.replace("name: logit-lens", "name: logit-lens\nsed: 3")
    codes = sorted(i.code for i in _issues(tmp_path, text))
    assert codes == ["D002", "D010", "D011"]


def test_a_missing_or_malformed_data_file_is_refused(tmp_path: Path) -> None:
    rows = 'rows:\n    - {base: "When Mary and John went, John gave it to", answer: " Mary"}\n    - {base: "The capital of the model is", answer: " the"}'
    assert rows in GOOD
    issues = _issues(tmp_path, GOOD.replace(rows, "file: rows.jsonl"))
    assert [i.code for i in issues] == ["D030"] and "rows.jsonl" in issues[0].message
    (tmp_path / "rows.jsonl").write_text('{"base": "The dog ran", "answer": " the"}\n{"base": \n')
    issues = _issues(tmp_path, GOOD.replace(rows, "file: rows.jsonl"))
    assert [i.code for i in issues] == ["D031"] and "line 2" in issues[0].message


def test_a_data_file_is_read_as_the_same_rows(tmp_path: Path) -> None:
    rows = [{"prompt": "The dog ran from the door to", "label": " the"}]
    (tmp_path / "rows.csv").write_text(
        "prompt,label\n" + f"{rows[0]['prompt']},{rows[0]['label']}\n"
    )
    text = (
        GOOD.split("data:")[0]
        + "data:\n  file: rows.csv\n  fields: {base: prompt, answer: label}\nsites:"
        + GOOD.split("sites:")[1]
    )
    source = _doc(tmp_path, text)
    exp = build(source, model=load_model("tiny:llama"))
    assert exp.rows.rows == ({"base": rows[0]["prompt"], "answer": " the"},)
    assert exp.rows.origin == "rows.csv" and exp.rows.digest.startswith("sha256:")


def test_a_json_data_file_and_a_layer_range(tmp_path: Path) -> None:
    rows = [
        {"base": "The dog ran from the door to", "answer": " the"},
        {"base": "Mary ran", "answer": " to"},
    ]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    text = GOOD.split("data:")[0] + "data:\n  file: rows.json\nsites:" + GOOD.split("sites:")[1]
    text = text.replace("layers: all", "layers: {start: 1, stop: 3}")
    results = run(_doc(tmp_path, text), tmp_path / "out", model=load_model("tiny:llama"))
    assert [c["layer"] for c in results["cells"]] == [1, 2]
    assert len(results["clean"]["base"]["per_row"]["logprob"]) == 2
    (tmp_path / "rows.json").write_text(json.dumps({"base": "not a list"}))
    issues, _ = static_issues(_doc(tmp_path, text))
    assert [i.code for i in issues] == ["D031"] and "a list of rows" in issues[0].message


def test_an_out_folder_of_another_document_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    model = load_model("tiny:llama")
    run(_doc(tmp_path, GOOD, "a.yaml"), out, model=model)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = _doc(tmp_path, GOOD.replace("name: logit-lens", "name: other"), "b.yaml")
    with pytest.raises(DocumentError) as caught:
        run(other, out, model=model)
    assert caught.value.issues[0].code == "D050" and "another document" in str(caught.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    strange = tmp_path / "strange"
    strange.mkdir()
    (strange / "notes.txt").write_text("mine")
    with pytest.raises(DocumentError, match="not a document's results"):
        run(other, strange, model=model)


def test_a_save_path_through_a_link_out_of_out_is_refused(tmp_path: Path) -> None:
    out, away = tmp_path / "out", tmp_path / "away"
    out.mkdir()
    away.mkdir()
    (out / "link").symlink_to(away)
    source = _doc(tmp_path, GOOD.replace("sweep:", "save: {path: link/results}\nsweep:"))
    with pytest.raises(DocumentError) as caught:
        run(source, out, model=load_model("tiny:llama"))
    assert caught.value.issues[0].code == "D020"
    assert list(away.iterdir()) == [] and [p.name for p in out.iterdir()] == ["link"]


def test_a_save_path_inside_out_holds_the_results(tmp_path: Path) -> None:
    source = _doc(tmp_path, GOOD.replace("sweep:", "save: {path: lens/here}\nsweep:"))
    run(source, tmp_path / "out", model=load_model("tiny:llama"))
    assert (tmp_path / "out" / "lens" / "here" / "results.json").is_file()


# ------------------------------------------------------------------ the run's folder


def test_an_interrupted_run_keeps_its_cells_and_resumes(tmp_path: Path) -> None:
    source = load(DOCS / "activation_patching.yaml")
    model, out = load_model("tiny:llama"), tmp_path / "out"
    seen: list[str] = []

    def stop_after_two(record: dict[str, Any]) -> None:
        seen.append(record["key"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(source, out, model=model, on_cell=stop_after_two)
    kept = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert [c["key"] for c in kept] == seen and not (out / "results.json").exists()
    counted = _counted(model)
    count = next(counted)
    results = run(source, out, model=model, resume=True)
    counted.close()
    cells = _cells(results)
    assert all(cells[c["key"]] == c for c in kept)  # kept as they were (their timings too)
    # the forwards of the cells still to run, as counted
    assert len(cells) == 18 and results["forwards"] == count[0]
    fresh = run(source, tmp_path / "fresh", model=model)
    for key, cell in _cells(fresh).items():
        assert cell["metrics"] == cells[key]["metrics"]


def test_a_mean_over_identical_rows_and_tokens_changes_nothing(tmp_path: Path) -> None:
    # every row the same text of one repeated token: the mean over rows and tokens of
    # the first layer's input is each token's own value, so the write is the identity
    text = (DOCS / "ablation.yaml").read_text()
    start, stop = text.index("  rows:"), text.index("sites:")
    rows = '  rows:\n    - {base: " the the the", answer: " the"}\n' * 1
    rows += '    - {base: " the the the", answer: " the"}\n'
    text = text[:start] + rows + text[stop:]
    text = text.replace("component: mlp_output", "component: block_input")
    results = run(_doc(tmp_path, text), tmp_path / "out", model=load_model("tiny:llama"))
    clean = results["clean"]["base"]["metrics"]
    first = _cells(results)["mean_ablated|layer=0"]["metrics"]
    # (the mean of equal floats can round in its last bit: KL of order 1e-8, where a
    # zero write gives 1e-4)
    assert first["kl"] < 1e-6 and first["logprob"] == pytest.approx(clean["logprob"], abs=1e-5)
    # later layers' inputs differ by token (attention mixes them in): the mean moves them
    assert _cells(results)["mean_ablated|layer=1"]["metrics"]["kl"] > 0
    assert _cells(results)["zero_ablated|layer=0"]["metrics"]["kl"] > 1e-5


def test_nonfinite_logits_are_said_not_averaged(tmp_path: Path) -> None:
    import torch

    from causalab_mini.documents.execute import measure

    exp = _built("logit_lens", "tiny:llama")
    logits = torch.zeros(2, exp.model.config.vocab_size)
    logits[1, 3] = float("nan")
    out = measure(exp, logits, {"base": torch.zeros_like(logits)})
    assert out["nonfinite"] == [1] and out["metrics"]["logprob"] is None
    assert out["per_row"]["logprob"][0] is not None and out["per_row"]["logprob"][1] is None
    json.dumps(out, allow_nan=False)


def test_the_receipt_records_versions_and_digests_and_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "hf_s3cr3t_value_not_to_be_seen"
    monkeypatch.setenv("HF_TOKEN", secret)
    monkeypatch.setenv("NDIF_API_KEY", secret)
    source = load(DOCS / "logit_lens.yaml")
    run(source, tmp_path, model=load_model("tiny:llama"))
    receipt = json.loads((tmp_path / "receipt.json").read_text())
    assert receipt["document"]["digest"] == source.digest
    assert receipt["data"]["digest"].startswith("sha256:") and receipt["seed"] == 0
    assert receipt["versions"]["torch"] and receipt["versions"]["causalab-mini"]
    assert receipt["device"] == "cpu" and receipt["timings"]["run_seconds"] >= 0
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    assert os.environ["HF_TOKEN"] == secret


# ------------------------------------------------------------------ the command line


def test_validate_prints_every_problem_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("block_output", "block_ouput"))
    done = cli("validate", str(path))
    assert done.exit_code == 1
    line = _line_of(path.read_text(), "block_ouput")
    assert f"{path}:{line}:" in done.output and "D010" in done.output
    assert "did you mean 'block_output'" in done.output
    good = cli("validate", str(DOCS / "logit_lens.yaml"), "--static")
    assert good.exit_code == 0 and "valid" in good.output


def test_run_and_explain_on_the_command_line(tmp_path: Path) -> None:
    doc = str(DOCS / "logit_lens.yaml")
    explained = cli("explain", doc, "--model", "tiny:gpt2")
    assert explained.exit_code == 0 and "model: tiny:gpt2:" in explained.output
    done = cli("run", doc, "--out", str(tmp_path / "out"))
    assert done.exit_code == 0, done.output
    assert "3 cells (0 refused)" in done.output
    assert (tmp_path / "out" / "plots" / "lensed_kl.png").is_file()


def test_tokens_is_positions_under_its_new_name() -> None:
    new = cli("tokens", "tiny:llama", "The fox")
    old = cli("positions", "tiny:llama", "The fox")
    assert new.exit_code == 0 and new.output == old.output and "anchor bos" in new.output


# ------------------------------------------------------------------ pieces


def test_metrics_per_row_against_their_definitions() -> None:
    import torch

    from causalab_mini.documents.metrics import Metric, per_row

    torch.manual_seed(0)
    logits, reference = torch.randn(3, 11), torch.randn(3, 11)
    tokens = {"answer": torch.tensor([1, 4, 7]), "contrast": torch.tensor([2, 2, 2])}
    logprobs = torch.log_softmax(logits, -1)
    rows = torch.arange(3)
    got = {m: per_row(Metric(m), logits, tokens, reference) for m in ("logit_diff", "logprob")}
    assert torch.equal(got["logit_diff"], logits[rows, [1, 4, 7]] - logits[rows, 2])
    assert torch.equal(got["logprob"], logprobs[rows, [1, 4, 7]])
    cross = per_row(Metric("cross_entropy"), logits, tokens, reference)
    assert torch.allclose(
        cross, torch.nn.functional.cross_entropy(logits, tokens["answer"], reduction="none")
    )
    kl = per_row(Metric("kl"), logits, tokens, reference)
    expected = torch.nn.functional.kl_div(
        logprobs, torch.log_softmax(reference, -1), log_target=True, reduction="none"
    ).sum(-1)
    assert torch.allclose(kl, expected) and (kl > 0).all()
    assert torch.equal(per_row(Metric("kl"), logits, tokens, logits), torch.zeros(3))
    top = logits.argmax(-1)
    accuracy = per_row(Metric("accuracy"), logits, {"answer": top}, reference)
    assert torch.equal(accuracy, torch.ones(3))
    assert torch.equal(
        per_row(Metric("iia"), logits, tokens, reference), (top == tokens["answer"]).float()
    )


def test_a_json_document_is_read_with_its_places(tmp_path: Path) -> None:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(GOOD)
    data["sites"]["stream"]["component"] = "block_ouput"
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(data, indent=2))
    issues, _ = static_issues(load(path))
    assert [i.code for i in issues] == ["D010"]
    assert issues[0].line == _line_of(path.read_text(), '"block_ouput"')


def test_the_second_source_of_a_row_is_patched_from(tmp_path: Path) -> None:
    text = (DOCS / "activation_patching.yaml").read_text()
    swap = text.replace("{site: stream, value: source}", "{site: stream, value: source, source: 1}")
    # rows of one source cannot give a second
    issues, _ = static_issues(_doc(tmp_path, swap, "one.yaml"))
    assert [i.code for i in issues] == ["D033"] and "rows [0, 1]" in issues[0].message
    # every source of a row must have the positions (an interchange resolves each)
    short = swap.replace('source: "When', 'source: ["The dog", "When').replace(
        'to", answer', 'to"], answer'
    )
    with pytest.raises(DocumentError) as caught:
        build(_doc(tmp_path, short, "short.yaml"), model=load_model("tiny:llama"))
    assert {i.code for i in caught.value.issues} == {"D042"} and "'The dog'" in str(caught.value)
    for old in (
        "When John and Mary went, Mary gave it to",
        "When Mary and John went, John gave it to",
    ):
        assert swap.count(f'source: "{old}"') == 1
        swap = swap.replace(
            f'source: "{old}"',
            f'source: ["The dog ran from his door to the capital of the model", "{old}"]',
        )
    model = load_model("tiny:llama")
    second = run(_doc(tmp_path, swap, "second.yaml"), tmp_path / "a", model=model)
    first = run(_doc(tmp_path, text, "first.yaml"), tmp_path / "b", model=model)
    assert all(c["status"] == "ok" for c in second["cells"])
    full = 'patched|layer=0|position="all"'
    for label in ("logit_diff", "logprob"):  # kl[source] is against source 0, another text
        assert _cells(second)[full]["per_row"][label] == _cells(first)[full]["per_row"][label]


def test_a_split_runs_its_rows_and_per_row_is_saved(tmp_path: Path) -> None:
    text = GOOD.replace(
        "sites:", "  splits: {first: [0, 1], rest: [1, 2]}\n  split: rest\nsites:", 1
    )
    text = text.replace("sweep:", "save: {per_row: true}\nsweep:")
    results = run(_doc(tmp_path, text), tmp_path / "out", model=load_model("tiny:llama"))
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(len(c["per_row"]["logprob"]) == 1 for c in saved["cells"])
    assert saved["cells"] == results["cells"]
    issues, _ = static_issues(_doc(tmp_path, text.replace("split: rest", "split: last")))
    assert [i.code for i in issues] == ["D032"] and "'last'" in issues[0].message


@pytest.mark.parametrize(
    ("old", "new", "code"),
    [
        ("readout: lens}", "readout: lense}", "D012"),
        ("{site: stream, lens: true}", "{site: stream2, lens: true}", "D012"),
        ("  engine: hooks", "  engine: hooks\n  remote: true", "D022"),
        ("component: block_output", "component: logits", "D003"),
    ],
)
def test_references_and_switches_are_checked(tmp_path: Path, old: str, new: str, code: str) -> None:
    assert GOOD.count(old) == 1
    issues, _ = static_issues(_doc(tmp_path, GOOD.replace(old, new)))
    assert code in [i.code for i in issues], [str(i) for i in issues]


def test_a_lens_read_of_several_layers_needs_a_sweep(tmp_path: Path) -> None:
    issues = _issues(tmp_path, GOOD.replace("  axes: [layers]", "  axes: [positions]"))
    assert [i.code for i in issues] == ["D016"] and "several layers" in issues[0].message


def test_a_write_at_a_read_only_component_is_refused(tmp_path: Path) -> None:
    text = MID.replace("component: block_mid", "component: input_ids")
    issues, _ = static_issues(_doc(tmp_path, text))
    assert "D017" in [i.code for i in issues]


def test_the_explain_output_in_the_docs_is_what_explain_prints() -> None:
    page = (REPO / "docs" / "documents.md").read_text()
    command = "$ causalab-mini explain documents/logit_lens.yaml --model tiny:gpt2 --rows 1\n"
    shown = page.split(command, 1)[1].split("```", 1)[0].rstrip("\n")
    cwd = os.getcwd()
    try:
        os.chdir(REPO)
        done = cli("explain", "documents/logit_lens.yaml", "--model", "tiny:gpt2", "--rows", "1")
    finally:
        os.chdir(cwd)
    assert done.exit_code == 0 and done.output.rstrip("\n") == shown


def test_integrated_gradients_count_their_steps(tmp_path: Path) -> None:
    text = (DOCS / "attribution_patching.yaml").read_text()
    text = text.replace("method: atp}", "method: ig, steps: 2}")
    source = _doc(tmp_path, text)
    model = load_model("tiny:llama")
    counted = _counted(model)
    count = next(counted)
    results = run(source, tmp_path / "out", model=model)
    counted.close()
    layers = model.internals.num_layers
    assert count[0] == results["forwards"] and results["backwards"] == layers * 4 * 3
    cells = _cells(results)
    assert cells['estimated|layer=0|position={"index": -1}']["metrics"]["ig[logit_diff]"] == 0.0


def test_a_model_that_cannot_load_is_a_document_error(tmp_path: Path) -> None:
    done = cli("validate", str(DOCS / "logit_lens.yaml"))
    assert done.exit_code == 0
    bad = _doc(tmp_path, GOOD.replace("checkpoint: tiny:llama", "checkpoint: tiny:llamaa"))
    with pytest.raises(DocumentError) as caught:
        build(bad)
    assert [i.code for i in caught.value.issues] == ["D045"]
    assert caught.value.issues[0].line == _line_of(GOOD, "checkpoint:")


# ------------------------------------------------------------------ fits and steering


def _subspace_cosine(path: Path, seed: int, width: int) -> float:
    """|cos| between a saved one-dimensional subspace and the seed's own direction."""
    from causalab_mini.featurizers import Subspace, load

    fitted = load(str(path)).matrix.detach()
    planted = Subspace(1, seed=seed, width=width).matrix.detach()
    return float((fitted @ planted.T).abs())


@pytest.mark.parametrize("spec", FAMILIES)
def test_das_fit_finds_the_planted_direction(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("das_fit", spec, tmp_path)
    cells = _cells(results)
    layers = exp.model.internals.num_layers
    assert len(cells) == 1 + layers and all(c["status"] == "ok" for c in cells.values())
    # explain says the forwards of every epoch; a fit that stops early makes fewer
    assert count == results["forwards"] <= forwards(exp)
    assert results["backwards"] == sum(
        len(c["train"]["history"]) * 4 for c in cells.values() if "train" in c
    )
    # the planted run is its own labels: every top token, no divergence
    assert cells["planted"]["metrics"] == {"iia[labels]": 1.0, "kl[labels]": 0.0}
    clean = results["clean"]["base"]["metrics"]["kl[labels]"]
    at = cells["das|layer=1"]
    history = at["train"]["history"]
    assert 1 <= len(history) <= 30 and history[-1]["loss"] < history[0]["loss"]
    # at the planted layer the fit gives the planted run's top token on the held-out
    # rows and (almost) its distribution
    assert at["metrics"]["iia[labels]"] == 1.0 and at["train"]["eval_iia"] == 1.0
    assert at["metrics"]["kl[labels]"] < clean
    width = exp.model.hidden_size
    cosine = _subspace_cosine(tmp_path / "featurizers" / "das_layer=1_0.safetensors", 3, width)
    if spec == "tiny:llama":
        # the direction itself is found (on tiny:gpt2 the random model's outputs barely
        # move under the planted patch: its top token is the same with and without)
        assert cosine > 0.99 and at["metrics"]["kl[labels]"] < clean / 100
    assert (tmp_path / "plots" / "das_training.png").read_bytes()[:4] == b"\x89PNG"
    _files_ok(tmp_path, results)


def _short_fit(text: str) -> str:
    return text.replace("layers: all", "layers: [1]").replace("epochs: 30", "epochs: 3")


def test_a_fit_is_the_same_for_the_same_seed_and_not_for_another(tmp_path: Path) -> None:
    text = _short_fit((DOCS / "das_fit.yaml").read_text())
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    model = load_model("tiny:gpt2")
    runs = [
        run(_doc(tmp_path, t, f"{n}.yaml"), tmp_path / str(n), model=model)
        for n, t in enumerate([text, text, text.replace("seed: 7", "seed: 8")])
    ]
    first, again, other = (_cells(r)["das|layer=1"] for r in runs)
    assert first["train"]["history"] == again["train"]["history"]
    assert first["per_row"] == again["per_row"]
    assert first["train"]["history"] != other["train"]["history"]


def test_a_zero_length_subspace_changes_nothing(tmp_path: Path) -> None:
    text = (DOCS / "das_fit.yaml").read_text()
    text = text.replace("das: {kind: subspace, k: 1, seed: 7}", "das: {kind: subspace, k: 0}")
    text = (
        text.split("\ntrain:")[0]
        + "\nmetrics:\n  - {metric: kl}\n  - {metric: kl, against: source}\n"
        + "sweep: {site: stream, axes: [layers]}\n"
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    for spec in FAMILIES:
        results = run(_doc(tmp_path, text), tmp_path / spec[5:], model=load_model(spec))
        cells = _cells(results)
        base = results["clean"]["base"]
        for layer in range(3):
            assert cells[f"das|layer={layer}"]["per_row"] == base["per_row"], spec
        assert cells["planted"]["metrics"]["kl"] > 0  # a one-dimensional one does


@pytest.mark.parametrize("spec", FAMILIES)
def test_dbm_fit_opens_the_planted_units(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("dbm_fit", spec, tmp_path)
    cells = _cells(results)
    assert all(c["status"] == "ok" for c in cells.values())
    assert count == results["forwards"] <= forwards(exp)
    assert cells["planted"]["metrics"] == {"iia[labels]": 1.0, "kl[labels]": 0.0}
    fitted = cells["masked|layer=1"]
    mask = fitted["train"]["mask"]
    assert len(mask) == exp.model.hidden_size
    top = sorted(range(len(mask)), key=lambda i: -mask[i])[:3]
    assert sorted(top) == [3, 17, 40] and fitted["train"]["open"] == 3
    assert min(mask[i] for i in top) > 0.5 > max(m for i, m in enumerate(mask) if i not in top)
    assert fitted["metrics"]["iia[labels]"] == 1.0
    kl = {layer: cells[f"masked|layer={layer}"]["metrics"]["kl[labels]"] for layer in range(3)}
    assert kl[1] == min(kl.values()) < results["clean"]["base"]["metrics"]["kl[labels]"]
    _files_ok(tmp_path, results)


@pytest.mark.parametrize("spec", FAMILIES)
def test_pca_control_carries_more_than_random_directions(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("pca_control", spec, tmp_path)
    cells = _cells(results)
    layers = exp.model.internals.num_layers
    assert len(cells) == 2 * layers and all(c["status"] == "ok" for c in cells.values())
    assert count == results["forwards"] == forwards(exp)
    clean = results["clean"]["base"]["metrics"]["kl[source]"]
    for layer in range(layers):
        pca = cells[f"pca|layer={layer}"]["metrics"]["kl[source]"]
        random = cells[f"random|layer={layer}"]["metrics"]["kl[source]"]
        assert pca < random < clean
        assert 0 < results["fits"]["pca"][f"block_output[{layer}]"]["explained"] <= 1
    _files_ok(tmp_path, results)


def test_a_pca_of_no_direction_changes_nothing_and_of_every_one_is_the_source(
    tmp_path: Path,
) -> None:
    text = (DOCS / "pca_control.yaml").read_text()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    for spec in FAMILIES:
        model = load_model(spec)
        width = model.hidden_size
        none = run(
            _doc(tmp_path, text.replace("k: 4, fit", "k: 0, fit"), "none.yaml"),
            tmp_path / f"none{spec[5:]}",
            model=model,
        )
        every = run(
            _doc(tmp_path, text.replace("k: 4, fit", f"k: {width}, fit"), "every.yaml"),
            tmp_path / f"every{spec[5:]}",
            model=model,
        )
        base = none["clean"]["base"]["per_row"]
        for layer in range(3):
            assert _cells(none)[f"pca|layer={layer}"]["per_row"] == base
        # every direction of the last layer's output at the last token: the source's logits
        last = _cells(every)["pca|layer=2"]["metrics"]
        assert last["kl[source]"] < 1e-6 and last["iia[source]"] == 1.0


@pytest.mark.parametrize("spec", FAMILIES)
def test_sae_ablation_is_a_layer_by_feature_grid(spec: str, tmp_path: Path) -> None:
    exp, results, count = _run("sae_ablation", spec, tmp_path)
    cells = results["cells"]
    layers = exp.model.internals.num_layers
    assert [(c["layer"], c["feature"]) for c in cells] == [
        (layer, f) for layer in range(layers) for f in range(16)
    ]
    assert all(c["status"] == "ok" for c in cells) and count == forwards(exp)
    assert any(c["metrics"]["kl"] > 0 for c in cells)
    for layer in range(layers):
        fit = results["fits"]["sae"][f"block_output[{layer}]"]
        assert fit["explained"] > 0.5 and 0 < fit["active"] < 16  # sparse, and it fits
    _files_ok(tmp_path, results)


def test_a_cell_run_a_row_at_a_time_is_measured_against_the_clean_run_made_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cells whose positions name different numbers of tokens per row run one row at a
    time; their metrics are taken against the clean logits made one row at a time too
    (a row's logits round apart in batches of other sizes on some CPUs), made once per
    run and counted: a zero-feature ablation there is exactly the clean run."""
    from causalab_mini.documents import cells as runner

    sizes: list[int | None] = []
    clean = runner.clean_logits

    def spied(exp: Any, role: str, slot: int = 0, size: int | None = None) -> Any:
        sizes.append(size)
        return clean(exp, role, slot, size)

    monkeypatch.setattr(runner, "clean_logits", spied)
    text = (DOCS / "sae_ablation.yaml").read_text()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    none = text.replace("features: {start: 0, stop: 16}", "features: {start: 0, stop: 0}")
    doc = _doc(tmp_path, none.replace("axes: [layers, features]", "axes: [layers]"), "none.yaml")
    exp = build(doc, model=load_model("tiny:llama"))
    results = run(doc, tmp_path / "none", model=exp.model)
    assert sizes.count(1) == sizes.count(None) == 2, sizes  # base and source, once each
    assert exp.batch_size > 1 and len(results["cells"]) == exp.model.internals.num_layers
    assert all(c["per_row"]["kl"] == [0.0] * len(exp.rows.rows) for c in results["cells"])


def test_sae_ablation_of_no_feature_changes_nothing_and_a_saved_sae_is_the_same(
    tmp_path: Path,
) -> None:
    text = (DOCS / "sae_ablation.yaml").read_text()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    model = load_model("tiny:llama")
    axes = "axes: [layers, features]"
    none = text.replace("features: {start: 0, stop: 16}", "features: {start: 0, stop: 0}")
    results = run(
        _doc(tmp_path, none.replace(axes, "axes: [layers]"), "none.yaml"),
        tmp_path / "none",
        model=model,
    )
    for cell in results["cells"]:
        assert (
            cell["metrics"]["kl"] == 0.0 and cell["per_row"] == results["clean"]["base"]["per_row"]
        )
    every = text.replace("features: {start: 0, stop: 16}", "features: all")
    results = run(
        _doc(tmp_path, every.replace(axes, "axes: [layers]"), "all.yaml"),
        tmp_path / "all",
        model=model,
    )
    assert all(c["metrics"]["kl"] > 0 for c in results["cells"])
    # the SAE the run trained and saved, named as a file beside the document: the same cells
    trained = run(_doc(tmp_path, text, "trained.yaml"), tmp_path / "trained", model=model)
    for layer in range(3):
        saved = tmp_path / "trained" / "featurizers" / f"sae_block_output_{layer}.safetensors"
        (tmp_path / "data" / f"sae_{layer}.safetensors").write_bytes(saved.read_bytes())
    from_file = text.replace(
        "features: 32, seed: 0, fit: {split: train, epochs: 300, learning_rate: 0.01, l1: 0.4}",
        'file: "data/sae_{layer}.safetensors"',
    )
    assert from_file != text
    loaded = run(_doc(tmp_path, from_file, "file.yaml"), tmp_path / "file", model=model)
    assert [c["metrics"] for c in loaded["cells"]] == [c["metrics"] for c in trained["cells"]]


@pytest.mark.parametrize("spec", FAMILIES)
def test_steering_moves_generation_and_scale_0_leaves_it(spec: str, tmp_path: Path) -> None:
    from causalab_mini import compat

    if not compat.is_08():
        pytest.skip("the steering document generates: Plan.generate needs nnsight 0.8")
    exp, results, count = _run("steering", spec, tmp_path)
    cells = results["cells"]
    assert len(cells) == 2 * exp.model.internals.num_layers
    assert all(c["status"] == "ok" for c in cells) and count == results["forwards"]
    assert all(len(c["generated"]) == 3 for c in cells)
    assert all(c["metrics"]["unchanged"] < 1 and c["metrics"]["kl"] > 0 for c in cells)
    _files_ok(tmp_path, results)
    text = (DOCS / "steering.yaml").read_text().replace("scale: 8", "scale: 0")
    still = run(_doc(tmp_path, text), tmp_path / "still", model=exp.model, spec=spec)
    assert all(c["per_row"]["unchanged"] == [1.0, 1.0, 1.0] for c in still["cells"])
    assert len({json.dumps(c["generated"]) for c in still["cells"]}) == 1
    assert all(c["metrics"]["kl"] < 1e-6 for c in still["cells"])


BAD_SECTIONS = [
    # a featurizer on a place with no width: refused with the model
    (
        "das_fit",
        "component: block_output, layers: [1]",
        "component: attention_probs, layers: [1]",
        "D018",
    ),
    ("das_fit", "kind: subspace, k: 1, seed: 7", "kind: subspase, k: 1, seed: 7", "D013"),
    ("das_fit", "featurizer: das\n  labels", "featurizer: planted_\n  labels", "D012"),
    ("das_fit", "labels: {intervention: planted}", "labels: {intervention: das}", "D016"),
    ("das_fit", "labels: {intervention: planted}", "labels: {field: answer}", "D016"),
    ("das_fit", "eval_split: test", "eval_split: tset", "D032"),
    (
        "das_fit",
        "interventions:\n  planted",
        "reads: {lensed: {site: stream, lens: true}}\ninterventions:\n  planted",
        "D016",
    ),
    ("pca_control", "kind: pca, k: 4", "kind: pca, k: 4, seed: 3", "D003"),
    (
        "pca_control",
        "{site: stream, value: source, featurizer: pca}",
        "{site: stream, value: source, featurizer: pcaa}",
        "D012",
    ),
    ("sae_ablation", "features: 32, seed: 0", "file: ../sae.safetensors, seed: 0", "D020"),
    ("sae_ablation", "features: 32, seed: 0", "file: data/nothing.safetensors, seed: 0", "D030"),
    ("sae_ablation", "features: {start: 0, stop: 16}", "features: [0, 32]", "D044"),
    ("sae_ablation", "features: {start: 0, stop: 16}}", "units: [0, 1]}", "D003"),
    ("steering", "engine: nnsight", "engine: hooks", "D014"),
    ("steering", "positions: {index: -1}", "positions: {index: 0}", "D015"),
    ("steering", "kind: renormalize", "kind: renormalise", "D013"),
    ("steering", "{site: stream, mechanism: added}", "{site: stream, mechanism: addd}", "D012"),
    (
        "steering",
        "minus: negative}, scale: 8}\n  renorm",
        "minus: neutral}, scale: 8}\n  renorm",
        "D033",
    ),
    ("steering", "  - {metric: kl}", "  - {metric: iia, against: labels}", "D016"),
]


@pytest.mark.parametrize(("name", "old", "new", "code"), BAD_SECTIONS)
def test_a_bad_fit_or_steering_section_is_refused_before_anything_runs(
    tmp_path: Path, name: str, old: str, new: str, code: str
) -> None:
    text = (DOCS / f"{name}.yaml").read_text()
    assert text.count(old) == 1, old
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_bytes((DOCS / "data" / "pairs.jsonl").read_bytes())
    issues = _issues(tmp_path, text.replace(old, new))
    found = [i for i in issues if i.code == code]
    assert found, [str(i) for i in issues]
    # the place: the line the change is on (a sweep's or a generation's own line where
    # that is what does not fit)
    elsewhere = {"D014": "steered: {input", "D003": "axes: [layers, features]"}
    changed = text.replace(old, new)
    if code == "D014" or (code == "D003" and "units" in new):
        assert found[0].line == _line_of(changed, elsewhere[code]), str(found[0])
    else:
        assert found[0].line == changed[: changed.index(new)].count("\n") + 1, str(found[0])


def _pairs_beside(tmp_path: Path, label: str | None = None) -> None:
    (tmp_path / "data").mkdir(exist_ok=True)
    lines = (DOCS / "data" / "pairs.jsonl").read_text().splitlines()
    if label is not None:
        lines = [json.dumps({**json.loads(line), "label": label}) for line in lines]
    (tmp_path / "data" / "pairs.jsonl").write_text("\n".join(lines) + "\n")


def test_an_interrupted_fit_resumes_to_the_same_cells(tmp_path: Path) -> None:
    _pairs_beside(tmp_path)
    source = _doc(tmp_path, (DOCS / "das_fit.yaml").read_text().replace("epochs: 30", "epochs: 3"))
    model, out = load_model("tiny:gpt2"), tmp_path / "out"
    seen: list[str] = []

    def stop_after_two(record: dict[str, Any]) -> None:
        seen.append(record["key"])
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(source, out, model=model, on_cell=stop_after_two)
    resumed = run(source, out, model=model, resume=True)
    fresh = run(source, tmp_path / "fresh", model=model)
    assert [c["key"] for c in resumed["cells"]] == [c["key"] for c in fresh["cells"]]
    for a, b in zip(resumed["cells"], fresh["cells"], strict=True):
        assert a["per_row"] == b["per_row"] and a.get("train", {}).get("history") == b.get(
            "train", {}
        ).get("history")


@pytest.mark.parametrize(
    ("labels", "objective", "metric"),
    [
        ("source", "kl", "{metric: iia, against: source}"),
        ("source", "cross_entropy", "{metric: kl, against: labels}"),
        ("{field: label}", "cross_entropy", "{metric: iia, target: label}"),
    ],
)
def test_a_fit_learns_labels_of_every_kind(
    tmp_path: Path, labels: str, objective: str, metric: str
) -> None:
    _pairs_beside(tmp_path, label=" the")
    text = (DOCS / "das_fit.yaml").read_text().replace("epochs: 30", "epochs: 2")
    text = text.replace("labels: {intervention: planted}", f"labels: {labels}")
    text = text.replace("objective: kl", f"objective: {objective}").replace(
        "layers: all", "layers: [1]"
    )
    text = text.replace(
        "  - {metric: iia, against: labels}\n  - {metric: kl, against: labels}", f"  - {metric}"
    )
    results = run(_doc(tmp_path, text), tmp_path / "out", model=load_model("tiny:llama"))
    fitted = _cells(results)["das|layer=1"]
    assert fitted["status"] == "ok" and len(fitted["train"]["history"]) == 2
    assert all(math.isfinite(v) for v in fitted["metrics"].values())


def test_a_label_field_is_one_token_in_every_row_a_fit_reads(tmp_path: Path) -> None:
    _pairs_beside(tmp_path, label=" the")
    text = (DOCS / "das_fit.yaml").read_text().replace("objective: kl", "objective: cross_entropy")
    text = text.replace("labels: {intervention: planted}", "labels: {field: base}")
    text = text.replace(
        "  - {metric: iia, against: labels}\n  - {metric: kl, against: labels}",
        "  - {metric: iia, target: label}",
    )
    issues = _issues(tmp_path, text)
    assert [i.code for i in issues] == ["D043"] and "train labels" in issues[0].message
    assert issues[0].line == _line_of(text, "labels: {field: base}")


@pytest.mark.parametrize("name", ["das_fit", "dbm_fit", "pca_control", "sae_ablation", "steering"])
def test_explaining_a_fit_or_a_generation_runs_no_forward(name: str) -> None:
    exp = build(load(DOCS / f"{name}.yaml"))  # its own model, fresh
    text = explain(exp)
    assert not exp.model.dispatched  # nothing fitted, harvested or generated to say it
    assert f"forwards: {forwards(exp)} " in text and "fits and steering:" in text


def _readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split(f"<!-- {marker} -->\n", 1)[1]
    return after.split("\n", 1)[1].split("```\n", 1)[0]  # the fenced block's body


def test_the_readme_shows_the_main_document_and_what_explain_says_of_it() -> None:
    """README's research section: the document its main command runs, as the file is,
    and the first lines of `causalab-mini explain` on it, as the command says them."""
    assert _readme_block("document") == (REPO / "documents/activation_patching.yaml").read_text(
        encoding="utf-8"
    )
    shown = _readme_block("explain")
    said = cli("explain", "documents/activation_patching.yaml")
    assert said.exit_code == 0, said.output
    assert said.output.startswith(shown), (shown, said.output[: len(shown) + 200])
