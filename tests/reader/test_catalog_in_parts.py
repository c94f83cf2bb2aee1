"""Opening a store from a version 2 checkpoint's header (FORMAT.md section 11): the rows are read
on first use, every check kept; what the header cannot settle is read at open."""

from __future__ import annotations

import base64
import json
import warnings
from datetime import UTC, datetime, timedelta
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
    np.testing.assert_array_equal(store.get("s2"), routes(2))  # reads the group of s2 only (version 3)
    assert store._catalog.in_parts
    assert store.sample_ids[:3] == ["s0", "s1", "s2"]  # needs every row: reads them
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
        store.sample_ids  # noqa: B018  # every row read: the lie is found
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


# -- version 3: a lookup reads only the row group(s) that may hold the id (FORMAT.md section 11.2) --


def test_first_get_reads_only_the_group_holding_the_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch, before=12, after=2)  # 3 groups of 4 one-sample commits
    full = r3store.open_store(tmp_path, reader={"use_checkpoint": False})
    store = r3store.open_store(tmp_path)
    catalog = store._catalog
    pending = catalog._pending
    assert pending is not None
    assert pending.lazy
    np.testing.assert_array_equal(store.get("s5"), routes(5))
    assert set(pending.groups) == {1}  # s5 is row 5: group 1 alone was read and checked
    assert store.num_tokens("s9") == 4
    assert store.row("s9") == full.row("s9")
    assert store.missing_rows("s9") == []
    assert store.policy_spans("s9") == []
    assert store.row("s12") == full.row("s12")  # a newer table's row: no group read
    assert set(pending.groups) == {1, 2}
    assert "s1" in store
    assert "nope" not in store
    with pytest.raises(r3store.errors.SampleNotFoundError):
        store.get("nope")
    assert catalog.in_parts
    assert len(store) == 14
    got = store.get_many(["s0", "s13"])
    np.testing.assert_array_equal(got[1], routes(13))
    assert catalog.in_parts
    same_as_tables(store, tmp_path)  # every row read now: the rows handed out keep their numbers
    assert not catalog.in_parts
    assert store._catalog.locate("s5") == full._catalog.locate("s5")


def test_commit_running_over_a_group_boundary_reads_the_next_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    commit(tmp_path, ["s0", "s1", "s2"])
    commit(tmp_path, ["s3", "s4", "s5"])  # rows 3 to 5: groups 0 and 1
    commit(tmp_path, ["s6", "s7"])
    assert r3store.compact(tmp_path).written
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s3"), routes(3))  # its array's row count needs s4 and s5 too
    pending = store._catalog._pending
    assert pending is not None
    assert set(pending.groups) == {0, 1}
    assert store._catalog.array_rows[store._catalog.array[store._catalog.locate("s3")]] == 9
    same_as_tables(store, tmp_path)


def test_damaged_group_met_by_a_lookup_reads_every_row_and_falls_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = compacted(tmp_path, monkeypatch)

    def edit(table: pa.Table) -> pa.Table:  # group 1 no longer matches its digest
        i = table.schema.get_field_index("step")
        values = table.column(i).to_pylist()
        values[5] = 7
        return table.set_column(i, table.schema.field(i), pa.array(values, pa.int64()))

    rewrite(path, rows=edit)
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s1"), routes(1))  # group 0 is intact
    with pytest.warns(CheckpointWarning, match="row group 1"):
        np.testing.assert_array_equal(store.get("s5"), routes(5))
    assert store.checkpoint is None
    assert not store._catalog.in_parts
    assert store.row("s5")["step"] == 1  # from its sample table
    np.testing.assert_array_equal(store.get("s1"), routes(1))
    same_as_tables(store, tmp_path)


def test_newer_commit_dated_before_the_checkpoint_reads_every_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch, after=0)
    w = r3store.RouteWriter(tmp_path, SPEC)
    w._committer.clock = lambda: datetime.now(UTC) - timedelta(days=1)  # type: ignore[method-assign]  # behind
    w.append("early", routes(1))
    with pytest.warns(r3store.errors.ClockSkewWarning):
        w.close()
    store = r3store.open_store(tmp_path)
    pending = store._catalog._pending
    assert pending is not None
    assert not pending.lazy
    np.testing.assert_array_equal(store.get("early"), routes(1))
    assert not store._catalog.in_parts
    assert store.sample_ids[0] == "early"
    same_as_tables(store, tmp_path)


def test_rows_handed_out_must_keep_their_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch, after=0)
    store = r3store.open_store(tmp_path)
    i = store._catalog.locate("s6")
    pending = store._catalog._pending
    assert pending is not None
    pending.rows[i] = dict(pending.rows[i], row_start=99)  # what a lying checkpoint would have handed out
    with pytest.raises(FormatError, match=r"row 6 was read from its row group as sample 's6'"):
        store.sample_ids  # noqa: B018


def test_version_2_checkpoint_still_reads_every_row_on_first_lookup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_VERSION", 2)
    compacted(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path)
    assert store._catalog.in_parts
    np.testing.assert_array_equal(store.get("s2"), routes(2))
    assert not store._catalog.in_parts
    same_as_tables(store, tmp_path)


def test_any_other_use_of_a_lazy_list_reads_every_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compacted(tmp_path, monkeypatch)
    store = r3store.open_store(tmp_path)
    catalog = store._catalog
    i = catalog.locate("s6")
    assert catalog.num_rows[i] == 3
    assert catalog.in_parts
    assert len(catalog.num_rows) == 13  # a whole-list use: every row read, the row numbers kept
    assert not catalog.in_parts
    assert catalog.array[i] == catalog.samples.column("array")[i].as_py()
