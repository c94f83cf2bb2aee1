"""Row rules of a sample table (``r3store/_format/_rows.py``): nulls, values, quarantined row counts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import r3store
from r3store.errors import FormatError
from r3store.testing import forge

SPEC_4X16 = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scores = rng.random((rows, SPEC_4X16.num_moe_layers, SPEC_4X16.num_experts))
    return np.argsort(scores, axis=-1)[..., :SPEC_4X16.top_k].astype(np.int32)


def make_store(root: Path | str, n: int = 3, rows: int = 10, seed: int = 0, **kw: Any) -> dict[str, np.ndarray]:
    data = {f"s{i}": routes(rows, seed + i) for i in range(n)}
    with r3store.RouteWriter(str(root), SPEC_4X16, **kw) as w:
        for sid, r in data.items():
            w.append(sid, r, metadata={"step": 1})
    return data


def index_file(root: Path) -> Path:
    (path,) = (root / "index").rglob("*.parquet")
    return path


def rewrite_table(root: Path, edit: Callable[[pa.Table], pa.Table]) -> Path:
    """Edit the store's sample table as a forger would: the digest recomputed, so the row rules are what refuse it."""
    return forge.rewrite_table(index_file(root), edit)


def set_column(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    return table.set_column(i, field.with_nullable(True), pa.array(values, type=field.type))


@pytest.fixture
def small_store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    make_store(root)
    return root


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
    with r3store.RouteWriter(tmp_path, SPEC_4X16, on_invalid="quarantine") as w:
        w.append("ok", routes(4, 1))
        w.append("off", routes(4, 2), num_tokens=4)  # rows == num_tokens: quarantined, still stored
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["ok"]
    assert store.get("off", include_quarantined=True).shape == (4, 4, 2)
