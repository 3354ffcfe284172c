"""The attention probabilities, tried against transformers' output_attentions."""

from __future__ import annotations

import dataclasses
from typing import Any

from causalab_mini.address import Address
from causalab_mini.generated import (
    DEFAULT_ADDRESSES,
    FAMILY_ADDRESSES,
)
from causalab_mini.tools.scaffold.data import Candidate, Verdict, first_reason


def probability_rows() -> list[Address]:
    """The default attention_probabilities row, then every family's, once each."""
    rows = [DEFAULT_ADDRESSES["attention_probabilities"]]
    for _, family_rows in FAMILY_ADDRESSES:
        row = family_rows.get("attention_probabilities")
        if row is not None and all((row.module, row.source) != (r.module, r.source) for r in rows):
            rows.append(row)
    return rows


def probability_candidates(model: Any, rows: dict[str, Address]) -> Verdict:
    """Try each known way to the probabilities against output_attentions, on one
    model loaded with eager attention (the runtime reads the row; nnterp's own
    load-time check runs later, on the chosen row)."""
    from causalab_mini.internals import Internals
    from causalab_mini.tools.certify import attention_oracle, sample_inputs

    inputs = sample_inputs(model)
    passing: list[Address] = []
    failures: list[str] = []
    default = DEFAULT_ADDRESSES["attention_probabilities"]
    for row in probability_rows():
        described = ".".join([row.module, *row.source])
        enabled = dataclasses.replace(
            row,
            unavailable=tuple(
                u for u in row.unavailable if u.when.kind != "attention_probs_disabled"
            ),
        )
        model.internals = Internals(model, {**rows, "attention_probabilities": enabled})
        try:
            checks = attention_oracle(model, inputs)
        except Exception as exc:
            failures.append(f"{described}: {first_reason(exc)}")
            continue
        if checks and all(c.ok for c in checks):
            passing.append(row)
            if row == default:
                break  # the default row holds; the others need not be tried
        elif checks:
            worst = max(c.max_error for c in checks)
            failures.append(f"{described}: output_attentions differs (max error {worst:.3g})")
        else:
            reason = model.internals.status().get("attention_probabilities")
            failures.append(f"{described}: {reason}")
    return _probability_verdict(passing, failures)


def _probability_verdict(passing: list[Address], failures: list[str]) -> Verdict:
    """default if the default row holds; verified if one other row does; else
    ambiguous or missing, with every row's failure."""
    default = DEFAULT_ADDRESSES["attention_probabilities"]
    place = "attention_probabilities"
    if passing and passing[0] == default:
        return Verdict(
            place,
            "default",
            "output_attentions == attention_probabilities on every layer (eager)",
            Candidate(default.module, "output"),
            check="output_attentions == attention_probabilities",
        )
    if len(passing) == 1:
        row = passing[0]
        fields: dict[str, Any] = {"source": list(row.source)}
        if row.module != default.module:
            fields["module"] = row.module
        return Verdict(
            place,
            "verified",
            "output_attentions == attention_probabilities on every layer (eager); the "
            f"default row does not reach them ({failures[0] if failures else ''})",
            Candidate(row.module, "output"),
            fields=fields,
            check="output_attentions == attention_probabilities",
        )
    if passing:
        return Verdict(
            place,
            "ambiguous",
            "several needle sets match output_attentions",
            choices=[Candidate(".".join([r.module, *r.source]), "output") for r in passing],
        )
    return Verdict(
        place,
        "missing",
        "no known needle set reaches the probabilities: " + "; ".join(failures),
    )
