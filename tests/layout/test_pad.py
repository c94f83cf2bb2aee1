"""Pad rows (``r3store/layout/_pad.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from r3store.errors import LayoutOptionError
from r3store.layout import apply_routes, pad_routes, plan_layout


def test_spread_pad_rows_need_top_k_distinct_experts() -> None:
    with pytest.raises(LayoutOptionError, match="top_k=3"):
        apply_routes(plan_layout([2]), np.zeros((1, 1, 3), np.int32), num_experts=2)
    with pytest.raises(LayoutOptionError, match="top_k=3"):
        pad_routes(1, 1, 3, 2)
    out, _ = apply_routes(plan_layout([2]), np.zeros((1, 1, 3), np.int32), num_experts=2, pad_policy="fill")
    assert out[1].tolist() == [[-1, -1, -1]]
