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
