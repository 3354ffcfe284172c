"""The checks of writes: a write at the stream between the sublayers reaches the
block's output through the structure's identity, a write never reaches backwards,
and an in-place edit of a read is the write of the place."""

from __future__ import annotations

from typing import Any

from causalab_mini.generated import BLOCK_STRUCTURES

from .block_identities import (
    evaluate_identity,
    mlp_addend,
    output_scale,
    parse_terms,
    rows_of,
    structure_identities,
)
from .common import CheckResult, compare, read_places, saved_value


def write_reaches_stream(model: Any, inputs: dict[str, Any], layer: int = 0) -> CheckResult | None:
    """Write at the stream between the sublayers and check the block carries the
    written value on: after ``layers_mid[i] = mid + delta``,
    ``layers_output[i] == (mid + delta) + mlps_output[i]`` (on a post_ln block the sum
    before the last norm, ``layers_output_prenorm``). On a parallel block the
    equivalent is ``attentions_output[i] += delta``, which must shift
    ``layers_output[i]`` by exactly delta."""
    import torch

    internals = model.internals
    torch.manual_seed(0)
    found = mlp_addend(model)
    beside = _mid_addend_identity(model, layer) if found is None else None
    if beside is not None:  # another sublayer adds to layers_mid first (cross-attention)
        return _write_through_identity(model, inputs, layer, beside)
    target, addend = found or ("layers_output", "layers_mid")
    # where the MLP adds to another stream than layers_mid (a reversible block), the
    # write reaches the block through the MLP's input: mlps_input == the written value
    via_input = addend != "layers_mid"
    needed = [target, addend, *(["mlps_input"] if via_input else [])]
    if (
        internals["layers_mid"].unavailable_on(layer) is None
        and internals["mlps_output"].unavailable_on(layer) is None
        and all(internals[name].unavailable_on(layer) is None for name in needed)
    ):
        box: dict[str, Any] = {}
        with model.trace(inputs):
            if via_input:
                box["addend"] = internals[addend][layer].clone().save()
            mid = internals["layers_mid"][layer]
            delta = torch.randn_like(mid) * 0.5
            box["written"] = (mid + delta).clone().save()
            internals["layers_mid"][layer] = mid + delta
            if via_input:
                box["read"] = internals["mlps_input"][layer].clone().save()
            box["mlp"] = internals["mlps_output"][layer].save()
            box["out"] = internals[target][layer].save()
        written = saved_value(box["written"])
        scale = output_scale(model, layer) if target == "layers_output" else 1.0
        if not via_input:
            return compare(
                f"{target} == written layers_mid + mlps_output",
                layer,
                saved_value(box["out"]),
                (written + saved_value(box["mlp"])) * scale,
            )
        return compare(
            f"mlps_input == written layers_mid, {target} == {addend} + mlps_output",
            layer,
            torch.cat([saved_value(box["read"]), saved_value(box["out"])], dim=-1),
            torch.cat(
                [written, (saved_value(box["addend"]) + saved_value(box["mlp"])) * scale], dim=-1
            ),
        )
    carried = _stream_write_target(model, layer)
    if carried is not None:
        return _write_through_identity(model, inputs, layer, carried)
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is not None and structure.parallel:
        return _attention_write_shifts(model, inputs, layer, "layers_output")
    return None


def _mid_addend_identity(model: Any, layer: int) -> str | None:
    """The structure's identity ``X == layers_mid + C`` (two plain rows, C not the
    MLP's contribution: the cross-attention's, on an encoder-decoder's decoder block)
    whose rows exist at ``layer``, where the next sublayer to add to layers_mid is not
    the MLP; None otherwise."""
    internals = model.internals
    for text in structure_identities(model):
        left, terms = parse_terms(text)
        rows = [n for t in terms for n in rows_of(t)]
        if len(terms) != 2 or any(t[0] != "row" for t in terms) or "layers_mid" not in rows:
            continue
        if "mlps_output" in rows:
            continue
        if all(internals[r].unavailable_on(layer) is None for r in (left, *rows)):
            return text
    return None


def _attention_write_shifts(
    model: Any, inputs: dict[str, Any], layer: int, observed: str
) -> CheckResult:
    """After ``attentions_output[layer] += 0.25``, ``observed[layer]`` must shift by
    exactly 0.25 against a clean run."""
    internals = model.internals
    box: dict[str, Any] = {}
    with model.trace(inputs):
        box["clean"] = internals[observed][layer].clone().save()
    with model.trace(inputs):
        attn = internals["attentions_output"][layer]
        internals["attentions_output"][layer] = attn + 0.25
        box["out"] = internals[observed][layer].clone().save()
    return compare(
        f"{observed} shifts by the delta written to attentions_output",
        layer,
        saved_value(box["out"]),
        saved_value(box["clean"]) + 0.25,
    )


def _stream_write_target(model: Any, layer: int) -> str | None:
    """An identity of the structure whose right side carries layers_mid on (as a row or
    as the streams a mixing term mixes) and whose rows all exist at ``layer``: where
    no contribution row is one tensor (several residual streams), the write to
    layers_mid is checked through it."""
    internals = model.internals
    for text in structure_identities(model):
        left, terms = parse_terms(text)
        if not any(t[0] in ("row", "@") and t[-1] == "layers_mid" for t in terms):
            continue
        rows = [left, *(n for t in terms for n in rows_of(t) if t[0] != "@" or n != t[1])]
        if all(internals[r].unavailable_on(layer) is None for r in rows):
            return text
    return None


def _write_through_identity(
    model: Any, inputs: dict[str, Any], layer: int, text: str
) -> CheckResult:
    """Write layers_mid + delta at ``layer``, read the identity's other rows after the
    write in the same trace, and hold its left side to the right side evaluated with
    the written layers_mid."""
    import torch

    internals = model.internals
    left, terms = parse_terms(text)
    rows = sorted(
        {n for t in terms for n in rows_of(t) if n != "layers_mid"} | {left},
        key=lambda n: internals.rank(n, layer),
    )
    rows = [r for r in rows if internals[r].unavailable_on(layer) is None]
    torch.manual_seed(0)
    box: dict[str, Any] = {}
    with model.trace(inputs):
        mid = internals["layers_mid"][layer]
        delta = torch.randn_like(mid) * 0.5
        box["layers_mid"] = (mid + delta).clone().save()
        internals["layers_mid"][layer] = mid + delta
        for row in rows:
            if internals.rank(row, layer) > internals.rank("layers_mid", layer):
                box[row] = internals[row][layer].save()
    early = [r for r in rows if r not in box]
    if early:  # rows before layers_mid (none on these blocks): a clean read
        box.update({k[0]: v for k, v in read_places(model, inputs, early).items()})
    values: dict[tuple[str, int | None], Any] = {
        (name, layer): saved_value(v) for name, v in box.items()
    }
    sides = evaluate_identity(model, text, values, layer)
    assert sides is not None
    return compare(f"{text}, with a written layers_mid", layer, sides[0], sides[1])


def attention_write_shifts_mid(model: Any, inputs: dict[str, Any]) -> CheckResult | None:
    """Where the block structure's identities do not name attentions_output (a block
    whose other mixer adds beside attention, as on Falcon-H1), check that it is
    attention's contribution all the same: after ``attentions_output[i] += delta``,
    ``layers_mid[i]`` shifts by exactly delta (through the row's scale, if any). On
    the first layer where both places exist; None where there is none, or where an
    identity already checks the row."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is None or any("attentions_output" in i for i in structure.identities):
        return None
    internals = model.internals
    layers = [
        i
        for i in range(internals.num_layers)
        if internals["attentions_output"].unavailable_on(i) is None
        and internals["layers_mid"].unavailable_on(i) is None
    ]
    if not layers:
        return None
    return _attention_write_shifts(model, inputs, layers[0], "layers_mid")


def write_keeps_earlier_reads(
    model: Any, inputs: dict[str, Any], name: str, layer: int | None
) -> list[CheckResult]:
    """A write must not reach backwards. In one trace: read every available place up
    to and including ``name`` at ``layer`` (in forward order), write there, read the
    same place again and a place after it. Every first read must equal a clean run
    (a saved read keeps the value it had when read, even where the write overwrites
    the tensor the block carries in place), the second read must equal the written
    value, and the later place must change (the write reaches the stream). Returns
    [] where the place or a later one to observe is not available."""
    import torch

    internals = model.internals
    place = internals[name]
    if place.unavailable_on(layer) is not None or place.refuses_writes() is not None:
        return []
    earlier, later = _around(internals, name, layer)
    if later is None:
        return []
    earlier.sort(key=lambda item: item[0])
    clean = read_places(model, inputs, sorted({other for _, other, _ in earlier} | {later[0]}))
    before: list[Any] = []
    box: dict[str, Any] = {}
    with model.trace(inputs):
        for _, other, at in earlier:
            before.append(internals[other].get(at).save())
        current = internals[name].get(layer)
        written = current * 0.5 + 1.0
        box["written"] = written.save()
        internals[name].set(layer, written)
        box["again"] = internals[name].get(layer).save()
        box["later"] = internals[later[0]].get(later[1]).save()
    where = f"{name}[{layer}]" if layer is not None else name
    checks = [
        compare(
            f"{other} read before the write at {where} == a clean run",
            at,
            saved_value(saved),
            clean[(other, at)],
        )
        for (_, other, at), saved in zip(earlier, before, strict=True)
    ]
    checks.append(
        compare(
            f"{where} read after the write == the written value",
            layer,
            saved_value(box["again"]),
            saved_value(box["written"]),
        )
    )
    after = saved_value(box["later"]).detach()
    moved = float((after.double() - clean[later].detach().double()).abs().max())
    checks.append(
        CheckResult.of(
            (),
            f"{later[0]} after the write at {where} differs from a clean run",
            bool(moved > 0 and torch.isfinite(after).all()),
            layer=later[1],
            max_error=moved,
        )
    )
    return checks


def _around(
    internals: Any, name: str, layer: int | None
) -> tuple[list[tuple[tuple[int, int], str, int | None]], tuple[str, int | None] | None]:
    """The places available at module boundaries up to and including ``name`` at
    ``layer`` (with their rank in forward order), and a place after it to observe a
    write there (layers_output or logits; None where there is none)."""
    rank = internals.rank(name, layer)
    earlier: list[tuple[tuple[int, int], str, int | None]] = []
    later: tuple[str, int | None] | None = None
    for other in internals:
        row = internals[other].row
        if row.io.value == "module" or row.source:
            # module boundaries only: an operation inside a forward (attention
            # probabilities) is found by a trace, and a row that finds none is
            # refused by its own check, not here
            continue
        layers: list[int | None] = list(range(internals.num_layers)) if row.per_layer else [None]
        for at in layers:
            if internals[other].unavailable_on(at) is not None:
                continue
            key = internals.rank(other, at)
            if key <= rank:
                earlier.append((key, other, at))
            elif other in ("layers_output", "logits") and (later is None or at == layer):
                later = (other, at)
    return earlier, later


def _edit_and_assign(model: Any, inputs: dict[str, Any], place: Any, layer: int | None) -> Any:
    """``in_place_edit``'s two traces: the read, an in-place edit of a second read, the
    read again and the logits; then the same edit on a copy written by assignment, and
    the logits. What they saved, by name."""
    internals = model.internals
    box: dict[str, Any] = {}
    with model.trace(inputs):
        first = place.get(layer)
        # names first bound in a trace body do not leave it: the position goes in box
        box["at"] = (slice(None), min(2, int(first.shape[1]) - 1)) if first.dim() >= 2 else ...
        box["before"] = first.save()
        edited = place.get(layer)
        edited[box["at"]] += 0.5
        box["again"] = place.get(layer).save()
        box["logits"] = internals["logits"]().save()
    with model.trace(inputs):
        copy = place.get(layer).clone()
        box["clean"] = copy.clone().save()
        copy[box["at"]] += 0.5
        place.set(layer, copy)
        box["assigned"] = internals["logits"]().save()
    return box


def in_place_edit(
    model: Any, inputs: dict[str, Any], name: str, layer: int | None
) -> list[CheckResult]:
    """An in-place edit of a read is the write of the place. In one trace: read
    ``name`` at ``layer`` and save it, edit a second read in place at one position
    (``x[:, p] += 0.5``), read the place again and the logits. In another: read it,
    make the same edit on a copy and write it by assignment, read the logits. The read
    saved before the edit must equal the other trace's first read (it keeps its
    value), the read after must be it with the edit at that position only, and the
    logits must equal the assignment's bit for bit (the edit reached the model exactly
    as the assignment did). The reads are held to their values where a read is a copy
    (snapshot, in_place, a scale, a module's input); at an output a read is the model's
    tensor. Returns
    [] where the place takes no write."""
    import torch

    internals = model.internals
    place = internals[name]
    if (
        place.row.io.value == "module"
        or place.refuses_writes() is not None
        or place.unavailable_on(layer) is not None
        or internals["logits"].unavailable_on() is not None
    ):
        return []
    box = _edit_and_assign(model, inputs, place, layer)
    where = f"{name}[{layer}]" if layer is not None else name
    before, clean = saved_value(box["before"]).detach(), saved_value(box["clean"]).detach()
    want = clean.clone()
    want[box["at"]] += 0.5
    logits, assigned = saved_value(box["logits"]).detach(), saved_value(box["assigned"]).detach()
    same = bool(torch.equal(logits, assigned))
    kept = []
    row = place.row
    if row.snapshot or row.write == "in_place" or row.scale is not None or row.io.value == "input":
        # where a read is a copy; at an output a read is the model's tensor itself,
        # which the forward may still change in place (XLM masks its block output)
        kept.append(
            compare(f"{where} read before an in-place edit == its clean read", layer, before, clean)
        )
        kept.append(
            compare(
                f"{where} read after an in-place edit == the read, edited there",
                layer,
                saved_value(box["again"]).detach(),
                want,
            )
        )
    return [
        *kept,
        CheckResult.of(
            (),
            f"logits after an in-place edit of {where} == after the same write by assignment",
            same,
            max_error=0.0 if same else float((logits.double() - assigned.double()).abs().max()),
        ),
    ]
