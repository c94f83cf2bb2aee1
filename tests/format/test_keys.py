"""Object keys of a store (``r3store/_format/_keys.py``): index file names and places."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from r3store.errors import FormatError
from tests.routes import index_file


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
