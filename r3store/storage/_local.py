"""Local-disk backend: mmap reads, temp-file-then-rename writes."""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import tempfile
from collections import OrderedDict
from pathlib import Path

from r3store.errors import StorageError
from r3store.storage._base import Backend, ByteRange, ObjectInfo, SuffixByteRange
from r3store.storage._errors import map_storage_errors

__all__ = ["LocalBackend"]

MAX_OPEN_MAPS = 128


class LocalBackend(Backend):
    """Objects as files under a local folder.

    Reads of byte ranges go through a bounded cache of read-only ``mmap`` handles, so
    only the pages holding the requested bytes are touched. Writes go to a temporary
    file in the destination folder, are fsynced, then ``os.replace``-d into place; the
    temporary file is removed on failure.

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

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        super().__init__(str(self.root))
        self._maps: OrderedDict[str, tuple[mmap.mmap | None, int]] = OrderedDict()

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

    def _map(self, key: str) -> tuple[mmap.mmap | None, int]:
        entry = self._maps.get(key)
        if entry is not None:
            self._maps.move_to_end(key)
            return entry
        with open(self._open(key), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self._maps[key] = (mapped, size)
        if len(self._maps) > MAX_OPEN_MAPS:
            _close_quietly(self._maps.popitem(last=False)[1][0])
        return mapped, size

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        with map_storage_errors(self.path_of(key)):
            if byte_range is None:
                with open(self._open(key), "rb") as f:
                    return f.read()
            mapped, size = self._map(key)
            if isinstance(byte_range, SuffixByteRange):
                start, end = max(0, size - byte_range.nbytes), size
            else:
                start, end = min(byte_range.start, size), min(byte_range.end, size)
            if mapped is None:
                return b""
            return memoryview(mapped)[start:end]

    def set(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            tmp = _write_temp(path, data)
            try:
                os.replace(tmp, path)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._maps.pop(key, None)

    def set_if_absent(self, key: str, data: bytes) -> bool:
        """Atomic create: the data is written to a temp file, then hard-linked into place."""
        path = self._path(key)
        with map_storage_errors(self.path_of(key)):
            tmp = _write_temp(path, data)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        with map_storage_errors(self.path_of(key)):
            return self._path(key).is_file()

    def delete(self, key: str) -> None:
        with map_storage_errors(self.path_of(key)):
            entry = self._maps.pop(key, None)
            if entry is not None:
                _close_quietly(entry[0])
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
        for mapped, _ in self._maps.values():
            _close_quietly(mapped)
        self._maps.clear()


def _write_temp(path: Path, data: bytes | memoryview) -> Path:
    """Write ``data`` to a fsynced temporary file beside ``path``; removed again on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _close_quietly(mapped: mmap.mmap | None) -> None:
    """Close a map; one still exported to a memoryview is left for the GC to close."""
    if mapped is not None:
        with contextlib.suppress(BufferError):
            mapped.close()
