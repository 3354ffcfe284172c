"""Thousands of generated registry documents: every one gives diagnostics, none a traceback."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from causalab_mini.codegen.diagnostics import CODES, Diagnostic
from causalab_mini.codegen.lint import (
    FAMILY_SCHEMA,
    FILES,
    _schema_diagnostics,
    default_registry,
    lint,
)
from causalab_mini.codegen.loader import load_text

SCHEMAS = [*FILES.values(), FAMILY_SCHEMA]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "input",
            "output",
            "module",
            "first_if_tuple",
            "{name}",
            "attention_interface(",
            "pre_norm",
            "always",
            "attention_probs_disabled",
            ">=5,<6",
            "q",
            "kv",
            "none",
        ]
    ),
)
keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "name",
            "doc",
            "module",
            "io",
            "order",
            "source",
            "select",
            "places",
            "family",
            "match",
            "addresses",
            "schema_version",
            "structures",
            "rules",
            "candidates",
            "reason",
            "unavailable",
            "when",
            "interiors",
            "components",
            "needles",
            "take",
        ]
    ),
)
documents = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=6)
    ),
    max_leaves=30,
)


def _check(diags: list[Diagnostic]) -> None:
    for d in diags:
        assert d.code in CODES
        assert d.line >= 1 and d.col >= 1
        assert str(d).count(":") >= 3


@settings(max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.text(max_size=300))
def test_arbitrary_text(raw: str) -> None:
    loaded, diags = load_text(raw, "fuzz.yaml")
    _check(diags)
    if not diags:
        for schema in SCHEMAS:
            _check(_schema_diagnostics(loaded, "fuzz.yaml", schema))


def _dump(data: Any) -> str:
    import io

    yaml = YAML(typ="safe", pure=True)
    buffer = io.StringIO()
    yaml.dump(data, buffer)
    return buffer.getvalue()


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=documents, schema=st.sampled_from(SCHEMAS))
def test_arbitrary_structures_against_every_schema(data: Any, schema: str) -> None:
    loaded, diags = load_text(_dump(data), "fuzz.yaml")
    _check(diags)
    if not diags:
        _check(_schema_diagnostics(loaded, "fuzz.yaml", schema))


# Whole registries: real rows with one value swapped for a generated one, through
# the full lint (schema and cross-row passes).
_yaml = YAML(typ="safe", pure=True)
_BASE = {p.name: _yaml.load(p.read_text()) for p in default_registry().glob("*.yaml")}
_BASE_FAMILIES = {
    p.name: _yaml.load(p.read_text()) for p in (default_registry() / "families").glob("*.yaml")
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _set(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    node[path[0]] = _set(node[path[0]], path[1:], value)
    return node


@functools.cache
def _base_texts() -> dict[str, str]:
    """Each real registry file as ``_dump`` writes it, dumped once: the files an example
    leaves alone are written as these bytes (dumping all of them again took 0.7 s of
    each example's 0.9 s)."""
    files = {**_BASE, **{f"families/{k}": v for k, v in _BASE_FAMILIES.items()}}
    return {name: _dump(content) for name, content in files.items()}


@pytest.mark.fuzz  # a minute or two: CI runs it after the README's command
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_registries(data: st.DataObject, tmp_path_factory: Any) -> None:
    import copy

    root: Path = tmp_path_factory.mktemp("reg")
    files = {**_BASE, **{f"families/{k}": v for k, v in _BASE_FAMILIES.items()}}
    name = data.draw(st.sampled_from(sorted(files)))
    doc = copy.deepcopy(files[name])
    path = data.draw(st.sampled_from(_paths(doc)))
    doc = _set(doc, path, data.draw(documents))
    (root / "families").mkdir()
    for other, text in _base_texts().items():
        (root / other).write_text(_dump(doc) if other == name else text)
    _, diags = lint(root)
    _check(diags)
    shutil.rmtree(root)
