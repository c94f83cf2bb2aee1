"""The storage contract: a flat key space of byte objects (the byte layer under a store).

A :class:`Backend` implements five primitives: ranged :meth:`Backend.get`,
:meth:`Backend.set` (atomic: readers see the old object or the whole new one),
:meth:`Backend.exists`, :meth:`Backend.delete` and :meth:`Backend.list_prefix`, plus
:meth:`Backend.info`.
Derived operations (multi-range get, many-key get, JSON helpers, prefix delete) are
written once here and may be overridden for speed. Keys use ``/`` separators and are
relative to the root. Every error leaves as an :mod:`r3store.errors` error. Backends
know nothing of the r3store format (which keys exist, which never change).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from r3store.errors import FormatError, OptionError

__all__ = ["Backend", "ByteRange", "ObjectInfo", "SuffixByteRange"]


@dataclass(frozen=True)
class ByteRange:
    """The half-open byte range ``[start, end)`` of an object."""

    start: int
    """First byte, inclusive, >= 0."""
    end: int
    """Last byte, exclusive, >= start."""

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise OptionError("byte_range", (self.start, self.end), f"invalid byte range [{self.start}, {self.end})")

    @property
    def nbytes(self) -> int:
        """Length of the range in bytes."""
        return self.end - self.start


@dataclass(frozen=True)
class SuffixByteRange:
    """The last ``nbytes`` bytes of an object."""

    nbytes: int
    """Number of bytes from the end, > 0."""


@dataclass(frozen=True)
class ObjectInfo:
    """Size and modification time of a stored object."""

    size: int
    """Size in bytes."""
    mtime: float | None
    """Modification time, seconds since the epoch (UTC), when the backend knows it."""


REMOTE_COALESCE_GAP = 64 << 10
"""Default :attr:`Backend.coalesce_gap` of object stores (bytes): at ~100 MB/s per stream and
tens of ms per request, reading a 64 KiB hole costs far less than a request (fsspec's
``parquet`` reader and Arrow's read coalescing use holes of the same order)."""


class Backend(ABC):
    """Abstract byte-object storage rooted at :attr:`url` (local folder, bucket prefix, ...)."""

    supports_writes: bool = True
    """Whether :meth:`set` and :meth:`delete` work."""
    supports_listing: bool = True
    """Whether :meth:`list_prefix` works."""
    is_local: bool = False
    """Whether objects live on a local filesystem (cheap ranged reads, no request costs)."""
    coalesce_gap: int = 0
    """Bytes: readers fetch two ranges of one object that are at most this far apart as one
    request (reading the bytes between). 0 (local disk): only touching ranges merge. Object
    stores set :data:`REMOTE_COALESCE_GAP`, where a request costs more than that many bytes."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def path_of(self, key: str) -> str:
        """Human-readable location of ``key`` for messages."""
        return f"{self.url}/{key}"

    def missing_root(self) -> str | None:
        """Why the store's root cannot hold a store at all (a folder or bucket that does not
        exist), for the message of a missing manifest; None when it exists or cannot be told.
        Backends override it; the base cannot tell."""
        return None

    @abstractmethod
    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        """Read an object, or a byte range of it.

        Raises
        ------
        r3store.errors.ObjectNotFoundError
            ``key`` does not exist.
        r3store.errors.StorageError
            The backend failed.
        """

    @abstractmethod
    def set(self, key: str, data: bytes | memoryview) -> None:
        """Write an object atomically (all or nothing).

        ``data`` may be a view of a buffer the caller reuses once the call returns (the
        writer encodes every storage object into one buffer): a backend that keeps the
        bytes past the call copies them.

        Raises
        ------
        r3store.errors.ReadOnlyStoreError
            The backend is read-only.
        r3store.errors.StorageError
            The backend failed; nothing is left under ``key``.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    @abstractmethod
    def list_prefix(self, prefix: str) -> list[str]:
        """Keys (sorted) of every object whose key starts with ``prefix``."""

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        """One level of the key space under ``prefix`` (which ends in ``/``): the keys of the
        objects directly under it, and the names of the "folders" below it (the first path
        component after ``prefix`` of deeper keys), both sorted; e.g. ``index/``'s checkpoints
        and buckets.

        Backends on object stores answer with one delimited listing (per 1,000 entries), not
        a listing of every key below; this default lists every key.
        """
        files, folders = [], set()
        for key in self.list_prefix(prefix):
            rest = key[len(prefix) :]
            if "/" in rest:
                folders.add(rest.partition("/")[0])
            else:
                files.append(key)
        return sorted(files), sorted(folders)

    @abstractmethod
    def info(self, key: str) -> ObjectInfo:
        """Size and modification time of ``key``.

        Raises
        ------
        r3store.errors.ObjectNotFoundError
        """

    def set_if_absent(self, key: str, data: bytes) -> bool:
        """Write ``key`` unless it exists; return whether this call wrote it.

        The base version checks, then writes (a race may let two writers both write);
        backends with an atomic create override it.
        """
        if self.exists(key):
            return False
        self.set(key, data)
        return True

    def list_info(self, prefix: str) -> dict[str, ObjectInfo]:
        """Size and modification time of every object under ``prefix``, by key (sorted).

        Object-store backends get these from the listing itself (no request per key).
        """
        return {key: self.info(key) for key in self.list_prefix(prefix)}

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """Size in bytes of every object under ``prefix``, by key (sorted)."""
        return {key: info.size for key, info in self.list_info(prefix).items()}

    def get_ranges(self, key: str, ranges: Sequence[ByteRange]) -> list[bytes | memoryview]:
        """Read several byte ranges of one object, in order."""
        return [self.get(key, r) for r in ranges]

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Read whole objects; backends may fetch them concurrently."""
        return {key: bytes(self.get(key)) for key in keys}

    def get_json(self, key: str) -> Any:
        """Read and parse a JSON object.

        Raises
        ------
        r3store.errors.FormatError
            The object is not valid UTF-8 JSON, or nests too deeply to parse.
        """
        raw = self.get(key)
        try:
            return json.loads(bytes(raw).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(self.path_of(key), f"not valid JSON: {exc}") from exc
        except RecursionError:
            raise FormatError(self.path_of(key), "not valid JSON: nested too deeply") from None

    def set_json(self, key: str, doc: Any) -> None:
        """Write ``doc`` as indented UTF-8 JSON."""
        self.set(key, (json.dumps(doc, indent=2, sort_keys=False) + "\n").encode("utf-8"))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; return how many were deleted."""
        keys = self.list_prefix(prefix)
        for key in keys:
            self.delete(key)
        return len(keys)

    def sync(self, keys: Iterable[str]) -> None:  # noqa: B027 - optional hook
        """Make the names of these written keys durable (the commit protocol calls it once
        for a commit's array objects before writing its sample table, and once after).

        :meth:`set` and :meth:`set_if_absent` make the bytes durable; on a file system the
        name that points at them lives in the folder, which needs its own ``fsync``
        (POSIX does not order a rename or link with a later one). The local backend
        fsyncs each distinct folder holding one of ``keys`` and each folder in which it
        created a folder since the last call; object stores need nothing (a PUT that
        returned is durable), so the default does nothing.

        Raises
        ------
        r3store.errors.StorageError
            The backend failed.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles (open descriptors); the store stays usable and reopens them on demand."""
