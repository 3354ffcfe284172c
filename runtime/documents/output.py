"""What a run leaves in ``--out``: a manifest naming the document (written first, so a
folder is known to be this document's), each finished cell as a line of
``cells.jsonl`` (appended as it finishes: an interrupted run keeps them and
``--resume`` goes on from there), and at the end ``results.json``, one CSV per
metric, ``receipt.json`` and the plots. Every file goes inside ``--out`` (a ``save``
path is checked to stay there, links resolved); the final files are written whole or
not at all (a temporary file, then a rename)."""

from __future__ import annotations

import csv
import io
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .source import DocumentError, Source

MANIFEST = "document.json"
CELLS = "cells.jsonl"
PACKAGES = (
    "causalab-mini",
    "torch",
    "transformers",
    "nnsight",
    "nnterp",
    "numpy",
    "matplotlib",
    "jsonschema",
    "ruamel.yaml",
    "click",
    "rich",
)


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _inside(out: Path, target: Path) -> bool:
    real_out = out.resolve()
    real = target.resolve()
    return real == real_out or real_out in real.parents


def target_folder(source: Source, out: Path) -> Path:
    """The folder results go to: ``--out``, or the ``save`` path inside it; refused
    (D020) where it leaves ``--out`` (through a link too)."""
    save = source.data.get("save") or {}
    target = out / save["path"] if save.get("path") else out
    if not _inside(out, target):  # resolved: a link inside --out is followed
        raise DocumentError(
            [
                source.issue(
                    ("save", "path"),
                    "D020",
                    f"save path {save.get('path')!r} leads out of --out {str(out)!r} "
                    f"(to {str(target.resolve())!r}, through a link): everything a run "
                    "writes stays inside --out",
                )
            ]
        )
    return target


def check_out(source: Source, out: Path, resume: bool) -> tuple[Path, dict[str, Any]]:
    """The folder a run writes to, and the finished cells it keeps (with ``resume``);
    refused (D050) where ``--out`` holds another document's results or other files."""
    target = target_folder(source, out)
    manifest = target / MANIFEST
    if target.exists() and not target.is_dir():
        raise _out_error(source, f"--out {str(target)!r} is a file: give a folder")
    if not target.exists() or not any(target.iterdir()):
        return target, {}
    if not manifest.is_file():
        raise _out_error(
            source,
            f"--out {str(target)!r} holds files that are not a document's results "
            f"({', '.join(sorted(p.name for p in target.iterdir())[:5])}): give an empty or "
            "new folder",
        )
    try:
        held = json.loads(manifest.read_text("utf-8"))
    except ValueError:
        held = {}
    if held.get("digest") != source.digest:
        raise _out_error(
            source,
            f"--out {str(target)!r} holds the results of another document "
            f"({held.get('name')!r}, {held.get('digest')}), and this one is "
            f"{source.data.get('name')!r} ({source.digest}): give another folder",
        )
    return target, (read_cells(target) if resume else {})


def _out_error(source: Source, message: str) -> DocumentError:
    return DocumentError([source.issue((), "D050", message)])


def read_cells(target: Path) -> dict[str, Any]:
    """The finished cells of an earlier run (a last line cut short is dropped)."""
    done: dict[str, Any] = {}
    path = target / CELLS
    if not path.is_file():
        return done
    for line in path.read_text("utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "key" in record:
            done[record["key"]] = record
    return done


def start(source: Source, target: Path, done: dict[str, Any]) -> None:
    """The manifest, and ``cells.jsonl`` holding exactly the kept cells."""
    target.mkdir(parents=True, exist_ok=True)
    manifest = {"name": source.data.get("name"), "digest": source.digest}
    atomic_write(target / MANIFEST, json.dumps(manifest, indent=2).encode())
    lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in done.values())
    atomic_write(target / CELLS, lines.encode())


def append_cell(target: Path, record: dict[str, Any]) -> None:
    with (target / CELLS).open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def receipt(exp: Any, timings: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """What ran: versions, digests of the document and the data, seed, timings, device.
    No environment variable's value and no credential is read into it."""
    import torch

    model = exp.model
    device = str(getattr(model, "device", "cpu"))
    return {
        "document": {
            "path": str(exp.source.path),
            "name": exp.doc.get("name"),
            "digest": exp.source.digest,
        },
        "data": {"origin": exp.rows.origin, "digest": exp.rows.digest, "rows": len(exp.rows.rows)},
        "model": {
            "checkpoint": exp.checkpoint,
            "class": model.internals.model_class,
            "families": list(getattr(model, "families", ())),
            "layers": model.internals.num_layers,
        },
        "seed": int(exp.doc.get("seed", 0)),
        "engine": exp.engine,
        "frame": exp.frame,
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "platform": f"{platform.system()} {platform.machine()}",
        "versions": versions(),
        "timings": timings,
        "flags": flags,
        "argv0": Path(sys.argv[0]).name,
    }


def metric_csvs(records: list[dict[str, Any]], labels: list[str]) -> dict[str, str]:
    """One CSV per metric: a row per cell (refused cells with their reason)."""
    axes = [
        a for a in ("layer", "position", "head", "unit", "feature") if any(a in r for r in records)
    ]
    out = {}
    for label in labels:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["intervention", *axes, "status", "value", "reason"])
        for r in records:
            value = r.get("metrics", {}).get(label)
            coords = [
                json.dumps(r[a]) if a == "position" and a in r else r.get(a, "") for a in axes
            ]
            writer.writerow(
                [
                    r["intervention"],
                    *coords,
                    r["status"],
                    "" if value is None else repr(value),
                    r.get("reason", ""),
                ]
            )
        out[label] = buffer.getvalue()
    return out


def finish(
    target: Path,
    results: dict[str, Any],
    rec: dict[str, Any],
    labels: list[str],
    plots: bool,
    per_row: bool,
) -> list[Path]:
    """The final files; returns them (plots included)."""
    records = results["cells"]
    if not per_row:
        records = [{k: v for k, v in r.items() if k != "per_row"} for r in records]
    written = []
    body = {**results, "cells": records}
    atomic_write(
        target / "results.json",
        json.dumps(body, indent=2, sort_keys=True, allow_nan=False).encode(),
    )
    written.append(target / "results.json")
    for label, text in metric_csvs(records, labels).items():
        path = target / "metrics" / f"{_safe(label)}.csv"
        atomic_write(path, text.encode())
        written.append(path)
    if plots:
        from .plots import plot_all

        written += plot_all(target / "plots", results["name"], records, labels)
    atomic_write(target / "receipt.json", json.dumps(rec, indent=2, sort_keys=True).encode())
    written.append(target / "receipt.json")
    return written


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in label).strip("_")


__all__ = ["append_cell", "check_out", "finish", "receipt", "start", "target_folder"]
