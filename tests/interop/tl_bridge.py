"""Each TransformerLens hook the table maps, read through TransformerLens's
TransformerBridge and through causalab_mini on the same tiny checkpoint and the same
tokens, compared: ``python tests/interop/tl_bridge.py [model_type ...] --out FILE``.

Run by ``nox -s transformer_lens``, in a venv where transformer_lens is installed
beside the project (it is never a dependency). Without model types it takes every
causal-LM model type whose tiny checkpoint's class the bridge adapts. Writes one JSON
record per model type: the hooks compared and the largest relative difference
(max |bridge - ours| / max |ours|) among them, those over the tolerance, the hooks the
table refuses on that family, the bridge's hooks the table does not know, and why a
model type could not be compared."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

TOLERANCE = 1e-5
TEXT = "The quick brown fox jumps over the lazy dog"


def bridge_types() -> list[str]:
    """The causal-LM model types whose tiny checkpoint's class the bridge adapts."""
    from transformer_lens.factories.architecture_adapter_factory import SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from causalab_mini.tools.tiny import causal_lm_model_types

    out = []
    for model_type in causal_lm_model_types():
        if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) in SUPPORTED_ARCHITECTURES:
            out.append(model_type)
    return out


def difference(theirs: Any, ours: Any, split: bool) -> float:
    """max |theirs - ours| / max |ours|, over the entries both hold as finite values
    above -1e9 (a masked score is -inf on one side, the dtype's minimum on the other);
    inf where the shapes differ."""
    t = theirs.detach().float()
    t = t.flatten(-2) if split else t
    o = ours.detach().float()
    if t.shape != o.shape:
        return float("inf")
    kept = t.isfinite() & o.isfinite() & (t > -1e9) & (o > -1e9)
    if not bool(kept.any()):
        return float("inf")
    return float((t - o)[kept].abs().max() / o[kept].abs().max().clamp_min(1e-30))


def detail(theirs: Any, ours: Any) -> str:
    """What a difference looks like: both shapes, and whether the bridge's rows sum to
    one (it holds probabilities where scores were named)."""
    t = theirs.detach().float()
    text = f"bridge {tuple(t.shape)}, ours {tuple(ours.shape)}"
    if t.dim() == 4 and bool(((t >= 0) & (t <= 1)).all()):
        if bool(torch_allclose_rows(t)):
            text += "; the bridge's rows sum to 1 (probabilities)"
    return text


def torch_allclose_rows(t: Any) -> bool:
    import torch

    return bool(torch.allclose(t.sum(-1), torch.ones_like(t.sum(-1)), atol=1e-4))


def compare(model_type: str) -> dict[str, Any]:
    import torch
    from transformer_lens.model_bridge import TransformerBridge

    # the bridge installs torchvision with pip when a processor wants it, which would
    # replace this venv's CPU torch: never here (a model type that needs it fails)
    from transformer_lens.model_bridge.sources.transformers import helpers

    from causalab_mini import Plan, StandardizedTransformer
    from causalab_mini.interop.transformer_lens import HookNameRefused, entry, place_of, split
    from causalab_mini.positions import encode, trace_inputs
    from causalab_mini.tools.tiny import build_tiny

    helpers._ensure_torchvision = lambda: False
    path = build_tiny(model_type)
    model = StandardizedTransformer(f"tiny:{model_type}", enable_attention_probs=True)
    bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
    batch = trace_inputs(model, encode(model, [TEXT]))
    # one unpadded row: no mask is handed over (the bridge's openai-gpt forward differs
    # from the model's own when given a mask of ones)
    assert bool(batch["attention_mask"].all())
    with torch.no_grad():
        _, cache = bridge.run_with_cache(batch["input_ids"])
    figures: dict[str, float] = {}
    refused: dict[str, str] = {}
    unknown: list[str] = []
    lacking: dict[str, str] = {}
    details: dict[str, str] = {}
    for hook, theirs in cache.items():
        pattern, _ = split(hook)
        found = entry(model, pattern)
        if found is None:
            unknown.append(pattern)
            continue
        if "refused" in found:
            refused[pattern] = found["nearest"]
            continue
        try:
            at = place_of(model, hook)
            ours = Plan.of(reads=[at]).run(model, [TEXT])[at]
        except HookNameRefused as error:  # mapped, and this model lacks the place
            lacking[pattern] = str(error).split(": ", 2)[-1][:200]
            continue
        figures[hook] = difference(theirs, ours, bool(found.get("split")))
        if not figures[hook] <= TOLERANCE:
            details[hook] = detail(theirs, ours)
    over = {h: r for h, r in figures.items() if not r <= TOLERANCE}
    return {
        "model_type": model_type,
        "class": type(model._model).__name__ if hasattr(model, "_model") else "",
        "structure": model.block_structure,
        "compared": len(figures),
        "max_rel": max(figures.values(), default=None),
        "over": over,
        "refused": sorted(set(refused)),
        "unknown": sorted(set(unknown)),
        "lacking": lacking,
        "details": details,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_types", nargs="*")
    parser.add_argument("--out", default="tl-bridge.json")
    args = parser.parse_args()
    types = args.model_types or bridge_types()
    records = []
    for model_type in types:
        start = time.perf_counter()
        try:
            record = compare(model_type)
        except Exception as error:  # the bridge or the build could not serve it: say why
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            record = {"model_type": model_type, "error": last[:300]}
        record["seconds"] = round(time.perf_counter() - start, 1)
        records.append(record)
        print(json.dumps(record), flush=True)
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    bad = [r["model_type"] for r in records if r.get("over")]
    print(f"{len(records)} model types, {len(bad)} with a hook over {TOLERANCE}: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
