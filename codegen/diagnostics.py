"""Lint diagnostics: ``path:line:col: CODE [row] message``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Every code the linter can emit, with what it means. Tests hold one golden case each.
CODES: dict[str, str] = {
    "F001": "a required registry file is missing",
    "F002": "a file in the registry directory is not a registry file",
    "F003": "a registry file cannot be read",
    "Y001": "YAML syntax error",
    "Y002": "a YAML tag (only plain data is allowed)",
    "Y003": "a key appears twice in one mapping",
    "Y004": "nesting too deep",
    "Y005": "a mapping key that is not a string",
    "S001": "a key the schema does not know",
    "S002": "a required key is missing",
    "S003": "a value of the wrong type",
    "S004": "a value the schema does not allow",
    "S005": "the schema version is not the one this tool reads",
    "X001": "two rows share a name",
    "X002": "two places share an order in one scope",
    "X003": "a structural place has neither candidates nor a reason for a structure",
    "X004": "a needle is not call-shaped",
    "X005": "a family names a row or field that does not exist",
    "X006": "a version range does not parse",
    "X007": "a reference to a structure, layer kind, row or interior that does not exist",
    "X008": "a structure's required rows are not replaced by a family of that structure",
    "X009": "a family file's name and its family field differ",
    "X010": "a reason uses a placeholder other than {place}",
    "X011": "the default rows are not in forward order",
    "X012": "a structural row or entry without its counterpart",
    "X013": "a component disagrees with the row it names",
    "X014": "a family that no block-structure rule covers",
    "X015": "a family without a final norm that does not refuse ln_final_output",
    "X016": "a family says why no block structure applies, and a block-structure rule covers it",
    "X017": "a family row that names no default place without 'add: true', or 'add: true' on a default place",
    "X018": "tiny.yaml sizes that do not fit together (head_dim x heads, kv_heads, experts, reserved ids)",
    "X019": "an identity outside the grammar, or naming a row no block of its structure has",
    "X020": "a tiny.yaml side input that cannot be made (its model type is not buildable, or @layer outside per_layer_type)",
    "X021": "a tiny.yaml group that takes no model type (its mapping is an earlier group's), or a first group that is not the causal LMs'",
    "X022": "a lens step that applies a row that is not a whole-model place",
    "X023": "a tiny.yaml tokenizer that cannot be built (adds no kind the builder knows, or names a chat template tiny.yaml does not hold)",
    "X024": "a family that traces a submodule (traced_module) without its traced_config, or naming containers or rows the submodule's families give",
    "X025": "a transformer_lens.yaml hook naming a component, structure or family the registry lacks, a name given twice in one scope, or {layer} on a whole-model component",
}


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    code: str
    row: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} [{self.row}] {self.message}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
