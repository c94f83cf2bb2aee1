"""A :class:`~r3store.storage.Backend` wrapper that counts reads: requests and bytes, by key.

Used to test and measure how much a reader fetches (rank-local reads, coalescing):

>>> from r3store.storage import open_backend  # doctest: +SKIP
>>> counting = CountingBackend(open_backend("/data/store"))  # doctest: +SKIP
>>> store = r3store.open_store(counting)  # doctest: +SKIP
>>> counting.reset(); store.assemble(ids, {"cp_size": 8, "cp_rank": 0}); counting.bytes_read  # doctest: +SKIP

Only reads of object bytes are counted (``get`` and each range of ``get_ranges``, one
request per range, as an object store would serve them); listings, ``exists`` and
``info`` are passed through uncounted. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from r3store.storage import Backend, ByteRange, ObjectInfo, SuffixByteRange

__all__ = ["CountingBackend"]


class CountingBackend(Backend):
    """Wraps ``inner``; counts requests and bytes read (see the module docstring).

    Attributes
    ----------
    requests : int
        Ranged or whole-object reads made (a ``get_ranges`` call counts one per range).
    bytes_read : int
        Bytes those reads returned.
    by_key : collections.Counter
        Bytes read per object key.
    """

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.supports_writes = inner.supports_writes
        self.supports_listing = inner.supports_listing
        self.is_local = inner.is_local
        self.coalesce_gap = inner.coalesce_gap
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes_read = 0
        self.by_key: Counter[str] = Counter()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Zero the counters."""
        with self._lock:
            self.requests = self.bytes_read = 0
            self.by_key = Counter()

    def _count(self, key: str, blobs: Sequence[bytes | memoryview]) -> None:
        with self._lock:
            self.requests += len(blobs)
            n = sum(len(b) for b in blobs)
            self.bytes_read += n
            self.by_key[key] += n

    def path_of(self, key: str) -> str:
        return self.inner.path_of(key)

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        blob = self.inner.get(key, byte_range)
        self._count(key, [blob])
        return blob

    def get_ranges(self, key: str, ranges: Sequence[ByteRange]) -> list[bytes | memoryview]:
        blobs = self.inner.get_ranges(key, ranges)
        self._count(key, blobs)
        return blobs

    def set(self, key: str, data: bytes | memoryview) -> None:
        self.inner.set(key, data)

    def set_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.set_if_absent(key, data)

    def sync(self, keys: Iterable[str]) -> None:
        self.inner.sync(keys)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list_prefix(self, prefix: str) -> list[str]:
        return self.inner.list_prefix(prefix)

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        return self.inner.list_info(prefix)

    def info(self, key: str) -> ObjectInfo:
        return self.inner.info(key)

    def close(self) -> None:
        self.inner.close()
