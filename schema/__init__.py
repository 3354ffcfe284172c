"""JSON Schemas (draft 2020-12), one per registry file kind."""
