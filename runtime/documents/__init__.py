"""Experiments as documents: a YAML or JSON file that says which model, which rows,
which places at which layers and positions, what is read and written, what is
measured and what is saved; checked before anything runs (``validate``), shown
before it runs (``explain``), and run into a folder of results, plots and a receipt
(``run``). The schema is ``schema/document.schema.json``; the command line is
``causalab-mini validate | explain | run``."""

from __future__ import annotations

from .source import DocumentError, Issue, Source, load

__all__ = ["DocumentError", "Issue", "Source", "load"]
