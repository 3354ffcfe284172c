"""What every lint rule works on: the files that passed their schema, the typed
registry being built, and the shared checks of row fields (needles, versions,
reasons, unavailability)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..diagnostics import Diagnostic
from ..loader import JsonPath, Loaded
from ..model import Registry

# a call site: the callable as written, "(", and optionally the start of the first
# argument where one forward calls the same callable twice
# a callable as called, ending in "(", then optionally the first argument, or the
# arguments up to the one that tells two calls apart ("self.post_attention(h, attn_vec",
# where XLNet's calls all start with h); or a tensor method called on an expression's
# result, which has no name (".sigmoid(" in "gate.unsqueeze(-1).sigmoid()"): a dot and
# the method alone, as nnsight names that call
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
NEEDLE = re.compile(
    rf"^(\.{_IDENT}|{_IDENT}(\.{_IDENT})*)\(({_IDENT}[A-Za-z0-9_.]*(, {_IDENT}[A-Za-z0-9_.]*)*)?$"
)
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
ALLOWED_PLACEHOLDERS = {"place"}
NEW_ROW_FIELDS = ("module", "io", "order", "doc")


@dataclass
class Context:
    """One lint run's cross-row state. ``loaded`` holds the registry files that passed
    their schema (by name), ``families`` the family files that did (by path relative
    to the registry); ``rows_raw`` the default rows as written, by name, and
    ``structure_rows_raw`` the rows a structure declares."""

    reg: Registry
    loaded: dict[str, Loaded]
    families: list[tuple[str, Loaded]]
    disp: Callable[[str], str]
    out: list[Diagnostic] = field(default_factory=list)
    rows_raw: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the rows structures declare, as written: name -> (structure, index, row)
    structure_rows_raw: dict[str, tuple[str, int, dict[str, Any]]] = field(default_factory=dict)
    # every structure that declares a row, where more than one does (alike)
    structure_row_scopes: dict[str, list[str]] = field(default_factory=dict)

    def file(self, name: str) -> Loaded | None:
        return self.loaded.get(name)

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

    # ------------------------------------------------------------ shared field checks

    def needles(
        self, loaded: Loaded, display: str, path: JsonPath, row: str, needles: list[str]
    ) -> None:
        """X004: every needle is call-shaped."""
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
        """X006: every version range parses."""
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

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

    def lens(
        self,
        loaded: Loaded,
        display: str,
        path: JsonPath,
        owner: str,
        raw: dict[str, Any],
        whole_model: set[str],
    ) -> None:
        """X022: every ``apply`` step of a lens names a whole-model row (whose module
        the lens calls); X010 on its reason."""
        if "unavailable" in raw:
            self.reasons(loaded, display, (*path, "unavailable"), owner, raw["unavailable"])
        for i, step in enumerate(raw.get("steps", ())):
            target = step.get("apply")
            if target is not None and target not in whole_model:
                self.err(
                    loaded,
                    display,
                    (*path, "steps", i, "apply"),
                    "X022",
                    owner,
                    f"the lens applies {target!r}, which is not a whole-model row (a "
                    "lens calls the module of a whole-model place: "
                    f"{', '.join(sorted(whole_model))}); name one of those",
                )

    def reasons(self, loaded: Loaded, display: str, path: JsonPath, row: str, reason: str) -> None:
        """X010: a reason fills in {place} and nothing else."""
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
        """X010 on every reason; X007 on a layer kind that is not defined."""
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
        """The checks every Address row gets, wherever it is written."""
        if "source" in raw:
            self.needles(loaded, display, (*path, "source"), row, raw["source"])
        if "versions" in raw:
            self.versions(loaded, display, (*path, "versions"), row, raw["versions"])
        if "unavailable" in raw:
            self.unavailable(loaded, display, (*path, "unavailable"), row, raw["unavailable"])
