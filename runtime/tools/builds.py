"""The sweep over both tiny builds (runtime/tools/tiny/build.py ``BUILDS``): the default
build and the moved one (``tiny:<model_type>?build=moved``: scales, caps, clips, head
and expert sizes and epsilons moved, norms drawn away from identity). A constant
factor, a width mix-up or a norm applied twice passes every identity when the factor
is 1 and the norm the identity; the moved build is where it shows. A place is
certified only where it holds on both builds: ``combined`` joins one architecture's
two results, ``both_markdown`` says per group how many architectures hold on both and
lists, per architecture, what the moved build moved, skipped (why) and found to change
nothing in transformers' own forward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from causalab_mini.tools.verdicts import LOADED, ArchitectureOutcome, ComponentState

__all__ = ["both_markdown", "build_of", "combined", "holds", "manifest_of", "spec_for"]

MOVED = "moved"


def spec_for(model_type: str, build: str) -> str:
    """The sweep's spec of ``model_type`` in ``build`` (the default build: the bare type)."""
    return model_type if build == "default" else f"tiny:{model_type}?build={build}"


def build_of(spec: str) -> str:
    """The build a sweep spec names (``tiny:llama?build=moved`` -> moved)."""
    _, _, query = spec.partition("?")
    for part in query.split("&"):
        key, _, value = part.partition("=")
        if key == "build":
            return value
    return "default"


def manifest_of(path: str) -> dict[str, Any]:
    """What a moved checkpoint's tiny_build.json records of its build (moved,
    skipped, no_effect, norms_drawn); empty for a default build."""
    file = Path(path) / "tiny_build.json"
    if not file.is_file():
        return {}
    data = json.loads(file.read_text())
    keys = ("build", "moved", "skipped", "no_effect", "norms_drawn", "weights_scaled")
    return {k: data[k] for k in keys if k in data}


_WORSE = [
    ArchitectureOutcome.CERTIFIED,
    ArchitectureOutcome.UNFINISHED,
    ArchitectureOutcome.UNBUILDABLE,
    ArchitectureOutcome.UNLOADABLE,
    ArchitectureOutcome.TIMEOUT,
    ArchitectureOutcome.CRASHED,
]


def _component(default: dict[str, Any] | None, moved: dict[str, Any] | None) -> dict[str, Any]:
    """One component over both builds: ok where ok on both; broken where broken on
    either (the reason names the build); refused where refused on both, or on one and
    ok on the other (the refusing build's reason, named)."""
    states = {b: (item or {}).get("state") for b, item in (("default", default), (MOVED, moved))}
    base = dict(default or moved or {})
    base["builds"] = states
    for state in (ComponentState.BROKEN, ComponentState.REFUSED):
        for build, item in (("default", default), (MOVED, moved)):
            if item is not None and item.get("state") == state:
                base["state"] = state
                base["reason"] = f"{build} build: {item.get('reason', '')}"
                return base
    if states["default"] == states[MOVED] == ComponentState.OK:
        base["state"] = ComponentState.OK
        base["checks"] = sorted(
            {*(default or {}).get("checks", []), *(moved or {}).get("checks", [])}
        )
        return base
    missing = MOVED if moved is None else "default"
    base["state"] = ComponentState.BROKEN
    base["reason"] = f"not certified on the {missing} build (it did not load there)"
    return base


def combined(default: Any, moved: Any) -> Any:
    """One architecture's result over both builds (sweep.Result objects): the worse
    outcome (the reason names the build), each component as ``_component`` says, and
    the moved build's manifest under ``build``."""
    import dataclasses

    order = {o: i for i, o in enumerate(_WORSE)}
    worse = max((default, moved), key=lambda r: order[ArchitectureOutcome(r.outcome)])
    which = "default" if worse is default else MOVED
    out = dataclasses.replace(default)
    out.outcome = worse.outcome
    out.reason = f"{which} build: {worse.reason}" if worse.reason else None
    out.seconds = default.seconds + moved.seconds
    out.build = {
        **(moved.build or {}),
        "outcomes": {"default": default.outcome, MOVED: moved.outcome},
    }
    if default.outcome in LOADED and moved.outcome in LOADED:
        names = [*default.components, *(n for n in moved.components if n not in default.components)]
        out.components = {
            n: _component(default.components.get(n), moved.components.get(n)) for n in names
        }
    elif default.outcome in LOADED:
        out.components = {n: _component(item, None) for n, item in default.components.items()}
    return out


def holds(result: dict[str, Any]) -> bool:
    """Whether an architecture's result (as a report holds it) is certified with
    nothing broken."""
    return _holds(result)


def _holds(result: dict[str, Any]) -> bool:
    return result["outcome"] == ArchitectureOutcome.CERTIFIED and not any(
        i["state"] == ComponentState.BROKEN for i in result["components"].values()
    )


def both_markdown(by_group: dict[str, list[dict[str, Any]]], labels: dict[str, str]) -> list[str]:
    """The section of docs/coverage.md on the two builds: per group, how many
    architectures hold on both (certified, nothing broken), and per architecture swept
    in the moved build what it moved, skipped and found to change nothing."""
    swept = {
        g: [r for r in results if (r.get("build") or {}).get("outcomes")]
        for g, results in by_group.items()
    }
    if not any(swept.values()):
        return []
    lines = [
        "",
        "## Both builds",
        "",
        "Each architecture below was certified twice: on the default tiny build and on the "
        "moved one (`tiny:<model_type>?build=moved`, registry/tiny.yaml `moved`: every "
        "config field that scales, caps, clips, sizes a head or an expert, or sets an "
        "epsilon moved away from its value, every norm's weight and bias drawn away from "
        "identity). A component counts as ok only where it is ok on both.",
        "",
        "| group | swept on both builds | hold on both | certified on the default build only |",
        "|---|---|---|---|",
    ]
    for group, results in swept.items():
        if not results:
            continue
        holds = sum(_holds(r) for r in results)
        default_only = sum(
            r["build"]["outcomes"]["default"] == ArchitectureOutcome.CERTIFIED and not _holds(r)
            for r in results
        )
        lines.append(f"| {labels.get(group, group)} | {len(results)} | {holds} | {default_only} |")
    lines += [
        "",
        "Fields the moved build moved that change none of the logits of transformers' own "
        "forward on the smoke batch (`no effect`: nothing relies on them there), and fields "
        "it skipped because the config refuses the value or the forward cannot run with it:",
        "",
        "| architecture | moved | no effect | skipped (why) | not holding on both |",
        "|---|---|---|---|---|",
    ]
    for results in swept.values():
        for r in results:
            build = r.get("build") or {}
            moved = ", ".join(f"`{k}`" for k in build.get("moved", {}))
            quiet = ", ".join(f"`{k}`" for k in build.get("no_effect", []))
            skipped = "; ".join(build.get("skipped", {}).values())
            broken = "; ".join(
                f"{k}: {i.get('reason', '')}"
                for k, i in r["components"].items()
                if i["state"] == ComponentState.BROKEN
            )
            if r["outcome"] not in LOADED:
                broken = f"{r['outcome']}: {r.get('reason') or ''}"
            cells = [moved, quiet, skipped[:300], broken[:300]]
            cells = [c.replace("|", "\\|").replace("\n", " ") for c in cells]
            lines.append(f"| {r['model_type']} | " + " | ".join(cells) + " |")
    return lines
