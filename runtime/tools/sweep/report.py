"""The sweep's report: the totals, the JSON report, the coverage table (markdown), the
differences against another run, and a report joined with the moved build's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from causalab_mini.tools.verdicts import LOADED, ArchitectureOutcome, ComponentState

from .runner import Result


def group_name(result: Result | dict[str, Any]) -> str:
    """The group of a result (a report without groups is the causal LMs')."""
    group = result.get("group") if isinstance(result, dict) else result.group
    return group or "causal_lm"


def summarize(results: list[Result]) -> dict[str, Any]:
    totals = {
        "architectures": len(results),
        **{outcome.value: 0 for outcome in ArchitectureOutcome},
        **{state.value: 0 for state in ComponentState},
    }
    for r in results:
        totals[r.outcome] += 1
        for key, value in r.counts().items():
            totals[key] += value
    return totals


def write_report(results: list[Result], path: Path, seconds: float) -> None:
    import transformers

    from causalab_mini.tools.tiny import group_model_types
    from causalab_mini.versions import installed_version

    every = group_model_types()
    data = {
        "transformers": transformers.__version__,
        "nnsight": installed_version("nnsight"),
        "nnterp": installed_version("nnterp"),
        "seconds": round(seconds, 1),
        "summary": summarize(results),
        "groups": {
            g: summarize([r for r in results if group_name(r) == g])
            for g in every
            if any(group_name(r) == g for r in results)
        },
        "all_model_types": sum(len(types) for types in every.values()),
        "group_model_types": {g: len(types) for g, types in every.items()},
        "results": [r.__dict__ for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _versions_of(report: dict[str, Any]) -> str:
    """``transformers 5.24.0, nnsight 0.7.0, nnterp 1.3.0`` (what the report records)."""
    return ", ".join(
        f"{package} {report[package]}"
        for package in ("transformers", "nnsight", "nnterp")
        if report.get(package)
    )


def _states(result: dict[str, Any]) -> dict[str, str]:
    return {name: item["state"] for name, item in result["components"].items()}


def _cell(text: str | None, limit: int = 240) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:limit]


def _why(result: dict[str, Any]) -> str:
    """An architecture's outcome in a cell: its counts where certified, else its reason."""
    if result["outcome"] in LOADED:
        states = list(_states(result).values())
        ok, refused = states.count(ComponentState.OK), states.count(ComponentState.REFUSED)
        return f"{result['outcome']}: {ok} ok, {refused} refused"
    return f"{result['outcome']}: {_cell(result['reason'])}"


def differences_markdown(report: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Where another sweep (another nnsight or transformers) differs from ``report``,
    architecture by architecture: its outcome, or the components whose state differs,
    with the reasons both runs give (one sentence where they agree)."""
    here, there = _versions_of(report), _versions_of(other)
    mine = {r["model_type"]: r for r in report["results"]}
    theirs = {r["model_type"]: r for r in other["results"]}
    s, o = report["summary"], other["summary"]
    rows: list[str] = []
    for name in sorted(set(mine) & set(theirs)):
        a, b = mine[name], theirs[name]
        if a["outcome"] != b["outcome"]:
            rows.append(f"| {name} | {a['outcome']} -> {b['outcome']} | {_why(a)} | {_why(b)} |")
            continue
        sa, sb = _states(a), _states(b)
        for component in sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k)):
            ia, ib = a["components"].get(component, {}), b["components"].get(component, {})
            rows.append(
                f"| {name} | {component}: {sa.get(component)} -> {sb.get(component)} | "
                f"{_cell(ia.get('reason'))} | {_cell(ib.get('reason'))} |"
            )
    only = sorted(set(mine) ^ set(theirs))
    lines = ["", f"## Against {there}", ""]
    if not rows and not only:
        return [
            *lines,
            f"The sweep under {there} gives the same outcome and the same state "
            "for every component of every architecture.",
        ]
    lines += [
        f"The same sweep under {there}: {o['certified']} certified (here {s['certified']}), "
        f"{o['ok']} ok ({s['ok']}), {o['refused']} refused ({s['refused']}), "
        f"{o['broken']} broken ({s['broken']}), {o['unloadable']} do not load "
        f"({s['unloadable']}), {o['crashed']} crashed ({s['crashed']}). Every architecture "
        "not listed here has the same outcome and the same state for every component; "
        "architectures that do not load under both are listed only where they load under "
        "one.",
        "",
        f"| architecture | what differs ({here} -> {there}) | here | there |",
        "|---|---|---|---|",
        *rows,
    ]
    if only:
        lines += ["", f"Swept in one run only: {', '.join(only)}."]
    return lines


def _lens(result: dict[str, Any]) -> str:
    """The lens identity's figure for one architecture (checks.lens_identity): ok or
    broken with the worst error, or refused with the family's reason."""
    return str(result.get("components", {}).get("logits", {}).get("lens", ""))


def _lens_summary(report: dict[str, Any]) -> str:
    from causalab_mini.tools.checks import LENS_IDENTITY

    states = [_lens(r).split(":", 1)[0] for r in report["results"] if _lens(r)]
    return (
        f"Lens identity `{LENS_IDENTITY}` (`model.lens`, the family's lens rows): "
        f"**{states.count(ComponentState.OK)} ok**, **{states.count(ComponentState.REFUSED)} "
        f"refused** with the family's reason, **{states.count(ComponentState.BROKEN)} broken** "
        "(column lens)."
    )


def coverage_markdown(report: dict[str, Any], against: dict[str, Any] | None = None) -> str:
    """docs/coverage.md from a sweep report and the registry's block structures; with
    ``against`` (another run's report), where that run differs."""
    from causalab_mini.generated import BLOCK_STRUCTURES
    from causalab_mini.generated.tiny import TINY_GROUPS

    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in report["results"]:
        by_group.setdefault(group_name(r), []).append(r)
    order = [g for g in TINY_GROUPS if g in by_group]
    order += sorted(g for g in by_group if g not in TINY_GROUPS)
    lines = [
        "<!-- DO NOT EDIT: written by `registry sweep --doc docs/coverage.md` from the sweep "
        "report and the registry. -->",
        "# Coverage",
        "",
    ]
    several = len(order) > 1
    if several:
        counts = ", ".join(f"{len(by_group[g])} {_group_label(g)}" for g in order)
        lines += [
            f"{_versions_of(report)}: {len(report['results'])} architectures swept in "
            f"{report['seconds']} s, in {len(order)} groups (registry/tiny.yaml groups), each "
            f"reported on its own below: {counts}.",
            "",
        ]
    structures = "Structures: " + ", ".join(f"`{k}`" for k in BLOCK_STRUCTURES) + "."
    if several:
        lines += [structures, ""]
    reasons: dict[str, int] = {}
    for group in order:
        part = _group_markdown(report, group, by_group[group], several, reasons)
        if not several:  # one group: the layout of a causal-LM sweep alone
            at = next(i for i, line in enumerate(part) if line.startswith("Lens identity"))
            part[at:at] = [structures, ""]
        lines += part
        lines += _engines_markdown(by_group[group])
    from causalab_mini.tools.builds import both_markdown

    lines += both_markdown(by_group, {g: _group_label(g) for g in by_group})
    lines += ["", "## Refusals, by reason", "", "| times | reason |", "|---|---|"]
    for text, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        cell = text[:400].replace("|", "\\|")
        lines.append(f"| {count} | {cell} |")
    if against is not None:
        lines += differences_markdown(report, against)
    return "\n".join(lines) + "\n"


def _engines_markdown(results: list[dict[str, Any]]) -> list[str]:
    """Per architecture, the certified components each engine serves (the sweep's
    hooks_engine check notes ``engines``; nothing where a report predates it)."""
    rows = []
    for r in results:
        ok = {k: i for k, i in r["components"].items() if i["state"] == "ok"}
        if not any("engines" in i for i in ok.values()):
            continue
        hooks = [k for k, i in ok.items() if "hooks" in i.get("engines", "")]
        reads = [k for k in hooks if "reads only" in ok[k]["engines"]]
        rest = [k for k in ok if k not in hooks]
        refused = "; ".join(f"{k}" for k in rest)
        rows.append(
            f"| {r['model_type']} | {', '.join(r.get('families') or [])} | {len(ok)} | "
            f"{len(hooks)} | {', '.join(reads)} | {_cell(refused, 300)} |"
        )
    if not rows:
        return []
    return [
        "",
        "Engines: of the components certified (ok), those the hooks engine "
        '(`engine="hooks"`) serves, certified torch.equal to the nnsight engine\'s by the '
        "sweep's hooks_engine check; the nnsight engine serves every ok component. The "
        "reasons of the hooks engine's refusals are in coverage.json (`hooks_refused`).",
        "",
        "| architecture | families | ok (nnsight) | hooks | hooks reads only | hooks refuses |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def _group_label(group: str) -> str:
    """``causal-LM`` for the causal LMs, else the group's name in words."""
    return "causal-LM" if group == "causal_lm" else group.replace("_", "-")


def _group_markdown(
    report: dict[str, Any],
    group: str,
    results: list[dict[str, Any]],
    several: bool,
    reasons: dict[str, int],
) -> list[str]:
    """One group's paragraph and table (its refusals counted into ``reasons``)."""
    from causalab_mini.generated.tiny import TINY_GROUPS

    s = summarize([Result(**r) for r in results])
    label = _group_label(group)
    lines: list[str] = []
    if several:
        lines += [f"## {label[0].upper()}{label[1:]} architectures", ""]
        if group in TINY_GROUPS:
            lines += [f"{TINY_GROUPS[group][2][0].upper()}{TINY_GROUPS[group][2][1:]}.", ""]
    swept = (
        f"{s['architectures']} {label} architectures swept"
        if several
        else f"{_versions_of(report)}: {s['architectures']} {label} architectures swept "
        f"in {report['seconds']} s"
    )
    lines += [
        f"{swept}. {s['certified']} loaded and certified component by component; "
        f"{s.get('unfinished', 0)} load but are unfinished (a place refused only because no "
        "block-structure rule gives their structure); "
        f"{s['unbuildable']} cannot be built tiny, {s['unloadable']} do not load, "
        f"{s['crashed']} crashed, {s['timeout']} timed out.",
        "",
        f"Components: **{s['ok']} ok** (certified on real tensors), **{s['refused']} refused** "
        f"with a reason, **{s['broken']} broken**.",
        "",
        _lens_summary({"results": results}),
        "",
        "| architecture | class | structure | ok | refused | broken | lens | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [_group_row(r, reasons) for r in results]
    return lines


def _group_row(r: dict[str, Any], reasons: dict[str, int]) -> str:
    """One architecture's line of its group's table (its refusals counted into
    ``reasons``)."""
    counts = {state.value: 0 for state in ComponentState}
    for item in r["components"].values():
        counts[item["state"]] += 1
    note = r["reason"] or ""
    if r["outcome"] in LOADED:
        broken = [
            f"{k}: {i['reason']}"
            for k, i in r["components"].items()
            if i["state"] == ComponentState.BROKEN
        ]
        note = "; ".join(broken)[:300]
        if r["outcome"] == ArchitectureOutcome.UNFINISHED:
            note = "; ".join(x for x in (r["reason"], note) if x)
    note = note.replace("|", "\\|").replace("\n", " ")[:300]
    row = (
        f"| {r['model_type']} | {r['model_class'] or ''} | {r['structure'] or ''} | "
        f"{counts['ok']} | {counts['refused']} | {counts['broken']} | "
        f"{_cell(_lens(r), 120)} | "
        f"{'' if r['outcome'] == ArchitectureOutcome.CERTIFIED else r['outcome'] + ': '}{note} |"
    )
    for item in r["components"].values():
        if item["state"] == ComponentState.REFUSED:
            text = item["reason"].split("\n", 1)[0]
            reasons[text] = reasons.get(text, 0) + 1
    return row


def joined_with_moved(report: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """``report`` (a default-build sweep) with each architecture that ``moved`` (a
    moved-build sweep) also swept replaced by the two combined (tools/builds.py)."""
    from causalab_mini.tools.builds import combined

    theirs = {r["model_type"]: Result(**r) for r in moved["results"]}
    results = []
    for r in report["results"]:
        other = theirs.get(r["model_type"])
        if other is None or (r.get("build") or {}).get("outcomes"):
            results.append(r)
            continue
        results.append(combined(Result(**r), other).__dict__)
    return {**report, "results": results}
