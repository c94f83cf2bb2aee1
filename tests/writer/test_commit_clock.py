"""Issue 22 item 2: no acknowledged sample is invisible to a default reader, whatever the writer's clock.

A writer whose clock was 2 h behind acknowledged a commit whose sample table landed in a
bucket older than the checkpoint's watermark: readers using the checkpoint (the default)
never listed it. The rule (FORMAT.md section 12.2): before acknowledging, the writer
compares its table's bucket with the store's timestamp of the table and, if a checkpoint
taken just before it landed could skip that bucket, writes the same bytes again under the
bucket of the store's time. A compaction takes the earlier of its clock and the store's.
The clock is injected through :attr:`r3store.WriterConfig.clock` (a documented seam).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.audit import validate
from r3store.errors import ClockSkewWarning, OptionError

SPEC = r3store.ModelSpec(num_layers=1, num_experts=8, top_k=2)


def _routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(8)[:2] for _ in range(rows)]).reshape(rows, 1, 2).astype(np.int32)


def _skewed(offset: dt.timedelta) -> r3store.WriterConfig:
    return r3store.WriterConfig(clock=lambda: dt.datetime.now(dt.UTC) + offset)


def test_a_writer_two_hours_behind_is_seen_by_checkpoint_readers(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("early", _routes(4, 0))
    assert r3store.compact(tmp_path).written  # watermark: this hour (or the last one)
    writer = r3store.RouteWriter(tmp_path, SPEC, _skewed(-dt.timedelta(hours=2)))
    writer.append("late", _routes(5, 1))
    with pytest.warns(ClockSkewWarning, match="120 min behind"):
        writer.flush()  # acknowledged: it must be visible to every reader from now on
    writer.close()
    store = r3store.open_store(tmp_path)  # the default: starts from the checkpoint
    assert store.checkpoint is not None
    assert sorted(store.sample_ids) == ["early", "late"]  # store order follows committed_at (the writer's clock)
    np.testing.assert_array_equal(store.get("late"), _routes(5, 1))
    assert sorted(r3store.open_store(tmp_path, reader={"use_checkpoint": False}).sample_ids) == ["early", "late"]
    tables = sorted(p.parent.name for p in (tmp_path / "index").rglob(f"{writer.commits[0]}.parquet"))
    assert len(tables) == 2  # the writer's bucket and the store time's: byte-identical, counted once
    assert validate(store).counts == {}


def test_a_writer_ahead_of_the_store_needs_no_move(tmp_path: Path) -> None:
    r3store.RouteWriter(tmp_path, SPEC).close()
    with r3store.RouteWriter(tmp_path, SPEC, _skewed(dt.timedelta(hours=3))) as w:
        w.append("a", _routes(3, 2))
    assert len(list((tmp_path / "index").rglob("*.parquet"))) == 1
    r3store.compact(tmp_path)
    assert r3store.open_store(tmp_path).sample_ids == ["a"]


def test_a_compaction_whose_clock_is_ahead_keeps_later_commits_visible(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", _routes(3, 3))
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    result = r3store.compact(tmp_path, clock=lambda: ahead)
    assert result.watermark is not None
    assert result.watermark <= r3store._format.bucket_of(dt.datetime.now(dt.UTC))  # the store's time, not the clock's
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("b", _routes(3, 4))
    assert r3store.open_store(tmp_path).sample_ids == ["a", "b"]


def test_the_clock_seam_is_checked() -> None:
    with pytest.raises(OptionError, match="clock"):
        r3store.WriterConfig(clock="now")  # type: ignore[arg-type]
