"""The typed registry: what `registry lint` makes of the YAML rows, and what `registry
gen`, the docs and the tools read. The one place rows become types (like torchgen's
``model.py``); it imports only the row types of ``causalab_mini.address``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    LeadingPositions,
    Lens,
    LensStep,
    Operand,
    Select,
    Streams,
    StructuralEntry,
    StructureRule,
    TrailingStreams,
    Unavailable,
)

__all__ = [
    "TOKENIZER_KINDS",
    "FamilyDef",
    "Registry",
    "TinyTables",
    "address",
    "address_fields",
    "block_structure",
    "component",
    "condition",
    "frozen",
    "interior",
    "layer_kind",
    "lens",
    "match",
    "operand",
    "rank_key",
    "select",
    "structural_entry",
    "structure_rule",
    "tiny",
]


@dataclass(frozen=True)
class FamilyDef:
    name: str
    file: str
    doc: str
    match: FamilyMatch
    rename: tuple[tuple[str, Any], ...]
    # row -> typed field values that differ from the default row (replace()), or a
    # whole new row where the name is not a default row
    overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]
    new_rows: tuple[tuple[str, Address], ...]
    # why the four interiors do not exist on this family, where they do not
    interiors_unavailable: str | None = None
    # interior -> the fields that replace the default interior's (its own forward)
    interiors: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    # operand name -> where this family's attention keeps it
    operands: tuple[tuple[str, Operand], ...] = ()
    # why no block structure applies to this family (the reason of every structural
    # place), where none does
    structure_unknown_reason: str | None = None
    # medium (image) -> the config attributes that may hold its placeholder token id
    media_tokens: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # what the model applies to the last block's output to make its logits, where it
    # is not the default lens (places.yaml)
    lens: Lens | None = None


@dataclass(frozen=True)
class TinyTables:
    """registry/tiny.yaml: how `tiny:<model_type>` shrinks a config. Values are plain
    YAML data made immutable (mappings stay mappings, lists become tuples)."""

    sizes: tuple[tuple[str, int], ...] = ()
    generic: tuple[tuple[str, Any], ...] = ()
    keep_off: tuple[str, ...] = ()
    overrides: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    not_buildable: tuple[tuple[str, str], ...] = ()
    build_from: tuple[tuple[str, str], ...] = ()
    # model type -> (the class its real checkpoints are saved by, the submodule of it
    # the loading class's model is, why)
    saved_by: tuple[tuple[str, tuple[str, str, str]], ...] = ()
    builds_with: tuple[tuple[str, tuple[str, str]], ...] = ()
    # model type -> file name -> what torch.save writes there (a file from_pretrained reads)
    checkpoint_files: tuple[tuple[str, Any], ...] = ()
    # group -> (its transformers auto mapping, its auto class, doc), in order
    groups: tuple[tuple[str, tuple[str, str, str]], ...] = ()
    # the groups that also take model types an earlier group takes with another class
    shared_groups: tuple[str, ...] = ()
    side_inputs: tuple[tuple[str, Any], ...] = ()
    vision_extra: tuple[tuple[str, Any], ...] = ()
    # the kind of special tokens a tiny tokenizer adds where tokenizers lists no row
    tokenizer_default: str = "bos"
    # model type -> (the kind its tokenizer adds, the name of its chat template or None)
    tokenizers: tuple[tuple[str, tuple[str, str | None]], ...] = ()
    # chat template name -> its Jinja text
    chat_templates: tuple[tuple[str, str], ...] = ()
    # the moved build: rules, exclude, norms (plain data, frozen)
    moved: Any = None


# What each kind of tiny tokenizer adds around a single sequence (registry/tiny.yaml
# tokenizer_default and tokenizers name one of these): a BOS token before it, an EOS
# token after it. The builder (causalab_mini.tools.tiny) reads the emitted table.
TOKENIZER_KINDS: dict[str, dict[str, bool]] = {
    "none": {"bos": False, "eos": False},
    "bos": {"bos": True, "eos": False},
    "eos": {"bos": False, "eos": True},
    "bos_eos": {"bos": True, "eos": True},
}


def frozen(value: Any) -> Any:
    """YAML data made immutable for emitting: a list becomes a tuple, a mapping a
    dict of frozen values (emitted as a read-only mapping)."""
    if isinstance(value, list):
        return tuple(frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: frozen(v) for k, v in value.items()}
    return value


def tiny(raw: dict[str, Any]) -> TinyTables:
    def table(items: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        return tuple((k, frozen(v)) for k, v in items.items())

    return TinyTables(
        sizes=tuple(raw["sizes"].items()),
        generic=table(raw["generic"]),
        keep_off=tuple(raw["keep_off"]),
        overrides=tuple((t, table(o)) for t, o in raw["overrides"].items()),
        not_buildable=tuple((t, " ".join(r.split())) for t, r in raw["not_buildable"].items()),
        build_from=tuple(raw.get("build_from", {}).items()),
        saved_by=tuple(
            (t, (v["class"], v["module"], " ".join(v["why"].split())))
            for t, v in raw.get("saved_by", {}).items()
        ),
        builds_with=tuple(
            (t, (v["transformers"], " ".join(v["why"].split())))
            for t, v in raw.get("builds_with", {}).items()
        ),
        side_inputs=table(raw.get("side_inputs", {})),
        checkpoint_files=tuple(
            (t, {name: frozen(file["torch_save"]) for name, file in files.items()})
            for t, files in raw.get("checkpoint_files", {}).items()
        ),
        groups=tuple(
            (g, (v["mapping"], v["auto_class"], " ".join(v["doc"].split())))
            for g, v in raw.get("groups", {}).items()
        ),
        shared_groups=tuple(
            g for g, v in raw.get("groups", {}).items() if v.get("shares_model_types")
        ),
        vision_extra=table(raw["vision_extra"]),
        tokenizer_default=raw.get("tokenizer_default", {}).get("adds", "bos"),
        tokenizers=tuple(
            (t, (row["adds"], row.get("chat_template")))
            for t, row in raw.get("tokenizers", {}).items()
        ),
        chat_templates=tuple(raw.get("chat_templates", {}).items()),
        moved=frozen(_moved_raw(raw.get("moved"))),
    )


def _moved_raw(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The moved build's table with each rule's reason on one line (nothing: empty)."""
    if not raw:
        return {}
    rules = [{**r, "why": " ".join(str(r["why"]).split())} for r in raw["rules"]]
    return {**raw, "rules": rules}


@dataclass
class Registry:
    root: Path
    sources: dict[str, bytes] = field(default_factory=dict)
    places: dict[str, Address] = field(default_factory=dict)
    structures: dict[str, BlockStructure] = field(default_factory=dict)
    # structure -> the rows only its blocks have (block_structures.yaml, ``places``)
    structure_places: dict[str, dict[str, Address]] = field(default_factory=dict)
    rules: list[StructureRule] = field(default_factory=list)
    layer_kinds: dict[str, LayerKind] = field(default_factory=dict)
    structural: dict[str, dict[str, StructuralEntry]] = field(default_factory=dict)
    interiors: dict[str, Interior] = field(default_factory=dict)
    # the operands the interior checks read, where the shared attention function has them
    operands: dict[str, Operand] = field(default_factory=dict)
    # (kind, call-shaped needle) of the calls that compute an attention's output gate
    gates: list[tuple[str, str]] = field(default_factory=list)
    components: dict[str, Component] = field(default_factory=dict)
    families: list[FamilyDef] = field(default_factory=list)
    tiny: TinyTables = field(default_factory=TinyTables)
    # transformer_lens.yaml: scope ("" every family, "structure:<s>", "family:<f>") ->
    # hook name (each alias its own key) -> what it is here
    transformer_lens: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    # the default lens (places.yaml): the last block's output to the logits
    lens: Lens = field(default_factory=Lens)

    def structure_of(self, name: str) -> str | None:
        """The structure that declares the row ``name`` (None for a default row or no
        row)."""
        for structure, rows in self.structure_places.items():
            if name in rows:
                return structure
        return None

    def row(self, name: str) -> Address | None:
        """The default row ``name``, else the structure row of that name."""
        if name in self.places:
            return self.places[name]
        structure = self.structure_of(name)
        return self.structure_places[structure][name] if structure is not None else None

    def all_rows(self) -> dict[str, Address]:
        """The default rows and every structure's rows, in forward order (whole-model
        places before the layers, per-layer places, whole-model places after)."""
        rows = dict(self.places)
        for declared in self.structure_places.values():
            rows.update(declared)
        return dict(sorted(rows.items(), key=lambda item: rank_key(item[1])))


def rank_key(row: Address) -> tuple[int, int]:
    """A row's place in forward order, as ``model.internals.rank`` orders layer 0."""
    if row.per_layer:
        return (1, row.order)
    return (0 if row.order < 0 else 2, row.order)


# ------------------------------------------------------------ YAML rows -> types
# Each takes a row as the schema passed it (plain data) and gives the frozen type.


def condition(raw: Any) -> Condition:
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
        config=tuple(raw.get("config", {}).items()),
        config_not=tuple(raw.get("config_not", {}).items()),
    )


def select(raw: Any) -> Select | None:
    if raw is None:
        return None
    if raw == "first_if_tuple":
        return FirstIfTuple()
    return Index(raw["index"])


# keys of a YAML row that are not fields of ``Address``: the row's name (places.yaml
# and a structure's places), and ``add`` (a family row that adds a place)
NOT_ADDRESS_FIELDS = ("name", "add")


def address_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """YAML row fields -> typed ``Address`` keyword arguments."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "io":
            out[key] = IOType(value)
        elif key == "source":
            out[key] = tuple(value)
        elif key == "select":
            out[key] = select(value)
        elif key == "unavailable":
            out[key] = tuple(Unavailable(condition(u["when"]), u["reason"].strip()) for u in value)
        elif key in ("versions", "routing"):
            out[key] = tuple(sorted(value.items()))
        elif key == "leading_positions":
            out[key] = LeadingPositions(value["config"], tuple(value.get("axes", (1,))))
        elif key == "trailing_streams":
            out[key] = TrailingStreams(value["config"], tuple(value.get("axes", (1,))))
        elif key == "streams":
            out[key] = None if value is None else Streams(value["layout"], value["count"])
        elif key in ("doc", "read_only"):
            out[key] = value.strip() if isinstance(value, str) else value
        elif key in NOT_ADDRESS_FIELDS:
            continue
        else:
            out[key] = value
    return out


def address(raw: dict[str, Any]) -> Address:
    return Address(**address_fields(raw))


def match(raw: dict[str, Any]) -> FamilyMatch:
    return FamilyMatch(
        tuple(raw.get("model_types", ())),
        tuple(raw.get("classes", ())),
        tuple(raw.get("config", {}).items()),
        tuple(raw.get("versions", {}).items()),
    )


def block_structure(name: str, raw: dict[str, Any]) -> BlockStructure:
    return BlockStructure(
        name,
        raw["doc"].strip(),
        tuple(raw["identities"]),
        tuple(raw.get("requires_rows", ())),
        parallel=bool(raw.get("parallel", False)),
        norm_after_add=bool(raw.get("norm_after_add", False)),
        residual_inside=bool(raw.get("residual_inside", False)),
        output_scale=raw.get("output_scale"),
    )


def layer_kind(name: str, raw: dict[str, Any]) -> LayerKind:
    return LayerKind(
        name,
        raw["doc"].strip(),
        tuple(raw.get("present", ())),
        tuple(raw.get("absent", ())),
        bool(raw.get("skipped_on_text_input", False)),
    )


def structure_rule(raw: dict[str, Any]) -> StructureRule:
    return StructureRule(raw["structure"], match(raw))


def structural_entry(raw: dict[str, Any]) -> StructuralEntry:
    if "reason" in raw:
        return StructuralEntry(reason=" ".join(raw["reason"].split()))
    return StructuralEntry(candidates=tuple(raw["candidates"]))


def interior_fields(raw: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A family's interior override -> typed ``Interior`` keyword arguments."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "needles":
            out[key] = tuple(value)
        elif key == "take":
            out["arg"] = value.get("arg")
            out["returns"] = value.get("return")
        elif key in ("note", "unavailable"):
            out[key] = " ".join(value.split())
        else:
            out[key] = value
    return tuple(out.items())


def operand(raw: dict[str, Any]) -> Operand:
    return Operand(
        needle=raw.get("needle"),
        arg=raw.get("arg"),
        kwarg=raw.get("kwarg"),
        returns=raw.get("return"),
        input=raw.get("input"),
        attribute=raw.get("attribute"),
        value=float(raw["value"]) if "value" in raw else None,
    )


def interior(raw: dict[str, Any]) -> Interior:
    take = raw["take"]
    return Interior(
        name=raw["name"],
        within=raw["within"],
        needles=tuple(raw["needles"]),
        order=raw["order"],
        arg=take.get("arg"),
        returns=take.get("return"),
        eager_only=raw.get("eager_only", False),
        versions=tuple(sorted(raw.get("versions", {}).items())),
        doc=raw["doc"].strip(),
        missing=" ".join(raw["missing"].split()) if "missing" in raw else None,
        reaches=raw.get("reaches"),
    )


def component(raw: dict[str, Any], kind: str, target: str, rank: int) -> Component:
    return Component(
        name=raw["name"],
        kind="boundary" if kind == "boundary" else "interior",
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


def _joined(text: str | None) -> str | None:
    return " ".join(text.split()) if text is not None else None


def _rename_value(value: Any) -> Any:
    """A rename field as the generated parts (Containers, Loading, ...) hold it: a list as a tuple, a
    mapping (key_mapping) as a tuple of (key, value) pairs, in the file's order."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return tuple((str(k), str(v)) for k, v in value.items())
    return value


def family(
    raw: dict[str, Any],
    file: str,
    overrides: list[tuple[str, tuple[tuple[str, Any], ...]]],
    new_rows: list[tuple[str, Address]],
) -> FamilyDef:
    return FamilyDef(
        name=raw["family"],
        file=file,
        doc=raw["doc"].strip(),
        match=match(raw["match"]),
        rename=tuple((k, _rename_value(v)) for k, v in raw.get("rename", {}).items()),
        overrides=tuple(overrides),
        new_rows=tuple(new_rows),
        interiors_unavailable=_joined(raw.get("interiors_unavailable")),
        interiors=tuple(
            (name, interior_fields(fields)) for name, fields in raw.get("interiors", {}).items()
        ),
        operands=tuple((name, operand(o)) for name, o in raw.get("operands", {}).items()),
        structure_unknown_reason=_joined(raw.get("structure_unknown_reason")),
        media_tokens=tuple(
            (medium, tuple(names)) for medium, names in raw.get("media_tokens", {}).items()
        ),
        lens=lens(raw["lens"]) if "lens" in raw else None,
    )


def lens(raw: dict[str, Any]) -> Lens:
    """A ``lens`` mapping (places.yaml, a family file) as a Lens."""
    steps = tuple(
        LensStep(kind, arg) for step in raw.get("steps", ()) for kind, arg in step.items()
    )
    return Lens(steps=steps, unavailable=_joined(raw.get("unavailable")))
