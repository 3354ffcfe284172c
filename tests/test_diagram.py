"""A picture of a block: valid SVG for every structure, drawn from the model's own rows,
naming the places the block refuses (and why), and the committed docs/diagrams fresh."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from causalab_mini.model import StandardizedTransformer
from causalab_mini.tools.cli import main
from causalab_mini.tools.diagram import Scene, Tap, diagram, render_svg

from .conftest import REPO

pytestmark = pytest.mark.slow

SVG = "{http://www.w3.org/2000/svg}"
# structure -> the model docs/diagrams/<structure>.svg is drawn from, and what it refuses
# (an MLP is gated or not: a gated one refuses mlps_pre, a plain one mlps_gate and
# mlps_up; a dense one, with no experts, the router's and experts' places; a post-norm
# block refuses the heads' terms of the output projection)
DENSE = {
    "routers_logits",
    "routers_weights",
    "routers_indices",
    "mlps_expert_output",
    "mlps_shared_expert",
}
GATED, PLAIN = {"mlps_pre"} | DENSE, {"mlps_gate", "mlps_up"} | DENSE
# places drawn as lines inside their sublayer's box, and their labels
INNER = {
    "attentions_head_output": "per head",
    "mlps_gate": "gate",
    "mlps_up": "up",
    "mlps_pre": "pre",
}
STRUCTURES = {
    "pre_norm": ("tiny:llama", GATED),
    "sandwich_norm": ("tiny:gemma2", GATED | {"attentions_head_output"}),
    "post_norm": (
        "tiny:olmo2",
        GATED | {"attentions_norm_output", "mlps_norm_output", "attentions_head_output"},
    ),
    "parallel": ("tiny:gpt_neox", PLAIN | {"layers_mid", "mlps_norm_output"}),
    "residual_inside": ("tiny:bloom", PLAIN),
    "post_ln": (
        "tiny:openai-gpt",
        PLAIN | {"attentions_norm_output", "mlps_norm_output"},
    ),
}


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def load(tiny_model: Callable[..., StandardizedTransformer]) -> Callable[[str], Any]:
    """The session's shared model for ``spec``, attention probabilities enabled."""
    return lambda spec: tiny_model(spec, probs=True)


def _texts(root: ET.Element) -> str:
    return "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_one_valid_svg_per_structure_naming_what_it_refuses(
    structure: str, load: Callable[[str], Any]
) -> None:
    spec, refused = STRUCTURES[structure]
    model = load(spec)
    assert model.block_structure == structure
    svg = diagram(model, 0, spec)
    root = ET.fromstring(svg)  # well-formed XML
    assert root.tag == f"{SVG}svg" and int(root.get("width", "0")) > 0
    text = _texts(root)
    assert f"block '{structure}'" in text
    status = model.internals.status(0)
    # GPT-1 has no final norm: a whole-model place, listed but not drawn in the block
    # (the sums before a norm that follows the add are rows of post_ln blocks only:
    # other models do not have them, so they are neither drawn nor listed)
    unplaced = {"ln_final_output"} if structure == "post_ln" else set()
    assert ("layers_mid_prenorm" in status) == (structure == "post_ln")
    assert {name for name, reason in status.items() if reason is not None} == refused | unplaced
    marked = {
        "".join(g.find(f"{SVG}text").itertext())  # type: ignore[union-attr]
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "place refused"
    }
    # each refused place is marked where it would sit: on the stream, or a line inside
    # its sublayer's box (a dense MLP's router and experts have no place in the drawing
    # of a dense block: they are listed below with their reason)
    assert marked == refused - set(INNER) - DENSE
    for name in refused & set(INNER):
        assert f"{INNER[name]}: refused" in text
    for name in refused | unplaced:  # ... and listed with the registry's whole reason
        # (one entry per reason: places sharing one are listed together, "each" for the name)
        assert " ".join(status[name].split()[1:7]) in " ".join(text.split())
    boxes = {
        "".join(g.find(f"{SVG}text").itertext())
        for g in root.iter(f"{SVG}g")  # type: ignore[union-attr]
        if (g.get("class") or "").startswith("box")
    }
    assert {"self_attn", "mlp"} <= boxes
    streams = [p for p in root.iter(f"{SVG}path") if p.get("class") == "stream"]
    assert len(streams) == 1
    adds = [g for g in root.iter(f"{SVG}g") if g.get("class") == "add"]
    assert len(adds) == (1 if structure == "parallel" else 2)  # one add for both sublayers
    if structure == "residual_inside":
        frames = [g for g in root.iter(f"{SVG}g") if g.get("class") == "frame"]
        assert len(frames) == 2 and "adds the residual itself" in text
    assert diagram(model, 0, spec) == svg  # the same model, the same bytes


@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_committed_docs_diagrams_are_fresh(structure: str, load: Callable[[str], Any]) -> None:
    spec, _ = STRUCTURES[structure]
    path = REPO / "docs" / "diagrams" / f"{structure}.svg"
    assert path.read_text() == diagram(load(spec), 0, spec), (
        f"run `registry diagram {spec} docs/diagrams/{structure}.svg`"
    )


def test_diagram_command_and_model_diagram(tmp_path: Path) -> None:
    out = tmp_path / "parallel.svg"
    result = cli("diagram", "tiny:gpt_neox", str(out))
    assert result.exit_code == 0
    assert result.stdout == (
        f"wrote {out}: block parallel, layer 0; refused: layers_mid, mlps_norm_output, "
        "mlps_gate, mlps_up, routers_logits, routers_weights, routers_indices, "
        "mlps_expert_output, mlps_shared_expert\n"
    )
    ET.fromstring(out.read_text())
    plain = cli("model", "tiny:gpt_neox")
    drawn = cli("model", "tiny:gpt_neox", "--diagram", str(tmp_path / "m.svg"))
    assert drawn.exit_code == 0 and drawn.stdout == plain.stdout  # piped text unchanged
    ET.fromstring((tmp_path / "m.svg").read_text())
    assert cli("diagram", "tiny:llama", str(out), "--layer", "9").exit_code == 2


def test_text_from_rows_is_escaped() -> None:
    hostile = '<script>alert(1)</script> & "quotes"'
    scene = Scene(400, 300, hostile, (hostile,))
    scene.taps.append(Tap(10, 10, hostile, (hostile,), False))
    scene.refused.append((hostile, (hostile,)))
    root = ET.fromstring(render_svg(scene))
    assert not list(root.iter(f"{SVG}script"))
    assert hostile in _texts(root)


# blocks of several residual streams (docs/multi-stream.md): structure -> the model and
# layer docs/diagrams/<structure>.svg is drawn from (Qwen4-exp's layer 0 is linear attention)
MULTI_STREAM = {
    "hyper_connections": ("tiny:hy_v4", 0),
    "mixed_hyper_connections": ("tiny:deepseek_v4", 0),
    "gated_hyper_connections": ("tiny:qwen4_exp_text", 1),
    "altup": ("tiny:gemma3n_text", 0),
}


@pytest.mark.parametrize("structure", sorted(MULTI_STREAM))
def test_a_multi_stream_block_draws_its_collapse_and_is_fresh(
    structure: str, load: Callable[[str], Any]
) -> None:
    spec, layer = MULTI_STREAM[structure]
    model = load(spec)
    assert model.block_structure == structure
    svg = diagram(model, layer, spec)
    root = ET.fromstring(svg)
    text = _texts(root)
    boxes = {
        "".join(g.find(f"{SVG}text").itertext())  # type: ignore[union-attr]
        for g in root.iter(f"{SVG}g")
        if (g.get("class") or "").startswith("box")
    }
    assert {"self_attn", "mlp"} <= boxes
    if "attentions_streams_in" in model.internals:  # hyper-connections
        collapse = {
            model.internals[f"{s}_streams_in"].address_at(layer).module
            for s in ("attentions", "mlps")
        }
        assert collapse <= boxes and "collapses the n streams" in text
        assert "attentions_sublayer_output" in text and "mlps_sublayer_output" in text
        assert "is not one tensor on this model" in " ".join(text.split())
    path = REPO / "docs" / "diagrams" / f"{structure}.svg"
    assert path.read_text() == svg, (
        f"run `registry diagram {spec} docs/diagrams/{structure}.svg --layer {layer}`"
    )
