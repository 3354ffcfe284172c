"""The scaffold's data: the rows a place may have, candidates, verdicts, the result,
the error it raises, and the one-line reason an exception gives."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from causalab_mini.address import Address
from causalab_mini.errors import CausalabError
from causalab_mini.generated import (
    DEFAULT_ADDRESSES,
    STRUCTURE_ADDRESSES,
)

# Every row a place may have: the default rows and the rows structures declare (a
# structure's identities name its own rows), in forward order; the row of a place.
ROWS: dict[str, Address] = dict(
    sorted(
        {
            **DEFAULT_ADDRESSES,
            **{name: row for rows in STRUCTURE_ADDRESSES.values() for name, row in rows.items()},
        }.items(),
        key=lambda item: (
            (1, item[1].order)
            if item[1].per_layer
            else (0 if item[1].order < 0 else 2, item[1].order)
        ),
    )
)

# The sublayers' contributions to the stream, each with the module whose output it is
# unless a structure says otherwise.
CONTRIBUTIONS = {"attentions_output": "self_attn", "mlps_output": "mlp"}


class ScaffoldError(CausalabError):  # type: ignore[misc]  # Any to mypy
    """The model cannot be scaffolded (not loadable, no layer list); says why."""


@dataclass(frozen=True)
class Candidate:
    """One way to read a place: a module (standardized path relative to the layer),
    a side, and what the tensor there is multiplied by."""

    module: str
    io: str  # input | output
    scale: str | None = None
    tuple_output: bool = False
    snapshot: bool = False

    def describe(self) -> str:
        text = f"{self.module or 'layer'}.{self.io}"
        if self.scale:
            text += f" * {self.scale}"
        return text

    def row_fields(self, default: Address) -> dict[str, Any]:
        """The family-file fields that make the default row read this candidate."""
        out: dict[str, Any] = {}
        if default.module != self.module:
            out["module"] = self.module
        if default.io.value != self.io:
            out["io"] = self.io
        if default.select is not None and not self.tuple_output and default.module != self.module:
            out["select"] = None
        if self.scale and default.scale != self.scale:
            out["scale"] = self.scale
        if self.snapshot and not default.snapshot:
            out["snapshot"] = True
        return out


@dataclass
class Verdict:
    """What the scaffold found for one place."""

    place: str
    status: str  # default | verified | ambiguous | missing | refused | unchecked
    evidence: str
    chosen: Candidate | None = None
    choices: list[Candidate] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # row fields to write (verified)
    check: str = ""  # the check that decided it, in a few words

    def to_json(self) -> dict[str, Any]:
        return {
            "place": self.place,
            "status": self.status,
            "check": self.check,
            "evidence": self.evidence,
            "chosen": self.chosen.describe() if self.chosen else None,
            "choices": [c.describe() for c in self.choices],
            "row": self.fields or None,
        }


@dataclass
class StructureTrial:
    name: str
    passed: bool
    evidence: str
    solutions: list[dict[str, Candidate]] = field(default_factory=list)
    verified_places: set[str] = field(default_factory=set)
    ruled_out: str | None = None


@dataclass
class Scaffold:
    """Everything ``registry new-family`` found, ready to render."""

    spec: str
    model_type: str
    model_class: str
    family: str
    num_layers: int
    containers: dict[str, str | bool]
    container_evidence: str
    structure: str | None
    structure_evidence: str
    trials: list[StructureTrial]
    verdicts: dict[str, Verdict]
    checks: list[str]  # the certify checks that proved the rows, as text
    failures: list[str]
    existing_rule: str | None
    structural_flags: list[str]
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> dict[str, dict[str, Any]]:
        return {
            name: v.fields
            for name, v in self.verdicts.items()
            if v.status == "verified" and v.fields
        }

    @property
    def undecided(self) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.status in ("ambiguous", "missing")]

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "model_type": self.model_type,
            "model_class": self.model_class,
            "family": self.family,
            "layers": self.num_layers,
            "containers": self.containers,
            "container_evidence": self.container_evidence,
            "block_structure": self.structure,
            "structure_evidence": self.structure_evidence,
            "existing_rule": self.existing_rule,
            "structures": [
                {
                    "name": t.name,
                    "passed": t.passed,
                    "ruled_out": t.ruled_out,
                    "evidence": t.evidence,
                }
                for t in self.trials
            ],
            "places": [v.to_json() for v in self.verdicts.values()],
            "checks": self.checks,
            "failures": self.failures,
            "notes": self.notes,
            "versions": self.versions,
        }


def first_reason(exc: BaseException) -> str:
    """The most specific message in an exception chain, on one line."""
    from causalab_mini.ops import OperationNotFound

    # nnsight re-raises an error inside a trace as text holding the traceback
    found = re.search(
        r"OperationNotFound: (.*?)(?: Fix the row's needle| Its operations are:|$)", str(exc), re.S
    )
    if found:
        return " ".join(found.group(1).split())[:300]
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OperationNotFound):
            text = re.split(r" Fix the row's needle| Its operations are:", str(seen))[0]
            return " ".join(text.split())[:300]
        seen = seen.__cause__ or seen.__context__
    raised: list[str] = re.findall(  # one group: each match is its text
        r"^[\w.]*(?:Error|Exception|Unavailable|NotFound|Refused): (.+)$", str(exc), re.M
    )
    if raised:
        return raised[-1].strip()[:300]
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]
