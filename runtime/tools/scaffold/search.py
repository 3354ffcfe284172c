"""Solving each block structure's identities over the candidates of a capture, and
deciding the one structure."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from itertools import product
from typing import Any

from causalab_mini.generated import (
    BLOCK_STRUCTURES,
    STRUCTURAL_ADDRESSES,
)
from causalab_mini.tools.certify import difference, parse_identity
from causalab_mini.tools.scaffold.capture import Capture
from causalab_mini.tools.scaffold.data import CONTRIBUTIONS, ROWS, Candidate, StructureTrial

# Config attributes that may scale a sublayer's contribution (Granite's
# residual_multiplier); other floats (eps, dropout, rope theta) are never tried.
SCALE_NAME = re.compile(r"multiplier|scale|scaling|factor|coef|alpha", re.IGNORECASE)
NOT_SCALE = re.compile(r"rope|eps|init|dropout|theta|router|aux|z_loss|temperature", re.I)


def scale_candidates(config: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in sorted(config.to_dict().items()):
        if (
            isinstance(value, float)
            and not isinstance(value, bool)
            and value not in (0.0, 1.0)
            and SCALE_NAME.search(key)
            and not NOT_SCALE.search(key)
        ):
            out[key] = value
    return out


class Search:
    """Solves a structure's identities over the candidates of one capture."""

    def __init__(self, cap: Capture, scales: dict[str, float]) -> None:
        self.cap = cap
        self.scales = scales
        ref = cap.inputs.get(("", 0))
        self.shape = tuple(ref.shape) if ref is not None else None

    def layers(self) -> range:
        return range(self.cap.num_layers)

    def cand(self, module: str, io: str, scale: str | None = None) -> Candidate:
        outputs = io == "output"
        return Candidate(
            module=module,
            io=io,
            scale=scale,
            tuple_output=outputs and any((module, i) in self.cap.tuple_out for i in self.layers()),
            snapshot=outputs and any((module, i) in self.cap.inplace for i in self.layers()),
        )

    def stream_shaped(self, io: str, under: str | None = None) -> list[Candidate]:
        """Every module (not the layer) whose tensor on side ``io`` has the stream's
        shape on every layer; ``under``: only modules below that path."""
        store = self.cap.inputs if io == "input" else self.cap.outputs
        out = []
        for path in self.cap.paths[0]:
            if not path or (under is not None and not path.startswith(under + ".")):
                continue
            if all(
                (path, i) in store and tuple(store[(path, i)].shape) == self.shape
                for i in self.layers()
            ):
                out.append(self.cand(path, io))
        return out

    def value(self, cand: Candidate, layer: int) -> Any | None:
        return self.cap.value(cand, layer, self.scales)

    def holds(
        self, left: Candidate, right: list[Candidate], layers: Iterable[int] | None = None
    ) -> tuple[bool, float]:
        worst = 0.0
        for layer in self.layers() if layers is None else layers:
            got = self.value(left, layer)
            parts = [self.value(c, layer) for c in right]
            if got is None or any(p is None for p in parts):
                return False, float("inf")
            total: Any = parts[0]  # a tensor: none of the parts is None (checked above)
            for p in parts[1:]:
                total = total + p
            ok, err = difference(got, total)
            worst = max(worst, err)
            if not ok:
                return False, err
        return True, worst

    def contributions(self, place: str, structure: str) -> list[Candidate]:
        """Where ``place`` (a sublayer's contribution) may be read on ``structure``.

        A structure that lists the place in ``requires_rows`` says the default row
        names another tensor there (a post-norm follows the module): every candidate
        whose tensor differs from the module's own output. On a residual-inside block
        any candidate. Otherwise the module's own output is the contribution, perhaps
        times a config multiplier (Granite) or read as a copy (Falcon)."""
        module = CONTRIBUTIONS[place]
        default = self.cand(module, "output")
        scaled = [dataclasses.replace(default, scale=s) for s in self.scales]
        others = [c for c in self.stream_shaped("output") if c.module != module]
        others += [dataclasses.replace(c, scale=s) for c in others for s in self.scales]
        if place in BLOCK_STRUCTURES[structure].requires_rows:
            return [c for c in others if not self.same(dataclasses.replace(c, scale=None), default)]
        if BLOCK_STRUCTURES[structure].residual_inside:
            # the sublayer modules add the residual themselves: the contribution is
            # read inside them, never at their output
            return [default, *scaled, *others]
        return [default, *scaled]

    def same(self, a: Candidate, b: Candidate) -> bool:
        """Whether two candidates hold the same tensor on every layer."""
        return self.holds(a, [b])[0]

    def candidates(
        self, place: str, structure: str
    ) -> tuple[list[Candidate], list[Candidate], str | None]:
        """(the structural table's existing candidates, the others to try, the reason
        the structure has no such place)."""
        row = ROWS[place]
        if place in CONTRIBUTIONS:
            return [], self.contributions(place, structure), None
        if not row.is_structural:
            return [self.cand(row.module, row.io.value)], [], None
        entry = STRUCTURAL_ADDRESSES.get(place, {}).get(structure)
        if entry is None:
            return [], [], f"structural.yaml has no entry for {place} on {structure}"
        if entry.reason is not None:
            return [], [], entry.reason.replace("{place}", place)
        table = [self.cand(c, row.io.value) for c in entry.candidates if self.cap.exists(c)]
        searched = [c for c in self.stream_shaped(row.io.value) if c.module not in entry.candidates]
        return table, searched, None


def layers_text(n: int) -> str:
    return "layer 0" if n == 1 else f"layers 0-{n - 1}"


def try_structure(search: Search, structure: str) -> StructureTrial:
    """Solve ``structure``'s identities: every assignment of candidates to the places
    they name that makes all of them hold on every layer."""
    identities = BLOCK_STRUCTURES[structure].identities
    if not identities:
        # nothing to solve, so nothing verified (mixer_only): a rule in
        # block_structures.yaml assigns such a structure, read off the model's code
        return StructureTrial(
            structure, False, "it states no identity, so no capture can verify it"
        )
    options: dict[str, list[Candidate]] = {}
    for text in identities:
        left, right = parse_identity(text)
        for place in (left, *right):
            if place in options:
                continue
            table, searched, reason = search.candidates(place, structure)
            if reason is not None:
                return StructureTrial(structure, False, f"{text}: {reason}")
            options[place] = table + searched
            if not options[place]:
                return StructureTrial(
                    structure, False, f"{text}: no module of the layer can be {place}"
                )
    solutions: list[dict[str, Candidate]] = [{}]
    errors: dict[str, float] = {}
    for text in identities:
        left, right = parse_identity(text)
        names = [left, *right]
        survivors: list[dict[str, Candidate]] = []
        best = float("inf")
        for partial in solutions:
            free = [n for n in names if n not in partial]
            for combo in product(*(options[n] for n in free)):
                assignment = {**partial, **dict(zip(free, combo, strict=True))}
                ok, err = search.holds(assignment[left], [assignment[r] for r in right])
                best = min(best, err)
                if ok:
                    survivors.append(assignment)
                    errors[text] = max(errors.get(text, 0.0), err)
        if not survivors:
            return StructureTrial(
                structure,
                False,
                f"{text} holds for no candidate (closest: max error {best:.3g})",
            )
        solutions = survivors
    places = {p for text in identities for p in (parse_identity(text)[0], *parse_identity(text)[1])}
    evidence = "; ".join(f"{text} (max error {errors.get(text, 0.0):.1e})" for text in identities)
    return StructureTrial(
        structure,
        True,
        f"{evidence}, on {layers_text(search.cap.num_layers)}",
        solutions=solutions,
        verified_places=places,
    )


def _module_output_is_stream(search: Search, trial: StructureTrial) -> list[str]:
    """Which sublayer modules return the stream itself (the residual added inside):
    the attention module's own output is layers_mid, or the MLP's is layers_output."""
    if not trial.solutions:
        return []
    solution = trial.solutions[0]
    streams = {"self_attn": solution.get("layers_mid"), "mlp": search.cand("", "output")}
    return [
        module
        for module, stream in streams.items()
        if stream is not None and search.same(search.cand(module, "output"), stream)
    ]


def decide_structure(
    search: Search,
    trials: list[StructureTrial],
    layer_has: Callable[[str], bool] | None = None,
) -> tuple[str | None, str]:
    """The one structure that passes and is not contradicted, or None with why.
    ``layer_has(path)``: whether the layer holds that attribute (a structure's
    output_scale weight); a structure whose weight the layer lacks is ruled out, and
    where the layer has it, so is one stating the same identities without it."""
    passed = [t for t in trials if t.passed]
    if layer_has is not None:
        _rule_out_by_scale(passed, layer_has)
    _rule_out_by_refusal(passed, _verified_somewhere(passed))
    _rule_out_by_residual(search, passed)
    _rule_out_by_subset(passed)
    left = [t for t in passed if not t.ruled_out]
    if len(left) == 1:
        return left[0].name, left[0].evidence
    if not left:
        return None, "no known structure's identities hold on this block"
    return None, f"several structures pass and none is ruled out: {', '.join(t.name for t in left)}"


def _rule_out_by_scale(passed: list[StructureTrial], layer_has: Callable[[str], bool]) -> None:
    """A structure whose output_scale weight the layer lacks; where the layer has it,
    one stating the same identities without it."""
    for t in passed:
        scale = BLOCK_STRUCTURES[t.name].output_scale
        if scale is not None and not layer_has(scale):
            t.ruled_out = f"its blocks multiply their output by {scale}, which this layer lacks"
    for t in passed:
        mine = BLOCK_STRUCTURES[t.name]
        for other in passed:
            theirs = BLOCK_STRUCTURES[other.name]
            if (
                not t.ruled_out
                and not other.ruled_out
                and mine.output_scale is None
                and theirs.output_scale is not None
                and set(mine.identities) == set(theirs.identities)
            ):
                t.ruled_out = (
                    f"the layer multiplies its output by {theirs.output_scale} ({other.name})"
                )


def _verified_somewhere(passed: list[StructureTrial]) -> dict[str, str]:
    """place -> the identity (and where) that verified it, on any passing structure."""
    found: dict[str, str] = {}
    for t in passed:
        solution = t.solutions[0]
        for text in BLOCK_STRUCTURES[t.name].identities:
            left, right = parse_identity(text)
            for place in (left, *right):
                if place in solution:
                    found.setdefault(
                        place, f"{text} holds with {place} at {solution[place].describe()}"
                    )
    return found


def _rule_out_by_refusal(passed: list[StructureTrial], found: dict[str, str]) -> None:
    """A structure that refuses a place another passing structure verified."""
    for t in passed:
        for place, entries in STRUCTURAL_ADDRESSES.items():
            entry = entries.get(t.name)
            if entry is not None and entry.reason is not None and place in found:
                t.ruled_out = f"it has no {place}, yet {found[place]}"
                break


def _rule_out_by_residual(search: Search, passed: list[StructureTrial]) -> None:
    """A structure that disagrees with whether a sublayer module returns the stream."""
    for t in passed:
        if t.ruled_out:
            continue
        inside = _module_output_is_stream(search, t)
        residual_inside = BLOCK_STRUCTURES[t.name].residual_inside
        if residual_inside and not inside:
            t.ruled_out = "neither sublayer module returns the stream itself"
        elif not residual_inside and inside:
            t.ruled_out = (
                f"{' and '.join(inside)} return{'s' if len(inside) == 1 else ''} the stream "
                "itself (the residual is added inside the module)"
            )


def _rule_out_by_subset(passed: list[StructureTrial]) -> None:
    """A structure whose identities are a strict part of another passing structure's
    says less about the block: the one that states (and passes) more is the block."""
    for t in passed:
        if t.ruled_out:
            continue
        mine = set(BLOCK_STRUCTURES[t.name].identities)
        for other in passed:
            theirs = set(BLOCK_STRUCTURES[other.name].identities)
            if not other.ruled_out and mine < theirs:
                t.ruled_out = f"{other.name} states all of its identities and more, and they hold"
                break
