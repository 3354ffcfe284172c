"""A picture of one block: the residual stream, the norms, attention and the MLP, where
each place sits, and which places the model refuses, with the reason.

The geometry is computed here from the model's own rows (``model.internals``, as
resolved for its family and block structure); ``codegen/templates/block.svg.j2`` only
lays the shapes out as plain SVG. ``registry diagram SPEC OUT.svg`` and
``registry model SPEC --diagram OUT.svg`` draw it.
"""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import click

from causalab_mini.tools.completion import complete_spec

__all__ = ["Scene", "block_scene", "diagram", "diagram_command", "render_svg"]

WIDTH = 1040
PARALLEL_WIDTH = 1240
STREAM_X = 150
COLUMN_X = 575  # centre of the sublayer column of a sequential block
PARALLEL_X = (490, 940)  # attention's and the MLP's columns on a parallel block
BOX_W = 240
NORM_H = 40
GAP = 30
LINE = 15  # line height of text inside a box
CHAR = 6.3  # width of one 11px character, for wrapping and placement


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float
    title: str
    lines: tuple[tuple[str, bool], ...] = ()  # (text, ok)
    kind: str = "norm"  # norm | attn | mlp | missing
    subtitle: str = ""

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def bottom(self) -> float:
        return self.y + self.h


@dataclass(frozen=True)
class Frame:
    """A dashed outline: a module that adds the residual itself."""

    x: float
    y: float
    w: float
    h: float
    label: tuple[str, ...]


@dataclass(frozen=True)
class Path:
    points: tuple[tuple[float, float], ...]
    kind: str = "branch"  # stream | branch
    arrow: bool = True

    @property
    def d(self) -> str:
        head, *rest = self.points
        return f"M {head[0]:g} {head[1]:g} " + " ".join(f"L {x:g} {y:g}" for x, y in rest)


@dataclass(frozen=True)
class Tap:
    x: float
    y: float
    names: str
    detail: tuple[str, ...]
    ok: bool
    label_x: float | None = None  # where the text starts, when not beside the marker

    @property
    def tx(self) -> float:
        return self.x + 12 if self.label_x is None else self.label_x

    @property
    def leader(self) -> bool:
        return self.label_x is not None


@dataclass(frozen=True)
class Scale:
    x: float
    y: float
    text: str


@dataclass
class Scene:
    width: int
    height: int
    title: str
    subtitle: tuple[str, ...]
    boxes: list[Box] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    adds: list[tuple[float, float]] = field(default_factory=list)
    junctions: list[tuple[float, float]] = field(default_factory=list)
    taps: list[Tap] = field(default_factory=list)
    scales: list[Scale] = field(default_factory=list)
    refused: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    refused_y: float = 0.0
    legend_y: float = 0.0


# ----------------------------------------------------------------------- the model


@dataclass(frozen=True)
class _Block:
    """What the picture needs from the model, for one layer."""

    structure: str | None
    status: dict[str, str | None]
    where: dict[str, str]  # place -> resolved address text
    module: dict[str, str]  # place -> resolved module path
    scale: dict[str, str]
    attn_class: str
    mlp_class: str
    mlp_norm_guess: str | None  # a parallel block's other norm (reads the block input)
    calls: dict[str, str] = field(default_factory=dict)  # place -> the calls it is read in


def _block(model: Any, layer: int) -> _Block:
    internals = model.internals
    status = internals.status(layer)
    where, module, scale, calls = {}, {}, {}, {}
    for name, reason in status.items():
        place = internals[name]
        if reason is not None:
            continue
        address = place.address_at(layer if place.per_layer else None)
        where[name] = address.describe()
        module[name] = address.module
        if address.source:
            calls[name] = " → ".join(n.rstrip("(").removeprefix("self.") for n in address.source)
        if address.scale:
            scale[name] = address.scale
            where[name] += f" × {address.scale}"
    layer_envoy = model.layers[layer]

    def kind(path: str) -> str:
        from causalab_mini.internals import child

        envoy = child(layer_envoy, path)
        return type(envoy._module).__name__ if envoy is not None else ""

    guess = None
    if status.get("mlps_norm_output") is not None:
        from causalab_mini.internals import child_names

        norms = [
            name
            for name in child_names(layer_envoy, 1)
            if "norm" in kind(name).lower() and name != module.get("attentions_norm_output")
        ]
        guess = norms[0] if len(norms) == 1 else None
    return _Block(
        structure=model.block_structure,
        status=status,
        where=where,
        module=module,
        scale=scale,
        attn_class=kind("self_attn"),
        mlp_class=kind("mlp"),
        mlp_norm_guess=guess,
        calls=calls,
    )


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _gist(reason: str) -> str:
    """A refusal in a few words: the sentence after the generic "X does not exist on
    this model: its block is 'Y'." (the whole reason is listed under the picture)."""
    first, _, rest = reason.partition(". ")
    if "its block is" in first and rest:
        return rest.split(". ")[0].split(" (")[0].rstrip(".")
    return first.split(" (")[0].rstrip(".")


def _needles(text: str) -> str:
    """``self_attn.attention_interface(.nn.functional.dropout(.output`` -> the calls."""
    parts = [p for p in text.split("(") if p]
    return " → ".join(p.strip(".").removesuffix(".output").split(".")[-1] for p in parts[:-1])


def _inside(b: _Block, place: str, container: str) -> bool:
    return b.module.get(place, "").startswith(container + ".")


def _post(b: _Block, place: str, container: str) -> str | None:
    """The module after the sublayer that the contribution is read at (a post-norm)."""
    path = b.module.get(place)
    if path is None or path == container or path.startswith(container + "."):
        return None
    return path


# ----------------------------------------------------------------------- geometry


class _Layout:
    def __init__(self, scene: Scene, b: _Block, room: int = 44) -> None:
        self.s = scene
        self.b = b
        self.room = room  # characters a label beside a column may take

    def ok(self, name: str) -> bool:
        return self.b.status.get(name) is None

    def tap(
        self,
        x: float,
        y: float,
        names: list[str],
        label_x: float | None = None,
        room: int = 44,
    ) -> None:
        """A place marker at (x, y), its label beside it or at ``label_x`` (beyond the
        column's boxes); ``room``: characters the label may take per line."""
        shown = [n for n in names if n in self.b.status]
        if not shown:
            return
        ok = self.ok(shown[0])
        if ok:
            detail: tuple[str, ...] = (_short(self.b.where.get(shown[0], ""), room),)
            label = " = ".join(n for n in shown if self.ok(n))
        else:
            detail = tuple(textwrap.wrap("refused: " + _gist(str(self.b.status[shown[0]])), room))
            label = shown[0]
        limit = 2 if label_x is None else 3  # on the stream, the next branch is close
        if len(detail) > limit:
            detail = (*detail[: limit - 1], _short(detail[limit - 1] + " …", room))
        self.s.taps.append(Tap(x, y, label, detail, ok, label_x))

    def column(
        self,
        cx: float,
        top: float,
        sub: str,  # attentions | mlps
        container: str,  # self_attn | mlp
        pre: str | None,
        pre_note: str = "",
    ) -> tuple[float, float]:
        """Boxes of one sublayer, top to bottom; returns (the y where its contribution
        leaves the column, the y where the column starts)."""
        b = self.b
        x0 = cx - BOX_W / 2
        y = top
        norm_place = f"{sub}_norm_output"
        input_place = f"{sub}_input"
        output_place = f"{sub}_output"
        module_place = sub
        y = self._collapse(cx, y, sub)
        if pre is not None:
            box = Box(x0, y, BOX_W, NORM_H, pre, (), "norm", pre_note)
            self.s.boxes.append(box)
            y = box.bottom + GAP
            self.s.paths.append(Path(((cx, box.bottom), (cx, y))))
        lines = self._inner_lines(sub)
        inside = _inside(b, output_place, container)
        klass = b.attn_class if container == "self_attn" else b.mlp_class
        title = container if self.ok(module_place) else f"{container} (refused)"
        height = 44 + LINE * len(lines)
        kind = (
            ("attn" if container == "self_attn" else "mlp") if self.ok(module_place) else "missing"
        )
        box = Box(x0, y, BOX_W, height, title, tuple(lines), kind, klass)
        self.s.boxes.append(box)
        module_top = y
        # the edge into the sublayer: its input (the norm's output, where there is one)
        into_y = y - GAP / 2
        beside = cx + BOX_W / 2 + 20
        if self.ok(norm_place) or norm_place not in b.status:
            self.tap(cx, into_y, [norm_place, input_place], beside, self.room)
        else:  # the norm place is refused: say so where it would be
            self.tap(cx, into_y, [norm_place], beside, self.room)
        y = box.bottom + GAP
        post = _post(b, output_place, container)
        if post is not None:
            pbox = Box(x0, y, BOX_W, NORM_H, post, (), "norm", "post-norm")
            self.s.boxes.append(pbox)
            self.s.paths.append(Path(((cx, box.bottom), (cx, y))))
            y = pbox.bottom + GAP
        if inside:
            self._frame(cx, module_top, y, container)
        return y, module_top

    def _collapse(self, cx: float, y: float, sub: str) -> float:
        """On a block of several residual streams, what collapses them into the
        sublayer's input comes first: hyper-connections' {sub}_streams_in, or the
        active copy AltUp predicts (layers_active_input, read before attention);
        returns the y below it (``y`` where there is none)."""
        b = self.b
        x0 = cx - BOX_W / 2
        wanted = [f"{sub}_streams_in"] + (["layers_active_input"] if sub == "attentions" else [])
        collapse = next((p for p in wanted if self.ok(p) and p in b.module), wanted[0])
        if self.ok(collapse) and collapse in b.module:
            title = b.module[collapse] or b.calls.get(collapse, "")
            box = Box(x0, y, BOX_W, NORM_H, title, (), "norm", "collapses the n streams")
            self.s.boxes.append(box)
            y = box.bottom + GAP
            self.s.paths.append(Path(((cx, box.bottom), (cx, y))))
            beside = cx + BOX_W / 2 + 20
            self.tap(cx, box.bottom + GAP / 2, [collapse], beside, self.room)
            self.tap(cx, box.y + NORM_H / 2, [f"{sub}_stream_weights"], beside, self.room)
        return y

    def _frame(self, cx: float, module_top: float, y: float, container: str) -> None:
        """The frame around a sublayer that adds the residual itself."""
        self.s.frames.append(
            Frame(
                STREAM_X - 30,
                module_top - 8,
                cx + BOX_W / 2 + 14 - (STREAM_X - 30),
                (y + 8) - (module_top - 8),
                (
                    f"{container} adds the residual itself:",
                    "its output is the stream, so its",
                    "contribution is read inside it",
                ),
            )
        )

    def _inner_lines(self, sub: str) -> list[tuple[str, bool]]:
        b = self.b
        if sub == "attentions":
            places = [
                ("premix", "attentions_premix"),
                ("probabilities", "attention_probabilities"),
                ("per head", "attentions_head_output"),
            ]
        else:
            places = [
                ("gate", "mlps_gate"),
                ("up", "mlps_up"),
                ("pre", "mlps_pre"),
                ("activation", "mlps_activation"),
                ("neurons", "mlps_neurons"),
            ]
        out = []
        inside = "attentions_output" if sub == "attentions" else "mlps_output"
        container = "self_attn" if sub == "attentions" else "mlp"
        if _inside(b, inside, container):
            out.append((f"contribution: {_short(b.where[inside], 28)}", True))
        for label, place in places:
            if place not in b.status:
                continue
            if self.ok(place):
                text = b.where[place].removeprefix(container + ".")
                if "(" in text:  # an operation inside the forward
                    text = _needles(text)
                out.append((f"{label}: {_short(text, 27)}", True))
            else:
                out.append((f"{label}: refused", False))
        return out


def _output_names(b: _Block, sub: str) -> list[str]:
    """The place drawn where a sublayer's output leaves its column: its contribution, or,
    on a block of several streams where the contribution is not one tensor, the
    sublayer's own output (the refused contribution is listed under the picture)."""
    own = f"{sub}_sublayer_output"
    if b.status.get(f"{sub}_output") is not None and b.status.get(own, "") is None:
        return [own]
    return [f"{sub}_output"]


def block_scene(model: Any, layer: int = 0, spec: str | None = None) -> Scene:
    """The picture of ``model``'s block at ``layer``, as shapes."""
    b = _block(model, layer)
    families = ", ".join(model.families) or "defaults only"
    title = (
        f"{spec or model.internals.model_class}: block '{b.structure or 'unknown'}' "
        f"(layer {layer} of {model.internals.num_layers})"
    )
    from causalab_mini.generated import BLOCK_STRUCTURES

    doc = (
        BLOCK_STRUCTURES[b.structure].doc
        if b.structure in BLOCK_STRUCTURES
        else (
            "No rule in block_structures.yaml gives this model a structure; structural places "
            "are refused."
        )
    )
    subtitle = tuple(textwrap.wrap(f"{model.internals.model_class}, family {families}. {doc}", 150))
    scene = Scene(WIDTH, 0, title, subtitle)
    lay = _Layout(scene, b)
    top = 76 + LINE * len(subtitle)
    stream_top = top + 26
    lay.tap(STREAM_X, stream_top + 4, ["layers_input"], room=40)
    branch = stream_top + 40
    properties = BLOCK_STRUCTURES.get(b.structure or "")
    parallel = properties is not None and properties.parallel
    attn_pre = b.module.get("attentions_norm_output")
    if parallel:
        bottom = _parallel_columns(scene, lay, b, branch, attn_pre)
    else:
        bottom = _serial_columns(scene, lay, b, branch, attn_pre, properties)
    scene.paths.insert(0, Path(((STREAM_X, stream_top), (STREAM_X, bottom)), "stream"))
    lay.tap(STREAM_X, bottom - 6, ["layers_output"], room=40)
    y = _refused_list(scene, b, bottom)
    scene.legend_y = y + 10
    scene.height = int(y + 40)
    return scene


def _parallel_columns(
    scene: Scene, lay: _Layout, b: _Block, branch: float, attn_pre: str | None
) -> float:
    """A parallel block's two columns side by side, both reading the block input, their
    contributions reaching one add; returns the y where the block's stream ends."""
    scene.width = PARALLEL_WIDTH
    lay.room = 30
    ax, mx = PARALLEL_X
    scene.paths.append(Path(((STREAM_X, branch), (mx, branch), (mx, branch + GAP))))
    scene.paths.append(Path(((ax, branch), (ax, branch + GAP))))
    scene.junctions.append((ax, branch))  # both columns read the block input
    a_end, _ = lay.column(ax, branch + GAP, "attentions", "self_attn", attn_pre)
    mlp_pre = b.module.get("mlps_norm_output") or b.mlp_norm_guess
    note = "" if b.module.get("mlps_norm_output") else "normalizes the block input"
    m_end, _ = lay.column(mx, branch + GAP, "mlps", "mlp", mlp_pre, note)
    add_y = max(a_end, m_end) + 14
    scene.paths.append(Path(((ax, a_end - GAP), (ax, add_y)), arrow=False))
    scene.junctions.append((ax, add_y))  # both contributions reach one add
    scene.paths.append(Path(((mx, m_end - GAP), (mx, add_y), (STREAM_X + 12, add_y))))
    lay.tap(ax, a_end - GAP / 2 + 2, ["attentions_output"], ax + BOX_W / 2 + 20, 30)
    lay.tap(mx, m_end - GAP / 2 + 2, ["mlps_output"], mx + BOX_W / 2 + 20, 30)
    _scale(scene, b, "attentions_output", ax, a_end - GAP / 2 + 6)
    _scale(scene, b, "mlps_output", mx, m_end - GAP / 2 + 6)
    scene.adds.append((STREAM_X, add_y))
    lay.tap(STREAM_X, branch + 70, ["layers_mid"], room=30)
    return add_y + 46


def _serial_columns(
    scene: Scene, lay: _Layout, b: _Block, branch: float, attn_pre: str | None, properties: Any
) -> float:
    """Attention, then the MLP, each added to the stream (with the sums before the norms
    where a norm follows each add); returns the y where the block's stream ends."""
    pre_attn = attn_pre
    a_end, _ = lay.column(COLUMN_X, branch + GAP, "attentions", "self_attn", pre_attn)
    add1 = a_end + 4
    scene.paths.append(Path(((STREAM_X, branch), (COLUMN_X, branch), (COLUMN_X, branch + GAP))))
    scene.paths.append(Path(((COLUMN_X, a_end - GAP), (COLUMN_X, add1), (STREAM_X + 12, add1))))
    lay.tap(
        COLUMN_X, a_end - GAP / 2 + 2, _output_names(b, "attentions"), COLUMN_X + BOX_W / 2 + 20
    )
    _scale(scene, b, "attentions_output", COLUMN_X, a_end - GAP / 2 + 6)
    scene.adds.append((STREAM_X, add1))
    # where a norm follows each add (post_ln), the sum before it is a place too
    post_ln = properties is not None and properties.norm_after_add
    extra = 34 if post_ln else 0
    if post_ln:
        lay.tap(STREAM_X, add1 + 30, ["layers_mid_prenorm"], room=40)
    mid_y = add1 + 34 + extra
    lay.tap(STREAM_X, mid_y, ["layers_mid"], room=40)
    branch2 = add1 + 62 + extra
    mlp_pre = b.module.get("mlps_norm_output")
    m_end, _ = lay.column(COLUMN_X, branch2 + GAP, "mlps", "mlp", mlp_pre)
    add2 = m_end + 4
    scene.paths.append(Path(((STREAM_X, branch2), (COLUMN_X, branch2), (COLUMN_X, branch2 + GAP))))
    scene.paths.append(Path(((COLUMN_X, m_end - GAP), (COLUMN_X, add2), (STREAM_X + 12, add2))))
    lay.tap(COLUMN_X, m_end - GAP / 2 + 2, _output_names(b, "mlps"), COLUMN_X + BOX_W / 2 + 20)
    _scale(scene, b, "mlps_output", COLUMN_X, m_end - GAP / 2 + 6)
    scene.adds.append((STREAM_X, add2))
    if post_ln:
        lay.tap(STREAM_X, add2 + 30, ["layers_output_prenorm"], room=40)
    return add2 + 46 + extra


def _refused_list(scene: Scene, b: _Block, bottom: float) -> float:
    """The places the model refuses, with the registry's reason (one entry per reason),
    under the picture; returns the y after them."""
    y = bottom + 40
    scene.refused_y = y
    per_line = int((scene.width - 60) / CHAR)
    groups: dict[str, list[str]] = {}  # one reason, the places it refuses
    for name, reason in b.status.items():
        if reason is not None:
            groups.setdefault(reason.replace(name, "{place}"), []).append(name)
    for reason, names in groups.items():
        text = reason.replace("{place}", names[0] if len(names) == 1 else "each")
        lines = tuple(textwrap.wrap(f"{', '.join(names)}: {text}", per_line))
        scene.refused.append((", ".join(names), lines))
    y += 22 + sum(LINE * len(lines) + 6 for _, lines in scene.refused)
    if not scene.refused:
        y += LINE
    return y


def _scale(scene: Scene, b: _Block, place: str, x: float, y: float) -> None:
    if place in b.scale:
        scene.scales.append(Scale(x, y, f"× {b.scale[place]}"))


def render_svg(scene: Scene) -> str:
    """The scene as plain SVG (every text escaped)."""
    from causalab_mini.codegen.generate import template_environment

    env = template_environment(autoescape=True)
    env.filters["n"] = lambda v: f"{float(v):g}"
    svg: str = env.get_template("block.svg.j2").render(scene=scene, LINE=LINE)
    return svg


def diagram(model: Any, layer: int = 0, spec: str | None = None) -> str:
    return render_svg(block_scene(model, layer, spec))


@click.command("diagram")
@click.argument("spec", shell_complete=complete_spec)
@click.argument("out", type=click.Path(dir_okay=False, path_type=pathlib.Path, allow_dash=True))
@click.option("--layer", type=int, default=0, show_default=True, help="The layer to draw.")
@click.option("--json", "as_json", is_flag=True, help="Print what the picture shows as JSON.")
def diagram_command(spec: str, out: pathlib.Path, layer: int, as_json: bool) -> None:
    """Draw one block of SPEC as SVG: the residual stream, norms, attention and MLP,
    where each place sits, and which places the model refuses, with the reason.

    SPEC is tiny:<model_type>, a local directory or a hub id; OUT is the SVG file
    ('-' prints it). The model is loaded with attention probabilities enabled.

    \b
    Example:
      registry diagram tiny:gpt_neox parallel.svg
      registry diagram tiny:gemma2 - --layer 1 > gemma2.svg
    """
    model = _load(spec)
    n = model.internals.num_layers
    if not -n <= layer < n:
        click.echo(f"registry diagram: layer {layer} is out of range: layers 0..{n - 1}", err=True)
        sys.exit(2)
    scene = block_scene(model, layer % n, spec)
    svg = render_svg(scene)
    if str(out) == "-":
        click.echo(svg, nl=False)
    else:
        out.write_text(svg, encoding="utf-8")
    if as_json:
        _echo_json(model, spec, layer % n, out, scene)
    elif str(out) != "-":
        refused = [name for name, _ in scene.refused]
        click.echo(
            f"wrote {out}: block {model.block_structure}, layer {layer % n}"
            + (f"; refused: {', '.join(refused)}" if refused else "")
        )


def _load(spec: str) -> Any:
    """The model SPEC names, with attention probabilities enabled and the libraries'
    logging quiet; exit 1 (with the reason) where it does not load."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    from causalab_mini import compat

    compat.install()  # nnterp imports under nnsight 0.8 only through its bridges
    import nnterp  # noqa: F401  (it sets its logger's level when first imported)

    for noisy in ("nnterp", "transformers"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    from causalab_mini.model import StandardizedTransformer
    from causalab_mini.tools.tiny import TinyBuildError

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # unannotated in transformers
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
    try:
        return StandardizedTransformer(spec, enable_attention_probs=True)
    except (TinyBuildError, OSError, ValueError) as exc:
        click.echo(f"registry diagram: cannot load {spec}: {exc}", err=True)
        sys.exit(1)


def _echo_json(model: Any, spec: str, layer: int, out: pathlib.Path, scene: Scene) -> None:
    """What the picture shows, as JSON (on stderr where the SVG went to stdout)."""
    status = model.internals.status(layer)
    click.echo(
        json.dumps(
            {
                "spec": spec,
                "layer": layer,
                "block_structure": model.block_structure,
                "out": str(out),
                "refused": {k: v for k, v in status.items() if v is not None},
                "places": [n for t in scene.taps if t.ok for n in t.names.split(" = ")],
            },
            indent=2,
        ),
        err=str(out) == "-",
    )
