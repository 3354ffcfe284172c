"""``python -m causalab_mini.tools.sweep TYPE``: one architecture, one JSON line."""

from causalab_mini.tools.sweep.cli import main

if __name__ == "__main__":  # importing the module (a walk over the package) runs nothing
    main()
