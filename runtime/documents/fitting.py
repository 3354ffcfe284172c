"""A document's featurizers bound to its places (``causalab_mini.featurizers``): built
per address from the document's options, fitted where the kind is fitted (PCA on the
site's clean values over the fit rows, an SAE trained on them or read from a file
beside the document), and the site's ``features`` made the featurizer's selection
(what a patch swaps; what a zero or mean write sets).

A fitted featurizer is fitted once per place and kept for the run; a subspace or a
gate is made fresh for each cell (a trained cell fits its own, from its seed)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .data import Rows, split_rows
from .experiment import Cell, Experiment
from .reading import forwards_of, role_texts, values
from .sections import featurizer_file
from .source import DocumentError

FITTED = ("pca", "sae")


def fit_rows(exp: Experiment, name: str) -> Rows:
    """The rows featurizer ``name`` is fitted on: its fit's split, else the train
    split where the document trains, else the document's rows."""
    item = exp.doc["featurizers"][name]
    split = (item.get("fit") or {}).get("split")
    if split is None and isinstance(exp.doc.get("train"), dict):
        split = exp.doc["train"].get("split", "train")
    if split is None:
        return exp.rows
    rows, issues = split_rows(exp.source, split, ("featurizers", name))
    if rows is None:
        raise DocumentError(issues)
    return rows


def _samples(exp: Experiment, name: str, address: Any) -> Any:
    """The clean values at ``address``'s place over the fit rows' base and source
    texts, each token the site names one sample (samples, width)."""
    texts = role_texts(exp, fit_rows(exp, name))
    place = dataclasses.replace(address, featurizer=None)
    exp.cache.setdefault("fit forwards", []).append(forwards_of(exp, [place], texts))
    return values(exp, [place], texts)[place].float()


def train_sae(samples: Any, item: dict[str, Any]) -> tuple[Any, dict[str, float]]:
    """A small sparse autoencoder trained on ``samples`` (n, d), full batch with Adam,
    on squared error plus ``l1`` times the features' decoder-weighted L1 norm; returns
    it and its fit (fraction of variance explained, mean features active, loss)."""
    import torch

    from ..featurizers import SAE

    fit = item.get("fit") or {}
    m, d = int(item["features"]), int(samples.shape[1])
    g = torch.Generator().manual_seed(int(item.get("seed", 0)))
    encoder = torch.randn(d, m, generator=g) / math.sqrt(d)
    decoder = encoder.T / encoder.T.norm(dim=-1, keepdim=True)
    activation = item.get("activation", "relu")
    sae = SAE(encoder, decoder, None, samples.mean(0), activation=activation, topk=item.get("topk"))
    optimizer = torch.optim.Adam(sae.parameters(), lr=float(fit.get("learning_rate", 1e-2)))
    l1 = float(fit.get("l1", 1e-3))
    scale = float(samples.var(0).sum())
    with torch.enable_grad():
        for _ in range(int(fit.get("epochs", 300))):
            f = sae.encode(samples)
            error = ((sae.decode(f) - samples) ** 2).sum(-1).mean() / scale
            loss = error + l1 * (f * sae.decoder.norm(dim=-1)).sum(-1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        f = sae.encode(samples)
        error = float(((sae.decode(f) - samples) ** 2).sum(-1).mean()) / scale
        active = float((f > 0).float().sum(-1).mean())
    return sae, {"explained": 1 - error, "active": active, "samples": int(samples.shape[0])}


def _fitted(exp: Experiment, name: str, address: Any) -> Any:
    """The fitted featurizer ``name`` at ``address``'s place, fitted once per run."""
    from ..featurizers import PCA

    fitted = exp.cache.setdefault("fitted", {})
    key = (name, address.component, address.layer, address.head)
    if key not in fitted:
        item = exp.doc["featurizers"][name]
        fit: dict[str, float] = {}
        if item["kind"] == "pca":
            samples = _samples(exp, name, address)
            f = PCA.fit(samples, int(item["k"]))
            variance = samples.var(0).sum()
            kept = ((samples - f.mean) @ f.matrix.T).var(0).sum() if f.k else 0.0
            fit["explained"] = float(kept / variance)
        elif "file" in item:
            f = featurizer_file(exp.source, item, address, address.layer)
        else:
            f, fit = train_sae(_samples(exp, name, address), item)
        fitted[key] = (f, fit)
    return fitted[key][0]


def build(exp: Experiment, name: str, address: Any, features: Any = None) -> Any:
    """Featurizer ``name`` of the document at ``address`` (a fresh subspace or gate, a
    copy of the fitted PCA or SAE), selecting ``features``, bound to the place."""
    from ..featurizers import Gate, Identity, Subspace

    item = exp.doc["featurizers"][name]
    kind = item["kind"]
    select = None if features is None else list(features)
    if kind in FITTED:
        f = _fitted(exp, name, address)
        f = type(f).built({**f.config(), "select": select}, f.tensors())
    elif kind == "subspace":
        f = Subspace(
            int(item["k"]),
            item.get("parametrization", "orthogonal"),
            seed=int(item.get("seed", 0)),
            select=select,
        )
    elif kind == "gate":
        over = item.get("over", "identity")
        inner = Identity(width=address.width) if over == "identity" else build(exp, over, address)
        f = Gate(
            inner,
            item.get("gate", "sigmoid"),
            temperature=float(item.get("temperature", 1.0)),
            init=item.get("init"),
        )
    else:
        f = Identity(select=select)
    return dataclasses.replace(address, featurizer=f.bind(address.width, str(address)))


def featurize(exp: Experiment, cell: Cell) -> Cell:
    """``cell`` with the addresses of its featurized sites bound to their featurizers
    (the same cell where it has none)."""
    names = {s: exp.featurizer_of(cell.intervention, s) for s in cell.bindings}
    if not any(names.values()) or cell.refused is not None:
        return cell
    addresses = dict(cell.addresses)
    for site, b in cell.bindings.items():
        name = names[site]
        if name is not None:
            features = b.features if name == b.featurizer else None
            addresses[site] = [build(exp, name, a, features) for a in addresses[site]]
    return dataclasses.replace(cell, addresses=addresses)


def fits(exp: Experiment) -> dict[str, Any]:
    """What each fitted featurizer's fit gave, by name and place (for the results)."""
    out: dict[str, Any] = {}
    for (name, component, layer, head), (_, fit) in exp.cache.get("fitted", {}).items():
        where = f"{component}[{layer}]" + ("" if head is None else f".head[{head}]")
        out.setdefault(name, {})[where] = fit
    return out


__all__ = ["build", "featurize", "fit_rows", "fits", "train_sae"]
