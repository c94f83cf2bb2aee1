"""What a writer must never do: lose its buffer on a failed commit, commit twice on a
retry, overwrite another writer's shard, or accept input that fails only at commit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import r3store
import r3store.audit
from r3store.errors import ChecksumError, NotAStoreError, RouteValidationError, SpecMismatchError, StorageError
from r3store.storage import LocalBackend
from r3store.testing import forge
from tests.routes import GOOD, SPEC6, SPEC_5X40
from tests.routes import check_store_after as _check_store_after
from tests.routes import seeded_routes as _routes

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


def routes(rows: int, shift: int = 0) -> np.ndarray:
    base = (np.arange(rows)[:, None, None] + np.arange(2)[None, :, None] + shift) % 8
    return np.concatenate([base, (base + 3) % 8], axis=-1).astype(np.int32)


class FlakyBackend(LocalBackend):
    """A local store whose writes of keys containing ``fail_on`` fail ``times`` times.

    With ``after_write`` the write lands before the error is raised: a response lost
    after the server applied the request (an ambiguous commit).
    """

    def __init__(self, root: Path, fail_on: str, times: int = 1, after_write: bool = False) -> None:
        super().__init__(root)
        self.fail_on, self.times, self.after_write = fail_on, times, after_write

    def _maybe_fail(self, key: str, write: object) -> object:
        if self.fail_on in key and self.times > 0:
            self.times -= 1
            if self.after_write:
                write()  # type: ignore[operator]
            raise StorageError(self.path_of(key), "injected failure")
        return write()  # type: ignore[operator]

    def set(self, key: str, data: bytes | memoryview) -> None:
        self._maybe_fail(key, lambda: super(FlakyBackend, self).set(key, data))

    def set_if_absent(self, key: str, data: bytes) -> bool:
        return bool(self._maybe_fail(key, lambda: super(FlakyBackend, self).set_if_absent(key, data)))


@pytest.mark.parametrize("bad_id", ["team/w1", ".hidden", "../../escaped", "w\x00x", "", "a" * 200])
def test_writer_id_syntax_is_enforced(tmp_path: Path, bad_id: str) -> None:
    with pytest.raises(ValueError, match="writer_id"):
        r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": bad_id})
    assert not any(tmp_path.iterdir())


def test_failed_close_keeps_every_sample_for_a_retry(tmp_path: Path) -> None:
    store = FlakyBackend(tmp_path, fail_on="c/0/0/0")
    writer = r3store.RouteWriter(store, SPEC)
    writer.append("a", routes(5))
    writer.append("b", routes(3, 1))
    with pytest.raises(StorageError, match="injected"):
        writer.close()
    assert len(r3store.open_store(tmp_path)) == 0  # nothing visible
    writer.close()  # the retry commits everything
    got = r3store.open_store(tmp_path)
    assert got.sample_ids == ["a", "b"]
    np.testing.assert_array_equal(got.get("b"), routes(3, 1))


def test_retry_after_an_ambiguous_commit_does_not_commit_twice(tmp_path: Path) -> None:
    store = FlakyBackend(tmp_path, fail_on="index/", after_write=True)
    writer = r3store.RouteWriter(store, SPEC)
    writer.append("a", routes(4))
    with pytest.raises(StorageError):
        writer.flush()  # the sample table landed, but the writer was told it failed
    shard = writer.flush()  # retried: finds its own commit record
    writer.append("b", routes(2))
    writer.close()
    got = r3store.open_store(tmp_path)  # on_duplicate="raise": no duplicate
    assert got.sample_ids == ["a", "b"]
    assert shard in got.commits
    assert len(got.commits) == 2


def test_two_writers_with_one_writer_id_never_share_a_shard(tmp_path: Path) -> None:
    first = r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": "rank0"})
    second = r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": "rank0"})
    first.append("a", routes(4))
    second.append("b", routes(4, 2))
    first.flush()
    second.flush()
    first.close()
    second.close()
    got = r3store.open_store(tmp_path)
    assert sorted(got.commits) == ["rank0-00000", "rank0-00001"]
    np.testing.assert_array_equal(got.get("a"), routes(4))
    np.testing.assert_array_equal(got.get("b"), routes(4, 2))


@pytest.mark.parametrize("case", ["surrogate-id", "surrogate-key", "int-float-beyond-2**53", "float-then-big-int"])
def test_input_that_parquet_cannot_hold_is_refused_at_append(tmp_path: Path, case: str) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("good", routes(3), metadata={"m": 2**60 + 1 if case == "int-float-beyond-2**53" else 0.5})
        with pytest.raises(RouteValidationError):  # noqa: PT012 - one append per case
            if case == "surrogate-id":
                w.append("bad-\ud800", routes(3))
            elif case == "surrogate-key":
                w.append("bad", routes(3), metadata={"k\udc80": 1})
            elif case == "int-float-beyond-2**53":
                w.append("bad", routes(3), metadata={"m": 0.5})
            else:
                w.append("bad", routes(3), metadata={"m": 2**53 + 1})
        w.append("later", routes(2), metadata={"m": 1})
    assert r3store.open_store(tmp_path).sample_ids == ["good", "later"]


def test_quarantine_survives_garbage_num_tokens_and_ids(tmp_path: Path) -> None:
    bad = routes(3)
    bad[0, 0, 1] = bad[0, 0, 0]
    with r3store.RouteWriter(tmp_path, SPEC, config={"on_invalid": "quarantine"}) as w:
        w.append("q", bad, num_tokens=2**70)
        with pytest.raises(RouteValidationError, match="sample_id"):
            w.append_sglang(12345, "!!notbase64")  # type: ignore[arg-type]
        with pytest.raises(RouteValidationError, match="sample_id"):
            w.append_sglang("", "!!notbase64")
        w.append("ok", routes(2))
    got = r3store.open_store(tmp_path)
    assert got.sample_ids == ["ok"]
    assert got.row("q", include_quarantined=True)["num_tokens"] == 4


def test_writer_never_writes_what_readers_refuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="chunk_rows x layers_per_chunk x top_k"):
        r3store.RouteWriter(tmp_path, SPEC, config={"chunk_rows": 2**26})
    # one-row chunks: a shard object stays within the reader's index-size bound
    with r3store.RouteWriter(tmp_path, SPEC,
                             config={"chunk_rows": 1, "layers_per_chunk": 1, "object_bytes": 1 << 30}) as w:
        w.append("a", routes(50))
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("a"), routes(50))


def test_layers_must_be_ints_listed_once(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", routes(3))
    store = r3store.open_store(tmp_path)
    for bad in ("1", [1.0], [True]):
        with pytest.raises(TypeError, match="layers"):
            store.get("a", layers=bad)  # type: ignore[arg-type]
    with pytest.raises(r3store.errors.LayerError, match="requested twice"):
        store.get("a", layers=[1, 1])


def test_writer_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(NotAStoreError) as info:
        r3store.RouteWriter(tmp_path, SPEC_5X40)
    assert "data.csv" in str(info.value)
    assert "other files" in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_writer_with_other_spec(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC_5X40) as w:
        for sid, routes in GOOD.items():
            w.append(sid, routes, metadata={"step": 0})
    before = _snapshot(tmp_path)
    other = r3store.ModelSpec(num_layers=5, num_experts=64, top_k=3, moe_layers=[1, 2, 4])
    with pytest.raises(SpecMismatchError) as info:
        r3store.RouteWriter(tmp_path, other)
    msg = str(info.value)
    assert str(tmp_path) in msg
    assert "num_experts 40 there vs 64" in msg
    assert info.value.expected == SPEC_5X40.to_dict()
    assert info.value.got == other.to_dict()
    assert info.value.fields == ("num_experts",)
    with pytest.raises(SpecMismatchError):
        r3store.RouteWriter(tmp_path, r3store.ModelSpec(num_layers=5, num_experts=40, top_k=3))  # moe_layers differ
    assert _snapshot(tmp_path) == before
    _check_store_after(str(tmp_path), later=False)


@pytest.mark.parametrize("resealed", [True, False])
def test_manifest_changed_under_a_writer(tmp_path: Path, resealed: bool) -> None:
    """Another spec (checksum recomputed) or a damaged manifest: the writer commits nothing."""
    w = r3store.RouteWriter(tmp_path, SPEC_5X40)
    w.append("g0", GOOD["g0"])
    if resealed:
        forge.reseal_manifest(tmp_path / "r3store.json", lambda d: d["spec"].update(num_experts=64))
    else:
        doc = json.loads((tmp_path / "r3store.json").read_text())
        doc["spec"]["num_experts"] = 64
        (tmp_path / "r3store.json").write_text(json.dumps(doc))
    with pytest.raises(SpecMismatchError if resealed else ChecksumError):
        w.flush()
    assert not (tmp_path / "index").exists() or not list((tmp_path / "index").rglob("*.parquet"))


class _FailTableOnce(LocalBackend):
    """Local storage whose first write of a sample table fails (an S3 PUT that timed out)."""

    failed = False

    def set_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith("index/") and not self.failed:
            self.failed = True
            raise StorageError(self.path_of(key), "injected failure")
        return super().set_if_absent(key, data)


def test_commit_retried_after_gc_delete_is_complete(tmp_path: Path) -> None:
    """Item 6: the retry "succeeded" without ``routes/<commit>/zarr.json``; every read then raised."""
    backend = _FailTableOnce(tmp_path)
    writer = r3store.RouteWriter(backend, SPEC6)
    writer.append("a", _routes(7, 3))
    with pytest.raises(StorageError, match="injected"):
        writer.flush()
    gone = r3store.audit.collect_garbage(tmp_path, older_than_s=0, delete=True)
    assert [g.commit for g in gone]
    assert not (tmp_path / "routes" / gone[0].commit / "zarr.json").exists()
    commit = writer.flush()
    writer.close()
    assert commit == gone[0].commit
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("a"), _routes(7, 3))
    assert r3store.audit.validate(store).ok


@pytest.mark.parametrize("sizes", [[37], [3, 30, 4], [16, 16, 5], [1] * 37, [4, 33]])
def test_row_spans_are_whole_blocks_that_never_cross_an_object(sizes: list[int]) -> None:
    from r3store._format import ArrayGeometry
    from r3store.writer._commit import _row_blocks

    geometry = ArrayGeometry.for_rows(37, num_moe_layers=4, top_k=3, codec={"id": "r3store.bitpack", "bits": 5},
                                      chunk_rows=4, layers_per_chunk=2, object_rows=16)
    ids = np.arange(37 * 12, dtype=np.uint16).reshape(37, 4, 3)
    parts = np.split(ids, np.cumsum(sizes)[:-1])
    got, row = [], 0
    for span in _row_blocks(iter(parts), geometry):
        assert len(span) % 4 == 0 or row + len(span) == 37  # only the array's last block is short
        assert row // 16 == (row + len(span) - 1) // 16  # inside one storage object
        got.append(span.copy())  # the straddling block's buffer is reused
        row += len(span)
    np.testing.assert_array_equal(np.concatenate(got), ids)


@pytest.mark.parametrize("direct", [4096, None])
def test_a_commit_writes_its_storage_object_directly_and_retries_recheck_the_array_document(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: int | None) -> None:
    # the object (page-aligned scratch) goes out with O_DIRECT where the file system takes it;
    # the first attempt does not re-read the array document it has just created, a retry does
    import os

    from r3store.storage import _local

    directly: dict[int, int] = {}  # object size -> bytes written with O_DIRECT (0: not page-aligned or refused)
    write_direct = _local._write_direct
    monkeypatch.setattr(_local, "_write_direct",
                        lambda fd, view: directly.setdefault(len(view), write_direct(fd, view)))
    backend = FlakyBackend(tmp_path / "s", fail_on="/c/", times=1)
    gets: list[str] = []
    get = backend.get
    monkeypatch.setattr(backend, "get", lambda key, byte_range=None: gets.append(key) or get(key, byte_range))
    written = routes(4000)
    with r3store.RouteWriter(backend, SPEC, {"direct_write_bytes": direct}) as writer:
        writer.append("a", written)
        with pytest.raises(StorageError):
            writer.flush()
        assert [k for k in gets if k.endswith("/zarr.json")] == []
        writer.flush()  # the retry
        assert len([k for k in gets if k.endswith("/zarr.json")]) == 1
    store = r3store.open_store(tmp_path / "s", reader={"cache_bytes": 0})
    np.testing.assert_array_equal(store.get("a"), written)
    (obj,) = [p for p in (tmp_path / "s" / "routes").rglob("*") if p.is_file() and p.name != "zarr.json"]
    size = os.path.getsize(obj)
    assert size > 4096
    if direct is None:
        assert directly == {}
    else:
        assert directly[size] in (0, size // 4096 * 4096)  # the object's whole pages, where the disk takes them
        probe = tmp_path / "probe"
        try:  # where the file system takes O_DIRECT, the object used it
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
        except (AttributeError, OSError):
            return
        assert directly[size] == size // 4096 * 4096
