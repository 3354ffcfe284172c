"""The models the tests run on, derived from the registry (the generated tables), so a
family file or a block-structure rule is tested the moment it exists: no test keeps
its own copy of the family list.

Two tiers. The README's test command runs the *representatives*: for each block
structure the first model type its rules name with no config condition, every config value a rule or a family
match decides by, and for each set of config attributes rows scale by, the first model
type with them set to a value that shows the scale. CI also runs the rest (marker ``wide``): every model type every rule
names, every model type every family file names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from causalab_mini.generated import BLOCK_STRUCTURE_RULES, FAMILY_ADDRESSES, FAMILY_MATCH
from causalab_mini.versions import outside_versions

Config = tuple[tuple[str, Any], ...]

# A value no config attribute defaults to: a row that scales by the attribute shows
# the scale only when it is not 1.
SCALE_VALUE = 0.37


def tiny_spec(model_type: str, config: Config = ()) -> str:
    """tiny:<model_type>, with ``config`` as overrides (true/false as the spec parses them).
    A model type that is a sub-config's (MusicGen's musicgen_decoder) is built as the
    model type whose causal LM registry/tiny.yaml builds from it (build_from)."""
    model_type = buildable(model_type)
    if not config:
        return f"tiny:{model_type}"
    values = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in config)
    return f"tiny:{model_type}?{values}"


def buildable(model_type: str) -> str:
    """The model type tiny builds ``model_type`` as (itself, or the composite model
    type whose causal LM is built from the sub-config of that model type)."""
    return _built_as().get(model_type, model_type)


def names_of(model_type: str) -> set[str]:
    """The model types rules and family files may name a tiny ``model_type`` by: its
    own, and the model types of the sub-config it is built from."""
    return {model_type, *(t for t, parent in _built_as().items() if parent == model_type)}


@cache
def _built_as() -> dict[str, str]:
    """The model type of each sub-config a causal LM is built from (registry/tiny.yaml
    build_from) -> the model type tiny builds it as (the loaded model reports the
    sub-config's model type, which family files and rules name)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from causalab_mini.generated.tiny import TINY_BUILD_FROM

    out: dict[str, str] = {}
    for parent, sub in TINY_BUILD_FROM.items():
        if parent not in CONFIG_MAPPING:
            continue
        sub_cls = (getattr(CONFIG_MAPPING[parent], "sub_configs", None) or {}).get(sub)
        sub_type = getattr(sub_cls, "model_type", None)
        if isinstance(sub_type, str) and sub_type:
            out[sub_type] = parent
    return out


@dataclass(frozen=True)
class Case:
    """One model to build: its spec, and what the registry says of it."""

    spec: str
    model_type: str
    config: Config
    representative: bool

    @property
    def structures(self) -> frozenset[str]:
        """Every structure a rule naming this model type gives (whatever the config)."""
        names = names_of(self.model_type)
        return frozenset(
            rule.structure for rule in BLOCK_STRUCTURE_RULES if names & set(rule.match.model_types)
        )

    def expected_structure(self) -> str | None:
        """The structure the rules give this tiny model (its config evaluated)."""
        return structure_of(self.model_type, self.config)

    @property
    def id(self) -> str:
        return self.spec.removeprefix("tiny:")

    def param(self, *values: Any, id: str | None = None) -> Any:
        """A pytest param of ``values`` (the case's spec if none), marked ``wide`` where
        the case is not a representative."""
        marks: list[Any] = [] if self.representative else [pytest.mark.wide]
        if self.model_type not in _installed_model_types():
            import transformers

            reason = f"{self.model_type} is not in transformers {transformers.__version__}"
            marks.append(pytest.mark.skip(reason=reason))
        else:
            from causalab_mini.tools.tiny import builds_outside

            outside = builds_outside(buildable(self.model_type))
            if outside is not None:  # registry/tiny.yaml builds_with
                marks.append(pytest.mark.skip(reason=outside))
        return pytest.param(*(values or (self.spec,)), id=id or self.id, marks=marks)


@cache
def _installed_model_types() -> frozenset[str]:
    """The model types of the installed transformers that tiny builds, in every group of
    registry/tiny.yaml (an older one, as `nox -s drift` installs, lacks some the
    registry names)."""
    from causalab_mini.tools.tiny import group_model_types

    return frozenset(t for types in group_model_types().values() for t in types)


def skip_unless_installed(model_type: str) -> None:
    """Skip the running test, with the model type and the transformers version, where
    the installed transformers lacks ``model_type`` (an older one, as `nox -s drift`
    installs)."""
    if model_type not in _installed_model_types():
        import transformers

        pytest.skip(f"{model_type} is not in transformers {transformers.__version__}")


@cache
def structure_of(model_type: str, config: Config = ()) -> str | None:
    """The structure the first matching rule gives the tiny ``model_type`` with ``config``
    set (evaluated on the tiny config, as a loaded model's text config would be)."""
    from causalab_mini.tools.tiny import tiny_config

    text = language_config(model_type, tiny_config(model_type))
    for key, value in config:
        setattr(text, key, value)
    missing = object()
    names = names_of(model_type)
    for rule in BLOCK_STRUCTURE_RULES:
        if rule.match.model_types and not names & set(rule.match.model_types):
            continue
        if outside_versions(rule.match.versions) is not None:  # a rule of other releases
            continue
        if all(getattr(text, key, missing) == value for key, value in rule.match.config):
            return rule.structure
    return None


def language_config(model_type: str, config: Any) -> Any:
    """The config the causal LM of a tiny ``model_type`` is built from: the text config,
    or the sub-config registry/tiny.yaml builds it from."""
    from causalab_mini.generated.tiny import TINY_BUILD_FROM

    if model_type in TINY_BUILD_FROM:
        return getattr(config, TINY_BUILD_FROM[model_type])
    return config.get_text_config()


def _scaled_by() -> dict[str, Config]:
    """model type -> the config attributes its family's rows scale by, each set to
    SCALE_VALUE (a scale of 1 would let an unscaled row pass)."""
    out: dict[str, Config] = {}
    for match, rows in FAMILY_ADDRESSES:
        attributes = sorted({row.scale for row in rows.values() if isinstance(row.scale, str)})
        for model_type in match.model_types:
            if attributes and model_type not in out:
                out[model_type] = tuple((a, SCALE_VALUE) for a in attributes)
    return out


def _rule_model_types() -> Iterator[tuple[Any, str, bool]]:
    """(rule, model type, first) for every model type every block-structure rule
    names, in the rules' order; first: the first config-free model type of the rule's
    structure."""
    seen_structures: set[str] = set()
    for rule in BLOCK_STRUCTURE_RULES:
        for model_type in rule.match.model_types:
            first = not rule.match.config and rule.structure not in seen_structures
            if first:
                seen_structures.add(rule.structure)
            yield rule, model_type, first


@cache
def rule_cases() -> tuple[Case, ...]:
    """Every model type every rule names, with the
    rule's config values; every family match decided by config values; and every
    model type whose rows scale by a config attribute, with that attribute set.
    Representatives: the first config-free model type of each structure, every config variant,
    and the first model type that scales by each set of attributes."""
    wanted: dict[tuple[str, Config], bool] = {}
    for rule, model_type, first in _rule_model_types():
        key = (model_type, tuple(rule.match.config))
        wanted[key] = wanted.get(key, False) or first or bool(rule.match.config)
    for match in FAMILY_MATCH.values():
        if match.config:
            for model_type in match.model_types:
                wanted[(model_type, tuple(match.config))] = True
    scales_seen: set[tuple[str, ...]] = set()
    for model_type, config in _scaled_by().items():  # the first model type per set of attributes
        attributes = tuple(key for key, _ in config)
        wanted[(model_type, config)] = attributes not in scales_seen
        scales_seen.add(attributes)
    cases = (
        Case(tiny_spec(model_type, config), buildable(model_type), config, representative)
        for (model_type, config), representative in wanted.items()
    )
    return tuple(sorted(cases, key=lambda case: case.spec))


def _member(model_type: str, classes: tuple[str, ...]) -> str:
    """The group member a family matching ``classes`` is built as: ``<group>/<type>``
    where its classes name only the whole model a group that shares model types maps
    the type to (mbart_whole: MBartForConditionalGeneration, tiny:seq2seq/mbart), not
    the class an earlier group loads; else the model type."""
    from transformers.models.auto import modeling_auto

    from causalab_mini.generated.tiny import TINY_GROUPS, TINY_SHARED_GROUPS
    from causalab_mini.tools.tiny import group_model_types

    earlier: set[str] = set()
    for group, (mapping, _, _) in TINY_GROUPS.items():
        mapped = getattr(modeling_auto, mapping, {}).get(model_type)
        mapped = {mapped} if isinstance(mapped, str) else set(mapped or ())
        member = f"{group}/{model_type}"
        if (
            group in TINY_SHARED_GROUPS
            and mapped & set(classes)
            and not earlier & set(classes)
            and member in group_model_types()[group]
        ):
            return member
        earlier |= mapped
    return model_type


@cache
def family_cases() -> tuple[tuple[str, Case], ...]:
    """(family, case) for every model type every family file names, with the config
    values its match requires; the first model type of each family is its
    representative."""
    out = []
    for family, match in FAMILY_MATCH.items():
        for i, model_type in enumerate(match.model_types):
            config = tuple(match.config)
            spec = tiny_spec(_member(model_type, match.classes), config)
            case = Case(spec, buildable(model_type), config, i == 0)
            out.append((family, case))
    return tuple(sorted(set(out), key=lambda pair: (pair[0], pair[1].spec)))


@cache
def model_types() -> tuple[Case, ...]:
    """Every model type the registry names (rules and family files), once, with no
    config; representatives: the first config-free model type of each structure's
    rules (each family file's are the representatives of ``family_cases``)."""
    representative: dict[str, bool] = {}
    for _, model_type, first in _rule_model_types():
        representative[model_type] = representative.get(model_type, False) or first
    for _, case in family_cases():
        representative.setdefault(case.model_type, False)
    out = {
        buildable(t): Case(tiny_spec(t), buildable(t), (), representative[t])
        for t in representative
    }
    return tuple(out[t] for t in sorted(out))
