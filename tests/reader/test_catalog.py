"""The sample catalogue after ``compact``: lists built on first use, the store-order sort
skipped only when a check finds the rows in order, and both kept right across ``refresh``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import r3store
from r3store.reader._catalog import _in_store_order

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def rows(times: list[int], commits: list[str | None], starts: list[int]) -> pa.Table:
    at = [datetime(2026, 1, 1, 0, 0, t, tzinfo=UTC) for t in times]
    return pa.table({"committed_at": pa.array(at, pa.timestamp("us", tz="UTC")),
                     "commit": pa.array(commits, pa.string()), "row_start": pa.array(starts, pa.int64())})


@pytest.mark.parametrize(("table", "ordered"), [
    (rows([0, 0, 0, 1], ["a", "a", "b", "a"], [0, 5, 0, 0]), True),  # each key breaks ties of the one before
    (rows([0, 0], ["a", "a"], [3, 3]), True),                        # equal rows: the stable sort keeps them
    (rows([1, 0], ["a", "b"], [0, 0]), False),                       # an earlier commit time after a later
    (rows([0, 0], ["b", "a"], [0, 0]), False),                       # same time, names out of order
    (rows([0, 0], ["a", "a"], [5, 0]), False),                       # same commit, rows out of order
    (rows([0, 0], ["a", None], [0, 0]), False),                      # a null is never taken as ordered
    (rows([0], ["a"], [0]), True),
])
def test_store_order_is_checked(table: pa.Table, ordered: bool) -> None:
    assert _in_store_order(table) is ordered


def write(url: Path, first: int, count: int) -> None:
    for c in range(count):
        with r3store.RouteWriter(url, SPEC, config={"on_invalid": "quarantine"}) as w:
            for k in range(2):
                i = first + 2 * c + k
                routes = (np.arange(3 + i)[:, None, None] + np.array([0, 8])[None, None, :]) % 16
                routes = np.broadcast_to(routes, (3 + i, 2, 2)).astype(np.int32)
                if i == first + 1:
                    routes = routes.copy()
                    routes[0, 0] = [4, 4]  # quarantined: hidden from len() and sample_ids
                w.append(f"s{i:03d}", routes)


def test_compacted_open_lists_follow_refresh(tmp_path: Path) -> None:
    url = tmp_path / "store"
    write(url, 0, 6)
    r3store.compact(url)
    reader = r3store.open_store(url)
    assert reader._catalog.checkpoint is not None
    assert len(reader) == 11
    assert len(reader.sample_ids) == 11
    assert reader.num_tokens("s004") == 3 + 4 + 1
    assert len(reader.commits) == 6
    write(url, 100, 2)
    assert reader.refresh() == 3
    assert len(reader) == 14 == len(reader.sample_ids)
    assert len(reader.commits) == 8
    assert reader.num_tokens("s103") == 3 + 103 + 1
    np.testing.assert_array_equal(reader.get("s103")[:, 0], (np.arange(106)[:, None] + [0, 8]) % 16)
    fresh = r3store.open_store(url, reader={"use_checkpoint": False})
    assert reader.sample_ids == fresh.sample_ids  # the same rows, in the same (store) order
    assert reader.commits == fresh.commits
