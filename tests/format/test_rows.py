"""Row rules of a sample table (``r3store/_format/_rows.py``): nulls, values, quarantined row counts."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from r3store.errors import FormatError
from tests.routes import SPEC_4X16, rewrite_table, set_column
from tests.routes import routes_4x16 as routes

REQUIRED = ["sample_id", "num_tokens", "num_rows", "row_start", "array", "commit", "committed_at", "quarantined"]


@pytest.mark.parametrize("column", REQUIRED)
def test_sample_table_nulls(small_store_dir: Path, column: str) -> None:
    path = rewrite_table(small_store_dir, lambda t: set_column(t, column, [None] * t.num_rows))
    with pytest.raises(FormatError, match=f"column '{column}' must not be null") as info:
        r3store.open_store(small_store_dir)
    assert path.name in str(info.value)


@pytest.mark.parametrize(("column", "values", "words"), [
    ("num_rows", [-3, 10, 10], "column 'num_rows' must lie in"),
    ("row_start", [-5, 10, 20], "column 'row_start' must lie in"),
    ("num_tokens", [0, 11, 11], "column 'num_tokens' must lie in"),
    ("num_tokens", [2**45, 11, 11], "column 'num_tokens' must lie in"),  # assemble allocated 1 PiB
    ("num_tokens", [5, 11, 11], "column 'num_rows' must be num_tokens - 1"),
    ("row_start", [0, 0, 20], "share rows"),
    ("row_start", [0, 5, 20], "share rows"),
])
def test_sample_table_values(small_store_dir: Path, column: str, values: list[int], words: str) -> None:
    path = rewrite_table(small_store_dir, lambda t: set_column(t, column, values))
    with pytest.raises(FormatError, match=words) as info:
        r3store.open_store(small_store_dir)
    assert path.name in str(info.value)


def test_quarantined_row_count_may_differ(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC_4X16, config={"on_invalid": "quarantine"}) as w:
        w.append("ok", routes(4, 1))
        w.append("off", routes(4, 2), num_tokens=4)  # rows == num_tokens: quarantined, still stored
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["ok"]
    assert store.get("off", include_quarantined=True).shape == (4, 4, 2)
