"""Quarantine across multi-turn samples and retries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import SampleNotFoundError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


def good(rows: int, shift: int = 0) -> np.ndarray:
    base = (np.arange(rows)[:, None, None] + np.arange(2)[None, :, None] + shift) % 8
    return np.concatenate([base, (base + 1) % 8], axis=-1).astype(np.int32)


def test_bad_turn_quarantines_the_sample_and_later_turns_still_append(tmp_path: Path) -> None:
    bad = good(3)
    bad[1, 0, 1] = bad[1, 0, 0]  # repeated id in turn 2
    with r3store.RouteWriter(tmp_path, SPEC, on_invalid="quarantine") as w:
        w.append("chat", good(4), start=0, final=False)
        w.append("chat", bad, start=4, final=False)  # flagged, kept open
        w.append("chat", good(2), start=7, num_tokens=10)  # no DuplicateSampleError
        w.append("ok", good(5))
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["ok"]
    row = store.row("chat", include_quarantined=True)
    assert row["quarantined"]
    assert "repeated" in row["reason"]
    assert row["num_rows"] == 9
    np.testing.assert_array_equal(store.get("chat", include_quarantined=True),
                                  np.concatenate([good(4), bad, good(2)]))
    with pytest.raises(SampleNotFoundError):
        store.get("chat")


def test_valid_retry_beats_an_earlier_quarantined_copy(tmp_path: Path) -> None:
    bad = good(3)
    bad[0, 1, 1] = bad[0, 1, 0]
    with r3store.RouteWriter(tmp_path, SPEC, on_invalid="quarantine") as w:
        w.append("s", bad)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("s", good(3, shift=1))
    store = r3store.open_store(tmp_path, on_duplicate="first")
    assert store.sample_ids == ["s"]
    assert len(store.duplicates["s"]) == 2
    np.testing.assert_array_equal(store.get("s"), good(3, shift=1))


def test_reading_a_quarantined_sample_says_why(tmp_path: Path) -> None:
    bad = good(3)
    bad[0, 1, 1] = bad[0, 1, 0]
    with r3store.RouteWriter(tmp_path, SPEC, on_invalid="quarantine") as w:
        w.append("q", bad)
    with pytest.raises(SampleNotFoundError, match=r"quarantined .*repeated.*include_quarantined=True"):
        r3store.open_store(tmp_path).get("q")
