"""`python -m causalab_mini.codegen` runs the `registry` command."""

from .cli import main

main()
