"""``ModelSpec`` (``r3store/_spec.py``): accepted values and the messages of a mismatch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import SpecError, SpecMismatchError

SPEC_4X16 = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def test_spec_accepts_numpy_ints_and_says_in_range() -> None:
    spec = r3store.ModelSpec(num_layers=np.int64(4), num_experts=np.int32(16), top_k=np.int8(2))
    assert spec == SPEC_4X16
    assert type(spec.num_layers) is int
    with pytest.raises(SpecError, match=r"top_k must be in \[1, 16\]"):
        r3store.ModelSpec(num_layers=4, num_experts=16, top_k=17)


def test_spec_mismatch_names_the_differing_fields(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC_4X16):
        pass
    other = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=3, moe_layers=range(1, 4))
    with pytest.raises(SpecMismatchError) as err:
        r3store.RouteWriter(tmp_path, other)
    assert err.value.fields == ("top_k", "moe_layers")
    assert "top_k 2 there vs 3" in str(err.value)
    assert "0..3 there vs 1..3" in str(err.value)
