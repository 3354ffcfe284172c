"""Check that the places mean what their names say, on real tensors.

The identities are the registry's own (``BLOCK_STRUCTURES[...].identities``); the
oracles are written by others: transformers' ``output_hidden_states`` and
``output_attentions``, and the model's logits. Used by the tests and by
``registry sweep``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeAlias

from causalab_mini.address import IdentityTerm, identity_term_rows, parse_identity_terms
from causalab_mini.generated import BLOCK_STRUCTURES

ATOL = 1e-4
RTOL = 1e-4


@dataclass(frozen=True)
class Check:
    """One comparison: what, where, and whether it held (with the worst error)."""

    name: str
    layer: int | None
    ok: bool
    max_error: float
    detail: str = ""


Term: TypeAlias = IdentityTerm


def parse_terms(text: str) -> tuple[str, tuple[Term, ...]]:
    """block_structures.yaml's identity grammar (``causalab_mini.address``)."""
    parsed: tuple[str, tuple[Term, ...]] = parse_identity_terms(text)
    return parsed


def parse_identity(text: str) -> tuple[str, tuple[str, ...]]:
    """``"a == b + c"`` -> ``("a", ("b", "c"))``: the left side and every row the right
    side names, in order (a weighted or mixed term names two, a number none)."""
    left, terms = parse_terms(text)
    return left, tuple(name for term in terms for name in identity_term_rows(term))


_rows_of = identity_term_rows


def identity_rows(text: str) -> tuple[str, ...]:
    """Every row an identity names, left side first."""
    left, right = parse_identity(text)
    return (left, *right)


def structure_identities(model: Any) -> tuple[str, ...]:
    """The identities of the model's block structure (none if it has no known one)."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    return structure.identities if structure is not None else ()


def mid_write_target(model: Any) -> str | None:
    """The row that must carry a write to layers_mid on: the left side of the
    structure's identity ``X == layers_mid + mlps_output`` (layers_output on a
    pre-norm block, layers_output_prenorm where a norm follows the add), or, where
    the MLP's contribution is added to another stream (a reversible block:
    ``layers_output == layers_input + mlps_output``, ``mlps_input == layers_mid``),
    the left side of that identity."""
    addend = _mlp_addend(model)
    return None if addend is None else addend[0]


def _mlp_addend(model: Any) -> tuple[str, str] | None:
    """(X, A) of the structure's identity ``X == A + mlps_output``, layers_mid's first."""
    texts = list(structure_identities(model))
    # the MLP reads layers_mid itself where it adds to another stream
    reads_mid = any(parse_identity(t) == ("mlps_input", ("layers_mid",)) for t in texts)
    found = []
    for text in texts:
        left, right = parse_identity(text)
        if len(right) == 2 and "mlps_output" in right:
            other = next(r for r in right if r != "mlps_output")
            if other == "layers_mid" or reads_mid:
                found.append((other != "layers_mid", left, other))
    return (min(found)[1], min(found)[2]) if found else None


def sample_inputs(model: Any, texts: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A padded batch of two (the first row left-padded), as tensors."""
    texts = texts or (
        "The quick brown fox",
        "A much longer sentence about the quick brown fox and a lazy dog",
    )
    tokenizer = model.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    # a forward that needs more than token ids (a drafter's target states) gets the
    # inputs registry/tiny.yaml side_inputs gives its model type
    from causalab_mini.tools.tiny import side_inputs

    inputs.update(side_inputs(model._model.config, *batch["input_ids"].shape, tokens=inputs))
    embeds = inputs.get("inputs_embeds")
    if embeds is not None and embeds.shape[1] < inputs["input_ids"].shape[1]:
        # the side inputs query fewer positions than the mask spans (a drafter: one
        # drafted position over the target's keys and values): the token ids are each
        # row's last ones, so nnsight counts no positions of its own for a batch whose
        # mask is wider than its ids (0.8 would, from a mask as wide as the ids)
        inputs["input_ids"] = inputs["input_ids"][:, -embeds.shape[1] :]
    return inputs


def forward_inputs(model: Any, inputs: Any) -> dict[str, Any]:
    """The keyword arguments the trace's own forward receives for ``inputs``: what a
    plain forward (an oracle) must be fed to compute what the places hold.

    A place holds what the traced forward computes, and nnsight decides part of that
    forward's input: on a left-padded text batch without ``position_ids``, nnsight
    0.8 adds position ids counted from each row's first real token (so left padding
    does not shift an absolute-position model such as GPT-2 or OPT), while 0.6 and
    0.7 pass the batch as given and the model counts positions itself. The oracles
    are fed exactly what the trace's forward got, read from the trace itself, so they
    hold on every nnsight. (Pass ``position_ids`` yourself to get the same places on
    every nnsight.)
    """
    box: list[Any] = []  # bound before the trace
    with model.trace(inputs):
        box.append(model.inputs.save())
    args, kwargs = _value(box[0])
    if args:
        raise TypeError(
            f"the traced forward was called with {len(args)} positional arguments; the "
            "oracles pass keyword arguments only: give the trace a mapping of tensors"
        )
    return dict(kwargs)


def read_places(
    model: Any, inputs: dict[str, Any], names: list[str] | None = None
) -> dict[tuple[str, int | None], Any]:
    """Read every available tensor place (per layer and whole-model) in one trace, in
    forward order. Returns ``{(name, layer): tensor}``."""
    internals = model.internals
    plan: list[tuple[tuple[int, int], str, int | None]] = []
    for name in names or list(internals):
        place = internals[name]
        if place.row.io.value == "module":
            continue
        if place.per_layer:
            for layer in range(internals.num_layers):
                if place.unavailable_on(layer) is None:
                    plan.append((internals.rank(name, layer), name, layer))
        elif place.unavailable_on() is None:
            plan.append((internals.rank(name), name, None))
    plan.sort(key=lambda item: item[0])
    saved: list[Any] = []  # made before the trace: names first bound inside it do not leave it
    with model.trace(inputs):
        for _, name, at in plan:
            saved.append(internals[name].get(at).save())
    return {(name, layer): _value(t) for (_, name, layer), t in zip(plan, saved, strict=True)}


def _value(saved: Any) -> Any:
    return getattr(saved, "value", saved)


def difference(got: Any, want: Any, atol: float = ATOL) -> tuple[bool, float]:
    """The one comparator of the project's checks: (whether ``got`` equals ``want`` up
    to ``atol`` times the larger of 1 and ``want``'s largest magnitude, and ``RTOL``;
    the worst absolute error). Tensors of different shapes differ (error inf)."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        return False, float("inf")
    got, want = got.detach().double(), want.detach().double()
    if not want.numel():
        return True, 0.0
    worst = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    return bool(torch.allclose(got, want, atol=atol * scale, rtol=RTOL)), worst


def close(got: Any, want: Any, atol: float = ATOL) -> tuple[bool, str]:
    """``difference`` as (ok, detail) for a report: the worst error, or the shapes."""
    ok, worst = difference(got, want, atol)
    if worst == float("inf"):
        return False, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return ok, f"max error {worst:.3g}"


def compare(name: str, layer: int | None, got: Any, want: Any) -> Check:
    """``difference`` as a named Check."""
    ok, worst = difference(got, want)
    detail = "" if worst != float("inf") else f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return Check(name, layer, ok, worst, detail)


def stream_count(model: Any, row: Any) -> int | None:
    """How many streams a row carries (None for one stream)."""
    if row.streams is None:
        return None
    count = getattr(model.text_config, row.streams.count, None)
    if not isinstance(count, int):
        raise ValueError(
            f"the row's streams count names config attribute {row.streams.count!r}, which "
            "this model's config does not give as an int"
        )
    return count


def canonical(model: Any, name: str, value: Any) -> Any:
    """A row's value with its streams as (batch, seq, n, hidden); a value handed on flat
    by a component (batch, seq, n x hidden) is taken the same way. Other rows as given."""
    row = model.internals[name].row
    n = stream_count(model, row)
    if n is None:
        return value
    if value.dim() == 3:  # handed on flat, or held flat (bsf)
        return value.unflatten(-1, (n, value.shape[-1] // n))
    return row.streams.canonical(value, n)


def _term(model: Any, term: Any, values: dict[str, Any], layer: int, left: str) -> Any:
    """The value of one term of an identity at ``layer`` (``values`` by row name)."""
    kind = term[0]
    if kind == "row":
        return canonical(model, term[1], values[term[1]])
    if kind == "k":
        return float(term[1]) * canonical(model, term[2], values[term[2]])
    if kind == "*":
        weights, one = values[term[1]], values[term[2]]
        return weights.to(one.dtype).unsqueeze(-1) * one.unsqueeze(-2)
    if kind == "@":
        streams = canonical(model, term[2], values[term[2]])
        mix = values.get(term[1])
        if mix is None:  # the model has no mixing row: the streams pass unmixed
            return streams
        return torch_einsum("bsjk,bsjh->bskh", mix.to(streams.dtype), streams)
    module = model.internals[left].address_at(layer).module
    from causalab_mini.internals import child

    envoy = child(model.internals.layer_envoy(layer), module)
    import torch

    with torch.no_grad():
        out = envoy._module(values[term[1]])
    return out[0] if isinstance(out, tuple) else out


def torch_einsum(spec: str, *operands: Any) -> Any:
    import torch

    return torch.einsum(spec, *operands)


def evaluate_identity(
    model: Any, text: str, values: dict[tuple[str, int | None], Any], layer: int
) -> tuple[Any, Any] | None:
    """(left, right) of ``text`` at ``layer`` as tensors, the streams as (batch, seq, n,
    hidden); None where a row it names is not in ``values`` (refused on the model or
    not read). A mixing row (``m @ x``) the model refuses means no mixing."""
    left, terms = parse_terms(text)
    needed = [left]
    for term in terms:
        if term[0] == "@":
            needed.append(term[2])
        else:
            needed.extend(_rows_of(term))
    if not all((name, layer) in values for name in needed):
        return None
    for term in terms:
        if term[0] == "@" and (term[1], layer) not in values:
            if model.internals[term[1]].unavailable_on(layer) is None:
                return None  # the row exists but was not read: nothing to say
    here = {
        name: values[(name, layer)]
        for name in {*needed, *(n for t in terms for n in _rows_of(t))}
        if (name, layer) in values
    }
    parts = [_term(model, term, here, layer, left) for term in terms]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return canonical(model, left, here[left]), total


def output_scale(model: Any, layer: int) -> Any:
    """The weight layer ``layer`` multiplies its whole output by, where its block
    structure has one (``output_scale``: a path relative to the layer, read off the
    module), else 1."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is None or structure.output_scale is None:
        return 1.0
    value = model.internals.layer_envoy(layer)._module
    for part in structure.output_scale.split("."):
        value = getattr(value, part)
    return value.detach()


def identities(model: Any, values: dict[tuple[str, int | None], Any]) -> list[Check]:
    """Every identity of the model's block structure, on every layer where all its
    places are available (an identity of layers_output times the block's output
    scale, where it has one)."""
    structure = BLOCK_STRUCTURES.get(model.block_structure or "")
    if structure is None:
        return []
    out = []
    for text in structure.identities:
        for layer in range(model.internals.num_layers):
            sides = evaluate_identity(model, text, values, layer)
            if sides is None:
                continue
            left, right = sides
            if parse_terms(text)[0] == "layers_output":
                right = right * output_scale(model, layer)
            out.append(compare(text, layer, left, right))
    return out


def oracle_hidden_states(model: Any, hidden: Any) -> Any:
    """transformers' ``output_hidden_states`` as the oracles read it: as given, or
    where the family says they count every call of the layer class with the layers'
    own calls last (``oracles_from_last_calls``), the last n + 1 entries with the first
    None (the entry before the layers' first output is another call's output, not the
    first layer's input)."""
    if not getattr(model, "oracles_from_last_calls", False) or hidden is None:
        return hidden
    n = model.internals.num_layers
    return (None, *tuple(hidden)[len(hidden) - n :])


def oracle_outputs(model: Any, inputs: dict[str, Any], **flags: Any) -> Any:
    """transformers' own forward of ``model`` on what the trace's forward receives for
    ``inputs`` (``forward_inputs``), with ``flags`` (output_hidden_states ...), as the
    oracles read it (``decoder_outputs``). Where the family says the wrapper drops or
    nests its language model's output (``oracle_module``: BLIP's text_decoder, whose
    hidden states the wrapper replaces with the vision tower's; BLIP-2's
    language_model), the hidden states and attentions are that module's own output in
    the same forward, the logits the wrapper's."""
    import torch

    path = getattr(model, "oracle_module", None)
    held: list[Any] = []
    hook = None
    if path is not None:
        module = model._model.get_submodule(path)
        hook = module.register_forward_hook(lambda _m, _a, out: held.append(out))
    try:
        with torch.no_grad():
            out = model._model(**forward_inputs(model, inputs), **flags)
    finally:
        if hook is not None:
            hook.remove()
    if path is None:
        return decoder_outputs(out)
    if not held:
        raise TypeError(
            f"{path!r} (the family's oracle_module) did not run in "
            f"{type(model._model).__name__}'s forward: the language model's hidden "
            "states and attentions are not where the family says"
        )
    inner = decoder_outputs(held[-1])
    return SimpleNamespace(
        hidden_states=inner.hidden_states,
        attentions=getattr(inner, "attentions", None),
        cross_attentions=getattr(inner, "cross_attentions", None),
        logits=out.logits,
    )


def decoder_outputs(out: Any) -> Any:
    """A model output as the oracles read a decoder's: an encoder-decoder's output
    (``decoder_hidden_states`` and ``decoder_attentions`` beside the encoder's) gives
    its decoder's entries as ``hidden_states`` and ``attentions`` (the registry's layers
    are the decoder's), ``cross_attentions`` and ``logits`` kept; any other as it is."""
    if getattr(out, "decoder_hidden_states", None) is None and not hasattr(
        out, "decoder_attentions"
    ):
        return out
    return SimpleNamespace(
        hidden_states=out.decoder_hidden_states,
        attentions=out.decoder_attentions,
        cross_attentions=getattr(out, "cross_attentions", None),
        encoder_hidden_states=getattr(out, "encoder_hidden_states", None),
        logits=out.logits,
    )


def merged_oracle(model: Any, out: Any) -> tuple[Any, str]:
    """``output_attentions`` of a decoder's output ``out`` as the oracle of the
    attention_probabilities row, and the check's name: where the family's attention is
    self- and cross-attention in one softmax (``merged_cross_attention``), the
    decoder's and the cross-attention's entries side by side on the key axis, as the
    one softmax made them (transformers hands them back split in two)."""
    import torch

    attentions: Any = getattr(out, "attentions", None)
    cross: Any = getattr(out, "cross_attentions", None)
    merged_cross = model.resolution.checks.merged_cross_attention
    if merged_cross is None or attentions is None or cross is None:
        return attentions, "output_attentions == attention_probabilities"
    merged = tuple(torch.cat(pair, dim=-1) for pair in zip(attentions, cross, strict=True))
    return merged, "cat(decoder_attentions, cross_attentions) == attention_probabilities"


def oracle_attentions(model: Any, attentions: Any) -> Any:
    """transformers' ``output_attentions`` as the oracles read it: the last n entries
    where they count every call of the layer class (``oracles_from_last_calls``)."""
    if not getattr(model, "oracles_from_last_calls", False) or attentions is None:
        return attentions
    return tuple(attentions)[len(attentions) - model.internals.num_layers :]


def hidden_state_oracle(
    model: Any, inputs: dict[str, Any], values: dict[tuple[str, int | None], Any]
) -> list[Check]:
    """transformers' ``output_hidden_states``: entry i is layer i's input, and the last
    is the final norm's output (where the family says its entries are the blocks'
    outputs, entry i is layer i's output)."""

    out = oracle_outputs(model, inputs, output_hidden_states=True)
    hidden = oracle_hidden_states(model, out.hidden_states)
    checks = []
    # the entries are the layers the model runs (on a text-only input a layer that
    # needs an image is skipped and has none), in order
    ran = model.internals.layers_run_on_text()
    n = len(ran)
    # entry i is layer i's input; or its output, where the family says so
    row = (
        "layers_output"
        if getattr(model, "hidden_states_are_block_outputs", False)
        else "layers_input"
    )
    if getattr(model, "oracles_from_last_calls", False):
        # entry i + 1 is layer i's output (the last entry the final norm's); nothing
        # says the stream is unchanged between two layers
        for entry, layer in enumerate(ran[:-1]):
            if ("layers_output", layer) in values:
                checks.append(
                    compare(
                        "hidden_states[i+1] == layers_output",
                        layer,
                        values[("layers_output", layer)],
                        hidden[entry + 1],
                    )
                )
        row = ""
    for entry, layer in enumerate(ran):
        if (row, layer) in values:
            checks.append(
                compare(f"hidden_states[i] == {row}", layer, values[(row, layer)], hidden[entry])
            )
    last = values.get(("layers_output", ran[-1])) if ran else None
    streams = model.internals["layers_output"].row.streams is not None
    if last is not None and len(hidden) == n + 1 and streams and hidden[n].shape == last.shape:
        # the last entry holds several streams (the shape of the block's output), so it is
        # not the final norm's output (one stream) but the last block's (Gemma-3n's copies)
        checks.append(compare("hidden_states[-1] == layers_output[-1]", ran[-1], last, hidden[n]))
    elif ("ln_final_output", None) in values and len(hidden) == n + 1:
        checks.append(
            compare(
                "hidden_states[-1] == ln_final_output",
                None,
                values[("ln_final_output", None)],
                hidden[n],
            )
        )
    if ("logits", None) in values:
        checks.append(compare("model logits == logits", None, values[("logits", None)], out.logits))
    return checks


def attention_oracle(model: Any, inputs: dict[str, Any]) -> list[Check]:
    """``output_attentions`` under eager attention == the attention_probabilities row
    (the model must be loaded with ``enable_attention_probs=True``)."""

    out = oracle_outputs(model, inputs, output_attentions=True)
    values = read_places(model, inputs, ["attention_probabilities"])
    attentions, name = merged_oracle(model, out)
    # one entry per layer the model runs (see hidden_state_oracle)
    return [
        compare(
            name,
            layer,
            values[("attention_probabilities", layer)],
            oracle_attentions(model, attentions)[entry],
        )
        for entry, layer in enumerate(model.internals.layers_run_on_text())
        if ("attention_probabilities", layer) in values
    ]


def write_reaches_stream(model: Any, inputs: dict[str, Any], layer: int = 0) -> Check | None:
    """Write at the stream between the sublayers and check the block carries the
    written value on: after ``layers_mid[i] = mid + delta``,
    ``layers_output[i] == (mid + delta) + mlps_output[i]`` (on a post_ln block the sum
    before the last norm, ``layers_output_prenorm``). On a parallel block the
    equivalent is ``attentions_output[i] += delta``, which must shift
    ``layers_output[i]`` by exactly delta."""
    import torch

    internals = model.internals
    torch.manual_seed(0)
    found = _mlp_addend(model)
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
        written = _value(box["written"])
        scale = output_scale(model, layer) if target == "layers_output" else 1.0
        if not via_input:
            return compare(
                f"{target} == written layers_mid + mlps_output",
                layer,
                _value(box["out"]),
                (written + _value(box["mlp"])) * scale,
            )
        return compare(
            f"mlps_input == written layers_mid, {target} == {addend} + mlps_output",
            layer,
            torch.cat([_value(box["read"]), _value(box["out"])], dim=-1),
            torch.cat([written, (_value(box["addend"]) + _value(box["mlp"])) * scale], dim=-1),
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
        rows = [n for t in terms for n in _rows_of(t)]
        if len(terms) != 2 or any(t[0] != "row" for t in terms) or "layers_mid" not in rows:
            continue
        if "mlps_output" in rows:
            continue
        if all(internals[r].unavailable_on(layer) is None for r in (left, *rows)):
            return text
    return None


def _attention_write_shifts(model: Any, inputs: dict[str, Any], layer: int, observed: str) -> Check:
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
        _value(box["out"]),
        _value(box["clean"]) + 0.25,
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
        rows = [left, *(n for t in terms for n in _rows_of(t) if t[0] != "@" or n != t[1])]
        if all(internals[r].unavailable_on(layer) is None for r in rows):
            return text
    return None


def _write_through_identity(model: Any, inputs: dict[str, Any], layer: int, text: str) -> Check:
    """Write layers_mid + delta at ``layer``, read the identity's other rows after the
    write in the same trace, and hold its left side to the right side evaluated with
    the written layers_mid."""
    import torch

    internals = model.internals
    left, terms = parse_terms(text)
    rows = sorted(
        {n for t in terms for n in _rows_of(t) if n != "layers_mid"} | {left},
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
        (name, layer): _value(v) for name, v in box.items()
    }
    sides = evaluate_identity(model, text, values, layer)
    assert sides is not None
    return compare(f"{text}, with a written layers_mid", layer, sides[0], sides[1])


def attention_write_shifts_mid(model: Any, inputs: dict[str, Any]) -> Check | None:
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
) -> list[Check]:
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
            _value(saved),
            clean[(other, at)],
        )
        for (_, other, at), saved in zip(earlier, before, strict=True)
    ]
    checks.append(
        compare(
            f"{where} read after the write == the written value",
            layer,
            _value(box["again"]),
            _value(box["written"]),
        )
    )
    after = _value(box["later"]).detach()
    moved = float((after.double() - clean[later].detach().double()).abs().max())
    checks.append(
        Check(
            f"{later[0]} after the write at {where} differs from a clean run",
            later[1],
            bool(moved > 0 and torch.isfinite(after).all()),
            moved,
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


def in_place_edit(model: Any, inputs: dict[str, Any], name: str, layer: int | None) -> list[Check]:
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
    before, clean = _value(box["before"]).detach(), _value(box["clean"]).detach()
    want = clean.clone()
    want[box["at"]] += 0.5
    logits, assigned = _value(box["logits"]).detach(), _value(box["assigned"]).detach()
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
                _value(box["again"]).detach(),
                want,
            )
        )
    return [
        *kept,
        Check(
            f"logits after an in-place edit of {where} == after the same write by assignment",
            None,
            same,
            0.0 if same else float((logits.double() - assigned.double()).abs().max()),
        ),
    ]
