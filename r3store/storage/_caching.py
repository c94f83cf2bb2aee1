"""Read-through local cache of a backend's write-once objects, for repeated epochs."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from r3store.errors import ObjectNotFoundError
from r3store.storage._base import Backend, ByteRange, ObjectInfo, SuffixByteRange
from r3store.storage._local import LocalBackend

__all__ = ["CachingBackend", "CachingStore", "Immutable", "KeyPrefixes"]

T = TypeVar("T")

Immutable = Callable[[str], bool] | Sequence[str]
"""Which keys never change once written: a predicate on the key, or key prefixes."""


class CachingBackend(Backend):
    """Serve a backend's write-once objects from local copies, fetched whole on first read.

    Which keys are write-once is the caller's knowledge (``immutable``): storage knows
    nothing of the format. r3store's readers pass the format's rule (route objects and
    sample tables; :func:`r3store.open_store` with ``reader={"cache_dir": ...}``).

    The first read of a cacheable key (any byte range, a suffix, or the whole object)
    downloads the whole object from ``inner`` and writes it to ``cache_dir`` atomically
    (temporary file, fsync, ``os.replace``: a reader in another process, such as a
    second DataLoader worker, sees no file or the whole file, never part of one). Every
    later read is served from that copy through :class:`LocalBackend` (``pread``), so a second
    epoch over a remote store makes no requests for those objects at all.

    Everything that can change goes to ``inner`` every time: listings
    (:meth:`list_prefix`, :meth:`list_info`), :meth:`exists`, :meth:`info`, and the
    keys ``immutable`` does not accept (for r3store: the manifest and the zarr group
    documents, which are small and are re-created if a store is deleted and made again
    at the same URL).
    Writes and deletes go to ``inner`` and drop the local copy; a download that raced
    with a write or delete made through this object is served but not kept. A key that
    could leave the cache folder (an empty, ``.`` or ``..`` component, a leading ``/``,
    a NUL byte: legal S3 keys) is refused by the copies' :class:`LocalBackend` with
    :class:`r3store.errors.StorageError` before anything is fetched or written.

    Parameters
    ----------
    inner : Backend
        The backend to read through (usually an :class:`FsspecBackend` on ``s3://``).
    cache_dir : str or os.PathLike
        Folder of the cache; one sub-folder per backend URL. It can be shared by
        processes and reused across runs. Nothing is evicted: delete the folder (or a
        URL's sub-folder) to reclaim the space.
    immutable : callable or sequence of str
        Which keys never change once written and are cached: a predicate
        ``immutable(key) -> bool``, or key prefixes (``("",)`` caches every key).

    Raises
    ------
    r3store.errors.ObjectNotFoundError, r3store.errors.StorageError
        From ``inner`` (naming its URL), or from the cache folder (naming the local
        path, e.g. a full disk).

    Notes
    -----
    Why not fsspec's ``simplecache::``/``filecache::`` chaining: they also cache whole
    files and serve ``cat_file``/``cat_ranges`` from the local copy, but (fsspec
    2026.9) download straight to the final cache file name and treat "file exists" as
    "file complete", so a concurrent reader (another DataLoader worker) or a later run
    after a killed download reads a truncated object (fsspec/filesystem_spec#639; the
    temp-and-rename fix is PR #2075, not in that release). They also cache every key
    (so a store deleted and re-created at the same URL would serve its old manifest),
    fail a negative-start ``cat_file`` (the cached file object has no ``size``), so each
    object-index read through them still costs a HEAD for the object's size, and read
    through ``open()``/``read()`` copies of whole files. ``blockcache::`` caches
    blocks of open files only, not ``cat_ranges``.
    Writing whole write-once objects atomically is all this class adds.

    For r3store stores the cache relies on the commit protocol: a route object or
    sample table is final once its sample table exists, and readers read only committed
    arrays. Do not mark keys immutable whose objects are rewritten in place.

    Examples
    --------
    >>> import tempfile
    >>> from r3store.storage import CachingBackend, LocalBackend
    >>> remote = LocalBackend(tempfile.mkdtemp())
    >>> remote.set("frozen/a", b"0123456789")
    >>> backend = CachingBackend(remote, tempfile.mkdtemp(), immutable=["frozen/"])
    >>> bytes(backend.get("frozen/a", ByteRange(2, 5)))
    b'234'
    >>> remote.delete("frozen/a")  # the copy answers from now on
    >>> bytes(backend.get("frozen/a", SuffixByteRange(3)))
    b'789'
    """

    def __init__(self, inner: Backend, cache_dir: str | os.PathLike[str], *, immutable: Immutable) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.cache_dir = Path(cache_dir).expanduser().absolute()
        self.local = LocalBackend(self.cache_dir / _folder_name(inner.url))
        """The copies, as a backend of their own."""
        self.immutable: Callable[[str], bool] = immutable if callable(immutable) else KeyPrefixes(immutable)
        self.supports_writes = inner.supports_writes
        self.supports_listing = inner.supports_listing
        self.coalesce_gap = inner.coalesce_gap  # first reads go to the inner store
        self._lock = threading.Lock()
        self._writes = 0  # bumped by every write or delete made through this object

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def path_of(self, key: str) -> str:
        return self.inner.path_of(key)

    def _cacheable(self, key: str) -> bool:
        return bool(self.immutable(key))

    def _fill(self, key: str, data: bytes | None = None) -> bool:
        """Copy ``key`` from ``inner`` into the cache (atomically); False when a write
        through this object overtook the download, which is then not kept."""
        with self._lock:
            writes = self._writes
        if data is None:
            data = bytes(self.inner.get(key))
        with self._lock:
            if writes != self._writes:
                return False
            self.local.set(key, data)
        return True

    def _read(self, key: str, read: Callable[[Backend], T]) -> T:
        """``read`` from the local copy, filling it first if needed."""
        try:
            return read(self.local)
        except ObjectNotFoundError:
            pass
        if self._fill(key):
            try:
                return read(self.local)
            except ObjectNotFoundError:  # deleted or overwritten through this object meanwhile
                pass
        return read(self.inner)

    # -- reads ----------------------------------------------------------------------

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        if not self._cacheable(key):
            return self.inner.get(key, byte_range)
        return self._read(key, lambda store: store.get(key, byte_range))

    def get_ranges(self, key: str, ranges: Sequence[ByteRange]) -> list[bytes | memoryview]:
        if not self._cacheable(key):
            return self.inner.get_ranges(key, ranges)
        return self._read(key, lambda store: store.get_ranges(key, ranges))

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        got: dict[str, bytes] = {}
        for key in keys:
            if self._cacheable(key):
                with contextlib.suppress(ObjectNotFoundError):
                    got[key] = bytes(self.local.get(key))
        missing = [k for k in keys if k not in got]
        fetched = self.inner.get_many(missing)
        for key in missing:
            if self._cacheable(key):
                self._fill(key, fetched[key])
        got.update(fetched)
        return {key: got[key] for key in keys}

    # -- everything that can change: the inner store ----------------------------------

    def set(self, key: str, data: bytes | memoryview) -> None:
        self.inner.set(key, data)
        self._forget(key)

    def _forget(self, key: str) -> None:
        with self._lock:
            self._writes += 1
            self.local.delete(key)

    def set_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.set_if_absent(key, data)

    def sync(self, keys: Iterable[str]) -> None:
        self.inner.sync(keys)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)
        self._forget(key)

    def list_prefix(self, prefix: str) -> list[str]:
        return self.inner.list_prefix(prefix)

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        return self.inner.list_info(prefix)

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        return self.inner.list_children(prefix)

    def info(self, key: str) -> ObjectInfo:
        return self.inner.info(key)

    def missing_root(self) -> str | None:
        return self.inner.missing_root()

    def close(self) -> None:
        self.inner.close()
        self.local.close()


class KeyPrefixes:
    """Predicate: does a key start with one of ``prefixes`` (picklable, unlike a lambda)?

    With ``skip_hidden``, keys whose last component starts with ``.`` (temporary files)
    are refused.
    """

    def __init__(self, prefixes: Sequence[str], *, skip_hidden: bool = False) -> None:
        self.prefixes = tuple(prefixes)
        self.skip_hidden = skip_hidden

    def __call__(self, key: str) -> bool:
        return key.startswith(self.prefixes) and not (self.skip_hidden and key.rpartition("/")[2].startswith("."))

    def __repr__(self) -> str:
        return f"KeyPrefixes({self.prefixes!r}, skip_hidden={self.skip_hidden})"


class CachingStore(CachingBackend):
    """Deprecated alias of :class:`CachingBackend` with its old signature.

    ``cache_prefixes`` defaulted to r3store's write-once prefixes; pass ``immutable=``
    to :class:`CachingBackend` (or ``reader={"cache_dir": ...}`` to :func:`r3store.open_store`).
    """

    def __init__(self, inner: Backend, cache_dir: str | os.PathLike[str], *,
                 cache_prefixes: Sequence[str] = ("routes/", "index/")) -> None:
        super().__init__(inner, cache_dir, immutable=KeyPrefixes(cache_prefixes, skip_hidden=True))


def _folder_name(url: str) -> str:
    """A readable, collision-free folder name for a store URL."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url)[-60:].strip("_") or "store"
    return f"{readable}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"
