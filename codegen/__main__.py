"""`python -m causalab_mini.codegen` runs the `registry` command line, every command
of it (the group is ``causalab_mini.tools.cli``; this is only its entry point)."""

from causalab_mini.tools.cli import main

main()
