"""``BackendTests``: the conformance kit every :class:`r3store.storage.Backend` must pass.

A backend's test module subclasses :class:`BackendTests`, supplies a ``backend`` fixture
(a fresh, empty backend) and implements :meth:`BackendTests.raw_get`,
:meth:`BackendTests.raw_set` and :meth:`BackendTests.raw_exists` without going through
the API under test (open the file, call the fsspec filesystem directly)::

    class TestLocalBackend(BackendTests):
        @pytest.fixture
        def backend(self, tmp_path):
            return LocalBackend(tmp_path / "store")

        def raw_set(self, backend, key, data):
            path = backend.root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        ...
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from r3store.errors import FormatError, ObjectNotFoundError, R3StoreError
from r3store.storage import Backend, ByteRange, SuffixByteRange

__all__ = ["BackendTests"]

DATA = bytes(range(256)) * 4
"""1 KiB holding every byte value."""


class BackendTests:
    """Abstract conformance tests for a :class:`r3store.storage.Backend` (not collected)."""

    def raw_set(self, backend: Backend, key: str, data: bytes) -> None:
        """Write ``data`` under ``key``, bypassing ``backend``'s API."""
        raise NotImplementedError

    def raw_get(self, backend: Backend, key: str) -> bytes:
        """Read ``key``, bypassing ``backend``'s API."""
        raise NotImplementedError

    def raw_exists(self, backend: Backend, key: str) -> bool:
        """Whether ``key`` holds an object, bypassing ``backend``'s API."""
        raise NotImplementedError

    # -- get ------------------------------------------------------------------------

    @pytest.mark.parametrize("key", ["k", "a/b", "a/b/c/d.bin", "zarr.json", "index/commit-00001.parquet"])
    def test_get_whole(self, backend: Backend, key: str) -> None:
        self.raw_set(backend, key, DATA)
        assert bytes(backend.get(key)) == DATA

    @pytest.mark.parametrize(
        ("start", "end"),
        [(0, 1), (0, 1024), (5, 6), (100, 900), (1023, 1024), (7, 7), (0, 0), (1024, 1024)],
    )
    def test_get_byte_range(self, backend: Backend, start: int, end: int) -> None:
        self.raw_set(backend, "obj", DATA)
        got = backend.get("obj", ByteRange(start, end))
        assert bytes(got) == DATA[start:end]

    def test_get_byte_range_clamps_end_to_size(self, backend: Backend) -> None:
        self.raw_set(backend, "obj", DATA)
        assert bytes(backend.get("obj", ByteRange(1000, 5000))) == DATA[1000:]

    @pytest.mark.parametrize("nbytes", [1, 16, 1023, 1024, 1025, 10_000])
    def test_get_suffix(self, backend: Backend, nbytes: int) -> None:
        self.raw_set(backend, "obj", DATA)
        assert bytes(backend.get("obj", SuffixByteRange(nbytes))) == DATA[-nbytes:]

    def test_empty_object(self, backend: Backend) -> None:
        backend.set("empty", b"")
        assert bytes(backend.get("empty")) == b""
        assert bytes(backend.get("empty", ByteRange(0, 0))) == b""
        assert bytes(backend.get("empty", SuffixByteRange(4))) == b""
        assert backend.info("empty").size == 0
        assert backend.exists("empty")
        assert backend.list_prefix("") == ["empty"]

    def test_large_object_tail(self, backend: Backend) -> None:
        data = np.random.default_rng(0).integers(0, 256, size=3 << 20, dtype=np.uint8).tobytes()
        backend.set("big", data)
        assert bytes(backend.get("big", ByteRange(len(data) - 100, len(data)))) == data[-100:]
        assert bytes(backend.get("big", SuffixByteRange(5000))) == data[-5000:]
        assert bytes(backend.get("big")) == data

    @pytest.mark.parametrize(
        "byte_range", [None, ByteRange(0, 4), ByteRange(0, 0), ByteRange(3, 3), SuffixByteRange(4)], ids=repr
    )
    def test_get_missing_key(self, backend: Backend, byte_range: ByteRange | SuffixByteRange | None) -> None:
        self.raw_set(backend, "present", b"x")
        with pytest.raises(ObjectNotFoundError) as info:
            backend.get("a/missing", byte_range)
        assert isinstance(info.value, FileNotFoundError)
        assert isinstance(info.value, R3StoreError)
        assert "a/missing" in str(info.value)

    def test_byte_range_validates(self) -> None:
        with pytest.raises(ValueError, match="invalid byte range"):
            ByteRange(-1, 3)
        with pytest.raises(ValueError, match="invalid byte range"):
            ByteRange(5, 4)
        assert ByteRange(2, 9).nbytes == 7

    # -- set ------------------------------------------------------------------------

    @pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
    def test_set_bytes_like(self, backend: Backend, kind: type) -> None:
        backend.set("a/b/obj", kind(DATA))
        assert self.raw_get(backend, "a/b/obj") == DATA

    def test_set_overwrites(self, backend: Backend) -> None:
        backend.set("obj", b"first version, longer than the second")
        backend.set("obj", b"second")
        assert self.raw_get(backend, "obj") == b"second"
        assert bytes(backend.get("obj")) == b"second"
        assert bytes(backend.get("obj", ByteRange(1, 4))) == b"eco"
        assert backend.info("obj").size == 6
        assert backend.list_prefix("") == ["obj"], "an overwrite left a temporary object behind"

    def test_overwrite_after_ranged_read(self, backend: Backend) -> None:
        backend.set("obj", DATA)
        assert bytes(backend.get("obj", ByteRange(0, 4))) == DATA[:4]
        backend.set("obj", b"new!" * 10)
        assert bytes(backend.get("obj", ByteRange(0, 8))) == b"new!new!"
        assert bytes(backend.get("obj", SuffixByteRange(100))) == b"new!" * 10

    def test_readers_see_old_or_new_object(self, backend: Backend) -> None:
        """Concurrent reads during overwrites return one whole version, never a mix."""
        versions = [b"a" * 65536, b"b" * 131072]
        backend.set("obj", versions[0])
        errors: list[BaseException] = []
        done = threading.Event()

        def writer() -> None:
            try:
                for i in range(16):
                    backend.set("obj", versions[(i + 1) % 2])
            except BaseException as exc:  # noqa: BLE001 - any failure of the writer thread is reported below
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        while not done.is_set():
            got = bytes(backend.get("obj"))
            assert got in versions, f"read a torn object of {len(got)} bytes"
        thread.join()
        assert not errors
        assert bytes(backend.get("obj")) == versions[0]

    def test_set_if_absent(self, backend: Backend) -> None:
        assert backend.set_if_absent("a/obj", b"one") is True
        assert backend.set_if_absent("a/obj", b"two") is False
        assert self.raw_get(backend, "a/obj") == b"one"
        self.raw_set(backend, "b", b"raw")
        assert backend.set_if_absent("b", b"api") is False
        assert self.raw_get(backend, "b") == b"raw"
        assert backend.list_prefix("") == ["a/obj", "b"]

    def test_sync_of_written_keys_changes_nothing_visible(self, backend: Backend) -> None:
        backend.set("a/b/obj", b"one")
        assert backend.set_if_absent("c", b"two") is True
        backend.sync(["a/b/obj", "c"])
        backend.sync([])
        assert backend.get("a/b/obj") == b"one"
        assert backend.get("c") == b"two"
        assert backend.list_prefix("") == ["a/b/obj", "c"]

    # -- exists / delete ------------------------------------------------------------

    def test_exists(self, backend: Backend) -> None:
        assert not backend.exists("a/b")
        self.raw_set(backend, "a/b", b"x")
        assert backend.exists("a/b")
        assert not backend.exists("a"), "a 'directory' is not an object"
        assert not backend.exists("a/b/c")
        assert not backend.exists("a/bb")

    def test_delete(self, backend: Backend) -> None:
        self.raw_set(backend, "a/b", b"x")
        self.raw_set(backend, "a/c", b"y")
        backend.delete("a/b")
        assert not self.raw_exists(backend, "a/b")
        assert self.raw_exists(backend, "a/c")
        assert not backend.exists("a/b")
        with pytest.raises(ObjectNotFoundError):
            backend.get("a/b")

    def test_delete_missing_is_not_an_error(self, backend: Backend) -> None:
        backend.delete("never/was")
        backend.delete("never")
        self.raw_set(backend, "x", b"1")
        backend.delete("x")
        backend.delete("x")
        assert backend.list_prefix("") == []

    def test_delete_after_ranged_read(self, backend: Backend) -> None:
        backend.set("obj", DATA)
        assert bytes(backend.get("obj", ByteRange(0, 2))) == DATA[:2]
        backend.delete("obj")
        with pytest.raises(ObjectNotFoundError):
            backend.get("obj", ByteRange(0, 2))
        backend.set("obj", b"again")
        assert bytes(backend.get("obj", ByteRange(0, 5))) == b"again"

    # -- listing --------------------------------------------------------------------

    def test_list_prefix_empty_store(self, backend: Backend) -> None:
        assert backend.list_prefix("") == []
        assert backend.list_prefix("a/") == []
        assert backend.list_prefix("nothing/here/") == []

    def test_list_prefix(self, backend: Backend) -> None:
        keys = ["z", "a/2", "a/10", "a/1/x", "ab", "a/1/y/z", "b/c"]
        for key in keys:
            self.raw_set(backend, key, key.encode())
        assert backend.list_prefix("") == sorted(keys)
        assert backend.list_prefix("a/") == ["a/1/x", "a/1/y/z", "a/10", "a/2"]
        assert backend.list_prefix("a") == ["a/1/x", "a/1/y/z", "a/10", "a/2", "ab"]
        assert backend.list_prefix("a/1") == ["a/1/x", "a/1/y/z", "a/10"]
        assert backend.list_prefix("a/1/") == ["a/1/x", "a/1/y/z"]
        assert backend.list_prefix("a/1/y/z") == ["a/1/y/z"]
        assert backend.list_prefix("b/") == ["b/c"]
        assert backend.list_prefix("c") == []
        assert backend.list_prefix("a/3/") == []

    def test_list_children(self, backend: Backend) -> None:
        for key in ["a/2", "a/10", "a/1/x", "a/1/y/z", "a/b/c", "ab", "z"]:
            self.raw_set(backend, key, key.encode())
        assert backend.list_children("a/") == (["a/10", "a/2"], ["1", "b"])
        assert backend.list_children("a/1/") == (["a/1/x"], ["y"])
        assert backend.list_children("nothing/") == ([], [])
        backend.set("a/3", b"3")  # a fresh listing, not a cached one
        assert backend.list_children("a/")[0] == ["a/10", "a/2", "a/3"]

    def test_list_prefix_sees_writes_and_deletes(self, backend: Backend) -> None:
        assert backend.list_prefix("d/") == []
        backend.set("d/1", b"1")
        assert backend.list_prefix("d/") == ["d/1"]
        backend.set("d/2", b"2")
        assert backend.list_prefix("d/") == ["d/1", "d/2"]
        backend.delete("d/1")
        assert backend.list_prefix("d/") == ["d/2"]

    # -- info -----------------------------------------------------------------------

    def test_info(self, backend: Backend) -> None:
        before = time.time()
        self.raw_set(backend, "a/obj", DATA)
        info = backend.info("a/obj")
        assert info.size == len(DATA)
        assert info.mtime is not None
        assert before - 120 <= info.mtime <= time.time() + 120

    def test_info_missing(self, backend: Backend) -> None:
        with pytest.raises(ObjectNotFoundError, match="missing"):
            backend.info("missing")

    # -- derived operations ---------------------------------------------------------

    def test_get_ranges(self, backend: Backend) -> None:
        self.raw_set(backend, "obj", DATA)
        ranges = [ByteRange(10, 20), ByteRange(0, 1), ByteRange(15, 30), ByteRange(1000, 1024), ByteRange(500, 500)]
        got = backend.get_ranges("obj", ranges)
        assert [bytes(b) for b in got] == [DATA[r.start : r.end] for r in ranges]

    @pytest.mark.parametrize("count", [0, 1, 2])
    def test_get_ranges_few(self, backend: Backend, count: int) -> None:
        self.raw_set(backend, "obj", DATA)
        ranges = [ByteRange(3, 9), ByteRange(0, 0)][:count]
        assert [bytes(b) for b in backend.get_ranges("obj", ranges)] == [DATA[r.start : r.end] for r in ranges]

    def test_get_ranges_missing(self, backend: Backend) -> None:
        with pytest.raises(ObjectNotFoundError):
            backend.get_ranges("missing", [ByteRange(0, 1), ByteRange(1, 2)])

    def test_get_many(self, backend: Backend) -> None:
        keys = ["a/1", "a/2", "b", "c/d/e"]
        for key in keys:
            self.raw_set(backend, key, key.encode() * 3)
        got = backend.get_many(keys)
        assert got == {key: key.encode() * 3 for key in keys}
        assert all(type(v) is bytes for v in got.values())
        assert backend.get_many(["b"]) == {"b": b"bbb"}
        assert backend.get_many([]) == {}
        assert backend.get_many(iter(["a/2", "a/1"])) == {"a/2": b"a/2" * 3, "a/1": b"a/1" * 3}

    @pytest.mark.parametrize("keys", [["missing"], ["a", "missing"], ["missing", "a"]])
    def test_get_many_missing(self, backend: Backend, keys: list[str]) -> None:
        self.raw_set(backend, "a", b"1")
        with pytest.raises(ObjectNotFoundError):
            backend.get_many(keys)

    def test_json_round_trip(self, backend: Backend) -> None:
        doc = {"format": "r3store", "version": 1, "nested": {"list": [1, 2.5, None, True]}, "text": "é✓"}
        backend.set_json("meta/doc.json", doc)
        assert backend.get_json("meta/doc.json") == doc
        raw = self.raw_get(backend, "meta/doc.json")
        assert raw.endswith(b"\n")
        assert json.loads(raw.decode("utf-8")) == doc

    @pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00", b""], ids=["syntax", "utf8", "empty"])
    def test_get_json_invalid(self, backend: Backend, raw: bytes) -> None:
        self.raw_set(backend, "bad.json", raw)
        with pytest.raises(FormatError, match=r"bad\.json") as info:
            backend.get_json("bad.json")
        assert isinstance(info.value, ValueError)
        assert info.value.__cause__ is not None

    def test_get_json_missing(self, backend: Backend) -> None:
        with pytest.raises(ObjectNotFoundError):
            backend.get_json("nope.json")

    def test_delete_prefix(self, backend: Backend) -> None:
        for key in ["a/1", "a/2/x", "ab", "b/1"]:
            self.raw_set(backend, key, b"x")
        assert backend.delete_prefix("a/") == 2
        assert backend.list_prefix("") == ["ab", "b/1"]
        assert not self.raw_exists(backend, "a/1")
        assert not self.raw_exists(backend, "a/2/x")
        assert backend.delete_prefix("a/") == 0
        assert backend.delete_prefix("") == 2
        assert backend.list_prefix("") == []

    def test_repr_and_path_of(self, backend: Backend) -> None:
        assert repr(backend) == f"{type(backend).__name__}({backend.url!r})"
        assert backend.path_of("a/b") == f"{backend.url}/a/b"
        assert not backend.url.endswith("/")

    def test_close_keeps_backend_usable(self, backend: Backend) -> None:
        backend.set("obj", DATA)
        assert bytes(backend.get("obj", ByteRange(0, 3))) == DATA[:3]
        backend.close()
        assert bytes(backend.get("obj", ByteRange(3, 6))) == DATA[3:6]
