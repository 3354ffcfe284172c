"""The oracles written by others: transformers' own forward of the model on what the
trace's forward receives, its ``output_hidden_states`` and ``output_attentions`` as
the checks read them (an encoder-decoder's decoder's, a wrapper's language model's),
and the places held against them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .common import CheckResult, compare, forward_inputs, read_places


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
) -> list[CheckResult]:
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


def attention_oracle(model: Any, inputs: dict[str, Any]) -> list[CheckResult]:
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
