"""Object keys of a store (``r3store/_format/_keys.py``): index file names and places."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import FormatError

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


@pytest.fixture
def small_store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    make_store(root)
    return root


@pytest.mark.parametrize("name", ["-dash-00000", "sp ace-00000", "x" * 241])
def test_index_file_name_must_be_a_shard_name(small_store_dir: Path, name: str) -> None:
    (index_file(small_store_dir).parent / f"{name}.parquet").write_bytes(index_file(small_store_dir).read_bytes())
    with pytest.raises(FormatError, match="does not match") as info:
        r3store.open_store(small_store_dir)
    assert name in str(info.value)


@pytest.mark.parametrize("where", ["sub/x-00000", "20261301T00/x-00000", "20261129T07/deeper/x-00000", "x-00000"])
def test_index_file_in_a_subfolder_is_rejected(small_store_dir: Path, where: str) -> None:
    """Format v2 tables live at index/<bucket>/<commit>.parquet, <bucket> a real UTC hour."""
    path = small_store_dir / "index" / f"{where}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(index_file(small_store_dir).read_bytes())
    with pytest.raises(FormatError, match=f"{where}.parquet: a format v2 sample table must be index/<bucket>/"):
        r3store.open_store(small_store_dir)
