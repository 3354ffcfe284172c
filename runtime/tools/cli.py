"""The `registry` command line (alias `causalab-mini`): one click group whose
commands load lazily, so a command's imports happen when it runs (`registry lint`
imports neither torch nor the tools it does not use)."""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["COMMANDS", "main"]

# name -> "module:attribute" of the click command
COMMANDS: dict[str, str] = {
    "lint": "causalab_mini.codegen.cli:lint_command",
    "gen": "causalab_mini.codegen.cli:gen_command",
    "model": "causalab_mini.tools.model:model_command",
    "sweep": "causalab_mini.tools.sweep:sweep_command",
    "new-family": "causalab_mini.tools.scaffold:new_family_command",
    "diagram": "causalab_mini.tools.diagram:diagram_command",
    "positions": "causalab_mini.tools.positions:positions_command",
    "validate": "causalab_mini.tools.documents:validate_command",
    "explain": "causalab_mini.tools.documents:explain_command",
    "run": "causalab_mini.tools.documents:run_command",
    "tokens": "causalab_mini.tools.documents:tokens_command",
}


class LazyGroup(click.Group):
    """A group that imports a command's module when the command is asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attribute = target.partition(":")
        command: Any = getattr(importlib.import_module(module), attribute)
        return command if isinstance(command, click.Command) else None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="causalab-mini")
def main() -> None:
    """causalab-mini: named places inside transformer language models.

    \b
    Example:
      registry lint
      registry gen --check
      registry model tiny:llama
      registry new-family starcoder2
      registry diagram tiny:gpt_neox parallel.svg
      registry positions tiny:llama "The quick brown fox" --position '{"index": -1}'
      causalab-mini validate documents/activation_patching.yaml
      causalab-mini explain documents/activation_patching.yaml --model tiny:gpt2
      causalab-mini run documents/activation_patching.yaml --out runs/patching
      causalab-mini tokens tiny:llama "The quick brown fox"   (= registry positions)

    \b
    Shell completion (bash; zsh_source and fish_source for the others):
      eval "$(_REGISTRY_COMPLETE=bash_source registry)"
    """


if __name__ == "__main__":
    main()
