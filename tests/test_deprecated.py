"""Every deprecated alias (kept for one release) warns with DeprecationWarning and still works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import r3store
import r3store.storage
import r3store.testing
from r3store.storage import Backend, ByteRange, CachingBackend, FsspecBackend, LocalBackend

# -- storage names -------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [("Store", Backend), ("LocalStore", LocalBackend),
                                          ("FsspecStore", FsspecBackend)])
def test_storage_class_aliases(old: str, new: type) -> None:
    with pytest.deprecated_call(match=f"r3store.storage.{old} is deprecated.*{new.__name__}"):
        alias = getattr(r3store.storage, old)
    assert alias is new
    assert old not in r3store.storage.__all__


def test_caching_store_alias_keeps_its_old_signature(tmp_path: Path) -> None:
    remote = LocalBackend(tmp_path / "remote")
    remote.set("routes/a/c/0/0/0", b"0123456789")
    remote.set("r3store.json", b"{}")
    with pytest.deprecated_call(match="CachingStore"):
        legacy = r3store.storage.CachingStore
    cached = legacy(remote, tmp_path / "cache")  # default: r3store's write-once prefixes
    assert isinstance(cached, CachingBackend)
    assert bytes(cached.get("routes/a/c/0/0/0", ByteRange(2, 5))) == b"234"
    remote.delete("routes/a/c/0/0/0")
    assert bytes(cached.get("routes/a/c/0/0/0")) == b"0123456789"  # served from the copy
    assert not cached.immutable("r3store.json") and not cached.immutable("routes/a/.x.tmp")


def test_handled_exceptions_alias() -> None:
    with pytest.deprecated_call(match="HANDLED_EXCEPTIONS"):
        handled = r3store.storage.HANDLED_EXCEPTIONS
    assert handled == r3store.storage.handled_exceptions()


def test_open_backend_cache_dir_without_immutable(tmp_path: Path) -> None:
    LocalBackend(tmp_path / "remote").set("index/w-00000.parquet", b"table")
    with pytest.deprecated_call(match="immutable"):
        backend = r3store.storage.open_backend(tmp_path / "remote", cache_dir=tmp_path / "cache")
    assert isinstance(backend, CachingBackend) and backend.immutable("index/w-00000.parquet")
    assert bytes(backend.get("index/w-00000.parquet")) == b"table"


def test_store_tests_alias_takes_a_store_fixture() -> None:
    with pytest.deprecated_call(match="StoreTests"):
        kit: Any = r3store.testing.StoreTests
    assert issubclass(kit, r3store.testing.BackendTests)
    fixture = kit.__dict__["backend"]  # the old kit named its fixture "store"
    assert "store" in fixture.__wrapped__.__code__.co_varnames
