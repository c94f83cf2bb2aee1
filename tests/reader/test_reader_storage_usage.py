"""``RouteReader.storage_usage`` (and so ``validate``, ``inspect``) never takes a committed route
array for an uncommitted leftover, whatever the reader did not list: a reader that started from
a checkpoint lists only the buckets from its watermark on, and a sample table can lie in an
older bucket (a format 2 writer whose clock was behind), hidden from that reader but committed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import r3store
from r3store.audit import validate

SPEC = r3store.ModelSpec(num_layers=1, num_experts=8, top_k=2)


def _store_with_a_table_older_than_the_watermark(root: Path) -> None:
    with r3store.RouteWriter(root, SPEC) as w:
        w.append("a", np.array([[[1, 2]], [[3, 4]]], np.int32))
    r3store.compact(root)
    with r3store.RouteWriter(root, SPEC, config={"writer_id": "late"}) as w:
        w.append("b", np.array([[[5, 6]]], np.int32))
    (table,) = (root / "index").rglob("late-00000.parquet")
    old = root / "index" / "20200101T00"
    old.mkdir()
    table.rename(old / table.name)


def test_a_commit_hidden_from_the_checkpoint_reader_is_not_a_leftover(tmp_path: Path) -> None:
    _store_with_a_table_older_than_the_watermark(tmp_path)
    store = r3store.open_store(tmp_path)
    assert store.checkpoint is not None
    assert store.sample_ids == ["a"]  # hidden from this reader (validate names it, below)
    usage = store.storage_usage()
    assert usage.uncommitted == {}
    tables = r3store.open_store(tmp_path, reader={"use_checkpoint": False})
    assert usage.route_bytes == tables.storage_usage().route_bytes
    report = validate(store)
    kinds = [f.kind for f in report.findings]
    assert "checkpoint" in kinds
    assert "uncommitted" not in kinds  # "a crashed writer; gc deletes old leftovers" would be wrong


def test_a_real_leftover_is_still_found_by_a_checkpoint_reader(tmp_path: Path) -> None:
    _store_with_a_table_older_than_the_watermark(tmp_path)
    (tmp_path / "routes" / "crashed-00000" / "c").mkdir(parents=True)
    (tmp_path / "routes" / "crashed-00000" / "c" / "0").write_bytes(b"x" * 10)
    assert set(r3store.open_store(tmp_path).storage_usage().uncommitted) == {"crashed-00000"}
