"""``python -m causalab_mini.tools.sweep TYPE``: one architecture, one JSON line."""

from causalab_mini.tools.sweep.cli import main

main()
