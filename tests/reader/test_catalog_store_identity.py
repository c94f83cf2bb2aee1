"""Issue 22 item 1: a store's checkpoints, sample tables and route arrays are tied to it (format v3 ``store_id``).

A checkpoint copied from another store whose commits have the same names (explicit writer
ids, a restored backup, a forked copy), under a key claiming more commits, was used with no
warning: ``row()`` returned the other store's rows and ``get("s0")`` this store's routes of
``s1``. A format v3 reader refuses it with a :class:`CheckpointWarning` and reads the sample
tables.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import CheckpointWarning, StoreIdentityError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def _routes(seed: int, rows: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.permutation(16)[:2] for _ in range(2)]) for _ in range(rows)]).astype(np.int32)


def _write(root: Path, commits: list[list[tuple[str, int]]]) -> None:
    """One commit per list entry, writer ids ``w0``, ``w1``, ... (explicit: the same names in every store)."""
    for c, samples in enumerate(commits):
        with r3store.RouteWriter(root, SPEC, config={"writer_id": f"w{c}"}) as w:
            for sid, rows in samples:
                w.append(sid, _routes(hash(sid) % 1000 + rows, rows), metadata={"origin": root.name})


def test_a_checkpoint_of_another_store_with_the_same_commit_names_is_refused(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    _write(mine, [[("s0", 6), ("s1", 9)], [("s2", 4)]])
    _write(other, [[("s1", 9), ("s0", 6)], [("s2", 5)], [("s3", 3)]])  # same commit names, other rows
    key = r3store.compact(other).key
    assert key is not None
    (mine / key).write_bytes((other / key).read_bytes())  # claims 3 commits: newer than anything of mine
    truth = r3store.open_store(mine, reader={"use_checkpoint": False})
    with pytest.warns(CheckpointWarning, match="of another store"):
        store = r3store.open_store(mine)
    assert store.checkpoint is None
    assert store.sample_ids == truth.sample_ids
    for sid in truth.sample_ids:
        assert store.row(sid) == truth.row(sid)
        assert store.row(sid)["origin"] == "mine"
        np.testing.assert_array_equal(store.get(sid), truth.get(sid))


def test_a_checkpoint_of_this_store_is_still_used(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _write(root, [[("s0", 6)], [("s1", 3)]])
    key = r3store.compact(root).key
    assert r3store.open_store(root).checkpoint == key


def test_a_fork_copies_the_identity_and_its_checkpoints_diverge(tmp_path: Path) -> None:
    """A byte copy of a store is the same store (same identity): its own checkpoints still read."""
    root = tmp_path / "store"
    _write(root, [[("s0", 6)]])
    shutil.copytree(root, tmp_path / "copy")
    key = r3store.compact(tmp_path / "copy").key
    assert r3store.open_store(tmp_path / "copy").checkpoint == key


def test_a_sample_table_of_another_store_is_refused(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    _write(mine, [[("s0", 6)]])
    _write(other, [[("x", 6)]])
    (table,) = (mine / "index").rglob("*.parquet")
    (theirs,) = (other / "index").rglob("*.parquet")
    table.write_bytes(theirs.read_bytes())  # same commit name w0-00000, same geometry
    with pytest.raises(StoreIdentityError, match="sample table of another store"):
        r3store.open_store(mine)


def test_a_route_array_of_another_store_is_refused(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    _write(mine, [[("s0", 6)]])
    _write(other, [[("s0", 6)]])
    for part in ("zarr.json", "c/0/0/0"):
        (mine / "routes" / "w0-00000" / part).write_bytes((other / "routes" / "w0-00000" / part).read_bytes())
    store = r3store.open_store(mine)
    with pytest.raises(StoreIdentityError, match="route array document of another store"):
        store.get("s0")


def test_a_manifest_without_its_identity_is_refused(tmp_path: Path) -> None:
    from r3store.testing import forge

    root = tmp_path / "store"
    _write(root, [[("s0", 6)]])
    forge.reseal_manifest(root / "r3store.json", lambda doc: doc.pop("store_id"))
    with pytest.raises(r3store.errors.FormatError, match="store_id"):
        r3store.open_store(root)
