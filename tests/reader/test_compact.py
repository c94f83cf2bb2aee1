"""Checkpoints (``r3store compact``), ``filter=`` and ``refresh()`` on growing stores."""

from __future__ import annotations

import subprocess
import sys
import threading
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

import r3store
from r3store._format import bucket_of
from r3store.errors import CheckpointWarning, OptionError
from r3store.reader import checkpoint_keys, filter_samples
from r3store.storage import open_backend
from r3store.testing.s3 import S3Counter

WRITER = Path(__file__).resolve().parents[1] / "procs" / "writer.py"
SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def routes(i: int, rows: int = 5) -> np.ndarray:
    base = (np.arange(rows)[:, None, None] + i + np.arange(SPEC.num_layers)[None, :, None]) % 8
    return (base + np.array([0, 8])).astype(np.int32)


def write_commits(url: str, first: int, count: int, *, per_commit: int = 2, step: int | None = None,
                  storage_options: dict[str, Any] | None = None) -> None:
    """``count`` commits of ``per_commit`` samples each (ids ``s<i>``), one writer per commit."""
    for c in range(count):
        with r3store.RouteWriter(url, SPEC, storage_options=storage_options) as w:
            for k in range(per_commit):
                i = first + c * per_commit + k
                meta = {"index": i} if step is None else {"index": i, "step": step}
                w.append(f"s{i}", routes(i), metadata=meta)


def test_compact_then_open_reads_checkpoint_and_newer_tables(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    write_commits(url, 0, 5)
    result = r3store.compact(url)
    assert result.written
    assert result.commits == 5
    assert result.samples == 10
    assert r3store.compact(url).written is False  # nothing new: the checkpoint already covers all
    write_commits(url, 10, 2)
    store = r3store.open_store(url)
    assert store.checkpoint == result.key
    full = r3store.open_store(url, reader={"use_checkpoint": False})
    assert full.checkpoint is None
    assert store.sample_ids == full.sample_ids == [f"s{i}" for i in range(14)]
    assert store.samples.equals(full.samples)
    assert store.commits == full.commits
    for sid in store.sample_ids:
        np.testing.assert_array_equal(store.get(sid), routes(int(sid[1:])))
    second = r3store.compact(url)
    assert second.written
    assert second.commits == 7
    assert checkpoint_keys(open_backend(url))[0] == second.key


def test_compaction_racing_four_writers_and_a_second_compaction(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    per_writer = 40
    procs = [subprocess.Popen([sys.executable, str(WRITER), url, str(w * per_writer), str(per_writer), "1", "3"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for w in range(4)]
    written: list[str] = []
    errors: list[BaseException] = []

    def compactor() -> None:
        try:
            while any(p.poll() is None for p in procs):
                if Path(url, "r3store.json").exists():
                    result = r3store.compact(url)
                    if result.written and result.key is not None:
                        written.append(result.key)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=compactor) for _ in range(2)]
    for t in threads:
        t.start()
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(written) >= 2  # compactions ran while writers committed
    expected = [f"sample-{i:06d}" for i in range(4 * per_writer)]
    store = r3store.open_store(url)  # on_duplicate="raise": a row counted twice would raise
    assert sorted(store.sample_ids) == expected
    full = r3store.open_store(url, reader={"use_checkpoint": False})
    assert store.samples.sort_by("sample_id").equals(full.samples.sort_by("sample_id"))
    backend = open_backend(url)
    for key in checkpoint_keys(backend):  # every checkpoint, as a starting point, gives the same store
        from r3store.reader import load_checkpoint

        manifest = store._catalog.manifest
        loaded = load_checkpoint(backend, manifest, keys=[key])
        assert loaded is not None
        rows = loaded.table.column("sample_id").to_pylist()
        assert len(rows) == len(set(rows))  # nothing twice within a checkpoint
        reader = r3store.RouteReader(backend, manifest,
                                     preloaded=r3store.reader.Preloaded(loaded.table, loaded.info.commits))
        assert sorted(reader.sample_ids) == expected, key
    final = r3store.compact(url)  # the newest checkpoint covers every commit (or this one does)
    assert final.commits == len(full.commits)
    assert final.samples == len(expected)


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":  # bit flips spread over the file: about a quarter of single bytes (Parquet page-header
        for i in range(1, 9):  # statistics, unused footer fields) change nothing a reader decodes, and are accepted
            data[len(data) * i // 9] ^= 0x40
        path.write_bytes(bytes(data))
    else:  # a partial write
        path.write_bytes(bytes(data[: len(data) // 2]))


@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_damaged_checkpoint_falls_back_with_a_warning(tmp_path: Path, how: str) -> None:
    url = tmp_path / "store"
    write_commits(str(url), 0, 3)
    older = r3store.compact(url)
    write_commits(str(url), 6, 2)
    newer = r3store.compact(url)
    assert newer.key is not None
    assert older.key is not None
    damage(url / newer.key, how)
    with pytest.warns(CheckpointWarning, match=newer.key.split("/")[1]):
        store = r3store.open_store(url)
    assert store.checkpoint == older.key  # the next older valid one
    assert store.sample_ids == [f"s{i}" for i in range(10)]
    damage(url / older.key, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = r3store.open_store(url)
    assert sum(isinstance(w.message, CheckpointWarning) for w in caught) == 2
    assert store.checkpoint is None  # from the sample tables
    assert store.sample_ids == [f"s{i}" for i in range(10)]


def test_checkpoint_of_another_spec_is_ignored(tmp_path: Path) -> None:
    url = tmp_path / "store"
    write_commits(str(url), 0, 2)
    other = tmp_path / "other"
    with r3store.RouteWriter(other, r3store.ModelSpec(num_layers=2, num_experts=16, top_k=1)) as w:
        w.append("x", np.zeros((3, 2, 1), np.int32))
    key = r3store.compact(other).key
    assert key is not None
    (url / key).write_bytes((other / key).read_bytes())
    with pytest.warns(CheckpointWarning, match="ModelSpec|of another store"):  # format v3: the identity differs too
        store = r3store.open_store(url)
    assert store.sample_ids == ["s0", "s1", "s2", "s3"]


def test_filter_equals_full_scan_filtered(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    for step in range(4):
        write_commits(url, step * 10, 2, step=step)
    write_commits(url, 100, 1)  # no step column in this commit
    r3store.compact(url)
    for step in range(4, 6):
        write_commits(url, step * 10, 2, step=step)
    full = r3store.open_store(url, reader={"use_checkpoint": False})
    for expr in [pc.field("step") == 2, pc.field("step") == 5, pc.field("step") >= 3,
                 pc.field("index") < 5, pc.field("sample_id") == "s100", pc.field("step") == 99]:
        want = filter_samples(full.samples, expr)
        for use in (True, False):
            got = r3store.open_store(url, reader={"filter": expr, "use_checkpoint": use})
            assert got.samples.column("sample_id").to_pylist() == want.column("sample_id").to_pylist(), (expr, use)
            assert got.sample_ids == want.column("sample_id").to_pylist()
    store = r3store.open_store(url, reader={"filter": pc.field("step") == 5})
    assert store.checkpoint is not None
    np.testing.assert_array_equal(store.get("s50"), routes(50))
    with pytest.raises(OptionError, match="filter"):
        r3store.open_store(url, reader={"filter": pc.field("nope") == 1})
    with pytest.raises(OptionError, match="filter"):
        r3store.open_store(url, reader={"filter": "step == 1"})  # type: ignore[arg-type]


def test_refresh_picks_up_new_commits(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    write_commits(url, 0, 2, step=0)
    store = r3store.open_store(url)
    step1 = r3store.open_store(url, reader={"filter": pc.field("step") == 1})  # nothing yet: a trainer waits for it
    assert len(store) == 4
    assert len(step1) == 0
    assert store.refresh() == 0
    write_commits(url, 10, 2, step=1)
    assert store.refresh() == 4
    assert len(store) == 8
    assert step1.refresh() == 4
    assert step1.sample_ids == ["s10", "s11", "s12", "s13"]
    np.testing.assert_array_equal(store.get("s13"), routes(13))
    r3store.compact(url)
    write_commits(url, 20, 1, step=2)
    with_ckpt = r3store.open_store(url)
    write_commits(url, 30, 1, step=3)
    assert store.refresh() == 4
    assert with_ckpt.refresh() == 2
    full = r3store.open_store(url, reader={"use_checkpoint": False})
    assert store.sample_ids == with_ckpt.sample_ids == full.sample_ids
    subset = r3store.open_store(url, reader={"commits": store.commits[:1]})
    with pytest.raises(OptionError, match="refresh"):
        subset.refresh()


def test_cli_compact(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from r3store.cli._main import main

    url = str(tmp_path / "store")
    write_commits(url, 0, 3)
    result = CliRunner().invoke(main, ["compact", url])
    assert result.exit_code == 0, result.output
    assert "3 commits" in result.output
    result = CliRunner().invoke(main, ["compact", url, "--json"])
    assert result.exit_code == 0
    assert '"written": false' in result.output


@pytest.mark.s3
def test_open_after_compact_on_s3_is_five_requests_plus_one_per_new_commit(
        s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter) -> None:
    write_commits(s3_url, 0, 12, per_commit=1, storage_options=s3_storage_options)
    before = datetime.now(UTC)
    result = r3store.compact(s3_url, storage_options=s3_storage_options)
    assert result.written
    assert result.commits == 12
    new = 3
    write_commits(s3_url, 100, new, per_commit=1, storage_options=s3_storage_options)
    s3_counter.reset()
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    log = list(s3_counter.log)
    assert store.checkpoint == result.key
    assert len(store) == 12 + new
    # manifest, one delimited listing of index/ (checkpoints and buckets), the checkpoint, one listing per
    # bucket from the watermark on (one, or two in the first 15 minutes of an hour), one GET per new table
    extra_bucket = int(result.watermark != bucket_of(before))
    assert len(log) <= 4 + new + extra_bucket, [(r.method, r.key, r.range) for r in log]
    gets = [r for r in log if r.method == "GET" and not r.is_listing and r.key.endswith(".parquet")]
    assert len(gets) == new
    s3_counter.reset()
    full = r3store.open_store(s3_url, storage_options=s3_storage_options, reader={"use_checkpoint": False})
    assert len(s3_counter.log) >= 12 + new  # without the checkpoint: one GET per table
    assert full.sample_ids == store.sample_ids


def test_validate_checks_checkpoints_against_the_tables(tmp_path: Path) -> None:
    from r3store.audit import validate
    from r3store.testing.forge import reseal_table

    url = tmp_path / "store"
    write_commits(str(url), 0, 3)
    key = r3store.compact(url).key
    assert key is not None
    report = validate(r3store.open_store(url, reader={"on_duplicate": "report"}))
    assert not [f for f in report.findings if f.kind == "checkpoint"]
    # a sample table changed after compaction (resealed: its own checks pass): the checkpoint disagrees
    table = sorted((url / "index").rglob("*.parquet"))[0]
    table.write_bytes(reseal_table(table.read_bytes(), lambda t: t.set_column(
        t.schema.get_field_index("index"), "index", pc.add(t.column("index"), 1000))))
    report = validate(r3store.open_store(url, reader={"on_duplicate": "report"}))
    found = [f for f in report.findings if f.kind == "checkpoint"]
    assert len(found) == 1
    assert "'index'" in found[0].detail
    assert found[0].severity == "error"
    damage(url / key, "flip")
    with pytest.warns(CheckpointWarning):
        store = r3store.open_store(url, reader={"on_duplicate": "report"})
    found = [f for f in validate(store).findings if f.kind == "checkpoint"]
    assert len(found) == 1
    assert "checkpoint ignored" in found[0].detail


def test_gc_keeps_tables_and_the_newest_checkpoints(tmp_path: Path) -> None:
    from r3store.audit import collect_garbage

    url = tmp_path / "store"
    keys = []
    for c in range(4):
        write_commits(str(url), c * 2, 1)
        keys.append(r3store.compact(url).key)
    found = collect_garbage(url, older_than_s=0, delete=True)
    assert sorted(f.commit for f in found) == sorted(keys[:2])
    assert sorted(checkpoint_keys(open_backend(url))) == sorted(keys[2:])
    store = r3store.open_store(url)
    assert store.checkpoint == keys[3]
    assert len(store) == 8
    assert len(r3store.open_store(url, reader={"use_checkpoint": False})) == 8


@pytest.mark.s3
def test_prefetch_reads_a_batch_of_many_commits_up_front(s3_url: str, s3_storage_options: dict[str, Any],
                                                         s3_counter: S3Counter) -> None:
    write_commits(s3_url, 0, 12, per_commit=1, storage_options=s3_storage_options)
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    ids = store.sample_ids
    s3_counter.reset()
    store.prefetch(ids)
    fetched = len(s3_counter.log)
    assert fetched == 2 * 12  # a document and an object index per commit, fetched concurrently
    s3_counter.reset()
    batch = store.assemble(ids)
    assert len(s3_counter.log) == 12  # then only the frames: one ranged read per commit's object
    cu = batch["cu_seqlens"]
    for j, sid in enumerate(ids):
        np.testing.assert_array_equal(batch["routes"][cu[j] : cu[j + 1] - 1], routes(int(sid[1:])))
