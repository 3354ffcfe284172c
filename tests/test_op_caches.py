"""Operation-name caches outlive nothing they describe: a forward's parsed source that
is collected takes its entries with it, so a new one (even at the same address) is
resolved from its own source."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from typing import Any

import pytest

from causalab_mini import ops


class _Accessor:
    """What find_op reads of nnsight's parsed forward: its source and where each
    operation's line is (0.7's ``source`` / ``line_numbers``); getattr hands back the
    operation's name, as nnsight hands back its envoy."""

    def __init__(self, lines: list[str], ops_at: dict[str, int]) -> None:
        self.source = "\n".join(["def forward(self, x):", *lines])
        self.line_numbers = ops_at

    def __getattr__(self, name: str) -> str:
        if name in self.line_numbers:
            return f"<{name}>"
        raise AttributeError(name)


def test_a_new_accessor_at_a_collected_ones_address_is_resolved_afresh() -> None:
    first = _Accessor(["    return torch.sigmoid(x)"], {"torch_sigmoid_0": 0})
    found = ops.find_op(first, "torch.sigmoid(", row="r", module="m", model_class="C")
    address = id(first)
    del first
    gc.collect()
    assert found == "<torch_sigmoid_0>"
    # CPython hands a freed object's memory to the next object of its size: make
    # accessors until one lands where the first one was
    lines = ["    y = torch.sigmoid(x)", "    return torch.sigmoid(y)"]
    at = {"torch_sigmoid_0": 0, "torch_sigmoid_1": 1}
    made = [_Accessor(lines, at) for _ in range(10_000)]  # kept, so each is a new address
    second = next((a for a in made if id(a) == address), None)
    del made
    if second is None:
        pytest.skip("no object was allocated at the collected accessor's address")
    # the second forward calls torch.sigmoid twice: the needle is ambiguous there, and
    # a cache keyed by the address would answer torch_sigmoid_0 without looking
    with pytest.raises(ops.OperationNotFound, match="at 2 operations"):
        ops.find_op(second, "torch.sigmoid(", row="r", module="m", model_class="C")


SEQUENCE = r"""
import gc, json, sys
import torch
from causalab_mini import StandardizedTransformer, ops
from causalab_mini.components import Plan, locate

def reads(model):
    addresses = [locate(model, c, layer=0) for c in
                 ("attention_query", "attention_key", "attention_scores", "attention_probs",
                  "attention_z")]
    out = Plan.of(reads=addresses).run(model, "The quick brown fox")
    return {a.component: (a.op, out[a]) for a in addresses}

answer = {}
for spec in sys.argv[1:]:
    model = StandardizedTransformer(spec, enable_attention_probs=True)
    warm = reads(model)  # with whatever the caches hold from the models before
    ops._CACHE.clear(); ops._OP_NAMES.clear()
    fresh = reads(model)  # as a fresh process resolves them
    answer[spec] = {
        name: [warm[name][0], fresh[name][0], bool(torch.equal(warm[name][1], fresh[name][1]))]
        for name in warm
    }
    del model, warm, fresh
    gc.collect()
print(json.dumps(answer))
"""


@pytest.mark.slow
def test_models_loaded_in_sequence_resolve_as_a_fresh_process() -> None:
    """Several models in one process, collected between them: every interior resolves
    to the operation (and reads the tensor) it does with empty caches."""
    specs = ["tiny:llama", "tiny:gpt2", "tiny:whisper", "tiny:qwen3", "tiny:llama"]
    done = subprocess.run(
        [sys.executable, "-c", SEQUENCE, *specs], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(answer) == sorted(set(specs))
    for spec, per_component in answer.items():
        for component, (warm, fresh, same) in per_component.items():
            assert warm == fresh and same, (spec, component, warm, fresh)
