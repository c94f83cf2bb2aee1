"""Checkpoint version 2 (FORMAT.md section 11): row groups with their own digests, a header bound
by a root digest, a Bloom filter of the ids; version 1 checkpoints still read."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store
from r3store._format import _checkpoint, read_checkpoint, read_checkpoint_header
from r3store._format._checkpoint import BloomFilter, _root_digest
from r3store.errors import ChecksumError, FormatError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)
V1_STORE = Path(__file__).parents[1] / "fixtures" / "stores" / "v3-ckpt"


def make_checkpoint(root: Path, samples: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of ``samples`` one-sample commits, compacted into groups of 4 rows (checkpoint version 2:
    version 3 has its own tests below)."""
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    monkeypatch.setattr(_checkpoint, "CHECKPOINT_VERSION", 2)
    for i in range(samples):
        with r3store.RouteWriter(root, SPEC) as w:
            w.append(f"s{i}", np.tile(np.array([i % 8, 8 + i % 8]), (3, 2, 1)).astype(np.int32),
                     metadata={"index": i})
    result = r3store.compact(root)
    assert result.key is not None
    return root / result.key


def rewrite(path: Path, rows: object = None, header: object = None, reseal: bool = False) -> None:
    """Rewrite a checkpoint in place: ``rows(table) -> table``, ``header(doc) -> doc``; the root
    digest kept as it was unless ``reseal`` (then recomputed: an attacker who knows the format)."""
    table = pq.read_table(path)
    kv = dict(table.schema.metadata)
    if callable(rows):
        table = rows(table)
    if callable(header):
        doc = header(json.loads(kv[b"r3store.checkpoint"]))
        kv[b"r3store.checkpoint"] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    if reseal:
        ident = (kv[b"r3store.store_id"].decode(),) if b"r3store.store_id" in kv else ()
        kv[b"r3store.digest"] = _root_digest(kv[b"r3store.version"].decode(), kv[b"r3store.spec"].decode(),
                                             kv[b"r3store.checkpoint"].decode(), kv[b"r3store.bloom"].decode(),
                                             ident).encode()
    pq.write_table(table.replace_schema_metadata(kv), path, row_group_size=4, write_page_checksum=True)


def read(path: Path) -> tuple[pa.Table, object]:
    store_id = json.loads((path.parents[1] / "r3store.json").read_text())["store_id"]
    return read_checkpoint(path.read_bytes(), str(path), spec=SPEC, store_id=store_id)


def header_of(path: Path) -> _checkpoint.CheckpointHeader | None:
    store_id = json.loads((path.parents[1] / "r3store.json").read_text())["store_id"]
    return read_checkpoint_header(path.read_bytes(), str(path), spec=SPEC, store_id=store_id)


def test_header_lists_each_group_and_what_an_open_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_checkpoint(tmp_path, 10, monkeypatch)
    header = header_of(path)
    assert header is not None
    assert [rows for rows, _ in header.groups] == [4, 4, 2]
    assert (header.rows, header.visible, header.commits, header.unique_ids) == (10, 10, 10, True)
    assert header.recent == header.info.commits  # every table lies in the current hour: all are recent
    assert len(header.recent) == 10
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    table, _ = read(path)
    assert table.num_rows == 10
    assert header.bloom.hits(table.column("sample_id").to_pylist()) == [f"s{i}" for i in range(10)]


def _row_5_index_99(table: pa.Table) -> pa.Table:
    """The table with row 5's ``index`` set to 99 (a change inside row group 1 of 4-row groups)."""
    i = table.schema.get_field_index("index")
    values = table.column(i).to_pylist()
    values[5] = 99
    return table.set_column(i, table.schema.field(i), pa.array(values, pa.int64()))


def test_damaged_group_is_named_and_the_header_still_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_checkpoint(tmp_path, 10, monkeypatch)

    rewrite(path, rows=_row_5_index_99)
    assert header_of(path) is not None  # the header and root digest are intact
    with pytest.raises(ChecksumError, match=r"row group 1 \(rows 4 to 7\)"):
        read(path)


def test_edited_header_fails_the_root_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_checkpoint(tmp_path, 6, monkeypatch)
    rewrite(path, header=lambda doc: dict(doc, visible=5))
    with pytest.raises(ChecksumError, match="root digest"):
        header_of(path)


@pytest.mark.parametrize(("edit", "fault"), [
    (lambda doc: dict(doc, visible=5), "header says 5 visible rows"),
    (lambda doc: dict(doc, unique_ids=False), "unique_ids=False"),
    (lambda doc: dict(doc, recent=["zz-00000"]), "recent commit 'zz-00000'"),
    (lambda doc: dict(doc, rows=7, groups=[[4, doc["groups"][0][1]], [3, doc["groups"][1][1]]]), "holds 6 rows"),
])
def test_resealed_header_that_lies_is_refused_when_the_rows_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object, fault: str) -> None:
    path = make_checkpoint(tmp_path, 6, monkeypatch)
    rewrite(path, header=edit, reseal=True)
    assert header_of(path) is not None
    with pytest.raises(FormatError, match=fault):
        read(path)


def test_bloom_filter_missing_an_id_is_refused_when_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_checkpoint(tmp_path, 6, monkeypatch)
    table = pq.read_table(path)
    kv = dict(table.schema.metadata)
    kv[b"r3store.bloom"] = base64.b64encode(bytes(len(base64.b64decode(kv[b"r3store.bloom"]))))  # holds no id
    pq.write_table(table.replace_schema_metadata(kv), path, row_group_size=4, write_page_checksum=True)
    rewrite(path, reseal=True)
    with pytest.raises(FormatError, match="Bloom filter misses"):
        read(path)


def test_version_1_checkpoint_has_no_header_and_reads_whole() -> None:
    key = next(p for p in (V1_STORE / "index").iterdir() if p.suffix == ".checkpoint")
    store_id = json.loads((V1_STORE / "r3store.json").read_text())["store_id"]
    spec = r3store.open_store(V1_STORE).spec
    assert read_checkpoint_header(key.read_bytes(), str(key), spec=spec, store_id=store_id) is None
    table, info = read_checkpoint(key.read_bytes(), str(key), spec=spec, store_id=store_id)
    assert table.num_rows == 3
    assert len(info.commits) == 1


def test_bloom_filter_holds_its_ids_and_few_others() -> None:
    ids = [f"id-{i}" for i in range(2000)]
    bloom = BloomFilter.build(ids, 16 * 2000, 11)
    assert bloom.hits(ids) == ids
    others = [f"other-{i}" for i in range(20000)]
    assert len(bloom.hits(others)) < 40  # about 0.05% expected (10 of 20,000)
    assert BloomFilter.build([], 1024, 11).hits(ids) == []


# -- checkpoint version 3 (FORMAT.md section 11.2): a Bloom filter per row group, the last row's key --


def make_v3(root: Path, samples: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_checkpoint, "GROUP_ROWS", 4)
    for i in range(samples):
        with r3store.RouteWriter(root, SPEC) as w:
            w.append(f"s{i}", np.tile(np.array([i % 8, 8 + i % 8]), (3, 2, 1)).astype(np.int32),
                     metadata={"index": i})
    result = r3store.compact(root)
    assert result.key is not None
    return root / result.key


def test_v3_header_gives_each_groups_filter_and_the_last_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_v3(tmp_path, 10, monkeypatch)
    header = header_of(path)
    assert header is not None
    assert header.layout == 3
    assert header.group_blooms is not None
    assert [rows for rows, _ in header.groups] == [4, 4, 2]
    assert [len(b.bits) * 64 for b in header.group_blooms.filters] == [128, 128, 64]  # 20 bits per row, >= 64
    for i in range(10):
        assert i // 4 in header.group_blooms.groups_of(f"s{i}")
    table, _ = read(path)
    assert header.last is not None
    assert header.last[1] == table.column("commit")[-1].as_py()
    assert header.bloom.hits([f"s{i}" for i in range(10)]) == [f"s{i}" for i in range(10)]


def test_v3_groups_read_alone_and_a_damaged_one_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_v3(tmp_path, 10, monkeypatch)

    rewrite(path, rows=_row_5_index_99)
    header = header_of(path)
    assert header is not None
    buf = path.read_bytes()
    rows = _checkpoint.read_checkpoint_groups(buf, str(path), header, [2], version=3)
    assert rows.column("sample_id").to_pylist() == ["s8", "s9"]
    with pytest.raises(ChecksumError, match=r"row group 1 \(rows 4 to 7\)"):
        _checkpoint.read_checkpoint_groups(buf, str(path), header, [1], version=3)
    with pytest.raises(FormatError, match="not consecutive"):
        _checkpoint.read_checkpoint_groups(buf, str(path), header, [0, 2], version=3)


def test_v3_rows_out_of_store_order_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_v3(tmp_path, 6, monkeypatch)
    table, _ = read(path)
    kv = pq.read_schema(path).metadata
    listed_at = datetime.fromisoformat(json.loads(kv[b"r3store.checkpoint"])["created_at"])
    store_id = kv[b"r3store.store_id"].decode()
    path.write_bytes(_checkpoint.write_checkpoint(table.take(list(range(5, -1, -1))), kv[b"r3store.spec"].decode(),
                                                  listed_at=listed_at, store_id=store_id))
    header = header_of(path)
    assert header is not None
    with pytest.raises(FormatError, match="not in store order"):
        read(path)
    with pytest.raises(FormatError, match="not in store order"):
        _checkpoint.read_checkpoint_groups(path.read_bytes(), str(path), header, [0], version=3)


@pytest.mark.parametrize(("edit", "fault"), [
    (lambda doc: dict(doc, last=[1, doc["last"][1]]), "its rows end with"),
    (lambda doc: dict(doc, groups=[[*g[:2], g[2] + 64] for g in doc["groups"]]), "Bloom filters hold"),
    (lambda doc: dict(doc, last="s"), "last must be"),
])
def test_v3_header_that_lies_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object,
                                        fault: str) -> None:
    path = make_v3(tmp_path, 6, monkeypatch)
    rewrite(path, header=edit, reseal=True)
    with pytest.raises(FormatError, match=fault):
        read(path)  # the header's own checks, or (last) the rows'


def test_v3_header_whose_row_groups_are_not_the_files_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_v3(tmp_path, 6, monkeypatch)
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=3, write_page_checksum=True)  # the header lists groups of 4 and 2
    with pytest.raises(FormatError, match="row groups of"):
        header_of(path)
