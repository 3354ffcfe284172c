"""An address names one tensor: two addresses compare and hash equal only where the
tensor they name is the same kind of tensor (heads, head size, width, streams, the
model's families), so a dict of results keyed by address never mixes models."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from causalab_mini.components import locate
from causalab_mini.model import StandardizedTransformer

pytestmark = [pytest.mark.slow]

Load = Callable[..., StandardizedTransformer]


def test_addresses_on_models_of_other_heads_differ(tiny_model: Load) -> None:
    four = tiny_model("tiny:llama?num_attention_heads=4&num_key_value_heads=4")
    eight = tiny_model("tiny:llama?num_attention_heads=8&num_key_value_heads=8")
    a, b = locate(four, "attention_query", 0), locate(eight, "attention_query", 0)
    assert (a.heads, b.heads) == (4, 8)
    assert (a.component, a.layer, a.rank, a.op) == (b.component, b.layer, b.rank, b.op)
    assert a != b
    assert len({a: 1, b: 2}) == 2
    # the same address twice (and through pickle) is still one key
    assert a == locate(four, "attention_query", 0)
    assert hash(a) == hash(pickle.loads(pickle.dumps(a)))
    # head 1 of each: one head of a tensor of 4 heads is not one of 8
    ha, hb = locate(four, "attention_query", 0, head=1), locate(eight, "attention_query", 0, head=1)
    assert ha != hb


def test_addresses_on_other_widths_and_families_differ(tiny_model: Load) -> None:
    small = tiny_model("tiny:llama")
    wide = tiny_model("tiny:llama?hidden_size=128")
    gpt2 = tiny_model("tiny:gpt2")
    a, w, g = (locate(m, "block_output", 1) for m in (small, wide, gpt2))
    assert a.width != w.width and a != w
    assert a.width == g.width and a.family != g.family and a != g
    assert dataclasses.replace(a, family=g.family) == g  # the family is what tells them apart
    assert len({a, w, g}) == 3


def test_an_address_hash_is_kept_once_and_never_travels(tiny_model: Load, tmp_path: Any) -> None:
    """An address keeps its hash after the first (a plan's reads are keyed by address
    every run), equal to the hash of its compared fields; a pickle or a copy carries
    none of it: a string hashes otherwise in another process, so an address loaded
    there must hash as one made there."""
    import copy
    import subprocess
    import sys

    model = tiny_model("tiny:llama")
    a = locate(model, "block_output", 1)
    compared = tuple(getattr(a, f.name) for f in dataclasses.fields(a) if f.compare)
    assert hash(a) == hash(compared) and "_hash" in vars(a)
    for other in (pickle.loads(pickle.dumps(a)), copy.copy(a), copy.deepcopy(a)):
        assert "_hash" not in vars(other) and other == a and hash(other) == hash(a)
    assert "_hash" not in vars(dataclasses.replace(a, layer=0))
    path = tmp_path / "address.pkl"
    path.write_bytes(pickle.dumps(a))
    script = (
        "import dataclasses, pickle, sys\n"
        f"a = pickle.loads(open({str(path)!r}, 'rb').read())\n"
        "b = dataclasses.replace(a)\n"
        "assert hash(a) == hash(b) and len({a: 1, b: 2}) == 1, (hash(a), hash(b))\n"
    )
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", script],
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
