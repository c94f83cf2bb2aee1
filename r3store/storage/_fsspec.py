"""Backend for any fsspec filesystem (``memory://``, ``s3://`` through s3fs, ...)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

from fsspec import AbstractFileSystem

from r3store.storage._base import REMOTE_COALESCE_GAP, Backend, ByteRange, ObjectInfo, SuffixByteRange
from r3store.storage._errors import map_storage_errors

__all__ = ["FsspecBackend", "mask_credentials"]


class FsspecBackend(Backend):
    """Objects in an fsspec filesystem under ``root``.

    Parameters
    ----------
    fs : fsspec.AbstractFileSystem
        The filesystem. It is never closed here: fsspec caches and shares instances.
    root : str
        Path of the store inside ``fs`` (no protocol).
    url : str
        The URL the user gave, for messages.
    retries : int, optional
        Attempts of s3fs's own retry loop (``S3FileSystem.retries``), kept when the
        filesystem is re-created after a fork; None leaves the filesystem's.

    Notes
    -----
    Object stores write whole objects in one PUT, so :meth:`set` is atomic there. Byte
    ranges are fetched with ranged GETs (``fs.cat_file(path, start, end)``); several
    ranges of several objects with ``fs.cat_ranges``, which s3fs runs concurrently.

    Request counts on S3 (s3fs): a whole object is one GET (s3fs would otherwise send a
    HEAD first to decide on a concurrent download; our objects are below its 50 MiB
    block), a :class:`SuffixByteRange` is one GET with ``Range: bytes=-n`` (other
    filesystems: a size lookup, then a ranged read), a byte range is one GET, and
    :meth:`exists` is one 1-byte GET.

    Listings are never answered from fsspec's listing cache where it matters:
    :meth:`list_prefix` always lists (s3fs's ``find``), and :meth:`exists` and
    :meth:`info` drop the cached listing of the key's folder first, because another
    process may have written or deleted the key since (writers commit concurrently,
    ``r3store gc`` re-checks commits right before deleting).

    Transient S3 errors (5xx, ``SlowDown`` throttling, dropped connections) are retried
    by botocore's retry handler (``storage_options={"config_kwargs": {"retries":
    {"total_max_attempts": 10, "mode": "adaptive"}}}``; r3store's default through
    :func:`open_backend`: standard mode, 3 attempts, 5 s connect and 10 s read
    timeouts) and then by s3fs's own loop (``storage_options={"retries": n}``, r3store's
    default 2, s3fs's 5, for throttling, broken connections and timeouts). Permanent errors
    (403, 404, ...) are not retried and leave as :mod:`r3store.errors` errors naming the
    ``s3://`` URL; credentials in a URL (``s3://key:secret@bucket``) are masked.

    The filesystem instance is re-created in a forked child (a DataLoader worker):
    fsspec's async filesystems refuse to run in a process they were not created in.
    """

    def __init__(self, fs: AbstractFileSystem, root: str, url: str, *, retries: int | None = None) -> None:
        super().__init__(mask_credentials(url))
        self._retries = retries
        if retries is not None:
            fs.retries = retries  # s3fs's own retry loop: an attribute, not a constructor option
        self._fs = fs
        self._pid = os.getpid()
        self.root = root.rstrip("/")
        self._is_s3 = "s3" in _protocols(fs)
        self._suffix_ranges = self._is_s3 or "memory" in _protocols(fs)
        if not set(_protocols(fs)) & {"file", "local", "memory"}:
            self.coalesce_gap = REMOTE_COALESCE_GAP

    @property
    def fs(self) -> AbstractFileSystem:
        """The fsspec filesystem (re-created after a fork; never closed here)."""
        if self._pid != os.getpid():
            self._fs = _reopen(self._fs)
            if self._retries is not None:
                self._fs.retries = self._retries
            self._pid = os.getpid()
        return self._fs

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            if byte_range is None:
                return bytes(self.fs.cat_file(path, **self._whole_kwargs()))
            if isinstance(byte_range, SuffixByteRange):
                return self._get_suffix(path, byte_range.nbytes)
            if byte_range.nbytes == 0:
                self.fs.info(path)  # a missing key still raises
                return b""
            return bytes(self.fs.cat_file(path, start=byte_range.start, end=byte_range.end))

    def _whole_kwargs(self) -> dict[str, Any]:
        # s3fs sends a HEAD before every whole-object GET unless told not to split it
        return {"max_concurrency": 1} if self._is_s3 else {}

    def _get_suffix(self, path: str, nbytes: int) -> bytes:
        if self._suffix_ranges:
            try:
                return bytes(self.fs.cat_file(path, start=-nbytes))
            except OSError as exc:  # 416 on an empty object from some S3 servers
                if exc.errno != errno.EINVAL:
                    raise
        size = self.fs.size(path)
        return bytes(self.fs.cat_file(path, start=max(0, size - nbytes), end=size)) if size else b""

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
            got: dict[str, Any] = self.fs.cat(paths, on_error="raise", **self._whole_kwargs())
        by_path = {self.fs._strip_protocol(p): v for p, v in got.items()}
        return {k: bytes(by_path[self.fs._strip_protocol(p)]) for k, p in zip(keys, paths, strict=True)}

    def set(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            parent = path.rpartition("/")[0]
            if parent and "s3" not in _protocols(self.fs) and not self.fs.exists(parent):
                self.fs.makedirs(parent, exist_ok=True)
            self.fs.pipe_file(path, bytes(data))

    def set_if_absent(self, key: str, data: bytes) -> bool:
        """Atomic create on S3: a conditional PUT (``If-None-Match: *``).

        AWS S3 (since 2024), MinIO and moto refuse the PUT when the key exists. A server
        that fails the conditional PUT for another reason (one without conditional
        writes answers 501) gets the base class's check-then-write instead, which
        reports any real failure itself.
        """
        if not self._is_s3:
            return super().set_if_absent(key, data)
        with map_storage_errors(self.path_of(key)):
            try:
                self.fs.pipe_file(self._path(key), bytes(data), mode="create")
            except FileExistsError:
                return False
            except OSError as exc:
                if not _not_implemented(exc):
                    raise
                return super().set_if_absent(key, data)
        return True

    def exists(self, key: str) -> bool:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            if self._is_s3:
                return self._exists_s3(path)
            # Not fs.isfile: it answers False for *any* error (an unreachable endpoint included).
            try:
                info = self._fresh_info(path)
            except FileNotFoundError:
                return False
        return bool(info.get("type") == "file")

    def _exists_s3(self, path: str) -> bool:
        """One request (a 1-byte GET), where s3fs's ``info`` sends a HEAD and, for a
        missing key, a listing to tell a folder from nothing."""
        try:
            self.fs.cat_file(path, start=0, end=1)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.EINVAL:  # 416: the range of an empty object
                return True
            raise
        return True

    def delete(self, key: str) -> None:
        with map_storage_errors(self.path_of(key)), contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._path(key))

    def list_prefix(self, prefix: str) -> list[str]:
        return list(self.list_info(prefix))

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        """One delimited listing (on S3 one request per 1,000 entries), never served from a cache."""
        base = self._path(prefix.rstrip("/")) if prefix.rstrip("/") else self.root
        with map_storage_errors(self.path_of(prefix)):
            try:
                found = self.fs.ls(base, detail=True, refresh=True)
            except FileNotFoundError:
                return [], []
        files, folders = [], []
        for info in found:
            name = str(info["name"]).rstrip("/").rpartition("/")[2]
            if info.get("type") == "directory":
                folders.append(name)
            elif name:
                files.append(f"{prefix}{name}")
        return sorted(files), sorted(folders)

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        """One listing call (sizes and times come with it on object stores)."""
        head, _, _ = prefix.rpartition("/")
        base = self._path(head) if head else self.root
        with map_storage_errors(self.path_of(prefix)):
            try:
                found = self.fs.find(base, withdirs=False, detail=True)
            except FileNotFoundError:
                return {}
        strip = self.fs._strip_protocol(self.root).rstrip("/")
        sizes: dict[str, ObjectInfo] = {}
        for path, info in found.items():
            # s3fs's find answers an empty listing with info() of the folder itself, which
            # is a "directory" once another writer has put a first object under it
            if info.get("type", "file") != "file":
                continue
            rel = self.fs._strip_protocol(path)[len(strip) :].lstrip("/")
            if rel.startswith(prefix) and rel:
                sizes[rel] = ObjectInfo(size=int(info.get("size") or 0), mtime=_mtime(info))
        return dict(sorted(sizes.items()))

    def missing_root(self) -> str | None:
        """For object stores (``s3://``, ``gs://``, ...): the bucket of the URL does not exist."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol in ("file", "local", "memory"):
            return None
        bucket = self.fs._strip_protocol(self.root).split("/", 1)[0]
        try:
            self.fs.invalidate_cache(bucket)
            exists = self.fs.exists(bucket)
        except Exception:  # noqa: BLE001 - a message helper: anything it cannot tell is "unknown"
            return None
        if exists:
            return None
        hint = " (S3 NoSuchBucket)" if protocol in ("s3", "s3a") else ""
        return f"the bucket {bucket!r} does not exist{hint}: create it first, or check the URL and endpoint"

    def info(self, key: str) -> ObjectInfo:
        with map_storage_errors(self.path_of(key)):
            info = self._fresh_info(self._path(key))
        return ObjectInfo(size=int(info.get("size") or 0), mtime=_mtime(info))

    def _fresh_info(self, path: str) -> dict[str, Any]:
        """``fs.info`` asked of the server, not of a listing cached before another process wrote."""
        self.fs.invalidate_cache(path.rpartition("/")[0] or path)
        info: dict[str, Any] = self.fs.info(path)
        return info

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None}  # the unpickled copy re-creates its filesystem


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")


def mask_credentials(url: str) -> str:
    """``s3://key:secret@bucket/x`` -> ``s3://***@bucket/x`` (for messages and reprs)."""
    return "::".join(_USERINFO.sub(r"\1***@", part) for part in url.split("::"))


def _reopen(fs: AbstractFileSystem) -> AbstractFileSystem:
    """The same filesystem, created anew in this process (fsspec drops its instance
    cache after a fork, so this builds a fresh client)."""
    return type(fs)(*fs.storage_args, **fs.storage_options)


def _not_implemented(exc: BaseException) -> bool:
    """Whether a failed conditional PUT means the server lacks conditional writes (HTTP 501)."""
    text = f"{exc} {exc.__cause__ or ''}"
    return "NotImplemented" in text or "501" in text


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
