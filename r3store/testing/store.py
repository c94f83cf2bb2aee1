"""``StoreTests``: the conformance kit every :class:`r3store.storage.Store` backend must pass.

A backend's test module subclasses :class:`StoreTests`, supplies a ``store`` fixture (a
fresh, empty store) and implements :meth:`StoreTests.raw_get`, :meth:`StoreTests.raw_set`
and :meth:`StoreTests.raw_exists` without going through the API under test (open the file,
call the fsspec filesystem directly)::

    class TestLocalStore(StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            return LocalStore(tmp_path / "store")

        def raw_set(self, store, key, data):
            path = store.root / key
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
from r3store.storage import ByteRange, Store, SuffixByteRange

__all__ = ["StoreTests"]

DATA = bytes(range(256)) * 4
"""1 KiB holding every byte value."""


class StoreTests:
    """Abstract conformance tests for a :class:`r3store.storage.Store` (not collected)."""

    def raw_set(self, store: Store, key: str, data: bytes) -> None:
        """Write ``data`` under ``key``, bypassing ``store``'s API."""
        raise NotImplementedError

    def raw_get(self, store: Store, key: str) -> bytes:
        """Read ``key``, bypassing ``store``'s API."""
        raise NotImplementedError

    def raw_exists(self, store: Store, key: str) -> bool:
        """Whether ``key`` holds an object, bypassing ``store``'s API."""
        raise NotImplementedError

    # -- get ------------------------------------------------------------------------

    @pytest.mark.parametrize("key", ["k", "a/b", "a/b/c/d.bin", "zarr.json", "index/shard-00001.parquet"])
    def test_get_whole(self, store: Store, key: str) -> None:
        self.raw_set(store, key, DATA)
        assert bytes(store.get(key)) == DATA

    @pytest.mark.parametrize(
        ("start", "end"),
        [(0, 1), (0, 1024), (5, 6), (100, 900), (1023, 1024), (7, 7), (0, 0), (1024, 1024)],
    )
    def test_get_byte_range(self, store: Store, start: int, end: int) -> None:
        self.raw_set(store, "obj", DATA)
        got = store.get("obj", ByteRange(start, end))
        assert bytes(got) == DATA[start:end]

    def test_get_byte_range_clamps_end_to_size(self, store: Store) -> None:
        self.raw_set(store, "obj", DATA)
        assert bytes(store.get("obj", ByteRange(1000, 5000))) == DATA[1000:]

    @pytest.mark.parametrize("nbytes", [1, 16, 1023, 1024, 1025, 10_000])
    def test_get_suffix(self, store: Store, nbytes: int) -> None:
        self.raw_set(store, "obj", DATA)
        assert bytes(store.get("obj", SuffixByteRange(nbytes))) == DATA[-nbytes:]

    def test_empty_object(self, store: Store) -> None:
        store.set("empty", b"")
        assert bytes(store.get("empty")) == b""
        assert bytes(store.get("empty", ByteRange(0, 0))) == b""
        assert bytes(store.get("empty", SuffixByteRange(4))) == b""
        assert store.info("empty").size == 0
        assert store.exists("empty")
        assert store.list_prefix("") == ["empty"]

    def test_large_object_tail(self, store: Store) -> None:
        data = np.random.default_rng(0).integers(0, 256, size=3 << 20, dtype=np.uint8).tobytes()
        store.set("big", data)
        assert bytes(store.get("big", ByteRange(len(data) - 100, len(data)))) == data[-100:]
        assert bytes(store.get("big", SuffixByteRange(5000))) == data[-5000:]
        assert bytes(store.get("big")) == data

    @pytest.mark.parametrize(
        "byte_range", [None, ByteRange(0, 4), ByteRange(0, 0), ByteRange(3, 3), SuffixByteRange(4)], ids=repr
    )
    def test_get_missing_key(self, store: Store, byte_range: ByteRange | SuffixByteRange | None) -> None:
        self.raw_set(store, "present", b"x")
        with pytest.raises(ObjectNotFoundError) as info:
            store.get("a/missing", byte_range)
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
    def test_set_bytes_like(self, store: Store, kind: type) -> None:
        store.set("a/b/obj", kind(DATA))
        assert self.raw_get(store, "a/b/obj") == DATA

    def test_set_overwrites(self, store: Store) -> None:
        store.set("obj", b"first version, longer than the second")
        store.set("obj", b"second")
        assert self.raw_get(store, "obj") == b"second"
        assert bytes(store.get("obj")) == b"second"
        assert bytes(store.get("obj", ByteRange(1, 4))) == b"eco"
        assert store.info("obj").size == 6
        assert store.list_prefix("") == ["obj"], "an overwrite left a temporary object behind"

    def test_overwrite_after_ranged_read(self, store: Store) -> None:
        store.set("obj", DATA)
        assert bytes(store.get("obj", ByteRange(0, 4))) == DATA[:4]
        store.set("obj", b"new!" * 10)
        assert bytes(store.get("obj", ByteRange(0, 8))) == b"new!new!"
        assert bytes(store.get("obj", SuffixByteRange(100))) == b"new!" * 10

    def test_readers_see_old_or_new_object(self, store: Store) -> None:
        """Concurrent reads during overwrites return one whole version, never a mix."""
        versions = [b"a" * 65536, b"b" * 131072]
        store.set("obj", versions[0])
        errors: list[BaseException] = []
        done = threading.Event()

        def writer() -> None:
            try:
                for i in range(16):
                    store.set("obj", versions[(i + 1) % 2])
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                done.set()

        thread = threading.Thread(target=writer)
        thread.start()
        while not done.is_set():
            got = bytes(store.get("obj"))
            assert got in versions, f"read a torn object of {len(got)} bytes"
        thread.join()
        assert not errors
        assert bytes(store.get("obj")) == versions[0]

    def test_set_if_absent(self, store: Store) -> None:
        assert store.set_if_absent("a/obj", b"one") is True
        assert store.set_if_absent("a/obj", b"two") is False
        assert self.raw_get(store, "a/obj") == b"one"
        self.raw_set(store, "b", b"raw")
        assert store.set_if_absent("b", b"api") is False
        assert self.raw_get(store, "b") == b"raw"
        assert store.list_prefix("") == ["a/obj", "b"]

    # -- exists / delete ------------------------------------------------------------

    def test_exists(self, store: Store) -> None:
        assert not store.exists("a/b")
        self.raw_set(store, "a/b", b"x")
        assert store.exists("a/b")
        assert not store.exists("a"), "a 'directory' is not an object"
        assert not store.exists("a/b/c")
        assert not store.exists("a/bb")

    def test_delete(self, store: Store) -> None:
        self.raw_set(store, "a/b", b"x")
        self.raw_set(store, "a/c", b"y")
        store.delete("a/b")
        assert not self.raw_exists(store, "a/b")
        assert self.raw_exists(store, "a/c")
        assert not store.exists("a/b")
        with pytest.raises(ObjectNotFoundError):
            store.get("a/b")

    def test_delete_missing_is_not_an_error(self, store: Store) -> None:
        store.delete("never/was")
        store.delete("never")
        self.raw_set(store, "x", b"1")
        store.delete("x")
        store.delete("x")
        assert store.list_prefix("") == []

    def test_delete_after_ranged_read(self, store: Store) -> None:
        store.set("obj", DATA)
        assert bytes(store.get("obj", ByteRange(0, 2))) == DATA[:2]
        store.delete("obj")
        with pytest.raises(ObjectNotFoundError):
            store.get("obj", ByteRange(0, 2))
        store.set("obj", b"again")
        assert bytes(store.get("obj", ByteRange(0, 5))) == b"again"

    # -- listing --------------------------------------------------------------------

    def test_list_prefix_empty_store(self, store: Store) -> None:
        assert store.list_prefix("") == []
        assert store.list_prefix("a/") == []
        assert store.list_prefix("nothing/here/") == []

    def test_list_prefix(self, store: Store) -> None:
        keys = ["z", "a/2", "a/10", "a/1/x", "ab", "a/1/y/z", "b/c"]
        for key in keys:
            self.raw_set(store, key, key.encode())
        assert store.list_prefix("") == sorted(keys)
        assert store.list_prefix("a/") == ["a/1/x", "a/1/y/z", "a/10", "a/2"]
        assert store.list_prefix("a") == ["a/1/x", "a/1/y/z", "a/10", "a/2", "ab"]
        assert store.list_prefix("a/1") == ["a/1/x", "a/1/y/z", "a/10"]
        assert store.list_prefix("a/1/") == ["a/1/x", "a/1/y/z"]
        assert store.list_prefix("a/1/y/z") == ["a/1/y/z"]
        assert store.list_prefix("b/") == ["b/c"]
        assert store.list_prefix("c") == []
        assert store.list_prefix("a/3/") == []

    def test_list_prefix_sees_writes_and_deletes(self, store: Store) -> None:
        assert store.list_prefix("d/") == []
        store.set("d/1", b"1")
        assert store.list_prefix("d/") == ["d/1"]
        store.set("d/2", b"2")
        assert store.list_prefix("d/") == ["d/1", "d/2"]
        store.delete("d/1")
        assert store.list_prefix("d/") == ["d/2"]

    # -- info -----------------------------------------------------------------------

    def test_info(self, store: Store) -> None:
        before = time.time()
        self.raw_set(store, "a/obj", DATA)
        info = store.info("a/obj")
        assert info.size == len(DATA)
        assert info.mtime is not None
        assert before - 120 <= info.mtime <= time.time() + 120

    def test_info_missing(self, store: Store) -> None:
        with pytest.raises(ObjectNotFoundError, match="missing"):
            store.info("missing")

    # -- derived operations ---------------------------------------------------------

    def test_get_ranges(self, store: Store) -> None:
        self.raw_set(store, "obj", DATA)
        ranges = [ByteRange(10, 20), ByteRange(0, 1), ByteRange(15, 30), ByteRange(1000, 1024), ByteRange(500, 500)]
        got = store.get_ranges("obj", ranges)
        assert [bytes(b) for b in got] == [DATA[r.start : r.end] for r in ranges]

    @pytest.mark.parametrize("count", [0, 1, 2])
    def test_get_ranges_few(self, store: Store, count: int) -> None:
        self.raw_set(store, "obj", DATA)
        ranges = [ByteRange(3, 9), ByteRange(0, 0)][:count]
        assert [bytes(b) for b in store.get_ranges("obj", ranges)] == [DATA[r.start : r.end] for r in ranges]

    def test_get_ranges_missing(self, store: Store) -> None:
        with pytest.raises(ObjectNotFoundError):
            store.get_ranges("missing", [ByteRange(0, 1), ByteRange(1, 2)])

    def test_get_many(self, store: Store) -> None:
        keys = ["a/1", "a/2", "b", "c/d/e"]
        for key in keys:
            self.raw_set(store, key, key.encode() * 3)
        got = store.get_many(keys)
        assert got == {key: key.encode() * 3 for key in keys}
        assert all(type(v) is bytes for v in got.values())
        assert store.get_many(["b"]) == {"b": b"bbb"}
        assert store.get_many([]) == {}
        assert store.get_many(iter(["a/2", "a/1"])) == {"a/2": b"a/2" * 3, "a/1": b"a/1" * 3}

    @pytest.mark.parametrize("keys", [["missing"], ["a", "missing"], ["missing", "a"]])
    def test_get_many_missing(self, store: Store, keys: list[str]) -> None:
        self.raw_set(store, "a", b"1")
        with pytest.raises(ObjectNotFoundError):
            store.get_many(keys)

    def test_json_round_trip(self, store: Store) -> None:
        doc = {"format": "r3store", "version": 1, "nested": {"list": [1, 2.5, None, True]}, "text": "é✓"}
        store.set_json("meta/doc.json", doc)
        assert store.get_json("meta/doc.json") == doc
        raw = self.raw_get(store, "meta/doc.json")
        assert raw.endswith(b"\n")
        assert json.loads(raw.decode("utf-8")) == doc

    @pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00", b""], ids=["syntax", "utf8", "empty"])
    def test_get_json_invalid(self, store: Store, raw: bytes) -> None:
        self.raw_set(store, "bad.json", raw)
        with pytest.raises(FormatError, match="bad.json") as info:
            store.get_json("bad.json")
        assert isinstance(info.value, ValueError)
        assert info.value.__cause__ is not None

    def test_get_json_missing(self, store: Store) -> None:
        with pytest.raises(ObjectNotFoundError):
            store.get_json("nope.json")

    def test_delete_prefix(self, store: Store) -> None:
        for key in ["a/1", "a/2/x", "ab", "b/1"]:
            self.raw_set(store, key, b"x")
        assert store.delete_prefix("a/") == 2
        assert store.list_prefix("") == ["ab", "b/1"]
        assert not self.raw_exists(store, "a/1")
        assert not self.raw_exists(store, "a/2/x")
        assert store.delete_prefix("a/") == 0
        assert store.delete_prefix("") == 2
        assert store.list_prefix("") == []

    def test_repr_and_path_of(self, store: Store) -> None:
        assert repr(store) == f"{type(store).__name__}({store.url!r})"
        assert store.path_of("a/b") == f"{store.url}/a/b"
        assert not store.url.endswith("/")

    def test_close_keeps_store_usable(self, store: Store) -> None:
        store.set("obj", DATA)
        assert bytes(store.get("obj", ByteRange(0, 3))) == DATA[:3]
        store.close()
        assert bytes(store.get("obj", ByteRange(3, 6))) == DATA[3:6]
