"""Local-disk backend: ``pread`` reads through cached descriptors, temp-file-then-rename writes."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from r3store.errors import StorageError
from r3store.storage._base import Backend, ByteRange, ObjectInfo, SuffixByteRange
from r3store.storage._errors import map_storage_errors

__all__ = ["LocalBackend"]

MAX_OPEN_FILES = 128
"""Descriptors kept open per backend for ranged reads (least recently used ones are closed)."""

DIRECT_WRITE_BYTES = 1 << 20
"""Objects of at least this many bytes are written with ``O_DIRECT`` where they can be
(:attr:`LocalBackend.direct_write_bytes`)."""

DIRECT_ALIGN = 4096
"""Alignment of the buffer address, length and file offset of an ``O_DIRECT`` write (the
largest logical block size of common disks; Linux wants the device's, at most this)."""


class _Handle:
    """An open read-only descriptor and the size the file had when it was opened.

    Closed when the last reference goes: a read holds a reference while it runs, so a
    descriptor dropped from the cache by another thread is never closed (and its number
    reused) under that read.
    """

    __slots__ = ("fd", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # At interpreter exit module globals (os, contextlib) may already be None: bind
        # os.close at definition and catch with a bare try (no module lookups).
        try:  # noqa: SIM105 - contextlib may be None by then
            _close(self.fd)
        except OSError:
            pass


class LocalBackend(Backend):
    """Objects as files under a local folder.

    Reads of byte ranges are ``os.pread`` calls on a bounded cache of open read-only
    descriptors, so only the requested bytes are read (no ``mmap``: a mapped file
    truncated in place, by a re-copy, ``rsync --inplace`` or a restore, kills the reader
    with SIGBUS when it touches a page past the new end). A range that the file held when
    it was opened but no longer holds raises :class:`r3store.errors.StorageError` naming
    the object ("truncated while open"). Writes go to a temporary file in the
    destination folder, are fsynced, then ``os.replace``-d into place (a new file: a
    descriptor opened before keeps reading the old bytes); the temporary file is removed
    on failure.

    An object of at least :attr:`direct_write_bytes` (1 MiB) given in a page-aligned buffer
    (the writer's storage objects are) has its whole 4 KiB pages written with ``O_DIRECT``
    and the rest through the page cache, then is fsynced and renamed like any other: the
    disk reads the caller's buffer, so the kernel neither copies the object into fresh
    page-cache pages nor has to find (reclaim) those pages, which on a machine whose cache
    is full costs more CPU than encoding the object (``benchmarks/README.md``, the writer
    row). Durability is the same (``O_DIRECT`` promises none by itself: the fsync does);
    a read of the object soon after comes from the disk, not the cache. Where the platform
    or file system refuses ``O_DIRECT`` (no such flag, tmpfs before Linux 6.6, an alignment
    the device does not take) the object goes through the page cache. A writer sets
    :attr:`direct_write_bytes` from its settings (``r3store.WriterConfig.direct_write_bytes``;
    ``None`` there: always the page cache), so users turn it off there, not here.

    Keys stay inside the folder: a key that is absolute or has an empty, ``.`` or ``..``
    component or a NUL byte raises :class:`r3store.errors.StorageError`, and reading
    anything but a regular file (a FIFO, a device, a symlink to one) raises it too,
    instead of blocking or reading forever.

    Parameters
    ----------
    root : str or os.PathLike
        The folder; created on first write.
    """

    is_local = True

    direct_write_bytes: int | None = DIRECT_WRITE_BYTES
    """Write objects of at least this many bytes from a page-aligned buffer with ``O_DIRECT``
    (None: never); ``r3store.RouteWriter`` sets it from ``WriterConfig.direct_write_bytes``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        super().__init__(str(self.root))
        self._files: OrderedDict[str, _Handle] = OrderedDict()
        self._lock = threading.Lock()
        self._made: set[Path] = set()
        """Folders this backend created since the last :meth:`sync` (their parents gained an entry)."""

    def _path(self, key: str) -> Path:
        """The file of ``key``; a key that could leave the root raises StorageError."""
        parts = key.split("/")
        if "\0" in key or any(p in ("", ".", "..") for p in parts):
            raise StorageError(self.path_of(ascii(key)[1:-1]), "invalid key: an empty, '.' or '..' component, "
                                                             "a leading '/' or a NUL byte")
        return self.root.joinpath(*parts)

    def _open(self, key: str) -> int:
        """A read-only descriptor of ``key``'s regular file (never blocks on a FIFO)."""
        fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        if not regular:
            os.close(fd)
            raise StorageError(self.path_of(key), "not a regular file (a folder, FIFO, device or socket)")
        return fd

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["root"])  # type: ignore[misc]

    def _handle(self, key: str) -> _Handle:
        with self._lock:
            handle = self._files.get(key)
            if handle is not None:
                self._files.move_to_end(key)
                return handle
        fd = self._open(key)
        try:
            handle = _Handle(fd, os.fstat(fd).st_size)
        except BaseException:
            os.close(fd)
            raise
        with self._lock:
            self._files[key] = handle
            while len(self._files) > MAX_OPEN_FILES:
                self._files.popitem(last=False)  # closed when no read holds it any more
        return handle

    def missing_root(self) -> str | None:
        if self.root.is_dir():
            return None
        return f"the folder {str(self.root)!r} does not exist" if not self.root.exists() else "it is not a folder"

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        with map_storage_errors(self.path_of(key)):
            if byte_range is None:
                with open(self._open(key), "rb") as f:
                    return f.read()
            handle = self._handle(key)
            size = handle.size
            if isinstance(byte_range, SuffixByteRange):
                start, end = max(0, size - byte_range.nbytes), size
            else:
                start, end = min(byte_range.start, size), min(byte_range.end, size)
            if end <= start:
                return b""
            data = os.pread(handle.fd, end - start, start)
            while len(data) < end - start:  # a short read: the file shrank (or a signal came)
                more = os.pread(handle.fd, end - start - len(data), start + len(data))
                if not more:
                    self._forget(key, handle)
                    raise StorageError(self.path_of(key), f"truncated while open: it held {size:,} bytes when "
                                       f"opened, bytes {start + len(data):,}..{end:,} are gone "
                                       f"(the file was rewritten in place)")
                data += more
            return data

    def _forget(self, key: str, handle: _Handle) -> None:
        """Drop ``key``'s cached descriptor if it is still ``handle`` (the next read reopens it)."""
        with self._lock:
            if self._files.get(key) is handle:
                del self._files[key]

    def set(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            tmp = _write_temp(path, data, self._made, self.direct_write_bytes)
            try:
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            with self._lock:
                self._files.pop(key, None)

    def set_if_absent(self, key: str, data: bytes) -> bool:
        """Atomic create: the data is written to a temp file, then hard-linked into place."""
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            if path.is_file():  # taken: the link would fail (no temp file to write and fsync)
                return False
            tmp = _write_temp(path, data, self._made, self.direct_write_bytes)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)

    def sync(self, keys: Iterable[str]) -> None:
        """``fsync`` each folder holding one of ``keys`` and each parent of a folder created
        since the last call (see :meth:`r3store.storage.Backend.sync`), each folder once."""
        with self._lock:
            made, self._made = self._made, set()
        folders = {self._path(key).parent for key in keys} | {folder.parent for folder in made}
        try:
            for folder in sorted(folders, key=lambda f: -len(f.parts)):  # deepest first
                with map_storage_errors(str(folder)):
                    _fsync_folder(folder)
        except BaseException:
            with self._lock:
                self._made |= made  # a retry syncs them again
            raise

    def exists(self, key: str) -> bool:
        with map_storage_errors(self.path_of(key)):
            return self._path(key).is_file()

    def delete(self, key: str) -> None:
        with map_storage_errors(self.path_of(key)):
            with self._lock:
                self._files.pop(key, None)
            self._path(key).unlink(missing_ok=True)

    def list_prefix(self, prefix: str) -> list[str]:
        with map_storage_errors(self.path_of(prefix)):
            head, _, _ = prefix.rpartition("/")
            base = self._path(head) if head else self.root
            if not base.is_dir():
                return []
            keys = []
            for dirpath, _, files in os.walk(base):
                rel = Path(dirpath).relative_to(self.root).as_posix()
                for name in files:
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
            return sorted(keys)

    def list_children(self, prefix: str) -> tuple[list[str], list[str]]:
        with map_storage_errors(self.path_of(prefix)):
            base = self._path(prefix.rstrip("/")) if prefix.rstrip("/") else self.root
            if not base.is_dir():
                return [], []
            files, folders = [], []
            for entry in os.scandir(base):
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.name)
                elif entry.is_file(follow_symlinks=False):
                    files.append(f"{prefix}{entry.name}")
            return sorted(files), sorted(folders)

    def info(self, key: str) -> ObjectInfo:
        with map_storage_errors(self.path_of(key)):
            st = self._path(key).stat()
            return ObjectInfo(size=st.st_size, mtime=st.st_mtime)

    def close(self) -> None:
        with self._lock:
            self._files.clear()  # each descriptor closes once no read holds it


def _fsync_folder(folder: Path) -> None:
    """``fsync`` a folder (its entries' names become durable); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (PermissionError, IsADirectoryError):  # Windows opens no folder: its renames are durable as made
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_folders(folder: Path, made: set[Path]) -> None:
    """``mkdir -p folder``, adding each folder it creates to ``made``."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for f in reversed(missing):
        try:
            f.mkdir()
            made.add(f)
        except FileExistsError:  # another writer made it first (or it is a file: the write then fails)
            pass


def _write_temp(path: Path, data: bytes | memoryview, made: set[Path] | None = None,
                direct_bytes: int | None = None) -> Path:
    """Write ``data`` to a fsynced temporary file beside ``path``; removed again on failure.
    Folders created on the way are added to ``made``. With ``direct_bytes``, data of at
    least that size goes through :func:`_write_direct` first."""
    _make_folders(path.parent, set() if made is None else made)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            view = memoryview(data).cast("B")
            done = _write_direct(fd, view) if direct_bytes is not None and len(view) >= direct_bytes else 0
            if done:
                os.lseek(fd, done, os.SEEK_SET)
            while done < len(view):
                n = os.write(fd, view[done:])
                if not n:
                    raise OSError(errno.EIO, "the file system wrote 0 bytes")
                done += n
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _write_direct(fd: int, view: memoryview) -> int:
    """Write the longest :data:`DIRECT_ALIGN`-multiple prefix of ``view`` to the empty file
    ``fd`` with ``O_DIRECT`` (the disk reads the caller's pages: no copy into fresh page-cache
    pages); returns how many bytes it wrote, 0 where ``O_DIRECT`` is unavailable (no such
    flag, a file system that refuses it, a buffer not page-aligned). The caller writes the
    rest through the page cache and fsyncs the file as for any write: ``O_DIRECT`` makes no
    promise of durability by itself."""
    head = len(view) // DIRECT_ALIGN * DIRECT_ALIGN
    direct = getattr(os, "O_DIRECT", 0)
    if not direct or not head or np.frombuffer(view, dtype=np.uint8).ctypes.data % DIRECT_ALIGN:
        return 0
    import fcntl  # POSIX only, like O_DIRECT

    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct)
    except OSError:  # the file system does not do direct I/O
        return 0
    done = 0
    try:
        while done < head:
            try:
                n = os.pwrite(fd, view[done:head], done)
            except OSError as exc:
                if exc.errno == errno.EINVAL and not done:  # an alignment the device refuses: buffered instead
                    return 0
                raise
            done += n
            if not n or done % DIRECT_ALIGN:  # a short write: the rest through the page cache
                break
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done
