"""The registry rows: YAML files shipped as package data."""
