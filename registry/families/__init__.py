"""One YAML file per family that differs from the defaults."""
