"""``collect_garbage`` never deletes the one valid checkpoint that lists a commit whose sample
table was lost (its routes still there), even when newer checkpoints push it past
``KEEP_CHECKPOINTS``: were they damaged, the next ``gc --delete`` would find the commit listed
by no checkpoint and delete its routes for good (found by the fuzz campaign of this round)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import r3store
from r3store.audit import collect_garbage
from tests.reader.test_catalog_damaged_table import commit_of, write_three_commits
from tests.routes import SPEC_4X16, routes_4x16, sample_tables


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_gc_keeps_the_only_valid_checkpoint_listing_a_lost_tables_routes(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_three_commits(root)
    r3store.compact(str(root))  # checkpoint 1 lists every commit
    table = sample_tables(root)[1]
    commit = commit_of(table)
    table.unlink()  # a lost table: its commit is committed, its routes stay
    for i in range(2):  # two newer checkpoints (each carries the lost commit), both damaged later
        with r3store.RouteWriter(str(root), SPEC_4X16) as w:
            w.append(f"later{i}", routes_4x16(6, 100 + i))
        r3store.compact(str(root))
    old = time.time() - 7200
    for path in (root / "routes" / commit).rglob("*"):
        os.utime(path, (old, old))
    checkpoints = sorted((root / "index").glob("*.checkpoint"))
    assert len(checkpoints) == 3
    for path in checkpoints[1:]:
        _damage(path)
    for _ in range(3):
        found = collect_garbage(str(root), older_than_s=0, delete=True)
        assert checkpoints[0].is_file(), "the only valid checkpoint listing the lost table's commit was deleted"
        (lost,) = [f for f in found if f.commit == commit]
        assert lost.listed_by == f"index/{checkpoints[0].name}"
        assert any((root / "routes" / commit).rglob("c/*")), "a committed sample's routes were deleted"
