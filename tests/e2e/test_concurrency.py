"""Many writers, crashed writers and long-running writers on a local store."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.audit import collect_garbage

WRITER = Path(__file__).resolve().parents[1] / "procs" / "writer.py"
sys.path.insert(0, str(WRITER.parent))
from writer import SPEC, routes_for  # noqa: E402


def spawn(url: str, first: int, count: int, buffer_bytes: int, rows: int = 300,
          options: dict | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, str(WRITER), url, str(first), str(count), str(buffer_bytes), str(rows)]
    if options is not None:
        args.append(json.dumps(options))
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_intact(store: r3store.RouteStore, rows: int = 300) -> None:
    """Every committed sample is bit-identical to what its writer appended."""
    for sid in store.sample_ids:
        index = int(sid.split("-")[1])
        np.testing.assert_array_equal(store.get(sid), routes_for(index, rows), err_msg=sid)


def test_eight_writer_processes_one_local_store(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    procs = [spawn(url, first=w * 40, count=40, buffer_bytes=200_000) for w in range(8)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    store = r3store.open_store(url)
    assert sorted(store.sample_ids) == [f"sample-{i:06d}" for i in range(320)]
    assert len(set(store.samples.column("writer_id").to_pylist())) == 8
    check_intact(store)


def test_sigkill_mid_write_leaves_store_readable(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    rng = random.Random(1234)
    committed_before = 0
    for attempt in range(8):
        proc = spawn(url, first=attempt * 1000, count=1000, buffer_bytes=int(rng.uniform(100_000, 600_000)))
        # wait until it has flushed at least once, then kill it at a random moment
        line = proc.stdout.readline()
        assert line.startswith("flushed"), proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)  # reap it and close its pipes
        store = r3store.open_store(url)
        assert len(store) > committed_before
        committed_before = len(store)
        check_intact(store)
    leftovers = collect_garbage(url, older_than_s=0)
    assert all(not (Path(url) / "index" / f"{item.commit}.parquet").exists() for item in leftovers)
    collect_garbage(url, older_than_s=0, delete=True)
    after = r3store.open_store(url)
    assert len(after) == committed_before
    check_intact(after)
    assert collect_garbage(url, older_than_s=0) == []


@pytest.mark.slow
def test_writer_memory_is_bounded_by_its_buffer(tmp_path: Path) -> None:
    """Append ~1 GB of int32 routes through a 32 MB buffer: peak RSS grows by buffer + a constant."""
    rows = 4096  # 4096 x 8 layers x top-8 x int32 = 1 MiB per sample
    buffer_bytes = 32 << 20
    proc = spawn(str(tmp_path / "store"), first=0, count=1024, buffer_bytes=buffer_bytes, rows=rows)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    growth = report["peak_bytes"] - report["baseline_bytes"]
    # buffered uint16 ids (buffer_bytes) + one encoded shard object + transient encode/validate arrays
    assert growth < buffer_bytes + (64 << 20), f"RSS grew by {growth / 2**20:.0f} MiB"
    store = r3store.open_store(tmp_path / "store")
    assert len(store) == 1024
    assert len(store.commits) >= 1024 * (1 << 19) // buffer_bytes - 1


def test_gc_never_touches_committed_data(tmp_path: Path) -> None:
    url = tmp_path / "store"
    with r3store.RouteWriter(url, SPEC) as w:
        w.append("keep", routes_for(1, 10))
    # an uncommitted shard: its index is gone
    with r3store.RouteWriter(url, SPEC) as w:
        w.append("lost", routes_for(2, 10))
        shard = w.flush()
    next((url / "index").rglob(f"{shard}.parquet")).unlink()
    assert collect_garbage(url, older_than_s=3600) == []  # too young
    found = collect_garbage(url, older_than_s=0)
    assert [f.commit for f in found] == [shard]
    assert found[0].nbytes > 0
    collect_garbage(url, older_than_s=0, delete=True)
    assert not [p for p in (url / "routes" / shard).rglob("*") if p.is_file()]
    store = r3store.open_store(url)
    assert store.sample_ids == ["keep"]
    np.testing.assert_array_equal(store.get("keep"), routes_for(1, 10))


def test_writer_memory_with_many_open_samples_is_bounded(tmp_path: Path) -> None:
    """48 open multi-turn samples (about 2.7 MiB each, 129 MiB in all) through a 16 MiB buffer:
    peak RSS grows by at most buffer + one sample + a margin, and the finished samples are
    committed in as few commits as the buffer allows (not one per sample)."""
    buffer_bytes = 16 << 20
    script = WRITER.parent / "open_samples.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "store"), "48", "4", "5500",
                           str(buffer_bytes)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    growth = report["growth_bytes"]
    # buffered ids + one sample + one encoded object and transient encode arrays (measured: ~11 MiB)
    assert growth < buffer_bytes + report["sample_bytes"] + (16 << 20), f"RSS grew by {growth / 2**20:.0f} MiB"
    assert report["commits"] <= -(-report["total_bytes"] // buffer_bytes)  # every commit holds a full buffer
    store = r3store.open_store(tmp_path / "store")
    assert len(store) == 48
    assert store.policy_spans("chat-007") == [(0, 5500, 0), (5500, 11000, 1), (11000, 16500, 2), (16500, 22000, 3)]
    expected = np.concatenate([routes_for(t, 5500) for t in range(4)])
    np.testing.assert_array_equal(store.get("chat-031"), expected)


def test_spilled_samples_are_committed_intact_and_scratch_is_removed(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    parts = {i: [routes_for(i * 10 + t, int(rng.integers(1, 50))) for t in range(3)] for i in range(12)}
    spill = tmp_path / "scratch"
    spill.mkdir()
    with r3store.RouteWriter(tmp_path / "store", SPEC, buffer_bytes=20_000, spill_dir=spill) as w:
        for t in range(3):
            for i, turns in parts.items():
                start = sum(len(p) for p in turns[:t])
                w.append(f"c{i}", turns[t], start=start, final=t == 2)
            if t == 1:
                assert w._buffer.spilled_bytes > 0
                assert list(spill.iterdir())
    assert list(spill.iterdir()) == []  # the scratch folder is gone
    store = r3store.open_store(tmp_path / "store")
    for i, turns in parts.items():
        np.testing.assert_array_equal(store.get(f"c{i}"), np.concatenate(turns))
