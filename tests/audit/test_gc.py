"""A lost sample table is not a crashed writer: ``collect_garbage`` never deletes the routes of a
commit a checkpoint lists, and ``validate``'s ``uncommitted`` finding says how to tell."""

from __future__ import annotations

import os
import time
from pathlib import Path

import r3store
from r3store.audit import collect_garbage, validate
from r3store.audit._gc import later_commit_of_writer
from tests.reader.test_catalog_damaged_table import commit_of, write_three_commits
from tests.routes import sample_tables


def _lose_table(root: Path, compacted: bool) -> str:
    """Delete the middle commit's sample table (a partial sync); its routes stay. Returns the commit."""
    write_three_commits(root)
    if compacted:
        r3store.compact(str(root))
    table = sample_tables(root)[1]
    table.unlink()
    old = time.time() - 7200
    for path in (root / "routes" / commit_of(table)).rglob("*"):
        os.utime(path, (old, old))
    return commit_of(table)


def test_gc_delete_keeps_the_routes_of_a_commit_a_checkpoint_lists(tmp_path: Path) -> None:
    root = tmp_path / "store"
    commit = _lose_table(root, compacted=True)
    (found,) = collect_garbage(str(root), older_than_s=0, delete=True)
    assert found.commit == commit
    assert found.listed_by is not None
    assert found.listed_by.endswith(".checkpoint")
    assert found.to_dict()["listed_by"] == found.listed_by
    assert (root / "routes" / commit).is_dir()  # not deleted
    assert any((root / "routes" / commit).rglob("c/*"))
    store = r3store.open_store(root)  # the checkpoint still holds its rows: all 6 samples read
    assert len(store.sample_ids) == 6
    (finding,) = [f for f in validate(store).findings if f.kind == "uncommitted"]
    assert "lists this commit as committed" in finding.detail
    assert "table was lost" in finding.detail


def test_without_a_checkpoint_the_finding_names_the_writers_later_commit(tmp_path: Path) -> None:
    root = tmp_path / "store"
    commit = _lose_table(root, compacted=False)
    store = r3store.open_store(root)
    later = [c for c in store.commits if c > commit]
    (finding,) = [f for f in validate(store).findings if f.kind == "uncommitted"]
    assert f"committed {later[0]!r} later" in finding.detail
    assert "for good" in finding.detail
    (found,) = collect_garbage(str(root), older_than_s=0)
    assert found.listed_by is None


def test_later_commit_of_writer() -> None:
    assert later_commit_of_writer("w-a-00001", ["w-a-00000", "w-a-00003", "w-a-00002", "w-b-00009"]) == "w-a-00002"
    assert later_commit_of_writer("w-a-00003", ["w-a-00000", "w-b-00009"]) is None
    assert later_commit_of_writer("plain", ["plain-1"]) is None
