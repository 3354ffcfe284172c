"""Blocks that multiply their whole output by a per-layer weight (a structure's
``output_scale``, Gemma-4's layer_scalar): the identities of layers_output hold with
the weight applied, and fail without it.

A tiny checkpoint keeps the weight at its init (1), where scaled and unscaled sums
agree; these tests give every layer another value first, as a trained checkpoint
has. The cases come from the rules of every structure with an output scale.
"""

from __future__ import annotations

from typing import Any

import pytest

from causalab_mini.generated import BLOCK_STRUCTURES
from causalab_mini.tools import certify as c

from .registry_cases import Case, _installed_model_types, rule_cases

pytestmark = [pytest.mark.slow, pytest.mark.semantic]


def _scaled(case: Case) -> bool:
    """Whether the case's block has an output scale (a model type the installed
    transformers lacks is judged by its rules, and skipped by its param)."""
    if not any(BLOCK_STRUCTURES[s].output_scale for s in case.structures):
        return False  # no rule naming it gives a scaled structure (nothing to build)
    from causalab_mini.tools.tiny import builds_outside

    if case.model_type not in _installed_model_types() or builds_outside(case.model_type):
        return True  # skipped by its param, with the reason
    structure = case.expected_structure()
    return structure is not None and BLOCK_STRUCTURES[structure].output_scale is not None


SCALED = [case.param(case) for case in rule_cases() if _scaled(case)]


def test_the_registry_has_scaled_cases() -> None:
    # the test below is parametrized from the registry: an empty list would run nothing
    assert {p.values[0].model_type for p in SCALED} >= {"gemma4_text"}


def _scaled_model(spec: str) -> Any:
    """A model of its own whose layers' output weights are 0.5, 0.75, 1.25, ..."""
    import torch

    from causalab_mini import StandardizedTransformer

    model = StandardizedTransformer(spec)
    model.dispatch()
    path = BLOCK_STRUCTURES[model.block_structure].output_scale
    with torch.no_grad():
        for layer in range(model.internals.num_layers):
            weight = model.internals.layer_envoy(layer)._module
            for part in path.split("."):
                weight = getattr(weight, part)
            weight.fill_(0.5 + 0.25 * layer + (0.25 if layer >= 2 else 0.0))
    return model


@pytest.mark.parametrize("case", SCALED)
def test_identities_hold_through_the_output_scale(case: Case) -> None:
    model = _scaled_model(case.spec)
    structure = BLOCK_STRUCTURES[model.block_structure]
    assert structure.output_scale
    inputs = c.sample_inputs(model)
    values = c.read_places(model, inputs)
    checks = c.identities(model, values) + c.hidden_state_oracle(model, inputs, values)
    assert not [check for check in checks if not check.ok]
    scaled = [i for i in structure.identities if c.parse_identity(i)[0] == "layers_output"]
    assert scaled, "the structure states an identity of layers_output"
    for layer in range(model.internals.num_layers):
        left, right = c.parse_identity(scaled[0])
        unscaled = sum(values[(n, layer)] for n in right)
        assert not c.difference(values[(left, layer)], unscaled)[0], "the weight matters"
    write = c.write_reaches_stream(model, inputs, layer=1)
    assert write is not None and write.ok, write
    # and the reads before that write keep their clean values
    kept = c.write_keeps_earlier_reads(model, inputs, "layers_mid", 1)
    assert len(kept) >= 3, "layers_mid[1] was not checked"
    assert all(check.ok for check in kept), [check for check in kept if not check.ok]
