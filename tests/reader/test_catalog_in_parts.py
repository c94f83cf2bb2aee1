"""Opening a store from a version 2 checkpoint's header (FORMAT.md section 11): the rows are read
on first use, every check kept; what the header cannot settle is read at open."""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import r3store
from r3store._format import _checkpoint
from r3store._format._checkpoint import _root_digest
from r3store.errors import CheckpointWarning, DuplicateSampleError, FormatError, SampleTooLargeError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def routes(i: int) -> np.ndarray:
    return np.tile(np.array([i % 8, 8 + i % 8]), (3, 2, 1)).astype(np.int32)


def commit(root: Path, ids: list[str], *, quarantine: bool = False) -> None:
    with r3store.RouteWriter(root, SPEC) as w:
        for sid in ids:
            w.append(sid, routes(int(sid[1:])), metadata={"step": int(sid[1:]) // 4})


def compacted(root: Path, monkeypatch: pytest.MonkeyPatch, *, before: int = 10, after: int = 3) -> Path:
    """``before`` one-sample commits compacted (groups of 4 rows), then ``after`` more."""
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    for i in range(before):
        commit(root, [f"s{i}"])
    key = r3store.compact(root).key
    assert key is not None
    for i in range(before, before + after):
        commit(root, [f"s{i}"])
    return root / key


def same_as_tables(store: r3store.RouteStore, root: Path) -> None:
    full = r3store.open_store(root, reader={"use_checkpoint": False, "on_duplicate": store.options.on_duplicate})
    assert store.sample_ids == full.sample_ids
    assert store.samples.equals(full.samples)
    assert store.commits == full.commits
    assert store.duplicates == full.duplicates
    for sid in full.sample_ids:
        np.testing.assert_array_equal(store.get(sid), full.get(sid))


def test_open_reads_the_header_then_the_rows_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = compacted(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path)
    assert store.checkpoint == f"index/{path.name}"
    assert store._catalog.in_parts
    assert len(store) == 13  # from the header (10) and the newer tables (3)
    assert store._catalog.in_parts
    np.testing.assert_array_equal(store.get("s2"), routes(2))  # reads the checkpoint's rows
    assert not store._catalog.in_parts
    same_as_tables(r3store.open_store(tmp_path), tmp_path)


def test_newer_commit_repeating_an_id_is_found_at_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch)
    commit(tmp_path, ["s4"])  # s4 again: its Bloom filter holds it, so the open reads the rows
    with pytest.raises(DuplicateSampleError, match="s4"):
        r3store.open_store(tmp_path)
    store = r3store.open_store(tmp_path, reader={"on_duplicate": "first"})
    assert not store._catalog.in_parts
    assert len(store) == 13
    assert list(store.duplicates) == ["s4"]
    same_as_tables(store, tmp_path)


def test_filter_reads_the_rows_at_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path, reader={"filter": pc.field("step") == 2})
    assert not store._catalog.in_parts
    assert store.sample_ids == ["s8", "s9", "s10", "s11"]


def test_refresh_after_an_open_in_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path)
    commit(tmp_path, ["s13", "s14"])
    assert len(store) == 13
    assert store.refresh() == 2
    same_as_tables(store, tmp_path)


def rewrite(path: Path, rows: object = None, bloom_empty: bool = False) -> None:
    """Rewrite the checkpoint keeping (or, with ``bloom_empty``, resealing) its header."""
    table = pq.read_table(path)
    kv = dict(table.schema.metadata)
    if callable(rows):
        table = rows(table)
    if bloom_empty:
        kv[b"r3store.bloom"] = base64.b64encode(bytes(len(base64.b64decode(kv[b"r3store.bloom"]))))
        kv[b"r3store.digest"] = _root_digest(kv[b"r3store.version"].decode(), kv[b"r3store.spec"].decode(),
                                             kv[b"r3store.checkpoint"].decode(), kv[b"r3store.bloom"].decode(),
                                             (kv[b"r3store.store_id"].decode(),)).encode()
    pq.write_table(table.replace_schema_metadata(kv), path, row_group_size=4, write_page_checksum=True)


def test_damaged_group_found_on_first_use_warns_and_reads_the_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = compacted(tmp_path, monkeypatch)

    def edit(table: pa.Table) -> pa.Table:  # another route row start in group 1: a different route if used
        i = table.schema.get_field_index("step")
        values = table.column(i).to_pylist()
        values[5] = 7
        return table.set_column(i, table.schema.field(i), pa.array(values, pa.int64()))

    rewrite(path, rows=edit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = r3store.open_store(tmp_path)  # the header is intact: nothing is wrong yet
        assert len(store) == 13
    with pytest.warns(CheckpointWarning, match=r"row group 1 .*sample tables of the commits it covers|row group 1"):
        np.testing.assert_array_equal(store.get("s5"), routes(5))
    assert store.checkpoint is None
    assert store.row("s5")["step"] == 1  # from its sample table
    commit(tmp_path, ["s20"])  # made after the open: not part of this reader's store
    assert "s20" not in store
    with pytest.warns(CheckpointWarning):
        same_as_tables(r3store.open_store(tmp_path, reader={"on_duplicate": "raise"}), tmp_path)


def test_bloom_filter_that_lies_is_caught_when_the_rows_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = compacted(tmp_path, monkeypatch, after=0)
    rewrite(path, bloom_empty=True)  # a resealed header whose filter holds no id
    commit(tmp_path, ["s3"])
    store = r3store.open_store(tmp_path, reader={"on_duplicate": "first"})
    assert store._catalog.in_parts  # the filter said s3 is new
    with pytest.raises(FormatError, match="promised 11 visible samples"):
        store.get("s3")
    store_id = json.loads((tmp_path / "r3store.json").read_text())["store_id"]
    with pytest.raises(FormatError, match="Bloom filter misses"):
        _checkpoint.read_checkpoint(path.read_bytes(), str(path), spec=SPEC, store_id=store_id)


def test_a_cap_below_the_headers_largest_sample_reads_the_rows_at_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch, after=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checkpoint is intact: the cap's error alone, no CheckpointWarning
        with pytest.raises(SampleTooLargeError, match="more than the cap of 2"):
            r3store.open_store(tmp_path, reader={"max_sample_rows": 2})
    assert r3store.open_store(tmp_path, reader={"max_sample_rows": 3})._catalog.in_parts
