"""A layer that sets a sublayer attribute to None where it has no such sublayer
(GraniteMoeHybrid's Mamba layers: self.self_attn = None) has no such child: the
tree walk says so instead of following nnsight's alias of the name back to itself
without end, and attention places are refused there with the layer-kind reason."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from causalab_mini.internals import PlaceUnavailable, child
from causalab_mini.model import StandardizedTransformer

pytestmark = pytest.mark.slow


def test_a_sublayer_set_to_none_is_no_child(
    tiny_model: Callable[..., StandardizedTransformer],
) -> None:
    model = tiny_model("tiny:granitemoehybrid")
    kinds = [child(model.layers[i], "self_attn") is not None for i in range(len(model.layers))]
    assert kinds == [False, True, False]
    assert child(model.layers[0], "mamba") is not None
    assert child(model.layers[1], "mamba") is None
    assert "mixes tokens without attention" in (
        model.internals["attentions_output"].unavailable_on(0) or ""
    )
    assert model.internals["attentions_output"].unavailable_on(1) is None
    with pytest.raises(PlaceUnavailable, match="without attention"):
        model.internals["attentions"].address_at(2)
