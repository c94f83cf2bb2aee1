"""``collect_garbage``: find and remove uncommitted leftovers, route arrays of commits that never happened."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from r3store._deprecated import renamed_property
from r3store._format import MANIFEST_KEY, Manifest, is_temporary_key, loads_document, parse_manifest
from r3store.errors import CheckpointWarning, NotAStoreError
from r3store.reader import checkpoint_keys, committed_commits, load_checkpoint, uncommitted_route_objects
from r3store.storage import Backend, ObjectInfo, open_backend

__all__ = ["KEEP_CHECKPOINTS", "Leftover", "checkpoint_listed", "collect_garbage", "later_commit_of_writer"]

KEEP_CHECKPOINTS = 2
"""Checkpoints ``gc`` keeps (the newest; an older one is the fallback while a newer one is damaged)."""


@dataclass(frozen=True)
class Leftover:
    """Objects of one uncommitted commit (or one stray temporary file)."""

    commit: str
    """Commit name, or the key of a temporary file."""
    keys: tuple[str, ...]
    """Keys of its objects."""
    nbytes: int
    """Their total size in bytes."""
    age_s: float
    """Seconds since the newest of them was modified."""
    listed_by: str | None = None
    """A checkpoint (``index/*.checkpoint``) that lists this commit as committed: its sample table
    was lost (deleted, or not copied or synced), not a crashed writer's. ``gc --delete`` never
    deletes such routes (they are the commit's samples; the checkpoint still holds its rows)."""

    shard = renamed_property("shard", "commit")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``schema/cli-gc.schema.json`` version 2: no ``shard`` key, use ``commit``)."""
        age = round(self.age_s, 1) if self.age_s != float("inf") else None
        return {"commit": self.commit, "keys": list(self.keys), "nbytes": self.nbytes,
                "age_s": age, "listed_by": self.listed_by}


def checkpoint_listed(backend: Backend, manifest: Manifest | None = None) -> dict[str, str]:
    """Commits that a checkpoint of the store lists as committed, each with the newest such
    checkpoint's key (checkpoints that fail their checks are passed over, without a warning).

    A route array of one of these commits with no sample table is a committed sample whose
    table was lost, never a crashed writer's leftover. Reads every checkpoint whole.
    """
    if manifest is None:
        path = backend.path_of(MANIFEST_KEY)
        manifest = parse_manifest(loads_document(backend.get(MANIFEST_KEY), path), path)
    out: dict[str, str] = {}
    for key in checkpoint_keys(backend):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)
            loaded = load_checkpoint(backend, manifest, keys=[key])
        if loaded is not None:
            for commit in loaded.info.commits:
                out.setdefault(commit, key)
    return out


def later_commit_of_writer(commit: str, committed: Collection[str]) -> str | None:
    """A committed commit of the same writer made after ``commit`` (names ``<writer_id>-<seq>``),
    or None. A writer that committed again after ``commit`` did not crash while writing it: its
    routes with no sample table more likely lost their table (a hint, not a proof: a commit
    whose table write failed is retried under the same name, never skipped)."""
    writer, sep, seq = commit.rpartition("-")
    if not sep or not seq.isdigit():
        return None
    later = [c for c in committed if c.rpartition("-")[0] == writer and c.rpartition("-")[2].isdigit()
             and int(c.rpartition("-")[2]) > int(seq)]
    return min(later, key=lambda c: int(c.rpartition("-")[2])) if later else None


def collect_garbage(
    url: str | os.PathLike[str] | Backend,
    *,
    older_than_s: float = 3600.0,
    delete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Leftover]:
    """List (and with ``delete`` remove) uncommitted leftovers older than ``older_than_s``.

    A leftover is a ``routes/<commit>/`` array with no sample table (``index/<bucket>/<commit>.parquet``; a
    writer died or failed before committing; see
    :func:`r3store.reader.uncommitted_route_objects`), a temporary file
    (``.<name>.tmp``), or a superseded checkpoint (``index/*.checkpoint`` other than the
    :data:`KEEP_CHECKPOINTS` newest: readers take the newest valid one), unless it is the
    newest valid checkpoint listing a commit whose routes have no sample table (the newer
    ones may be damaged: that commit would be listed by none, and its routes deleted). Committed arrays
    and sample tables are never touched (a checkpoint is a cache of the tables, which stay
    the source of truth): the commit record is re-checked right before each delete.

    Routes with no sample table are not always a crashed writer's: a committed sample whose
    table was lost (deleted, or left out of a copy or sync) looks the same, and deleting its
    routes loses it for good. A commit that a valid checkpoint lists is such a sample: it is
    listed (:attr:`Leftover.listed_by`) but never deleted. Without a checkpoint the two cannot
    be told apart for sure; a later commit of the same writer
    (:func:`later_commit_of_writer`) or routes much older than the writer's last commit
    point to a lost table.

    Parameters
    ----------
    url : str, os.PathLike or Backend
    older_than_s : float
        Only leftovers whose newest object is at least this old (seconds). Choose it
        longer than any writer's flush, so a commit still being written is left alone.
    delete : bool
        Remove what is found; otherwise only list it.
    storage_options : mapping, optional
        Passed to fsspec.

    Returns
    -------
    list of Leftover

    Raises
    ------
    r3store.errors.NotAStoreError
    r3store.errors.StorageError
    """
    backend = open_backend(url, storage_options)
    if not backend.exists(MANIFEST_KEY):
        raise NotAStoreError.missing_manifest(backend)
    now = time.time()
    committed = set(committed_commits(backend))
    listing = backend.list_info("")
    groups: dict[str, dict[str, ObjectInfo]] = dict(uncommitted_route_objects(listing, committed))
    listed = checkpoint_listed(backend) if groups else {}
    grouped = {key for objects in groups.values() for key in objects}
    for key, info in listing.items():
        if is_temporary_key(key) and key.endswith(".tmp") and key not in grouped:
            groups[key] = {key: info}
    # a superseded checkpoint that is the newest valid one listing a lost table's commit stays: were
    # the newer ones damaged, deleting it would leave those routes listed by none, deleted next time
    needed = {listed[name] for name in groups if name in listed}
    for key in checkpoint_keys(backend, [k for k in listing if k.count("/") == 1])[KEEP_CHECKPOINTS:]:
        if key not in needed:
            groups[key] = {key: listing[key]}
    found = []
    for name, objects in sorted(groups.items()):
        times = [info.mtime for info in objects.values() if info.mtime is not None]
        age = now - max(times) if times else float("inf")
        if age < older_than_s:
            continue
        nbytes = sum(info.size for info in objects.values())
        found.append(Leftover(commit=name, keys=tuple(objects), nbytes=nbytes, age_s=age, listed_by=listed.get(name)))
        if delete and name not in listed and name not in committed_commits(backend):  # re-listed: its table may
            # have landed since
            for key in objects:
                backend.delete(key)
    return found
