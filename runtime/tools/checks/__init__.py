"""The sweep's checks, as units: each is a small function of one ``Context`` (the
model, what was read, the model's own outputs) that yields what it compared, and
``CHECKS`` is the list one loop runs (``sweep.certify``).

A check yields ``CheckResult``s (``checks.base``): the components it covers, its
description (the same on every model, so the coverage table can list it), its status
(ok, broken, or refused by the library with the reason, which breaks nothing) and a
detail (the worst error, the layer). A check that does not apply to a model yields
nothing; a component that no check covers is reported broken by the sweep, never ok.

The comparison is ``certify.close``, the one comparator of the project's checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from causalab_mini.tools import certify as cert
from causalab_mini.tools.certify import close
from causalab_mini.tools.checks import engines, experts, gradients, interventions, recompute
from causalab_mini.tools.checks import positions as position_checks
from causalab_mini.tools.checks import ragged as ragged_checks
from causalab_mini.tools.checks import ragged_pairs as ragged_pair_checks
from causalab_mini.tools.checks.base import (
    CheckFunction,
    CheckResult,
    Context,
    Outcome,
    handed,
    row_components,
)
from causalab_mini.tools.verdicts import ComponentState


def read_alone(ctx: Context) -> Iterator[CheckResult]:
    """A whole-model place does not depend on what else the trace reads: where its
    module runs more than once (Dory's norm), nnsight 0.6/0.7 hand on the call after the
    last place read before it, and 0.8 refuses to read it after them."""
    from causalab_mini.components import Plan

    whole = {key: a for key, a in ctx.addresses.items() if key[1] is None}
    if not whole:
        return
    alone = Plan.of(reads=whole.values()).run(ctx.model, ctx.inputs)
    for key, address in whole.items():
        if address in ctx.unordered:
            ok, d = False, ctx.unordered[address]
        elif hasattr(ctx.v[key], "shape"):
            ok, d = close(alone[address], ctx.v[key])
        else:
            ok, d = True, ""
        yield CheckResult.of((key[0],), "read alone == read with the layers' places", ok, d)


def identities(ctx: Context) -> Iterator[CheckResult]:
    """The block structure's identities (block_structures.yaml), on every layer."""
    row_of = row_components()
    for check in cert.identities(ctx.model, ctx.places):
        left, right = cert.parse_identity(check.description)
        yield CheckResult.of(
            tuple(row_of[r] for r in (left, *right) if r in row_of),
            check.description,
            check.ok,
            f"layer {check.layer}: max error {check.max_error:.3g}",
        )


def hidden_states(ctx: Context) -> Iterator[CheckResult]:
    """transformers' output_hidden_states: entry i is block i's input (or, where the
    family says so, its output), entry i+1 block i's output. The entries are the
    blocks the model runs: a layer it skips on a text-only input (a cross-attention
    layer without an image) has none, and the next entry is the next layer's."""
    hidden, v = ctx.hidden, ctx.v
    ran = ctx.model.internals.layers_run_on_text()
    n = len(ran)
    for entry, layer in enumerate(ran):
        if ctx.model.hidden_states_are_block_outputs:
            if entry > 0 and ctx.have("block_input", layer=layer) and len(hidden) == n + 1:
                ok, d = close(
                    v[("block_input", layer)], handed(ctx, "block_input", layer, hidden[entry - 1])
                )
                yield CheckResult.of(
                    ("block_input",), "output_hidden_states[i-1] == block_input[i]", ok, d
                )
            if ctx.have("block_output", layer=layer) and len(hidden) == n + 1:
                ok, d = close(
                    v[("block_output", layer)], handed(ctx, "block_output", layer, hidden[entry])
                )
                yield CheckResult.of(
                    ("block_output",), "output_hidden_states[i] == block_output[i]", ok, d
                )
        else:
            # where the entries are every layer call's outputs, the layers' last, an
            # entry is a layer's output, not the next one's input (BLT adds a
            # cross-attention between its layers): only outputs are compared
            if ctx.have("block_input", layer=layer) and not ctx.model.oracles_from_last_calls:
                ok, d = close(
                    v[("block_input", layer)], handed(ctx, "block_input", layer, hidden[entry])
                )
                yield CheckResult.of(
                    ("block_input",), "output_hidden_states[i] == block_input[i]", ok, d
                )
            if entry < n - 1 and ctx.have("block_output", layer=layer) and len(hidden) == n + 1:
                ok, d = close(
                    v[("block_output", layer)],
                    handed(ctx, "block_output", layer, hidden[entry + 1]),
                )
                yield CheckResult.of(
                    ("block_output",), "output_hidden_states[i+1] == block_output[i]", ok, d
                )


def attention_probabilities(ctx: Context) -> Iterator[CheckResult]:
    """transformers' output_attentions (eager) == attention_probs, per layer; hybrid
    stacks return attentions only for their attention layers."""
    merged, name = cert.merged_oracle(ctx.model, ctx.hf)
    attentions = cert.oracle_attentions(ctx.model, merged)
    if attentions is None:
        return
    label = name.replace("attention_probabilities", "attention_probs")
    layers = [layer for layer in range(ctx.n) if ("attention_probs", layer) in ctx.v]
    for layer in layers:
        index = layer if len(attentions) == ctx.n else layers.index(layer)
        if index < len(attentions) and attentions[index] is not None:
            ok, d = close(ctx.v[("attention_probs", layer)], attentions[index])
            yield CheckResult.of(("attention_probs",), label, ok, d)


def attention_input_norm(ctx: Context) -> Iterator[CheckResult]:
    """attention_input_norm is what the attention module reads."""
    for layer in range(ctx.n):
        if ctx.have("attention_input_norm", layer=layer) and (
            ("attentions_input", layer) in ctx.attn_inputs
        ):
            ok, d = close(
                ctx.v[("attention_input_norm", layer)],
                ctx.attn_inputs[("attentions_input", layer)],
            )
            yield CheckResult.of(
                ("attention_input_norm",), "attention_input_norm == attention's input", ok, d
            )


def final_norm(ctx: Context) -> Iterator[CheckResult]:
    """ln_final == output_hidden_states[-1]; where hidden states are counted per layer
    call (Dory runs some layers more than once), the base model's last_hidden_state."""

    if not ctx.have("ln_final"):
        return
    n, hidden = len(ctx.model.internals.layers_run_on_text()), ctx.hidden
    if len(hidden) == n + 1 and not ctx.stream_ends_at_block:
        ok, d = close(ctx.v[("ln_final", None)], hidden[n])
        yield CheckResult.of(("ln_final",), "output_hidden_states[-1] == ln_final", ok, d)
    elif len(hidden) != n + 1:
        last = recompute.final_hidden_state(ctx.model, ctx.inputs)
        if last is not None:
            ok, d = close(ctx.v[("ln_final", None)], last)
            yield CheckResult.of(
                ("ln_final",), "the base model's last_hidden_state == ln_final", ok, d
            )


def model_outputs(ctx: Context) -> Iterator[CheckResult]:
    """logits == the model's own logits; input_ids == the ids given; embeddings ==
    get_input_embeddings()(input_ids) (the decoder's on an encoder-decoder)."""
    import torch

    if ctx.have("logits"):
        ok, d = close(ctx.v[("logits", None)], ctx.hf.logits)
        yield CheckResult.of(("logits",), "the model's logits == logits", ok, d)
    if ctx.have("input_ids"):
        ok = bool(torch.equal(ctx.v[("input_ids", None)], ctx.inputs["input_ids"]))
        yield CheckResult.of(("input_ids",), "input_ids == the ids given", ok)
    if ctx.have("embeddings"):
        table = _single(input_embeddings(ctx.model._model), ctx, "embeddings")
        with torch.no_grad():
            embedded = table(ctx.inputs["input_ids"])
        ok, d = close(ctx.v[("embeddings", None)], embedded)
        yield CheckResult.of(
            ("embeddings",), "embeddings == get_input_embeddings()(input_ids)", ok, d
        )


def input_embeddings(hf_model: Any) -> Any:
    """transformers' input embeddings of the stack the places are on: the decoder's
    on an encoder-decoder, whose own ``get_input_embeddings()`` may be its encoder's
    (T5Gemma and FSMT keep one table per stack): the decoder stack's
    ``get_input_embeddings()`` (``_decoder_stack``), or, where the decoder is a plain
    module without that method, the table ``get_output_embeddings()`` names when it is
    one (FSMT's: the decoder's table, to which its head is tied);
    ``get_input_embeddings()`` elsewhere."""
    import torch

    if getattr(getattr(hf_model, "config", None), "is_encoder_decoder", False):
        decoder = _decoder_stack(hf_model)
        if decoder is not None and hasattr(decoder, "get_input_embeddings"):
            return decoder.get_input_embeddings()
        output = hf_model.get_output_embeddings()
        if isinstance(output, torch.nn.Embedding):
            return output
    return hf_model.get_input_embeddings()


def _decoder_stack(hf_model: Any) -> Any:
    """``get_decoder()``, asked again of what it returns until a module returns itself
    (or has no such method): a multimodal wrapper's ``get_decoder()`` is its whole
    encoder-decoder language model (Florence-2's BART), whose ``get_input_embeddings()``
    is the shared table, not the decoder's. The two are one tensor only while the text
    config ties its embeddings: the moved build unties them, and the decoder reads its
    own table. None where the model has no ``get_decoder()``."""
    decoder: Any = hf_model.get_decoder() if hasattr(hf_model, "get_decoder") else None
    for _ in range(4):  # a wrapper of a wrapper at most, in practice
        inner = decoder.get_decoder() if hasattr(decoder, "get_decoder") else decoder
        if inner is decoder or inner is None:
            break
        decoder = inner
    return decoder


def _single(module: Any, ctx: Context, component: str) -> Any:
    """``get_input_embeddings()`` / ``get_output_embeddings()`` as one module: where a
    model has a list of them (MusicGen: one embedding and one head per codebook), the
    one the component's row reads (its family refuses the place where that one is
    not the model's only one)."""
    import torch

    if not isinstance(module, torch.nn.ModuleList):
        return module
    from causalab_mini.internals import child

    address = ctx.addresses[(component, None)]
    return child(ctx.model, address.module)._module


def unembedding(ctx: Context) -> Iterator[CheckResult]:
    """lm_head is get_output_embeddings() of what it reads: the final norm's output
    (held to output_hidden_states[-1] by final_norm), the input of an unembedding
    inside a head that transforms ln_final first (pre-LN RoBERTa kin), the last
    block's output where there is no final norm, or the unembedding's own input
    (MiniCPM3 divides the final norm's output first)."""
    import torch

    head = ctx.model._model.get_output_embeddings()
    if not ctx.have("lm_head") or head is None or isinstance(head, torch.nn.Embedding):
        # an embedding table is a lookup of ids, no map of the stream to logits: a
        # model whose get_output_embeddings() names its input table (FSMT's, whose
        # head is another module) gives no oracle here
        return
    head = _single(head, ctx, "lm_head")
    v, raw = ctx.v, ctx.raw
    with torch.no_grad():
        given = raw.get(("lm_head_input", -1))
        via_norm = (
            close(v[("lm_head", None)], head(v[("ln_final", None)]))
            if ctx.have("ln_final")
            else None
        )
        inner = raw.get(("unembedding_input", -1))
        ends_at_block = ctx.stream_ends_at_block
        if (
            via_norm is not None
            and not via_norm[0]
            and not ends_at_block
            and inner is not None
            and given is not None
            and close(given, v[("ln_final", None)])[0]
        ):
            ok, d = close(v[("lm_head", None)], head(inner))
            yield CheckResult.of(
                ("lm_head",),
                "lm_head == get_output_embeddings()(its input inside lm_head), "
                "lm_head reading ln_final",
                ok,
                d,
            )
        elif via_norm is not None and (
            via_norm[0] or given is None or close(given, v[("ln_final", None)])[0]
        ):
            covered = ("lm_head", "ln_final") if ends_at_block else ("lm_head",)
            yield CheckResult.of(covered, "lm_head == get_output_embeddings()(ln_final)", *via_norm)
        elif via_norm is None and ctx.have("block_output", layer=ctx.n - 1):
            ok, d = close(v[("lm_head", None)], head(v[("block_output", ctx.n - 1)]))
            yield CheckResult.of(
                ("lm_head",), "lm_head == get_output_embeddings()(block_output[-1])", ok, d
            )
        elif given is not None:
            ok, d = close(v[("lm_head", None)], head(given))
            yield CheckResult.of(
                ("lm_head",), "lm_head == get_output_embeddings()(the unembedding's input)", ok, d
            )


LENS_IDENTITY = "lens(layers_output[last]) == logits"
LENS_ATOL = 1e-6


def lens_identity(ctx: Context) -> Iterator[CheckResult]:
    """The model's own head (``model.lens``: the family's lens rows) applied to the
    last block's output gives the model's logits; where the family refuses the lens,
    its reason is noted (nothing is certified by it)."""
    from causalab_mini.logit_lens import LensRefused

    ran = ctx.model.internals.layers_run_on_text()
    if not ran or not ctx.have("logits") or not ctx.have("block_output", layer=ran[-1]):
        return
    note = ctx.notes.setdefault("logits", {})
    try:
        got = ctx.model.lens(ctx.v[("block_output", ran[-1])])
    except LensRefused as exc:
        note["lens"] = f"{ComponentState.REFUSED}: {exc}"
        return
    except Exception as exc:  # a lens row that does not fit the model: broken, said
        note["lens"] = f"{ComponentState.BROKEN}: {type(exc).__name__}: {exc}"
        yield CheckResult.of(("logits",), LENS_IDENTITY, False, note["lens"])
        return
    # the same modules on the same tensor: exact up to float rounding, far below the
    # identities' tolerance (a tiny model's soft-capping moves its logits by 1e-4)
    ok, d = close(got, ctx.v[("logits", None)], atol=LENS_ATOL)
    note["lens"] = f"{ComponentState.OK if ok else ComponentState.BROKEN}: {d}"
    yield CheckResult.of(("logits",), LENS_IDENTITY, ok, d)


# ---------------------------------------------------------------- per layer


def module_consistency(ctx: Context) -> Iterator[CheckResult]:
    """A place that is a module's input, fed to that module, gives the module's output;
    attention_premix through the output projection is attention's output or its
    contribution; layers_mid, where no contribution row is read (MiniCPM3), through the
    norm whose output is mlps_norm_output (checks.recompute)."""
    for layer in range(ctx.n):
        yield from recompute.consistency_checks(ctx.model, ctx.v, ctx.raw, layer)


def interiors(ctx: Context) -> Iterator[CheckResult]:
    """softmax(scores) == probs, z == probs · V, z == premix (or z x the attention's
    output gate), scores == q·kᵀ·scaling + mask (or log probs, up to a constant per
    query) (checks.recompute)."""
    for layer in range(ctx.n):
        yield from recompute.interior_checks(ctx.model, ctx.v, ctx.raw, layer)


def mlp_interiors(ctx: Context) -> Iterator[CheckResult]:
    """The down projection of mlp_neuron_output is the MLP's output; the neurons are
    the activation, or the activation times a gate (checks.recompute)."""
    for layer in range(ctx.n):
        yield from recompute.mlp_checks(ctx.model, ctx.v, ctx.raw, layer)


def mlp_projections(ctx: Context) -> Iterator[CheckResult]:
    """act(mlp_gate) * mlp_up == mlp_neuron_output on a gated MLP, act(mlp_pre) ==
    mlp_activation on a non-gated one, and each half its linear of mlp_input
    (checks.recompute)."""
    for layer in range(ctx.n):
        yield from recompute.mlp_projection_checks(ctx.model, ctx.v, layer)


def rotary(ctx: Context) -> Iterator[CheckResult]:
    """rotary(attention_query_pre_rope) == attention_query and the same for the keys,
    with the family's own rotary function and arguments (checks.recompute)."""
    yield from recompute.rotary_checks(ctx.model, ctx.inputs, ctx.addresses, ctx.v)


# ---------------------------------------------------------------- writes


def write_reaches_stream(ctx: Context) -> Iterator[CheckResult]:
    """A write between the sublayers reaches the stream the block carries on
    (certify.write_reaches_stream)."""
    write = cert.write_reaches_stream(ctx.model, ctx.inputs, layer=min(1, ctx.n - 1))
    if write is not None:
        component = "block_mid" if "written layers_mid" in write.description else "attention_output"
        yield CheckResult.of(
            (component,), write.description, write.ok, f"max error {write.max_error:.3g}"
        )


def write_keeps_earlier_reads(ctx: Context) -> Iterator[CheckResult]:
    """Where a write overwrites the tensor the block carries (in_place) or the forward
    modifies it later (snapshot), every place read before the write keeps its clean
    value, the place reads back the written value and the stream after it changes."""
    yield from _at_each_place(
        ctx,
        lambda place: place.row.write == "in_place" or place.row.snapshot,
        cert.write_keeps_earlier_reads,
        "a write keeps every earlier read, reads back, and reaches the stream",
    )


def _at_each_place(
    ctx: Context,
    wanted: Callable[[Any], bool],
    run: Callable[[Any, dict[str, Any], str, int | None], list[Any]],
    name: str,
    if_read: bool = False,
) -> Iterator[CheckResult]:
    """``run`` (a certify write check) at every place a component reads that ``wanted``
    keeps, on the probe layer (1, or 0 on a one-layer model); one outcome each."""
    row_of = row_components()
    probe = min(1, ctx.n - 1)
    for row_name, place in ctx.model.internals.items():
        component = row_of.get(row_name)
        if component is None or not wanted(place):
            continue
        layer = probe if place.per_layer else None
        if place.unavailable_on(layer) is not None or (if_read and (component, layer) not in ctx.v):
            continue  # refused, or not read: its own check says why
        checks = run(ctx.model, ctx.inputs, row_name, layer)
        if checks:
            failed = [c for c in checks if not c.ok]
            detail = (
                f"{failed[0].description}: max error {failed[0].max_error:.3g}" if failed else ""
            )
            yield CheckResult.of((component,), name, not failed, detail)


def in_place_edits(ctx: Context) -> Iterator[CheckResult]:
    """At every writable place a component reads, an in-place edit of a read
    (``x[:, 2] += 0.5``) is the write of the place: the logits equal those of the same
    write by assignment, the read saved before keeps its value, the read after shows
    the edit (certify.in_place_edit)."""
    yield from _at_each_place(
        ctx,
        lambda place: True,
        cert.in_place_edit,
        "an in-place edit of a read is the place's write, and keeps earlier reads",
        if_read=True,
    )


def attention_write_shifts_mid(ctx: Context) -> Iterator[CheckResult]:
    """Where no identity names attentions_output (Falcon-H1's mixers side by side), a
    write to it shifts layers_mid by exactly the delta."""
    shift = cert.attention_write_shifts_mid(ctx.model, ctx.inputs)
    if shift is not None:
        yield CheckResult.of(
            ("attention_output",), shift.description, shift.ok, f"max error {shift.max_error:.3g}"
        )


# The checks the sweep runs, in this order, on every architecture.
CHECKS: tuple[CheckFunction, ...] = (
    read_alone,
    identities,
    module_consistency,
    hidden_states,
    attention_probabilities,
    attention_input_norm,
    interiors,
    mlp_interiors,
    mlp_projections,
    experts.router_checks,
    rotary,
    final_norm,
    model_outputs,
    unembedding,
    lens_identity,
    write_reaches_stream,
    write_keeps_earlier_reads,
    in_place_edits,
    attention_write_shifts_mid,
    experts.router_writes,
    position_checks.position_reads_and_writes,
    position_checks.interchange_identities,
    ragged_checks.ragged_batches,
    ragged_checks.ragged_interchange,
    ragged_pair_checks.ragged_pairs,
    engines.hooks_engine,
    interventions.mechanism_identities,
    interventions.featurizer_interchange,
    gradients.gradients,
)

__all__ = [
    "CHECKS",
    "LENS_IDENTITY",
    "CheckFunction",
    "CheckResult",
    "Context",
    "Outcome",
    "row_components",
]
