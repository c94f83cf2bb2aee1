"""The local-disk backend (``r3store/storage/_local.py``): keys that leave the root, special files, descriptors."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import StorageError
from r3store.storage import LocalBackend
from tests.routes import array_dir, deadline, index_file

ESCAPING_KEYS = ["../x", "routes/../../x", "/abs", "a//b", "./x", "a/./b", "a/", "", "a\0b", "a/.."]


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_local_store_refuses_keys_that_leave_the_root(tmp_path: Path, key: str) -> None:
    store = LocalBackend(tmp_path / "root" / "deeper")
    calls = [lambda: store.get(key), lambda: store.set(key, b"x"), lambda: store.exists(key),
             lambda: store.delete(key), lambda: store.info(key), lambda: store.set_if_absent(key, b"x")]
    for call in calls:
        with pytest.raises(StorageError, match="invalid key"):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing written, not even the root


@pytest.mark.parametrize("target", ["manifest", "zarr", "index"])
def test_symlink_to_dev_zero(small_store_dir: Path, target: str) -> None:
    path = {"manifest": small_store_dir / "r3store.json", "zarr": array_dir(small_store_dir) / "zarr.json",
            "index": index_file(small_store_dir)}[target]
    path.unlink()
    path.symlink_to("/dev/zero")
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(small_store_dir).get("s0")


def test_fifo_in_index_does_not_hang(small_store_dir: Path) -> None:
    os.mkfifo(index_file(small_store_dir).parent / "zz-00000.parquet")
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(small_store_dir)


def test_fifo_route_object_does_not_hang(small_store_dir: Path) -> None:
    obj = array_dir(small_store_dir) / "c" / "0" / "0" / "0"
    obj.unlink()
    os.mkfifo(obj)
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(small_store_dir).get("s0")


def test_descriptor_close_survives_interpreter_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a reader still alive at interpreter exit printed "Exception ignored in
    _Handle.__del__ ... 'NoneType' object has no attribute 'suppress'" (module globals are
    None by then). Simulated here: the module's globals gone, the descriptor still closed."""
    import os

    from r3store.storage import _local

    path = tmp_path / "f"
    path.write_bytes(b"x")
    handle = _local._Handle(os.open(path, os.O_RDONLY), 1)
    fd = handle.fd
    monkeypatch.setattr(_local, "os", None)
    monkeypatch.setattr(_local, "contextlib", None, raising=False)
    handle.__del__()  # must neither raise nor leave the descriptor open
    monkeypatch.undo()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    handle.__del__()  # a second close (already closed) is quiet too


def _fsynced_folders(monkeypatch: pytest.MonkeyPatch, log: list[tuple[str, str]]) -> None:
    """Log ("fsync", folder) for each real fsync of a folder, ("link"/"replace", target) for
    each name made (the real calls run: this only watches)."""
    fsync, link, replace = os.fsync, os.link, os.replace

    def watched_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            log.append(("fsync", path))
        fsync(fd)

    def watched_link(src: object, dst: object) -> None:
        link(src, dst)  # type: ignore[arg-type]
        log.append(("link", os.fspath(dst)))  # type: ignore[arg-type]

    def watched_replace(src: object, dst: object) -> None:
        replace(src, dst)  # type: ignore[arg-type]
        log.append(("replace", os.fspath(dst)))  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(os, "link", watched_link)
    monkeypatch.setattr(os, "replace", watched_replace)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name a descriptor's folder")
def test_sync_fsyncs_the_folders_of_the_keys_and_of_the_folders_made(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBackend(tmp_path / "root")
    store.set("a/b/c/x", b"1")  # makes root, a, a/b, a/b/c
    store.set_if_absent("a/y", b"2")
    log: list[tuple[str, str]] = []
    _fsynced_folders(monkeypatch, log)
    store.sync(["a/b/c/x", "a/y"])
    root = tmp_path / "root"
    assert sorted(p for _, p in log) == sorted(str(p) for p in [tmp_path, root, root / "a", root / "a/b",
                                                                root / "a/b/c"])
    log.clear()
    store.sync(["a/y"])  # the folders made were synced: only the key's folder now
    assert log == [("fsync", str(root / "a"))]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to name a descriptor's folder")
def test_a_commit_names_its_array_durably_before_its_table_and_itself_before_returning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=40, top_k=2)
    routes = np.random.default_rng(0).permuted(np.tile(np.arange(40), (9, 3, 1)), axis=2)[:, :, :2]
    with r3store.RouteWriter(tmp_path / "s", spec) as writer:
        log: list[tuple[str, str]] = []
        _fsynced_folders(monkeypatch, log)
        writer.append("a", routes)
        writer.flush()
        monkeypatch.undo()
    table = str(index_file(tmp_path / "s"))
    objects = [str(p) for p in array_dir(tmp_path / "s").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert objects
    made = [i for i, (what, _) in enumerate(log) if what != "fsync"]
    table_at = next(i for i, (what, p) in enumerate(log) if what == "link" and p == table)
    for obj in objects:  # the object's folder is fsynced after its name is made and before the table's
        named = next(i for i, (what, p) in enumerate(log) if what == "replace" and p == obj)
        assert any(named < i < table_at and log[i] == ("fsync", os.path.dirname(obj)) for i in range(len(log)))
    assert ("fsync", os.path.dirname(table)) in log[table_at:]  # the table's name too, before flush returns
    assert made[-1] == table_at


def _page_aligned_bytes(n: int, shift: int = 0) -> memoryview:
    """``n`` random bytes starting ``shift`` bytes past a page boundary (a view of a numpy buffer)."""
    raw = np.empty(n + 2 * 4096, np.uint8)
    start = -raw.ctypes.data % 4096 + shift
    view = raw[start : start + n]
    view[:] = np.random.default_rng(n + shift).integers(0, 256, n, dtype=np.uint8)
    return memoryview(view)


def _direct_io_refused(folder: Path) -> bool:
    """Whether the file system of ``folder`` refuses ``O_DIRECT`` (or the platform has none)."""
    if not hasattr(os, "O_DIRECT"):
        return True
    try:
        os.close(os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except OSError:
        return True
    finally:
        (folder / ".probe").unlink(missing_ok=True)
    return False


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5, (1 << 20) + 17])
@pytest.mark.parametrize("shift", [0, 1])
def test_objects_read_back_whole_whatever_their_size_and_alignment(tmp_path: Path, size: int, shift: int) -> None:
    store = LocalBackend(tmp_path)
    store.direct_write_bytes = 1  # every object that can be written with O_DIRECT is (aligned ones, here)
    data = _page_aligned_bytes(size, shift)
    store.set("routes/x/c/0/0/0", data)
    assert store.set_if_absent("index/t.parquet", data)
    for key in ("routes/x/c/0/0/0", "index/t.parquet"):
        assert bytes(store.get(key)) == bytes(data)
        assert store.info(key).size == size
    assert [p.name for p in tmp_path.rglob(".*")] == []  # no temporary file left


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux (O_DIRECT, /proc)")
def test_a_large_aligned_object_goes_to_disk_with_o_direct_then_is_fsynced(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if _direct_io_refused(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    import fcntl

    data = _page_aligned_bytes(3 * 4096 + 100)
    log: list[tuple[str, bool, int]] = []  # (call, O_DIRECT set on the descriptor, bytes)
    pwrite, write, fsync = os.pwrite, os.write, os.fsync

    def direct(fd: int) -> bool:
        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)

    def watched_pwrite(fd: int, buf: memoryview, offset: int) -> int:
        log.append(("pwrite", direct(fd), len(buf)))
        return pwrite(fd, buf, offset)

    def watched_write(fd: int, buf: memoryview) -> int:
        log.append(("write", direct(fd), len(buf)))
        return write(fd, buf)

    def watched_fsync(fd: int) -> None:
        log.append(("fsync", direct(fd), 0))
        fsync(fd)

    monkeypatch.setattr(os, "pwrite", watched_pwrite)
    monkeypatch.setattr(os, "write", watched_write)
    monkeypatch.setattr(os, "fsync", watched_fsync)
    store = LocalBackend(tmp_path)
    store.direct_write_bytes = 4096
    store.set("a/big", data)
    assert log == [("pwrite", True, 3 * 4096), ("write", False, 100), ("fsync", False, 0)]
    log.clear()
    store.set("a/small", data[:4095])  # below the threshold: through the page cache
    store.set("a/shifted", _page_aligned_bytes(3 * 4096 + 100, shift=8))  # not page-aligned: likewise
    store.direct_write_bytes = None
    store.set("a/off", data)
    assert log == [("write", False, 4095), ("fsync", False, 0), ("write", False, 3 * 4096 + 100),
                   ("fsync", False, 0), ("write", False, 3 * 4096 + 100), ("fsync", False, 0)]
    monkeypatch.undo()
    assert bytes(store.get("a/big")) == bytes(data)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")
@pytest.mark.parametrize("refusal", ["fcntl", "write"])
def test_a_file_system_that_refuses_o_direct_gets_the_bytes_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str) -> None:
    # Simulated refusals (tmpfs before Linux 6.6 refuses the flag; some devices an alignment):
    # this machine's file systems accept both.
    import errno
    import fcntl

    real_fcntl, real_pwrite = fcntl.fcntl, os.pwrite

    def refusing_fcntl(fd: int, cmd: int, arg: int = 0) -> int:
        if refusal == "fcntl" and cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return int(real_fcntl(fd, cmd, arg))

    def refusing_pwrite(fd: int, buf: memoryview, offset: int) -> int:
        if refusal == "write" and real_fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, buf, offset)

    monkeypatch.setattr(fcntl, "fcntl", refusing_fcntl)
    monkeypatch.setattr(os, "pwrite", refusing_pwrite)
    store = LocalBackend(tmp_path)
    store.direct_write_bytes = 4096
    data = _page_aligned_bytes(5 * 4096 + 3)
    store.set("a/x", data)
    monkeypatch.undo()
    assert bytes(store.get("a/x")) == bytes(data)


def test_a_write_error_under_o_direct_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(fd: int, buf: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    monkeypatch.setattr(os, "write", lambda fd, buf: full(fd, buf, 0))
    store = LocalBackend(tmp_path)
    store.direct_write_bytes = 4096
    with pytest.raises(StorageError, match="No space left"):
        store.set("a/x", _page_aligned_bytes(2 * 4096))
    monkeypatch.undo()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
