"""The content digest of a sample table (``r3store/_format/_digest.py``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store.audit
from r3store.errors import ChecksumError
from tests.routes import sample_tables as _tables
from tests.routes import seeded_routes as _routes
from tests.routes import write_store as _write


def test_sample_table_edit_with_its_old_metadata_is_refused(tmp_path: Path) -> None:
    """Item 4: rewriting a table with ``s4`` renamed ``s2`` (metadata kept) served s4's routes as s2."""
    data = {f"s{i}": _routes(5 + i, i) for i in (1, 3, 4)}
    _write(tmp_path, data)
    (path,) = _tables(tmp_path)
    table = pq.read_table(path)
    ids = ["s2" if s == "s4" else s for s in table.column("sample_id").to_pylist()]
    table = table.set_column(0, table.schema.field(0), pa.array(ids))
    pq.write_table(table, path)  # the footer keeps r3store.version / spec (and the now stale digest)
    with pytest.raises(ChecksumError, match="digest") as info:
        r3store.open_store(tmp_path)
    assert path.name in str(info.value)
