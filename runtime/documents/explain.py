"""``explain``: what a run of a document will do, said without running the model (it is
built on the meta device where its family allows): the model, each site's place on it
per layer (or the model's reason for refusing it), each row's content frame with the
tokens each site's positions name, the cells (refused ones with why) and the number
of forwards."""

from __future__ import annotations

import json
from typing import Any

from .cells import backwards, forwards
from .experiment import Experiment, texts_of
from .plots import position_label
from .sections import trained_interventions


def _places(exp: Experiment, name: str) -> dict[int | None, str]:
    """A site's address per layer on the model (its text), or the model's refusal."""
    from ..geometry import ComponentError
    from ..locator import locate

    bound = exp.sites[name]
    layers: list[int | None] = [x for x in bound.layers if x is not None]
    out: dict[int | None, str] = {}
    for layer in layers or [None]:
        try:
            address = locate(exp.model, bound.component, layer)
            internals = exp.model.internals
            known = address.accessor and address.accessor in internals
            place = internals[address.accessor] if known else None
            row = f" = {address.accessor}: {place.row.describe()}" if place is not None else ""
            out[layer] = f"{address}{row}"
        except ComponentError as exc:
            out[layer] = f"refused: {exc}"
    return out


def _short(values: tuple[int, ...] | None) -> str:
    """A list of ints written short where it is a run: 0..15."""
    found = list(values or ())
    if len(found) > 3 and found == list(range(found[0], found[-1] + 1)):
        return f"{found[0]}..{found[-1]}"
    return str(found)


def _site_lines(exp: Experiment) -> list[str]:
    lines = ["sites:"]
    for name, site in exp.doc["sites"].items():
        heads = [x for x in exp.sites[name].heads if x is not None]
        written = site.get("positions")
        lines.append(
            f"  {name}: {site['component']}"
            + (f", heads {heads}" if heads else "")
            + (f", units {_short(exp.sites[name].units)}" if exp.sites[name].units else "")
            + (f", featurizer {site['featurizer']}" if site.get("featurizer") else "")
            + (f", features {_short(exp.sites[name].features)}" if exp.sites[name].features else "")
            + (f", positions {json.dumps(written)}" if written is not None else "")
        )
        lines += [f"    layer {layer}: {text}" for layer, text in _places(exp, name).items()]
    return lines


def _section_lines(exp: Experiment) -> list[str]:
    """The featurizers, mechanisms and training the run makes, said short."""
    doc = exp.doc
    lines = []
    for name, item in (doc.get("featurizers") or {}).items():
        options = ", ".join(f"{k} {json.dumps(v)}" for k, v in item.items() if k != "kind")
        lines.append(f"  featurizer {name}: {item['kind']}" + (f" ({options})" if options else ""))
    for name, item in (doc.get("mechanisms") or {}).items():
        options = ", ".join(f"{k} {json.dumps(v)}" for k, v in item.items() if k != "kind")
        lines.append(f"  mechanism {name}: {item['kind']} ({options})")
    train = doc.get("train")
    if isinstance(train, dict):
        from .fits import rows_of_split

        rows = rows_of_split(exp, "split")
        held = rows_of_split(exp, "eval_split")
        lines.append(
            f"  train {train['featurizer']} in each cell of "
            f"{', '.join(trained_interventions(doc))}: {train['objective']} to the labels "
            f"{json.dumps(train['labels'])}, {train.get('epochs', 10)} epochs at most over "
            f"{len(rows.rows) if rows else 0} rows"
            + (f", eval {len(held.rows)} rows" if held else "")
        )
    return (["fits and steering:", *lines]) if lines else []


def _marks(exp: Experiment, texts: list[str], role: str) -> list[str]:
    from ..positions import PositionError, encode, resolve

    encoded = encode(exp.model, texts, exp.frame)
    marks: list[dict[int, list[str]]] = [{} for _ in texts]
    for name, site in exp.doc["sites"].items():
        written = site.get("positions")
        specs = written if isinstance(written, list) else [written]
        for spec in specs if written is not None else []:
            try:
                found = resolve(exp.model, encoded, spec)
            except PositionError:
                continue  # checked before: only a site no patch reads from the source
            for row, indices in enumerate(found):
                for i in indices:
                    marks[row].setdefault(i, []).append(f"{name} {position_label(spec)}")
    lines = []
    outside = "template" if exp.frame == "chat" else "special"
    for row, frame in enumerate(encoded.frames):
        lines.append(f"  row {row} {role}: {frame.text!r}")
        content = {t: n for n, t in enumerate(frame.content)}
        for i, token in enumerate(frame.tokens):
            if i not in frame.real:
                continue
            where = (
                f"index {content[i]:>3}"
                if i in content
                else next((f"anchor {k}" for k, v in frame.anchors.items() if v == i), outside)
            )
            note = ("  <- " + "; ".join(marks[row][i])) if i in marks[row] else ""
            lines.append(f"    {i:>4}  {token!r:<14} {where}{note}")
    return lines


def _cell_lines(exp: Experiment) -> list[str]:
    refused = [c for c in exp.cells if c.refused is not None]
    lines = [
        f"cells: {len(exp.cells)} ({len(exp.cells) - len(refused)} to run, {len(refused)} refused)"
    ]
    for name in exp.doc["interventions"]:
        mine = [c for c in exp.cells if c.intervention == name]
        axes = sorted({k for c in mine for k in c.coords})
        lines.append(f"  {name}: {len(mine)} cells" + (f" over {' x '.join(axes)}" if axes else ""))
    for cell in refused:
        lines.append(f"  refused {cell.key}: {cell.refused}")
    return lines


def explain(exp: Experiment, max_rows: int = 3) -> str:
    """The explanation of ``exp`` as text."""
    model = exp.model
    families = ", ".join(getattr(model, "families", ())) or "the defaults"
    rows = exp.rows.rows
    lines = [
        f"document: {exp.source.path} ({exp.doc['name']}, {exp.source.digest[:19]})",
        f"model: {exp.checkpoint}: {model.internals.model_class} (family: {families}), "
        f"{model.internals.num_layers} layers, block structure "
        f"{getattr(model, 'block_structure', '?')}, engine {exp.engine}",
        f"data: {len(rows)} rows ({exp.rows.origin}, {exp.rows.digest[:19]}), frame {exp.frame}",
        *_site_lines(exp),
        *_section_lines(exp),
        f"frames (first {min(max_rows, len(rows))} rows; positions marked):",
    ]
    shown = rows[:max_rows]
    lines += _marks(exp, [r["base"] for r in shown], "base")
    if all("source" in r for r in shown) and any(
        w.get("value") == "source" for w in (exp.doc.get("writes") or {}).values()
    ):
        lines += _marks(exp, texts_of(exp.rows, "source")[:max_rows], "source")
    lines += _cell_lines(exp)
    lines.append(
        f"forwards: {forwards(exp)} (batch size {exp.batch_size}); backwards: {backwards(exp)}"
    )
    return "\n".join(lines)


def explained(exp: Experiment) -> dict[str, Any]:
    """The explanation as data: the model, each site's address (or refusal) per layer,
    the cells (refused ones with why) and the forwards."""
    sites = {
        name: {
            "component": bound.component,
            "places": {str(k): v for k, v in _places(exp, name).items()},
        }
        for name, bound in exp.sites.items()
    }
    return {
        "document": exp.doc["name"],
        "digest": exp.source.digest,
        "model": exp.checkpoint,
        "layers": exp.model.internals.num_layers,
        "rows": len(exp.rows.rows),
        "sites": sites,
        "cells": [{"key": c.key, "refused": c.refused} for c in exp.cells],
        "forwards": forwards(exp),
        "backwards": backwards(exp),
    }


__all__ = ["explain", "explained"]
