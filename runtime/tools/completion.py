"""Shell completion for model specs: ``tiny:<model_type>`` for the model types the
registry names (its block-structure rules and family files), without importing torch.

Completion itself is click's: ``eval "$(_REGISTRY_COMPLETE=bash_source registry)"``
(``zsh_source``, ``fish_source`` for the other shells).
"""

from __future__ import annotations

from typing import Any

from click.shell_completion import CompletionItem

__all__ = ["complete_spec"]


def complete_spec(ctx: Any, param: Any, incomplete: str) -> list[CompletionItem]:
    """``tiny:<model_type>`` specs (and local directories, which the shell completes)."""
    from causalab_mini.generated import BLOCK_STRUCTURE_RULES, FAMILY_MATCH

    types = {t for rule in BLOCK_STRUCTURE_RULES for t in rule.match.model_types}
    types |= {t for match in FAMILY_MATCH.values() for t in match.model_types}
    specs = sorted(f"tiny:{t}" for t in types)
    if incomplete and not ("tiny:".startswith(incomplete) or incomplete.startswith("tiny:")):
        specs = sorted(t for t in types)  # a bare model type (registry new-family takes one)
    return [CompletionItem(s) for s in specs if s.startswith(incomplete)]
