"""Published sparse autoencoders and transcoders, loaded from a local directory and
placed on a loaded model: ``causalab_mini.featurizers.SAE.load(path, model=...)``
(``read`` and ``placed`` here), ``sae_report(model, sae, texts)``, and
``transcoder_write`` (a transcoder's feature edit as a write at its output place).

Three layouts are read, each as its library writes it:

- **SAELens**: ``cfg.json`` (``architecture`` standard / jumprelu / topk / gated,
  ``d_in``, ``d_sae``, ``hook_name`` at the top level or under ``metadata``,
  ``hook_name_out`` for a transcoder, ``apply_b_dec_to_input``, ``k``) and
  ``sae_weights.safetensors`` (``W_enc`` d x m, ``W_dec`` m x d, ``b_enc``, ``b_dec``;
  ``threshold`` for JumpReLU; ``b_gate``, ``r_mag``, ``b_mag`` for gated). The site is
  a TransformerLens hook name, placed by ``interop.transformer_lens.place_of``.
- **sparsify**: a directory per hookpoint (``layers.6``, ``layers.6.mlp``) holding
  ``cfg.json`` (``d_in``, ``num_latents``, ``k``, ``transcode``) and
  ``sae.safetensors`` (``encoder.weight`` m x d, ``encoder.bias``, ``W_dec`` m x d,
  ``b_dec``). The hookpoint is a module of the model, whose output (a transcoder: whose
  input, then its output) is the site; it is placed where a component's address is
  that module's output (input).
- **dictionary_learning**: ``config.json`` (``trainer``: ``dict_class``,
  ``activation_dim``, ``dict_size``, ``k``, ``layer``, ``submodule_name``) and
  ``ae.pt`` (its state dict). Its site names are a convention of its users
  (``resid_post_layer_3``), read as the TransformerLens hook they mean.

A site that does not name one place on the model (an unknown or refused hook name, a
hookpoint that is no component's module here) is refused with the reason; ``site=``
says which place is meant. The width of the dictionary is checked against the
place's. A loaded SAE keeps its place (``sae.site``, a transcoder's output place
``sae.site_out``) and where it came from (``sae.origin``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import CausalabError
from .interop.transformer_lens import HookNameRefused, hook_name_of, place_of
from .locator import ComponentAddress, locate


class DictionaryRefused(CausalabError, ValueError):
    """A dictionary directory that cannot be read or placed: its format, a file that
    is missing or corrupt, a site the model cannot serve, a width that is not the
    place's."""


# dictionary_learning's site names, as its users write them, and the hook each means
DICTIONARY_LEARNING_SITES = {
    "resid_post": "blocks.{layer}.hook_resid_post",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "attn_out": "blocks.{layer}.hook_attn_out",
}


@dataclass
class Origin:
    """Where a loaded dictionary came from: its format, directory, kind and the site
    as the checkpoint names it (and its output site, for a transcoder)."""

    format: str
    path: str
    kind: str
    site: str
    site_out: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Parts:
    """A checkpoint's weights as ``SAE(encoder, decoder, encoder_bias, decoder_bias,
    activation=..., **options)`` takes them (encoder d x m, decoder m x d)."""

    encoder: torch.Tensor
    decoder: torch.Tensor
    encoder_bias: torch.Tensor
    decoder_bias: torch.Tensor
    activation: str
    options: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------- files


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DictionaryRefused(
            f"{path}: cannot be read as JSON ({error}): the directory's config is corrupt; "
            "write it again from the library that trained the dictionary"
        ) from error
    if not isinstance(data, dict):
        raise DictionaryRefused(f"{path}: holds {type(data).__name__}, not a JSON object")
    return data


def _section(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """``cfg[name]`` where it is a mapping (else empty)."""
    value = cfg.get(name)
    return value if isinstance(value, dict) else {}


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise DictionaryRefused(f"{path} is missing: the directory holds no weights")
    try:
        return dict(load_file(str(path)))
    except Exception as error:  # safetensors raises its own error kinds on a bad header
        raise DictionaryRefused(
            f"{path}: cannot be read as safetensors ({type(error).__name__}: {error}): the "
            "weights file is corrupt or truncated; fetch or save it again"
        ) from error


def _torch_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise DictionaryRefused(f"{path} is missing: the directory holds no state dict")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several kinds on a truncated archive
        raise DictionaryRefused(
            f"{path}: cannot be read as a torch state dict ({type(error).__name__}: "
            f"{error}): the file is corrupt or truncated; save it again"
        ) from error
    if not isinstance(state, dict):
        raise DictionaryRefused(f"{path}: holds {type(state).__name__}, not a state dict")
    return {str(k): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _need(tensors: dict[str, torch.Tensor], names: tuple[str, ...], where: Path) -> None:
    missing = [n for n in names if n not in tensors]
    if missing:
        raise DictionaryRefused(
            f"{where}: has no {', '.join(missing)} (it holds {', '.join(sorted(tensors))}): "
            "not the layout its config names, or a corrupt file"
        )


# ---------------------------------------------------------------------- formats


def detect(path: Path) -> str:
    """The format of the directory ``path``: saelens, sparsify or dictionary_learning."""
    if (path / "sae_weights.safetensors").exists():
        return "saelens"
    if (path / "sae.safetensors").exists():
        return "sparsify"
    if (path / "ae.pt").exists():
        return "dictionary_learning"
    if (path / "cfg.json").exists():
        return "saelens"
    raise DictionaryRefused(
        f"{path}: no dictionary this loader reads (SAELens: cfg.json and "
        "sae_weights.safetensors; sparsify: cfg.json and sae.safetensors in a directory "
        "named by its hookpoint; dictionary_learning: config.json and ae.pt)"
    )


def _saelens(path: Path) -> tuple[Parts, Origin]:
    cfg = _json(path / "cfg.json")
    meta = _section(cfg, "metadata")
    hook = cfg.get("hook_name") or meta.get("hook_name")
    if not isinstance(hook, str):
        raise DictionaryRefused(f"{path}/cfg.json names no hook_name: its site is unknown")
    norm = cfg.get("normalize_activations", "none")
    if norm not in ("none", None):
        raise DictionaryRefused(
            f"{path}/cfg.json: normalize_activations={norm!r} scales the activations by a "
            "factor the checkpoint does not hold; fold it into the weights first"
        )
    arch = cfg.get("architecture", "standard")
    w = _safetensors(path / "sae_weights.safetensors")
    base = ("W_enc", "W_dec", "b_dec") + (
        ("b_gate", "r_mag", "b_mag") if arch == "gated" else ("b_enc",)
    )
    _need(
        w, base + (("threshold",) if arch == "jumprelu" else ()), path / "sae_weights.safetensors"
    )
    shift = w["b_dec"] @ w["W_enc"] if cfg.get("apply_b_dec_to_input", True) else 0
    kwargs: dict[str, Any] = {}
    if arch == "gated":
        kwargs = {
            "magnitude_scale": w["r_mag"].exp(),
            "magnitude_bias": w["b_mag"] - shift * w["r_mag"].exp(),
        }
        bias, act = w["b_gate"] - shift, "gated"
    elif arch in ("standard", "relu", "jumprelu", "topk"):
        bias, act = w["b_enc"] - shift, {"standard": "relu"}.get(arch, arch)
        if arch == "jumprelu":
            kwargs["threshold"] = w["threshold"]
        if arch == "topk":
            kwargs["topk"] = int(cfg.get("k") or meta.get("k") or 0) or None
    else:
        raise DictionaryRefused(
            f"{path}/cfg.json: architecture {arch!r} is not one this loader reads "
            "(standard, jumprelu, topk, gated)"
        )
    sae = _built(path, w["W_enc"], w["W_dec"], bias, w["b_dec"], act, kwargs)
    out = cfg.get("hook_name_out") or meta.get("hook_name_out")
    kind = "transcoder" if isinstance(out, str) and out != hook else "sae"
    return sae, Origin("saelens", str(path), kind, hook, out if kind == "transcoder" else None)


def _sparsify(path: Path) -> tuple[Parts, Origin]:
    cfg = _json(path / "cfg.json")
    w = _safetensors(path / "sae.safetensors")
    _need(w, ("encoder.weight", "encoder.bias", "W_dec", "b_dec"), path / "sae.safetensors")
    if "W_skip" in w or cfg.get("skip_connection"):
        raise DictionaryRefused(
            f"{path}: a skip connection (W_skip) adds a linear map of the input to the "
            "output, which this SAE featurizer has no term for"
        )
    k = cfg.get("k")
    transcode = bool(cfg.get("transcode"))
    enc = w["encoder.weight"].T
    # sparsify subtracts b_dec from the input of an autoencoder (not of a transcoder)
    bias = w["encoder.bias"] - (0 if transcode else w["b_dec"] @ enc)
    kwargs = {"topk": int(k)} if k else {}
    sae = _built(path, enc, w["W_dec"], bias, w["b_dec"], "topk" if k else "relu", kwargs)
    kind = "transcoder" if transcode else "sae"
    return sae, Origin("sparsify", str(path), kind, path.name, path.name if transcode else None)


def _dictionary_learning(path: Path) -> tuple[Parts, Origin]:
    cfg = _json(path / "config.json")
    trainer = _section(cfg, "trainer")
    state = _torch_file(path / "ae.pt")
    cls = str(trainer.get("dict_class", "AutoEncoder"))
    where = path / "ae.pt"
    kwargs: dict[str, Any] = {}
    if "W_enc" in state:  # JumpReLU: the weights as SAELens lays them out
        _need(state, ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"), where)
        enc, dec, b_dec = state["W_enc"], state["W_dec"], state["b_dec"]
        bias, act, kwargs = state["b_enc"], "jumprelu", {"threshold": state["threshold"]}
    elif "r_mag" in state:  # gated
        _need(
            state,
            ("encoder.weight", "decoder.weight", "decoder_bias", "gate_bias", "mag_bias"),
            where,
        )
        enc, dec, b_dec = (
            state["encoder.weight"].T,
            state["decoder.weight"].T,
            state["decoder_bias"],
        )
        shift, scale = b_dec @ enc, state["r_mag"].exp()
        bias, act = state["gate_bias"] - shift, "gated"
        kwargs = {"magnitude_scale": scale, "magnitude_bias": state["mag_bias"] - shift * scale}
    else:  # standard (b_dec as ``bias``) or top-k (``b_dec``, ``k``)
        b_name = "b_dec" if "b_dec" in state else "bias"
        _need(state, ("encoder.weight", "encoder.bias", "decoder.weight", b_name), where)
        enc, dec, b_dec = state["encoder.weight"].T, state["decoder.weight"].T, state[b_name]
        k = trainer.get("k") or (int(state["k"]) if "k" in state else None)
        bias, act = state["encoder.bias"] - b_dec @ enc, "topk" if k else "relu"
        kwargs = {"topk": int(k)} if k else {}
    sae = _built(path, enc, dec, bias, b_dec, act, kwargs)
    site = str(trainer.get("submodule_name") or "")
    origin = Origin("dictionary_learning", str(path), "sae", site, extra={"dict_class": cls})
    origin.extra["layer"] = trainer.get("layer")
    return sae, origin


def _built(
    path: Path, enc: Any, dec: Any, bias: Any, b_dec: Any, act: str, kwargs: dict[str, Any]
) -> Parts:
    return Parts(enc, dec, bias, b_dec, act, kwargs)


READERS = {"saelens": _saelens, "sparsify": _sparsify, "dictionary_learning": _dictionary_learning}


# ---------------------------------------------------------------------- sites


def _hook_place(model: Any, hook: str, origin: Origin) -> ComponentAddress:
    try:
        return place_of(model, hook)
    except HookNameRefused as error:
        raise DictionaryRefused(
            f"{origin.path} ({origin.format}) was trained at {hook!r}, which this model "
            f"cannot serve: {error}. If you know the place it means, say "
            "site=locate(model, component, layer)"
        ) from error


def _module_place(model: Any, hookpoint: str, side: str, origin: Origin) -> ComponentAddress:
    """The component whose address is the ``side`` (output / input) of the module
    ``hookpoint`` names (sparsify's hookpoints are module paths)."""
    from .tree import child

    root = model._model
    names = [n for n, _ in root.named_modules() if n == hookpoint or n.endswith("." + hookpoint)]
    if len(names) != 1:
        found = "no module" if not names else f"{len(names)} modules ({', '.join(names)})"
        raise DictionaryRefused(
            f"{origin.path} (sparsify) names the hookpoint {hookpoint!r}, and {found} of "
            f"{type(root).__name__} end in it: say site=locate(model, component, layer)"
        )
    target = root.get_submodule(names[0])
    matches = []
    for name in _SIZED:
        for layer in range(len(model.layers)) if _per_layer(name) else [None]:
            try:
                at = locate(model, name, layer)
            except (CausalabError, IndexError):
                continue
            base = model.layers[layer] if layer is not None else model
            envoy = child(base, at.module) if at.module else base
            module = getattr(envoy, "_module", None)
            if module is target and at.io == side and at.kind == "boundary":
                matches.append(at)
    if len(matches) != 1:
        what = "no component" if not matches else ", ".join(str(m) for m in matches)
        raise DictionaryRefused(
            f"{origin.path} (sparsify) reads the {side} of {names[0]}, and on this model that "
            f"is {what}: no one place means it here (a post-norm family's MLP output is not "
            "its contribution); say site=locate(model, component, layer)"
        )
    return matches[0]


def _per_layer(name: str) -> bool:
    from causalab_mini.generated import COMPONENTS

    return bool(COMPONENTS[name].per_layer)


# the components a dictionary may sit at: a width, one tensor per token, not per head
_SIZED = (
    "embeddings",
    "block_input",
    "attention_input_norm",
    "attention_output",
    "block_mid",
    "mlp_input_norm",
    "mlp_input",
    "mlp_activation",
    "mlp_neuron_output",
    "mlp_output",
    "block_output",
    "ln_final",
)


def _dictionary_learning_hook(origin: Origin) -> str:
    m = re.fullmatch(r"(resid_post|resid_pre|resid_mid|mlp_out|attn_out)_layer_(\d+)", origin.site)
    if m is None:
        raise DictionaryRefused(
            f"{origin.path} (dictionary_learning) names its site {origin.site!r}, which is "
            f"none of {', '.join(k + '_layer_N' for k in DICTIONARY_LEARNING_SITES)}: the "
            "place it means is ambiguous; say site=locate(model, component, layer) or a "
            "TransformerLens hook name"
        )
    return DICTIONARY_LEARNING_SITES[m.group(1)].replace("{layer}", m.group(2))


def _place(model: Any, site: Any, origin: Origin) -> ComponentAddress:
    if isinstance(site, ComponentAddress):
        return site
    if isinstance(site, str):
        return _hook_place(model, site, origin)
    if origin.format == "saelens":
        return _hook_place(model, origin.site, origin)
    if origin.format == "sparsify":
        return _module_place(model, origin.site, "input" if origin.site_out else "output", origin)
    return _hook_place(model, _dictionary_learning_hook(origin), origin)


def _checked(at: ComponentAddress, origin: Origin, what: str, width: int) -> None:
    if at.width != width:
        raise DictionaryRefused(
            f"{origin.path} ({origin.format}) {what} {width} wide, and its site {at} is "
            f"{at.width} wide: this dictionary was trained on another model or place; load "
            f"it onto a place {width} wide (site=...) or onto the model it was trained on"
        )


def read(path: Any) -> tuple[Parts, Origin]:
    """The weights and the origin of the dictionary in the directory ``path``."""
    directory = Path(path)
    if not directory.is_dir():
        raise DictionaryRefused(f"{directory} is no directory: give the dictionary's folder")
    return READERS[detect(directory)](directory)


def placed(
    model: Any, parts: Parts, origin: Origin, site: Any = None, site_out: Any = None
) -> tuple[ComponentAddress, ComponentAddress | None]:
    """The place a dictionary reads on ``model`` (and a transcoder's output place),
    each checked against its width; ``site`` / ``site_out`` (a hook name or a component
    address) say which place is meant where the checkpoint's own name is ambiguous."""
    at = _place(model, site, origin)
    _checked(at, origin, "reads tensors", int(parts.encoder.shape[0]))
    if origin.kind != "transcoder":
        return at, None
    out_site = site_out if site_out is not None else origin.site_out
    if origin.format == "sparsify" and site_out is None:
        out = _module_place(model, origin.site, "output", origin)
    elif isinstance(out_site, ComponentAddress):
        out = out_site
    else:
        out = _hook_place(model, str(out_site), origin)
    _checked(out, origin, "writes tensors", int(parts.decoder.shape[1]))
    return at, out


# ---------------------------------------------------------------------- report


@dataclass(frozen=True)
class ReportRow:
    """One place's figures: fraction of variance unexplained, mean L0 per token, the
    fraction of features never active on the texts."""

    place: str
    hook: str | None
    fvu: float
    l0: float
    dead: float
    own: bool


@dataclass(frozen=True)
class SAEReport:
    """``sae_report``'s answer: a row per place (the dictionary's own and its
    neighbours in forward order), and ``flag`` where a neighbour's error is lower."""

    rows: tuple[ReportRow, ...]
    tokens: int
    flag: str | None

    def __str__(self) -> str:
        lines = [f"{'place':<28} {'hook':<28} {'FVU':>8} {'L0':>7} {'dead':>6}"]
        for r in self.rows:
            mark = "*" if r.own else " "
            lines.append(
                f"{mark}{r.place:<27} {r.hook or '-':<28} {r.fvu:8.4f} {r.l0:7.2f} {r.dead:6.3f}"
            )
        return "\n".join([*lines, self.flag or f"placement holds ({self.tokens} tokens)"])


def figures(
    sae: Any, x: torch.Tensor, target: torch.Tensor | None = None
) -> tuple[float, float, float]:
    """(FVU, L0, dead fraction) of ``sae`` on the token rows ``x`` (n x d), its
    reconstruction compared with ``target`` (a transcoder's output; else ``x``)."""
    with torch.no_grad():
        f = sae.features(x.to(sae.dtype))
        y = (x if target is None else target).to(sae.dtype)
        error = (y - sae.inverse(f)).pow(2).sum()
        total = (y - y.mean(0)).pow(2).sum().clamp_min(1e-30)
        active = f != 0
    return (
        float(error / total),
        float(active.sum(-1).float().mean()),
        float((~active.any(0)).float().mean()),
    )


def _neighbours(model: Any, at: ComponentAddress, width: int) -> list[ComponentAddress]:
    """Up to three places before and three after ``at`` in forward order, of its
    width, that the model has."""
    found = []
    for name in _SIZED:
        for layer in range(len(model.layers)) if _per_layer(name) else [None]:
            try:
                place = locate(model, name, layer)
            except (CausalabError, IndexError):
                continue
            if place.width == width:
                found.append(place)
    found.sort()
    i = next(j for j, p in enumerate(found) if (p.component, p.layer) == (at.component, at.layer))
    return found[max(0, i - 3) : i + 4]


def sae_report(model: Any, sae: Any, texts: list[str], *, engine: str = "nnsight") -> SAEReport:
    """FVU, L0 and dead fraction of a loaded ``sae`` at its place and at the nearest
    place before and after it in forward order whose tensor differs (on the content
    tokens of ``texts``); ``flag`` names a neighbour whose error is lower."""
    from .plan import Plan
    from .positions import encode

    at = getattr(sae, "site", None)
    if not isinstance(at, ComponentAddress):
        raise DictionaryRefused(f"{sae!r} has no place: load it with SAE.load(path, model=...)")
    places = _neighbours(model, at, sae.width or 0)
    reads = [*places, *([sae.site_out] if sae.site_out is not None else [])]
    got = Plan.of(reads=reads).run(model, texts, engine=engine)
    frames = encode(model, texts).frames
    rows_of = [(r, c) for r, frame in enumerate(frames) for c in frame.content]
    index = (torch.tensor([r for r, _ in rows_of]), torch.tensor([c for _, c in rows_of]))
    tokens = {p: got[p][index] for p in reads}
    own = tokens[at]
    target = tokens[sae.site_out] if sae.site_out is not None else None
    i = places.index(at)
    before = [p for p in reversed(places[:i]) if not torch.allclose(tokens[p], own)][:1]
    after = [p for p in places[i + 1 :] if not torch.allclose(tokens[p], own)][:1]
    rows = []
    for place in [*before, at, *after]:
        fvu, l0, dead = figures(sae, tokens[place], target if place == at else None)
        rows.append(ReportRow(_short(place), _hook(place, model), fvu, l0, dead, place == at))
    mine = next(r for r in rows if r.own)
    better = [r for r in rows if not r.own and r.fvu < mine.fvu]
    flag = None
    if better and sae.site_out is None:
        best = min(better, key=lambda r: r.fvu)
        flag = (
            f"misplaced? {best.place} reconstructs with FVU {best.fvu:.4f}, lower than "
            f"{mine.fvu:.4f} at its own place {mine.place}: the checkpoint's site may name "
            "another tensor on this family"
        )
    return SAEReport(tuple(rows), len(rows_of), flag)


def transcoder_write(
    model: Any, sae: Any, texts: list[str], edit: Any, *, engine: str = "nnsight"
) -> tuple[ComponentAddress, Any]:
    """The write that edits a loaded transcoder's features on ``texts``: its output
    place and ``Add(decode(f_new) - decode(f))``, f its features of the input place
    and f_new ``edit`` (a mechanism, or features) applied to them. Put it in a plan
    run on the same texts: the error term is kept (no edit: an Add of zeros), and the
    input place is upstream of the output, so one forward to read it is enough."""
    from .mechanisms import Add, Mechanism
    from .plan import Plan

    if getattr(sae, "site_out", None) is None:
        raise DictionaryRefused(
            f"{sae!r} is no transcoder (it has no output place): write features at its own "
            "place, locate(model, component, layer, featurizer=sae)"
        )
    x = Plan.of(reads=[sae.site]).run(model, texts, engine=engine)[sae.site]
    with torch.no_grad():
        f = sae.read(x)
        new = edit.apply(f) if isinstance(edit, Mechanism) else edit.to(f.dtype)
        delta = (sae.inverse(new) - sae.inverse(f)).to(x.dtype)
    return sae.site_out, Add(delta)


def _short(place: ComponentAddress) -> str:
    return place.component if place.layer is None else f"{place.component}[{place.layer}]"


def _hook(place: ComponentAddress, model: Any) -> str | None:
    try:
        return hook_name_of(place, model)
    except HookNameRefused:
        return None


__all__ = [
    "DICTIONARY_LEARNING_SITES",
    "DictionaryRefused",
    "Origin",
    "Parts",
    "ReportRow",
    "SAEReport",
    "detect",
    "figures",
    "placed",
    "read",
    "sae_report",
    "transcoder_write",
]
