"""A validated document bound to a loaded model: its sites resolved on the model's
layers and heads, its rows' positions checked in each row's content frame, its
answers checked to be one token, and its cells (every result the run makes) with the
addresses each needs, or the model's reason for refusing the cell.

Nothing here runs a forward: the model may still be on the meta device.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import CausalabError
from .data import Rows
from .metrics import Metric, MetricError, token_ids
from .source import DocumentError, Issue, Source
from .validate import static_issues

AXES = {
    "layers": "layer",
    "positions": "position",
    "heads": "head",
    "units": "unit",
    "features": "feature",
}


@dataclass(frozen=True)
class Binding:
    """A site's values in one cell: its layers, heads and position spec(s)."""

    component: str
    layers: tuple[int | None, ...]
    heads: tuple[int | None, ...]
    positions: Any  # as written: one spec, a list of specs, or None (every token)
    units: tuple[int, ...] | None = None  # of the last axis; None: the whole width
    featurizer: str | None = None  # the document's featurizer the site is in
    features: tuple[int, ...] | None = None  # of the featurizer; None: every feature


@dataclass
class Cell:
    """One result: an intervention at the swept values ``coords`` (none where the
    intervention does not use the swept site)."""

    intervention: str
    coords: dict[str, Any]
    bindings: dict[str, Binding]
    addresses: dict[str, list[Any]] = field(default_factory=dict)
    refused: str | None = None

    @property
    def key(self) -> str:
        parts = [self.intervention]
        parts += [f"{k}={json.dumps(v, sort_keys=True)}" for k, v in self.coords.items()]
        return "|".join(parts)


@dataclass
class Experiment:
    """Everything a run needs, checked."""

    source: Source
    rows: Rows
    model: Any
    checkpoint: str
    cells: list[Cell]
    metrics: list[Metric]
    tokens: dict[str, list[int]]
    frame: str
    engine: str
    batch_size: int
    sites: dict[str, Binding] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)  # a run's encoded texts and means

    @property
    def doc(self) -> dict[str, Any]:
        return self.source.data  # type: ignore[no-any-return]

    def featurizer_of(self, intervention: str, site: str) -> str | None:
        """The featurizer intervention ``intervention`` writes site ``site`` in: its
        write's own, else the site's (None: the place itself)."""
        for w in self.writes_of(intervention):
            if w["site"] == site and w.get("featurizer") is not None:
                return str(w["featurizer"])
        return self.sites[site].featurizer if site in self.sites else None

    def writes_of(self, intervention: str) -> list[dict[str, Any]]:
        writes = self.doc.get("writes") or {}
        names = self.doc["interventions"][intervention].get("writes") or []
        return [{"name": n, **writes[n]} for n in names]


def _range(spec: Any, n: int, what: str) -> list[int]:
    if spec == "all":
        return list(range(n))
    if isinstance(spec, int):
        return [spec]
    if isinstance(spec, dict):
        return list(range(spec["start"], spec["stop"], spec.get("step", 1)))
    return list(spec)


def _bounded(
    source: Source, path: tuple[Any, ...], code: str, values: list[int], n: int, what: str
) -> list[Issue]:
    bad = [v for v in values if not 0 <= v < n]
    if not bad:
        return []
    return [
        source.issue(
            path,
            code,
            f"{what} {bad} beyond the model, which has {n} {what} (0..{n - 1}): give "
            f"{what} counted from 0 below {n}, or all",
        )
    ]


def _heads_of(model: Any, component: str, layer: int | None) -> int:
    from causalab_mini.generated import COMPONENTS

    from ..geometry import num_heads, num_kv_heads

    kind = COMPONENTS[component].per_head
    return int(num_kv_heads(model, layer) if kind == "kv" else num_heads(model, layer))


def resolve_sites(source: Source, model: Any) -> tuple[dict[str, Binding], list[Issue]]:
    """Each site's full values on ``model``, or issues (D040, D041)."""
    from causalab_mini.generated import COMPONENTS

    n = model.internals.num_layers
    out: dict[str, Binding] = {}
    issues: list[Issue] = []
    for name, site in source.data["sites"].items():
        component = site["component"]
        per_layer = COMPONENTS[component].per_layer
        layers: list[int | None] = [None]
        if per_layer:
            found = _range(site.get("layers", "all"), n, "layers")
            issues += _bounded(source, ("sites", name, "layers"), "D040", found, n, "layers")
            layers = list(found)
        heads: list[int | None] = [None]
        if site.get("heads") is not None:
            first = next((x for x in layers if x is not None and 0 <= x < n), None)
            count = _heads_of(model, component, first)
            found = _range(site["heads"], count, "heads")
            issues += _bounded(source, ("sites", name, "heads"), "D041", found, count, "heads")
            heads = list(found)
        units, found_issues = _units(source, model, name, site, layers)
        issues += found_issues + _hook_served(source, model, name, site)
        features, found_issues = _features(source, model, name, site, layers)
        issues += found_issues
        out[name] = Binding(
            component,
            tuple(layers),
            tuple(heads),
            site.get("positions"),
            units,
            site.get("featurizer"),
            features,
        )
    return out, issues


def _width(model: Any, component: str, layers: list[int | None]) -> int | None:
    """The place's width at the first layer the model has it (None: no width)."""
    from ..geometry import ComponentError
    from ..locator import locate

    for layer in layers:
        try:
            return locate(model, component, layer).width
        except ComponentError:
            continue  # a layer the model refuses: its cells say so
    return None


def _features(
    source: Source, model: Any, name: str, site: dict[str, Any], layers: list[int | None]
) -> tuple[tuple[int, ...] | None, list[Issue]]:
    """A featurized site's features, checked against its featurizer's number of
    features (D018: a place with no width to featurize; D044: a feature beyond)."""
    from .sections import feature_count

    written = [
        ("writes", w, "featurizer")
        for w, item in (source.data.get("writes") or {}).items()
        if item.get("site") == name and item.get("featurizer") is not None
    ]
    where = [("sites", name, "featurizer")] if site.get("featurizer") is not None else written
    if not where:
        return None, []
    width = _width(model, site["component"], layers)
    if width is None:
        return None, [
            source.issue(
                where[0],
                "D018",
                f"site {name!r} puts a featurizer on component "
                f"{site['component']!r}, which has no width on this model (its last axis is "
                "not a feature axis): a featurizer maps a place of a width; give a site "
                "with one (block_output, attention_z, mlp_activation, ...)",
            )
        ]
    if site.get("features") is None or site.get("featurizer") is None:
        return None, []
    k = feature_count(source, site["featurizer"], width)
    found = _range(site["features"], k, "features")
    return tuple(found), _bounded(source, ("sites", name, "features"), "D044", found, k, "features")


def _hook_served(source: Source, model: Any, name: str, site: dict[str, Any]) -> list[Issue]:
    """D046: a site written as a hook name whose meaning on this model's family is not
    the component it reads as on every family (refused here, or another place)."""
    from causalab_mini.interop.transformer_lens import HookNameRefused, place_of

    hook = site.get("hook")
    if not isinstance(hook, str):
        return []
    try:
        at = place_of(model, hook)
    except HookNameRefused as refusal:
        return [source.issue(("sites", name, "hook"), "D046", str(refusal))]
    if at.component != site["component"]:
        return [
            source.issue(
                ("sites", name, "hook"),
                "D046",
                f"{hook} is {at.component} on this model's family, not {site['component']} as on "
                f"every other: write component {at.component!r} and layers [{at.layer}]",
            )
        ]
    return []


def _units(
    source: Source, model: Any, name: str, site: dict[str, Any], layers: list[int | None]
) -> tuple[tuple[int, ...] | None, list[Issue]]:
    """A site's units of its last axis, checked against the place's width (D018: a
    place with no width; D044: a unit beyond it)."""
    from ..geometry import ComponentError
    from ..locator import locate

    if site.get("units") is None:
        return None, []
    path = ("sites", name, "units")
    width = None
    for layer in layers:
        try:
            width = locate(model, site["component"], layer).width
            break
        except ComponentError:
            continue  # a layer the model refuses: its cells say so
    if width is None:
        why = f"component {site['component']!r} has no width on this model (its last axis"
        return None, [
            source.issue(
                path, "D018", f"{why} is not a feature axis), so it has no units to select"
            )
        ]
    found = _range(site["units"], width, "units")
    return tuple(found), _bounded(source, path, "D044", found, width, "units")


def _uses(doc: dict[str, Any], intervention: str) -> list[str]:
    """The sites an intervention's writes and readout name, in order."""
    item = doc["interventions"][intervention]
    writes, reads = doc.get("writes") or {}, doc.get("reads") or {}
    sites = [writes[w]["site"] for w in item.get("writes") or []]
    readout = item.get("readout", "logits")
    if readout != "logits":
        sites.append(reads[readout]["site"])
    if "attribute" in item:
        sites.append(item["attribute"]["site"])
    return list(dict.fromkeys(sites))


def _sweep_values(binding: Binding, axis: str) -> list[Any]:
    if axis == "layers":
        return list(binding.layers)
    if axis == "heads":
        return list(binding.heads)
    if axis == "units":
        return list(binding.units or ())
    if axis == "features":
        return list(binding.features or ())
    spec = binding.positions
    return list(spec) if isinstance(spec, list) else [spec]


def enumerate_cells(doc: dict[str, Any], sites: dict[str, Binding]) -> list[Cell]:
    """Every cell of the document, in the order of its interventions and sweep."""
    sweep = doc.get("sweep")
    cells: list[Cell] = []
    for name in doc["interventions"]:
        used = _uses(doc, name)
        bindings = {s: sites[s] for s in used}
        if not sweep or sweep["site"] not in used:
            cells.append(Cell(name, {}, bindings))
            continue
        swept, axes = sites[sweep["site"]], list(sweep["axes"])
        for values in itertools.product(*(_sweep_values(swept, a) for a in axes)):
            coords = {AXES[a]: v for a, v in zip(axes, values, strict=True)}
            one = Binding(
                swept.component,
                (coords["layer"],) if "layer" in coords else swept.layers,
                (coords["head"],) if "head" in coords else swept.heads,
                coords["position"] if "position" in coords else swept.positions,
                (coords["unit"],) if "unit" in coords else swept.units,
                swept.featurizer,
                (coords["feature"],) if "feature" in coords else swept.features,
            )
            cells.append(Cell(name, coords, {**bindings, sweep["site"]: one}))
    return cells


def locate_cells(model: Any, cells: list[Cell]) -> None:
    """Each cell's addresses, or the model's reason for refusing it."""
    from ..geometry import ComponentError
    from ..locator import locate

    for cell in cells:
        for site, b in cell.bindings.items():
            try:
                cell.addresses[site] = [
                    locate(model, b.component, layer, head, position=b.positions)
                    for layer in b.layers
                    for head in b.heads
                ]
            except ComponentError as exc:
                cell.refused = str(exc)
                break


def texts_of(rows: Rows, role: str, slot: int = 0) -> list[str]:
    out = []
    for row in rows.rows:
        value = row[role]
        out.append(value[slot] if isinstance(value, list) else value)
    return out


def _position_issues(
    source: Source, model: Any, rows: Rows, sites: dict[str, Binding], frame: str
) -> list[Issue]:
    """D042: a site's position that a row lacks (in the base, or the source a patch
    takes it from; a patch names as many tokens in both; a lens read one token)."""
    from ..positions import PositionError, encode, resolve

    doc = source.data
    patched = {
        w["site"]: w.get("source", 0)
        for w in (doc.get("writes") or {}).values()
        if w.get("value") == "source"
    }
    for item in doc["interventions"].values():
        if "attribute" in item:  # scores base and source tokens pairwise
            patched.setdefault(item["attribute"]["site"], 0)
    lensed = {r["site"] for r in (doc.get("reads") or {}).values() if r.get("lens")}
    issues: list[Issue] = []
    texts = {"base": texts_of(rows, "base")}
    slots = max(patched.values(), default=-1) + 1  # an interchange resolves every source
    for slot in range(slots):
        texts[f"source {slot}"] = texts_of(rows, "source", slot)
    encoded = {k: encode(model, v, frame) for k, v in texts.items()}
    for name, b in sites.items():
        specs = b.positions if isinstance(b.positions, list) else [b.positions]
        path = ("sites", name, "positions")
        if b.positions is None and (name in patched or name in lensed):
            why = "a patch moves" if name in patched else "a lens reads"
            issues.append(
                source.issue(
                    ("sites", name),
                    "D015",
                    f"site {name!r} names no positions, and {why} tokens: "
                    "say which (positions: all, or {index: -1})",
                )
            )
            continue
        for spec in specs if b.positions is not None else []:
            try:
                found = {
                    k: resolve(model, e, spec)
                    for k, e in encoded.items()
                    if k == "base" or name in patched
                }
            except PositionError as exc:
                issues.append(source.issue(path, "D042", f"site {name!r}: {exc}"))
                continue
            # a patch moves as many tokens as it takes from its own source
            mine = {k: v for k, v in found.items() if k in ("base", f"source {patched.get(name)}")}
            issues += _counts(source, path, name, spec, mine, texts, lensed)
    return issues


def _counts(
    source: Source,
    path: Any,
    name: str,
    spec: Any,
    found: dict[str, Any],
    texts: dict[str, list[str]],
    lensed: set[str],
) -> list[Issue]:
    base = found["base"]
    for key, indices in found.items():
        for row, (b, s) in enumerate(zip(base, indices, strict=True)):
            if len(b) != len(s):
                return [
                    source.issue(
                        path,
                        "D042",
                        f"site {name!r}: position {json.dumps(spec)} names "
                        f"{len(b)} tokens in row {row}'s base "
                        f"{texts['base'][row]!r} and {len(s)} in its {key} "
                        f"{texts[key][row]!r}: a patch moves as many tokens as "
                        "it takes (a span with an index, or texts of as many "
                        "tokens)",
                    )
                ]
    if name in lensed:
        for row, b in enumerate(base):
            if len(b) != 1:
                return [
                    source.issue(
                        path,
                        "D042",
                        f"site {name!r} is read through the lens, which reads "
                        f"one token per row, and {json.dumps(spec)} names "
                        f"{len(b)} in row {row} {texts['base'][row]!r}: sweep "
                        "the positions, or name one token ({index: -1})",
                    )
                ]
    return []


def _lens_issues(source: Source, sites: dict[str, Binding]) -> list[Issue]:
    """D016: a lens read gives one row of logits per input row, so each of its cells
    names one layer, one head and one position spec (the sweep runs over the rest)."""
    doc = source.data
    sweep = doc.get("sweep") or {}
    issues = []
    for name, read in (doc.get("reads") or {}).items():
        site = read["site"]
        swept = set(sweep.get("axes") or ()) if sweep.get("site") == site else set()
        b = sites[site]
        many = {
            "layers": len(b.layers) > 1,
            "heads": len(b.heads) > 1,
            "positions": isinstance(b.positions, list) and len(b.positions) > 1,
        }
        for axis, several in many.items():
            if several and axis not in swept:
                issues.append(
                    source.issue(
                        ("reads", name),
                        "D016",
                        f"lens read {name!r} reads site {site!r}, which names several "
                        f"{axis}, and a lens gives one set of logits per row: sweep the "
                        f"{axis} (sweep: {{site: {site}, axes: [..., {axis}]}}) or name one",
                    )
                )
    return issues


def _label_issues(source: Source, model: Any, rows: Rows) -> list[Issue]:
    """D033, D043: train's label field in every row a fit reads, one token each."""
    labels = (source.data.get("train") or {}).get("labels")
    if not isinstance(labels, dict) or "field" not in labels:
        return []
    field = labels["field"]
    for checked in [rows, *_fit_rows(source)]:
        lacking = [n for n, r in enumerate(checked.rows) if field not in r]
        if lacking:
            return [
                source.issue(
                    ("train", "labels"), "D033", f"rows {lacking[:10]} of a split have no {field!r}"
                )
            ]
        try:
            token_ids(model.tokenizer, [r[field] for r in checked.rows], field)
        except MetricError as exc:
            return [source.issue(("train", "labels"), "D043", f"{exc} (train labels)")]
    return []


def _fit_rows(source: Source) -> list[Rows]:
    """The rows of the splits a fit reads besides the document's (train's split and
    eval split, a featurizer's fit split): their positions are checked too."""
    from .data import split_rows

    doc = source.data
    names = []
    train = doc.get("train")
    if isinstance(train, dict):
        names += [train.get("split", "train"), train.get("eval_split")]
    names += [(f.get("fit") or {}).get("split") for f in (doc.get("featurizers") or {}).values()]
    found = [split_rows(source, n, ("data",))[0] for n in dict.fromkeys(names) if n is not None]
    return [r for r in found if r is not None]


def _token_issues(
    source: Source, model: Any, rows: Rows, metrics: list[Metric]
) -> tuple[dict[str, list[int]], list[Issue]]:
    fields: dict[str, int] = {}
    for i, m in enumerate(metrics):
        if m.name != "kl" and not m.from_reference:
            fields.setdefault(m.target, i)
        if m.name == "logit_diff":
            fields.setdefault(m.contrast, i)
    tokens: dict[str, list[int]] = {}
    m_names = [m.label for m in metrics]
    issues = []
    for name, i in fields.items():
        try:
            tokens[name] = token_ids(model.tokenizer, [r[name] for r in rows.rows], name)
        except MetricError as exc:
            inline = "rows" in source.data["data"]
            path = ("data", "rows", exc.row, name) if inline else ("data", "file")
            issues.append(source.issue(path, "D043", f"{exc} (metric {i}: {m_names[i]})"))
    return tokens, issues


def load_model(source: Source, spec: str | None = None, trust_remote_code: bool = False) -> Any:
    """The document's model (or ``spec``'s), built on the meta device where its family
    allows: nothing runs until the first forward. ``trust_remote_code`` is only ever
    the command line's."""
    from ..model import StandardizedTransformer

    block = source.data["model"]
    checkpoint = spec or block["checkpoint"]
    local = source.folder / checkpoint
    if spec is None and not checkpoint.startswith("tiny:") and local.is_dir():
        checkpoint = str(local)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if block.get("revision"):
        kwargs["revision"] = block["revision"]
    if block.get("dtype"):
        import torch

        kwargs["dtype"] = getattr(torch, block["dtype"])
    if block.get("attn_implementation"):
        kwargs["attn_implementation"] = block["attn_implementation"]
    probs = bool(block.get("enable_attention_probs", False))
    return StandardizedTransformer(checkpoint, enable_attention_probs=probs, **kwargs)


def build(
    source: Source,
    *,
    model: Any = None,
    spec: str | None = None,
    trust_remote_code: bool = False,
) -> Experiment:
    """The document checked (without and then with the model) and bound to it; every
    problem raised at once as a ``DocumentError`` before anything runs."""
    issues, rows = static_issues(source)
    if issues or rows is None:
        raise DocumentError(issues)
    doc = source.data
    if model is None:
        try:
            model = load_model(source, spec, trust_remote_code)
        except CausalabError as exc:  # a spec that names nothing loadable, a refused load
            where = "--model" if spec is not None else "its checkpoint"
            raise DocumentError(
                [source.issue(("model", "checkpoint"), "D045", f"{where}: {exc}")]
            ) from None
    frame = (doc.get("data") or {}).get("frame", "plain")
    sites, issues = resolve_sites(source, model)
    metrics = [Metric.of(m) for m in doc["metrics"]]
    tokens, found = _token_issues(source, model, rows, metrics)
    issues += found + _label_issues(source, model, rows)
    if not issues:
        for checked in [rows, *_fit_rows(source)]:
            issues += _position_issues(source, model, checked, sites, frame)
        issues += _lens_issues(source, sites)
    if issues:
        raise DocumentError(issues)
    cells = enumerate_cells(doc, sites)
    locate_cells(model, cells)
    block = doc["model"]
    return Experiment(
        source,
        rows,
        model,
        spec or block["checkpoint"],
        cells,
        metrics,
        tokens,
        frame,
        block.get("engine", "nnsight"),
        int(block.get("batch_size", 32)),
        sites,
    )


__all__ = ["Binding", "Cell", "Experiment", "build", "load_model", "texts_of"]
