"""The checks, before a model is loaded, of the sections that fit or steer: featurizers
(what each kind needs, a file beside the document), sites in a basis (``featurizer``,
``features``), mechanisms (their kind, vector and factor), writes of a mechanism,
interventions that generate, and ``train`` (what it fits, its labels and splits).

Codes as in ``validate``: D003 (a value that does not fit its kind), D012 (a name that
refers to nothing), D013 (an unknown featurizer or mechanism kind, did you mean), D014
(a combination this runtime does not run), D015 (a position generation lacks), D016
(parts that do not fit together), D020 (a file leaving the document's folder), D030
(a missing file), D032 (a missing split), D033 (a field a row lacks)."""

from __future__ import annotations

import difflib
from pathlib import PurePosixPath
from typing import Any

from .data import Rows, split_rows
from .source import Issue, Path_, Source

# what a document may build of causalab_mini.featurizers, and the options each takes
FEATURIZER_OPTIONS: dict[str, tuple[str, ...]] = {
    "identity": (),
    "subspace": ("k", "seed", "parametrization"),
    "pca": ("k", "fit"),
    "sae": ("features", "seed", "activation", "topk", "file", "fit"),
    "gate": ("over", "gate", "temperature", "init"),
}
# of causalab_mini.mechanisms, with the options each takes
MECHANISM_OPTIONS: dict[str, tuple[str, ...]] = {
    "add": ("vector", "scale"),
    "renormalize": ("vector", "scale"),
    "scale": ("factor",),
}
NEEDED = {"subspace": ("k",), "pca": ("k",), "add": ("vector",), "renormalize": ("vector",)}
NEEDED["scale"] = ("factor",)
TRAINABLE = ("subspace", "gate")
LAST = {"index": -1}


def _close(word: str, choices: Any) -> str:
    found = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(f) for f in found)}?)" if found else ""


def _kind_issues(source: Source, section: str, table: dict[str, tuple[str, ...]]) -> list[Issue]:
    """D013 an unknown kind; D003 an option its kind does not take, or one it needs."""
    out: list[Issue] = []
    what = section[:-1]
    for name, item in (source.data.get(section) or {}).items():
        kind = item.get("kind")
        if kind not in table:
            out.append(
                source.issue(
                    (section, name, "kind"),
                    "D013",
                    f"unknown {what} {kind!r}{_close(str(kind), table)}; a document builds "
                    f"the {section} of causalab_mini.{section}: {', '.join(table)}",
                )
            )
            continue
        for option in item:
            if option != "kind" and option not in table[kind]:
                takes = ", ".join(table[kind]) or "no options"
                out.append(
                    source.issue(
                        (section, name, option),
                        "D003",
                        f"{what} {name!r} is a {kind}, which takes {takes}, not {option!r}",
                    )
                )
        for option in NEEDED.get(kind, ()):
            if option not in item:
                out.append(
                    source.issue(
                        (section, name), "D003", f"{what} {name!r} ({kind}) needs {option}"
                    )
                )
    return out


def _sae_issues(source: Source) -> list[Issue]:
    """An SAE is trained here (features) or read from a file beside the document
    (file, relative, inside its folder; checked to exist), one of the two."""
    out: list[Issue] = []
    for name, item in (source.data.get("featurizers") or {}).items():
        if item.get("kind") == "gate":
            over = item.get("over", "identity")
            known = source.data.get("featurizers") or {}
            if over != "identity" and over not in known:
                out.append(_ref(source, ("featurizers", name, "over"), over, "featurizer", known))
            elif over != "identity" and known[over].get("kind") == "gate":
                out.append(
                    source.issue(
                        ("featurizers", name, "over"),
                        "D016",
                        f"gate {name!r} is over {over!r}, another gate: give a basis",
                    )
                )
        if item.get("kind") != "sae":
            continue
        if ("file" in item) == ("features" in item):
            out.append(
                source.issue(
                    ("featurizers", name),
                    "D003",
                    f"SAE {name!r}: give features (an SAE trained on the rows here) or "
                    "file (one saved with featurizer.save), one of them",
                )
            )
        if "file" in item:
            out += _file_issues(source, name, str(item["file"]))
    return out


def _file_issues(source: Source, name: str, written: str) -> list[Issue]:
    path: Path_ = ("featurizers", name, "file")
    pure = PurePosixPath(written.replace("\\", "/"))
    if pure.is_absolute() or written.startswith("~") or ".." in pure.parts:
        return [
            source.issue(
                path,
                "D020",
                f"featurizer file {written!r} leaves the document's folder: give a path "
                "relative to the document, inside its folder (data/sae.safetensors)",
            )
        ]
    found = source.folder / written.replace("{layer}", "0")
    if not found.resolve().is_relative_to(source.folder):
        return [source.issue(path, "D020", f"featurizer file {written!r} leads out (a link)")]
    if not found.is_file():
        return [source.issue(path, "D030", f"featurizer file {str(found)!r} does not exist")]
    return []


def _ref(source: Source, path: Path_, name: Any, kind: str, known: Any) -> Issue:
    return source.issue(
        path,
        "D012",
        f"{name!r} names no {kind}{_close(str(name), known)}; the {kind}s are "
        f"{', '.join(known) or '(none)'}",
    )


def _site_basis_issues(source: Source) -> list[Issue]:
    """A site's featurizer names one; features need a featurizer (not a gate) and are
    not units; a sweep over features needs them."""
    doc = source.data
    known = doc.get("featurizers") or {}
    out: list[Issue] = []
    for name, site in (doc.get("sites") or {}).items():
        where: Path_ = ("sites", name)
        f = site.get("featurizer")
        if f is not None and f not in known:
            out.append(_ref(source, (*where, "featurizer"), f, "featurizer", known))
        if site.get("features") is not None:
            if f is None or (f in known and known[f].get("kind") == "gate"):
                why = "it has no featurizer" if f is None else f"{f!r} is a gate (a mask)"
                out.append(
                    source.issue(
                        (*where, "features"),
                        "D003",
                        f"site {name!r} names features and {why}: features select a "
                        "basis's coordinates (give the site a featurizer: subspace, pca, sae)",
                    )
                )
            if site.get("units") is not None:
                out.append(
                    source.issue(
                        (*where, "units"),
                        "D003",
                        f"site {name!r} names units and features: give one of them",
                    )
                )
    out += _basis_readers(source)
    sweep = doc.get("sweep") or {}
    site = (doc.get("sites") or {}).get(sweep.get("site")) or {}
    axes = list(sweep.get("axes") or [])
    if "features" in axes and site.get("features") is None:
        out.append(
            source.issue(
                ("sweep", "axes", axes.index("features")),
                "D003",
                f"the sweep runs over features and site {sweep.get('site')!r} names none: "
                "give it a featurizer and features (a list, a range or all)",
            )
        )
    return out


def _basis_readers(source: Source) -> list[Issue]:
    """D016: a lens read or an attribution reads the place itself, not a basis's
    features: not at a site with a featurizer."""
    doc = source.data
    sites = doc.get("sites") or {}
    used: list[tuple[Path_, Any]] = [
        (("reads", n), r.get("site")) for n, r in (doc.get("reads") or {}).items()
    ]
    used += [
        (("interventions", n, "attribute"), i["attribute"].get("site"))
        for n, i in (doc.get("interventions") or {}).items()
        if isinstance(i.get("attribute"), dict)
    ]
    return [
        source.issue(
            path,
            "D016",
            f"site {site!r} has a featurizer, and a lens read or an attribution reads the "
            "place itself: give it a site without one",
        )
        for path, site in used
        if (sites.get(site) or {}).get("featurizer") is not None
    ]


def _write_issues(source: Source) -> list[Issue]:
    """A mechanism write names a mechanism, at a site without a basis (its vector is
    the place's own width)."""
    doc = source.data
    known = doc.get("mechanisms") or {}
    out: list[Issue] = []
    for name, item in (doc.get("writes") or {}).items():
        f = item.get("featurizer")
        featurizers = doc.get("featurizers") or {}
        if f is not None and f not in featurizers:
            out.append(_ref(source, ("writes", name, "featurizer"), f, "featurizer", featurizers))
        if f is not None and "mechanism" in item:
            out.append(
                source.issue(
                    ("writes", name, "featurizer"),
                    "D014",
                    f"write {name!r} applies a mechanism in a featurizer's basis: a "
                    "document's mechanisms act on the place itself",
                )
            )
        mechanism = item.get("mechanism")
        if mechanism is None:
            continue
        if mechanism not in known:
            out.append(_ref(source, ("writes", name, "mechanism"), mechanism, "mechanism", known))
        site = (doc.get("sites") or {}).get(item.get("site")) or {}
        if site.get("featurizer") is not None:
            out.append(
                source.issue(
                    ("writes", name, "mechanism"),
                    "D014",
                    f"write {name!r} applies a mechanism at site {item.get('site')!r}, which "
                    "has a featurizer: a document's mechanisms act on the place itself; "
                    "give the write a site without one",
                )
            )
    return out


def _generation_issues(source: Source) -> list[Issue]:
    """A generating intervention: nnsight engine, mechanism writes only, each at a site
    whose positions are {index: -1} (the token of every step), no readout."""
    doc = source.data
    writes, sites = doc.get("writes") or {}, doc.get("sites") or {}
    out: list[Issue] = []
    for name, item in (doc.get("interventions") or {}).items():
        if "generate" not in item:
            continue
        where: Path_ = ("interventions", name, "generate")
        if (doc.get("model") or {}).get("engine", "nnsight") != "nnsight":
            out.append(
                source.issue(
                    where,
                    "D014",
                    f"intervention {name!r} generates, which runs on the nnsight engine "
                    "(Plan.generate): say engine: nnsight, or leave the engine out",
                )
            )
        if "readout" in item or "attribute" in item or item.get("input", "base") != "base":
            out.append(
                source.issue(
                    where,
                    "D016",
                    f"intervention {name!r} generates from the base and reads the logits",
                )
            )
        for w in item.get("writes") or []:
            write = writes.get(w) or {}
            if "mechanism" not in write:
                out.append(
                    source.issue(
                        where,
                        "D016",
                        f"intervention {name!r} generates, and write {w!r} is not a "
                        "mechanism: a generation writes mechanisms (add, renormalize, scale)",
                    )
                )
            site = sites.get(write.get("site")) or {}
            if "mechanism" in write and site.get("positions") != LAST:
                out.append(
                    source.issue(
                        ("sites", str(write.get("site"))),
                        "D015",
                        f"site {write.get('site')!r} is written at every step of a "
                        "generation, which runs one new token per step: its positions "
                        "are {index: -1}",
                    )
                )
    return out


def _train_issues(source: Source) -> list[Issue]:
    doc = source.data
    train = doc.get("train")
    if not isinstance(train, dict):
        return []
    known = doc.get("featurizers") or {}
    name = train.get("featurizer")
    if name not in known:
        return [_ref(source, ("train", "featurizer"), name, "featurizer", known)]
    kind = known[name].get("kind")
    out: list[Issue] = []
    if kind not in TRAINABLE or (kind == "subspace" and known[name].get("k") == 0):
        out.append(
            source.issue(
                ("train", "featurizer"),
                "D016",
                f"train fits {name!r}, a {kind}{' of k 0' if kind == 'subspace' else ''}, "
                "which has nothing to learn: train a subspace (k >= 1) or a gate",
            )
        )
    if not trained_interventions(doc):
        out.append(
            source.issue(
                ("train", "featurizer"),
                "D016",
                f"no intervention patches from the source at a site whose featurizer is "
                f"{name!r}: training fits that patch (give a site featurizer: {name} and a "
                "write value: source there)",
            )
        )
    return out + _label_issues(source, train)


def _label_issues(source: Source, train: dict[str, Any]) -> list[Issue]:
    doc = source.data
    labels = train.get("labels")
    where: Path_ = ("train", "labels")
    if isinstance(labels, dict) and "intervention" in labels:
        known = doc.get("interventions") or {}
        name = labels["intervention"]
        if name not in known:
            return [_ref(source, (*where, "intervention"), name, "intervention", known)]
        sweep = (doc.get("sweep") or {}).get("site")
        used = _sites_of(doc, name)
        if name in trained_interventions(doc) or sweep in used or "generate" in known[name]:
            return [
                source.issue(
                    (*where, "intervention"),
                    "D016",
                    f"labels from {name!r}: an intervention of one cell (not swept, not "
                    "trained, not generating) whose logits are the answer the fit learns",
                )
            ]
    if isinstance(labels, dict) and "field" in labels and train.get("objective") == "kl":
        return [
            source.issue(
                where,
                "D016",
                "labels of a row field are tokens: objective cross_entropy (kl takes logits: "
                "labels: source, or {intervention: name})",
            )
        ]
    return []


def _against_labels(source: Source) -> list[Issue]:
    """D016: a metric against the labels needs labels that are logits."""
    doc = source.data
    train = doc.get("train")
    labels = train.get("labels") if isinstance(train, dict) else None
    out = []
    for i, metric in enumerate(doc.get("metrics") or []):
        if metric.get("against") == "labels" and not (
            labels == "source" or (isinstance(labels, dict) and "intervention" in labels)
        ):
            out.append(
                source.issue(
                    ("metrics", i, "against"),
                    "D016",
                    "against: labels reads the logits train learns (train labels: source, "
                    "or {intervention: name}); this document has none",
                )
            )
    return out


def _sites_of(doc: dict[str, Any], intervention: str) -> list[str]:
    writes = doc.get("writes") or {}
    names = (doc.get("interventions") or {}).get(intervention, {}).get("writes") or []
    return [writes[w]["site"] for w in names if w in writes and "site" in writes[w]]


def trained_interventions(doc: dict[str, Any]) -> list[str]:
    """The interventions whose cells ``train`` fits: a source patch at a site whose
    featurizer is the one trained."""
    train = doc.get("train")
    if not isinstance(train, dict):
        return []
    writes, sites = doc.get("writes") or {}, doc.get("sites") or {}
    out = []
    for name, item in (doc.get("interventions") or {}).items():
        for w in item.get("writes") or []:
            write = writes.get(w) or {}
            site = sites.get(write.get("site")) or {}
            basis = write.get("featurizer", site.get("featurizer"))
            if write.get("value") == "source" and basis == train["featurizer"]:
                out.append(name)
                break
    return out


def split_issues(source: Source) -> list[Issue]:
    """The splits train and the featurizers' fits name exist (D032)."""
    doc = source.data
    out: list[Issue] = []
    train = doc.get("train")
    if isinstance(train, dict):
        for key, default in (("split", "train"), ("eval_split", None)):
            name = train.get(key, default)
            if name is not None:
                out += split_rows(source, name, ("train", key) if key in train else ("train",))[1]
    for name, item in (doc.get("featurizers") or {}).items():
        fit = item.get("fit") or {}
        if "split" in fit:
            out += split_rows(source, fit["split"], ("featurizers", name, "fit", "split"))[1]
    return out


def feature_count(source: Source, name: str, width: int) -> int:
    """The number of features featurizer ``name`` has at a place ``width`` wide."""
    item = source.data["featurizers"][name]
    kind = item["kind"]
    if kind in ("subspace", "pca"):
        return int(item["k"])
    if kind == "sae" and "features" in item:
        return int(item["features"])
    if kind == "gate":
        over = item.get("over", "identity")
        return width if over == "identity" else feature_count(source, over, width)
    if kind == "sae":
        return int(featurizer_file(source, item, None, 0).k or 0)
    return width


def featurizer_file(source: Source, item: dict[str, Any], address: Any, layer: int | None) -> Any:
    """The featurizer saved in the file the document names (``{layer}``: the layer),
    refused unless ``address`` (where given) has the width it was fitted at."""
    from ..featurizers import load

    written = str(item["file"]).replace("{layer}", str(layer if layer is not None else 0))
    return load(str(source.folder / written), onto=address)


def field_needs(doc: dict[str, Any]) -> dict[str, Path_]:
    """The row fields these sections read: a mechanism's vector texts, a label field."""
    needs: dict[str, Path_] = {}
    for name, item in (doc.get("mechanisms") or {}).items():
        vector = item.get("vector") or {}
        for key in ("mean_of", "minus"):
            if isinstance(vector.get(key), str):
                needs.setdefault(vector[key], ("mechanisms", name, "vector", key))
    train = doc.get("train")
    if isinstance(train, dict):
        labels = train.get("labels")
        if isinstance(labels, dict) and isinstance(labels.get("field"), str):
            needs.setdefault(labels["field"], ("train", "labels"))
        if labels == "source" or trained_interventions(doc):
            needs.setdefault("source", ("train",))
    return needs


def section_issues(source: Source) -> list[Issue]:
    """Every problem of these sections found without a model."""
    return [
        *_kind_issues(source, "featurizers", FEATURIZER_OPTIONS),
        *_kind_issues(source, "mechanisms", MECHANISM_OPTIONS),
        *_sae_issues(source),
        *_site_basis_issues(source),
        *_write_issues(source),
        *_generation_issues(source),
        *_train_issues(source),
        *_against_labels(source),
    ]


def lacking_field(source: Source, rows: Rows, field: str, path: Any) -> Issue | None:
    """D033 at ``path``: the rows that lack ``field``, which the document reads of every
    row (None where none lacks it)."""
    lacking = [n for n, row in enumerate(rows.rows) if field not in row]
    if not lacking:
        return None
    return source.issue(
        path,
        "D033",
        f"this reads the field {field!r} of every row, and rows {lacking[:10]} "
        f"have none (their fields: {sorted(rows.rows[lacking[0]])})",
    )


__all__ = [
    "FEATURIZER_OPTIONS",
    "MECHANISM_OPTIONS",
    "feature_count",
    "featurizer_file",
    "field_needs",
    "lacking_field",
    "section_issues",
    "split_issues",
    "trained_interventions",
]
