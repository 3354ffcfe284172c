"""Every place of the chosen structure: its verdict from the identities, or from its
relation to another place."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from causalab_mini.address import Address
from causalab_mini.generated import (
    BLOCK_STRUCTURES,
    STRUCTURAL_ADDRESSES,
)
from causalab_mini.tools.certify import difference, parse_identity
from causalab_mini.tools.scaffold.capture import walk_layer
from causalab_mini.tools.scaffold.data import ROWS, Candidate, StructureTrial, Verdict
from causalab_mini.tools.scaffold.search import Search, layers_text

ACTIVATION_NAME = re.compile(r"act|gelu|silu|relu|swish|xielu|glu|tanh|sigmoid|mish", re.I)


def _canonical(model: Any, path: str) -> str | None:
    """The walk's spelling of a module path the runtime resolves (nnsight answers to a
    module's own name and its alias: DBRX's self_attn.attn is self_attn.self_attn)."""
    from causalab_mini.internals import child

    envoy = child(model.layers[0], path)
    if envoy is None:
        return None
    target = envoy._module
    walked: str  # walk_layer yields (standardized path, torch module)
    for walked, module in walk_layer(model.layers[0]):
        if module is target:
            return walked
    return None


def _table_resolution(model: Any, search: Search, place: str, structure: str) -> Candidate | None:
    """The candidate the runtime picks from structural.yaml (the one that exists)."""
    entry = STRUCTURAL_ADDRESSES.get(place, {}).get(structure)
    if entry is None or entry.reason is not None:
        return None
    found = [p for p in (_canonical(model, c) for c in entry.candidates) if p is not None]
    if len(found) != 1:
        return None
    return search.cand(found[0], ROWS[place].io.value)


def _default_candidate(model: Any, search: Search, place: str, structure: str) -> Candidate | None:
    row = ROWS[place]
    if row.is_structural:
        return _table_resolution(model, search, place, structure)
    return search.cand(row.module, row.io.value)


def _skip_layers(model: Any, place: str) -> set[int]:
    """Layers where the default row refuses the place by layer kind (MoE layers)."""
    out: set[int] = set()
    for item in ROWS[place].unavailable:
        if item.when.kind == "layer_kind" and item.when.layer_kind:
            for layer in range(len(model.layers)):
                if model.internals.layer_kind_matches(item.when.layer_kind, layer):
                    out.add(layer)
    return out


def _outermost(cands: list[Candidate], same: Any) -> Candidate | None:
    """Of candidates that hold one tensor, the module every other one is inside."""
    for outer in cands:
        if outer.scale or outer.io != "output":
            continue
        if all(
            c == outer
            or (c.module.startswith(outer.module + ".") and c.scale is None and same(c, outer))
            for c in cands
        ):
            return outer
    return None


def _pick(
    place: str,
    passing: list[Candidate],
    default: Candidate | None,
    evidence: str,
    row: Address,
    same: Any = None,
    check: str = "",
) -> Verdict:
    """default if the runtime's own resolution passes; the one candidate that passes;
    or several / none, for a person to decide."""
    verdict = _pick_inner(place, passing, default, evidence, row, same)
    verdict.check = check
    return verdict


def _pick_inner(
    place: str,
    passing: list[Candidate],
    default: Candidate | None,
    evidence: str,
    row: Address,
    same: Any,
) -> Verdict:
    unique = list(dict.fromkeys(passing))
    if default is not None and default in unique:
        fields = default.row_fields(row) if not row.is_structural else {}
        if default.snapshot and not row.snapshot:
            fields = {"snapshot": True}
            return Verdict(
                place,
                "verified",
                f"{evidence}; the forward modifies {default.module}'s output in place after "
                "it returns, so a read copies it (snapshot)",
                default,
                fields=fields,
            )
        return Verdict(place, "default", evidence, default)
    outer = _outermost(unique, same) if same is not None else None
    if outer is not None and len(unique) > 1:
        inner = ", ".join(c.describe() for c in unique if c != outer)
        evidence += f"; {inner} hold{'s' if len(unique) == 2 else ''} the same tensor inside it"
        unique = [outer]
    if len(unique) == 1:
        return Verdict(place, "verified", evidence, unique[0], fields=unique[0].row_fields(row))
    if unique:
        return Verdict(place, "ambiguous", evidence, choices=unique)
    return Verdict(place, "missing", evidence)


def place_verdicts(
    model: Any, search: Search, structure: str, trial: StructureTrial
) -> dict[str, Verdict]:
    """Every per-layer place of the default rows, for ``structure``."""
    out: dict[str, Verdict] = {}
    span = layers_text(search.cap.num_layers)
    solutions = trial.solutions
    for text in BLOCK_STRUCTURES[structure].identities:
        left, right = parse_identity(text)
        for place in (left, *right):
            if place in out:
                continue
            passing = [s[place] for s in solutions]
            row = ROWS[place]
            default = _default_candidate(model, search, place, structure)
            where = sorted({c.describe() for c in passing})
            out[place] = _pick(
                place,
                passing,
                default,
                f"{text} on {span} ({', '.join(where)})",
                row,
                search.same,
                text,
            )
    chosen = {p: v.chosen for p, v in out.items() if v.chosen is not None}
    for place in RELATIONS:
        out[place] = _relation(model, search, structure, place, chosen)
    return out


@dataclass(frozen=True)
class Relation:
    """How a place no identity names is checked, against another place.

    ``equals``: the place's tensor is ``other``'s (the attention reads its norm's
    output). ``returns``: the place is the input of a module inside ``within`` that
    returns ``within``'s output, or ``other`` (the sublayer's contribution).
    ``feeds``: the module ``other`` reads (the down projection) reads the place, alone
    or times another branch of ``within`` (a gated MLP)."""

    check: str  # equals | returns | feeds: the key of CHECKS
    other: str  # the place it is checked against
    within: str = ""  # the sublayer (standardized name) whose modules may hold it
    what: str = ""  # the relation in words, for the evidence


# Places no identity names, each with the relation to another place that checks it.
# These are facts of what each place *is* (its definition, the same on every model:
# the attention reads attentions_norm_output), not facts of a model, so they are a
# table of the tool and not registry rows; a place added here needs a check in CHECKS.
RELATIONS: dict[str, Relation] = {
    "attentions_norm_output": Relation("equals", "attentions_input", what="the attention reads it"),
    "attentions_premix": Relation("returns", "attentions_output", "self_attn", "the attention's"),
    "mlps_neurons": Relation("returns", "mlps_output", "mlp", "the MLP's"),
    "mlps_activation": Relation("feeds", "mlps_neurons", "mlp"),
}


@dataclass(frozen=True)
class _Span:
    """The layers a relation is checked on (those its row does not refuse)."""

    search: Search
    layers: list[int]
    text: str

    def same(self, a: Candidate, b: Candidate) -> bool:
        ok: bool = self.search.holds(a, [b], self.layers)[0]
        return ok

    def under(self, prefix: str, io: str, *, params: bool | None = None) -> list[Candidate]:
        """The modules below ``prefix`` with a tensor on side ``io`` on every layer
        (``params``: only those with, or without, parameters of their own)."""
        cap = self.search.cap
        out = []
        for path in cap.paths[self.layers[0]] if self.layers else ():
            if not path.startswith(prefix + "."):
                continue
            if params is not None and cap.params.get(path, False) != params:
                continue
            if all(
                (path, i) in (cap.inputs if io == "input" else cap.outputs) for i in self.layers
            ):
                out.append(self.search.cand(path, io))
        return out


@dataclass(frozen=True)
class _Found:
    """What a relation's check found: the passing candidates, evidence, the check."""

    passing: list[Candidate]
    evidence: str
    check: str


@dataclass(frozen=True)
class _Ask:
    """One relation to check: the place, its relation and where."""

    model: Any
    structure: str
    place: str
    relation: Relation
    span: _Span
    chosen: dict[str, Candidate]
    default: Candidate | None


def _relation(
    model: Any,
    search: Search,
    structure: str,
    place: str,
    chosen: dict[str, Candidate],
) -> Verdict:
    """The verdict of a place no identity names, from its relation (RELATIONS)."""
    entry = STRUCTURAL_ADDRESSES.get(place, {}).get(structure)
    if entry is not None and entry.reason is not None:
        return Verdict(place, "refused", entry.reason.replace("{place}", place))
    skip = _skip_layers(model, place)
    layers = [i for i in search.layers() if i not in skip]
    if not layers:
        reason = model.internals[place].unavailable_on(0) if place in model.internals else None
        return Verdict(place, "refused", reason or "refused on every layer by its row")
    span = _Span(search, layers, layers_text(len(layers)) if not skip else f"layers {layers}")
    default = _table_resolution(model, search, place, structure)
    relation = RELATIONS[place]
    ask = _Ask(model, structure, place, relation, span, chosen, default)
    found = CHECKS[relation.check](ask)
    if isinstance(found, Verdict):
        return found
    verdict = _pick(
        place, found.passing, default, found.evidence, ROWS[place], span.same, found.check
    )
    if verdict.status == "missing" and default is not None:
        # the runtime would read the structural table's module, which failed the check:
        # a person decides (keep it, name another module, or refuse the place)
        verdict.evidence = (
            f"structural.yaml resolves it to {default.module}, which fails {found.check}, "
            f"and no other module passes ({found.evidence}); with no row the runtime reads "
            f"{default.describe()}"
        )
    return verdict


def _equals(ask: _Ask) -> _Found:
    """The modules whose tensor is the other place's."""
    place, rel, span = ask.place, ask.relation, ask.span
    target = _default_candidate(ask.model, span.search, rel.other, ask.structure)
    io = ROWS[place].io.value
    passing = [
        c for c in span.search.stream_shaped(io) if target is not None and span.same(c, target)
    ]
    return _Found(
        passing,
        f"{place} == {rel.other} ({rel.what}) on {span.text}",
        f"{place} == {rel.other}",
    )


def _returns(ask: _Ask) -> _Found:
    """The modules inside the sublayer, with weights, whose input is the place and
    whose output is the sublayer's output or its contribution."""
    place, rel, span = ask.place, ask.relation, ask.span
    search = span.search
    contribution = ask.chosen.get(rel.other)
    targets = [search.cand(rel.within, "output")]
    if contribution is not None:
        targets.append(dataclasses.replace(contribution, scale=None))
    passing = []
    for c in span.under(rel.within, ROWS[place].io.value, params=True):
        out_side = search.cand(c.module, "output")
        if any(span.same(out_side, t) for t in targets):
            passing.append(c)
    return _Found(
        passing,
        f"the module whose input is {place} returns {rel.what} output (or its "
        f"contribution) on {span.text}",
        f"its module returns {rel.what} output",
    )


def _feeds(ask: _Ask) -> _Found | Verdict:
    """The modules inside the sublayer whose tensor the other place's module (the down
    projection) reads: alone, or times another branch (gated: an activation times a
    gate)."""
    place, rel, span, default = ask.place, ask.relation, ask.span, ask.default
    search = span.search
    down = _relation(ask.model, search, ask.structure, rel.other, ask.chosen).chosen
    if down is None:
        return Verdict(
            place,
            "unchecked" if default else "missing",
            "no down projection was verified, so nothing checks the activation"
            + (f"; structural.yaml resolves it to {default.module}" if default else ""),
            default,
        )
    branches = span.under(rel.within, ROWS[place].io.value)
    passing = [c for c in branches if _feeds_down(search, span, down, c, branches)]
    return _Found(
        passing,
        f"{rel.other} ({down.module}.{ROWS[rel.other].io.value}) == {place}, or {place} "
        f"times another branch of the MLP (a gated MLP), on {span.text}",
        f"{rel.other} == {place} (x gate)",
    )


def _feeds_down(
    search: Search, span: _Span, down: Candidate, c: Candidate, branches: list[Candidate]
) -> bool:
    """Whether ``down`` reads ``c``, alone or times another of the ``branches``."""
    cap = search.cap
    # an activation function: no weights of its own (xIELU has a few, and says
    # so in its name), and not a norm or a dropout that happens to sit there
    kind = cap.kinds.get(c.module, "")
    if c.module == down.module or re.search(r"norm|dropout|linear", kind, re.I):
        return False
    if cap.params.get(c.module) and not ACTIVATION_NAME.search(kind):
        return False
    if span.same(down, c):
        return True
    return any(
        other.module not in (c.module, down.module) and _gated(search, down, c, other, span.layers)
        for other in branches
    )


# How each kind of relation is checked (Relation.check).
CHECKS: dict[str, Callable[[_Ask], _Found | Verdict]] = {
    "equals": _equals,
    "returns": _returns,
    "feeds": _feeds,
}


def _gated(
    search: Search, down: Candidate, act: Candidate, other: Candidate, layers: list[int]
) -> bool:
    for layer in layers:
        want = search.value(down, layer)
        a, b = search.value(act, layer), search.value(other, layer)
        if want is None or a is None or b is None or a.shape != b.shape or a.shape != want.shape:
            return False
        if not difference(want, a * b)[0]:
            return False
    return True
