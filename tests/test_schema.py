"""The schemas: one source for the shared definitions (schema/common.schema.json),
resolved offline, and the Address row fields the same in the schema and the type."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from causalab_mini.address import Address
from causalab_mini.codegen.lint import (
    COMMON_SCHEMA,
    FAMILY_SCHEMA,
    FILES,
    OPTIONAL_FILES,
    _validator,
    load_schema,
)

from .conftest import REPO

SCHEMA_DIR = REPO / "schema"
FILE_SCHEMAS = [*FILES.values(), *OPTIONAL_FILES.values(), FAMILY_SCHEMA]

# keys of a YAML row that are not Address fields, and why
ROW_KEYS_NOT_FIELDS = {
    "name": "the row's name: the key of model.internals, not a field of the place",
    "add": "a family row's flag that the row is a new place, not a replacement",
}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_address_fields_and_the_row_schema_agree() -> None:
    common = load_schema(COMMON_SCHEMA)["$defs"]
    in_schema = set(common["address_fields"]["properties"])
    in_type = {f.name for f in dataclasses.fields(Address)}
    assert in_schema == in_type
    # the row schemas add exactly the documented keys
    place = common["place"]
    assert set(place["properties"]) == {"name"} and place["$ref"] == "#/$defs/address_fields"
    family_row = load_schema(FAMILY_SCHEMA)["properties"]["addresses"]["additionalProperties"]
    assert set(family_row["properties"]) == {"add"}
    assert family_row["$ref"] == "common.schema.json#/$defs/address_fields"
    assert {"name", "add"} == set(ROW_KEYS_NOT_FIELDS)
    for row in (place, family_row):
        assert row["unevaluatedProperties"] is False  # unknown keys are still refused


def test_address_fields_the_schema_lacks_fail_the_agreement() -> None:
    # the check above can fail: a field the dataclass gains and the schema lacks
    @dataclasses.dataclass(frozen=True)
    class Wider(Address):
        gate: str | None = None

    common = load_schema(COMMON_SCHEMA)["$defs"]
    assert set(common["address_fields"]["properties"]) != {
        f.name for f in dataclasses.fields(Wider)
    }


@pytest.mark.parametrize("name", FILE_SCHEMAS)
def test_file_schemas_share_definitions_through_the_common_schema(name: str) -> None:
    schema = json.loads((SCHEMA_DIR / name).read_text())
    assert "$defs" not in schema, "shared definitions live in common.schema.json"
    # no $id: a reference is relative to the file, as an editor resolves it
    assert "$id" not in schema
    refs = _refs(schema)
    assert refs and all(r.startswith(f"{COMMON_SCHEMA}#/$defs/") for r in refs), refs
    common = load_schema(COMMON_SCHEMA)["$defs"]
    for ref in refs:
        assert ref.rsplit("/", 1)[1] in common, ref


def test_common_refers_only_to_itself() -> None:
    common = json.loads((SCHEMA_DIR / COMMON_SCHEMA).read_text())
    for ref in _refs(common):
        assert ref.startswith("#/$defs/") and ref.rsplit("/", 1)[1] in common["$defs"], ref


def test_references_resolve_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a schema reference went to the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    _validator.cache_clear()
    for name in FILE_SCHEMAS:
        # a document that reaches every $ref of the places and family rows
        errors = list(_validator(name).iter_errors({"schema_version": 1}))
        assert all(e.validator in ("required",) for e in errors), name
    row = {"module": "mlp", "io": "output", "select": {"index": 0}, "order": 1}
    row |= {"unavailable": [{"when": {"config": {"a": 1}}, "reason": "{place} is not here"}]}
    row |= {"versions": {"transformers": ">=5"}, "source": ["f("], "bogus": 1}
    family = {"schema_version": 1, "family": "x", "doc": "d", "match": {"model_types": ["x"]}}
    errors = list(_validator(FAMILY_SCHEMA).iter_errors({**family, "addresses": {"mlps": row}}))
    assert [e.validator for e in errors] == ["unevaluatedProperties"]


def test_yaml_files_name_their_schema_for_editors() -> None:
    registry = REPO / "registry"
    for path in [*registry.glob("*.yaml"), *registry.glob("families/*.yaml")]:
        first = path.read_text().splitlines()[0]
        assert first.startswith("# yaml-language-server: $schema="), path
        target = (path.parent / first.split("=", 1)[1]).resolve()
        assert target.is_file() and target.parent == SCHEMA_DIR.resolve(), path
        assert Path(target).name in (*FILE_SCHEMAS,), path


def test_an_unknown_key_in_a_family_row_names_the_fields_and_add(registry_copy: Path) -> None:
    from causalab_mini.codegen.lint import lint

    from .conftest import edit

    edit(
        registry_copy / "families/olmo2.yaml",
        "  attentions_output:\n",
        "  attentions_output:\n    gate: 1\n",
    )
    # (the file fails its schema, so its rows are missing from the cross-row pass: X008)
    (diag,) = [d for d in lint(registry_copy)[1] if d.code == "S001"]
    assert (diag.code, diag.row, diag.line, diag.col) == ("S001", "olmo2:attentions_output", 21, 5)
    assert diag.message == (
        "unknown key 'gate' in the row; allowed here: add, before_layers, doc, flat_tokens, heads_through, io, layer_list, "
        "leading_positions, merged_heads, module, order, per_layer, read_only, replaces_accessor, "
        "routing, scale, select, seq_first, snapshot, source, spelled, streams, trailing_streams, "
        "unavailable, versions, write"
    )
