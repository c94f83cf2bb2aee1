"""Issue 22 item 7: ``append`` of a 0-row array is refused like ``append_sglang``'s empty payload.

It stored a 1-token sample silently. A sample of no rows now needs ``num_tokens=1`` (or one
token) to say it is a 1-token sample; otherwise the append is refused as "no routes".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import RowCountError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


def test_a_zero_row_array_is_refused(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(RowCountError, match="has 0 rows: no routes to store"):
            w.append("empty", np.zeros((0, 2, 2), np.int32))
        with pytest.raises(RowCountError, match="pass num_tokens=1"):
            w.append("empty", [])
    assert r3store.open_store(tmp_path).sample_ids == []


def test_a_one_token_sample_says_so(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("one", np.zeros((0, 2, 2), np.int32), num_tokens=1)
        w.append("tok", np.zeros((0, 2, 2), np.int32), tokens=[7])
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["one", "tok"]
    assert store.get("one").shape == (0, 2, 2)


def test_a_final_turn_of_zero_rows_after_others_is_fine(tmp_path: Path) -> None:
    routes = np.array([[[1, 2], [3, 4]], [[5, 6], [7, 0]]], np.int32)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("multi", routes, final=False)
        w.append("multi", np.zeros((0, 2, 2), np.int32), start=2)
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("multi"), routes)
