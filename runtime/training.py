"""Trained interventions: fit the featurizers of interchange patches (a distributed
alignment search subspace, a boundless mask) to counterfactual labels, the model
frozen.

    result = train(model, [locate(model, "block_output", 1, position={"index": -1},
                                  featurizer=Subspace(1))],
                   bases, sources, labels, epochs=20, lr=0.05, seed=0)
    result.featurizers[0].matrix   # the fitted direction(s), k x d
    result.history                 # loss and IIA per epoch
    result.iia                     # interchange-intervention accuracy on the eval split

Each step runs ``interchange`` on a batch of pairs with gradients on (the patch's
featurizer swaps its selected features from the source; its parameters are the only
ones that learn) and takes the loss of the base rows' last-token logits against the
labels: ``objective="cross_entropy"`` (labels: one token per pair, ids or one-token
texts) or ``"kl"`` (labels: the (pairs, vocab) logits a counterfactual run gave). The
model's weights are frozen and left bit for bit as they were; the run is deterministic
for a seed (the order of pairs per epoch; a featurizer's start is its own seed's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .attribution import frozen
from .engines import Engine
from .errors import CausalabError
from .hooks import dispatched
from .interchange import interchange
from .locator import ComponentAddress
from .metrics import tokens_of


class TrainingRefused(CausalabError, ValueError):
    """A training run that cannot start as asked, with what to give instead."""


@dataclass
class TrainResult:
    """The fitted featurizers (in the order of the patches), the loss and the
    interchange-intervention accuracy (IIA) per epoch, the eval split's IIA, and the
    epoch whose featurizers were kept (the best on the eval split)."""

    featurizers: list[Any]
    history: list[dict[str, float]] = field(default_factory=list)
    iia: float | None = None
    best_epoch: int = 0


def _labels(model: Any, labels: Any, n: int, objective: str) -> Any:
    import torch

    if objective == "kl":
        value = torch.as_tensor(labels).float()
        if value.dim() != 2 or value.shape[0] != n:
            raise TrainingRefused(
                f"objective='kl' takes the (pairs, vocab) logits of the counterfactual runs; "
                f"got shape {tuple(value.shape)} for {n} pairs"
            )
        return value
    ids = tokens_of(model, labels)
    if ids.numel() != n:
        raise TrainingRefused(f"{ids.numel()} labels for {n} pairs: give one label per pair")
    return ids.reshape(n)


def _loss(logits: Any, target: Any, objective: str) -> Any:
    import torch

    if objective == "kl":
        p = torch.log_softmax(target.to(logits.device), -1)
        q = torch.log_softmax(logits.float(), -1)
        return (p.exp() * (p - q)).sum(-1).mean()
    return torch.nn.functional.cross_entropy(logits.float(), target.to(logits.device))


def _hits(logits: Any, target: Any, objective: str) -> Any:
    want = target.argmax(-1) if objective == "kl" else target
    return (logits.argmax(-1) == want.to(logits.device)).float()


def _parameters(patches: Sequence[ComponentAddress]) -> list[Any]:
    params: list[Any] = []
    for address in patches:
        f = address.featurizer
        if f is None:
            raise TrainingRefused(
                f"{address} has no featurizer: training fits a featurizer's parameters; "
                "locate the place with featurizer=Subspace(k) (or a Gate)"
            )
        mine = [p for p in f.parameters() if p.requires_grad]
        if not mine:
            raise TrainingRefused(
                f"{address}: {f!r} has no trainable parameters (a fixed basis): train a "
                "Subspace or a Gate"
            )
        params += mine
    return params


def _evaluate(
    model: Any,
    patches: Sequence[ComponentAddress],
    pairs: tuple[Sequence[str], Sequence[str], Any],
    objective: str,
    engine: str | Engine,
    frame: str,
) -> tuple[float, float]:
    import torch

    bases, sources, target = pairs
    with torch.no_grad():
        logits = interchange(model, patches, bases, sources, engine=engine, frame=frame).logits
        return float(_loss(logits, target, objective)), float(
            _hits(logits, target, objective).mean()
        )


def train(
    model: Any,
    patches: Sequence[ComponentAddress],
    bases: Sequence[str],
    sources: Sequence[str],
    labels: Any,
    *,
    objective: str = "cross_entropy",
    epochs: int = 10,
    batch_size: int = 16,
    lr: float = 1e-2,
    seed: int = 0,
    eval: tuple[Sequence[str], Sequence[str], Any] | None = None,
    patience: int | None = None,
    engine: str | Engine = "hooks",
    frame: str = "plain",
) -> TrainResult:
    """Fit the featurizers of ``patches`` (see the module's text). ``eval``: a held-out
    (bases, sources, labels) split, whose loss picks the epoch kept and, with
    ``patience``, stops early after that many epochs without improving."""
    import torch

    _check(objective, bases, sources, epochs, batch_size)
    params = _parameters(patches)
    target = _labels(model, labels, len(bases), objective)
    held = (
        None
        if eval is None
        else (eval[0], eval[1], _labels(model, eval[2], len(eval[0]), objective))
    )
    run = _Run(
        model,
        patches,
        bases,
        sources,
        target,
        objective,
        engine,
        frame,
        batch_size,
        torch.optim.Adam(params, lr=lr),
        torch.Generator().manual_seed(seed),
    )
    result = TrainResult([a.featurizer for a in patches])
    keep = _Best(result)
    with _weights_kept(model), frozen(model), torch.enable_grad():
        for epoch in range(epochs):
            entry = run.epoch(epoch)
            if held is not None:
                entry["eval_loss"], entry["eval_iia"] = _evaluate(
                    model, patches, held, objective, engine, frame
                )
            result.history.append(entry)
            if keep.stale(epoch, entry.get("eval_loss", entry["loss"]), patience):
                break
    keep.restore()
    if held is not None:
        result.iia = _evaluate(model, patches, held, objective, engine, frame)[1]
    return result


@contextlib.contextmanager
def _weights_kept(model: Any) -> Iterator[None]:
    """Hold the model's weights to staying bit for bit what they were (refused if not)."""
    import torch

    dispatched(model)  # the real weights, before they are held to staying as they are
    module = getattr(model, "_model", model)
    weights = [p.detach().clone() for p in module.parameters()]
    yield
    after = list(module.parameters())
    if any(not torch.equal(a, b) for a, b in zip(after, weights, strict=True)):
        raise TrainingRefused("a weight of the model changed during training: it must not")


class _Best:
    """The featurizers' state at the best epoch (the lowest eval loss, or training
    loss), and whether training has gone ``patience`` epochs without improving."""

    def __init__(self, result: TrainResult) -> None:
        self.result, self.best, self.count = result, float("inf"), 0
        self.state: list[dict[str, Any]] = []

    def stale(self, epoch: int, score: float, patience: int | None) -> bool:
        if score < self.best:
            self.best, self.count, self.result.best_epoch = score, 0, epoch
            self.state = [
                {k: v.detach().clone() for k, v in f.state_dict().items()}
                for f in self.result.featurizers
            ]
            return False
        self.count += 1
        return patience is not None and self.count >= patience

    def restore(self) -> None:
        for f, state in zip(self.result.featurizers, self.state, strict=False):
            f.load_state_dict(state)


def _check(
    objective: str, bases: Sequence[str], sources: Sequence[str], epochs: int, batch_size: int
) -> None:
    if objective not in ("cross_entropy", "kl"):
        raise TrainingRefused(f"objective is 'cross_entropy' or 'kl', not {objective!r}")
    if len(bases) != len(sources) or not bases:
        raise TrainingRefused("bases and sources are lists of texts, one source per base")
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if type(value) is not int or value < 1:
            raise TrainingRefused(f"{name} is a positive int, not {value!r}")


@dataclass
class _Run:
    """One training run's fixed parts; ``epoch`` runs one pass over the pairs."""

    model: Any
    patches: Sequence[ComponentAddress]
    bases: Sequence[str]
    sources: Sequence[str]
    target: Any
    objective: str
    engine: str | Engine
    frame: str
    batch_size: int
    optimizer: Any
    order: Any

    def epoch(self, epoch: int) -> dict[str, float]:
        import torch

        losses, hits = [], []
        for chunk in torch.split(
            torch.randperm(len(self.bases), generator=self.order), self.batch_size
        ):
            rows = chunk.tolist()
            logits = interchange(
                self.model,
                self.patches,
                [self.bases[i] for i in rows],
                [self.sources[i] for i in rows],
                engine=self.engine,
                frame=self.frame,
            ).logits
            loss = _loss(logits, self.target[chunk], self.objective)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.detach()) * len(rows))
            hits.append(_hits(logits.detach(), self.target[chunk], self.objective))
        mean_hits = float(torch.cat(hits).mean())
        return {"epoch": float(epoch), "loss": sum(losses) / len(self.bases), "iia": mean_hits}


__all__ = ["TrainResult", "TrainingRefused", "train"]
