"""Writing: the family file's text, the rule added to block_structures.yaml."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from causalab_mini.generated import (
    DEFAULT_ADDRESSES,
)
from causalab_mini.tools.scaffold.data import ROWS, Candidate, Scaffold, ScaffoldError, Verdict
from causalab_mini.tools.scaffold.probabilities import probability_rows

WIDTH = 92


def _comment(text: str, indent: str = "", first: str = "") -> list[str]:
    """``text`` as YAML comment lines of at most WIDTH columns."""
    prefix = f"{indent}# "
    lines = textwrap.wrap(
        text,
        width=WIDTH - len(prefix),
        initial_indent=first,
        subsequent_indent=" " * len(first) if first.endswith("  ") else "",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [(prefix + line).rstrip() for line in lines] or [prefix.rstrip()]


def yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_ .,()/+-]*", text)
    if plain and text not in ("null", "true", "false") and not text.endswith(" "):
        return text
    return json.dumps(text)  # a YAML double-quoted scalar


def _row_lines(place: str, fields: dict[str, Any], indent: str = "  ") -> list[str]:
    lines = [f"{indent}{place}:"]
    lines += [f"{indent}  {key}: {yaml_scalar(value)}" for key, value in fields.items()]
    return lines


def _choice_fields(verdict: Verdict, choice: Candidate) -> dict[str, Any]:
    if verdict.place == "attention_probabilities":
        _, _, needles = choice.module.partition(".")
        fields: dict[str, Any] = {}
        default = DEFAULT_ADDRESSES["attention_probabilities"]
        for row in probability_rows():
            if ".".join([row.module, *row.source]) == choice.module:
                if row.module != default.module:
                    fields["module"] = row.module
                fields["source"] = list(row.source)
        return fields or {"source": [needles]}
    return choice.row_fields(ROWS[verdict.place]) or {"module": choice.module}


def rule_text(structure: str, model_type: str, spec: str) -> list[str]:
    return [
        f"  - structure: {structure}  # verified by `registry new-family {spec}`",
        f"    model_types: [{model_type}]",
    ]


def render_family(sc: Scaffold, *, rule_written: bool = False) -> str:
    """The family file: verified rows as rows, the rest as comments to decide."""
    out = ["# yaml-language-server: $schema=../../schema/family.schema.json", "#"]
    out += _intro_comments(sc)
    out += _structure_comments(sc, rule_written)
    out += _found_comments(sc)
    out += _family_lines(sc)
    out += _address_lines(sc)
    return "\n".join(out) + "\n"


def _intro_comments(sc: Scaffold) -> list[str]:
    """How the file was made, and how to read it."""
    v = sc.versions
    out = _comment(
        f"{sc.model_class}: scaffolded by `registry new-family {sc.spec}` on a tiny random "
        f"instance ({sc.num_layers} layers; transformers {v.get('transformers', '?')}, nnsight "
        f"{v.get('nnsight', '?')}, nnterp {v.get('nnterp', '?')}). Every row below passed the "
        "check named above it, on that instance. A line starting `DECIDE` marks a choice for "
        "a person: the candidates follow it, commented out, with their evidence. Then run "
        "`registry lint` and `registry gen`. Fields: see gpt2.yaml."
    )
    out.append("#")
    return out


def _structure_comments(sc: Scaffold, rule_written: bool) -> list[str]:
    """The block structure (verified, or to decide), the others and why not, its rule,
    and the config values that may switch it."""
    out: list[str] = []
    if sc.structure is not None:
        out += _comment(f"Block structure: {sc.structure}, verified: {sc.structure_evidence}.")
    else:
        out += _comment(f"DECIDE the block structure: {sc.structure_evidence}.")
        out += _comment(
            "Where none of the structures applies, give no rule and say why in "
            "structure_unknown_reason: (the reason of every structural place; see dory.yaml)."
        )
    trials = {t.name: t for t in sc.trials}
    others = [
        f"{t.name} ({t.ruled_out or t.evidence})" for t in trials.values() if t.name != sc.structure
    ]
    if others:
        out += _comment("Not " + "; not ".join(others) + ".")
    if sc.structure is not None:
        out += _rule_comments(sc, sc.structure, rule_written)
    if sc.structural_flags:
        out += _comment(
            "Verified for this config only. These config values may switch the structure: "
            f"{', '.join(sc.structural_flags)}; rebuild with tiny:{sc.model_type}?<key>=<value> "
            "and run this command again (a rule can match on config values)."
        )
    return out


def _rule_comments(sc: Scaffold, structure: str, rule_written: bool) -> list[str]:
    """What block_structures.yaml says of the verified structure, or the rule to add."""
    if sc.existing_rule == structure:
        return _comment("block_structures.yaml already gives this structure.")
    if sc.existing_rule is not None:
        return _comment(
            f"DECIDE: block_structures.yaml gives {sc.existing_rule} for this model, but "
            f"only {structure} passes here; check the rule (is it config-dependent?)."
        )
    if rule_written:
        out = _comment("Its rule was added to block_structures.yaml:")
    else:
        out = _comment("Add its rule to the rules of block_structures.yaml:")
    return out + ["#" + line for line in rule_text(structure, sc.model_type, sc.spec)]


def _found_comments(sc: Scaffold) -> list[str]:
    """The places the default rows serve (checked, unchecked, refused), the notes and
    the failures of the proof."""
    out: list[str] = []
    defaults = [x for x in sc.verdicts.values() if x.status == "default"]
    if defaults:
        out.append("#")
        out += _comment("Checked with the default rows (no row needed):")
        width = max(len(x.place) for x in defaults)
        out += [f"#   {x.place:{width}}  {x.check or x.evidence}".rstrip() for x in defaults]
    unchecked = [x for x in sc.verdicts.values() if x.status == "unchecked"]
    if unchecked:
        out += _comment(
            "Default rows nothing here checks: "
            + ", ".join(
                f"{x.place} ({x.chosen.describe()})" if x.chosen else x.place for x in unchecked
            )
            + "."
        )
    refused = [x for x in sc.verdicts.values() if x.status == "refused"]
    if refused:
        out += _comment(
            f"Refused on {'a ' + sc.structure if sc.structure else 'this'} block, with the "
            f"registry's reason: {', '.join(x.place for x in refused)}."
        )
    for note in sc.notes:
        out += _comment(f"Note: {note}")
    if sc.failures:
        out += _comment("The proof through the runtime failed: " + "; ".join(sc.failures))
    return out


def _family_lines(sc: Scaffold) -> list[str]:
    """The family's name, match and containers."""
    out = [
        "schema_version: 1",
        f"family: {sc.family}",
        f"doc: {yaml_scalar(f'{sc.model_class} checkpoints (model_type {sc.model_type}).')}",
        "match:",
        f"  model_types: [{yaml_scalar(sc.model_type)}]",
        f"  classes: [{sc.model_class}]",
    ]
    out += _comment(f"verified: {sc.container_evidence}.")
    out.append("rename:")
    for key, value in sc.containers.items():
        out.append(f"  {key}: {yaml_scalar(value)}")
    return out


def _address_lines(sc: Scaffold) -> list[str]:
    """The verified rows, then each undecided place as commented-out choices."""
    out: list[str] = []
    rows = [x for x in sc.verdicts.values() if x.status == "verified" and x.fields]
    undecided = sc.undecided
    if rows:
        out.append("addresses:")
    elif undecided:
        out.append("# addresses:  (uncomment it with the first choice you uncomment below)")
    for x in rows:
        out += _comment(f"verified: {x.evidence}", "  ")
        out += _row_lines(x.place, x.fields)
    for x in undecided:
        out += _decide_lines(x)
    return out


def _decide_lines(x: Verdict) -> list[str]:
    """One undecided place: what passed, its choices, or how to name or refuse it."""
    if x.status == "ambiguous":
        head = f"DECIDE {x.place}: {len(x.choices)} candidates pass ({x.evidence}); uncomment one."
    else:
        head = f"DECIDE {x.place}: no candidate passes ({x.evidence})."
    out = _comment(head, "  ")
    for choice in x.choices:
        out += ["  # " + line for line in _row_lines(x.place, _choice_fields(x, choice), "")]
    if x.status == "missing":
        out += _comment("Name its module, or refuse the place with a reason:", "  ")
        out += [
            f"  # {x.place}:",
            "  #   module: <module path relative to the layer>",
            f"  # {x.place}:",
            "  #   unavailable:",
            "  #     - when: always",
            "  #       reason: >-",
            "  #         {place} does not exist on this model: <why>.",
        ]
    return out


def add_rule(path: Path, structure: str, model_type: str, spec: str) -> None:
    """Append a rule to the rules of a block_structures.yaml, keeping its text."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "rules:"), None)
    if start is None:
        raise ScaffoldError(f"{path} has no top-level `rules:`; add the rule by hand")
    end = len(lines)
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line[0].isspace() and not line.startswith(("#", "-")):
            end = i
            break
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if end and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    new = [line + "\n" for line in rule_text(structure, model_type, spec)]
    path.write_text("".join(lines[:end] + new + lines[end:]), encoding="utf-8")


@dataclass
class Written:
    family_file: Path | None
    rule_file: Path | None
    text: str


def _target(registry_dir: Path | None, out: Path | None) -> Path | None:
    """The registry the command adds to (None: --out alone touches no registry)."""
    from causalab_mini.codegen.lint import default_registry

    if out is not None and registry_dir is None:
        return None
    return registry_dir or default_registry()


def preflight(
    family: str,
    model_type: str,
    *,
    registry_dir: Path | None,
    out: Path | None,
    force: bool,
) -> Path | None:
    """Where the family file goes, refusing before any model is built: an existing
    file, or another family of the registry for the same model type."""
    from causalab_mini.codegen.lint import lint

    if out is not None and str(out) == "-":
        return None
    registry = _target(registry_dir, out)
    path = out if out is not None else (registry or Path()) / "families" / f"{family}.yaml"
    if path.exists() and not force:
        raise ScaffoldError(f"{path} exists; pass --force to overwrite it, or --out PATH")
    if registry is not None and not force:
        parsed, _ = lint(registry)
        clash = [
            f.name
            for f in parsed.families
            if model_type in f.match.model_types and f.name != family
        ]
        if clash:
            raise ScaffoldError(
                f"the registry already has famil{'ies' if len(clash) > 1 else 'y'} "
                f"{', '.join(clash)} for model type {model_type!r}; pass --force to add "
                "another, or --out PATH to compare"
            )
    return path


def write_scaffold(
    sc: Scaffold, *, registry_dir: Path | None, out: Path | None, force: bool
) -> Written:
    """Write the family file (and, into a registry, the verified structure's rule)."""
    from causalab_mini.codegen.lint import lint

    path = preflight(sc.family, sc.model_type, registry_dir=registry_dir, out=out, force=force)
    if path is None:
        return Written(None, None, render_family(sc))
    registry = _target(registry_dir, out)
    rule_file = None
    if registry is not None and sc.structure is not None and sc.existing_rule is None:
        parsed, _ = lint(registry)
        if not any(sc.model_type in r.match.model_types for r in parsed.rules):
            rule_file = registry / "block_structures.yaml"
    text = render_family(sc, rule_written=rule_file is not None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if rule_file is not None:
        assert sc.structure is not None
        add_rule(rule_file, sc.structure, sc.model_type, sc.spec)
    return Written(path, rule_file, text)
