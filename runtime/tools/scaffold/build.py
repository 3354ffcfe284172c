"""The whole build: inspect, try, verify, and prove the rows through the runtime."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from causalab_mini.address import Address, IOType
from causalab_mini.codegen.model import address_fields
from causalab_mini.generated import (
    BLOCK_STRUCTURE_RULES,
    BLOCK_STRUCTURES,
    DEFAULT_ADDRESSES,
)
from causalab_mini.tools.certify import CheckResult, parse_identity
from causalab_mini.tools.scaffold.capture import capture
from causalab_mini.tools.scaffold.data import (
    CONTRIBUTIONS,
    ROWS,
    Scaffold,
    ScaffoldError,
    StructureTrial,
    Verdict,
    first_reason,
)
from causalab_mini.tools.scaffold.loading import (
    detect_containers,
    family_name,
    force_structure,
    load,
    quiet,
    resolve_spec,
)
from causalab_mini.tools.scaffold.places import RELATIONS, place_verdicts
from causalab_mini.tools.scaffold.probabilities import probability_candidates
from causalab_mini.tools.scaffold.search import (
    Search,
    decide_structure,
    layers_text,
    scale_candidates,
    try_structure,
)


def _nnterp_container(model: Any, name: str) -> str | None:
    """The module path nnterp itself resolved for one of its containers."""
    try:
        path = str(getattr(model, name).path)
    except Exception:
        return None
    return path.removeprefix("model.") if path.startswith("model.") else None


def rows_for(verdicts: dict[str, Verdict]) -> dict[str, Address]:
    rows = dict(DEFAULT_ADDRESSES)  # every name, so no existing family's row leaks in
    for name, verdict in verdicts.items():
        if verdict.status == "verified" and verdict.fields:
            rows[name] = dataclasses.replace(ROWS[name], **address_fields(verdict.fields))
    return rows


def _existing_rule(model: Any) -> str | None:
    names = tuple(c.__name__ for c in type(model._model).__mro__)
    for rule in BLOCK_STRUCTURE_RULES:
        if rule.match.matches(names, model.model_type, model.text_config):
            structure: str = rule.structure
            return structure
    return None


def _structural_flags(config: Any) -> list[str]:
    """Boolean config attributes whose names suggest they change the block."""
    pattern = re.compile(
        r"parallel|residual|post_?(?:layer_?)?norm|pre_?(?:layer_?)?norm|sandwich|alibi|"
        r"new_decoder|norm_before|norm_after",
        re.I,
    )
    return [
        f"{key}={value}"
        for key, value in sorted(config.to_dict().items())
        if isinstance(value, bool) and pattern.search(key) and not key.startswith("use_cache")
    ]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for package in ("causalab-mini", "transformers", "nnsight", "nnterp", "torch"):
        try:
            out[package] = version(package)
        except Exception:
            continue
    return out


def scaffold(arg: str, family: str | None = None) -> Scaffold:
    """Inspect, try and verify: everything a family file for ``arg`` can say."""
    quiet()
    spec, model_type = resolve_spec(arg)
    containers, notes, model_class = _inspect(spec, model_type)
    family = family_name(model_type, family)
    model = _load_eager(spec, containers, notes)
    search, trials, structure, structure_evidence = _decide(model)
    verdicts = _structure_verdicts(model, search, trials, structure, structure_evidence)
    verify_model, probs = _verified_load(spec, containers, model, verdicts)
    checks = _prove(verify_model, structure, probs, verdicts, notes)
    n = verify_model.internals.num_layers
    passed, failures = _summarize(checks, n)
    _demote(verdicts, failures)
    _fill_defaults(verdicts, passed, verify_model)
    if "layers_input" in verdicts and any(p.startswith("hidden_states[i]") for p in passed):
        verdicts["layers_input"].check = "hidden_states[i] == layers_input"
    if structure is not None and _identity_failed(failures):
        structure_evidence += "; but the proof through the runtime failed: " + "; ".join(failures)
        structure = None
    return Scaffold(
        spec=spec,
        model_type=model_type,
        model_class=model_class,
        family=family,
        num_layers=n,
        containers=containers,
        container_evidence=_container_evidence(checks, notes),
        structure=structure,
        structure_evidence=structure_evidence,
        trials=trials,
        verdicts={name: verdicts[name] for name in ROWS if name in verdicts},
        checks=passed,
        failures=failures,
        existing_rule=_existing_rule(verify_model),
        structural_flags=_structural_flags(verify_model.text_config),
        notes=notes,
        versions=_versions(),
    )


def _inspect(spec: str, model_type: str) -> tuple[dict[str, str | bool], list[str], str]:
    """Build (or load) the transformers model: (its containers, notes, its class)."""
    import transformers

    from causalab_mini.tools.tiny import TinyBuildError, build_class, resolve_model_spec

    try:
        path = resolve_model_spec(spec)
        hf_model = getattr(transformers, build_class(model_type)).from_pretrained(path)
    except (TinyBuildError, OSError, ValueError) as exc:
        raise ScaffoldError(f"cannot build or load {spec}: {exc}") from exc
    containers, notes = detect_containers(hf_model)
    return containers, notes, type(hf_model).__name__


def _load_eager(spec: str, containers: dict[str, str | bool], notes: list[str]) -> Any:
    """nnterp's load with the containers found and the default rows, eager attention
    (the probabilities are tried on this model too); the final norm nnterp found
    where the module tree did not tell."""
    try:
        model = load(spec, containers, dict(DEFAULT_ADDRESSES), False, attn_implementation="eager")
    except Exception as exc:
        raise ScaffoldError(
            f"nnterp does not load {spec} with the containers found "
            f"({', '.join(f'{k}={v}' for k, v in containers.items())}): {exc}"
        ) from exc
    if "ln_final_name" not in containers:
        found = _nnterp_container(model, "ln_final")
        if found:  # the hidden-state oracle below checks it
            containers["ln_final_name"] = found
            notes[:] = [n for n in notes if not n.startswith("final norm")]
    return model


def _decide(model: Any) -> tuple[Search, list[StructureTrial], str | None, str]:
    """One capture, every structure tried on it, the one decided (or None, with why)."""
    from causalab_mini.tools import certify

    inputs = certify.sample_inputs(model)
    cap = capture(model, inputs)
    search = Search(cap, scale_candidates(model.text_config))
    trials = [try_structure(search, name) for name in BLOCK_STRUCTURES]
    layer0 = model.internals.layer_envoy(0)._module

    def layer_has(path: str) -> bool:
        value: Any = layer0
        for part in path.split("."):
            value = getattr(value, part, None)
        return value is not None

    structure, structure_evidence = decide_structure(search, trials, layer_has)
    return search, trials, structure, structure_evidence


def _structure_verdicts(
    model: Any,
    search: Search,
    trials: list[StructureTrial],
    structure: str | None,
    structure_evidence: str,
) -> dict[str, Verdict]:
    """The places of the decided structure; with none decided, every place that
    depends on it is missing."""
    verdicts: dict[str, Verdict] = {}
    if structure is not None:
        trial = next(t for t in trials if t.name == structure)
        decided: dict[str, Verdict] = place_verdicts(model, search, structure, trial)
        return decided
    for text in {t for s in BLOCK_STRUCTURES.values() for t in s.identities}:
        left, right = parse_identity(text)
        for place in (left, *right):
            if ROWS[place].is_structural or place in CONTRIBUTIONS:
                verdicts.setdefault(
                    place,
                    Verdict(
                        place,
                        "missing",
                        f"depends on the block structure, which is undecided: {structure_evidence}",
                    ),
                )
    return verdicts


def _verified_load(
    spec: str, containers: dict[str, str | bool], model: Any, verdicts: dict[str, Verdict]
) -> tuple[Any, Verdict]:
    """The probabilities tried on ``model``, then the model loaded with the rows found
    (probabilities enabled where a row reaches them, unless nnterp's own load-time
    check refuses it): (that model, the probabilities' verdict)."""
    probs = probability_candidates(model, rows_for(verdicts))
    verdicts["attention_probabilities"] = probs
    rows = rows_for(verdicts)
    enabled = probs.status in ("default", "verified")
    try:
        return load(spec, containers, rows, enabled), probs
    except Exception as exc:  # nnterp's own load-time check of the probabilities
        if not enabled:
            raise
        probs.status = "missing"
        probs.evidence += f"; but nnterp's load-time check refuses it: {first_reason(exc)}"
        return load(spec, containers, rows_for(verdicts), False), probs


def _prove(
    model: Any,
    structure: str | None,
    probs: Verdict,
    verdicts: dict[str, Verdict],
    notes: list[str],
) -> list[Any]:
    """certify's checks of the rows through the runtime, as if the block were
    ``structure``; a place the runtime cannot read becomes missing."""
    from causalab_mini.tools import certify

    force_structure(model, structure)
    inputs = certify.sample_inputs(model)
    values, unreadable = _read_all(model, inputs)
    checks: list[CheckResult] = certify.identities(model, values)
    checks += certify.hidden_state_oracle(model, inputs, values)
    if probs.status in ("default", "verified"):
        checks += _guarded(lambda: certify.attention_oracle(model, inputs), notes)
    if structure is not None and not unreadable:
        write = _guarded(lambda: [certify.write_reaches_stream(model, inputs)], notes)
        checks += [c for c in write if c is not None]
    for name, reason in unreadable.items():
        verdicts[name] = Verdict(name, "missing", f"the runtime cannot read it: {reason}")
    return checks + _equal_places(values, model.internals.num_layers)


def _equal_places(values: dict[Any, Any], n: int) -> list[Any]:
    """The relations that say two places hold one tensor, compared on every layer."""
    from causalab_mini.tools import certify

    checks = []
    for place, relation in RELATIONS.items():
        if relation.check != "equals":
            continue
        for layer in range(n):
            a, b = (place, layer), (relation.other, layer)
            if a in values and b in values:
                name = f"{place} == {relation.other}"
                checks.append(certify.compare(name, layer, values[a], values[b]))
    return checks


def _identity_failed(failures: list[str]) -> bool:
    """Whether one of the structures' identities (or layers_output) failed the proof."""
    return any(
        f.split(":")[0] in {t for s in BLOCK_STRUCTURES.values() for t in s.identities}
        or f.startswith("layers_output")
        for f in failures
    )


def _container_evidence(checks: list[Any], notes: list[str]) -> str:
    """What verified the containers: nnterp's load, and transformers' own outputs."""
    oracle = [c for c in checks if c.description.startswith(("hidden_states", "model logits"))]
    container_evidence = "nnterp loads the model with these containers"
    if oracle and all(c.ok for c in oracle):
        container_evidence += ", and transformers' own outputs agree: " + ", ".join(
            sorted({c.description for c in oracle})
        )
    elif oracle:
        notes.append(
            "transformers' hidden_states or logits disagree with the places they name: "
            "check the containers (layers_name, ln_final_name)"
        )
    return container_evidence


def _read_all(model: Any, inputs: dict[str, Any]) -> tuple[dict[Any, Any], dict[str, str]]:
    """certify.read_places over every place; where one trace fails, place by place, so
    one unreadable row names itself instead of failing the whole proof."""
    from causalab_mini.tools import certify

    try:
        return certify.read_places(model, inputs), {}
    except Exception:
        pass
    values: dict[Any, Any] = {}
    bad: dict[str, str] = {}
    for name in model.internals:
        if model.internals[name].row.io is IOType.MODULE:
            continue
        try:
            values.update(certify.read_places(model, inputs, [name]))
        except Exception as exc:
            bad[name] = first_reason(exc)
    return values, bad


def _guarded(run: Any, notes: list[str]) -> list[Any]:
    try:
        return list(run())
    except Exception as exc:
        notes.append(f"a check could not run: {first_reason(exc)}")
        return []


def _fill_defaults(verdicts: dict[str, Verdict], passed: list[str], model: Any) -> None:
    """The places no search decided: default rows, with what checked them (if anything)."""
    for name, row in DEFAULT_ADDRESSES.items():
        if name in verdicts:
            continue
        proof = [p for p in passed if re.search(rf"\b{name}\b", p.split(" on ")[0])]
        if row.io is IOType.MODULE:
            verdicts[name] = Verdict(
                name, "default", f"the module {row.module} exists", check="the module exists"
            )
        elif proof:
            verdicts[name] = Verdict(
                name, "default", "; ".join(proof), check=proof[0].split(" on ")[0]
            )
        else:
            reason = model.internals.status().get(name)
            verdicts[name] = Verdict(
                name,
                "unchecked" if reason is None else "refused",
                reason or f"the default row reads {row.describe()}; no identity or oracle names it",
            )


def _summarize(checks: list[Any], n: int) -> tuple[list[str], list[str]]:
    """certify's checks grouped by name: the ones that held, and the ones that failed."""
    by_name: dict[str, list[Any]] = {}
    for check in checks:
        by_name.setdefault(check.description, []).append(check)
    passed, failed = [], []
    for name, group in by_name.items():
        worst = max(c.max_error for c in group)
        layers = [c.layer for c in group if c.layer is not None]
        where = (
            "the whole model"
            if not layers
            else layers_text(n)
            if len(layers) == n
            else f"layers {layers}"
        )
        if all(c.ok for c in group):
            passed.append(f"{name} on {where} (max error {worst:.1e})")
        else:
            bad = [c.layer for c in group if not c.ok]
            failed.append(
                f"{name}: fails on {bad if layers else 'the whole model'} (max error {worst:.3g})"
            )
    return passed, failed


def _demote(verdicts: dict[str, Verdict], failures: list[str]) -> None:
    """A written row whose proof failed is not written: it becomes a choice."""
    for failure in failures:
        named = set(re.findall(r"[a-z_]+", failure.split(":")[0]))
        for name in named & set(verdicts):
            verdict = verdicts[name]
            if verdict.status == "verified":
                verdict.status = "ambiguous"
                verdict.choices = [verdict.chosen] if verdict.chosen else []
                verdict.evidence += f"; but the proof failed: {failure}"
