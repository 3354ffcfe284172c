"""The installed versions of packages, read once per process, and whether a row's or an
interior's version ranges hold for them."""

from __future__ import annotations

import functools

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@functools.cache
def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (read once per process: reading package
    metadata costs milliseconds, and locate asks for every interior at every layer)."""
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None


def outside_versions(versions: tuple[tuple[str, str], ...]) -> tuple[str, str, str] | None:
    """The first (package, range, installed version) of ``versions`` whose installed
    version is outside its range, or None where every installed one is inside (a
    package not installed is not held against a row)."""
    for package, spec in versions:
        installed = installed_version(package)
        if installed is not None and Version(installed) not in SpecifierSet(spec):
            return package, spec, installed
    return None


__all__ = ["installed_version", "outside_versions"]
