"""Building and caching tiny checkpoints: the cache directory keyed by model type,
build and transformers version (``build_tiny``, ``resolve_model_spec``), the model
instantiated with seeded weights (the moved build: its fields moved, norms drawn,
weights scaled), saved with its tokenizer and loaded back the way the loader loads
it, with the same logits."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from causalab_mini.generated.tiny import (
    TINY_CHECKPOINT_FILES,
    TINY_MOVED,
    TINY_SAVED_BY,
)

from .config import (
    BUILD_FROM,
    BUILD_KEY,
    TINY_PREFIX,
    TinyBuildError,
    apply_overrides,
    build_class,
    causal_lm_model_types,
    check_model_type,
    first_line,
    parse_tiny_spec,
    recipe_of,
    split_member,
    thaw,
    tiny_config,
)
from .inputs import side_inputs
from .tokenizer import tiny_tokenizer

BUILDER_VERSION = 3
"""Bumped whenever a change here changes what gets built; part of the cache key."""


BUILDS = ("default", "moved")
"""The tiny builds of a model type: ``default`` (the shrunk config as it comes) and
``moved`` (registry/tiny.yaml moved: every field that scales, caps, clips, sizes a
head or an expert, or sets an epsilon moved away from its value, every norm drawn
away from identity), spelled ``tiny:<model_type>?build=moved``."""


CACHE_ENV = "CAUSALAB_MINI_CACHE"


MANIFEST = "tiny_build.json"


def cache_root() -> Path:
    """``$CAUSALAB_MINI_CACHE`` if set, else ``~/.cache/causalab_mini``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "causalab_mini"


def _checkpoint_name(
    model_type: str, seed: int, overrides: dict[str, Any] | None = None, build: str = "default"
) -> str:
    import hashlib

    import transformers

    name = (
        f"{model_type.replace('/', '+')}-transformers{transformers.__version__}-v{BUILDER_VERSION}"
    )
    recipe = recipe_of(model_type)
    if build != "default":  # the build's own table is part of what is built
        recipe["build"] = {"name": build, "moved": thaw(TINY_MOVED)}
    if recipe:
        key = json.dumps(recipe, sort_keys=True, default=str).encode()
        name += f"-r{hashlib.sha256(key).hexdigest()[:8]}"
    if overrides:
        key = json.dumps(overrides, sort_keys=True).encode()
        name += f"-cfg{hashlib.sha256(key).hexdigest()[:10]}"
    return name if seed == 0 else f"{name}-seed{seed}"


def build_tiny(
    model_type: str,
    *,
    cache_dir: Path | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    build: str = "default",
) -> Path:
    """Build (once) and return the directory of a tiny ``model_type`` checkpoint.

    The checkpoint lives at ``<root>/tiny/<model_type>-transformers<version>-v<N>``
    where ``<root>`` is ``cache_dir`` or :func:`cache_root`; a non-zero ``seed`` adds
    ``-seed<seed>``. It holds the model (float32 safetensors), its config and the
    tokenizer, all written by ``save_pretrained``. Concurrent builders serialise on a
    file lock; the directory appears atomically (built next to it, then renamed).
    ``overrides`` sets config attributes of the text config (``use_parallel_residual``,
    ``residual_multiplier``) and is part of the cache key. ``build`` is one of
    ``BUILDS``: ``moved`` moves the config's scales, caps, head and expert sizes and
    epsilons and draws the norms away from identity (``moved_fields``, ``draw_norms``);
    its manifest records what moved, what was skipped and why, and what had no effect.
    """
    from filelock import FileLock

    if build not in BUILDS:
        raise TinyBuildError(
            f"tiny {model_type!r}: no build {build!r}; the builds are {', '.join(BUILDS)} "
            f"(write tiny:{model_type} or tiny:{model_type}?build=moved)"
        )
    check_model_type(model_type)
    base = (Path(cache_dir) if cache_dir is not None else cache_root()) / "tiny"
    final = base / _checkpoint_name(model_type, seed, overrides, build)
    if (final / MANIFEST).is_file():
        return final
    base.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / MANIFEST).is_file():
            return final
        if final.exists():  # left by a crash between rename and manifest: rebuild
            shutil.rmtree(final)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=base))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
        try:
            from causalab_mini.quiet import quiet

            with quiet():  # no "Writing model shards" / "Loading weights" bars
                _materialize(model_type, tmp, seed, overrides or {}, build)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _materialize(
    model_type: str, out: Path, seed: int, overrides: dict[str, Any], build: str = "default"
) -> None:
    """Write a tiny checkpoint of ``model_type`` into the (empty) directory ``out``."""
    import torch
    import transformers

    started = time.perf_counter()
    member, model_type = model_type, split_member(model_type)[1]
    config = tiny_config(model_type)
    # the config the causal-LM class is built from: the composite config, or the
    # sub-config registry/tiny.yaml names (build_from)
    built = getattr(config, BUILD_FROM[model_type]) if model_type in BUILD_FROM else config
    text = built.get_text_config()
    apply_overrides(model_type, text, overrides)
    tokenizer = tiny_tokenizer(model_type)
    vocab_size = getattr(text, "vocab_size", None)
    if isinstance(vocab_size, int) and len(tokenizer) > vocab_size:
        raise TinyBuildError(
            f"tokenizer of {len(tokenizer)} entries exceeds the vocab of {vocab_size}"
        )
    auto = _causal_lm_class(model_type, member)
    saver = _saving_class(model_type)
    built = built if model_type in BUILD_FROM else config
    moves: dict[str, Any] = {}
    if build == "moved":
        attempts = _Attempts(model_type, saver or auto, built, tokenizer, seed)
        model, built, moves = _moved_model(attempts)
        config = built if model_type not in BUILD_FROM else config
        try:
            _save_and_reload(model_type, auto, model, tokenizer, config, out)
        except TinyBuildError:  # a moved field the checkpoint does not keep: each
            # field is tried through a save and load of its own, and kept if it survives
            attempts.reload_with = (auto, None if model_type not in BUILD_FROM else config)
            model, built, moves = _moved_model(attempts, every_field_alone=True)
            config = built if model_type not in BUILD_FROM else config
            try:
                _save_and_reload(model_type, auto, model, tokenizer, config, out)
            except TinyBuildError as exc:  # a weight the load makes anew (a sinusoidal
                # table, Marian's) loses its scale: the weights stay as built
                attempts.unscaled = (
                    f"the checkpoint does not keep the scaled weights: {first_line(exc)}"
                )
                model, built, moves = _moved_model(attempts, every_field_alone=True)
                config = built if model_type not in BUILD_FROM else config
                _save_and_reload(model_type, auto, model, tokenizer, config, out)
    else:
        model = _instantiate(model_type, saver or auto, built, seed)
        _save_and_reload(model_type, auto, model, tokenizer, config, out)
    manifest = {
        "model_type": model_type,
        "model_class": type(model).__name__,
        "build_class": build_class(member),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "builder_version": BUILDER_VERSION,
        "seed": seed,
        "overrides": overrides,
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - started, 3),
        "build": build,
        **moves,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass(frozen=True)
class Move:
    """One config field of the moved build: its path in the text config (dotted
    through nested configs), the value the tiny config gives it, the moved value, and
    the rule's reason."""

    path: str
    old: Any
    new: Any
    why: str


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _moved_value(rule: Mapping[str, Any], value: Any, turn: int) -> Any:
    """The value ``rule`` moves ``value`` to on its ``turn``-th field (None: the rule
    does not apply to a value of this type): a number from the rule's values that is
    not the value; a list of numbers element by element; a boolean negated."""
    if rule["kind"] == "flip":
        return (not value) if isinstance(value, bool) else None
    values = list(rule.get("values") or ())
    if not values:
        return None

    def pick(current: Any, at: int) -> Any:
        for step in range(len(values)):
            candidate = values[(at + step) % len(values)]
            if candidate != current:
                if isinstance(current, int) and float(candidate).is_integer():
                    return int(candidate)
                return candidate
        return None

    if value is None:
        return pick(None, turn) if rule.get("from_none") else None
    if _number(value):
        return pick(value, turn)
    if isinstance(value, (list, tuple)) and value and all(map(_number, value)):
        moved = [pick(v, turn + i) for i, v in enumerate(value)]
        return None if any(m is None for m in moved) else type(value)(moved)
    return None


def moved_fields(config: Any, table: Mapping[str, Any] | None = None) -> list[Move]:
    """The fields of ``config`` (a text config, and the configs it nests as attributes)
    the moved build moves (registry/tiny.yaml moved), in the order of their names: each
    found by the first rule whose pattern its name matches (and exclude does not), with
    the value that rule gives it."""
    from transformers import PretrainedConfig

    table = TINY_MOVED if table is None else table
    rules = list(table.get("rules") or ())
    exclude = re.compile(str(table.get("exclude") or "(?!)"))
    turns: dict[int, int] = {}
    found: list[Move] = []

    def walk(cfg: Any, prefix: str, seen: set[int]) -> None:
        if id(cfg) in seen:
            return
        seen.add(id(cfg))
        held = vars(cfg)
        for key in sorted(held):
            value = held[key]  # as stored: a per-layer attribute's getter may refuse
            if key.startswith("_"):
                continue
            if isinstance(value, PretrainedConfig):
                walk(value, f"{prefix}{key}.", seen)
                continue
            if exclude.search(key):
                continue
            for index, rule in enumerate(rules):
                if not re.search(str(rule["pattern"]), key):
                    continue
                new = _moved_value(rule, value, turns.get(index, 0))
                if new is not None:
                    turns[index] = turns.get(index, 0) + 1
                    found.append(Move(f"{prefix}{key}", value, new, str(rule["why"])))
                break  # the first matching rule decides, even where it moves nothing

    walk(config, "", set())
    return found


def _set_path(config: Any, path: str, value: Any) -> None:
    *parents, key = path.split(".")
    for part in parents:
        config = getattr(config, part)
    setattr(config, key, value)


def draw_norms(model: Any, table: Mapping[str, Any] | None = None) -> int:
    """Every norm of ``model`` (a module whose class name matches registry/tiny.yaml
    moved.norms.pattern) given weights and biases drawn around their init: each of its
    own floating parameters plus seeded normal noise (bias_std for a parameter named
    bias, weight_std otherwise). The same model (same shapes) always gets the same
    draw. Returns how many parameters were drawn."""
    import torch

    norms = (TINY_MOVED if table is None else table)["norms"]
    pattern = re.compile(str(norms["pattern"]), re.IGNORECASE)
    generator = torch.Generator().manual_seed(int(norms["seed"]))
    drawn = 0
    with torch.no_grad():
        for _, module in model.named_modules():
            if not pattern.search(type(module).__name__):
                continue
            for name, param in module.named_parameters(recurse=False):
                if not param.is_floating_point():
                    continue
                std = float(norms["bias_std"] if "bias" in name else norms["weight_std"])
                noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.add_((noise * std).to(param.dtype))
                drawn += 1
    return drawn


def scale_weights(model: Any, table: Mapping[str, Any] | None = None) -> int:
    """Every floating parameter of ``model`` with two or more axes (projections,
    embeddings, convolutions) multiplied by registry/tiny.yaml moved.weights.scale, so
    that a tiny model's activations are of order one rather than init-sized. Returns
    how many parameters were scaled (a tied weight once)."""
    import torch

    factor = float((TINY_MOVED if table is None else table)["weights"]["scale"])
    scaled = 0
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dim() >= 2:
                param.mul_(factor)
                scaled += 1
    return scaled


class _Attempts:
    """Builds of one config with some of its moved fields set: each instantiated,
    its weights scaled (unless the forward cannot run so: ``unscaled`` says why), its
    norms drawn, and its smoke logits taken."""

    def __init__(self, model_type: str, cls: Any, built: Any, tokenizer: Any, seed: int):
        self.model_type, self.cls, self.built = model_type, cls, built
        self.tokenizer, self.seed = tokenizer, seed
        self.unscaled: str | None = None
        # (loading class, the composite config a sub-config's checkpoint holds): set,
        # an attempt with moved fields must also survive a save and load
        self.reload_with: tuple[Any, Any] | None = None

    def __call__(self, moves: list[Move]) -> tuple[Any, Any, Any, int]:
        """(model, config, smoke logits, norm parameters drawn) with ``moves`` set;
        TinyBuildError where the config refuses them or the forward cannot run."""
        import copy

        config = copy.deepcopy(self.built)
        text = config.get_text_config()
        for move in moves:
            try:
                _set_path(text, move.path, move.new)
            except Exception as exc:
                raise TinyBuildError(
                    f"the config refuses {move.path}={move.new!r}: {first_line(exc)}"
                ) from exc
        if moves:
            try:  # what the checkpoint's config.json will be read back as (validated)
                type(config).from_dict(config.to_dict())
            except Exception as exc:
                raise TinyBuildError(
                    f"the config, read back, refuses it: {type(exc).__name__}: {first_line(exc)}"
                ) from exc
        model = _instantiate(self.model_type, self.cls, config, self.seed)
        if self.unscaled is None:
            scale_weights(model)
        drawn = draw_norms(model)
        part = _traced(self.model_type, _loaded_part(self.model_type, model))
        logits = _smoke_logits(self.model_type, part, self.tokenizer)
        if moves and self.reload_with is not None:
            auto, composite = self.reload_with
            scratch = Path(tempfile.mkdtemp(prefix="tiny-moved-"))
            try:
                _save_and_reload(
                    self.model_type, auto, model, self.tokenizer, composite or config, scratch
                )
            except TinyBuildError as exc:
                raise TinyBuildError(f"the checkpoint does not keep it: {first_line(exc)}") from exc
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        return model, config, logits, drawn

    def kept(self, candidates: list[Move], skipped: dict[str, str]) -> list[Move]:
        """The candidates the config and the forward take, alone and together (the
        others into ``skipped`` with the reason); where even none runs at scaled
        weights, the weights stay as built (``unscaled``)."""
        try:
            self([])
        except TinyBuildError as exc:
            self.unscaled = f"the forward fails with the weights scaled: {first_line(exc)}"
        kept = []
        for move in candidates:
            try:
                self([move])
            except TinyBuildError as exc:
                skipped[move.path] = f"{move.path}={move.new!r}: {first_line(exc)}"
                continue
            kept.append(move)
        while kept:  # together: drop the last field until they run
            try:
                self(kept)
                break
            except TinyBuildError as exc:
                last = kept.pop()
                skipped[last.path] = (
                    f"{last.path}={last.new!r}: runs alone but not with the other moved "
                    f"fields: {first_line(exc)}"
                )
        return kept


def _moved_model(
    attempt: _Attempts, every_field_alone: bool = False
) -> tuple[Any, Any, dict[str, Any]]:
    """The moved build of the attempts' config (the one the class is built from): the
    model, its config, and what the manifest records (moved: path -> [tiny value,
    moved value]; skipped: path -> why; no_effect: the moved fields whose value
    changes none of the smoke batch's logits; norms_drawn; weights_scaled: true, or
    why not). All fields are tried at once first, unless ``every_field_alone``."""
    import torch

    candidates = moved_fields(attempt.built.get_text_config())
    skipped: dict[str, str] = {}
    try:
        if every_field_alone:
            raise TinyBuildError("each field alone")
        kept = list(candidates)
        model, config, logits, drawn = attempt(kept)
    except TinyBuildError:
        kept = attempt.kept(candidates, skipped)
        model, config, logits, drawn = attempt(kept)
    no_effect = []
    for move in kept:  # a field whose value changes nothing of the forward's logits
        try:
            _, _, without, _ = attempt([m for m in kept if m is not move])
        except TinyBuildError:
            continue
        if without.shape == logits.shape and torch.equal(without, logits):
            no_effect.append(move.path)
    return (
        model,
        config,
        {
            "moved": {m.path: [m.old, m.new] for m in kept},
            "skipped": skipped,
            "no_effect": no_effect,
            "norms_drawn": drawn,
            "weights_scaled": attempt.unscaled or True,
        },
    )


def _causal_lm_class(model_type: str, member: str) -> Any:
    """The transformers class a tiny ``model_type`` (group member ``member``) is built
    with (untyped classmethods)."""
    import transformers

    if model_type in BUILD_FROM:
        # the causal-LM class of the model type, which AutoModelForCausalLM maps only
        # from the composite config
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    from causalab_mini.compat import loading_class

    return loading_class(build_class(member))


def _saving_class(model_type: str) -> Any:
    """The class registry/tiny.yaml ``saved_by`` says real ``model_type`` checkpoints
    are written by (the tiny one is built and saved with it), as it is built; None where
    the class that loads the checkpoint writes it."""
    from causalab_mini.compat import loading_class

    row = TINY_SAVED_BY.get(model_type)
    return loading_class(row[0]) if row is not None else None


def _loaded_part(model_type: str, model: Any) -> Any:
    """The part of a freshly built ``model`` that its checkpoint loads back as: the
    submodule registry/tiny.yaml ``saved_by`` names, else the model."""
    row = TINY_SAVED_BY.get(model_type)
    if row is None:
        return model
    return model.get_submodule(row[1])


def _instantiate(model_type: str, auto: Any, config: Any, seed: int) -> Any:
    """The model of ``config`` with seeded random weights, in float32, in eval mode
    (built from the sub-config registry/tiny.yaml names where it names one)."""
    import torch
    import transformers

    transformers.set_seed(seed)
    torch.manual_seed(seed)
    try:
        if model_type in BUILD_FROM:
            model = auto._from_config(config, dtype=torch.float32)
        else:
            model = auto.from_config(config, dtype=torch.float32)
    except ImportError as exc:
        raise TinyBuildError(
            f"model of {model_type!r} needs an extra package: {first_line(exc)}"
        ) from exc
    except Exception as exc:
        raise TinyBuildError(
            f"cannot instantiate tiny {model_type!r}: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return model.to(torch.float32).eval()


def _save_and_reload(
    model_type: str, auto: Any, model: Any, tokenizer: Any, config: Any, out: Path
) -> None:
    """Save the model and tokenizer into ``out`` and load them back: the same logits,
    or the build fails."""
    import torch

    before = _smoke_logits(
        model_type, _traced(model_type, _loaded_part(model_type, model)), tokenizer
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for name, content in TINY_CHECKPOINT_FILES.get(model_type, {}).items():
        torch.save(thaw(content), out / name)  # a file from_pretrained reads (a table)
    if model.config.model_type not in causal_lm_model_types() and model_type not in BUILD_FROM:
        # Built from a composite config (emu3, mllama): the model's own config is a
        # text config AutoModelForCausalLM cannot map back; keep the composite one.
        config.save_pretrained(out)
    try:
        reloaded = auto.from_pretrained(out, dtype=torch.float32, **_load_kwargs(model_type))
        reloaded = reloaded.eval()
    except Exception as exc:
        raise TinyBuildError(
            f"tiny {model_type!r} saves but does not load back: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    after = _smoke_logits(model_type, _traced(model_type, reloaded), tokenizer)
    if before.shape != after.shape or not torch.allclose(before, after, atol=1e-4, rtol=1e-4):
        raise TinyBuildError(f"tiny {model_type!r} gives other logits after a save/load round trip")


def _traced(model_type: str, model: Any) -> Any:
    """What a forward of the tiny ``model_type`` runs: the model, or the submodule its
    family traces as the model (``traced_module``: a class with no forward of its own
    that runs the text decoder)."""
    from causalab_mini.classes import traced_module_for
    from causalab_mini.traced import submodule

    path = traced_module_for(model_type)
    return submodule(model, path) if path else model


def _load_kwargs(model_type: str) -> dict[str, Any]:
    """What ``from_pretrained`` is given beside the checkpoint, as the loader gives it:
    the family's ``key_mapping`` (registry/families/*.yaml), where it has one."""
    from causalab_mini.classes import key_mapping_for

    found = key_mapping_for((), model_type, None)
    return {"key_mapping": found} if found else {}


_SMOKE_TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def _smoke_logits(model_type: str, model: Any, tokenizer: Any) -> Any:
    """Logits of a left-padded batch of two sentences; a family whose forward fails
    or gives non-finite logits never reaches the cache."""
    import torch

    batch = dict(tokenizer(_SMOKE_TEXTS, return_tensors="pt", padding=True))
    rows, seq = batch["input_ids"].shape
    batch.update(side_inputs(model.config, rows, seq, tokens=batch))
    try:
        with torch.no_grad():
            logits = model(**batch).logits
    except Exception as exc:
        raise TinyBuildError(
            f"tiny {model_type!r} builds but its forward fails: "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    if not torch.isfinite(logits).all():
        raise TinyBuildError(f"tiny {model_type!r} gives non-finite logits")
    return logits


def resolve_model_spec(spec: str) -> str:
    """``tiny:<model_type>[?key=value&...]`` -> the built checkpoint directory;
    anything else (a hub id, a local directory) unchanged."""
    if spec.startswith(TINY_PREFIX):
        model_type, overrides = parse_tiny_spec(spec)
        build = overrides.pop(BUILD_KEY, "default")
        return str(build_tiny(model_type, overrides=overrides or None, build=str(build)))
    return spec
