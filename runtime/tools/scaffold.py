"""``registry new-family``: a starting family file whose rows are verified, not guessed.

The scaffold builds (or loads) a tiny random instance of the model, inspects its
module tree, and for every place tries the modules, sides and operations that could
hold it:

1. **Containers.** The layer list, embedding, unembedding, final norm, attention and
   MLP are found from the module tree; nnterp must load the model with them, and
   transformers' own ``output_hidden_states`` and logits must agree with the places
   they name.
2. **Block structure.** One forward pass with hooks on every module of every layer
   captures each module's input and output. For each known structure, the
   registry's own identities (``BLOCK_STRUCTURES[...].identities``) are solved over
   the candidates: the structural table's modules first, then every module of the
   layer; for the sublayers' contributions the default rows, every module output of
   the stream's shape, and the same times a config multiplier. A structure passes if
   some assignment satisfies all its identities on every layer. A structure that
   refuses a place another passing structure verified (a parallel block "has no
   mid-stream" while a pre-norm solution found one) is ruled out, and so is one that
   disagrees with whether a sublayer module returns the stream itself.
3. **Places.** For the chosen structure each place is: ``default`` (the default row,
   as the runtime resolves it, passes), ``verified`` (another candidate passes, and
   only it: written as a row), ``ambiguous`` (several pass: written as
   commented-out choices), ``missing`` (none passes: a commented-out stub with the
   evidence), ``refused`` (the structure has no such place, with its reason) or
   ``unchecked`` (no identity can check it; the runtime's resolution is reported).
4. **Proof.** The rows are loaded into a ``StandardizedTransformer`` and run through
   ``causalab_mini.tools.certify`` (identities, hidden-state and attention oracles, the
   write that must reach the stream). A row whose check fails is not written.

Nothing unverified is ever written as a row: undecided places are comments saying
what a person must decide, and the evidence for each choice.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import click

from causalab_mini.address import Address, IOType, RenameConfig
from causalab_mini.codegen.model import address_fields
from causalab_mini.compat import aliases_of
from causalab_mini.generated import (
    BLOCK_STRUCTURE_RULES,
    BLOCK_STRUCTURES,
    DEFAULT_ADDRESSES,
    FAMILY_ADDRESSES,
    STRUCTURAL_ADDRESSES,
    STRUCTURE_ADDRESSES,
)
from causalab_mini.tools.certify import difference, parse_identity
from causalab_mini.tools.completion import complete_spec

__all__ = [
    "Candidate",
    "Scaffold",
    "ScaffoldError",
    "new_family_command",
    "render_family",
    "scaffold",
]

# Every row a place may have: the default rows and the rows structures declare (a
# structure's identities name its own rows), in forward order; the row of a place.
ROWS: dict[str, Address] = dict(
    sorted(
        {
            **DEFAULT_ADDRESSES,
            **{name: row for rows in STRUCTURE_ADDRESSES.values() for name, row in rows.items()},
        }.items(),
        key=lambda item: (
            (1, item[1].order)
            if item[1].per_layer
            else (0 if item[1].order < 0 else 2, item[1].order)
        ),
    )
)

CONTRIBUTIONS = {"attentions_output": "self_attn", "mlps_output": "mlp"}
# Places no identity names, each with the relation to another place that checks it.
RELATIONS = ("attentions_norm_output", "attentions_premix", "mlps_neurons", "mlps_activation")
# Config attributes that may scale a sublayer's contribution (Granite's
# residual_multiplier); other floats (eps, dropout, rope theta) are never tried.
SCALE_NAME = re.compile(r"multiplier|scale|scaling|factor|coef|alpha", re.IGNORECASE)
ACTIVATION_NAME = re.compile(r"act|gelu|silu|relu|swish|xielu|glu|tanh|sigmoid|mish", re.I)
NOT_SCALE = re.compile(r"rope|eps|init|dropout|theta|router|aux|z_loss|temperature", re.I)


class ScaffoldError(Exception):
    """The model cannot be scaffolded (not loadable, no layer list); says why."""


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Candidate:
    """One way to read a place: a module (standardized path relative to the layer),
    a side, and what the tensor there is multiplied by."""

    module: str
    io: str  # input | output
    scale: str | None = None
    tuple_output: bool = False
    snapshot: bool = False

    def describe(self) -> str:
        text = f"{self.module or 'layer'}.{self.io}"
        if self.scale:
            text += f" * {self.scale}"
        return text

    def row_fields(self, default: Address) -> dict[str, Any]:
        """The family-file fields that make the default row read this candidate."""
        out: dict[str, Any] = {}
        if default.module != self.module:
            out["module"] = self.module
        if default.io.value != self.io:
            out["io"] = self.io
        if default.select is not None and not self.tuple_output and default.module != self.module:
            out["select"] = None
        if self.scale and default.scale != self.scale:
            out["scale"] = self.scale
        if self.snapshot and not default.snapshot:
            out["snapshot"] = True
        return out


@dataclass
class Verdict:
    """What the scaffold found for one place."""

    place: str
    status: str  # default | verified | ambiguous | missing | refused | unchecked
    evidence: str
    chosen: Candidate | None = None
    choices: list[Candidate] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)  # row fields to write (verified)
    check: str = ""  # the check that decided it, in a few words

    def to_json(self) -> dict[str, Any]:
        return {
            "place": self.place,
            "status": self.status,
            "check": self.check,
            "evidence": self.evidence,
            "chosen": self.chosen.describe() if self.chosen else None,
            "choices": [c.describe() for c in self.choices],
            "row": self.fields or None,
        }


@dataclass
class StructureTrial:
    name: str
    passed: bool
    evidence: str
    solutions: list[dict[str, Candidate]] = field(default_factory=list)
    verified_places: set[str] = field(default_factory=set)
    ruled_out: str | None = None


@dataclass
class Scaffold:
    """Everything ``registry new-family`` found, ready to render."""

    spec: str
    model_type: str
    model_class: str
    family: str
    num_layers: int
    containers: dict[str, str | bool]
    container_evidence: str
    structure: str | None
    structure_evidence: str
    trials: list[StructureTrial]
    verdicts: dict[str, Verdict]
    checks: list[str]  # the certify checks that proved the rows, as text
    failures: list[str]
    existing_rule: str | None
    structural_flags: list[str]
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> dict[str, dict[str, Any]]:
        return {
            name: v.fields
            for name, v in self.verdicts.items()
            if v.status == "verified" and v.fields
        }

    @property
    def undecided(self) -> list[Verdict]:
        return [v for v in self.verdicts.values() if v.status in ("ambiguous", "missing")]

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "model_type": self.model_type,
            "model_class": self.model_class,
            "family": self.family,
            "layers": self.num_layers,
            "containers": self.containers,
            "container_evidence": self.container_evidence,
            "block_structure": self.structure,
            "structure_evidence": self.structure_evidence,
            "existing_rule": self.existing_rule,
            "structures": [
                {
                    "name": t.name,
                    "passed": t.passed,
                    "ruled_out": t.ruled_out,
                    "evidence": t.evidence,
                }
                for t in self.trials
            ],
            "places": [v.to_json() for v in self.verdicts.values()],
            "checks": self.checks,
            "failures": self.failures,
            "notes": self.notes,
            "versions": self.versions,
        }


# ------------------------------------------------------------------------ the model


def resolve_spec(arg: str) -> tuple[str, str]:
    """``starcoder2`` -> ``tiny:starcoder2``; ``tiny:...`` as is; a local checkpoint
    directory -> a tiny random instance of its model type, with the boolean and
    string config values that differ from the tiny defaults (they may decide the
    block's structure). Returns (spec, model_type)."""
    from causalab_mini.tools.tiny import TINY_PREFIX, parse_tiny_spec

    if arg.startswith(TINY_PREFIX):
        model_type, _ = parse_tiny_spec(arg)
        return arg, model_type
    path = Path(arg)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ScaffoldError(f"{arg} is a directory without config.json")
        config = json.loads(config_file.read_text())
        model_type = config.get("model_type")
        if not isinstance(model_type, str):
            raise ScaffoldError(f"{config_file} names no model_type")
        overrides = _structural_overrides(model_type, config)
        query = "&".join(f"{k}={_spec_text(v)}" for k, v in sorted(overrides.items()))
        return f"{TINY_PREFIX}{model_type}{'?' + query if query else ''}", model_type
    if "/" in arg or "\\" in arg:
        raise ScaffoldError(
            f"{arg} is not a local directory, and no model hub is reachable: pass a "
            "checkpoint directory, a model type (starcoder2) or tiny:<model_type>"
        )
    return f"{TINY_PREFIX}{arg}", arg


def family_name(model_type: str, family: str | None = None) -> str:
    """The family's name: ``family``, or the model type in lower_snake_case."""
    name = family or re.sub(r"[^a-z0-9_]", "_", model_type.lower())
    if not re.match(r"^[a-z][a-z0-9_]*$", name):
        raise ScaffoldError(f"family name {name!r} is not lower_snake_case; pass --family NAME")
    return name


def _spec_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _structural_overrides(model_type: str, config: dict[str, Any]) -> dict[str, Any]:
    from causalab_mini.tools.tiny import tiny_config

    tiny = tiny_config(model_type).get_text_config()
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    assert isinstance(text, dict)
    out: dict[str, Any] = {}
    for key, value in text.items():
        if not isinstance(value, bool) or not hasattr(tiny, key):
            continue
        if getattr(tiny, key) != value and not key.startswith(("use_cache", "output_", "return_")):
            out[key] = value
    return out


def _quiet() -> None:
    import logging
    import warnings

    from causalab_mini import compat

    compat.install()  # nnterp imports under nnsight 0.8 only through its bridges
    import nnterp  # noqa: F401  (it sets its logger's level when first imported)

    warnings.filterwarnings("ignore")
    for noisy in ("nnterp", "transformers", "torch._subclasses.fake_tensor"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def detect_containers(hf_model: Any) -> tuple[dict[str, str | bool], list[str]]:
    """The containers nnterp renames, found from the module tree of a transformers
    model: (container -> path, notes on what could not be told)."""
    import torch

    config = hf_model.config.get_text_config()
    n_layers = getattr(config, "num_hidden_layers", None)
    modules = dict(hf_model.named_modules())
    names = {id(m): n for n, m in modules.items()}
    notes: list[str] = []
    lists = [
        name
        for name, module in modules.items()
        if isinstance(module, torch.nn.ModuleList)
        and len(module) > 0
        and (n_layers is None or len(module) == n_layers)
        and len(list(module[0].children())) >= 2
    ]
    lists = [n for n in lists if not any(n != o and n.startswith(o + ".") for o in lists)]
    if len(lists) != 1:
        raise ScaffoldError(
            f"cannot tell which module list holds the layers: {', '.join(lists) or 'none'} "
            f"(config.num_hidden_layers = {n_layers})"
        )
    layers = lists[0]
    out: dict[str, str | bool] = {}
    prefix = getattr(hf_model, "base_model_prefix", "") or ""
    model_name = prefix if prefix and layers.startswith(prefix + ".") else layers.split(".")[0]
    out["model_name"] = model_name
    out["layers_name"] = layers
    embed = hf_model.get_input_embeddings()
    if embed is not None and id(embed) in names:
        out["embed_name"] = names[id(embed)]
    layer = modules[layers][0]
    children = dict(layer.named_children())
    attn = [n for n, m in children.items() if re.search(r"attn|attention", type(m).__name__, re.I)]
    if len(attn) == 1:
        out["attn_name"] = attn[0]
    else:
        notes.append(
            f"attention: {'several children look like it: ' + ', '.join(attn) if attn else 'no child looks like it'}"
        )
    mlp = [
        n
        for n, m in children.items()
        if n in ("mlp", "ffn", "feed_forward", "block_sparse_moe")
        or re.search(r"mlp|feedforward|ffn|moe|experts", type(m).__name__, re.I)
    ]
    if len(mlp) == 1:
        out["mlp_name"] = mlp[0]
    elif not mlp:
        out["ignore_mlp"] = True  # nnterp refuses to load a model without one otherwise
        notes.append(
            "no child of the layer is an MLP module (its parts sit in the layer itself, "
            f"as on OPT: {', '.join(children)}), so rename says ignore_mlp: true and the "
            "places on the MLP cannot be found; refuse them with a reason (see opt.yaml)"
        )
    else:
        notes.append(f"MLP: several children look like it: {', '.join(mlp)}")
    base = modules.get(model_name)
    if base is not None:
        norms = [
            f"{model_name}.{n}"
            for n, m in base.named_children()
            if re.search(r"norm", type(m).__name__, re.I) or re.match(r"ln|norm", n)
        ]
        if len(norms) == 1:
            out["ln_final_name"] = norms[0]
        else:
            notes.append(
                f"final norm: {'several candidates: ' + ', '.join(norms) if norms else 'none found'}"
            )
    head = hf_model.get_output_embeddings()
    if head is not None and id(head) in names:
        out["lm_head_name"] = names[id(head)]
    return out, notes


def load(
    spec: str,
    containers: dict[str, str | bool],
    rows: dict[str, Address],
    probs: bool,
    **kwargs: Any,
) -> Any:
    from causalab_mini.model import StandardizedTransformer

    config = RenameConfig(**containers, addresses=rows)  # type: ignore[arg-type]
    model = StandardizedTransformer(
        spec, rename_config=config, enable_attention_probs=probs, **kwargs
    )
    model.dispatch()
    return model


def force_structure(model: Any, structure: str | None) -> None:
    """Resolve the model's places as if its block were ``structure``."""
    from causalab_mini.internals import Internals

    rows = {name: place.row for name, place in model.internals._places.items()}
    model.block_structure = structure
    model.internals = Internals(model, rows)


# -------------------------------------------------------------------------- capture


@dataclass
class Capture:
    """Every module's input and output on every layer, from one forward pass."""

    num_layers: int
    paths: list[list[str]]  # per layer: standardized module paths ("" is the layer)
    kinds: dict[str, str]  # path -> module class name (layer 0)
    params: dict[str, bool]  # path -> has parameters of its own
    inputs: dict[tuple[str, int], Any]
    outputs: dict[tuple[str, int], Any]
    tuple_out: set[tuple[str, int]]
    inplace: set[tuple[str, int]]
    hidden_states: tuple[Any, ...]
    logits: Any

    def exists(self, path: str) -> bool:
        return all(path in p for p in self.paths)

    def value(self, cand: Candidate, layer: int, scales: dict[str, float]) -> Any | None:
        store = self.inputs if cand.io == "input" else self.outputs
        value = store.get((cand.module, layer))
        if value is None:
            return None
        if cand.scale:
            value = value * scales[cand.scale]
        return value


def walk_layer(envoy: Any) -> Iterator[tuple[str, Any]]:
    """(standardized path, torch module) for the layer and every module below it."""
    yield "", envoy._module

    def walk(env: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        aliases = aliases_of(env)
        for sub in env._children:
            name = sub.path.split(".")[-1]
            # the layer's own children by their standardized names (self_attn, mlp);
            # deeper modules by their own (DBRX's self_attn.attn, not self_attn.self_attn)
            if not prefix and name in aliases:
                name = aliases[name][0]
            path = f"{prefix}{name}"
            yield path, sub._module
            yield from walk(sub, f"{path}.")

    yield from walk(envoy, "")


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any | None:
    import torch

    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"]
    for value in kwargs.values():
        if isinstance(value, torch.Tensor):
            return value
    return None


def capture(model: Any, inputs: dict[str, Any]) -> Capture:
    import torch

    n = len(model.layers)
    paths: list[list[str]] = []
    ins: dict[tuple[str, int], Any] = {}
    outs: dict[tuple[str, int], Any] = {}
    refs: dict[tuple[str, int], Any] = {}
    tuples: set[tuple[str, int]] = set()
    kinds: dict[str, str] = {}
    params: dict[str, bool] = {}
    handles = []

    def hook(key: tuple[str, int]) -> Any:
        def fn(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if key in outs or key in ins:
                return  # the first call is the place; a module called twice is noted
            x = _first_tensor(args, kwargs)
            if x is not None:
                ins[key] = x.detach().clone()
            value = out[0] if isinstance(out, tuple) and out else out
            if isinstance(out, tuple):
                tuples.add(key)
            if isinstance(value, torch.Tensor):
                outs[key] = value.detach().clone()
                refs[key] = value

        return fn

    for layer in range(n):
        layer_paths = []
        for path, module in walk_layer(model.layers[layer]):
            layer_paths.append(path)
            if layer == 0:
                kinds[path] = type(module).__name__
                params[path] = any(True for _ in module.parameters(recurse=False))
            handles.append(module.register_forward_hook(hook((path, layer)), with_kwargs=True))
        paths.append(layer_paths)
    try:
        with torch.no_grad():
            out = model._model(**inputs, output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    inplace = {
        key
        for key, ref in refs.items()
        if ref.shape != outs[key].shape or not torch.equal(ref.detach(), outs[key])
    }
    return Capture(
        num_layers=n,
        paths=paths,
        kinds=kinds,
        params=params,
        inputs=ins,
        outputs=outs,
        tuple_out=tuples,
        inplace=inplace,
        hidden_states=tuple(out.hidden_states or ()),
        logits=out.logits,
    )


# --------------------------------------------------------------------------- search


def _scales(config: Any) -> dict[str, float]:
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


class _Search:
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
            total = parts[0]
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


def _layers_text(n: int) -> str:
    return "layer 0" if n == 1 else f"layers 0-{n - 1}"


def try_structure(search: _Search, structure: str) -> StructureTrial:
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
        f"{evidence}, on {_layers_text(search.cap.num_layers)}",
        solutions=solutions,
        verified_places=places,
    )


def _module_output_is_stream(search: _Search, trial: StructureTrial) -> list[str]:
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
    search: _Search,
    trials: list[StructureTrial],
    layer_has: Callable[[str], bool] | None = None,
) -> tuple[str | None, str]:
    """The one structure that passes and is not contradicted, or None with why.
    ``layer_has(path)``: whether the layer holds that attribute (a structure's
    output_scale weight); a structure whose weight the layer lacks is ruled out, and
    where the layer has it, so is one stating the same identities without it."""
    passed = [t for t in trials if t.passed]
    if layer_has is not None:
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
    found: dict[str, str] = {}  # place -> the identity (and where) that verified it
    for t in passed:
        solution = t.solutions[0]
        for text in BLOCK_STRUCTURES[t.name].identities:
            left, right = parse_identity(text)
            for place in (left, *right):
                if place in solution:
                    found.setdefault(
                        place, f"{text} holds with {place} at {solution[place].describe()}"
                    )
    for t in passed:
        for place, entries in STRUCTURAL_ADDRESSES.items():
            entry = entries.get(t.name)
            if entry is not None and entry.reason is not None and place in found:
                t.ruled_out = f"it has no {place}, yet {found[place]}"
                break
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
    # a structure whose identities are a strict part of another passing structure's
    # says less about the block: the one that states (and passes) more is the block
    for t in passed:
        if t.ruled_out:
            continue
        mine = set(BLOCK_STRUCTURES[t.name].identities)
        for other in passed:
            theirs = set(BLOCK_STRUCTURES[other.name].identities)
            if not other.ruled_out and mine < theirs:
                t.ruled_out = f"{other.name} states all of its identities and more, and they hold"
                break
    left = [t for t in passed if not t.ruled_out]
    if len(left) == 1:
        return left[0].name, left[0].evidence
    if not left:
        return None, "no known structure's identities hold on this block"
    return None, f"several structures pass and none is ruled out: {', '.join(t.name for t in left)}"


# --------------------------------------------------------------------------- places


def _canonical(model: Any, path: str) -> str | None:
    """The walk's spelling of a module path the runtime resolves (nnsight answers to a
    module's own name and its alias: DBRX's self_attn.attn is self_attn.self_attn)."""
    from causalab_mini.internals import child

    envoy = child(model.layers[0], path)
    if envoy is None:
        return None
    target = envoy._module
    for walked, module in walk_layer(model.layers[0]):
        if module is target:
            return walked
    return None


def _table_resolution(model: Any, search: _Search, place: str, structure: str) -> Candidate | None:
    """The candidate the runtime picks from structural.yaml (the one that exists)."""
    entry = STRUCTURAL_ADDRESSES.get(place, {}).get(structure)
    if entry is None or entry.reason is not None:
        return None
    found = [p for p in (_canonical(model, c) for c in entry.candidates) if p is not None]
    if len(found) != 1:
        return None
    return search.cand(found[0], ROWS[place].io.value)


def _default_candidate(model: Any, search: _Search, place: str, structure: str) -> Candidate | None:
    row = ROWS[place]
    if row.is_structural:
        return _table_resolution(model, search, place, structure)
    return search.cand(row.module, row.io.value)


def _skip_layers(model: Any, place: str) -> set[int]:
    """Layers where the default row refuses the place by layer kind (MoE layers)."""
    out: set[int] = set()
    for item in ROWS[place].unavailable:
        if item.when.kind == "layer_kind" and item.when.layer_kind:
            for layer in range(len(model.layers)):
                if model.internals._layer_kind(item.when.layer_kind, layer):
                    out.add(layer)
    return out


def _outermost(cands: list[Candidate], same: Any) -> Candidate | None:
    """Of candidates that hold one tensor, the module every other one is inside."""
    for outer in cands:
        if outer.scale or outer.io != "output":
            continue
        if all(
            c == outer
            or (c.module.startswith(outer.module + ".") and c.scale is None and same(c, outer))
            for c in cands
        ):
            return outer
    return None


def _pick(
    place: str,
    passing: list[Candidate],
    default: Candidate | None,
    evidence: str,
    row: Address,
    same: Any = None,
    check: str = "",
) -> Verdict:
    """default if the runtime's own resolution passes; the one candidate that passes;
    or several / none, for a person to decide."""
    verdict = _pick_inner(place, passing, default, evidence, row, same)
    verdict.check = check
    return verdict


def _pick_inner(
    place: str,
    passing: list[Candidate],
    default: Candidate | None,
    evidence: str,
    row: Address,
    same: Any,
) -> Verdict:
    unique = list(dict.fromkeys(passing))
    if default is not None and default in unique:
        fields = default.row_fields(row) if not row.is_structural else {}
        if default.snapshot and not row.snapshot:
            fields = {"snapshot": True}
            return Verdict(
                place,
                "verified",
                f"{evidence}; the forward modifies {default.module}'s output in place after "
                "it returns, so a read copies it (snapshot)",
                default,
                fields=fields,
            )
        return Verdict(place, "default", evidence, default)
    outer = _outermost(unique, same) if same is not None else None
    if outer is not None and len(unique) > 1:
        inner = ", ".join(c.describe() for c in unique if c != outer)
        evidence += f"; {inner} hold{'s' if len(unique) == 2 else ''} the same tensor inside it"
        unique = [outer]
    if len(unique) == 1:
        return Verdict(place, "verified", evidence, unique[0], fields=unique[0].row_fields(row))
    if unique:
        return Verdict(place, "ambiguous", evidence, choices=unique)
    return Verdict(place, "missing", evidence)


def place_verdicts(
    model: Any, search: _Search, structure: str, trial: StructureTrial
) -> dict[str, Verdict]:
    """Every per-layer place of the default rows, for ``structure``."""
    out: dict[str, Verdict] = {}
    span = _layers_text(search.cap.num_layers)
    solutions = trial.solutions
    for text in BLOCK_STRUCTURES[structure].identities:
        left, right = parse_identity(text)
        for place in (left, *right):
            if place in out:
                continue
            passing = [s[place] for s in solutions]
            row = ROWS[place]
            default = _default_candidate(model, search, place, structure)
            where = sorted({c.describe() for c in passing})
            out[place] = _pick(
                place,
                passing,
                default,
                f"{text} on {span} ({', '.join(where)})",
                row,
                search.same,
                text,
            )
    chosen = {p: v.chosen for p, v in out.items() if v.chosen is not None}
    for place in RELATIONS:
        out[place] = _relation(model, search, structure, place, chosen)
    return out


def _relation(
    model: Any,
    search: _Search,
    structure: str,
    place: str,
    chosen: dict[str, Candidate],
) -> Verdict:
    row = ROWS[place]
    entry = STRUCTURAL_ADDRESSES.get(place, {}).get(structure)
    if entry is not None and entry.reason is not None:
        return Verdict(place, "refused", entry.reason.replace("{place}", place))
    skip = _skip_layers(model, place)
    layers = [i for i in search.layers() if i not in skip]
    if not layers:
        reason = model.internals[place].unavailable_on(0) if place in model.internals else None
        return Verdict(place, "refused", reason or "refused on every layer by its row")
    span = _layers_text(len(layers)) if not skip else f"layers {layers}"
    default = _table_resolution(model, search, place, structure)
    cap = search.cap

    def same(a: Candidate, b: Candidate) -> bool:
        return search.holds(a, [b], layers)[0]

    def under(prefix: str, io: str, *, params: bool | None = None) -> list[Candidate]:
        out = []
        for path in cap.paths[layers[0]] if layers else ():
            if not path.startswith(prefix + "."):
                continue
            if params is not None and cap.params.get(path, False) != params:
                continue
            if all((path, i) in (cap.inputs if io == "input" else cap.outputs) for i in layers):
                out.append(search.cand(path, io))
        return out

    if place == "attentions_norm_output":
        target = search.cand("self_attn", "input")
        passing = [c for c in search.stream_shaped("output") if same(c, target)]
        evidence = f"{place} == attentions_input (the attention reads it) on {span}"
        check = f"{place} == attentions_input"
    elif place in ("attentions_premix", "mlps_neurons"):
        module = "self_attn" if place == "attentions_premix" else "mlp"
        contribution = chosen.get("attentions_output" if module == "self_attn" else "mlps_output")
        targets = [search.cand(module, "output")]
        if contribution is not None:
            targets.append(dataclasses.replace(contribution, scale=None))
        passing = []
        for c in under(module, "input", params=True):
            out_side = search.cand(c.module, "output")
            if any(same(out_side, t) for t in targets):
                passing.append(c)
        what = "the attention's" if module == "self_attn" else "the MLP's"
        evidence = (
            f"the module whose input is {place} returns {what} output (or its "
            f"contribution) on {span}"
        )
        check = f"its module returns {what} output"
    else:  # mlps_activation: the down projection reads it (gated: times another branch)
        neurons = _relation(model, search, structure, "mlps_neurons", chosen)
        down = neurons.chosen
        if down is None:
            return Verdict(
                place,
                "unchecked" if default else "missing",
                "no down projection was verified, so nothing checks the activation"
                + (f"; structural.yaml resolves it to {default.module}" if default else ""),
                default,
            )
        passing = []
        branches = under("mlp", "output")
        for c in under("mlp", "output"):
            # an activation function: no weights of its own (xIELU has a few, and says
            # so in its name), and not a norm or a dropout that happens to sit there
            kind = cap.kinds.get(c.module, "")
            if c.module == down.module or re.search(r"norm|dropout|linear", kind, re.I):
                continue
            if cap.params.get(c.module) and not ACTIVATION_NAME.search(kind):
                continue
            if same(down, c):
                passing.append(c)
                continue
            for other in branches:
                if other.module in (c.module, down.module):
                    continue
                if _gated(search, down, c, other, layers):
                    passing.append(c)
                    break
        evidence = (
            f"mlps_neurons ({down.module}.input) == {place}, or {place} times another "
            f"branch of the MLP (a gated MLP), on {span}"
        )
        check = f"mlps_neurons == {place} (x gate)"
    verdict = _pick(place, passing, default, evidence, row, same, check)
    if verdict.status == "missing" and default is not None:
        # the runtime would read the structural table's module, which failed the check:
        # a person decides (keep it, name another module, or refuse the place)
        verdict.evidence = (
            f"structural.yaml resolves it to {default.module}, which fails {check}, and no "
            f"other module passes ({evidence}); with no row the runtime reads "
            f"{default.describe()}"
        )
    return verdict


def _gated(
    search: _Search, down: Candidate, act: Candidate, other: Candidate, layers: list[int]
) -> bool:
    for layer in layers:
        want = search.value(down, layer)
        a, b = search.value(act, layer), search.value(other, layer)
        if want is None or a is None or b is None or a.shape != b.shape or a.shape != want.shape:
            return False
        if not difference(want, a * b)[0]:
            return False
    return True


# ---------------------------------------------------------------- probabilities


def _probability_rows() -> list[Address]:
    """The default attention_probabilities row, then every family's, once each."""
    rows = [DEFAULT_ADDRESSES["attention_probabilities"]]
    for _, family_rows in FAMILY_ADDRESSES:
        row = family_rows.get("attention_probabilities")
        if row is not None and all((row.module, row.source) != (r.module, r.source) for r in rows):
            rows.append(row)
    return rows


def _probabilities(model: Any, rows: dict[str, Address]) -> Verdict:
    """Try each known way to the probabilities against output_attentions, on one
    model loaded with eager attention (the runtime reads the row; nnterp's own
    load-time check runs later, on the chosen row)."""
    from causalab_mini.internals import Internals
    from causalab_mini.tools.certify import attention_oracle, sample_inputs

    inputs = sample_inputs(model)
    passing: list[Address] = []
    failures: list[str] = []
    default = DEFAULT_ADDRESSES["attention_probabilities"]
    for row in _probability_rows():
        described = ".".join([row.module, *row.source])
        enabled = dataclasses.replace(
            row,
            unavailable=tuple(
                u for u in row.unavailable if u.when.kind != "attention_probs_disabled"
            ),
        )
        model.internals = Internals(model, {**rows, "attention_probabilities": enabled})
        try:
            checks = attention_oracle(model, inputs)
        except Exception as exc:
            failures.append(f"{described}: {_first_reason(exc)}")
            continue
        if checks and all(c.ok for c in checks):
            passing.append(row)
            if row == default:
                break  # the default row holds; the others need not be tried
        elif checks:
            worst = max(c.max_error for c in checks)
            failures.append(f"{described}: output_attentions differs (max error {worst:.3g})")
        else:
            reason = model.internals.status().get("attention_probabilities")
            failures.append(f"{described}: {reason}")
    place = "attention_probabilities"
    if passing and passing[0] == default:
        return Verdict(
            place,
            "default",
            "output_attentions == attention_probabilities on every layer (eager)",
            Candidate(default.module, "output"),
            check="output_attentions == attention_probabilities",
        )
    if len(passing) == 1:
        row = passing[0]
        fields: dict[str, Any] = {"source": list(row.source)}
        if row.module != default.module:
            fields["module"] = row.module
        return Verdict(
            place,
            "verified",
            "output_attentions == attention_probabilities on every layer (eager); the "
            f"default row does not reach them ({failures[0] if failures else ''})",
            Candidate(row.module, "output"),
            fields=fields,
            check="output_attentions == attention_probabilities",
        )
    if passing:
        return Verdict(
            place,
            "ambiguous",
            "several needle sets match output_attentions",
            choices=[Candidate(".".join([r.module, *r.source]), "output") for r in passing],
        )
    return Verdict(
        place,
        "missing",
        "no known needle set reaches the probabilities: " + "; ".join(failures),
    )


# ----------------------------------------------------------------------- the whole


def _first_reason(exc: BaseException) -> str:
    """The most specific message in an exception chain, on one line."""
    from causalab_mini.ops import OperationNotFound

    # nnsight re-raises an error inside a trace as text holding the traceback
    found = re.search(
        r"OperationNotFound: (.*?)(?: Fix the row's needle| Its operations are:|$)", str(exc), re.S
    )
    if found:
        return " ".join(found.group(1).split())[:300]
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OperationNotFound):
            text = re.split(r" Fix the row's needle| Its operations are:", str(seen))[0]
            return " ".join(text.split())[:300]
        seen = seen.__cause__ or seen.__context__
    raised = re.findall(
        r"^[\w.]*(?:Error|Exception|Unavailable|NotFound|Refused): (.+)$", str(exc), re.M
    )
    if raised:
        return raised[-1].strip()[:300]
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def _nnterp_container(model: Any, name: str) -> str | None:
    """The module path nnterp itself resolved for one of its containers."""
    try:
        path = str(getattr(model, name).path)
    except Exception:
        return None
    return path.removeprefix("model.") if path.startswith("model.") else None


def _rows_for(verdicts: dict[str, Verdict]) -> dict[str, Address]:
    rows = dict(DEFAULT_ADDRESSES)  # every name, so no existing family's row leaks in
    for name, verdict in verdicts.items():
        if verdict.status == "verified" and verdict.fields:
            rows[name] = dataclasses.replace(ROWS[name], **address_fields(verdict.fields))
    return rows


def _existing_rule(model: Any) -> str | None:
    names = tuple(c.__name__ for c in type(model._model).__mro__)
    for rule in BLOCK_STRUCTURE_RULES:
        if rule.match.matches(names, model.model_type, model.text_config):
            return rule.structure
    return None


def _structural_flags(config: Any) -> list[str]:
    """Boolean config attributes whose names suggest they change the block."""
    pattern = re.compile(
        r"parallel|residual|post_?(?:layer_?)?norm|pre_?(?:layer_?)?norm|sandwich|alibi|"
        r"new_decoder|norm_before|norm_after",
        re.I,
    )
    return [
        f"{key}={value}"
        for key, value in sorted(config.to_dict().items())
        if isinstance(value, bool) and pattern.search(key) and not key.startswith("use_cache")
    ]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for package in ("causalab-mini", "transformers", "nnsight", "nnterp", "torch"):
        try:
            out[package] = version(package)
        except Exception:
            continue
    return out


def scaffold(arg: str, family: str | None = None) -> Scaffold:
    """Inspect, try and verify: everything a family file for ``arg`` can say."""
    import transformers

    from causalab_mini.tools import certify
    from causalab_mini.tools.tiny import TinyBuildError, build_class, resolve_model_spec

    _quiet()
    spec, model_type = resolve_spec(arg)
    try:
        path = resolve_model_spec(spec)
        hf_model = getattr(transformers, build_class(model_type)).from_pretrained(path)
    except (TinyBuildError, OSError, ValueError) as exc:
        raise ScaffoldError(f"cannot build or load {spec}: {exc}") from exc
    containers, notes = detect_containers(hf_model)
    model_class = type(hf_model).__name__
    del hf_model
    family = family_name(model_type, family)
    try:
        # eager attention: the probabilities are tried on this model too
        model = load(spec, containers, dict(DEFAULT_ADDRESSES), False, attn_implementation="eager")
    except Exception as exc:
        raise ScaffoldError(
            f"nnterp does not load {spec} with the containers found "
            f"({', '.join(f'{k}={v}' for k, v in containers.items())}): {exc}"
        ) from exc
    if "ln_final_name" not in containers:
        found = _nnterp_container(model, "ln_final")
        if found:  # the hidden-state oracle below checks it
            containers["ln_final_name"] = found
            notes[:] = [n for n in notes if not n.startswith("final norm")]
    inputs = certify.sample_inputs(model)
    cap = capture(model, inputs)
    search = _Search(cap, _scales(model.text_config))
    trials = [try_structure(search, name) for name in BLOCK_STRUCTURES]
    layer0 = model.internals.layer_envoy(0)._module

    def layer_has(path: str) -> bool:
        value: Any = layer0
        for part in path.split("."):
            value = getattr(value, part, None)
        return value is not None

    structure, structure_evidence = decide_structure(search, trials, layer_has)
    verdicts: dict[str, Verdict] = {}
    if structure is not None:
        trial = next(t for t in trials if t.name == structure)
        verdicts = place_verdicts(model, search, structure, trial)
    else:
        for text in {t for s in BLOCK_STRUCTURES.values() for t in s.identities}:
            left, right = parse_identity(text)
            for place in (left, *right):
                if ROWS[place].is_structural or place in CONTRIBUTIONS:
                    verdicts.setdefault(
                        place,
                        Verdict(
                            place,
                            "missing",
                            f"depends on the block structure, which is undecided: {structure_evidence}",
                        ),
                    )
    rows = _rows_for(verdicts)
    probs = _probabilities(model, rows)
    verdicts["attention_probabilities"] = probs
    rows = _rows_for(verdicts)
    enabled = probs.status in ("default", "verified")
    try:
        verify_model = load(spec, containers, rows, enabled)
    except Exception as exc:  # nnterp's own load-time check of the probabilities
        if not enabled:
            raise
        probs.status = "missing"
        probs.evidence += f"; but nnterp's load-time check refuses it: {_first_reason(exc)}"
        rows = _rows_for(verdicts)
        verify_model = load(spec, containers, rows, False)
    force_structure(verify_model, structure)
    inputs = certify.sample_inputs(verify_model)
    values, unreadable = _read_all(verify_model, inputs)
    checks = certify.identities(verify_model, values)
    checks += certify.hidden_state_oracle(verify_model, inputs, values)
    if probs.status in ("default", "verified"):
        checks += _guarded(lambda: certify.attention_oracle(verify_model, inputs), notes)
    if structure is not None and not unreadable:
        write = _guarded(lambda: [certify.write_reaches_stream(verify_model, inputs)], notes)
        checks += [c for c in write if c is not None]
    for name, reason in unreadable.items():
        verdicts[name] = Verdict(name, "missing", f"the runtime cannot read it: {reason}")
    n = verify_model.internals.num_layers
    for layer in range(n):
        a, b = ("attentions_norm_output", layer), ("attentions_input", layer)
        if a in values and b in values:
            checks.append(
                certify.compare(
                    "attentions_norm_output == attentions_input", layer, values[a], values[b]
                )
            )
    passed, failures = _summarize(checks, n)
    _demote(verdicts, failures)
    _fill_defaults(verdicts, passed, verify_model)
    if "layers_input" in verdicts and any(p.startswith("hidden_states[i]") for p in passed):
        verdicts["layers_input"].check = "hidden_states[i] == layers_input"
    identity_failed = any(
        f.split(":")[0] in {t for s in BLOCK_STRUCTURES.values() for t in s.identities}
        or f.startswith("layers_output")
        for f in failures
    )
    if structure is not None and identity_failed:
        structure_evidence += "; but the proof through the runtime failed: " + "; ".join(failures)
        structure = None
    oracle = [c for c in checks if c.name.startswith(("hidden_states", "model logits"))]
    container_evidence = "nnterp loads the model with these containers"
    if oracle and all(c.ok for c in oracle):
        container_evidence += ", and transformers' own outputs agree: " + ", ".join(
            sorted({c.name for c in oracle})
        )
    elif oracle:
        notes.append(
            "transformers' hidden_states or logits disagree with the places they name: "
            "check the containers (layers_name, ln_final_name)"
        )
    return Scaffold(
        spec=spec,
        model_type=model_type,
        model_class=model_class,
        family=family,
        num_layers=n,
        containers=containers,
        container_evidence=container_evidence,
        structure=structure,
        structure_evidence=structure_evidence,
        trials=trials,
        verdicts={name: verdicts[name] for name in ROWS if name in verdicts},
        checks=passed,
        failures=failures,
        existing_rule=_existing_rule(verify_model),
        structural_flags=_structural_flags(verify_model.text_config),
        notes=notes,
        versions=_versions(),
    )


def _read_all(model: Any, inputs: dict[str, Any]) -> tuple[dict[Any, Any], dict[str, str]]:
    """certify.read_places over every place; where one trace fails, place by place, so
    one unreadable row names itself instead of failing the whole proof."""
    from causalab_mini.tools import certify

    try:
        return certify.read_places(model, inputs), {}
    except Exception:
        pass
    values: dict[Any, Any] = {}
    bad: dict[str, str] = {}
    for name in model.internals:
        if model.internals[name].row.io is IOType.MODULE:
            continue
        try:
            values.update(certify.read_places(model, inputs, [name]))
        except Exception as exc:
            bad[name] = _first_reason(exc)
    return values, bad


def _guarded(run: Any, notes: list[str]) -> list[Any]:
    try:
        return list(run())
    except Exception as exc:
        notes.append(f"a check could not run: {_first_reason(exc)}")
        return []


def _fill_defaults(verdicts: dict[str, Verdict], passed: list[str], model: Any) -> None:
    """The places no search decided: default rows, with what checked them (if anything)."""
    for name, row in DEFAULT_ADDRESSES.items():
        if name in verdicts:
            continue
        proof = [p for p in passed if re.search(rf"\b{name}\b", p.split(" on ")[0])]
        if row.io is IOType.MODULE:
            verdicts[name] = Verdict(
                name, "default", f"the module {row.module} exists", check="the module exists"
            )
        elif proof:
            verdicts[name] = Verdict(
                name, "default", "; ".join(proof), check=proof[0].split(" on ")[0]
            )
        else:
            reason = model.internals.status().get(name)
            verdicts[name] = Verdict(
                name,
                "unchecked" if reason is None else "refused",
                reason or f"the default row reads {row.describe()}; no identity or oracle names it",
            )


def _summarize(checks: list[Any], n: int) -> tuple[list[str], list[str]]:
    """certify's checks grouped by name: the ones that held, and the ones that failed."""
    by_name: dict[str, list[Any]] = {}
    for check in checks:
        by_name.setdefault(check.name, []).append(check)
    passed, failed = [], []
    for name, group in by_name.items():
        worst = max(c.max_error for c in group)
        layers = [c.layer for c in group if c.layer is not None]
        where = (
            "the whole model"
            if not layers
            else _layers_text(n)
            if len(layers) == n
            else f"layers {layers}"
        )
        if all(c.ok for c in group):
            passed.append(f"{name} on {where} (max error {worst:.1e})")
        else:
            bad = [c.layer for c in group if not c.ok]
            failed.append(
                f"{name}: fails on {bad if layers else 'the whole model'} (max error {worst:.3g})"
            )
    return passed, failed


def _demote(verdicts: dict[str, Verdict], failures: list[str]) -> None:
    """A written row whose proof failed is not written: it becomes a choice."""
    for failure in failures:
        named = set(re.findall(r"[a-z_]+", failure.split(":")[0]))
        for name in named & set(verdicts):
            verdict = verdicts[name]
            if verdict.status == "verified":
                verdict.status = "ambiguous"
                verdict.choices = [verdict.chosen] if verdict.chosen else []
                verdict.evidence += f"; but the proof failed: {failure}"


# ------------------------------------------------------------------------ writing

WIDTH = 92


def _comment(text: str, indent: str = "", first: str = "") -> list[str]:
    """``text`` as YAML comment lines of at most WIDTH columns."""
    prefix = f"{indent}# "
    lines = textwrap.wrap(
        text,
        width=WIDTH - len(prefix),
        initial_indent=first,
        subsequent_indent=" " * len(first) if first.endswith("  ") else "",
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [(prefix + line).rstrip() for line in lines] or [prefix.rstrip()]


def _yaml_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v) for v in value) + "]"
    text = str(value)
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_ .,()/+-]*", text)
    if plain and text not in ("null", "true", "false") and not text.endswith(" "):
        return text
    return json.dumps(text)  # a YAML double-quoted scalar


def _row_lines(place: str, fields: dict[str, Any], indent: str = "  ") -> list[str]:
    lines = [f"{indent}{place}:"]
    lines += [f"{indent}  {key}: {_yaml_scalar(value)}" for key, value in fields.items()]
    return lines


def _choice_fields(verdict: Verdict, choice: Candidate) -> dict[str, Any]:
    if verdict.place == "attention_probabilities":
        _, _, needles = choice.module.partition(".")
        fields: dict[str, Any] = {}
        default = DEFAULT_ADDRESSES["attention_probabilities"]
        for row in _probability_rows():
            if ".".join([row.module, *row.source]) == choice.module:
                if row.module != default.module:
                    fields["module"] = row.module
                fields["source"] = list(row.source)
        return fields or {"source": [needles]}
    return choice.row_fields(ROWS[verdict.place]) or {"module": choice.module}


def rule_text(structure: str, model_type: str, spec: str) -> list[str]:
    return [
        f"  - structure: {structure}  # verified by `registry new-family {spec}`",
        f"    model_types: [{model_type}]",
    ]


def render_family(sc: Scaffold, *, rule_written: bool = False) -> str:
    """The family file: verified rows as rows, the rest as comments to decide."""
    v = sc.versions
    out = ["# yaml-language-server: $schema=../../schema/family.schema.json", "#"]
    out += _comment(
        f"{sc.model_class}: scaffolded by `registry new-family {sc.spec}` on a tiny random "
        f"instance ({sc.num_layers} layers; transformers {v.get('transformers', '?')}, nnsight "
        f"{v.get('nnsight', '?')}, nnterp {v.get('nnterp', '?')}). Every row below passed the "
        "check named above it, on that instance. A line starting `DECIDE` marks a choice for "
        "a person: the candidates follow it, commented out, with their evidence. Then run "
        "`registry lint` and `registry gen`. Fields: see gpt2.yaml."
    )
    out.append("#")
    trials = {t.name: t for t in sc.trials}
    if sc.structure is not None:
        out += _comment(f"Block structure: {sc.structure}, verified: {sc.structure_evidence}.")
    else:
        out += _comment(f"DECIDE the block structure: {sc.structure_evidence}.")
        out += _comment(
            "Where none of the structures applies, give no rule and say why in "
            "structure_unknown_reason: (the reason of every structural place; see dory.yaml)."
        )
    others = [
        f"{t.name} ({t.ruled_out or t.evidence})" for t in trials.values() if t.name != sc.structure
    ]
    if others:
        out += _comment("Not " + "; not ".join(others) + ".")
    if sc.structure is not None:
        if sc.existing_rule == sc.structure:
            out += _comment("block_structures.yaml already gives this structure.")
        elif sc.existing_rule is not None:
            out += _comment(
                f"DECIDE: block_structures.yaml gives {sc.existing_rule} for this model, but "
                f"only {sc.structure} passes here; check the rule (is it config-dependent?)."
            )
        elif rule_written:
            out += _comment("Its rule was added to block_structures.yaml:")
            out += ["#" + line for line in rule_text(sc.structure, sc.model_type, sc.spec)]
        else:
            out += _comment("Add its rule to the rules of block_structures.yaml:")
            out += ["#" + line for line in rule_text(sc.structure, sc.model_type, sc.spec)]
    if sc.structural_flags:
        out += _comment(
            "Verified for this config only. These config values may switch the structure: "
            f"{', '.join(sc.structural_flags)}; rebuild with tiny:{sc.model_type}?<key>=<value> "
            "and run this command again (a rule can match on config values)."
        )
    defaults = [x for x in sc.verdicts.values() if x.status == "default"]
    if defaults:
        out.append("#")
        out += _comment("Checked with the default rows (no row needed):")
        width = max(len(x.place) for x in defaults)
        out += [f"#   {x.place:{width}}  {x.check or x.evidence}".rstrip() for x in defaults]
    unchecked = [x for x in sc.verdicts.values() if x.status == "unchecked"]
    if unchecked:
        out += _comment(
            "Default rows nothing here checks: "
            + ", ".join(
                f"{x.place} ({x.chosen.describe()})" if x.chosen else x.place for x in unchecked
            )
            + "."
        )
    refused = [x for x in sc.verdicts.values() if x.status == "refused"]
    if refused:
        out += _comment(
            f"Refused on {'a ' + sc.structure if sc.structure else 'this'} block, with the "
            f"registry's reason: {', '.join(x.place for x in refused)}."
        )
    for note in sc.notes:
        out += _comment(f"Note: {note}")
    if sc.failures:
        out += _comment("The proof through the runtime failed: " + "; ".join(sc.failures))
    out += [
        "schema_version: 1",
        f"family: {sc.family}",
        f"doc: {_yaml_scalar(f'{sc.model_class} checkpoints (model_type {sc.model_type}).')}",
        "match:",
        f"  model_types: [{_yaml_scalar(sc.model_type)}]",
        f"  classes: [{sc.model_class}]",
    ]
    out += _comment(f"verified: {sc.container_evidence}.")
    out.append("rename:")
    for key, value in sc.containers.items():
        out.append(f"  {key}: {_yaml_scalar(value)}")
    rows = [x for x in sc.verdicts.values() if x.status == "verified" and x.fields]
    undecided = sc.undecided
    if rows:
        out.append("addresses:")
    elif undecided:
        out.append("# addresses:  (uncomment it with the first choice you uncomment below)")
    for x in rows:
        out += _comment(f"verified: {x.evidence}", "  ")
        out += _row_lines(x.place, x.fields)
    for x in undecided:
        if x.status == "ambiguous":
            head = (
                f"DECIDE {x.place}: {len(x.choices)} candidates pass ({x.evidence}); uncomment one."
            )
        else:
            head = f"DECIDE {x.place}: no candidate passes ({x.evidence})."
        out += _comment(head, "  ")
        for choice in x.choices:
            out += ["  # " + line for line in _row_lines(x.place, _choice_fields(x, choice), "")]
        if x.status == "missing":
            out += _comment("Name its module, or refuse the place with a reason:", "  ")
            out += [
                f"  # {x.place}:",
                "  #   module: <module path relative to the layer>",
                f"  # {x.place}:",
                "  #   unavailable:",
                "  #     - when: always",
                "  #       reason: >-",
                "  #         {place} does not exist on this model: <why>.",
            ]
    return "\n".join(out) + "\n"


def add_rule(path: Path, structure: str, model_type: str, spec: str) -> None:
    """Append a rule to the rules of a block_structures.yaml, keeping its text."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "rules:"), None)
    if start is None:
        raise ScaffoldError(f"{path} has no top-level `rules:`; add the rule by hand")
    end = len(lines)
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line[0].isspace() and not line.startswith(("#", "-")):
            end = i
            break
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if end and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    new = [line + "\n" for line in rule_text(structure, model_type, spec)]
    path.write_text("".join(lines[:end] + new + lines[end:]), encoding="utf-8")


@dataclass
class Written:
    family_file: Path | None
    rule_file: Path | None
    text: str


def _target(registry_dir: Path | None, out: Path | None) -> Path | None:
    """The registry the command adds to (None: --out alone touches no registry)."""
    from causalab_mini.codegen.lint import default_registry

    if out is not None and registry_dir is None:
        return None
    return registry_dir or default_registry()


def preflight(
    family: str,
    model_type: str,
    *,
    registry_dir: Path | None,
    out: Path | None,
    force: bool,
) -> Path | None:
    """Where the family file goes, refusing before any model is built: an existing
    file, or another family of the registry for the same model type."""
    from causalab_mini.codegen.lint import lint

    if out is not None and str(out) == "-":
        return None
    registry = _target(registry_dir, out)
    path = out if out is not None else (registry or Path()) / "families" / f"{family}.yaml"
    if path.exists() and not force:
        raise ScaffoldError(f"{path} exists; pass --force to overwrite it, or --out PATH")
    if registry is not None and not force:
        parsed, _ = lint(registry)
        clash = [
            f.name
            for f in parsed.families
            if model_type in f.match.model_types and f.name != family
        ]
        if clash:
            raise ScaffoldError(
                f"the registry already has famil{'ies' if len(clash) > 1 else 'y'} "
                f"{', '.join(clash)} for model type {model_type!r}; pass --force to add "
                "another, or --out PATH to compare"
            )
    return path


def write_scaffold(
    sc: Scaffold, *, registry_dir: Path | None, out: Path | None, force: bool
) -> Written:
    """Write the family file (and, into a registry, the verified structure's rule)."""
    from causalab_mini.codegen.lint import lint

    path = preflight(sc.family, sc.model_type, registry_dir=registry_dir, out=out, force=force)
    if path is None:
        return Written(None, None, render_family(sc))
    registry = _target(registry_dir, out)
    rule_file = None
    if registry is not None and sc.structure is not None and sc.existing_rule is None:
        parsed, _ = lint(registry)
        if not any(sc.model_type in r.match.model_types for r in parsed.rules):
            rule_file = registry / "block_structures.yaml"
    text = render_family(sc, rule_written=rule_file is not None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if rule_file is not None:
        assert sc.structure is not None
        add_rule(rule_file, sc.structure, sc.model_type, sc.spec)
    return Written(path, rule_file, text)


# ---------------------------------------------------------------------- the command

STATUS_STYLE = {
    "default": "green",
    "verified": "bold green",
    "refused": "yellow",
    "unchecked": "dim",
    "ambiguous": "bold red",
    "missing": "bold red",
}


def _where(v: Verdict) -> str:
    if v.status == "verified" and v.fields:
        return ", ".join(f"{k}: {_yaml_scalar(val)}" for k, val in v.fields.items())
    if v.status in ("ambiguous",):
        return " | ".join(c.describe() for c in v.choices)
    if v.chosen is not None:
        return v.chosen.describe()
    return ""


def print_summary(sc: Scaffold, written: Written | None) -> None:
    """The findings: a rich table on a terminal, plain text when piped."""
    title = (
        f"{sc.spec}: {sc.model_class}, {sc.num_layers} layers, block "
        f"{sc.structure or 'undecided'}"
        + (" (verified)" if sc.structure else f" ({sc.structure_evidence})")
    )
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, title_justify="left", show_lines=False)
        table.add_column("place")
        table.add_column("status")
        table.add_column("where / row")
        table.add_column("check")
        for v in sc.verdicts.values():
            style = STATUS_STYLE.get(v.status, "")
            table.add_row(
                v.place,
                f"[{style}]{v.status}[/]",
                _where(v),
                v.check or v.evidence[:80],
            )
        Console().print(table)
    else:
        click.echo(title)
        width = max(len(name) for name in sc.verdicts)
        wheres = {name: _where(v) for name, v in sc.verdicts.items()}
        span = max(len(w) for w in wheres.values())
        for name, v in sc.verdicts.items():
            line = f"  {name:{width}}  {v.status:9}  {wheres[name]:{span}}  {v.check or v.evidence}"
            click.echo(line.rstrip())
    for failure in sc.failures:
        click.echo(f"proof failed: {failure}", err=True)
    if written is None:
        return
    if written.family_file is not None:
        click.echo(f"wrote {written.family_file}")
    if written.rule_file is not None:
        click.echo(
            f"added a rule to {written.rule_file}: {sc.structure} for model_types [{sc.model_type}]"
        )


@click.command("new-family")
@click.argument("spec", shell_complete=complete_spec)
@click.option("--family", default=None, help="The family's name (default: the model type).")
@click.option(
    "--registry",
    "registry_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Registry to add the family to (default: the package's own registry/).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False, allow_dash=True),
    default=None,
    help="Write the family file here instead ('-' prints it); touches no registry.",
)
@click.option("--force", is_flag=True, help="Overwrite an existing file; add beside a family.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def new_family_command(
    spec: str,
    family: str | None,
    registry_dir: Path | None,
    out: Path | None,
    force: bool,
    as_json: bool,
) -> None:
    """Scaffold registry/families/<family>.yaml for SPEC, with verified rows only.

    SPEC is a model type (starcoder2), tiny:<model_type>[?key=value...], or a local
    checkpoint directory (a tiny random instance of its model type is built, with its
    boolean config values). Every place is tried on that instance against the
    registry's identities and transformers' own outputs; rows that pass are written,
    places where none or several pass are left as commented-out choices marked
    DECIDE. Into a registry it also adds the verified block structure's rule to
    block_structures.yaml, then runs `registry lint` on it.

    \b
    Example:
      registry new-family starcoder2
      registry new-family tiny:olmo3 --registry my_rows/
      registry new-family tiny:cohere --out - --json
    """
    from causalab_mini.codegen.lint import default_registry, lint

    try:
        _, model_type = resolve_spec(spec)
        preflight(
            family_name(model_type, family),
            model_type,
            registry_dir=registry_dir,
            out=out,
            force=force,
        )
        sc = scaffold(spec, family)
        written = write_scaffold(sc, registry_dir=registry_dir, out=out, force=force)
    except ScaffoldError as exc:
        click.echo(f"registry new-family: {exc}", err=True)
        sys.exit(1)
    diagnostics: list[Any] = []
    linted = written.family_file is not None and (out is None or registry_dir is not None)
    if linted:
        _, diagnostics = lint(registry_dir or default_registry())
    if as_json:
        data = sc.to_json()
        data["written"] = {
            "family_file": str(written.family_file) if written.family_file else None,
            "rule_file": str(written.rule_file) if written.rule_file else None,
            "lint": [d.to_json() for d in diagnostics] if linted else None,
        }
        if written.family_file is None:
            data["written"]["text"] = written.text
        click.echo(json.dumps(data, indent=2))
        return
    if written.family_file is None:  # --out -: the file on stdout, nothing else there
        click.echo(written.text, nl=False)
    else:
        print_summary(sc, written)
    undecided = sc.undecided
    if undecided:
        click.echo(
            err=written.family_file is None,
            message=f"{len(undecided)} place{'s' if len(undecided) != 1 else ''} to decide (DECIDE in "
            f"the file): {', '.join(v.place for v in undecided)}",
        )
    if written.family_file is None:
        return
    if linted:
        for diag in diagnostics:
            click.echo(str(diag))
        click.echo(
            "registry lint: clean"
            if not diagnostics
            else f"registry lint: {len(diagnostics)} errors"
        )
    click.echo("next: review the file, then `registry gen`")
