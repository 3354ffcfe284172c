"""Check that the places mean what their names say, on real tensors.

The identities are the registry's own (``BLOCK_STRUCTURES[...].identities``); the
oracles are written by others: transformers' ``output_hidden_states`` and
``output_attentions``, and the model's logits. Used by the tests and by
``registry sweep``.

The package along its seams: ``common`` (the sample inputs, one trace reading every
place, the one comparator and ``CheckResult``, the one result type of every check;
``Check`` is its older name), ``block_identities`` (the block structure's identities
parsed and evaluated), ``oracles`` (transformers' own forward
and what the checks read of it) and ``writes`` (a write reaches the stream, never
reaches backwards, and an in-place edit is the write). Their public names are
importable from here."""

from causalab_mini.tools.certify.block_identities import (
    Term,
    canonical,
    evaluate_identity,
    identities,
    identity_rows,
    mid_write_target,
    mlp_addend,
    output_scale,
    parse_identity,
    parse_terms,
    rows_of,
    stream_count,
    structure_identities,
    torch_einsum,
)
from causalab_mini.tools.certify.common import (
    ATOL,
    RTOL,
    Check,
    CheckResult,
    close,
    compare,
    difference,
    forward_inputs,
    read_places,
    sample_inputs,
    saved_value,
)
from causalab_mini.tools.certify.oracles import (
    attention_oracle,
    decoder_outputs,
    hidden_state_oracle,
    merged_oracle,
    oracle_attentions,
    oracle_hidden_states,
    oracle_outputs,
)
from causalab_mini.tools.certify.writes import (
    attention_write_shifts_mid,
    in_place_edit,
    write_keeps_earlier_reads,
    write_reaches_stream,
)

__all__ = [
    "ATOL",
    "RTOL",
    "Check",
    "CheckResult",
    "Term",
    "attention_oracle",
    "attention_write_shifts_mid",
    "canonical",
    "close",
    "compare",
    "decoder_outputs",
    "difference",
    "evaluate_identity",
    "forward_inputs",
    "hidden_state_oracle",
    "identities",
    "identity_rows",
    "in_place_edit",
    "merged_oracle",
    "mid_write_target",
    "mlp_addend",
    "oracle_attentions",
    "oracle_hidden_states",
    "oracle_outputs",
    "output_scale",
    "parse_identity",
    "parse_terms",
    "read_places",
    "rows_of",
    "sample_inputs",
    "saved_value",
    "stream_count",
    "structure_identities",
    "torch_einsum",
    "write_keeps_earlier_reads",
    "write_reaches_stream",
]
