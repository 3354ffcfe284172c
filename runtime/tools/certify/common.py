"""What every check stands on: the sample inputs, one trace reading every place, and
the one comparator (``difference``; ``close`` and ``compare`` report it) with the
tolerances and ``CheckResult``, the one result type of every check (``Check`` is its
older name)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from causalab_mini.tools.verdicts import ComponentState

ATOL = 1e-4


RTOL = 1e-4


@dataclass(frozen=True)
class CheckResult:
    """What one check found, the one result type of the project's checks (certify's
    comparisons and the sweep's checks alike): the ``components`` it covers (none on a
    comparison of registry rows, which certify makes; the sweep names the components
    when it reports one), its ``description`` (the same on every model, so the
    coverage table can list it; on a comparison, what was compared), its ``status``
    (ok: it held; broken: it failed; refused: the library refused what the check runs,
    with the reason in ``detail``, which breaks nothing), a ``detail`` (the worst
    error, the layer, or the shapes that differ), and, on a comparison, the ``layer``
    it was made on (None: the whole model) and its worst absolute error
    (``max_error``; inf where the shapes differ)."""

    components: tuple[str, ...]
    description: str
    status: ComponentState
    detail: str = ""
    layer: int | None = None
    max_error: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the check breaks none of its components (it held, or was refused)."""
        return self.status is not ComponentState.BROKEN

    @classmethod
    def of(
        cls,
        components: Iterable[str],
        description: str,
        ok: bool,
        detail: str = "",
        *,
        layer: int | None = None,
        max_error: float | None = None,
    ) -> CheckResult:
        """A comparison's result: ok where it held, else broken."""
        status = ComponentState.OK if ok else ComponentState.BROKEN
        return cls(tuple(components), description, status, detail, layer, max_error)

    @classmethod
    def refused(cls, components: Iterable[str], description: str, detail: str) -> CheckResult:
        """A check the library refused to run here, with the reason (``detail``)."""
        return cls(tuple(components), description, ComponentState.REFUSED, detail)


# the name certify's comparisons had before every check had one result type
Check = CheckResult


def sample_inputs(model: Any, texts: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A padded batch of two (the first row left-padded), as tensors."""
    texts = texts or (
        "The quick brown fox",
        "A much longer sentence about the quick brown fox and a lazy dog",
    )
    tokenizer = model.tokenizer
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    # a forward that needs more than token ids (a drafter's target states) gets the
    # inputs registry/tiny.yaml side_inputs gives its model type
    from causalab_mini.tools.tiny import side_inputs

    inputs.update(side_inputs(model._model.config, *batch["input_ids"].shape, tokens=inputs))
    embeds = inputs.get("inputs_embeds")
    if embeds is not None and embeds.shape[1] < inputs["input_ids"].shape[1]:
        # the side inputs query fewer positions than the mask spans (a drafter: one
        # drafted position over the target's keys and values): the token ids are each
        # row's last ones, so nnsight counts no positions of its own for a batch whose
        # mask is wider than its ids (0.8 would, from a mask as wide as the ids)
        inputs["input_ids"] = inputs["input_ids"][:, -embeds.shape[1] :]
    return inputs


def forward_inputs(model: Any, inputs: Any) -> dict[str, Any]:
    """The keyword arguments the trace's own forward receives for ``inputs``: what a
    plain forward (an oracle) must be fed to compute what the places hold.

    A place holds what the traced forward computes, and the trace decides part of that
    forward's input: on a left-padded text batch without ``position_ids``, position ids
    counted from each row's first real token are added (by nnsight 0.8 itself, on 0.6
    and 0.7 by the model: ``compat.supply_position_ids``), so left padding does not
    shift an absolute-position model such as GPT-2 or OPT. The oracles are fed exactly
    what the trace's forward got, read from the trace itself. (Position ids passed by
    the caller are used as given.)
    """
    box: list[Any] = []  # bound before the trace
    with model.trace(inputs):
        box.append(model.inputs.save())
    args, kwargs = saved_value(box[0])
    if args:
        raise TypeError(
            f"the traced forward was called with {len(args)} positional arguments; the "
            "oracles pass keyword arguments only: give the trace a mapping of tensors"
        )
    return dict(kwargs)


def read_places(
    model: Any, inputs: dict[str, Any], names: list[str] | None = None
) -> dict[tuple[str, int | None], Any]:
    """Read every available tensor place (per layer and whole-model) in one trace, in
    forward order. Returns ``{(name, layer): tensor}``."""
    internals = model.internals
    plan: list[tuple[tuple[int, int], str, int | None]] = []
    for name in names or list(internals):
        place = internals[name]
        if place.row.io.value == "module":
            continue
        if place.per_layer:
            for layer in range(internals.num_layers):
                if place.unavailable_on(layer) is None:
                    plan.append((internals.rank(name, layer), name, layer))
        elif place.unavailable_on() is None:
            plan.append((internals.rank(name), name, None))
    plan.sort(key=lambda item: item[0])
    saved: list[Any] = []  # made before the trace: names first bound inside it do not leave it
    with model.trace(inputs):
        for _, name, at in plan:
            saved.append(internals[name].get(at).save())
    return {(name, layer): saved_value(t) for (_, name, layer), t in zip(plan, saved, strict=True)}


def saved_value(saved: Any) -> Any:
    return getattr(saved, "value", saved)


def difference(got: Any, want: Any, atol: float = ATOL) -> tuple[bool, float]:
    """The one comparator of the project's checks: (whether ``got`` equals ``want`` up
    to ``atol`` times the larger of 1 and ``want``'s largest magnitude, and ``RTOL``;
    the worst absolute error). Tensors of different shapes differ (error inf)."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        return False, float("inf")
    got, want = got.detach().double(), want.detach().double()
    if not want.numel():
        return True, 0.0
    worst = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    return bool(torch.allclose(got, want, atol=atol * scale, rtol=RTOL)), worst


def close(got: Any, want: Any, atol: float = ATOL) -> tuple[bool, str]:
    """``difference`` as (ok, detail) for a report: the worst error, or the shapes."""
    ok, worst = difference(got, want, atol)
    if worst == float("inf"):
        return False, f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return ok, f"max error {worst:.3g}"


def compare(name: str, layer: int | None, got: Any, want: Any) -> CheckResult:
    """``difference`` as a comparison's result, described by ``name`` (it covers no
    component: the caller names them)."""
    ok, worst = difference(got, want)
    detail = "" if worst != float("inf") else f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    return CheckResult.of((), name, ok, detail, layer=layer, max_error=worst)
