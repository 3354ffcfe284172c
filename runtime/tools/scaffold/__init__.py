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

from causalab_mini.tools.scaffold.build import rows_for, scaffold
from causalab_mini.tools.scaffold.capture import Capture, capture, walk_layer
from causalab_mini.tools.scaffold.command import new_family_command, print_summary
from causalab_mini.tools.scaffold.data import (
    ROWS,
    Candidate,
    Scaffold,
    ScaffoldError,
    StructureTrial,
    Verdict,
)
from causalab_mini.tools.scaffold.loading import (
    detect_containers,
    family_name,
    force_structure,
    load,
    resolve_spec,
)
from causalab_mini.tools.scaffold.places import RELATIONS, Relation, place_verdicts
from causalab_mini.tools.scaffold.search import decide_structure, try_structure
from causalab_mini.tools.scaffold.writing import (
    Written,
    add_rule,
    preflight,
    render_family,
    rule_text,
    write_scaffold,
)

__all__ = [
    "RELATIONS",
    "ROWS",
    "Candidate",
    "Capture",
    "Relation",
    "Scaffold",
    "ScaffoldError",
    "StructureTrial",
    "Verdict",
    "Written",
    "add_rule",
    "capture",
    "decide_structure",
    "detect_containers",
    "family_name",
    "force_structure",
    "load",
    "new_family_command",
    "place_verdicts",
    "preflight",
    "print_summary",
    "render_family",
    "resolve_spec",
    "rows_for",
    "rule_text",
    "scaffold",
    "try_structure",
    "walk_layer",
    "write_scaffold",
]
