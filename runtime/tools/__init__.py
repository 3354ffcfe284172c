"""The tools beside the library: the `registry` command line (`cli`), the coverage
sweep (`sweep`) and the checks it runs (`certify`), the family scaffolder
(`scaffold`), block diagrams (`diagram`), tiny random checkpoints (`tiny`) and shell
completion (`completion`).

The library (``causalab_mini`` itself: the model, its internals, components and
plans) never imports this package; a research user's ``from causalab_mini import
StandardizedTransformer`` loads none of it. Building a ``tiny:`` spec is the one place
the library reaches in here, and only when it is given one.
"""
