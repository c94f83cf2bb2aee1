"""The local-disk backend (``r3store/storage/_local.py``): keys that leave the root, special files, descriptors."""

from __future__ import annotations

import os
from pathlib import Path

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
