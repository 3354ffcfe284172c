"""Benchmarks of causalab-mini, every figure a ratio against a baseline of the same run.

    python tests/bench/bench.py --out bench.json        (or: nox -s bench)

Not a test: pytest never collects it (the name does not start with ``test_``), and no
test asserts a time. Four parts, each timed in this one run:

1. tracing overhead: reads of every boundary place at every layer in one trace
   through ``model.internals`` and through a ``Plan``, against the same reads
   hand-written on nnsight's module paths, against a bare PyTorch forward whose
   ``register_forward_hook``s save the same tensors (the floor); the same for writes
   (``layers_mid`` patched at every layer) and for the four attention interiors
   (``locate`` + ``Plan`` against hand-written ``.source``); and, where Python
   overhead dominates (a small model), the cost of one read: (trace with N reads -
   trace with none) / N.
2. resolve cost at scale: ``internals.status()`` and ``locate`` of every component at
   every layer of a 70B-class Llama on the meta device, against building that meta
   model; no forward may run and no weight may load. ``registry model`` on the same
   config, beyond its model construction.
3. tooling: ``registry lint``, ``registry gen --check`` and importing
   ``causalab_mini.generated``, against starting the interpreter; lint and gen --check
   again on a synthetic registry of 200 family files (the package's families cloned
   round-robin, each matching a class of its own), and lint of both with the
   content cache off (every file parsed and checked: the first run after an edit of
   every file, or after an upgrade).
4. sweep throughput: pending (the sweep command is not there yet).

Parts run on request (``--only``): ``engines`` and ``seam`` (the hooks engine against
a bare forward), ``grid`` (``interchange.grid`` against the bare-forward bound of its
batches and one interchange per cell) and ``grid_tl`` (the same grids against
TransformerLens's cached patching grid; ``--tl-python`` runs it in a venv that has
transformer_lens, never a dependency).

Variants of one figure run interleaved (A B C, B C A, ...) so that load from other
processes falls on all of them alike; each figure reports min and median over the
repeats, and a ratio of mins and a ratio of medians. A target is judged on the ratio
of mins, the figure least disturbed by other work on the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# The models of part 1 (built locally by causalab_mini.tools.tiny, cached after the first run).
READS_MODEL = {
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "max_position_embeddings": 256,
}
READS_BATCH, READS_SEQ = 4, 128
SMALL_MODEL = {"num_hidden_layers": 8}  # the tiny default: hidden 64, 4 heads (2 kv)
SMALL_BATCH, SMALL_SEQ = 1, 8
# Part 2: a 70B-class Llama config, never given weights.
BIG_CONFIG = {
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}

TARGETS = {
    "reads": 1.05,
    "reads_plan": 1.05,
    "writes": 1.05,
    "writes_plan": 1.05,
    "interiors": 1.05,
    "per_read": 1.10,
    "resolve": 0.10,
    "registry_model_s": 2.0,
    "lint_s": 0.5,
    "gen_check_s": 0.5,
    "import_s": 0.050,
    # `registry lint` against `python -c pass` (issue 12): the registry as it is, and a
    # synthetic one of 200 family files
    "lint_ratio": 8.0,
    "lint_ratio_200": 10.0,
}
SYNTHETIC_FAMILIES = 200


# ---------------------------------------------------------------------- timing


def stats(values: list[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "n": len(values)}


def ratio(a: list[float], b: list[float]) -> dict[str, float]:
    return {
        "min": min(a) / min(b),
        "median": statistics.median(a) / statistics.median(b),
    }


def cpu_now() -> float:
    """CPU seconds of this process (all its threads) and of its finished children."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


# CPU seconds of every timed call, by the id of its wall-time table: recorded beside
# the wall times, which are what the figures judge; on a machine that other work keeps
# busy the CPU ratios show how much of a wall ratio is that work.
CPU: dict[int, dict[str, list[float]]] = {}


def interleaved(
    variants: dict[str, Callable[[], Any]], repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Wall time of each variant ``repeats`` times, rotating their order every round."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    enabled = gc.isenabled()
    gc.collect()
    gc.freeze()  # what exists now is never scanned again: each round's collect is cheap
    try:
        for r in range(repeats):
            gc.collect()  # once a round, never inside a timed call
            gc.disable()
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start, start_cpu = time.perf_counter(), cpu_now()
                variants[name]()
                times[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_now() - start_cpu)
            if enabled:
                gc.enable()
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    CPU[id(times)] = cpu
    return times


def timing(times: dict[str, list[float]]) -> dict[str, Any]:
    """Wall and CPU statistics of every variant."""
    cpu = CPU.get(id(times), {})
    return {
        name: {"wall": stats(values), **({"cpu": stats(cpu[name])} if name in cpu else {})}
        for name, values in times.items()
    }


def figure(
    times: dict[str, list[float]],
    numerator: str,
    baseline: str,
    target: float | None,
) -> dict[str, Any]:
    cpu = CPU.get(id(times))
    r = ratio(times[numerator], times[baseline])
    out: dict[str, Any] = {
        "ratio": r,
        "numerator": numerator,
        "baseline": baseline,
        "target": target,
        "met": None if target is None else r["min"] <= target,
    }
    if cpu is not None:
        out["ratio_cpu"] = ratio(cpu[numerator], cpu[baseline])
    return out


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("nnterp", "transformers", "torch", "nnsight"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:
        pass


# ---------------------------------------------------------------------- part 1


def _tokens(batch: int, seq: int, vocab: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(16, vocab - 16, (batch, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, tuple) else value


# The boundary rows of a pre-norm Llama block, hand-written on nnsight's module paths
# (row name -> how to read it from the layer's Envoy). In forward order.
HAND_LAYER: dict[str, Callable[[Any], Any]] = {
    "layers_input": lambda layer: layer.input,
    "attentions_norm_output": lambda layer: layer.input_layernorm.output,
    "attentions_input": lambda layer: layer.self_attn.input,
    "attentions_premix": lambda layer: layer.self_attn.o_proj.input,
    "attentions_output": lambda layer: layer.self_attn.output[0],
    "layers_mid": lambda layer: layer.post_attention_layernorm.input,
    "mlps_norm_output": lambda layer: layer.post_attention_layernorm.output,
    "mlps_input": lambda layer: layer.mlp.input,
    "mlps_activation": lambda layer: layer.mlp.act_fn.output,
    "mlps_neurons": lambda layer: layer.mlp.down_proj.input,
    "mlps_output": lambda layer: layer.mlp.output,
    "layers_output": lambda layer: _first(layer.output),
}
HAND_BEFORE: dict[str, Callable[[Any], Any]] = {
    "embeddings_input": lambda model: model.model.embed_tokens.input,
    "embeddings_output": lambda model: model.model.embed_tokens.output,
}
HAND_AFTER: dict[str, Callable[[Any], Any]] = {
    "ln_final_output": lambda model: model.model.norm.output,
    "lm_head_output": lambda model: model.lm_head.output,
    "logits": lambda model: model.output["logits"],
}
# The same tensors for the bare-PyTorch floor: (child path of the layer or model,
# "in" for a forward pre-hook's first argument, "out" for a forward hook's output).
TORCH_LAYER: dict[str, tuple[str, str]] = {
    "layers_input": ("", "in"),
    "attentions_norm_output": ("input_layernorm", "out"),
    "attentions_input": ("self_attn", "in"),
    "attentions_premix": ("self_attn.o_proj", "in"),
    "attentions_output": ("self_attn", "out"),
    "layers_mid": ("post_attention_layernorm", "in"),
    "mlps_norm_output": ("post_attention_layernorm", "out"),
    "mlps_input": ("mlp", "in"),
    "mlps_activation": ("mlp.act_fn", "out"),
    "mlps_neurons": ("mlp.down_proj", "in"),
    "mlps_output": ("mlp", "out"),
    "layers_output": ("", "out"),
}
TORCH_MODEL: dict[str, tuple[str, str]] = {
    "embeddings_input": ("model.embed_tokens", "in"),
    "embeddings_output": ("model.embed_tokens", "out"),
    "ln_final_output": ("model.norm", "out"),
    "lm_head_output": ("lm_head", "out"),
}


def _module(root: Any, path: str) -> Any:
    return root.get_submodule(path) if path else root


class TorchHooks:
    """A bare forward of the same checkpoint (its own copy, never wrapped by nnsight),
    with hooks that save (or overwrite) the same tensors."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()
        self.layers = list(self.hf.model.layers)

    def reads(
        self, inputs: dict[str, Any], before: list[str], per: list[str], after: list[str]
    ) -> list[Any]:
        import torch

        layers = len(self.layers)
        saved: dict[tuple[str, int | None], Any] = {}
        handles = []

        def add(module: Any, key: tuple[str, int | None], kind: str) -> None:
            if kind == "in":

                def pre(_m: Any, args: Any, kwargs: Any) -> None:
                    saved[key] = args[0] if args else next(iter(kwargs.values()))

                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            else:

                def post(_m: Any, _args: Any, output: Any) -> None:
                    saved[key] = _first(output)

                handles.append(module.register_forward_hook(post))

        for name in [*before, *after]:
            if name in TORCH_MODEL:
                path, kind = TORCH_MODEL[name]
                add(_module(self.hf, path), (name, None), kind)
        for name in per:
            path, kind = TORCH_LAYER[name]
            for i in range(layers):
                add(_module(self.layers[i], path), (name, i), kind)
        try:
            with torch.no_grad():
                saved[("logits", None)] = self.hf(**inputs)["logits"]
        finally:
            for h in handles:
                h.remove()
        return [
            *(saved[(n, None)] for n in before),
            *(saved[(n, i)] for i in range(layers) for n in per),
            *(saved[(n, None)] for n in after),
        ]

    def write_mid(self, values: list[Any], inputs: dict[str, Any]) -> Any:
        import torch

        handles = []
        for i, layer in enumerate(self.layers):

            def pre(_m: Any, args: Any, kwargs: Any, v: Any = values[i]) -> None:
                (args[0] if args else next(iter(kwargs.values())))[...] = v

            handles.append(
                layer.post_attention_layernorm.register_forward_pre_hook(pre, with_kwargs=True)
            )
        try:
            with torch.no_grad():
                return self.hf(**inputs)["logits"]
        finally:
            for h in handles:
                h.remove()

    def forward(self, inputs: dict[str, Any]) -> Any:
        import torch

        with torch.no_grad():
            return self.hf(**inputs)["logits"]


def _split_rows(model: Any) -> tuple[list[str], list[str], list[str]]:
    """The available tensor rows: whole-model before the layers, per layer, after."""
    internals = model.internals
    status = internals.status()
    names = [n for n in internals if status[n] is None and internals[n].row.io.value != "module"]
    per = [n for n in names if internals[n].per_layer]
    before = [n for n in names if not internals[n].per_layer and internals[n].row.order < 0]
    after = [n for n in names if not internals[n].per_layer and internals[n].row.order >= 0]
    return before, per, after


def internals_reads(
    model: Any, inputs: Any, before: list[str], per: list[str], after: list[str]
) -> list[Any]:
    internals = model.internals
    out: list[Any] = []
    with model.trace(inputs):
        for name in before:
            out.append(internals[name]().save())
        for i in range(internals.num_layers):
            for name in per:
                out.append(internals[name][i].save())
        for name in after:
            out.append(internals[name]().save())
    return out


def hand_reads(
    model: Any, inputs: Any, before: list[str], per: list[str], after: list[str]
) -> list[Any]:
    out: list[Any] = []
    layer_reads = [HAND_LAYER[n] for n in per]
    with model.trace(inputs):
        for name in before:
            out.append(HAND_BEFORE[name](model).save())
        for i in range(len(model.model.layers)):
            layer = model.model.layers[i]
            for read in layer_reads:
                out.append(read(layer).save())
        for name in after:
            out.append(HAND_AFTER[name](model).save())
    return out


def empty_trace(model: Any, inputs: Any) -> None:
    with model.trace(inputs):
        pass


def _values(out: Any) -> list[Any]:
    if isinstance(out, dict):
        out = list(out.values())
    return [getattr(t, "value", t) for t in out]


def _same(a: list[Any], b: list[Any]) -> bool:
    import torch

    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def bench_boundary(repeats: int) -> dict[str, Any]:
    """Reads of every boundary place at every layer, and writes of layers_mid."""
    import torch

    from causalab_mini import StandardizedTransformer
    from causalab_mini.components import Plan, locate
    from causalab_mini.tools.tiny import build_tiny

    out: dict[str, Any] = {}

    # -- reads and writes at module boundaries
    log("part 1: tiny llama 4x256, batch 4, seq 128")
    path = build_tiny("llama", overrides=READS_MODEL)
    model = StandardizedTransformer(str(path))
    inputs = _tokens(READS_BATCH, READS_SEQ, model._model.config.vocab_size)
    before, per, after = _split_rows(model)
    n_layers = model.internals.num_layers
    floor = TorchHooks(path)

    # the same places as components, for the Plan
    plan_components = {
        "block_input": "layers_input",
        "attention_input_norm": "attentions_norm_output",
        "attention_premix": "attentions_premix",
        "attention_output": "attentions_output",
        "block_mid": "layers_mid",
        "mlp_input_norm": "mlps_norm_output",
        "mlp_input": "mlps_input",
        "mlp_activation": "mlps_activation",
        "mlp_neuron_output": "mlps_neurons",
        "mlp_output": "mlps_output",
        "block_output": "layers_output",
    }
    whole = {"input_ids": "embeddings_input", "embeddings": "embeddings_output"}
    whole_after = {"ln_final": "ln_final_output", "lm_head": "lm_head_output", "logits": "logits"}
    addresses = [locate(model, c) for c in whole]
    addresses += [locate(model, c, i) for i in range(n_layers) for c in plan_components]
    addresses += [locate(model, c) for c in whole_after]
    plan = Plan.of(reads=addresses)
    plan_per = list(plan_components.values())
    plan_rows = (list(whole.values()), plan_per, list(whole_after.values()))

    a = internals_reads(model, inputs, before, per, after)
    b = hand_reads(model, inputs, before, per, after)
    c = floor.reads(inputs, before, per, after)
    d = _values(plan.run(model, inputs))
    e = hand_reads(model, inputs, *plan_rows)
    checks = {
        "reads: internals == hand-written": _same(_values(a), _values(b)),
        "reads: hooks == hand-written": _same(c, _values(b)),
        "reads: plan == hand-written": _same(d, _values(e)),
    }
    log(f"reads: {len(a)} tensors per trace ({len(plan.steps)} through the plan)")
    times = interleaved(
        {
            "torch_hooks": lambda: floor.reads(inputs, before, per, after),
            "nnsight_hand": lambda: hand_reads(model, inputs, before, per, after),
            "internals": lambda: internals_reads(model, inputs, before, per, after),
            "nnsight_hand_plan_rows": lambda: hand_reads(model, inputs, *plan_rows),
            "plan": lambda: plan.run(model, inputs),
        },
        repeats,
    )
    out["reads"] = {
        "model": {**READS_MODEL, "batch": READS_BATCH, "seq": READS_SEQ},
        "reads_per_trace": len(a),
        "plan_reads_per_trace": len(plan.steps),
        "times": timing(times),
        "figures": {
            "internals / nnsight hand-written": figure(
                times, "internals", "nnsight_hand", TARGETS["reads"]
            ),
            "plan / nnsight hand-written": figure(
                times, "plan", "nnsight_hand_plan_rows", TARGETS["reads_plan"]
            ),
            "nnsight hand-written / torch hooks": figure(
                times, "nnsight_hand", "torch_hooks", None
            ),
            "internals / torch hooks": figure(times, "internals", "torch_hooks", None),
        },
    }

    # -- writes: layers_mid patched at every layer with the values of another input
    other = _tokens(READS_BATCH, READS_SEQ, model._model.config.vocab_size - 1)
    other["input_ids"] = other["input_ids"].flip(1)
    saved: list[Any] = []
    with model.trace(other):
        for i in range(n_layers):
            saved.append(model.internals["layers_mid"][i].save())
    clean = [getattr(t, "value", t) for t in saved]
    mid = model.internals["layers_mid"]
    logits = model.internals["logits"]
    mid_addresses = [locate(model, "block_mid", i) for i in range(n_layers)]
    write_plan = Plan.of(
        reads=[locate(model, "logits")], writes=list(zip(mid_addresses, clean, strict=True))
    )

    def internals_writes() -> Any:
        with model.trace(inputs):
            for i in range(n_layers):
                mid[i] = clean[i]
            result = logits().save()
        return result

    def hand_writes() -> Any:
        with model.trace(inputs):
            for i in range(n_layers):
                model.model.layers[i].post_attention_layernorm.input[...] = clean[i]
            result = model.output["logits"].save()
        return result

    def plan_writes() -> Any:
        return next(iter(write_plan.run(model, inputs).values()))

    w = [internals_writes(), hand_writes(), floor.write_mid(clean, inputs), plan_writes()]
    w = [getattr(t, "value", t) for t in w]
    checks["writes: internals == hand-written == hooks == plan"] = all(
        torch.equal(w[0], x) for x in w[1:]
    )
    checks["writes: the patch changes the logits"] = not torch.equal(w[0], floor.forward(inputs))
    times = interleaved(
        {
            "torch_hooks": lambda: floor.write_mid(clean, inputs),
            "nnsight_hand": hand_writes,
            "internals": internals_writes,
            "plan": plan_writes,
        },
        repeats,
    )
    out["writes"] = {
        "writes_per_trace": n_layers,
        "times": timing(times),
        "figures": {
            "internals / nnsight hand-written": figure(
                times, "internals", "nnsight_hand", TARGETS["writes"]
            ),
            "plan / nnsight hand-written": figure(
                times, "plan", "nnsight_hand", TARGETS["writes_plan"]
            ),
            "nnsight hand-written / torch hooks": figure(
                times, "nnsight_hand", "torch_hooks", None
            ),
        },
    }
    out["checks"] = checks
    return out


def bench_interiors(repeats: int) -> dict[str, Any]:
    """The four interiors (eager attention, so the scores exist): locate + Plan against
    the same tensors hand-written through ``.source``, flattened the way the Plan hands
    them on."""
    from causalab_mini import StandardizedTransformer, compat
    from causalab_mini.components import Plan, locate
    from causalab_mini.ops import find_op, op_name
    from causalab_mini.tools.tiny import build_tiny

    log("part 1: interiors (eager attention)")
    path = build_tiny("llama", overrides=READS_MODEL)
    model = StandardizedTransformer(str(path), attn_implementation="eager")
    inputs = _tokens(READS_BATCH, READS_SEQ, model._model.config.vocab_size)
    n_layers = model.internals.num_layers
    floor = TorchHooks(path, attn_implementation="eager")
    kinds = ["attention_query", "attention_key", "attention_scores", "attention_z"]
    plan = Plan.of(reads=[locate(model, k, i) for i in range(n_layers) for k in kinds])
    # the attention call's name is the installed nnsight's (attention_interface_1 on
    # 0.8, which also numbers the assignment that picks the function; _0 before)
    interface = op_name(
        model.layers[0].self_attn,
        "attention_interface(",
        row="bench",
        module="self_attn",
        model_class="bench",
    )
    # nnsight hands a trace body's new names back to the frame, not to closures
    names: dict[str, str] = {}
    with model.trace(inputs):
        found = find_op(
            getattr(model.model.layers[0].self_attn.source, interface).source,
            "nn.functional.softmax(",
            row="bench",
            module=f"self_attn.{interface}",
            model_class="bench",
        )
        names["softmax"] = str(found.path.split(".")[-1])
    softmax = names["softmax"]
    # nnsight 0.8 hands an operation its callee after its inputs: the nested source
    # opens after the inputs are read there, before them on 0.6/0.7
    callee_after_inputs = compat.callee_after_inputs()

    def hand() -> list[Any]:
        saved: list[Any] = []
        with model.trace(inputs):
            for i in range(n_layers):
                call = getattr(model.model.layers[i].self_attn.source, interface)
                if not callee_after_inputs:
                    inner = call.source
                args = call.inputs[0]
                if callee_after_inputs:
                    inner = call.source
                saved.append(args[1].transpose(1, 2).flatten(2).save())
                saved.append(args[2].transpose(1, 2).flatten(2).save())
                saved.append(getattr(inner, softmax).inputs[0][0].save())
                saved.append(call.output[0].flatten(2).save())
        return saved

    same = _same(_values(plan.run(model, inputs)), _values(hand()))
    times = interleaved(
        {
            "torch_forward": lambda: floor.forward(inputs),
            "nnsight_hand": hand,
            "plan": lambda: plan.run(model, inputs),
        },
        repeats,
    )
    return {
        "reads_per_trace": len(plan.steps),
        "interface_op": interface,
        "softmax_op": softmax,
        "check": same,
        "times": timing(times),
        "figures": {
            "plan / nnsight hand-written .source": figure(
                times, "plan", "nnsight_hand", TARGETS["interiors"]
            ),
            "nnsight hand-written / bare forward (no capture)": figure(
                times, "nnsight_hand", "torch_forward", None
            ),
        },
    }


def bench_per_read(repeats: int) -> dict[str, Any]:
    """Where Python overhead dominates (a small model): the cost of one read,
    (trace with N reads - trace with none) / N."""
    from causalab_mini import StandardizedTransformer
    from causalab_mini.tools.tiny import build_tiny

    log("part 1: small llama 8x64, seq 8: the cost of one read")
    model = StandardizedTransformer(str(build_tiny("llama", overrides=SMALL_MODEL)))
    inputs = _tokens(SMALL_BATCH, SMALL_SEQ, model._model.config.vocab_size)
    before, per, after = _split_rows(model)
    first = internals_reads(model, inputs, before, per, after)
    n_reads = len(first)
    same = _same(_values(first), _values(hand_reads(model, inputs, before, per, after)))
    times = interleaved(
        {
            "empty_trace": lambda: empty_trace(model, inputs),
            "nnsight_hand": lambda: hand_reads(model, inputs, before, per, after),
            "internals": lambda: internals_reads(model, inputs, before, per, after),
        },
        repeats,
        warmup=3,
    )

    # The same reads, timed from inside the trace body by the CPU clock of the thread
    # nnsight runs it in: the model's compute (another thread) and waiting are not in
    # it, nor is other work on the machine, so it shows the Python cost of a read.
    layer_reads = [HAND_LAYER[n] for n in per]
    internals = model.internals

    def body_internals(acc: list[float]) -> None:
        with model.trace(inputs):
            for i in range(internals.num_layers):
                for name in per:
                    start = time.thread_time()
                    internals[name][i].save()
                    acc.append(time.thread_time() - start)

    def body_hand(acc: list[float]) -> None:
        with model.trace(inputs):
            for i in range(len(model.model.layers)):
                start = time.thread_time()
                layer = model.model.layers[i]
                acc.append(time.thread_time() - start)
                for read in layer_reads:
                    start = time.thread_time()
                    read(layer).save()
                    acc.append(time.thread_time() - start)

    thread: dict[str, list[float]] = {"internals": [], "nnsight_hand": []}
    n_body = internals.num_layers * len(per)
    for _ in range(max(10, repeats // 4)):
        for name, body in (("internals", body_internals), ("nnsight_hand", body_hand)):
            acc: list[float] = []
            body(acc)
            thread[name].append(sum(acc) / n_body)

    def per_read(name: str, how: Callable[[list[float]], float]) -> float:
        return (how(times[name]) - how(times["empty_trace"])) / n_reads

    cost = {
        name: {"min": per_read(name, min), "median": per_read(name, statistics.median)}
        for name in ("nnsight_hand", "internals")
    }
    r = {k: cost["internals"][k] / cost["nnsight_hand"][k] for k in ("min", "median")}
    cpu = CPU[id(times)]

    def cpu_read(name: str, how: Callable[[list[float]], float]) -> float:
        return (how(cpu[name]) - how(cpu["empty_trace"])) / n_reads

    r_cpu = {
        k: cpu_read("internals", how) / cpu_read("nnsight_hand", how)
        for k, how in (("min", min), ("median", statistics.median))
    }
    return {
        "model": {**SMALL_MODEL, "hidden_size": 64, "batch": SMALL_BATCH, "seq": SMALL_SEQ},
        "reads_per_trace": n_reads,
        "check": same,
        "times": timing(times),
        "per_read_seconds": cost,
        "thread_cpu_per_read_seconds": {k: stats(v) for k, v in thread.items()},
        "figures": {
            "internals / nnsight hand-written, worker-thread CPU per read": {
                "ratio": ratio(thread["internals"], thread["nnsight_hand"]),
                "numerator": "internals",
                "baseline": "nnsight_hand",
                "target": None,
                "met": None,
            },
            "internals / nnsight hand-written, per read": {
                "ratio": r,
                "ratio_cpu": r_cpu,
                "numerator": "internals",
                "baseline": "nnsight_hand",
                "target": TARGETS["per_read"],
                "met": r["min"] <= TARGETS["per_read"],
            },
        },
    }


def bench_tracing(repeats: int, small_repeats: int) -> dict[str, Any]:
    out = bench_boundary(repeats)
    out["interiors"] = bench_interiors(repeats)
    out["checks"]["interiors: plan == hand-written .source"] = out["interiors"]["check"]
    out["per_read"] = bench_per_read(small_repeats)
    out["checks"]["small model: internals == hand-written"] = out["per_read"]["check"]
    return out


# ---------------------------------------------------------------------- engines


ENGINE_READS = (
    "block_input",
    "attention_output",
    "block_mid",
    "mlp_input",
    "mlp_output",
    "block_output",
)  # x 4 layers: 24 residual-stream reads
ENGINE_ROWS = {
    "block_input": "layers_input",
    "attention_output": "attentions_output",
    "block_mid": "layers_mid",
    "mlp_input": "mlps_input",
    "mlp_output": "mlps_output",
    "block_output": "layers_output",
}
INTERCHANGE_PAIRS = 32
GRID_PAIRS = 8


def _pairs(model: Any, n: int) -> tuple[list[str], list[str]]:
    """``n`` (base, source) pairs of equal token length from the sweep's sentences."""
    from causalab_mini.tools.checks.positions import equal_length_pairs

    found = equal_length_pairs(model)
    assert found is not None, "no two sentences of equal length under this tokenizer"
    bases, sources = found
    return [bases[i % len(bases)] for i in range(n)], [sources[i % len(sources)] for i in range(n)]


def bench_engines(repeats: int) -> dict[str, Any]:
    """The hooks engine against the bare forward and the nnsight engine: 24 residual
    reads, a 1-position interchange of 32 pairs, model.internals against hand-written
    nnsight on the same 24 rows, and a (layer x position) patching grid's throughput."""
    import torch

    from causalab_mini import StandardizedTransformer
    from causalab_mini.components import Plan, locate
    from causalab_mini.interchange import interchange
    from causalab_mini.positions import encode, resolve, trace_inputs
    from causalab_mini.tools.tiny import build_tiny

    log("engines: tiny llama 4x256, batch 4, seq 128")
    path = build_tiny("llama", overrides=READS_MODEL)
    model = StandardizedTransformer(str(path))
    inputs = _tokens(READS_BATCH, READS_SEQ, model._model.config.vocab_size)
    floor = TorchHooks(path)
    n = model.internals.num_layers
    addresses = [locate(model, c, i) for i in range(n) for c in ENGINE_READS]
    plan = Plan.of(reads=addresses)
    internals = model.internals
    rows = [internals[ENGINE_ROWS[c]] for c in ENGINE_READS]
    hand = [HAND_LAYER[ENGINE_ROWS[c]] for c in ENGINE_READS]

    def internals_reads() -> list[Any]:
        out = []
        with model.trace(inputs):
            for i in range(n):
                for row in rows:
                    out.append(row[i].save())
        return out

    def hand_reads() -> list[Any]:
        out = []
        with model.trace(inputs):
            for i in range(n):
                layer = model.model.layers[i]
                for read in hand:
                    out.append(read(layer).save())
        return out

    def no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return fn()

        return run

    hooks_reads = _values(plan.run(model, inputs, engine="hooks"))
    checks = {
        "engines: hooks reads == nnsight reads": _same(
            hooks_reads, _values(plan.run(model, inputs))
        ),
        "engines: internals == hand-written (24 rows)": _same(
            _values(internals_reads()), _values(hand_reads())
        ),
    }
    times = interleaved(
        {
            "bare": no_grad(lambda: floor.forward(inputs)),
            "hooks": no_grad(lambda: plan.run(model, inputs, engine="hooks")),
            "nnsight_plan": no_grad(lambda: plan.run(model, inputs)),
            "internals": no_grad(internals_reads),
            "nnsight_hand": no_grad(hand_reads),
        },
        repeats,
    )
    out: dict[str, Any] = {
        "reads": {
            "model": {**READS_MODEL, "batch": READS_BATCH, "seq": READS_SEQ},
            "reads_per_forward": len(addresses),
            "times": timing(times),
            "figures": {
                "hooks engine / bare forward": figure(times, "hooks", "bare", 1.05),
                "nnsight engine / bare forward": figure(times, "nnsight_plan", "bare", None),
                "hooks engine / nnsight engine": figure(times, "hooks", "nnsight_plan", None),
                "internals / nnsight hand-written": figure(
                    times, "internals", "nnsight_hand", 1.05
                ),
            },
        }
    }

    # -- a 1-position interchange of 32 pairs, against the bare forward of its batch
    bases, sources = _pairs(model, INTERCHANGE_PAIRS)
    patch = locate(model, "block_output", 1, position={"index": -1})
    batch = trace_inputs(model, encode(model, [*bases, *sources]))
    a = interchange(model, [patch], bases, sources)
    b = interchange(model, [patch], bases, sources, engine="hooks")
    checks["engines: interchange hooks == nnsight"] = bool(torch.equal(a.logits, b.logits))
    tokenizer = model.tokenizer
    texts = [*bases, *sources]

    def bare_from_text() -> Any:
        # what any run from text pays: the tokenizer, then the forward
        ids = tokenizer(texts, return_tensors="pt", padding=True)
        return floor.forward(dict(ids))

    times = interleaved(
        {
            "bare": no_grad(lambda: floor.forward(batch)),
            "bare_text": no_grad(bare_from_text),
            "hooks": no_grad(lambda: interchange(model, [patch], bases, sources, engine="hooks")),
            "nnsight": no_grad(lambda: interchange(model, [patch], bases, sources)),
        },
        repeats,
    )
    out["interchange"] = {
        "pairs": INTERCHANGE_PAIRS,
        "rows": int(batch["input_ids"].shape[0]),
        "seq": int(batch["input_ids"].shape[1]),
        "times": timing(times),
        "figures": {
            "hooks interchange / bare forward": figure(times, "hooks", "bare", 1.05),
            "hooks interchange / tokenizer + bare forward": figure(
                times, "hooks", "bare_text", 1.05
            ),
            "tokenizer + bare forward / bare forward": figure(times, "bare_text", "bare", None),
            "nnsight interchange / bare forward": figure(times, "nnsight", "bare", None),
            "hooks interchange / nnsight interchange": figure(times, "hooks", "nnsight", None),
        },
    }

    # -- a full (layer x position) activation-patching grid: one interchange per cell
    # one length for every pair: each position names a token in every row
    bases, sources = ([texts[0]] * GRID_PAIRS for texts in _pairs(model, 1))
    positions = len(resolve(model, [bases[0]], "all")[0])
    cells = [
        locate(model, "block_input", layer, position={"index": p})
        for layer in range(n)
        for p in range(positions)
    ]

    def grid(engine: str) -> Callable[[], Any]:
        def run() -> list[Any]:
            with torch.no_grad():
                return [
                    interchange(model, [c], bases, sources, engine=engine).logits for c in cells
                ]

        return run

    checks["engines: patching grid hooks == nnsight"] = _same(grid("hooks")(), grid("nnsight")())
    grid_repeats = max(3, repeats // 8)
    variants = {"hooks": grid("hooks"), "nnsight": grid("nnsight")}
    lens = _lens_grid(path, model, cells, bases, sources)
    if isinstance(lens, str):
        lens_note = lens
    else:
        variants["transformer_lens"] = lens
        # TransformerLens runs eager attention (its hooks see the scores): close, not equal
        ours = torch.stack(grid("nnsight")())
        theirs = torch.stack(lens())
        lens_note = f"TransformerLens run_with_hooks, max |logits diff| {float((ours - theirs).abs().max()):.2e}"
        checks["engines: patching grid TransformerLens ~= nnsight (atol 1e-4)"] = bool(
            torch.allclose(ours, theirs, atol=1e-4)
        )
    times = interleaved(variants, grid_repeats, 1)
    patches = len(cells) * GRID_PAIRS
    out["grid"] = {
        "cells": len(cells),
        "pairs": GRID_PAIRS,
        "patches": patches,
        "times": timing(times),
        "patches_per_s": {
            engine: patches / statistics.median(values) for engine, values in times.items()
        },
        "transformer_lens": lens_note,
        "figures": {
            "hooks grid / nnsight grid": figure(times, "hooks", "nnsight", None),
            **(
                {
                    "hooks grid / TransformerLens grid": figure(
                        times, "hooks", "transformer_lens", None
                    ),
                    "nnsight grid / TransformerLens grid": figure(
                        times, "nnsight", "transformer_lens", None
                    ),
                }
                if "transformer_lens" in times
                else {}
            ),
        },
    }
    out["checks"] = checks
    return out


SEAM_SHAPES = ((1, 16), (4, 128))


def interleaved_gc_on(
    variants: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Wall time of each variant ``repeats`` times, rotating their order every round,
    with the garbage collector left as a user has it (on, never frozen)."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start, start_cpu = time.perf_counter(), time.process_time()
            variants[name]()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    CPU[id(times)] = cpu
    return times


def bench_seam(repeats: int) -> dict[str, Any]:
    """The engine seam's cost (issue 31): 24 residual reads on the 4-layer Llama of the
    engines part, at 1x16 and 4x128 tokens, against a pure transformers forward of the
    same checkpoint (never wrapped by nnsight) and against raw torch hooks doing the
    same reads (the mid-stream copied, as the hooks engine must: the block adds to it
    in place later); per-read overhead in microseconds; gc on."""
    import torch

    from causalab_mini import StandardizedTransformer
    from causalab_mini.components import Plan, locate
    from causalab_mini.tools.tiny import build_tiny

    path = build_tiny("llama", overrides=READS_MODEL)
    model = StandardizedTransformer(str(path))
    floor = TorchHooks(path)
    n = model.internals.num_layers
    addresses = [locate(model, c, i) for i in range(n) for c in ENGINE_READS]
    plan = Plan.of(reads=addresses)
    per = [ENGINE_ROWS[c] for c in ENGINE_READS]
    rows = [model.internals[name] for name in per]
    hand = [HAND_LAYER[name] for name in per]

    def torch_reads(inputs: dict[str, Any]) -> list[Any]:
        values = floor.reads(inputs, [], per, [])
        # the mid-stream is the residual the block adds the MLP output to in place
        return [
            v.clone() if i % len(per) == per.index("layers_mid") else v
            for i, v in enumerate(values)
        ]

    out: dict[str, Any] = {"reads_per_forward": len(addresses), "shapes": {}}
    for batch, seq in SEAM_SHAPES:
        log(f"seam: 24 reads, {batch}x{seq}")
        inputs = _tokens(batch, seq, model._model.config.vocab_size)

        def internals_reads(inputs: Any = inputs) -> list[Any]:
            saved = []
            with model.trace(inputs):
                for i in range(n):
                    for row in rows:
                        saved.append(row[i].save())
            return saved

        def hand_reads(inputs: Any = inputs) -> list[Any]:
            saved = []
            with model.trace(inputs):
                for i in range(n):
                    layer = model.model.layers[i]
                    for read in hand:
                        saved.append(read(layer).save())
            return saved

        def no_grad(fn: Callable[[], Any]) -> Callable[[], Any]:
            def run() -> Any:
                with torch.no_grad():
                    return fn()

            return run

        hooks_values = _values(plan.run(model, inputs, engine="hooks"))
        checks = {
            "hooks engine == nnsight engine": _same(hooks_values, _values(plan.run(model, inputs))),
            "hooks engine == raw torch hooks": _same(
                hooks_values, torch_reads(inputs)[: len(hooks_values)]
            ),
            "internals == hand-written": _same(_values(internals_reads()), _values(hand_reads())),
        }
        times = interleaved_gc_on(
            {
                "bare": no_grad(lambda inputs=inputs: floor.forward(inputs)),
                "torch_hooks": no_grad(lambda inputs=inputs: torch_reads(inputs)),
                "hooks": no_grad(lambda inputs=inputs: plan.run(model, inputs, engine="hooks")),
                "nnsight": no_grad(lambda inputs=inputs: plan.run(model, inputs)),
                "internals": no_grad(internals_reads),
                "nnsight_hand": no_grad(hand_reads),
            },
            repeats,
        )
        med = {k: statistics.median(v) for k, v in times.items()}
        cpu = {k: statistics.median(v) for k, v in CPU[id(times)].items()}
        out["shapes"][f"{batch}x{seq}"] = {
            "median_cpu_ms": {k: 1e3 * v for k, v in cpu.items()},
            "cpu_figures": {
                "hooks engine / bare forward": cpu["hooks"] / cpu["bare"],
                "hooks engine / raw torch hooks": cpu["hooks"] / cpu["torch_hooks"],
                "internals / nnsight hand-written": cpu["internals"] / cpu["nnsight_hand"],
            },
            "per_read_cpu_us": {
                k: 1e6 * (cpu[k] - cpu["bare"]) / len(addresses)
                for k in ("torch_hooks", "hooks", "nnsight", "internals", "nnsight_hand")
            },
            "checks": checks,
            "median_ms": {k: 1e3 * v for k, v in med.items()},
            "per_read_us": {
                k: 1e6 * (med[k] - med["bare"]) / len(addresses)
                for k in ("torch_hooks", "hooks", "nnsight", "internals", "nnsight_hand")
            },
            "figures": {
                "hooks engine / bare forward": med["hooks"] / med["bare"],
                "hooks engine / raw torch hooks": med["hooks"] / med["torch_hooks"],
                "raw torch hooks / bare forward": med["torch_hooks"] / med["bare"],
                "nnsight engine / bare forward": med["nnsight"] / med["bare"],
                "internals / nnsight hand-written": med["internals"] / med["nnsight_hand"],
            },
        }
    return out


# (model overrides, pairs, words of the longest text + 1, positions) of each grid: the
# tiny Llama's texts are 23 tokens (bos and 11 words of 2-3 tokens), the 4-layer's 128
GRID_CASES: dict[str, tuple[dict[str, Any], int, int, int]] = {
    "tiny llama 3 layers, 12 positions, 8 pairs": ({"num_hidden_layers": 3}, 8, 12, 12),
    "4-layer llama, 4 pairs x 128 tokens, 8 positions": (READS_MODEL, 4, 47, 8),
}
GRID_BATCH = 64


def bench_grid(repeats: int) -> dict[str, Any]:
    """Patching grids (issue 37): ``interchange.grid`` against the bare-forward bound of
    the same batches (the source forward and each chunk of patched rows, run as a pure
    transformers forward of the same checkpoint), and against one ``interchange`` per
    cell; interleaved, gc on. Grids: tiny Llama 3 layers x 12 positions x 8 pairs, and
    the 4-layer Llama of the engines part at 4 pairs x 128 tokens (8 positions)."""
    out: dict[str, Any] = {}
    for label, case in GRID_CASES.items():
        out[label] = _grid_case(label, *case, repeats)
    return out


class GridBench:
    """One grid of GRID_CASES, ready to time: the model, its pairs (ragged: three
    lengths), the positions (the last ``n_pos`` tokens), the batch every engine runs,
    and the bare-forward bound of the grid's batches."""

    def __init__(self, overrides: dict[str, Any], pairs: int, words: int, n_pos: int) -> None:
        from causalab_mini import StandardizedTransformer
        from causalab_mini.positions import encode, trace_inputs
        from causalab_mini.tools.tiny import build_tiny

        self.path = build_tiny("llama", overrides=overrides)
        self.model = StandardizedTransformer(str(self.path))
        self.floor = TorchHooks(self.path)
        vocab = [f" w{i}" for i in range(words)]
        self.bases = ["".join(vocab[: words - 1 - (i % 3)]) for i in range(pairs)]
        self.sources = ["".join(reversed(vocab[: words - 1 - (i % 3)])) for i in range(pairs)]
        self.layers = list(range(self.model.internals.num_layers))
        self.specs = [{"index": -1 - j} for j in range(n_pos)]
        self.pairs = pairs
        self.cells = len(self.layers) * n_pos * pairs
        self.inputs = trace_inputs(self.model, encode(self.model, [*self.bases, *self.sources]))
        # the grid's own chunking (batch_size GRID_BATCH, its default token budget for
        # the device the weights are on: loaded first)
        from causalab_mini.hooks import dispatched
        from causalab_mini.patching import rows_per_forward

        dispatched(self.model)
        length = int(self.inputs["input_ids"].shape[1])
        rows = n_pos * pairs
        self.chunk = rows_per_forward(self.model, length, GRID_BATCH, None, rows)
        self.chunks = [min(self.chunk, rows - s) for s in range(0, rows, self.chunk)]
        # the columns the grid's forwards unembed (patching.logits_kept): the tight
        # bound asks the bare forwards for those logits only, as the grid does
        import torch

        from causalab_mini.patching import logits_kept

        frames = encode(self.model, [*self.bases, *self.sources]).frames
        last = torch.tensor([f.real[-1] for f in frames])
        kept = logits_kept(self.model, self.inputs, last)
        self.kept = {} if kept is None else {"logits_to_keep": kept}

    def bound(self, extra: dict[str, Any] | None = None) -> None:
        """The grid's forwards, bare: bases and sources once, then per layer each chunk
        of patched rows (a base each); ``extra`` keywords given to each forward."""
        import torch

        more = extra or {}
        with torch.no_grad():
            self.floor.forward({**self.inputs, **more})
            for _ in self.layers:
                for rows in self.chunks:
                    idx = torch.arange(rows) % self.pairs
                    self.floor.forward({**{k: v[idx] for k, v in self.inputs.items()}, **more})

    def bound_kept(self) -> None:
        """The bound with each forward asked for the logits the grid reads only."""
        self.bound(self.kept)

    def run(self, engine: str) -> Any:
        import torch

        from causalab_mini.interchange import grid

        with torch.no_grad():
            return grid(
                self.model,
                "block_input",
                self.layers,
                self.specs,
                self.bases,
                self.sources,
                engine=engine,
                batch_size=GRID_BATCH,
            )

    def per_cell(self) -> list[Any]:
        import torch

        from causalab_mini.components import locate
        from causalab_mini.interchange import interchange

        with torch.no_grad():
            return [
                interchange(
                    self.model,
                    [locate(self.model, "block_input", layer, position=p)],
                    self.bases,
                    self.sources,
                    engine="hooks",
                ).logits
                for layer in self.layers
                for p in self.specs
            ]


def _grid_figures(cells: int, times: dict[str, list[float]]) -> dict[str, Any]:
    """Medians, patches/s and bound / variant (wall and CPU) of one interleaved run."""
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in CPU[id(times)].items()}
    return {
        "median_ms": {k: 1e3 * v for k, v in med.items()},
        "median_cpu_ms": {k: 1e3 * v for k, v in cpu.items()},
        "patches_per_s": {k: cells / v for k, v in med.items()},
        "bound / grid (wall)": {k: med["bound"] / med[k] for k in med if k != "bound"},
        "bound / grid (cpu)": {k: cpu["bound"] / cpu[k] for k in cpu if k != "bound"},
        "bound / grid (wall, min)": {
            k: min(times["bound"]) / min(v) for k, v in times.items() if k != "bound"
        },
        # the tight bound: the same bare forwards asked for the logits the grid reads
        # only (as the grid's forwards are); 1.0 is a grid that costs exactly those
        "tight bound / grid (wall)": {
            k: med["bound_kept"] / med[k] for k in med if k not in ("bound", "bound_kept")
        }
        if "bound_kept" in med
        else {},
    }


def _grid_case(
    label: str, overrides: dict[str, Any], pairs: int, words: int, n_pos: int, repeats: int
) -> dict[str, Any]:
    import torch

    log(f"grid: {label}")
    g = GridBench(overrides, pairs, words, n_pos)
    a, b = g.run("hooks"), g.run("nnsight")
    cells_equal = torch.equal(a.logits, b.logits)
    one = torch.stack(g.per_cell()).reshape(a.logits.shape)
    worst = float((one - a.logits).abs().max())
    load = os.getloadavg()
    times = interleaved_gc_on(
        {
            "bound": g.bound,
            "bound_kept": g.bound_kept,
            "grid_hooks": lambda: g.run("hooks"),
            "grid_nnsight": lambda: g.run("nnsight"),
            "per_cell_hooks": g.per_cell,
        },
        max(3, repeats // 4),
        warmup=1,
    )
    return {
        "cells": g.cells,
        "batch": list(g.inputs["input_ids"].shape),
        "rows_per_forward": g.chunk,
        "load": [*load, *os.getloadavg()],
        "checks": {"engines equal": cells_equal, "max |grid - per-cell interchange|": worst},
        **_grid_figures(g.cells, times),
    }


# TransformerLens's grid against ours: its logits may differ from transformers' own
# forward by float32 rounding (it runs the checkpoint through its bridge); a grid cell
# is within this of ours (absolute, on logits of magnitude about 1: some 80 float32
# steps, well above the clean forwards' measured difference and far below any effect).
LENS_TOLERANCE = 1e-5


def bench_grid_tl(repeats: int, tl_python: str | None) -> dict[str, Any]:
    """Patching grids against TransformerLens (issue 37): its grid with the sources'
    activations cached once (``run_with_cache`` of the bases and sources, then
    ``run_with_hooks`` per layer with that layer's cells as rows of the same chunks as
    ours, and per cell with the pairs as rows, as its patching helpers do), our grid on
    both engines, and the bare-forward bound of our batches; interleaved, gc on, the
    same checkpoints as the grid part. TransformerLens is never a dependency: where it
    does not import, ``tl_python`` (an interpreter that has it and this project) runs
    this part and its JSON is returned."""
    try:
        import transformer_lens  # noqa: F401
    except ImportError as error:
        if tl_python is None:
            return {"status": f"not measured: transformer_lens does not import ({error})"}
        return _grid_tl_elsewhere(tl_python, repeats)
    out: dict[str, Any] = {}
    for label, case in GRID_CASES.items():
        out[label] = _grid_tl_case(label, *case, repeats)
    return out


def _grid_tl_elsewhere(python: str, repeats: int) -> dict[str, Any]:
    """This part run by another interpreter (one with transformer_lens), its result."""
    import torch

    with tempfile.TemporaryDirectory(prefix="causalab-bench-tl-") as tmp:
        out = Path(tmp) / "grid_tl.json"
        args = [python, __file__, "--only", "grid_tl", "--repeats", str(repeats)]
        args += ["--threads", str(torch.get_num_threads()), "--out", str(out)]
        log(f"grid_tl: in {python}")
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            return {"status": f"failed in {python}: {done.stderr[-2000:]}"}
        result = json.loads(out.read_text())
    part: dict[str, Any] = result["grid_tl"]
    part["interpreter"] = {"python": python, **result["meta"]}
    return part


class LensGrid:
    """The grid of ``g`` with TransformerLens: its bridge over the same checkpoint,
    the bases' and sources' ``hook_resid_pre`` at every layer cached by one
    ``run_with_cache``, then each cell's source value written by a hook into its base
    row's token in ``run_with_hooks``."""

    def __init__(self, g: GridBench) -> None:
        import torch
        from transformer_lens.model_bridge import TransformerBridge

        from causalab_mini.positions import encode, resolve

        self.bridge = TransformerBridge.boot_transformers(str(g.path), device="cpu")
        self.g = g
        k = g.pairs
        self.ids, self.mask = g.inputs["input_ids"], g.inputs["attention_mask"]
        encoded = encode(g.model, [*g.bases, *g.sources])
        self.last = torch.tensor([row[0] for row in resolve(g.model, encoded, {"index": -1})])
        at = [resolve(g.model, encoded, spec) for spec in g.specs]
        # cell c = position c // k, pair c % k (as our grid orders them)
        self.pair_of = torch.arange(k).repeat(len(g.specs))
        self.base_tok = torch.tensor([w[i][0] for w in at for i in range(k)])
        self.source_tok = torch.tensor([w[k + i][0] for w in at for i in range(k)])
        self.names = [f"blocks.{layer}.hook_resid_pre" for layer in g.layers]

    def cache(self) -> Any:
        wanted = set(self.names)
        logits, cache = self.bridge.run_with_cache(
            self.ids, attention_mask=self.mask, names_filter=lambda name: name in wanted
        )
        return logits, cache

    def layer_batches(self) -> Any:
        """Per layer, the cells in the chunks of our grid: logits (L, P, k, vocab)."""
        import torch

        with torch.no_grad():
            _, cache = self.cache()
            out = []
            for name in self.names:
                source = cache[name]
                for start in range(0, len(self.pair_of), self.g.chunk):
                    rows = slice(start, start + self.g.chunk)
                    out.append(self._patched(name, source, rows))
        g = self.g
        return torch.cat(out).reshape(len(g.layers), len(g.specs), g.pairs, -1)

    def _patched(self, name: str, source: Any, rows: slice) -> Any:
        import torch

        pairs, at = self.pair_of[rows], self.base_tok[rows]
        put = source[self.g.pairs + pairs, self.source_tok[rows]]
        n = torch.arange(len(pairs))

        def patch(t: Any, hook: Any) -> Any:
            t = t.clone()
            t[n, at] = put
            return t

        logits = self.bridge.run_with_hooks(
            self.ids[pairs], attention_mask=self.mask[pairs], fwd_hooks=[(name, patch)]
        )
        return logits[n, self.last[pairs]]

    def per_cell(self) -> Any:
        """One ``run_with_hooks`` per cell, the pairs as rows: logits (L, P, k, vocab)."""
        import torch

        k = self.g.pairs
        with torch.no_grad():
            _, cache = self.cache()
            out = [
                self._patched(name, cache[name], slice(s, s + k))
                for name in self.names
                for s in range(0, len(self.pair_of), k)
            ]
        g = self.g
        return torch.cat(out).reshape(len(g.layers), len(g.specs), g.pairs, -1)

    def clean(self) -> Any:
        """Its unpatched logits of every row against transformers' own forward's."""
        import torch

        with torch.no_grad():
            theirs = self.bridge(self.ids, attention_mask=self.mask)
            ours = self.g.floor.hf(**self.g.inputs).logits
        kept = self.mask.bool()
        return float((theirs - ours)[kept].abs().max()), float(ours[kept].abs().max())


def _grid_tl_case(
    label: str, overrides: dict[str, Any], pairs: int, words: int, n_pos: int, repeats: int
) -> dict[str, Any]:
    import torch

    log(f"grid_tl: {label}")
    g = GridBench(overrides, pairs, words, n_pos)
    lens = LensGrid(g)
    ours = g.run("hooks")
    theirs, theirs_cells = lens.layer_batches(), lens.per_cell()
    clean, scale = lens.clean()
    # the metric of the grids: the base's top clean token's logit minus the
    # source's, at the last token
    top = torch.stack([ours.base_logits.argmax(-1), ours.source_logits.argmax(-1)], -1)

    def metric(logits: Any) -> Any:
        picked = logits.gather(-1, top.expand(*logits.shape[:-1], 2))
        return picked[..., 0] - picked[..., 1]

    worst = float((theirs - ours.logits).abs().max())
    checks = {
        "engines equal": torch.equal(ours.logits, g.run("nnsight").logits),
        "TransformerLens per cell == per layer batch": float((theirs_cells - theirs).abs().max()),
        "max |TransformerLens - ours| logits": worst,
        "max |TransformerLens - ours| metric": float(
            (metric(theirs) - metric(ours.logits)).abs().max()
        ),
        "max |TransformerLens - transformers| clean logits": clean,
        "max |logit|": scale,
        f"TransformerLens ~= ours (atol {LENS_TOLERANCE})": worst <= LENS_TOLERANCE,
    }
    load = os.getloadavg()
    times = interleaved_gc_on(
        {
            "bound": g.bound,
            "bound_kept": g.bound_kept,
            "grid_hooks": lambda: g.run("hooks"),
            "grid_nnsight": lambda: g.run("nnsight"),
            "tl_cached": lens.layer_batches,
            "tl_cached_per_cell": lens.per_cell,
        },
        max(3, repeats // 4),
        warmup=1,
    )
    figures = _grid_figures(g.cells, times)
    med = figures["median_ms"]
    return {
        "cells": g.cells,
        "batch": list(g.inputs["input_ids"].shape),
        "rows_per_forward": g.chunk,
        "load": [*load, *os.getloadavg()],
        "checks": checks,
        **figures,
        "ours hooks / TransformerLens cached (speed)": med["tl_cached"] / med["grid_hooks"],
    }


def _ranks(values: Any) -> Any:
    """The rank of each value (0 for the least), ties broken by position."""
    import torch

    order = values.argsort()
    ranks = torch.empty_like(order, dtype=torch.float64)
    ranks[order] = torch.arange(len(values), dtype=torch.float64)
    return ranks


def spearman(a: Any, b: Any) -> float:
    """Spearman's rank correlation of two flat tensors of the same length."""
    import torch

    ra, rb = _ranks(a.flatten().double()), _ranks(b.flatten().double())
    return float(torch.corrcoef(torch.stack([ra, rb]))[0, 1])


def bench_attribution(repeats: int) -> dict[str, Any]:
    """Issue 35: a (layer x position) grid on the 4-layer Llama of the engines part
    estimated by attribution patching (``attribute``: one forward of bases and sources
    and one backward) against the exact grid by activation patching
    (``interchange.grid``: one patched row per cell), on the same pairs and the same
    metric; wall time of the whole grid each way (interleaved, gc on, medians) and the
    Spearman rank agreement of the two grids (over every cell, and over the cells'
    means across pairs)."""
    import torch

    from causalab_mini import StandardizedTransformer
    from causalab_mini.attribution import attribute
    from causalab_mini.components import locate
    from causalab_mini.interchange import grid
    from causalab_mini.metrics import logit_diff
    from causalab_mini.tools.tiny import build_tiny

    seq, pairs = 32, 4
    log(f"attribution: 4-layer llama, {seq} tokens, {pairs} pairs")
    path = build_tiny("llama", overrides=READS_MODEL)
    model = StandardizedTransformer(str(path))
    # the same words in each row, rotated: as many tokens in every base and source
    words = [f" w{i}" for i in range(seq)]
    bases = ["".join(words[i:] + words[:i]) for i in range(pairs)]
    sources = ["".join(reversed(words[i:] + words[:i])) for i in range(pairs)]
    layers = list(range(model.internals.num_layers))
    addresses = [locate(model, "block_input", layer) for layer in layers]
    with torch.no_grad():
        clean = grid(model, "block_input", layers[:1], [{"index": 0}], bases[:1], sources[:1])
    good, bad = int(clean.source_logits[0].argmax()), int(clean.base_logits[0].argmax())
    metric = logit_diff(good, bad)

    def exact(engine: str) -> Any:
        with torch.no_grad():
            result = grid(
                model,
                "block_input",
                layers,
                "all",
                bases,
                sources,
                metric=lambda logits, _pairs: metric(logits, model),
                engine=engine,
                batch_size=64,
            )
        base = metric(result.base_logits, model)
        return result.values - base  # (layers, positions, pairs)

    def atp(engine: str) -> Any:
        result = attribute(model, addresses, bases, sources, metric, engine=engine)
        # (pairs, positions) per layer -> (layers, positions, pairs)
        return torch.stack([result.scores[a].T for a in addresses])

    grids = {"patching": exact("hooks"), "atp": atp("hooks")}
    agree = {
        "engines equal (patching)": bool(torch.allclose(exact("nnsight"), grids["patching"])),
        "engines equal (atp)": bool(
            torch.allclose(atp("nnsight"), grids["atp"], rtol=1e-5, atol=1e-6)
        ),
    }
    shape = tuple(grids["patching"].shape)
    assert tuple(grids["atp"].shape) == shape, (grids["atp"].shape, shape)
    times = interleaved_gc_on(
        {
            "atp_hooks": lambda: atp("hooks"),
            "atp_nnsight": lambda: atp("nnsight"),
            "patching_hooks": lambda: exact("hooks"),
            "patching_nnsight": lambda: exact("nnsight"),
        },
        max(3, repeats // 8),
        warmup=1,
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in CPU[id(times)].items()}
    return {
        "grid": {"layers": shape[0], "positions": shape[1], "pairs": shape[2]},
        "metric": metric.name,
        "checks": agree,
        "median_ms": {k: 1e3 * v for k, v in med.items()},
        "median_cpu_ms": {k: 1e3 * v for k, v in cpu.items()},
        "figures": {
            f"patching / atp ({e})": figure(times, f"patching_{e}", f"atp_{e}", None)
            for e in ("hooks", "nnsight")
        },
        "spearman (every cell)": spearman(grids["atp"], grids["patching"]),
        "spearman (mean over pairs)": spearman(grids["atp"].mean(-1), grids["patching"].mean(-1)),
        "max |patching effect|": float(grids["patching"].abs().max()),
    }


def _lens_grid(
    path: Path, model: Any, cells: list[Any], bases: list[str], sources: list[str]
) -> Callable[[], list[Any]] | str:
    """The same patching grid with TransformerLens's ``run_with_hooks`` on the same
    checkpoint (its bridge over the transformers model): per cell one forward of the
    bases and sources, a hook on the block's input moving the sources' token into the
    bases'; or why it is not measured (it is the bench venv's, never a dependency)."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as error:
        return f"not measured: transformer_lens does not import here ({error})"
    import torch

    from causalab_mini.positions import encode, resolve, trace_inputs

    bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
    k = len(bases)
    encoded = encode(model, [*bases, *sources])
    batch = trace_inputs(model, encoded)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    last = resolve(model, encoded, {"index": -1})
    at = [(c.layer, resolve(model, encoded, c.position)) for c in cells]
    rows = torch.arange(k)

    def cell(layer: int, where: list[list[int]]) -> Any:
        base = torch.tensor([w[0] for w in where[:k]])
        source = torch.tensor([w[0] for w in where[k:]])

        def patch(t: Any, hook: Any) -> Any:
            t = t.clone()
            t[rows, base] = t[rows + k, source]
            return t

        logits = bridge.run_with_hooks(
            ids, attention_mask=mask, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)]
        )
        return logits[rows, torch.tensor([w[0] for w in last[:k]])]

    def run() -> list[Any]:
        with torch.no_grad():
            return [cell(layer, where) for layer, where in at]

    return run


# ---------------------------------------------------------------------- part 2


def _cold_caches() -> None:
    """Empty the process-wide caches of causalab-mini, so every repeat resolves cold."""
    from causalab_mini import internals, ops

    for module in (internals, ops):
        for value in vars(module).values():
            clear = getattr(value, "cache_clear", None)
            if callable(clear):
                clear()
    for name in ("_CACHE", "_OP_NAMES"):
        cache = getattr(ops, name, None)
        if cache is not None and callable(getattr(cache, "clear", None)):
            cache.clear()


def big_config_dir(root: Path) -> Path:
    from transformers import LlamaConfig

    from causalab_mini.tools.tiny import tiny_tokenizer

    out = root / "llama-70b-class-config"
    config = LlamaConfig(**BIG_CONFIG)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


def resolve_all(model: Any) -> tuple[float, float, int, int]:
    from causalab_mini.components import ComponentError, locate
    from causalab_mini.generated import COMPONENTS

    start = time.perf_counter()
    model.internals.status()
    status_s = time.perf_counter() - start
    ok = refused = 0
    start = time.perf_counter()
    for name, spec in COMPONENTS.items():
        for layer in range(model.internals.num_layers) if spec.per_layer else [None]:
            try:
                locate(model, name, layer)
                ok += 1
            except ComponentError:
                refused += 1
    return status_s, time.perf_counter() - start, ok, refused


def bench_resolve(repeats: int, root: Path) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from causalab_mini import StandardizedTransformer

    log("part 2: 70B-class llama on the meta device")
    config_dir = big_config_dir(root)
    times: dict[str, list[float]] = {
        k: [] for k in ("build", "status", "locate", "resolve", "hf_meta")
    }
    cpu: dict[str, list[float]] = {"build": [], "resolve": []}
    CPU[id(times)] = cpu
    untouched = True
    counts: tuple[int, int] = (0, 0)
    for _ in range(repeats):
        _cold_caches()
        gc.collect()
        start = time.perf_counter()
        with torch.device("meta"):
            LlamaForCausalLM(LlamaConfig(**BIG_CONFIG))
        times["hf_meta"].append(time.perf_counter() - start)
        start, start_cpu = time.perf_counter(), cpu_now()
        model = StandardizedTransformer(str(config_dir), check_renaming=False)
        times["build"].append(time.perf_counter() - start)
        cpu["build"].append(cpu_now() - start_cpu)
        calls: list[int] = []
        hook = model._model.register_forward_pre_hook(lambda *_, c=calls: c.append(1))
        start_cpu = cpu_now()
        status_s, locate_s, ok, refused = resolve_all(model)
        cpu["resolve"].append(cpu_now() - start_cpu)
        hook.remove()
        counts = (ok, refused)
        times["status"].append(status_s)
        times["locate"].append(locate_s)
        times["resolve"].append(status_s + locate_s)
        untouched = untouched and not calls and not getattr(model, "dispatched", False)
        untouched = untouched and all(p.is_meta for p in model._model.parameters())
        del model
    figures = {
        "status + locate / meta-model build": figure(times, "resolve", "build", TARGETS["resolve"]),
    }
    CPU.pop(id(times))  # status and locate alone have no CPU figure
    figures["status / meta-model build"] = figure(times, "status", "build", None)
    figures["locate / meta-model build"] = figure(times, "locate", "build", None)
    CPU[id(times)] = cpu
    out: dict[str, Any] = {
        "config": BIG_CONFIG,
        "located": {"ok": counts[0], "refused": counts[1]},
        "no_forward_no_weights": untouched,
        "times": timing(times),
        "figures": figures,
    }
    out["registry_model"] = bench_registry_model(config_dir, max(1, repeats - 1))
    return out


_REGISTRY_MODEL = r"""
import contextlib, io, json, sys, time
t0 = time.perf_counter()
import causalab_mini.model as M
from causalab_mini.tools.cli import main
spent = []
class Timed(M.StandardizedTransformer):
    def __init__(self, *args, **kwargs):
        start, start_cpu = time.perf_counter(), time.process_time()
        super().__init__(*args, **kwargs)
        spent.append((time.perf_counter() - start, time.process_time() - start_cpu))
M.StandardizedTransformer = Timed
buf = io.StringIO()
t1, c1 = time.perf_counter(), time.process_time()
code = 0
with contextlib.redirect_stdout(buf):
    try:
        main(["model", sys.argv[1]], standalone_mode=False)
    except SystemExit as exc:
        code = exc.code or 0
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"imports": t1 - t0, "command": t2 - t1, "construction": spent[0][0],
                  "command_cpu": c2 - c1, "construction_cpu": spent[0][1],
                  "lines": buf.getvalue().count("\n"), "exit": code}))
"""


def bench_registry_model(config_dir: Path, repeats: int) -> dict[str, Any]:
    log("part 2: registry model on the 70B-class config")
    runs = []
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-c", _REGISTRY_MODEL, str(config_dir)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    beyond = [r["command"] - r["construction"] for r in runs]
    construction = [r["construction"] for r in runs]
    beyond_cpu = [r["command_cpu"] - r["construction_cpu"] for r in runs]
    construction_cpu = [r["construction_cpu"] for r in runs]
    r = ratio(beyond, construction)
    return {
        "runs": runs,
        "beyond_construction_s": stats(beyond),
        "construction_s": stats(construction),
        "figures": {
            "registry model beyond construction / construction": {
                "ratio": r,
                "ratio_cpu": ratio(beyond_cpu, construction_cpu),
                "numerator": "beyond construction",
                "baseline": "construction",
                "target": None,
                "met": None,
            },
            "registry model beyond construction (s)": {
                "seconds": stats(beyond),
                "cpu_seconds": stats(beyond_cpu),
                "target_s": TARGETS["registry_model_s"],
                "met": min(beyond) <= TARGETS["registry_model_s"],
            },
        },
    }


# ---------------------------------------------------------------------- part 3


_IMPORT = (
    "import sys, time\n"
    "t, c = time.perf_counter(), time.process_time()\n"
    "import causalab_mini.generated\n"
    "d, e = time.perf_counter() - t, time.process_time() - c\n"
    "print(d, e, 'torch' in sys.modules)\n"
)


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO, check=False)


def synthetic_registry(root: Path, families: int) -> Path:
    """The package's registry with ``families`` family files: its own, then clones of
    them round-robin, each renamed and matching only a class of its own (so no
    structure rule or required row changes); lint-clean like the original."""
    import re

    from causalab_mini.codegen.lint import default_registry

    target = root / "registry"
    shutil.copytree(default_registry(), target, ignore=shutil.ignore_patterns("*.py", "__py*"))
    originals = sorted((target / "families").glob("*.yaml"))
    for i in range(max(0, families - len(originals))):
        source = originals[i % len(originals)]
        name = f"{source.stem}_synth{i:03d}"
        text = source.read_text()
        text = re.sub(r"(?m)^family: .*$", f"family: {name}", text)
        # the match: one class of its own (the file's other keys are kept)
        head, sep, rest = text.partition("\nmatch:\n")
        body = re.split(r"(?m)^(?=\S)", rest, maxsplit=1)
        tail = body[1] if len(body) > 1 else ""
        text = f"{head}{sep}  classes: [Synth{i:03d}ForCausalLM]\n{tail}"
        (target / "families" / f"{name}.yaml").write_text(text)
    return target


def bench_tooling(repeats: int) -> dict[str, Any]:
    log("part 3: registry lint, registry gen --check, import causalab_mini.generated")
    registry = shutil.which("registry", path=str(Path(sys.executable).parent)) or shutil.which(
        "registry"
    )
    if registry is None:
        raise SystemExit("bench: the `registry` command is not installed (pip install -e .)")
    import_seconds: list[float] = []
    import_cpu: list[float] = []
    torch_imported = False
    failures: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="causalab-bench-registry-"))
    synthetic = synthetic_registry(tmp, SYNTHETIC_FAMILIES)
    n_families = len(list((synthetic / "families").glob("*.yaml")))
    synthetic_out = tmp / "generated"
    made = _run([registry, "gen", "--registry", str(synthetic), "--out", str(synthetic_out)])
    if made.returncode != 0:
        failures.append(f"synthetic registry: gen failed: {made.stdout}{made.stderr}")
    no_cache = {**os.environ, "CAUSALAB_MINI_LINT_CACHE": "0"}

    def importing() -> None:
        nonlocal torch_imported
        proc = _run([sys.executable, "-c", _IMPORT])
        seconds, cpu_seconds, torch_flag = proc.stdout.split()
        import_seconds.append(float(seconds))
        import_cpu.append(float(cpu_seconds))
        torch_imported = torch_imported or torch_flag == "True"

    def command(*args: str, env: dict[str, str] | None = None) -> Callable[[], None]:
        def run() -> None:
            proc = subprocess.run(
                [registry, *args], capture_output=True, text=True, cwd=REPO, env=env, check=False
            )
            if proc.returncode != 0:
                failures.append(f"registry {' '.join(args)}: exit {proc.returncode}")

        return run

    big = ("--registry", str(synthetic))
    try:
        times = interleaved(
            {
                "python_startup": lambda: _run([sys.executable, "-c", "pass"]),
                "lint": command("lint"),
                "gen_check": command("gen", "--check"),
                "import_generated": importing,
                "lint_200": command("lint", *big),
                "gen_check_200": command("gen", "--check", *big, "--out", str(synthetic_out)),
                "lint_no_cache": command("lint", env=no_cache),
                "lint_200_no_cache": command("lint", *big, env=no_cache),
            },
            repeats,
            warmup=1,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    import_seconds, import_cpu = import_seconds[1:], import_cpu[1:]  # not the warm-up's
    figures: dict[str, Any] = {}
    for name, key in (("registry lint", "lint"), ("registry gen --check", "gen_check")):
        target = TARGETS["lint_ratio"] if key == "lint" else None
        figures[f"{name} / python startup"] = figure(times, key, "python_startup", target)
        figures[f"{name} (s)"] = {
            "seconds": stats(times[key]),
            "cpu_seconds": stats(CPU[id(times)][key]),
            "target_s": TARGETS[f"{key}_s"],
            "met": min(times[key]) <= TARGETS[f"{key}_s"],
        }
    big_name = f"{n_families} families"
    figures[f"registry lint, {big_name} / python startup"] = figure(
        times, "lint_200", "python_startup", TARGETS["lint_ratio_200"]
    )
    figures[f"registry gen --check, {big_name} / python startup"] = figure(
        times, "gen_check_200", "python_startup", None
    )
    figures["registry lint, no cache / python startup"] = figure(
        times, "lint_no_cache", "python_startup", None
    )
    figures[f"registry lint, {big_name}, no cache / python startup"] = figure(
        times, "lint_200_no_cache", "python_startup", None
    )
    figures["import causalab_mini.generated / python startup"] = figure(
        times, "import_generated", "python_startup", None
    )
    figures["import causalab_mini.generated, in-process (s)"] = {
        "seconds": stats(import_seconds),
        "cpu_seconds": stats(import_cpu),
        "target_s": TARGETS["import_s"],
        "met": min(import_seconds) <= TARGETS["import_s"] and not torch_imported,
    }
    return {
        "times": timing(times),
        "import_seconds": stats(import_seconds),
        "torch_imported": torch_imported,
        "synthetic_families": n_families,
        "failures": failures,
        "figures": figures,
    }


# ---------------------------------------------------------------------- report


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for package in ("torch", "transformers", "nnsight", "nnterp", "causalab-mini"):
        try:
            out[package] = version(package)
        except Exception:
            out[package] = "?"
    return out


def table(result: dict[str, Any]) -> str:
    """The figures as a Markdown table: wall-time ratio min and median, the target and
    whether the min meets it, and the CPU-time ratio of the mins beside it."""
    rows: list[tuple[str, ...]] = []

    def verdict(met: bool | None) -> str:
        return {True: "met", False: "MISSED", None: ""}[met]

    def ratio_row(label: str, fig: dict[str, Any]) -> None:
        r = fig["ratio"]
        target = "-" if fig["target"] is None else f"<= {fig['target']:.2f}x"
        cpu = fig.get("ratio_cpu")
        rows.append(
            (
                label,
                f"{r['min']:.3f}x",
                f"{r['median']:.3f}x",
                f"{cpu['min']:.3f}x" if cpu else "-",
                target,
                verdict(fig["met"]),
            )
        )

    def seconds_row(label: str, fig: dict[str, Any]) -> None:
        s, cpu = fig["seconds"], fig.get("cpu_seconds")
        ms = fig["target_s"] < 0.2
        unit, suffix = (1000.0, " ms") if ms else (1.0, " s")

        def show(x: float) -> str:
            return f"{x * unit:.3g}{suffix}"

        rows.append(
            (
                label,
                show(s["min"]),
                show(s["median"]),
                show(cpu["min"]) if cpu else "-",
                f"<= {show(fig['target_s'])}",
                verdict(fig["met"]),
            )
        )

    t = result.get("tracing")
    if t:
        r = t["reads"]["figures"]
        n = t["reads"]["reads_per_trace"]
        ratio_row(
            f"reads ({n}/trace): internals / nnsight hand", r["internals / nnsight hand-written"]
        )
        ratio_row("reads: Plan / nnsight hand", r["plan / nnsight hand-written"])
        ratio_row(
            "reads: nnsight hand / torch hooks (floor)", r["nnsight hand-written / torch hooks"]
        )
        ratio_row("reads: internals / torch hooks (floor)", r["internals / torch hooks"])
        w = t["writes"]["figures"]
        ratio_row(
            "writes layers_mid: internals / nnsight hand", w["internals / nnsight hand-written"]
        )
        ratio_row("writes layers_mid: Plan / nnsight hand", w["plan / nnsight hand-written"])
        ratio_row(
            "writes: nnsight hand / torch hooks (floor)", w["nnsight hand-written / torch hooks"]
        )
        i = t["interiors"]["figures"]
        ratio_row(
            "interiors q/k/scores/z: Plan / hand .source", i["plan / nnsight hand-written .source"]
        )
        ratio_row(
            "interiors: hand .source / bare forward",
            i["nnsight hand-written / bare forward (no capture)"],
        )
        p = t["per_read"]
        fig = p["figures"]["internals / nnsight hand-written, per read"]
        ratio_row(f"per read, small model ({p['reads_per_trace']}/trace): internals / hand", fig)
        ratio_row(
            "per read: trace-body thread CPU, internals / hand",
            p["figures"]["internals / nnsight hand-written, worker-thread CPU per read"],
        )
    a = result.get("attribution")
    if a:
        g = a["grid"]
        cells = f"{g['layers']}x{g['positions']}x{g['pairs']}"
        for label, fig in a["figures"].items():
            ratio_row(f"attribution grid {cells}: {label}", fig)
    e = result.get("engines")
    if e:
        for part in ("reads", "interchange", "grid"):
            for label, fig in e[part]["figures"].items():
                ratio_row(f"engines {part}: {label}", fig)
        per_s = e["grid"]["patches_per_s"]
        lens_per_s = per_s.get("transformer_lens")
        rows.append(
            (
                f"engines grid ({e['grid']['patches']} patches): patches/s hooks, nnsight, "
                "TransformerLens",
                f"{per_s['hooks']:.0f}",
                f"{per_s['nnsight']:.0f}",
                "-" if lens_per_s is None else f"{lens_per_s:.0f}",
                "-",
                "",
            )
        )
    r2 = result.get("resolve")
    if r2:
        f = r2["figures"]
        ratio_row("70B meta: status + locate / meta build", f["status + locate / meta-model build"])
        ratio_row("70B meta: status / meta build", f["status / meta-model build"])
        ratio_row("70B meta: locate / meta build", f["locate / meta-model build"])
        rm = r2["registry_model"]["figures"]
        ratio_row(
            "registry model 70B: beyond construction / construction",
            rm["registry model beyond construction / construction"],
        )
        seconds_row(
            "registry model 70B: beyond construction", rm["registry model beyond construction (s)"]
        )
    r3 = result.get("tooling")
    if r3:
        f = r3["figures"]
        ratio_row("registry lint / python startup", f["registry lint / python startup"])
        seconds_row("registry lint", f["registry lint (s)"])
        ratio_row(
            "registry gen --check / python startup", f["registry gen --check / python startup"]
        )
        seconds_row("registry gen --check", f["registry gen --check (s)"])
        n = r3.get("synthetic_families", SYNTHETIC_FAMILIES)
        for label in (
            f"registry lint, {n} families / python startup",
            f"registry gen --check, {n} families / python startup",
            "registry lint, no cache / python startup",
            f"registry lint, {n} families, no cache / python startup",
        ):
            ratio_row(label, f[label])
        ratio_row(
            "import causalab_mini.generated / python startup",
            f["import causalab_mini.generated / python startup"],
        )
        seconds_row(
            "import causalab_mini.generated (in-process)",
            f["import causalab_mini.generated, in-process (s)"],
        )
    rows.append(("sweep throughput", "pending", "pending", "-", "-", "pending"))
    head = ("figure", "wall min", "wall median", "cpu min", "target", "")
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    meta = result.get("meta", {})
    caption = ", ".join(
        f"{k} {meta.get(k, '?')}" for k in ("torch", "transformers", "nnsight", "nnterp")
    )
    return "\n".join(
        [
            f"{caption}; torch threads {meta.get('torch_threads', '?')}",
            "",
            line(head),
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *map(line, rows),
        ]
    )


GRID_VARIANTS = {
    "bound": "bare transformers forwards (bound)",
    "bound_kept": "the same, logits at the columns read only (tight bound)",
    "grid_hooks": "ours, hooks engine",
    "grid_nnsight": "ours, nnsight engine",
    "tl_cached": "TransformerLens cached, layer chunks",
    "tl_cached_per_cell": "TransformerLens cached, per cell",
    "per_cell_hooks": "one interchange per cell (hooks)",
}


def grid_table(result: dict[str, Any]) -> str:
    """The grid parts as a Markdown table: per grid and variant the patches/s (median),
    the bound's time over the variant's (wall median, wall min, CPU median) and the
    load over the grid's run."""
    rows = [("grid", "variant", "patches/s", "bound/x wall", "min", "cpu", "tight/x wall", "load")]
    for part in ("grid", "grid_tl"):
        for label, case in result.get(part, {}).items():
            if not isinstance(case, dict) or "patches_per_s" not in case:
                continue
            load = case.get("load")
            shown = "-" if load is None else f"{load[0]:.1f}-{load[3]:.1f}"
            for key, per_s in case["patches_per_s"].items():
                ratios = [
                    case[f].get(key) for f in ("bound / grid (wall)", "bound / grid (wall, min)")
                ]
                ratios.append(case["bound / grid (cpu)"].get(key))
                ratios.append(case.get("tight bound / grid (wall)", {}).get(key))
                cells = ["-" if r is None else f"{r:.3f}" for r in ratios]
                rows.append((label, GRID_VARIANTS.get(key, key), f"{per_s:.0f}", *cells, shown))
    if len(rows) == 1:
        return ""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows[1:])]
    )


# (label, part of result["tracing"], variant) of the absolute times compared across runs
COMPARED_TIMES = [
    ("empty trace, small model", "per_read", "empty_trace"),
    ("reads: nnsight hand", "reads", "nnsight_hand"),
    ("reads: internals", "reads", "internals"),
    ("reads: Plan", "reads", "plan"),
    ("reads: torch hooks (floor)", "reads", "torch_hooks"),
    ("writes: nnsight hand", "writes", "nnsight_hand"),
    ("writes: internals", "writes", "internals"),
    ("interiors: hand .source", "interiors", "nnsight_hand"),
    ("interiors: Plan", "interiors", "plan"),
]
# (label, part, figure) of the ratios compared across runs
COMPARED_RATIOS = [
    ("reads: internals / nnsight hand", "reads", "internals / nnsight hand-written"),
    ("reads: Plan / nnsight hand", "reads", "plan / nnsight hand-written"),
    ("reads: nnsight hand / torch hooks", "reads", "nnsight hand-written / torch hooks"),
    ("writes: internals / nnsight hand", "writes", "internals / nnsight hand-written"),
    ("writes: nnsight hand / torch hooks", "writes", "nnsight hand-written / torch hooks"),
    ("interiors: Plan / hand .source", "interiors", "plan / nnsight hand-written .source"),
    ("per read: internals / hand", "per_read", "internals / nnsight hand-written, per read"),
]


def compare(results: list[dict[str, Any]]) -> str:
    """The tracing figures of several runs side by side (one per installed nnsight, as
    ``nox -s bench -- --nnsight 0.7.0,0.8.1`` writes them): the median wall times, and
    each later run's against the first; the ratios of each run to its own baselines."""
    heads = [f"nnsight {r['meta'].get('nnsight', '?')}" for r in results]
    first = heads[0]
    cols = ["figure (median)", *heads, *[f"{h} / {first}" for h in heads[1:]]]
    rows: list[list[str]] = []
    for label, part, variant in COMPARED_TIMES:
        medians = []
        for r in results:
            t = r.get("tracing", {}).get(part, {}).get("times", {}).get(variant)
            medians.append(None if t is None else t["wall"]["median"])
        cells = ["-" if m is None else f"{m * 1000:.2f} ms" for m in medians]
        base = medians[0]
        cells += ["-" if m is None or not base else f"{m / base:.2f}x" for m in medians[1:]]
        rows.append([label, *cells])
    for label, part, name in COMPARED_RATIOS:
        cells = []
        for r in results:
            fig = r.get("tracing", {}).get(part, {}).get("figures", {}).get(name)
            cells.append("-" if fig is None else f"{fig['ratio']['median']:.3f}x")
        rows.append([label, *cells, *["" for _ in results[1:]]])
    loads = [
        f"{h}: torch {r['meta'].get('torch_threads')} thread(s), load "
        f"{r['meta'].get('load', '?')}, transformers {r['meta'].get('transformers')}"
        for h, r in zip(heads, results, strict=True)
    ]
    widths = [max(len(row[k]) for row in [cols, *rows]) for k in range(len(cols))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [
            line(cols),
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
            *map(line, rows),
            "",
            *loads,
        ]
    )


def grid_checks(result: dict[str, Any]) -> dict[str, bool]:
    """The grid parts' pass/fail checks: the engines equal, one interchange per cell
    within 1e-6, TransformerLens within LENS_TOLERANCE."""
    out: dict[str, bool] = {}
    for part in ("grid", "grid_tl"):
        for label, case in result.get(part, {}).items():
            for name, value in case.get("checks", {}).items() if isinstance(case, dict) else ():
                if isinstance(value, bool):
                    out[f"{part} {label}: {name}"] = value
                elif name == "max |grid - per-cell interchange|":
                    out[f"{part} {label}: grid == per-cell interchange (1e-6)"] = value <= 1e-6
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench.json"), help="where the JSON goes")
    parser.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="print the tracing figures of earlier runs (one per nnsight) side by side, "
        "the first as the baseline, and exit",
    )
    parser.add_argument("--repeats", type=int, default=40, help="repeats of each traced figure")
    parser.add_argument(
        "--small-repeats", type=int, default=300, help="repeats of the per-read figure"
    )
    parser.add_argument("--resolve-repeats", type=int, default=3, help="meta-model builds")
    parser.add_argument("--tool-repeats", type=int, default=7, help="runs of each command")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (1: least noise)"
    )
    parser.add_argument(
        "--only",
        default="tracing,engines,resolve,tooling",
        help="comma-separated parts: tracing, engines, seam, grid, grid_tl, attribution, resolve, tooling",
    )
    parser.add_argument(
        "--tl-python",
        default=os.environ.get("CAUSALAB_TL_PYTHON"),
        help="for grid_tl where transformer_lens does not import: an interpreter that has "
        "it and this project (e.g. a venv of `nox -s transformer_lens`); the part runs "
        "there (default: $CAUSALAB_TL_PYTHON)",
    )
    args = parser.parse_args(argv)
    if args.compare:
        print(compare([json.loads(path.read_text()) for path in args.compare]))
        return 0
    parts = set(args.only.split(","))
    quiet()
    started = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {
        "meta": {
            **_versions(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": args.threads,
            "repeats": {
                "traced": args.repeats,
                "per_read": args.small_repeats,
                "resolve": args.resolve_repeats,
                "tooling": args.tool_repeats,
            },
            "judged_on": "ratio of mins",
            "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        }
    }
    if "tracing" in parts:
        result["tracing"] = bench_tracing(args.repeats, args.small_repeats)
    if "engines" in parts:
        result["engines"] = bench_engines(args.repeats)
    if "seam" in parts:
        result["seam"] = bench_seam(args.repeats)
    if "grid" in parts:
        result["grid"] = bench_grid(args.repeats)
    if "attribution" in parts:
        result["attribution"] = bench_attribution(args.repeats)
    if "grid_tl" in parts:
        result["grid_tl"] = bench_grid_tl(args.repeats, args.tl_python)
    if "resolve" in parts:
        with tempfile.TemporaryDirectory(prefix="causalab-bench-") as tmp:
            result["resolve"] = bench_resolve(args.resolve_repeats, Path(tmp))
    if "tooling" in parts:
        result["tooling"] = bench_tooling(args.tool_repeats)
    result["sweep"] = {"status": "pending: the sweep command does not exist yet"}
    result["meta"]["bench_seconds"] = time.perf_counter() - started
    result["meta"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["table"] = table(result)
    result["grid_table"] = grid_table(result)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    if result["grid_table"]:
        print("\n" + result["grid_table"])
    checks = {
        **result.get("tracing", {}).get("checks", {}),
        **result.get("engines", {}).get("checks", {}),
        **grid_checks(result),
    }
    bad = [k for k, v in checks.items() if not v]
    if result.get("resolve") and not result["resolve"]["no_forward_no_weights"]:
        bad.append("resolve: a forward ran or a weight loaded")
    bad += result.get("tooling", {}).get("failures", [])
    for item in bad:
        print(f"bench: check failed: {item}", file=sys.stderr)
    print(f"\nwrote {args.out} in {result['meta']['bench_seconds']:.0f} s", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
