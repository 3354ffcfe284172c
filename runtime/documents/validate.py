"""The checks a document passes before a model is loaded: its schema (every error
at once), its cross references, the switches no document may turn on, where it may
save, and its rows.

Each problem is an ``Issue`` (``path:line:col: CODE message``); codes:

    D001 not readable as YAML or JSON
    D002 a key the schema does not know (did you mean)
    D003 a value the schema refuses
    D010 an unknown component (did you mean)
    D011 an unknown metric (did you mean)
    D012 a name that refers to no site, read, write or intervention
    D013 a featurizer or mechanism kind a document cannot build (did you mean)
    D014 a combination this runtime does not run (generation on the hooks engine, ...)
    D015 a position that is not well written
    D016 an intervention whose writes or readout do not fit together
    D017 a write at a read-only component
    D018 units or a featurizer on a place with no width
    D019 a site's TransformerLens hook name with no place: unknown, refused (what its
         tensor is, the nearest place), or given beside a component or layers
    D020 a save path that leaves --out
    D021 a code-loading switch (trust_remote_code, ...), which only the command line gives
    D022 remote runs
    D030 a data file that is missing
    D031 a data file or row that is malformed
    D032 a split the data does not have
    D033 a field a metric or write needs that a row lacks
    D040 a layer beyond the model       (checked with the model: ``checks.py``)
    D041 a head beyond the model
    D042 a position a row does not have
    D043 an answer that is not one token on the tokenizer
    D044 a unit beyond the place's width, a feature beyond the featurizer's
    D045 a model that cannot be loaded (the loader's reason)
    D046 a site's hook name that the model's family cannot serve (its reason)
    D050 an --out folder holding another document's results
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import PurePosixPath
from typing import Any

from .data import Rows, rows_of
from .sections import field_needs, lacking_field, section_issues, split_issues
from .source import Issue, Path_, Source

METRICS = ("logit_diff", "logprob", "cross_entropy", "kl", "accuracy", "iia")
# keys a document may never carry: each loads or runs code that is not the document's
CODE_SWITCHES = ("trust_remote_code", "code_revision", "custom_pipelines", "auto_map")


@functools.cache
def _validator() -> Any:
    from importlib.resources import files

    from jsonschema import Draft202012Validator

    text = files("causalab_mini.schema").joinpath("document.schema.json").read_text("utf-8")
    return Draft202012Validator(json.loads(text))


def _close(word: str, choices: Any) -> str:
    found = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(f) for f in found)}?)" if found else ""


def _switches(source: Source, node: Any, path: Path_ = ()) -> list[Issue]:
    out: list[Issue] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CODE_SWITCHES:
                out.append(
                    source.issue(
                        (*path, key),
                        "D021",
                        f"a document cannot set {key}: it would load and run code the "
                        "document does not show. Remove it; the person running the document "
                        "passes --trust-remote-code on the command line if they trust the model",
                    )
                )
            else:
                out.extend(_switches(source, value, (*path, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_switches(source, value, (*path, i)))
    return out


def _schema_issue(source: Source, error: Any) -> list[Issue]:
    path: Path_ = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = error.schema.get("properties", {})
        extra = [k for k in error.instance if k not in allowed and k not in CODE_SWITCHES]
        where = "/".join(str(p) for p in path) or "the document"
        return [
            source.issue(
                (*path, key),
                "D002",
                f"unknown key {key!r} in {where}{_close(key, allowed)}; "
                f"it takes {', '.join(allowed)}",
            )
            for key in extra
        ]
    if error.validator == "oneOf" and error.validator_value and path == ("data",):
        return [source.issue(path, "D003", "data takes either rows (inline) or file, one of them")]
    return [source.issue(path, "D003", _said(error))]


def _said(error: Any) -> str:
    where = "/".join(str(p) for p in error.absolute_path) or "the document"
    message = str(error.message)
    if len(message) > 200:
        message = message[:200] + "..."
    return f"{where}: {message}"


def schema_issues(source: Source) -> list[Issue]:
    out = _switches(source, source.data)
    for error in sorted(_validator().iter_errors(source.data), key=lambda e: list(e.path)):
        out.extend(_schema_issue(source, error))
    return out


def _components() -> Any:
    from causalab_mini.generated import COMPONENTS

    return COMPONENTS


def hook_sites(source: Source) -> list[Issue]:
    """A site written as a TransformerLens hook name (``hook:``) reads as the component
    and layer the name means on every family (filled in here; the model's own family
    is checked when the model is loaded), or D019 with the reason."""
    import difflib

    from causalab_mini.interop.transformer_lens import entry, hook_table, split

    out: list[Issue] = []
    for name, site in (source.data.get("sites") or {}).items():
        hook = site.get("hook") if isinstance(site, dict) else None
        if not isinstance(hook, str):
            continue
        path = ("sites", name, "hook")
        pattern, layer = split(hook)
        found = entry(None, pattern)
        if found is None:
            close = difflib.get_close_matches(pattern, list(hook_table()), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            out.append(
                source.issue(path, "D019", f"{hook!r} is no hook name the table knows{hint}")
            )
        elif "refused" in found:
            out.append(
                source.issue(
                    path,
                    "D019",
                    f"{hook}: TransformerLens's tensor there is {found['refused']}; no place "
                    f"holds it. The nearest is component {found['nearest']!r}: write that "
                    "if it is the tensor you mean",
                )
            )
        else:
            said = {"component": found["component"], "layers": None if layer is None else [layer]}
            if any(k in site and site[k] != v for k, v in said.items()):
                why = "a hook name already says its component and layer: give one or the other"
                out.append(source.issue(path, "D019", why))
                continue
            site.update({k: v for k, v in said.items() if v is not None})
    return out


def _site_issues(source: Source) -> list[Issue]:
    from ..positions import PositionError, parse

    out: list[Issue] = []
    table = _components()
    for name, site in (source.data.get("sites") or {}).items():
        component = site.get("component")
        if isinstance(component, str) and component not in table:
            out.append(
                source.issue(
                    ("sites", name, "component"),
                    "D010",
                    f"unknown component {component!r}{_close(component, table)}; "
                    f"the components are {', '.join(table)}",
                )
            )
        elif isinstance(component, str):
            spec = table[component]
            if site.get("layers") is not None and not spec.per_layer:
                out.append(
                    source.issue(
                        ("sites", name, "layers"),
                        "D003",
                        f"component {component!r} is not per layer: give no layers",
                    )
                )
            if site.get("heads") is not None and spec.per_head == "none":
                out.append(
                    source.issue(
                        ("sites", name, "heads"),
                        "D041",
                        f"component {component!r} is not per head: give no heads (the "
                        "per-head components: "
                        f"{', '.join(n for n, c in table.items() if c.per_head != 'none')})",
                    )
                )
        if site.get("units") is not None and site.get("heads") is not None:
            out.append(
                source.issue(
                    ("sites", name, "units"),
                    "D003",
                    f"site {name!r} names units and heads: units select the place's last "
                    "axis, so give one of them (a head's units: not supported)",
                )
            )
        if "positions" in site:
            try:
                parse(site["positions"])
            except PositionError as exc:
                out.append(source.issue(("sites", name, "positions"), "D015", str(exc)))
    return out


def _ref(source: Source, path: Path_, name: Any, kind: str, known: Any) -> list[Issue]:
    if name in known:
        return []
    return [
        source.issue(
            path,
            "D012",
            f"{name!r} names no {kind}{_close(str(name), known)}; the {kind}s are "
            f"{', '.join(known) or '(none)'}",
        )
    ]


def _reference_issues(source: Source) -> list[Issue]:
    doc = source.data
    sites, reads, writes = doc.get("sites") or {}, doc.get("reads") or {}, doc.get("writes") or {}
    out: list[Issue] = []
    for section, table in (("reads", reads), ("writes", writes)):
        for name, item in table.items():
            out += _ref(source, (section, name, "site"), item.get("site"), "site", sites)
    for name, item in (doc.get("interventions") or {}).items():
        if "attribute" in item:
            where = ("interventions", name, "attribute", "site")
            out += _ref(source, where, item["attribute"].get("site"), "site", sites)
        for i, w in enumerate(item.get("writes") or []):
            out += _ref(source, ("interventions", name, "writes", i), w, "write", writes)
        readout = item.get("readout", "logits")
        if readout != "logits":
            out += _ref(source, ("interventions", name, "readout"), readout, "read", reads)
    sweep = doc.get("sweep")
    if isinstance(sweep, dict) and "site" in sweep:
        out += _ref(source, ("sweep", "site"), sweep["site"], "site", sites)
    return out


def _intervention_issues(source: Source) -> list[Issue]:
    doc = source.data
    writes = doc.get("writes") or {}
    table = _components()
    out: list[Issue] = []
    for name, item in (doc.get("interventions") or {}).items():
        values = {writes[w].get("value") for w in item.get("writes") or [] if w in writes}
        where: Path_ = ("interventions", name)
        if "source" in values and len(values) > 1:
            out.append(
                source.issue(
                    (*where, "writes"),
                    "D016",
                    f"intervention {name!r} mixes source writes with {sorted(values - {'source'})} "
                    "writes: give them as two interventions",
                )
            )
        if "source" in values and item.get("input", "base") != "base":
            out.append(
                source.issue(
                    (*where, "input"),
                    "D016",
                    f"intervention {name!r} patches from the source: its input is the base",
                )
            )
        readout = item.get("readout", "logits")
        out += _attribute_issues(source, name, item)
        if "source" in values and readout != "logits":
            out.append(
                source.issue(
                    (*where, "readout"),
                    "D016",
                    f"intervention {name!r}: a patch from the source reads out the logits",
                )
            )
    for name, item in (doc.get("writes") or {}).items():
        site = (doc.get("sites") or {}).get(item.get("site"))
        spec = table.get(site.get("component")) if isinstance(site, dict) else None
        if site is not None and spec is not None and not spec.writable:
            out.append(
                source.issue(
                    ("writes", name, "site"),
                    "D017",
                    f"write {name!r} is at {site['component']!r}, which is read-only: "
                    f"{spec.why_read_only}",
                )
            )
    return out


def _attribute_issues(source: Source, name: str, item: dict[str, Any]) -> list[Issue]:
    """D016: an attribution runs alone (no writes, no readout), on the base, of a metric
    the document measures (its target and contrast), at a site without heads."""
    attribute = item.get("attribute")
    if not isinstance(attribute, dict):
        return []
    where: Path_ = ("interventions", name)
    out = []
    if item.get("writes") or "readout" in item or item.get("input", "base") != "base":
        out.append(
            source.issue(
                where,
                "D016",
                f"intervention {name!r} attributes: it runs on the base with no writes "
                "and no readout (give those to another intervention)",
            )
        )
    measured = [m.get("metric") for m in source.data.get("metrics") or []]
    if attribute.get("metric") not in measured:
        out.append(
            source.issue(
                (*where, "attribute", "metric"),
                "D012",
                f"attribution of {attribute.get('metric')!r}, which the document's metrics "
                f"do not name ({', '.join(map(str, measured))}): add it there (its target "
                "and contrast are read from it)",
            )
        )
    site = (source.data.get("sites") or {}).get(attribute.get("site"))
    if isinstance(site, dict) and site.get("heads") is not None:
        out.append(
            source.issue(
                (*where, "attribute", "site"),
                "D016",
                "an attribution scores a place per (row, position): its site names no heads",
            )
        )
    return out


def _metric_issues(source: Source) -> list[Issue]:
    out: list[Issue] = []
    for i, item in enumerate(source.data.get("metrics") or []):
        name = item.get("metric")
        if isinstance(name, str) and name not in METRICS:
            out.append(
                source.issue(
                    ("metrics", i, "metric"),
                    "D011",
                    f"unknown metric {name!r}{_close(name, METRICS)}; the metrics are "
                    f"{', '.join(METRICS)}",
                )
            )
    return out


def _sweep_issues(source: Source) -> list[Issue]:
    sweep = source.data.get("sweep")
    sites = source.data.get("sites") or {}
    if not isinstance(sweep, dict) or sweep.get("site") not in sites:
        return []
    site = sites[sweep["site"]]
    out = []
    for i, axis in enumerate(sweep.get("axes") or []):
        if axis in ("units", "heads") and site.get(axis) is None:
            out.append(
                source.issue(
                    ("sweep", "axes", i),
                    "D003",
                    f"the sweep runs over {axis} and site {sweep['site']!r} names none: give "
                    f"it {axis} (a list, a range or all)",
                )
            )
    return out


def _save_issues(source: Source) -> list[Issue]:
    save = source.data.get("save")
    if not isinstance(save, dict) or not isinstance(save.get("path"), str):
        return []
    written = save["path"]
    pure = PurePosixPath(written.replace("\\", "/"))
    if pure.is_absolute() or written.startswith("~") or ":" in pure.parts[0]:
        why = "it is absolute"
    elif ".." in pure.parts:
        why = "it goes up through .."
    else:
        return []
    return [
        source.issue(
            ("save", "path"),
            "D020",
            f"save path {written!r} leaves the --out folder ({why}): everything a run "
            "writes stays inside --out; give a relative folder such as 'results'",
        )
    ]


def _runtime_issues(source: Source) -> list[Issue]:
    out: list[Issue] = []
    if (source.data.get("model") or {}).get("remote"):
        out.append(
            source.issue(
                ("model", "remote"),
                "D022",
                "documents run locally here: an interchange has no remote engine. Say "
                "remote: false, or run the plan with Plan.run(..., remote=True) in Python",
            )
        )
    return out


def _row_issues(source: Source, rows: Rows) -> list[Issue]:
    doc = source.data
    needs: dict[str, Path_] = {}
    for i, metric in enumerate(doc.get("metrics") or []):
        if metric.get("against") == "source":
            needs.setdefault("source", ("metrics", i))
        reference = metric.get("against") in ("source", "labels")
        if metric.get("metric") == "kl" or (
            reference and metric.get("metric") in ("accuracy", "iia")
        ):
            continue  # no field: a kl, or a reference run's top token
        needs.setdefault(metric.get("target", "answer"), ("metrics", i))
        if metric.get("metric") == "logit_diff":
            needs.setdefault(metric.get("contrast", "contrast"), ("metrics", i))
    for name, item in (doc.get("writes") or {}).items():
        if item.get("value") == "source":
            needs.setdefault("source", ("writes", name))
    for name, item in (doc.get("interventions") or {}).items():
        if item.get("input") == "source" or "attribute" in item:
            needs.setdefault("source", ("interventions", name))
    for field, path in field_needs(doc).items():
        needs.setdefault(field, path)
    out = _source_counts(source, rows)
    for field, path in needs.items():
        issue = lacking_field(source, rows, field, path)
        if issue is not None:
            out.append(issue)
    return out


def _source_counts(source: Source, rows: Rows) -> list[Issue]:
    """D033: a write from source k needs k + 1 sources in every row."""
    out = []
    for name, item in (source.data.get("writes") or {}).items():
        if item.get("value") != "source":
            continue
        slot = int(item.get("source", 0))
        short = [
            n
            for n, row in enumerate(rows.rows)
            if "source" in row
            and (len(row["source"]) if isinstance(row["source"], list) else 1) <= slot
        ]
        if short:
            out.append(
                source.issue(
                    ("writes", name, "source"),
                    "D033",
                    f"write {name!r} takes source {slot} of each row, and rows {short[:10]} "
                    f"have fewer than {slot + 1} sources: give every row a list of sources",
                )
            )
    return out


def static_issues(source: Source) -> tuple[list[Issue], Rows | None]:
    """Every problem found without a model, and the rows (None where unreadable)."""
    issues = schema_issues(source)
    issues += hook_sites(source)
    checks = (
        _site_issues,
        _reference_issues,
        _intervention_issues,
        _metric_issues,
        _sweep_issues,
        _save_issues,
        section_issues,
        split_issues,
        _runtime_issues,
    )
    for check in checks:
        try:
            issues += check(source)
        except (AttributeError, TypeError, KeyError):
            if not issues:  # not a section the schema refused: a fault of the check
                raise
            continue  # a section the schema already refused: its issue is said
    rows, found = rows_of(source)
    issues += found
    if rows is not None:
        issues += _row_issues(source, rows)
    return _unique(issues), rows


def _unique(issues: list[Issue]) -> list[Issue]:
    seen: set[Issue] = set()
    out = []
    for issue in issues:
        if issue not in seen:
            seen.add(issue)
            out.append(issue)
    return out


__all__ = ["CODE_SWITCHES", "METRICS", "hook_sites", "static_issues"]
