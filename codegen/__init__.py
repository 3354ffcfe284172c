"""Loader, lint, templates and writer: `registry lint`, `registry gen`."""
