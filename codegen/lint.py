"""`registry lint`: the schema pass, then the cross-row pass, then frozen typed rows.

Every error is collected (never only the first); a file that fails its schema is
left out of the cross-row pass so one mistake is not reported five times.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from causalab_mini.address import (
    Address,
    BlockStructure,
    Component,
    Condition,
    FamilyMatch,
    FirstIfTuple,
    Index,
    Interior,
    IOType,
    LayerKind,
    Select,
    StructuralEntry,
    StructureRule,
    Unavailable,
)

from .diagnostics import Diagnostic
from .loader import JsonPath, Loaded, load_file
from .model import FamilyDef, Registry

SCHEMA_VERSION = 1

# registry file -> schema file
FILES: dict[str, str] = {
    "places.yaml": "places.schema.json",
    "block_structures.yaml": "block_structures.schema.json",
    "structural.yaml": "structural.schema.json",
    "interiors.yaml": "interiors.schema.json",
    "components.yaml": "components.schema.json",
}
FAMILY_SCHEMA = "family.schema.json"

# a call site: the callable as written, "(", and optionally the start of the first
# argument where one forward calls the same callable twice
NEEDLE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\(([A-Za-z_][A-Za-z0-9_.]*)?$"
)
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
ALLOWED_PLACEHOLDERS = {"place"}
NEW_ROW_FIELDS = ("module", "io", "order", "doc")


def default_registry() -> Path:
    """The registry directory shipped with the package."""
    return Path(str(resources.files("causalab_mini.registry")))


@cache
def load_schema(name: str) -> dict[str, Any]:
    text = resources.files("causalab_mini.schema").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(load_schema(name))


# ---------------------------------------------------------------- schema pass


def _label(loaded: Loaded, path: JsonPath) -> str:
    """The row an error belongs to, for the ``[row]`` part of a diagnostic."""
    data = loaded.data
    if not isinstance(data, dict) or not path:
        return "-"
    head = path[0]
    if head in ("places", "interiors", "components") and len(path) > 1:
        items = data.get(head)
        if isinstance(items, list) and isinstance(path[1], int) and path[1] < len(items):
            item = items[path[1]]
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                return str(item["name"])
            return f"{head}[{path[1]}]"
    if head == "addresses" and len(path) > 1:
        family = data.get("family")
        return f"{family}:{path[1]}" if isinstance(family, str) else str(path[1])
    if head in ("structures", "layer_kinds") and len(path) > 1:
        return str(path[1])
    if head == "places" and len(path) > 1:  # structural.yaml
        return str(path[1])
    if head == "rules" and len(path) > 1:
        return f"rules[{path[1]}]"
    if head in ("family", "match", "rename", "doc"):
        family = data.get("family")
        return str(family) if isinstance(family, str) else "-"
    return "-"


def _leaf_errors(error: ValidationError) -> Iterator[ValidationError]:
    """Descend oneOf/anyOf to the sub-error that explains the failure best."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        # A oneOf over an object shape: prefer the branch whose required keys fit.
        best = best_match(error.context)
        if best is not None and best.validator not in ("oneOf", "anyOf"):
            yield best
            return
        if best is not None:
            yield from _leaf_errors(best)
            return
    yield error


def _schema_diagnostics(loaded: Loaded, display: str, schema: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for top in sorted(
        _validator(schema).iter_errors(loaded.data), key=lambda e: list(map(str, e.absolute_path))
    ):
        for error in _leaf_errors(top):
            out.extend(_one_schema_error(loaded, display, error))
    return out


def _one_schema_error(loaded: Loaded, display: str, error: ValidationError) -> list[Diagnostic]:
    path: JsonPath = tuple(error.absolute_path)
    row = _label(loaded, path)
    line, col = loaded.where(path)
    where = _where(path)
    kind = error.validator
    if kind == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, dict) else {}
        allowed = sorted(schema.get("properties", {}))
        out = []
        for key in error.instance:
            if key not in allowed:
                kline, kcol = loaded.where((*path, key), key=True)
                hint = (
                    f"allowed here: {', '.join(allowed)}" if allowed else "no keys are allowed here"
                )
                out.append(
                    Diagnostic(
                        display, kline, kcol, "S001", row, f"unknown key {key!r} in {where}; {hint}"
                    )
                )
        if out:
            return out
    if kind == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [
            Diagnostic(
                display,
                line,
                col,
                "S002",
                row,
                f"{where} lacks the required key {missing!r}; add it",
            )
        ]
    if kind == "type":
        expected = error.validator_value
        given = type(error.instance).__name__ if error.instance is not None else "null"
        return [
            Diagnostic(
                display,
                line,
                col,
                "S003",
                row,
                f"{where} must be {_types(expected)}, not {given} ({_short(error.instance)})",
            )
        ]
    if kind == "const" and path == ("schema_version",):
        return [
            Diagnostic(
                display,
                line,
                col,
                "S005",
                row,
                f"schema_version is {_short(error.instance)}; this tool reads version {SCHEMA_VERSION}. "
                f"Write schema_version: {SCHEMA_VERSION} and the fields of that version",
            )
        ]
    if kind == "propertyNames":
        return [
            Diagnostic(
                display,
                *loaded.where(path),
                "S004",
                row,
                f"a key in {where} is not a lower_snake_case name: {error.message}",
            )
        ]
    return [Diagnostic(display, line, col, "S004", row, f"{where}: {_explain(error)}")]


def _where(path: JsonPath) -> str:
    """The part of the path below the row the error belongs to."""
    if len(path) >= 2 and path[0] in (
        "places",
        "interiors",
        "components",
        "addresses",
        "structures",
        "layer_kinds",
        "rules",
    ):
        rest = path[2:]
        return ".".join(str(p) for p in rest) if rest else "the row"
    return ".".join(str(p) for p in path) or "the file"


def _types(expected: Any) -> str:
    names = {
        "string": "a string",
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "null": "null",
        "object": "a mapping",
        "array": "a list",
    }
    if isinstance(expected, list):
        return " or ".join(names.get(str(t), str(t)) for t in expected)
    return names.get(str(expected), str(expected))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _explain(error: ValidationError) -> str:
    kind, value = error.validator, error.validator_value
    if kind == "enum" and isinstance(value, list):
        return f"{_short(error.instance)} is not one of {', '.join(map(repr, value))}"
    if kind == "const":
        return f"{_short(error.instance)} must be {value!r}"
    if kind == "pattern":
        return f"{_short(error.instance)} does not have the form {value!r}"
    if kind in ("minLength", "minItems", "minProperties"):
        return f"{_short(error.instance)} is too short (at least {value})"
    if kind == "minimum":
        return f"{_short(error.instance)} is below the minimum {value}"
    if kind in ("oneOf", "anyOf"):
        return f"{_short(error.instance)} matches none of the allowed forms"
    return str(error.message)


# ---------------------------------------------------------------- typed rows


def _condition(raw: Any) -> Condition:
    if raw == "always":
        return Condition("always")
    if raw == "attention_probs_disabled":
        return Condition("attention_probs_disabled")
    if raw == "structure_unknown":
        return Condition("structure_unknown")
    if "layer_kind" in raw:
        return Condition("layer_kind", layer_kind=raw["layer_kind"])
    return Condition(
        "config",
        config=tuple(raw["config"].items()),
        config_not=tuple(raw.get("config_not", {}).items()),
    )


def _select(raw: Any) -> Select | None:
    if raw is None:
        return None
    if raw == "first_if_tuple":
        return FirstIfTuple()
    return Index(raw["index"])


def _fields(raw: dict[str, Any]) -> dict[str, Any]:
    """YAML row fields -> typed ``Address`` keyword arguments."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "io":
            out[key] = IOType(value)
        elif key == "source":
            out[key] = tuple(value)
        elif key == "select":
            out[key] = _select(value)
        elif key == "unavailable":
            out[key] = tuple(Unavailable(_condition(u["when"]), u["reason"].strip()) for u in value)
        elif key == "versions":
            out[key] = tuple(sorted(value.items()))
        elif key in ("doc", "read_only"):
            out[key] = value.strip() if isinstance(value, str) else value
        elif key == "add":
            continue  # says the row is new; not a field of the row
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------- cross-row pass


class _Pass:
    def __init__(self, registry: Registry) -> None:
        self.reg = registry
        self.out: list[Diagnostic] = []

    def err(
        self,
        loaded: Loaded,
        display: str,
        path: JsonPath,
        code: str,
        row: str,
        msg: str,
        *,
        key: bool = False,
    ) -> None:
        line, col = loaded.where(path, key=key)
        self.out.append(Diagnostic(display, line, col, code, row, msg))

    def needles(
        self, loaded: Loaded, display: str, path: JsonPath, row: str, needles: list[str]
    ) -> None:
        for i, needle in enumerate(needles):
            if not NEEDLE.match(needle):
                hint = re.sub(r"[^A-Za-z0-9_.]", "", needle.split("(")[0]) or "callable"
                self.err(
                    loaded,
                    display,
                    (*path, i),
                    "X004",
                    row,
                    f"needle {needle!r} is not call-shaped: write the callable as it is "
                    f"called in the source, ending in '(' (e.g. {hint + '('!r}), so an "
                    "assignment that shares the name is not matched",
                )

    def versions(
        self, loaded: Loaded, display: str, path: JsonPath, row: str, raw: dict[str, str]
    ) -> None:
        for package, spec in raw.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                self.err(
                    loaded,
                    display,
                    (*path, package),
                    "X006",
                    row,
                    f"version range {spec!r} for {package} does not parse; write a PEP 440 "
                    "range such as '>=5.0,<6'",
                )

    def reasons(self, loaded: Loaded, display: str, path: JsonPath, row: str, reason: str) -> None:
        for found in PLACEHOLDER.findall(reason):
            if found not in ALLOWED_PLACEHOLDERS:
                self.err(
                    loaded,
                    display,
                    path,
                    "X010",
                    row,
                    f"the reason uses {{{found}}}; only {{place}} (the row's name) is "
                    "filled in. Write the text itself instead",
                )

    def unavailable(
        self, loaded: Loaded, display: str, path: JsonPath, row: str, raw: list[dict[str, Any]]
    ) -> None:
        for i, item in enumerate(raw):
            self.reasons(loaded, display, (*path, i, "reason"), row, item["reason"])
            when = item["when"]
            if isinstance(when, dict) and "layer_kind" in when:
                kind = when["layer_kind"]
                if self.reg.layer_kinds and kind not in self.reg.layer_kinds:
                    self.err(
                        loaded,
                        display,
                        (*path, i, "when", "layer_kind"),
                        "X007",
                        row,
                        f"layer kind {kind!r} is not defined; define it under layer_kinds "
                        f"in block_structures.yaml or use one of "
                        f"{', '.join(sorted(self.reg.layer_kinds))}",
                    )

    def row_fields(
        self, loaded: Loaded, display: str, path: JsonPath, row: str, raw: dict[str, Any]
    ) -> None:
        if "source" in raw:
            self.needles(loaded, display, (*path, "source"), row, raw["source"])
        if "versions" in raw:
            self.versions(loaded, display, (*path, "versions"), row, raw["versions"])
        if "unavailable" in raw:
            self.unavailable(loaded, display, (*path, "unavailable"), row, raw["unavailable"])


def lint(root: Path | None = None) -> tuple[Registry, list[Diagnostic]]:
    """Lint the registry at ``root``; return the typed rows and every diagnostic."""
    root = Path(root) if root is not None else default_registry()
    registry = Registry(root=root)
    diags: list[Diagnostic] = []
    if not root.is_dir():
        return registry, [
            Diagnostic(
                str(root),
                1,
                1,
                "F001",
                "-",
                "the registry directory does not exist; pass --registry DIR "
                "naming a directory that holds places.yaml",
            )
        ]

    def disp(rel: str) -> str:
        return str(root / rel)

    loaded: dict[str, Loaded] = {}
    for name, schema in FILES.items():
        path = root / name
        if not path.is_file():
            diags.append(
                Diagnostic(
                    disp(name),
                    1,
                    1,
                    "F001",
                    "-",
                    f"{name} is missing from the registry; every registry holds "
                    f"{', '.join(FILES)} (copy it from the package's registry/)",
                )
            )
            continue
        data, errs = load_file(path, disp(name))
        registry.sources[name] = path.read_bytes()
        if errs:
            diags.extend(errs)
            continue
        errs = _schema_diagnostics(data, disp(name), schema)
        diags.extend(errs)
        if not errs:
            loaded[name] = data
    for path in sorted(root.glob("*.yaml")) + sorted(root.glob("*.yml")):
        if path.name not in FILES:
            diags.append(
                Diagnostic(
                    disp(path.name),
                    1,
                    1,
                    "F002",
                    "-",
                    f"{path.name} is not a registry file; the registry holds "
                    f"{', '.join(FILES)} and families/*.yaml. Move or rename it",
                )
            )
    fam_loaded: list[tuple[str, Loaded]] = []
    fam_dir = root / "families"
    if fam_dir.is_dir():
        for path in sorted(fam_dir.iterdir()):
            rel = f"families/{path.name}"
            if path.suffix == ".yml":
                diags.append(
                    Diagnostic(disp(rel), 1, 1, "F002", "-", "family files end in .yaml; rename it")
                )
                continue
            if path.suffix != ".yaml":
                continue
            data, errs = load_file(path, disp(rel))
            registry.sources[rel] = path.read_bytes()
            if errs:
                diags.extend(errs)
                continue
            errs = _schema_diagnostics(data, disp(rel), FAMILY_SCHEMA)
            diags.extend(errs)
            if not errs:
                fam_loaded.append((rel, data))

    check = _Pass(registry)
    _cross(registry, check, loaded, fam_loaded, disp)
    diags.extend(check.out)
    return registry, sorted(set(diags), key=lambda d: (d.path, d.line, d.col, d.code, d.message))


def _cross(
    reg: Registry,
    check: _Pass,
    loaded: dict[str, Loaded],
    fam_loaded: list[tuple[str, Loaded]],
    disp: Any,
) -> None:
    # -- block structures first: other files refer to them
    bs = loaded.get("block_structures.yaml")
    if bs is not None:
        d = disp("block_structures.yaml")
        for name, raw in bs.data["structures"].items():
            reg.structures[name] = BlockStructure(
                name,
                raw["doc"].strip(),
                tuple(raw["identities"]),
                tuple(raw.get("requires_rows", ())),
            )
        for name, raw in bs.data["layer_kinds"].items():
            reg.layer_kinds[name] = LayerKind(
                name,
                raw["doc"].strip(),
                tuple(raw.get("present", ())),
                tuple(raw.get("absent", ())),
            )
        for i, raw in enumerate(bs.data["rules"]):
            if raw["structure"] not in reg.structures:
                check.err(
                    bs,
                    d,
                    ("rules", i, "structure"),
                    "X007",
                    f"rules[{i}]",
                    f"structure {raw['structure']!r} is not defined; use one of "
                    f"{', '.join(reg.structures)} or define it under structures",
                )
                continue
            reg.rules.append(
                StructureRule(
                    raw["structure"],
                    FamilyMatch(
                        tuple(raw.get("model_types", ())),
                        tuple(raw.get("classes", ())),
                        tuple(raw.get("config", {}).items()),
                    ),
                )
            )

    # -- default rows
    pl = loaded.get("places.yaml")
    rows_raw: dict[str, dict[str, Any]] = {}
    if pl is not None:
        d = disp("places.yaml")
        last: int | None = None
        orders: dict[tuple[bool, int], str] = {}
        for i, raw in enumerate(pl.data["places"]):
            name = raw["name"]
            if name in rows_raw:
                check.err(
                    pl,
                    d,
                    ("places", i, "name"),
                    "X001",
                    name,
                    f"a row named {name!r} is already defined above; rename one",
                )
                continue
            rows_raw[name] = raw
            check.row_fields(pl, d, ("places", i), name, raw)
            per_layer = raw.get("per_layer", True)
            scope = (per_layer, raw["order"])
            if scope in orders:
                check.err(
                    pl,
                    d,
                    ("places", i, "order"),
                    "X002",
                    name,
                    f"order {raw['order']} is already taken by {orders[scope]!r} "
                    f"({'inside a layer' if per_layer else 'among whole-model places'}); "
                    "give each place its own order",
                )
            orders[scope] = name
            if last is not None and raw["order"] <= last:
                check.err(
                    pl,
                    d,
                    ("places", i, "order"),
                    "X011",
                    name,
                    f"order {raw['order']} comes after {last} in the file; rows are "
                    "listed in forward order, so move the row or fix its order",
                )
            last = raw["order"]
            if raw["io"] == "module" and (raw.get("source") or raw.get("select")):
                check.err(
                    pl,
                    d,
                    ("places", i, "io"),
                    "X005",
                    name,
                    "a module row (io: module) names the module itself; drop source and "
                    "select, or say input or output",
                )
            reg.places[name] = Address(**_fields({k: v for k, v in raw.items() if k != "name"}))

    # -- structural candidates
    st = loaded.get("structural.yaml")
    if st is not None and pl is not None:
        d = disp("structural.yaml")
        for place, per_structure in st.data["places"].items():
            if place not in reg.places:
                check.err(
                    st,
                    d,
                    ("places", place),
                    "X007",
                    place,
                    f"{place!r} is not a row of places.yaml; structural entries belong to "
                    'rows whose module is "{name}"',
                    key=True,
                )
                continue
            if not reg.places[place].is_structural:
                check.err(
                    st,
                    d,
                    ("places", place),
                    "X012",
                    place,
                    f"row {place!r} names a fixed module ({reg.places[place].module!r}); "
                    'write module: "{name}" in places.yaml or drop this entry',
                    key=True,
                )
                continue
            entries: dict[str, StructuralEntry] = {}
            for structure, entry in per_structure.items():
                if reg.structures and structure not in reg.structures:
                    check.err(
                        st,
                        d,
                        ("places", place, structure),
                        "X007",
                        place,
                        f"structure {structure!r} is not defined in block_structures.yaml; "
                        f"use one of {', '.join(reg.structures)}",
                        key=True,
                    )
                    continue
                if "reason" in entry:
                    check.reasons(
                        st, d, ("places", place, structure, "reason"), place, entry["reason"]
                    )
                    entries[structure] = StructuralEntry(reason=" ".join(entry["reason"].split()))
                else:
                    entries[structure] = StructuralEntry(candidates=tuple(entry["candidates"]))
            for structure in reg.structures:
                if structure not in per_structure:
                    check.err(
                        st,
                        d,
                        ("places", place),
                        "X003",
                        place,
                        f"structure {structure!r} has neither candidates nor a reason for "
                        f"{place}; add '{structure}: {{candidates: [...]}}' or "
                        f"'{structure}: {{reason: ...}}'",
                        key=True,
                    )
            reg.structural[place] = entries
        for place, row in reg.places.items():
            if row.is_structural and place not in st.data["places"]:
                i = list(rows_raw).index(place)
                check.err(
                    pl,
                    disp("places.yaml"),
                    ("places", i, "module"),
                    "X012",
                    place,
                    f"{place} is resolved from the module tree but structural.yaml has no "
                    "entry for it; add its candidates per structure there",
                )

    # -- structures' required rows exist
    if bs is not None and pl is not None:
        d = disp("block_structures.yaml")
        for name, raw in bs.data["structures"].items():
            for j, row in enumerate(raw.get("requires_rows", ())):
                if row not in reg.places:
                    check.err(
                        bs,
                        d,
                        ("structures", name, "requires_rows", j),
                        "X007",
                        name,
                        f"requires_rows names {row!r}, which is not a row of places.yaml",
                    )

    # -- interiors
    it = loaded.get("interiors.yaml")
    if it is not None:
        d = disp("interiors.yaml")
        taken = {
            raw["order"]: raw["name"] for raw in rows_raw.values() if raw.get("per_layer", True)
        }
        for i, raw in enumerate(it.data["interiors"]):
            name = raw["name"]
            if name in reg.interiors or name in rows_raw:
                check.err(
                    it,
                    d,
                    ("interiors", i, "name"),
                    "X001",
                    name,
                    f"{name!r} is already a row or an interior; rename one",
                )
                continue
            check.needles(it, d, ("interiors", i, "needles"), name, raw["needles"])
            if "versions" in raw:
                check.versions(it, d, ("interiors", i, "versions"), name, raw["versions"])
            if raw["order"] in taken:
                check.err(
                    it,
                    d,
                    ("interiors", i, "order"),
                    "X002",
                    name,
                    f"order {raw['order']} is already taken by {taken[raw['order']]!r} inside a "
                    "layer; interiors go in the gaps the rows leave",
                )
            taken[raw["order"]] = name
            within = rows_raw.get(raw["within"])
            if pl is not None and (within is None or within["io"] != "module"):
                check.err(
                    it,
                    d,
                    ("interiors", i, "within"),
                    "X007",
                    name,
                    f"within names {raw['within']!r}, which is not a module row of places.yaml "
                    "(a row with io: module, such as attentions)",
                )
            take = raw["take"]
            reg.interiors[name] = Interior(
                name=name,
                within=raw["within"],
                needles=tuple(raw["needles"]),
                order=raw["order"],
                arg=take.get("arg"),
                returns=take.get("return"),
                eager_only=raw.get("eager_only", False),
                versions=tuple(sorted(raw.get("versions", {}).items())),
                doc=raw["doc"].strip(),
            )

    # -- components
    co = loaded.get("components.yaml")
    if co is not None:
        d = disp("components.yaml")
        for i, raw in enumerate(co.data["components"]):
            name = raw["name"]
            if name in reg.components:
                check.err(
                    co,
                    d,
                    ("components", i, "name"),
                    "X001",
                    name,
                    f"component {name!r} is already defined above; rename one",
                )
                continue
            if "row" in raw:
                kind, target = "boundary", raw["row"]
                if pl is not None and target not in reg.places:
                    check.err(
                        co,
                        d,
                        ("components", i, "row"),
                        "X007",
                        name,
                        f"row {target!r} is not in places.yaml; name one of its rows",
                    )
                    continue
                row = reg.places.get(target)
                per_layer = row.per_layer if row else raw["per_layer"]
                rank = row.order if row else 0
            else:
                kind, target = "interior", raw["interior"]
                if it is not None and target not in reg.interiors:
                    check.err(
                        co,
                        d,
                        ("components", i, "interior"),
                        "X007",
                        name,
                        f"interior {target!r} is not in interiors.yaml; name one of its "
                        f"interiors ({', '.join(reg.interiors)})",
                    )
                    continue
                interior = reg.interiors.get(target)
                per_layer, rank = True, interior.order if interior else 0
                row = None
            if raw["per_layer"] != per_layer:
                check.err(
                    co,
                    d,
                    ("components", i, "per_layer"),
                    "X013",
                    name,
                    f"per_layer is {raw['per_layer']} but {target} is "
                    f"{'per layer' if per_layer else 'whole-model'}; the component table "
                    "is what to fix",
                )
            if (raw["per_head"] == "none") != ("layout" not in raw):
                check.err(
                    co,
                    d,
                    ("components", i, "per_head"),
                    "X013",
                    name,
                    "a per-head component says how its tensor is held (layout: bhsd, bshd, bsf "
                    "or bhsk) and a component that is not per head has no layout",
                )
            if (
                kind == "boundary"
                and row is not None
                and (row.read_only is not None or row.io is IOType.MODULE)
                and raw["writable"]
            ):
                check.err(
                    co,
                    d,
                    ("components", i, "writable"),
                    "X013",
                    name,
                    f"writable is true but {target} refuses writes "
                    f"({row.read_only or 'it is a module, not a tensor'}); write "
                    "'writable: false' with a why_read_only in the component's words",
                )
            if not raw["writable"] and "why_read_only" not in raw:
                check.err(
                    co,
                    d,
                    ("components", i, "writable"),
                    "X013",
                    name,
                    "a read-only component says why: add why_read_only with the reason "
                    "and what to write instead",
                )
            reg.components[name] = Component(
                name=name,
                kind=kind,
                target=target,
                per_layer=raw["per_layer"],
                default_rank=rank,
                sequence_axis=raw["sequence_axis"],
                per_head=raw["per_head"],
                layout=raw.get("layout"),
                keys_axis=raw.get("keys_axis"),
                width=raw["width"],
                writable=raw["writable"],
                why_read_only=raw.get("why_read_only"),
                doc=raw.get("doc", "").strip(),
            )

    # -- families
    seen: dict[str, str] = {}
    for rel, fam in fam_loaded:
        d = disp(rel)
        data = fam.data
        name = data["family"]
        stem = Path(rel).stem
        if name != stem:
            check.err(
                fam,
                d,
                ("family",),
                "X009",
                name,
                f"family {name!r} is in {Path(rel).name}; name the file {name}.yaml or "
                f"write family: {stem}",
            )
        if name in seen:
            check.err(fam, d, ("family",), "X001", name, f"family {name!r} is also {seen[name]}")
            continue
        seen[name] = rel
        overrides: list[tuple[str, tuple[tuple[str, Any], ...]]] = []
        new_rows: list[tuple[str, Address]] = []
        if "interiors_unavailable" in data:
            check.reasons(fam, d, ("interiors_unavailable",), name, data["interiors_unavailable"])
        if "structure_unknown_reason" in data:
            check.reasons(
                fam, d, ("structure_unknown_reason",), name, data["structure_unknown_reason"]
            )
        for row, raw in data.get("addresses", {}).items():
            path: JsonPath = ("addresses", row)
            check.row_fields(fam, d, path, f"{name}:{row}", raw)
            if pl is not None and (row in reg.places) == bool(raw.get("add")):
                if raw.get("add"):
                    message = (
                        f"{row!r} is a default place, so this row replaces it field by field; "
                        "drop 'add: true' (or give the new place a name of its own)"
                    )
                else:
                    close = difflib.get_close_matches(row, reg.places, n=1, cutoff=0.6)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    message = (
                        f"{row!r} is not a default place: {hint}A row here replaces a default "
                        "place of the same name; to add a place of the family's own, say "
                        "'add: true' and give module, io, order and doc"
                    )
                check.err(fam, d, path, "X017", f"{name}:{row}", message, key=True)
                continue
            if pl is not None and row not in reg.places:
                missing = [f for f in NEW_ROW_FIELDS if f not in raw]
                if missing:
                    known = ", ".join(reg.places)
                    check.err(
                        fam,
                        d,
                        path,
                        "X005",
                        f"{name}:{row}",
                        f"'add: true' makes {row!r} a new place, which must give "
                        f"{', '.join(missing)}; or replace one of: {known}",
                        key=True,
                    )
                    continue
                new_rows.append((row, Address(**_fields(raw))))
            else:
                overrides.append((row, tuple(_fields(raw).items())))
        rename = data.get("rename", {})
        if rename.get("ignore_ln_final"):
            ln_final = data.get("addresses", {}).get("ln_final_output", {})
            if not any(u.get("when") == "always" for u in ln_final.get("unavailable", ())):
                check.err(
                    fam,
                    d,
                    ("rename", "ignore_ln_final"),
                    "X015",
                    name,
                    "ignore_ln_final says the model has no final norm, so ln_final_output "
                    "must be refused: give it 'unavailable: [{when: always, reason: ...}]' "
                    "under addresses, naming what to read instead",
                )
        match = data["match"]
        reg.families.append(
            FamilyDef(
                name=name,
                file=rel,
                doc=data["doc"].strip(),
                match=FamilyMatch(
                    tuple(match.get("model_types", ())),
                    tuple(match.get("classes", ())),
                    tuple(match.get("config", {}).items()),
                ),
                rename=tuple(
                    (k, tuple(v) if isinstance(v, list) else v)
                    for k, v in data.get("rename", {}).items()
                ),
                overrides=tuple(overrides),
                new_rows=tuple(new_rows),
                interiors_unavailable=(
                    " ".join(data["interiors_unavailable"].split())
                    if "interiors_unavailable" in data
                    else None
                ),
                structure_unknown_reason=(
                    " ".join(data["structure_unknown_reason"].split())
                    if "structure_unknown_reason" in data
                    else None
                ),
            )
        )
        # new rows' orders must not collide with the defaults'
        for row, address in new_rows:
            for other, existing in reg.places.items():
                if existing.per_layer == address.per_layer and existing.order == address.order:
                    check.err(
                        fam,
                        d,
                        ("addresses", row, "order"),
                        "X002",
                        f"{name}:{row}",
                        f"order {address.order} is already taken by {other!r}; pick a free order",
                    )

    # -- structures that need family rows
    if bs is not None:
        d = disp("block_structures.yaml")
        for i, raw in enumerate(bs.data["rules"]):
            structure = reg.structures.get(raw["structure"])
            if structure is None or not structure.requires_rows:
                continue
            types = set(raw.get("model_types", ()))
            classes = set(raw.get("classes", ()))
            replaced: set[str] = set()
            for family in reg.families:
                if types & set(family.match.model_types) or classes & set(family.match.classes):
                    replaced |= {row for row, _ in family.overrides}
            missing = [row for row in structure.requires_rows if row not in replaced]
            if missing:
                who = ", ".join(sorted(types | classes))
                check.err(
                    bs,
                    d,
                    ("rules", i),
                    "X008",
                    f"rules[{i}]",
                    f"{who}: the block is {structure.name}, where the default "
                    f"{' and '.join(missing)} name{'s' if len(missing) == 1 else ''} a "
                    f"different tensor; a family file matching {who} must replace "
                    f"{', '.join(missing)} (see families/gemma2.yaml)",
                )

    # -- every family has a block structure
    if bs is not None:
        ruled_types = {t for raw in bs.data["rules"] for t in raw.get("model_types", ())}
        ruled_classes = {c for raw in bs.data["rules"] for c in raw.get("classes", ())}
        for rel, fam in fam_loaded:
            match = fam.data["match"]
            types = set(match.get("model_types", ()))
            classes = set(match.get("classes", ()))
            name = fam.data["family"]
            ruled = types & ruled_types or classes & ruled_classes
            if ruled and "structure_unknown_reason" in fam.data:
                check.err(
                    fam,
                    disp(rel),
                    ("structure_unknown_reason",),
                    "X016",
                    name,
                    f"structure_unknown_reason says no block structure applies, and a rule in "
                    f"block_structures.yaml gives {', '.join(sorted(ruled))} one; drop the "
                    "reason or the rule",
                )
            if not types or ruled or "structure_unknown_reason" in fam.data:
                continue
            check.err(
                fam,
                disp(rel),
                ("match", "model_types"),
                "X014",
                name,
                f"no rule in block_structures.yaml gives {', '.join(sorted(types))} a block "
                "structure, so every structural place is refused on it; add a rule "
                "(`registry new-family <model_type>` verifies which structure holds)",
            )
