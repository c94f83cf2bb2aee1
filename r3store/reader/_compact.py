"""``compact``: write a checkpoint, one Parquet file of the sample rows of every commit so far.

Opening a store reads one sample table per commit; a store that grows for weeks has tens of
thousands. A checkpoint (``index/<covered>-<token>.checkpoint``, FORMAT.md section 11)
holds the rows of the commits it covers, so a reader reads it plus the tables committed
after it. Sample tables stay the source of truth: nothing is deleted or rewritten.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from r3store._format import (
    INDEX_PREFIX,
    MANIFEST_KEY,
    checkpoint_key,
    loads_document,
    parse_manifest,
    watermark_of,
    write_checkpoint,
)
from r3store.errors import FormatVersionError, NotAStoreError, ObjectNotFoundError, StorageError
from r3store.reader._catalog import SampleCatalog, table_keys
from r3store.storage import Backend, open_backend

__all__ = ["CompactResult", "compact", "store_time"]


@dataclass(frozen=True)
class CompactResult:
    """What :func:`compact` did."""

    key: str | None
    """The checkpoint written (``index/<covered>-<token>.checkpoint``), or the existing one that already covered
    every commit (``written`` False); None for a store with no commit."""
    written: bool
    """Whether a new checkpoint was written."""
    commits: int
    """Commits it covers."""
    samples: int
    """Sample rows it holds (quarantined and duplicated ones included)."""
    nbytes: int
    """Its size in bytes (0 when nothing was written)."""
    watermark: str | None
    """Its watermark bucket: tables of commits it does not cover are in this bucket or newer."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, validated by ``schema/cli-compact.schema.json`` (``r3store compact --json``)."""
        return {"key": self.key, "written": self.written, "commits": self.commits, "samples": self.samples,
                "nbytes": self.nbytes, "watermark": self.watermark}


def store_time(backend: Backend) -> datetime | None:
    """The store's current time: the timestamp the storage gives a temporary object written now
    (``index/.clock-<random>``, ignored by readers and deleted at once); None if it gives none."""
    key = f"index/.clock-{uuid.uuid4().hex}"
    try:
        backend.set(key, b"")
        try:
            mtime = backend.info(key).mtime
        finally:
            backend.delete(key)
    except (StorageError, NotImplementedError):
        return None
    return None if mtime is None or mtime <= 0 else datetime.fromtimestamp(mtime, UTC)


def compact(url: str | os.PathLike[str] | Backend, *, storage_options: Mapping[str, Any] | None = None,
            clock: Any = None) -> CompactResult:
    """Write a checkpoint of every sample committed so far (FORMAT.md section 11).

    Reads the newest valid checkpoint and the sample tables of the commits it does not
    cover (every table when there is none), then writes their rows, all of them
    (quarantined and duplicated ids included: readers resolve those as from the tables),
    as ``index/<covered:012d>-<random>.checkpoint`` (checkpoint version 2: row groups with their
    own digests, a header naming the covered commits whose tables lie in buckets from the
    watermark on, found by listing those buckets once more), created only if absent. Safe while
    writers commit and while other compactions run: each checkpoint names exactly the
    commits whose rows it holds, and a reader reads every other commit from its table, so
    nothing is lost or counted twice; of several checkpoints readers take the one covering
    the most commits. Sample tables are never deleted or changed.

    Parameters
    ----------
    url : str, os.PathLike or Backend
        A format v2 store (local folder or fsspec URL).
    storage_options : mapping, optional
        Passed to fsspec.
    clock : callable, optional
        Returns the current UTC datetime (tests). The checkpoint's time is the earlier of it
        and the store's own time (the timestamp the storage gives a probe object written just
        before the listing, FORMAT.md section 12.2), so a clock ahead of the store's cannot
        put the watermark past a table that lands after the listing.

    Returns
    -------
    CompactResult
        Nothing is written when the newest valid checkpoint already covers every commit,
        or when the store has no commit.

    Raises
    ------
    r3store.errors.NotAStoreError
        No ``r3store.json`` at ``url``.
    r3store.errors.FormatVersionError
        A format v1 store (read-only: checkpoints are a format v2 feature).
    r3store.errors.FormatError, r3store.errors.StorageError
        A sample table fails its checks (as :func:`r3store.open_store`), or a write failed.

    Warns
    -----
    r3store.errors.CheckpointWarning
        An existing checkpoint failed its checks and was skipped.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)
    >>> path = tempfile.mkdtemp()
    >>> for step in range(3):
    ...     with r3store.RouteWriter(path, spec) as w:
    ...         w.append(f"s{step}", np.zeros((3, 1, 1), np.int64), metadata={"step": step})
    >>> result = compact(path)
    >>> result.written, result.commits, result.samples
    (True, 3, 3)
    >>> store = r3store.open_store(path)
    >>> store.checkpoint == result.key, len(store)
    (True, 3)
    """
    now = clock or (lambda: datetime.now(UTC))
    backend = open_backend(url, storage_options)
    try:
        raw = backend.get(MANIFEST_KEY)
    except ObjectNotFoundError as exc:
        raise NotAStoreError.missing_manifest(backend) from exc
    path = backend.path_of(MANIFEST_KEY)
    manifest = parse_manifest(loads_document(raw, path), path)
    if manifest.version < 2:
        raise FormatVersionError(path, f"format version {manifest.version} stores are read-only; checkpoints need "
                                       "format version 2 (write new rollouts to a new store)")
    listed_at = min(now(), store_time(backend) or now())  # before the listing: a table missing from it lands later
    catalog = SampleCatalog(backend, manifest, on_duplicate="report")
    rows = catalog.all_rows
    commits = len(catalog.commits)
    if catalog.checkpoint is not None and catalog.covered == set(catalog.commits):
        return CompactResult(key=catalog.checkpoint, written=False, commits=commits, samples=rows.num_rows,
                             nbytes=0, watermark=catalog.watermark)
    if not commits:
        return CompactResult(key=None, written=False, commits=0, samples=0, nbytes=0, watermark=None)
    watermark = watermark_of(listed_at)
    buckets = backend.list_children(INDEX_PREFIX)[1]
    late = table_keys([key for bucket in buckets if bucket >= watermark
                       for key in backend.list_prefix(f"{INDEX_PREFIX}{bucket}/")], manifest.version, backend.path_of)
    recent = set(late).intersection(catalog.commits)  # covered commits a reader must tell apart from newer ones
    blob = write_checkpoint(rows, json.dumps(manifest.spec.to_dict()), listed_at=listed_at,
                            version=manifest.version, store_id=manifest.store_id, recent=recent)
    key = checkpoint_key(commits, uuid.uuid4().hex)
    backend.set_if_absent(key, blob)  # a fresh random name: never taken
    return CompactResult(key=key, written=True, commits=commits, samples=rows.num_rows, nbytes=len(blob),
                         watermark=watermark)
