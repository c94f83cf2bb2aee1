"""Storage backends: the BackendTests kit on local disk, memory:// and S3 (moto), plus specifics."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from r3store.errors import ObjectNotFoundError, StorageError
from r3store.storage import Backend, ByteRange, FsspecBackend, LocalBackend, SuffixByteRange, open_backend
from r3store.testing import BackendTests
from r3store.testing.s3 import S3Counter

# -- the conformance kit on every backend --------------------------------------------


class TestLocalBackend(BackendTests):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[LocalBackend]:
        backend = LocalBackend(tmp_path / "store")
        yield backend
        backend.close()

    def raw_set(self, backend: Backend, key: str, data: bytes) -> None:
        assert isinstance(backend, LocalBackend)
        path = backend.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def raw_get(self, backend: Backend, key: str) -> bytes:
        assert isinstance(backend, LocalBackend)
        return (backend.root / key).read_bytes()

    def raw_exists(self, backend: Backend, key: str) -> bool:
        assert isinstance(backend, LocalBackend)
        return (backend.root / key).is_file()


class FsspecBackendTests(BackendTests):
    """Raw access through the backend's own fsspec filesystem, not the Backend API."""

    def raw_set(self, backend: Backend, key: str, data: bytes) -> None:
        assert isinstance(backend, FsspecBackend)
        backend.fs.pipe_file(f"{backend.root}/{key}", data)

    def raw_get(self, backend: Backend, key: str) -> bytes:
        assert isinstance(backend, FsspecBackend)
        return bytes(backend.fs.cat_file(f"{backend.root}/{key}"))

    def raw_exists(self, backend: Backend, key: str) -> bool:
        assert isinstance(backend, FsspecBackend)
        return bool(backend.fs.isfile(f"{backend.root}/{key}"))


class TestMemoryBackend(FsspecBackendTests):
    @pytest.fixture
    def backend(self, memory_url: str) -> FsspecBackend:
        backend = open_backend(memory_url)
        assert isinstance(backend, FsspecBackend)
        return backend


@pytest.mark.s3
class TestS3Backend(FsspecBackendTests):
    @pytest.fixture
    def backend(self, s3_url: str, s3_storage_options: dict[str, Any]) -> FsspecBackend:
        backend = open_backend(s3_url, s3_storage_options)
        assert isinstance(backend, FsspecBackend)
        return backend


# -- open_backend ---------------------------------------------------------------------


def test_open_backend_local(tmp_path: Path) -> None:
    for url in (tmp_path / "s", str(tmp_path / "s"), f"file://{tmp_path}/s"):
        store = open_backend(url)
        assert isinstance(store, LocalBackend)
        assert store.root == tmp_path / "s"
        assert store.is_local


def test_open_backend_memory(memory_url: str) -> None:
    store = open_backend(memory_url + "/")
    assert isinstance(store, FsspecBackend)
    assert store.url == memory_url
    assert not store.is_local
    assert open_backend(store) is store


def test_open_backend_unknown_protocol() -> None:
    with pytest.raises(StorageError, match="nosuchproto://x") as info:
        open_backend("nosuchproto://x/y")
    assert info.value.__cause__ is not None


def test_fsspec_store_never_closes_shared_filesystem(memory_url: str) -> None:
    store = open_backend(memory_url)
    assert isinstance(store, FsspecBackend)
    store.set("k", b"v")
    store.close()
    assert store.fs is fsspec.filesystem("memory")
    assert bytes(store.get("k")) == b"v"


# -- LocalBackend specifics -------------------------------------------------------------


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file() and p.name.endswith(".tmp"))


def test_local_failed_replace_keeps_old_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBackend(tmp_path)
    store.set("a/obj", b"old")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StorageError, match="a/obj") as info:
        store.set("a/obj", b"new")
    assert isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()
    assert (tmp_path / "a" / "obj").read_bytes() == b"old"
    assert _leftovers(tmp_path) == []
    assert store.list_prefix("") == ["a/obj"]


def test_local_failed_fsync_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBackend(tmp_path)
    store.set("obj", b"old")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StorageError):
        store.set("obj", b"new")
    with pytest.raises(StorageError):
        store.set_if_absent("other", b"new")
    monkeypatch.undo()
    assert (tmp_path / "obj").read_bytes() == b"old"
    assert not (tmp_path / "other").exists()
    assert _leftovers(tmp_path) == []


def test_local_write_of_bad_data_leaves_no_temp_file(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path)
    store.set("obj", b"old")
    with pytest.raises(TypeError):
        store.set("obj", "text is not bytes")  # type: ignore[arg-type]
    assert (tmp_path / "obj").read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_local_ranged_reads_keep_one_descriptor(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path)
    store.set("obj", b"0123456789")
    assert bytes(store.get("obj", ByteRange(2, 6))) == b"2345"
    assert bytes(store.get("obj", SuffixByteRange(3))) == b"789"
    assert bytes(store.get("obj", ByteRange(8, 20))) == b"89"
    assert bytes(store.get("obj", ByteRange(12, 20))) == b""
    assert [bytes(v) for v in store.get_ranges("obj", [ByteRange(0, 1), ByteRange(1, 2)])] == [b"0", b"1"]
    assert list(store._files) == ["obj"]


TRUNCATE_UNDER_A_READER = """
import os, sys
import numpy as np
import r3store
from r3store.storage import ByteRange, LocalBackend

root = sys.argv[1]
backend = LocalBackend(root)
backend.set("obj", bytes(range(256)) * 64)
assert bytes(backend.get("obj", ByteRange(0, 4))) == bytes(range(4))  # opened (formerly: mapped)
os.truncate(os.path.join(root, "obj"), 100)  # rewritten in place, as rsync --inplace does
try:
    bytes(backend.get("obj", ByteRange(8000, 8192)))
except r3store.errors.StorageError as exc:
    print("refused", type(exc).__name__, exc)

spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
with r3store.RouteWriter(os.path.join(root, "s"), spec, chunk_rows=4) as w:
    w.append("a", np.array([[[0, 1], [2, 3]]] * 40))
store = r3store.open_store(os.path.join(root, "s"))
store.get("a", rows=slice(0, 2))
(obj,) = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(root, "s", "routes")) for f in fs if f == "0"]
os.truncate(obj, os.path.getsize(obj) // 3)
try:
    store.get("a")
except r3store.errors.R3StoreError as exc:
    print("refused", type(exc).__name__, exc)
"""


def test_object_truncated_in_place_under_an_open_reader_is_an_error(tmp_path: Path) -> None:
    """Issue 13 item 2: a mapped object truncated in place killed the reader with SIGBUS; reads are
    ``pread`` calls now and a range the file no longer holds is a StorageError naming the object."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", TRUNCATE_UNDER_A_READER, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=False)
    assert proc.returncode == 0, f"died ({proc.returncode}): {proc.stderr[-800:]}"
    first, second = proc.stdout.splitlines()
    assert first.startswith("refused StorageError")
    assert "/obj" in first
    assert "truncated while open" in first
    assert second.startswith("refused StorageError")
    assert "/routes/" in second
    assert "truncated while open" in second


def test_local_view_survives_overwrite_and_close(tmp_path: Path) -> None:
    """A view handed out before an overwrite keeps the old bytes (os.replace makes a new file)."""
    store = LocalBackend(tmp_path)
    store.set("obj", b"old bytes")
    view = store.get("obj", ByteRange(0, 9))
    store.set("obj", b"NEW BYTES, longer")
    store.close()
    assert bytes(view) == b"old bytes"
    assert bytes(store.get("obj", ByteRange(0, 9))) == b"NEW BYTES"


def test_local_descriptor_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("r3store.storage._local.MAX_OPEN_FILES", 4)
    store = LocalBackend(tmp_path)
    for i in range(10):
        store.set(f"k{i}", bytes([i]) * 8)
    for i in range(10):
        assert bytes(store.get(f"k{i}", ByteRange(0, 2))) == bytes([i]) * 2
    assert list(store._files) == ["k6", "k7", "k8", "k9"]
    assert bytes(store.get("k0", ByteRange(7, 8))) == b"\x00"


def test_local_set_if_absent_race_has_one_winner(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path)
    barrier = threading.Barrier(8)
    results: dict[int, bool] = {}

    def attempt(i: int) -> None:
        barrier.wait()
        results[i] = store.set_if_absent("manifest", f"writer {i}".encode())

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results.items() if won]
    assert len(winners) == 1
    assert (tmp_path / "manifest").read_bytes() == f"writer {winners[0]}".encode()
    assert _leftovers(tmp_path) == []


def test_local_store_pickles(tmp_path: Path) -> None:
    import pickle

    store = LocalBackend(tmp_path)
    store.set("obj", b"abc")
    store.get("obj", ByteRange(0, 1))
    clone = pickle.loads(pickle.dumps(store))
    assert clone.root == store.root
    assert clone._files == {}
    assert bytes(clone.get("obj", ByteRange(1, 3))) == b"bc"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_local_permission_denied(tmp_path: Path) -> None:
    store = LocalBackend(tmp_path)
    store.set("obj", b"abc")
    (tmp_path / "obj").chmod(0)
    try:
        with pytest.raises(StorageError, match="permission denied") as info:
            store.get("obj")
        assert not isinstance(info.value, ObjectNotFoundError)
    finally:
        (tmp_path / "obj").chmod(0o644)


# -- S3 specifics ---------------------------------------------------------------------


@pytest.mark.s3
def test_s3_counter_counts_requests_and_bytes(
    s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter
) -> None:
    store = open_backend(s3_url, s3_storage_options)
    store.set("obj", bytes(1000))
    assert s3_counter.puts == 1
    assert s3_counter.gets == 0
    s3_counter.reset()
    assert bytes(store.get("obj", ByteRange(100, 350))) == bytes(250)
    assert s3_counter.snapshot() == {
        "requests": 1, "gets": 1, "ranged_gets": 1, "heads": 0, "puts": 0, "bytes_sent": 250,
    }
    store.get_ranges("obj", [ByteRange(0, 10), ByteRange(20, 40), ByteRange(50, 50)])
    assert s3_counter.ranged_gets == 3
    assert s3_counter.bytes_sent == 250 + 30
    s3_counter.reset()
    assert bytes(store.get("obj")) == bytes(1000)
    assert (s3_counter.gets, s3_counter.ranged_gets, s3_counter.bytes_sent) == (1, 0, 1000)


@pytest.mark.s3
def test_s3_zero_length_ranges_do_not_fetch_the_object(
    s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter
) -> None:
    """An empty ``Range: bytes=5-4`` is invalid HTTP, and S3 answers it with the whole object."""
    store = open_backend(s3_url, s3_storage_options)
    store.set("obj", bytes(range(100)))
    s3_counter.reset()
    got = store.get_ranges("obj", [ByteRange(5, 5), ByteRange(0, 2), ByteRange(9, 12)])
    assert [bytes(b) for b in got] == [b"", b"\x00\x01", b"\x09\x0a\x0b"]
    assert s3_counter.bytes_sent == 5


@pytest.mark.s3
def test_moto_server_context_manager() -> None:
    import urllib.error
    import urllib.request

    from r3store.testing.s3 import make_bucket, moto_server

    with moto_server() as endpoint:
        assert endpoint.startswith("http://127.0.0.1:")
        make_bucket(endpoint, "ctx-bucket")
        with urllib.request.urlopen(f"{endpoint}/ctx-bucket", timeout=5) as resp:
            assert resp.status == 200
            assert b"<Name>ctx-bucket</Name>" in resp.read()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{endpoint}/ctx-bucket", timeout=5)
