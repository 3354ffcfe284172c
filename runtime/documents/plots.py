"""The plots of a run (PNG, matplotlib's Agg backend: no display needed): per
intervention and metric, a heatmap where the cells form a grid of two axes (layer x
position, layer x head), a line where they run along one (a layer sweep). A refused
cell is left blank (grey) in a heatmap and missing from a line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

AXES = ("layer", "position", "head", "unit", "feature")  # a cell's coordinates, in order


def position_label(spec: Any) -> str:
    """A position spec written short: 'all', 'index 2', 'span fox[-1]', 'bos'."""
    if spec == "all":
        return "all"
    if isinstance(spec, list):
        return "+".join(position_label(s) for s in spec)
    if isinstance(spec, dict):
        if "anchor" in spec:
            return str(spec["anchor"])
        if "span" in spec:
            at = f"[{spec['index']}]" if "index" in spec else ""
            return f"{spec['span'].strip()}{at}"
        return f"index {spec.get('index')}"
    return json.dumps(spec)


def _label(axis: str, value: Any) -> str:
    return position_label(value) if axis == "position" else str(value)


def _values(records: list[dict[str, Any]], axis: str) -> list[Any]:
    seen: list[Any] = []
    for r in records:
        if axis in r and r[axis] not in seen:
            seen.append(r[axis])
    return seen


def _value(record: dict[str, Any], label: str) -> float:
    value = record.get("metrics", {}).get(label)
    return math.nan if value is None else float(value)


def _heatmap(ax: Any, fig: Any, records: list[dict[str, Any]], axes: list[str], label: str) -> None:
    import numpy as np

    rows, cols = (_values(records, a) for a in axes)
    grid = np.full((len(rows), len(cols)), np.nan)
    for r in records:
        grid[rows.index(r[axes[0]]), cols.index(r[axes[1]])] = _value(r, label)
    import matplotlib

    finite = grid[np.isfinite(grid)]
    signed = finite.size > 0 and finite.min() < 0 < finite.max()
    cmap = matplotlib.colormaps["RdBu_r" if signed else "viridis"].with_extremes(bad="#cccccc")
    bound = float(np.abs(finite).max()) if finite.size else 1.0
    limits = (-bound, bound) if signed else (None, None)
    image = ax.imshow(
        np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", vmin=limits[0], vmax=limits[1]
    )
    ax.set_yticks(range(len(rows)), [_label(axes[0], v) for v in rows])
    ax.set_xticks(range(len(cols)), [_label(axes[1], v) for v in cols], rotation=45, ha="right")
    ax.set_ylabel(axes[0])
    ax.set_xlabel(axes[1])
    fig.colorbar(image, ax=ax, label=label)


def _line(ax: Any, records: list[dict[str, Any]], axis: str, label: str) -> None:
    xs = _values(records, axis)
    ys = [next((_value(r, label) for r in records if r.get(axis) == x), math.nan) for x in xs]
    ax.plot(range(len(xs)), ys, marker="o")
    ax.set_xticks(range(len(xs)), [_label(axis, x) for x in xs])
    ax.set_xlabel(axis)
    ax.set_ylabel(label)
    ax.grid(True, alpha=0.3)


def _curves(folder: Path, name: str, intervention: str, records: list[dict[str, Any]]) -> Path:
    """The training curves of an intervention's fitted cells: the loss and the IIA per
    epoch (train, and the eval split's where there is one), a line per cell."""
    import matplotlib.pyplot as plt

    fig, (loss, iia) = plt.subplots(1, 2, figsize=(10, 4))
    for r in records:
        history = (r.get("train") or {}).get("history") or []
        if not history:
            continue
        cell = ", ".join(f"{a} {_label(a, r[a])}" for a in AXES if a in r) or intervention
        epochs = [int(e["epoch"]) for e in history]
        line = loss.plot(epochs, [e["loss"] for e in history], label=cell)[0]
        iia.plot(epochs, [e["iia"] for e in history], color=line.get_color(), label=cell)
        if "eval_iia" in history[0]:
            loss.plot(epochs, [e["eval_loss"] for e in history], color=line.get_color(), ls="--")
            iia.plot(epochs, [e["eval_iia"] for e in history], color=line.get_color(), ls="--")
    for ax, label in ((loss, "loss"), (iia, "IIA")):
        ax.set_xlabel("epoch")
        ax.set_ylabel(label + " (dashed: eval split)")
        ax.grid(True, alpha=0.3)
    iia.legend(fontsize="small")
    fig.suptitle(f"{name}: {intervention}, training")
    fig.tight_layout()
    return _save(fig, folder / f"{intervention}_training.png")


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


def plot_all(
    folder: Path, name: str, records: list[dict[str, Any]], labels: list[str]
) -> list[Path]:
    """Every plot of the run's cells, written under ``folder``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for intervention in dict.fromkeys(r["intervention"] for r in records):
        mine = [r for r in records if r["intervention"] == intervention]
        axes = [a for a in AXES if any(a in r for r in mine)]
        if any("train" in r for r in mine):
            written.append(_curves(folder, name, intervention, mine))
        if not axes or len(axes) > 2:
            continue
        for label in [x for x in labels if any(x in r.get("metrics", {}) for r in mine)]:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            if len(axes) == 2:
                _heatmap(ax, fig, mine, axes, label)
            else:
                _line(ax, mine, axes[0], label)
            ax.set_title(f"{name}: {intervention}, {label}")
            fig.tight_layout()
            safe = "".join(c if c.isalnum() or c in "_-" else "_" for c in label).strip("_")
            written.append(_save(fig, folder / f"{intervention}_{safe}.png"))
    return written


__all__ = ["plot_all", "position_label"]
