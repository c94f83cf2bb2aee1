"""Backend for any fsspec filesystem (``memory://``, ``s3://`` through s3fs, ...)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from fsspec import AbstractFileSystem

from r3store.storage._base import ByteRange, ObjectInfo, Store, SuffixByteRange
from r3store.storage._errors import map_storage_errors

__all__ = ["FsspecStore"]


class FsspecStore(Store):
    """Objects in an fsspec filesystem under ``root``.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem. It is never closed here: fsspec caches and shares instances.
    root : str
        Path of the store inside ``fs`` (no protocol).
    url : str
        The URL the user gave, for messages.

    Notes
    -----
    Object stores write whole objects in one PUT, so :meth:`set` is atomic there. Byte
    ranges are fetched with ranged GETs (``fs.cat_file(path, start, end)``); several
    ranges of several objects with ``fs.cat_ranges``, which s3fs runs concurrently.
    Transient S3 errors are retried by s3fs/botocore's own retry settings (pass
    ``config_kwargs={"retries": {...}}`` in ``storage_options``; s3fs's own ``retries``
    is a class attribute, not an option).
    """

    def __init__(self, fs: AbstractFileSystem, root: str, url: str) -> None:
        super().__init__(url)
        self.fs = fs
        self.root = root.rstrip("/")

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes:
        with map_storage_errors(self.path_of(key)):
            if byte_range is None:
                return bytes(self.fs.cat_file(self._path(key)))
            if isinstance(byte_range, SuffixByteRange):
                size = self.fs.size(self._path(key))
                return bytes(self.fs.cat_file(self._path(key), start=max(0, size - byte_range.nbytes), end=size))
            if byte_range.nbytes == 0:
                self.fs.info(self._path(key))  # a missing key still raises
                return b""
            return bytes(self.fs.cat_file(self._path(key), start=byte_range.start, end=byte_range.end))

    def get_ranges(self, key: str, ranges: Sequence[ByteRange]) -> list[bytes | memoryview]:
        # An empty range would go out as the invalid header "bytes=5-4", which S3 answers
        # with the whole object; such ranges are answered here instead.
        wanted = [r for r in ranges if r.nbytes]
        if len(wanted) <= 1:
            return [self.get(key, r) for r in ranges]
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            out = self.fs.cat_ranges([path] * len(wanted), [r.start for r in wanted], [r.end for r in wanted])
        for item in out:
            if isinstance(item, BaseException):
                with map_storage_errors(self.path_of(key)):
                    raise item
        fetched = iter(out)
        return [bytes(next(fetched)) if r.nbytes else b"" for r in ranges]

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        paths = [self._path(k) for k in keys]
        with map_storage_errors(self.path_of(keys[0]) if len(keys) == 1 else self.url):
            got: dict[str, Any] = self.fs.cat(paths, on_error="raise")
        by_path = {self.fs._strip_protocol(p): v for p, v in got.items()}
        return {k: bytes(by_path[self.fs._strip_protocol(p)]) for k, p in zip(keys, paths, strict=True)}

    def set(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            parent = path.rpartition("/")[0]
            if parent and "s3" not in _protocols(self.fs) and not self.fs.exists(parent):
                self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(path, bytes(data))

    def exists(self, key: str) -> bool:
        # Not fs.isfile: it answers False for *any* error (an unreachable endpoint included).
        with map_storage_errors(self.path_of(key)):
            try:
                info = self.fs.info(self._path(key))
            except FileNotFoundError:
                return False
        return bool(info.get("type") == "file")

    def delete(self, key: str) -> None:
        with map_storage_errors(self.path_of(key)):
            try:
                self.fs.rm_file(self._path(key))
            except FileNotFoundError:
                pass

    def list_prefix(self, prefix: str) -> list[str]:
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        with map_storage_errors(self.path_of(prefix)):
            try:
                found = self.fs.find(base, withdirs=False)
            except FileNotFoundError:
                return []
        strip = self.fs._strip_protocol(self.root).rstrip("/")
        keys = []
        for path in found:
            rel = self.fs._strip_protocol(path)[len(strip) :].lstrip("/")
            if rel.startswith(prefix):
                keys.append(rel)
        return sorted(keys)

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """One listing call (sizes come with it on object stores)."""
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        with map_storage_errors(self.path_of(prefix)):
            try:
                found = self.fs.find(base, withdirs=False, detail=True)
            except FileNotFoundError:
                return {}
        strip = self.fs._strip_protocol(self.root).rstrip("/")
        sizes = {}
        for path, info in found.items():
            rel = self.fs._strip_protocol(path)[len(strip) :].lstrip("/")
            if rel.startswith(prefix):
                sizes[rel] = int(info.get("size") or 0)
        return dict(sorted(sizes.items()))

    def info(self, key: str) -> ObjectInfo:
        with map_storage_errors(self.path_of(key)):
            info = self.fs.info(self._path(key))
        return ObjectInfo(size=int(info.get("size") or 0), mtime=_mtime(info))


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _mtime(info: dict[str, Any]) -> float | None:
    for field in ("LastModified", "mtime", "created", "last_modified"):
        value = info.get(field)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return None
