"""r3store on S3, against moto on loopback: no mocked client anywhere.

URLs and storage options end to end (writer, reader, dataset, CLI, environment
variables), remote reads counted request by request and byte by byte, the read-through
cache, retries of injected faults and the errors of permanent ones, and writer processes
running concurrently or killed mid-write.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch.utils.data import DataLoader

import r3store
from r3store._format import is_immutable_key
from r3store.audit import collect_garbage
from r3store.cli import main
from r3store.errors import NotAStoreError, ObjectNotFoundError, StorageError
from r3store.storage import Backend, CachingBackend, FsspecBackend, SuffixByteRange, open_backend
from r3store.testing import BackendTests
from r3store.testing.s3 import ACCESS_KEY, REGION, SECRET_KEY, MotoServer, S3Counter, clear_s3fs_cache

pytestmark = pytest.mark.s3

WRITER = Path(__file__).resolve().parents[1] / "procs" / "writer.py"
sys.path.insert(0, str(WRITER.parent))
from writer import SPEC, routes_for  # noqa: E402

NUM_SAMPLES = 50


def rows_of(index: int) -> int:
    return 100 + 7 * index


@pytest.fixture
def fifty(s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter) -> dict[str, int]:
    """50 samples (100 to 443 rows) committed as one shard: one storage object of
    256-row x 1-layer inner chunks. Returns rows by sample id; the counter is zeroed."""
    with r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options, chunk_rows=256,
                             layers_per_chunk=1) as w:
        for i in range(NUM_SAMPLES):
            w.append(f"sample-{i:06d}", routes_for(i, rows_of(i)), metadata={"index": i})
    s3_counter.reset()
    return {f"sample-{i:06d}": rows_of(i) for i in range(NUM_SAMPLES)}


def check_intact(store: r3store.RouteStore, rows: int | None = None) -> None:
    """Every committed sample is bit-identical to what its writer appended."""
    for sid in store.sample_ids:
        index = int(sid.split("-")[1])
        expected = routes_for(index, rows if rows is not None else rows_of(index))
        np.testing.assert_array_equal(store.get(sid), expected, err_msg=sid)


def frame_bytes(store: r3store.RouteStore, sample_id: str, layers: list[int] | None = None) -> int:
    """Bytes of the inner chunks (frames) that hold ``sample_id``'s rows at ``layers``,
    from the shard index (the upper bound of what a read of that sample may fetch)."""
    row = store.row(sample_id)
    layout = store.geometry_of(row["array"])
    assert layout.num_objects == 1
    index = store._chunks.object_index(row["array"], layout, 0)  # (row chunk, layer chunk, (offset, nbytes))
    cr, lpc = layout.chunk_rows, layout.layers_per_chunk
    layer_chunks = sorted({p // lpc for p in store.spec.layer_positions(layers)})
    row_chunks = range(row["row_start"] // cr, (row["row_start"] + row["num_rows"] - 1) // cr + 1)
    return sum(int(index[c, b, 1]) for c in row_chunks for b in layer_chunks)


# -- URLs, objects, request counts ------------------------------------------------------


def test_s3_url_round_trip_in_few_objects(fifty: dict[str, int], s3_url: str,
                                          s3_storage_options: dict[str, Any]) -> None:
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    assert sorted(store.sample_ids) == sorted(fifty)
    check_intact(store)
    np.testing.assert_array_equal(store.get("sample-000003", [2, 5], rows=slice(10, 20)),
                                  routes_for(3, rows_of(3))[10:20, [2, 5]])
    # one commit = one storage object of routes + its array metadata + its sample table
    (shard,) = store.commits
    (table,) = store.backend.list_prefix("index/")
    assert re.fullmatch(rf"index/\d{{8}}T\d{{2}}/{shard}\.parquet", table)  # index/<bucket>/<commit>.parquet
    assert store.backend.list_prefix("") == sorted([
        "r3store.json", "zarr.json", "routes/zarr.json", f"routes/{shard}/zarr.json",
        f"routes/{shard}/c/0/0/0", table,
    ])


def test_open_is_manifest_listing_and_one_get_per_shard(fifty: dict[str, int], s3_url: str,
                                                        s3_storage_options: dict[str, Any],
                                                        s3_counter: S3Counter) -> None:
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    log = list(s3_counter.log)
    (table,) = store.backend.list_prefix("index/")
    assert [(r.method, r.key, r.range) for r in log if not r.is_listing] == [
        ("GET", "store/r3store.json", None), ("GET", f"store/{table}", None),
    ]
    # one delimited listing of index/ (checkpoints and buckets: none here), one listing of the tables
    assert sum(r.is_listing for r in log) == 2
    assert len(log) == 4
    s3_counter.reset()
    r3store.open_store(s3_url, storage_options=s3_storage_options, use_checkpoint=False)
    assert sum(r.is_listing for r in s3_counter.log) == 1
    assert len(s3_counter.log) == 3


def test_one_sample_read_fetches_only_its_chunks(fifty: dict[str, int], s3_url: str,
                                                 s3_storage_options: dict[str, Any],
                                                 s3_counter: S3Counter) -> None:
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    (shard,) = store.commits
    chunk_key = f"store/routes/{shard}/c/0/0/0"
    s3_counter.reset()
    sid = "sample-000025"
    np.testing.assert_array_equal(store.get(sid), routes_for(25, rows_of(25)))
    log = list(s3_counter.log)

    layout = store.geometry_of(f"routes/{shard}")
    needed = frame_bytes(store, sid)
    object_size = store.backend.info(f"routes/{shard}/c/0/0/0").size
    assert [r.method for r in log] == ["GET"] * 3, log
    assert (log[0].method, log[0].key, log[0].range) == ("GET", f"store/routes/{shard}/zarr.json", None)
    index_read = (chunk_key, f"bytes=-{layout.index_nbytes}", layout.index_nbytes)
    assert (log[1].key, log[1].range, log[1].nbytes) == index_read
    assert log[2].key == chunk_key
    assert log[2].range is not None
    assert log[2].nbytes == needed
    assert s3_counter.bytes_sent <= needed + layout.index_nbytes + log[0].nbytes
    assert needed < object_size / 10  # the other 49 samples' chunks stay on the server

    # the next sample of the same shard: one request for its frames (the layout and the
    # shard index are kept; a row chunk shared with sample 25 is still decoded in memory)
    s3_counter.reset()
    store.get("sample-000026")
    (request,) = s3_counter.log
    assert request.key == chunk_key
    assert 0 < request.nbytes <= frame_bytes(store, "sample-000026")

    # a pipeline stage's layers: only those layer chunks
    store.clear_cache()
    s3_counter.reset()
    stage = [4, 5]
    np.testing.assert_array_equal(store.get(sid, stage), routes_for(25, rows_of(25))[:, stage])
    frames = [r for r in s3_counter.log if r.key == chunk_key and not (r.range or "").startswith("bytes=-")]
    # the holes between its layer chunks (other layers' frames) are read through: one request
    assert len(frames) == 1
    assert frame_bytes(store, sid, stage) < sum(r.nbytes for r in frames) <= needed
    # without reading through holes: only those layer chunks, one request per row chunk
    store.clear_cache()
    store.backend.coalesce_gap = 0
    s3_counter.reset()
    np.testing.assert_array_equal(store.get(sid, stage), routes_for(25, rows_of(25))[:, stage])
    frames = [r for r in s3_counter.log if r.key == chunk_key and not (r.range or "").startswith("bytes=-")]
    assert sum(r.nbytes for r in frames) == frame_bytes(store, sid, stage) < needed / 3


def test_suffix_whole_and_exists_are_one_request_each(s3_url: str, s3_storage_options: dict[str, Any],
                                                      s3_counter: S3Counter) -> None:
    store = open_backend(s3_url, s3_storage_options)
    for key in ("a", "b", "c"):
        store.set(key, key.encode() * 1000)
    s3_counter.reset()
    assert bytes(store.get("a", SuffixByteRange(10))) == b"a" * 10
    assert bytes(store.get("b")) == b"b" * 1000
    assert store.get_many(["a", "b", "c"]) == {k: k.encode() * 1000 for k in "abc"}
    assert store.exists("c")
    assert not store.exists("missing")
    assert [(r.method, r.key, r.range) for r in s3_counter.log[:2]] == [
        ("GET", "store/a", "bytes=-10"), ("GET", "store/b", None),
    ]
    assert s3_counter.heads == 0
    assert s3_counter.requests == 2 + 3 + 2


def test_exists_and_info_see_another_writers_object(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    """A listing cached by s3fs must not hide an object another process wrote since
    (``r3store gc`` re-checks a shard's commit right before deleting its arrays)."""
    reader = open_backend(s3_url, s3_storage_options)
    other = open_backend(s3_url, {**s3_storage_options, "skip_instance_cache": True})
    reader.set("index/old.parquet", b"x")
    assert reader.list_prefix("index/") == ["index/old.parquet"]  # s3fs caches this listing
    other.set("index/new.parquet", b"yy")
    assert reader.exists("index/new.parquet")
    assert reader.info("index/new.parquet").size == 2
    assert reader.list_prefix("index/") == ["index/new.parquet", "index/old.parquet"]


def test_set_if_absent_has_one_winner_on_s3(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    """The manifest is created with a conditional PUT (If-None-Match: *), so racing writers agree."""
    stores = [open_backend(s3_url, {**s3_storage_options, "skip_instance_cache": True}) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    won: dict[int, bool] = {}

    def attempt(i: int) -> None:
        barrier.wait()
        won[i] = stores[i].set_if_absent("manifest", f"writer {i}".encode())

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, w in won.items() if w]
    assert len(winners) == 1
    assert bytes(stores[0].get("manifest")) == f"writer {winners[0]}".encode()


def test_masks_credentials_in_urls() -> None:
    import fsspec

    store = FsspecBackend(fsspec.filesystem("memory"), "/bucket/x", "s3://AKIA123:very-secret@bucket/x")
    assert store.url == "s3://***@bucket/x"
    assert "very-secret" not in repr(store)


# -- read-through cache -------------------------------------------------------------------


def _batches(ds: r3store.RouteDataset, **loader: Any) -> list[dict[str, Any]]:
    return list(DataLoader(ds, batch_size=None, **loader))


def test_cache_dir_second_epoch_makes_no_route_or_index_requests(
    fifty: dict[str, int], s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    plain = _batches(r3store.RouteDataset(s3_url, 4096, storage_options=s3_storage_options))
    s3_counter.reset()
    ds = r3store.RouteDataset(s3_url, 4096, storage_options=s3_storage_options, cache_dir=cache)
    first = _batches(ds)
    route_gets = s3_counter.requests_for("store/routes/", "GET")
    assert [r.range for r in route_gets] == [None, None]  # zarr.json and the shard object, whole
    assert len(s3_counter.requests_for("store/index/")) == 1

    s3_counter.reset()
    ds.reader.clear_cache()  # drop decoded chunks held in memory: epoch 2 reads storage again
    ds.set_epoch(1)
    second = _batches(ds)
    assert s3_counter.requests == 0

    # a new run (new process, same cache folder): manifest and listing only
    s3_counter.reset()
    third = _batches(r3store.RouteDataset(s3_url, 4096, storage_options=s3_storage_options, cache_dir=cache))
    assert [r.key for r in s3_counter.log if not r.is_listing] == ["store/r3store.json"]
    assert s3_counter.requests_for("store/routes/") == []
    assert s3_counter.requests_for("store/index/") == []

    for batches in (first, second, third):
        assert len(batches) == len(plain)
        for got, want in zip(batches, plain, strict=True):
            assert got["sample_ids"] == want["sample_ids"]
            assert torch.equal(got["routes"], want["routes"])
    cached = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert len(cached) == 3
    assert not [n for n in cached if n.startswith(".")]


def test_dataloader_workers_share_the_cache(fifty: dict[str, int], s3_url: str, s3_storage_options: dict[str, Any],
                                            s3_counter: S3Counter, tmp_path: Path) -> None:
    """Forked workers re-create their s3fs client (fsspec's is not fork-safe) and fill
    one cache folder together."""
    ds = r3store.RouteDataset(s3_url, 2048, storage_options=s3_storage_options, cache_dir=tmp_path / "cache")
    seen = []
    for batch in _batches(ds, num_workers=2):
        for sid, start, stop in zip(batch["sample_ids"], batch["cu_seqlens"][:-1], batch["cu_seqlens"][1:],
                                    strict=False):
            index = int(sid.split("-")[1])
            np.testing.assert_array_equal(batch["routes"][int(start) : int(stop) - 1].numpy(),
                                          routes_for(index, rows_of(index)))
            seen.append(sid)
    assert sorted(seen) == sorted(fifty)
    assert len(s3_counter.requests_for("store/routes/", "GET")) <= 2 * 2  # each worker at most once per object


def test_cache_files_appear_whole(s3_url: str, s3_storage_options: dict[str, Any], tmp_path: Path) -> None:
    """A reader of the cache folder (another DataLoader worker) never sees part of an
    object: copies are written under a temporary name and renamed (fsspec 2026.9's
    ``simplecache::`` writes to the final name; such a reader saw torn files)."""
    data = np.random.default_rng(0).integers(0, 256, 24 << 20, dtype=np.uint8).tobytes()
    open_backend(s3_url, s3_storage_options).set("routes/a/c/0/0/0", data)
    store = CachingBackend(open_backend(s3_url, s3_storage_options), tmp_path / "cache", immutable=is_immutable_key)
    seen: list[bool] = []
    stop = threading.Event()

    def watch() -> None:
        while True:
            last = stop.is_set()  # one more look after the download finished
            for path in (tmp_path / "cache").rglob("*"):
                if path.is_file() and not path.name.startswith("."):
                    seen.append(path.read_bytes() == data)
            if last:
                return

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert bytes(store.get("routes/a/c/0/0/0", SuffixByteRange(4))) == data[-4:]
    finally:
        stop.set()
        watcher.join()
    assert seen
    assert all(seen)


class TestCachingBackendOnS3(BackendTests):
    """The Backend conformance kit, with every key cached."""

    @pytest.fixture
    def backend(self, s3_url: str, s3_storage_options: dict[str, Any], tmp_path: Path) -> Iterator[CachingBackend]:
        backend = CachingBackend(open_backend(s3_url, s3_storage_options), tmp_path / "cache", immutable=("",))
        yield backend
        backend.close()

    def raw_set(self, backend: Backend, key: str, data: bytes) -> None:
        assert isinstance(backend, CachingBackend)
        assert isinstance(backend.inner, FsspecBackend)
        backend.inner.fs.pipe_file(f"{backend.inner.root}/{key}", data)

    def raw_get(self, backend: Backend, key: str) -> bytes:
        assert isinstance(backend, CachingBackend)
        assert isinstance(backend.inner, FsspecBackend)
        return bytes(backend.inner.fs.cat_file(f"{backend.inner.root}/{key}"))

    def raw_exists(self, backend: Backend, key: str) -> bool:
        assert isinstance(backend, CachingBackend)
        assert isinstance(backend.inner, FsspecBackend)
        return bool(backend.inner.fs.isfile(f"{backend.inner.root}/{key}"))


# -- transient and permanent errors ------------------------------------------------------


def _inject(counter: S3Counter, kind: str, n: int, method: str) -> None:
    if kind == "drop":
        counter.drop_next(n, methods={method})
    else:
        counter.fail_next(n, int(kind), methods={method})


@pytest.mark.parametrize("kind", ["503", "500", "drop"])
def test_transient_faults_are_retried(kind: str, s3_url: str, s3_storage_options: dict[str, Any],
                                      s3_counter: S3Counter) -> None:
    """503 SlowDown, 500 InternalError and dropped connections, on writes and on reads,
    are retried by botocore's retry handler (here: standard mode) and s3fs."""
    options = {**s3_storage_options, "config_kwargs": {"retries": {"max_attempts": 5, "mode": "standard"}}}
    with r3store.RouteWriter(s3_url, SPEC, storage_options=options) as w:
        w.append("sample-000001", routes_for(1, 50))
        _inject(s3_counter, kind, 2, "PUT")  # the route object's PUT, then its retry
    assert s3_counter.faults == 2
    _inject(s3_counter, kind, 1, "GET")  # the manifest
    store = r3store.open_store(s3_url, storage_options=options)
    _inject(s3_counter, kind, 1, "GET")  # the array's zarr.json
    np.testing.assert_array_equal(store.get("sample-000001"), routes_for(1, 50))
    assert [r.fault for r in s3_counter.log if r.fault] == [kind] * 4


def _no_secret(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert SECRET_KEY not in text


def test_permanent_errors_name_the_url_and_never_the_secret(fifty: dict[str, int], s3_url: str,
                                                            s3_storage_options: dict[str, Any],
                                                            s3_counter: S3Counter) -> None:
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    (shard,) = store.commits
    s3_counter.fail_next(1, 403, methods={"GET"})
    with pytest.raises(StorageError, match=f"{s3_url}/routes/{shard}/zarr.json: permission denied") as info:
        store.get("sample-000001")
    assert not isinstance(info.value, ObjectNotFoundError)
    assert s3_counter.faults == 1
    _no_secret(info.value)

    # 404: the chunk object is gone (not retried)
    store.backend.delete(f"routes/{shard}/c/0/0/0")
    s3_counter.reset()
    with pytest.raises(ObjectNotFoundError, match=f"{s3_url}/routes/{shard}/c/0/0/0") as missing:
        store.get("sample-000002")
    assert isinstance(missing.value, FileNotFoundError)
    assert s3_counter.requests == 2
    _no_secret(missing.value)
    with pytest.raises(NotAStoreError, match="s3://r3store-test/elsewhere"):
        r3store.open_store("s3://r3store-test/elsewhere", storage_options=s3_storage_options)

    # a refused write: nothing is committed, the samples stay buffered for the next flush
    writer = r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options)
    writer.append("sample-000100", routes_for(100, 30))
    s3_counter.fail_next(1, 403, methods={"PUT"})
    with pytest.raises(StorageError, match=f"{s3_url}/routes/{writer.writer_id}-00000/") as refused:
        writer.flush()
    _no_secret(refused.value)
    writer.close()
    np.testing.assert_array_equal(r3store.open_store(s3_url, storage_options=s3_storage_options).get("sample-000100"),
                                  routes_for(100, 30))


# -- many writer processes, killed writers ------------------------------------------------


def spawn(url: str, first: int, count: int, buffer_bytes: int, options: dict[str, Any],
          rows: int = 300) -> subprocess.Popen[str]:
    args = [sys.executable, str(WRITER), url, str(first), str(count), str(buffer_bytes), str(rows), json.dumps(options)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_eight_writer_processes_one_s3_store(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    procs = [spawn(s3_url, w * 40, 40, 200_000, s3_storage_options) for w in range(8)]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]  # reap every one before asserting
    for proc, err in zip(procs, errors, strict=True):
        assert proc.returncode == 0, err
    store = r3store.open_store(s3_url, storage_options=s3_storage_options)
    assert sorted(store.sample_ids) == [f"sample-{i:06d}" for i in range(320)]  # each once: no duplicate raised
    assert len(set(store.samples.column("writer_id").to_pylist())) == 8
    check_intact(store, rows=300)


def test_sigkill_mid_write_on_s3(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    rng = random.Random(4321)
    committed = 0
    for attempt in range(3):
        proc = spawn(s3_url, attempt * 1000, 1000, int(rng.uniform(100_000, 400_000)), s3_storage_options)
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("flushed"), proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        store = r3store.open_store(s3_url, storage_options=s3_storage_options)
        assert len(store) > committed
        committed = len(store)
        check_intact(store, rows=300)
    collect_garbage(s3_url, older_than_s=0, delete=True, storage_options=s3_storage_options)
    after = r3store.open_store(s3_url, storage_options=s3_storage_options)
    assert len(after) == committed
    check_intact(after, rows=300)
    assert collect_garbage(s3_url, older_than_s=0, storage_options=s3_storage_options) == []


# -- CLI ----------------------------------------------------------------------------------


def test_cli_inspect_s3_with_options_and_cache(fifty: dict[str, int], s3_url: str, s3_server: MotoServer,
                                               tmp_path: Path) -> None:
    args = ["inspect", s3_url, "--json", "-o", f"key={ACCESS_KEY}", "-o", f"secret={SECRET_KEY}",
            "-o", f"endpoint_url={s3_server.endpoint}", "-o", f"region_name={REGION}"]
    for extra in ([], ["--cache-dir", str(tmp_path / "cache")]):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 0, result.output
        summary = json.loads(result.output)
        assert summary["url"] == s3_url
        assert summary["samples"] == NUM_SAMPLES
        assert summary["commits"] == 1
    missing = CliRunner().invoke(main, ["inspect", "s3://r3store-test/elsewhere", *args[3:]])
    assert missing.exit_code == 2
    assert "s3://r3store-test/elsewhere" in missing.output
    assert SECRET_KEY not in missing.output


def test_cli_inspect_s3_from_aws_environment(fifty: dict[str, int], s3_url: str, s3_server: MotoServer) -> None:
    env = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_ENDPOINT_URL_S3": s3_server.endpoint, "AWS_DEFAULT_REGION": REGION}
    try:
        result = CliRunner().invoke(main, ["inspect", s3_url, "--json"], env=env)
    finally:
        clear_s3fs_cache()  # the client built from this environment must not outlive the test
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["samples"] == NUM_SAMPLES


@pytest.mark.parametrize("options", [{"endpoint_url": "localhost:9000"}, {"endpoint_url": ""},
                                     {"client_kwargs": {"endpoint_url": "127.0.0.1:9000"}},
                                     {"endpoint_url": "ftp://x"}])
def test_s3_endpoint_without_http_scheme_is_refused_at_open(options: dict) -> None:
    """Finding: ``endpoint_url="localhost:9000"`` (no scheme) escaped from ``open_store`` as
    botocore's bare ``ValueError: Invalid endpoint``; now a StorageError naming the option."""
    with pytest.raises(r3store.errors.StorageError, match=r"endpoint_url.*http"):
        r3store.open_store("s3://bucket/store", storage_options={"anon": True, **options})


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf")])
def test_s3_timeout_must_be_finite_and_positive(timeout: float) -> None:
    """Finding: a NaN, infinite, zero or negative timeout was accepted at open (NaN then
    failed every request as a connect timeout)."""
    with pytest.raises(r3store.errors.StorageError, match="connect_timeout"):
        r3store.open_store("s3://bucket/store", storage_options={
            "anon": True, "endpoint_url": "http://127.0.0.1:1", "config_kwargs": {"connect_timeout": timeout}})


SPEC_2X8 = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


ROUTES = np.array([[[0, 1], [2, 3]]] * 5)


@pytest.mark.s3
@pytest.mark.parametrize(("edit", "words"), [
    ({"endpont_url": "http://127.0.0.1:9"}, "unknown storage option 'endpont_url' (did you mean 'endpoint_url'?)"),
    ({"anon": "yes"}, "storage option 'anon' must be true or false, got str 'yes'"),
    ({"key": 123}, "storage option 'key' must be a string, got int 123"),
    ({"use_ssl": "no"}, "storage option 'use_ssl' must be true or false"),
    ({"client_kwargs": {"endpoint": "http://x"}}, "unknown storage option 'client_kwargs.endpoint' (did you mean"),
    ({"client_kwargs": {"endpoint_url": 5}}, "storage option 'client_kwargs.endpoint_url' must be a string"),
    ({"config_kwargs": {"connect_timout": 3}}, "unknown storage option 'config_kwargs.connect_timout' (did you"),
    ({"config_kwargs": {"retries": "x"}}, "storage option 'config_kwargs' is refused by botocore"),
    ({"config_kwargs": {"retries": {"mode": "sometimes"}}}, "storage option 'config_kwargs' is refused by botocore"),
    ({"config_kwargs": {"read_timeout": "10"}}, "'config_kwargs.read_timeout' must be a number of seconds"),
    ({"retries": 0}, "storage option 'retries' (attempts of s3fs's retry loop) must be an integer in [1, 100]"),
])
def test_bad_s3_storage_options_are_refused_at_open(s3_url: str, s3_storage_options: dict[str, Any],
                                                    edit: dict[str, Any], words: str) -> None:
    """Item 7: unknown or mistyped s3 options raised TypeError/AttributeError at the first request
    (or were taken: ``anon="yes"``); they are refused when the store is opened, naming the option."""
    options = {**s3_storage_options, **edit}
    if "client_kwargs" in edit:
        options["client_kwargs"] = {**s3_storage_options["client_kwargs"], **edit["client_kwargs"]}
    for call in (lambda: open_backend(s3_url, options),
                 lambda: r3store.RouteWriter(s3_url, SPEC_2X8, storage_options=options),
                 lambda: r3store.open_store(s3_url, storage_options=options)):
        with pytest.raises(StorageError) as info:
            call()
        assert words in str(info.value)
        assert s3_url in str(info.value)


@pytest.mark.s3
def test_good_s3_storage_options_still_work(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    options = {**s3_storage_options, "anon": False, "use_listings_cache": False, "skip_instance_cache": True,
               "retries": 3, "config_kwargs": {"max_pool_connections": 20, "retries": {"max_attempts": 4}},
               "client_kwargs": {**s3_storage_options["client_kwargs"], "verify": False}}
    with r3store.RouteWriter(s3_url, SPEC_2X8, storage_options=options) as w:
        w.append("a", ROUTES)
    backend = open_backend(s3_url, options)
    assert isinstance(backend, FsspecBackend)
    assert backend.fs.retries == 3
    assert backend.fs.config_kwargs == {"connect_timeout": 5, "read_timeout": 10, "max_pool_connections": 20,
                                        "retries": {"max_attempts": 4, "mode": "standard"}}
    assert options["config_kwargs"] == {"max_pool_connections": 20, "retries": {"max_attempts": 4}}  # not changed
    np.testing.assert_array_equal(r3store.open_store(s3_url, storage_options=options).get("a"), ROUTES)


@pytest.mark.s3
def test_s3_defaults_bound_every_request(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    """Item 18: no timeout was set (botocore's 60 s read timeout x legacy 5 attempts x s3fs's 5)."""
    backend = open_backend(s3_url, {**s3_storage_options, "skip_instance_cache": True})
    assert isinstance(backend, FsspecBackend)
    assert backend.fs.config_kwargs == {"connect_timeout": 5, "read_timeout": 10,
                                        "retries": {"total_max_attempts": 3, "mode": "standard"}}
    assert backend.fs.retries == 2
    forked = pickle.loads(pickle.dumps(backend))  # as in a DataLoader worker: the filesystem is re-created
    assert forked.fs is not backend.fs
    assert forked.fs.retries == 2


@pytest.mark.s3
@pytest.mark.parametrize("where", ["route object", "manifest"])
def test_stalled_s3_response_is_a_storage_error_naming_the_object(
        s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter, where: str) -> None:
    """Item 18: a stalled response blocked a read forever; with a 1 s read timeout, 2 botocore
    attempts and 1 s3fs attempt, 20 stalled responses in a row end in about 2 s as a StorageError.
    (With the defaults, 10 s, 3 and 2: 12 attempts, 125 s measured; s3fs nests its loop.)"""
    with r3store.RouteWriter(s3_url, SPEC_2X8, storage_options=s3_storage_options) as w:
        w.append("a", ROUTES)
    options = {**s3_storage_options, "skip_instance_cache": True, "retries": 1,
               "config_kwargs": {"read_timeout": 1, "retries": {"total_max_attempts": 2}}}
    store = r3store.open_store(s3_url, storage_options=options) if where == "route object" else None
    s3_counter.stall_next(20, 60, methods={"GET"})
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.get("a") if store is not None else r3store.open_store(s3_url, storage_options=options)
    took = time.monotonic() - start
    stalled = [r for r in s3_counter.log if r.fault == "stall"]
    s3_counter.reset()  # ends the stalls still held by the server
    assert took < 15, took
    assert "ReadTimeoutError" in str(info.value) or "timeout" in str(info.value).lower()
    name = "/routes/" if where == "route object" else "/r3store.json"
    assert name in str(info.value), str(info.value)
    assert len(stalled) == 2, stalled  # botocore's 2 attempts, s3fs's 1
