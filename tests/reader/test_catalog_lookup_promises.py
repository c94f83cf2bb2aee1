"""A version 3 checkpoint's lookups trust its header's Bloom filters (FORMAT.md 11.2): an id one of
them leaves out (a resealed header that lies) is answered "not committed" while the rows are
unread; once every row is read that answer is checked, as the rows handed out are, and a lie is
a ``FormatError`` naming the checkpoint, never a store that lists a sample it said did not exist.
Found by the version 3 lookups attack of the checkpoint fuzzer (``tests/fuzz/checkpoints.py``)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import r3store
from r3store._format import _checkpoint
from r3store._format._checkpoint import _root_digest
from r3store.errors import FormatError, SampleNotFoundError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def _routes(i: int) -> np.ndarray:
    return np.tile(np.array([i % 8, 8 + i % 8]), (3, 2, 1)).astype(np.int32)


def _compacted_with_empty_blooms(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten one-sample commits compacted in row groups of 4 rows; the checkpoint then resealed with
    every group's Bloom filter emptied (its root digest recomputed, its rows untouched)."""
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    for i in range(10):
        with r3store.RouteWriter(root, SPEC) as w:
            w.append(f"s{i}", _routes(i))
    key = r3store.compact(root).key
    assert key is not None
    path = root / key
    table = pq.read_table(path)
    kv = dict(table.schema.metadata)
    kv[b"r3store.bloom"] = base64.b64encode(bytes(len(base64.b64decode(kv[b"r3store.bloom"]))))
    kv[b"r3store.digest"] = _root_digest(kv[b"r3store.version"].decode(), kv[b"r3store.spec"].decode(),
                                         kv[b"r3store.checkpoint"].decode(), kv[b"r3store.bloom"].decode(),
                                         (kv[b"r3store.store_id"].decode(),)).encode()
    pq.write_table(table.replace_schema_metadata(kv), path, row_group_size=4, write_page_checksum=True)


def test_an_id_a_lying_filter_hid_is_a_format_error_once_the_rows_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _compacted_with_empty_blooms(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path)
    assert store._catalog._pending is not None
    assert store._catalog._pending.lazy
    assert "s5" not in store  # the header is trusted for lookups while the rows are unread
    with pytest.raises(SampleNotFoundError):
        store.get("s5")
    with pytest.raises(FormatError, match=r"sample 's5' was looked up before the rows were read and not found"):
        store.sample_ids  # noqa: B018  # every row read: the lie is found, not a list holding 's5'
    with pytest.raises(FormatError, match="looked up before the rows were read"):
        len(store.samples)


def test_ids_truly_absent_stay_absent_after_the_rows_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    for i in range(10):
        with r3store.RouteWriter(tmp_path, SPEC) as w:
            w.append(f"s{i}", _routes(i))
    r3store.compact(tmp_path)
    store = r3store.open_store(tmp_path)
    assert "never-written" not in store
    assert "" not in store
    np.testing.assert_array_equal(store.get("s7"), _routes(7))
    assert store.sample_ids == [f"s{i}" for i in range(10)]
