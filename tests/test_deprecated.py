"""Every deprecated alias (kept for one release) warns with DeprecationWarning and still works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
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
    assert not cached.immutable("r3store.json")
    assert not cached.immutable("routes/a/.x.tmp")


def test_handled_exceptions_alias() -> None:
    with pytest.deprecated_call(match="HANDLED_EXCEPTIONS"):
        handled = r3store.storage.HANDLED_EXCEPTIONS
    assert handled == r3store.storage.handled_exceptions()


def test_open_backend_cache_dir_without_immutable(tmp_path: Path) -> None:
    LocalBackend(tmp_path / "remote").set("index/w-00000.parquet", b"table")
    with pytest.deprecated_call(match="immutable"):
        backend = r3store.storage.open_backend(tmp_path / "remote", cache_dir=tmp_path / "cache")
    assert isinstance(backend, CachingBackend)
    assert backend.immutable("index/w-00000.parquet")
    assert bytes(backend.get("index/w-00000.parquet")) == b"table"


def test_store_tests_alias_takes_a_store_fixture() -> None:
    with pytest.deprecated_call(match="StoreTests"):
        kit: Any = r3store.testing.StoreTests
    assert issubclass(kit, r3store.testing.BackendTests)
    fixture = kit.__dict__["backend"]  # the old kit named its fixture "store"
    assert "store" in fixture.__wrapped__.__code__.co_varnames


# -- commit (was: shard) -----------------------------------------------------------------

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


def _store(root: Path) -> Any:
    with r3store.RouteWriter(root, SPEC) as w:
        w.append("a", np.tile(np.array([0, 1]), (3, 2, 1)))
        w.flush()
        w.append("b", np.tile(np.array([2, 3]), (4, 2, 1)))
    return w


def test_writer_shards_alias(tmp_path: Path) -> None:
    w = _store(tmp_path)
    with pytest.deprecated_call(match=r"RouteWriter.shards is deprecated.*RouteWriter.commits"):
        assert w.shards == w.commits
        assert len(w.commits) == 2


@pytest.mark.parametrize("old", ["shards", "committed_shards"])
def test_store_shards_aliases(tmp_path: Path, old: str) -> None:
    w = _store(tmp_path)
    store = r3store.open_store(tmp_path)
    with pytest.deprecated_call(match=f"RouteStore.{old} is deprecated.*commits"):
        assert getattr(store, old) == store.commits == sorted(w.commits)


def test_store_layout_of_alias(tmp_path: Path) -> None:
    _store(tmp_path)
    store = r3store.open_store(tmp_path)
    array = store.row("a")["array"]
    with pytest.deprecated_call(match="layout_of.*geometry_of"):
        assert store.layout_of(array) == store.geometry_of(array)


def test_duplicate_sample_error_shards_alias() -> None:
    err = r3store.errors.DuplicateSampleError("x", ("w-00001", "w-00000"))
    with pytest.deprecated_call(match="DuplicateSampleError.shards"):
        assert err.shards == err.commits == ("w-00001", "w-00000")


def test_leftover_shard_alias() -> None:
    from r3store.audit import Leftover

    item = Leftover(commit="w-00003", keys=("routes/w-00003/zarr.json",), nbytes=10, age_s=5.0)
    with pytest.deprecated_call(match="Leftover.shard"):
        assert item.shard == "w-00003"
    assert item.to_dict()["shard"] == item.to_dict()["commit"] == "w-00003"  # JSON keeps the old key one release


# -- data-parallel rank names ---------------------------------------------------------------


def test_route_dataset_rank_and_world_size_keywords(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _store(tmp_path)
    with pytest.deprecated_call(match=r"RouteDataset\(rank=...\) is deprecated.*dp_rank="):
        old = r3store.RouteDataset(tmp_path, max_tokens_per_batch=4, rank=1, dp_size=2)
    with pytest.deprecated_call(match=r"RouteDataset\(world_size=...\).*dp_size="):
        also_old = r3store.RouteDataset(tmp_path, max_tokens_per_batch=4, dp_rank=1, world_size=2)
    new = r3store.RouteDataset(tmp_path, max_tokens_per_batch=4, dp_rank=1, dp_size=2)
    assert old.state_dict() == also_old.state_dict() == new.state_dict()
    assert [b["sample_ids"] for b in old] == [b["sample_ids"] for b in new]
    with pytest.raises(TypeError, match="both rank="):
        r3store.RouteDataset(tmp_path, rank=0, dp_rank=0)


def test_route_dataset_store_attribute(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _store(tmp_path)
    ds = r3store.RouteDataset(tmp_path)
    with pytest.deprecated_call(match="RouteDataset.store.*RouteDataset.reader"):
        assert ds.store is ds.reader


def test_plan_batches_num_replicas_keyword() -> None:
    pytest.importorskip("torch")
    from r3store.dataset import plan_batches

    with pytest.deprecated_call(match=r"plan_batches\(num_replicas=...\).*dp_size="):
        old = plan_batches([5, 5, 5], 5, shuffle=False, seed=0, epoch=0, num_replicas=2)
    new = plan_batches([5, 5, 5], 5, shuffle=False, seed=0, epoch=0, dp_size=2)
    assert [b.tolist() for b in old] == [b.tolist() for b in new]


def test_writer_shard_bytes_keyword(tmp_path: Path) -> None:
    with pytest.deprecated_call(match=r"RouteWriter\(shard_bytes=...\).*object_bytes="):
        w = r3store.RouteWriter(tmp_path, SPEC, shard_bytes=1000)
    assert w.config.object_bytes == 1000
    w.close()
    with pytest.raises(TypeError, match="both shard_bytes="):
        r3store.RouteWriter(tmp_path, SPEC, shard_bytes=1000, object_bytes=1000)


def test_writer_store_attribute(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w, pytest.deprecated_call(match="RouteWriter.store.*backend"):
        assert w.store is w.backend


@pytest.mark.parametrize(("old", "new"), [("buffer_bytes", "buffer_bytes"), ("chunk_rows", "chunk_rows"),
                                          ("layers_per_chunk", "layers_per_chunk"), ("shard_bytes", "object_bytes"),
                                          ("on_invalid", "on_invalid")])
def test_writer_setting_attributes(tmp_path: Path, old: str, new: str) -> None:
    with r3store.RouteWriter(tmp_path, SPEC, object_bytes=999, chunk_rows=7) as w, \
            pytest.deprecated_call(match=f"RouteWriter.{old} is deprecated.*RouteWriter.config.{new}"):
        assert getattr(w, old) == getattr(w.config, new)
