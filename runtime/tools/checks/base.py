"""What every check of the sweep is made of: a ``CheckResult`` (what one check found;
the one result type, defined beside certify's comparator and used by its comparisons
too), the ``Context`` a check reads, and the two helpers most checks share. The checks
(``causalab_mini.tools.checks``) and the recomputations they call
(``checks.recompute``, ``checks.positions``) import this module; it imports none of
them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from causalab_mini.generated import COMPONENTS
from causalab_mini.tools import certify as cert
from causalab_mini.tools.certify import CheckResult, close

# the name the checks' results had before they had one type (code on other branches)
Outcome = CheckResult


@dataclass
class Context:
    """What every check reads: ``v`` holds the components read in one trace by
    (component, layer); ``raw`` the modules' own outputs and what the attention call
    was given (``sweep.raw_outputs_of``); ``hf`` transformers' own forward with hidden
    states (and attentions under eager attention); ``places`` the Address rows'
    values by (row, layer), including rows an identity names that no component reads."""

    model: Any
    inputs: dict[str, Any]
    addresses: dict[tuple[str, int | None], Any]
    v: dict[tuple[str, int | None], Any]
    raw: dict[tuple[Any, int], Any] = field(default_factory=dict)
    hf: Any = None
    places: dict[tuple[str, int | None], Any] = field(default_factory=dict)
    attn_inputs: dict[tuple[str, int | None], Any] = field(default_factory=dict)
    unordered: dict[Any, str] = field(default_factory=dict)
    # per component, figures a check records beside its outcomes (the sweep keeps
    # them in the component's entry of the report: the lens identity's error)
    notes: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.model.internals.num_layers)

    def have(self, *names: str, layer: int | None = None) -> bool:
        return all((name, layer) in self.v for name in names)

    @property
    def hidden(self) -> Any:
        return cert.oracle_hidden_states(self.model, self.hf.hidden_states)

    @property
    def stream_ends_at_block(self) -> bool:
        """Whether output_hidden_states ends with the last block's output rather than
        the final norm's (BERT- and BART-style models, whose norm sits in the LM head
        or nowhere)."""
        n, hidden = self.n, self.hidden
        return (
            len(hidden) == n + 1
            and self.have("block_output", layer=n - 1)
            and close(
                self.v[("block_output", n - 1)], handed(self, "block_output", n - 1, hidden[n])
            )[0]
        )


# a check of the sweep: a function of the model's context yielding its results
CheckFunction = Callable[[Context], Iterator[CheckResult]]


def handed(ctx: Context, component: str, layer: int | None, held: Any) -> Any:
    """An oracle's tensor as the component hands it on: where its place carries several
    residual streams, flat (batch, seq, n x hidden) like the component's value; else
    as given."""
    from causalab_mini.address import Streams

    address = ctx.addresses.get((component, layer))
    layout = getattr(address, "stream_layout", None)
    if layout is None:
        return held
    return Streams(layout, "").flat(held)


def row_components() -> dict[str, str]:
    """The component that names each Address row (boundary components only)."""
    return {spec.target: name for name, spec in COMPONENTS.items() if spec.kind == "boundary"}


# ---------------------------------------------------------------- whole model


__all__ = ["CheckFunction", "CheckResult", "Context", "Outcome", "handed", "row_components"]
