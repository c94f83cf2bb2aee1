"""Issue 22 item 2: ``validate`` names a commit hidden from checkpoint readers.

A sample table in a bucket older than a checkpoint's watermark, not covered by it (what a
format 2 writer whose clock was behind could leave), was reported as "uncommitted"; it is a
finding on the checkpoint that names the commit and the cause.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import r3store
from r3store.audit import validate

SPEC = r3store.ModelSpec(num_layers=1, num_experts=8, top_k=2)


def test_a_table_older_than_the_watermark_is_named(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", np.array([[[1, 2]], [[3, 4]]], np.int32))
    r3store.compact(tmp_path)
    with r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": "late"}) as w:
        w.append("b", np.array([[[5, 6]]], np.int32))
    (table,) = (tmp_path / "index").rglob("late-00000.parquet")
    old = tmp_path / "index" / "20200101T00"
    old.mkdir()
    table.rename(old / table.name)  # where a writer 2 h behind, with no store-time check, put it
    assert r3store.open_store(tmp_path).sample_ids == ["a"]  # hidden from the checkpoint reader
    report = validate(r3store.open_store(tmp_path, reader={"use_checkpoint": False}))
    (finding,) = [f for f in report.findings if f.kind == "checkpoint"]
    assert "'late-00000'" in finding.detail
    assert "older than its watermark" in finding.detail
    assert not [f for f in report.findings if f.kind == "uncommitted"]
