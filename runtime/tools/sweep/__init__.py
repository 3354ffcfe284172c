"""``registry sweep``: every causal-LM architecture of the installed transformers (and
of every other group registry/tiny.yaml names: image-text-to-text wrappers), each
component of registry/components.yaml certified on real tensors or refused with a
reason.

Each architecture runs in its own process (``python -m causalab_mini.tools.sweep TYPE``)
with a timeout, so a hang or a crash never stops the sweep. A component is

* ``ok``      it resolved, and every check that covers it passed;
* ``refused`` the model says why it has no such place (a specific reason);
* ``broken``  it resolved to a tensor that failed a check, a check crashed, or the
              reason is generic.

An architecture that loads is ``certified`` when every component is ok or refused
with a reason of the model, and ``unfinished`` when a component is refused only
because no rule in registry/block_structures.yaml gives its block structure (the
registry has not been told; a family's structure_unknown_reason is a reason).

The package along its seams: ``runner`` (one architecture in this process, or each in
its own with a timeout; the ``Result``), ``certification`` (one loaded model's
components located, read, checked and judged), ``report`` (totals, the JSON report,
the coverage table) and ``cli`` (the command). Their public names are importable
from here."""

from causalab_mini.tools.sweep.certification import GENERIC, certify, check_context, read_all
from causalab_mini.tools.sweep.cli import main, sweep_command
from causalab_mini.tools.sweep.report import (
    coverage_markdown,
    differences_markdown,
    group_name,
    joined_with_moved,
    summarize,
    write_report,
)
from causalab_mini.tools.sweep.runner import Result, judge_structure, run_one, sweep, untold

__all__ = [
    "GENERIC",
    "Result",
    "certify",
    "check_context",
    "coverage_markdown",
    "differences_markdown",
    "group_name",
    "joined_with_moved",
    "judge_structure",
    "main",
    "read_all",
    "run_one",
    "summarize",
    "sweep",
    "sweep_command",
    "untold",
    "write_report",
]
