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
    MANIFEST_KEY,
    checkpoint_key,
    loads_document,
    parse_manifest,
    watermark_of,
    write_checkpoint,
)
from r3store.errors import FormatVersionError, NotAStoreError, ObjectNotFoundError
from r3store.reader._catalog import SampleCatalog
from r3store.storage import Backend, open_backend

__all__ = ["CompactResult", "compact"]


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


def compact(url: str | os.PathLike[str] | Backend, *, storage_options: Mapping[str, Any] | None = None,
            clock: Any = None) -> CompactResult:
    """Write a checkpoint of every sample committed so far (FORMAT.md section 11).

    Reads the newest valid checkpoint and the sample tables of the commits it does not
    cover (every table when there is none), then writes their rows, all of them
    (quarantined and duplicated ids included: readers resolve those as from the tables),
    as ``index/<covered:012d>-<random>.checkpoint``, created only if absent. Safe while
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
        Returns the current UTC datetime (tests).

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
        A sample table fails its checks (as :func:`r3store.open_reader`), or a write failed.

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
        raise NotAStoreError(backend.url) from exc
    path = backend.path_of(MANIFEST_KEY)
    manifest = parse_manifest(loads_document(raw, path), path)
    if manifest.version < 2:
        raise FormatVersionError(path, f"format version {manifest.version} stores are read-only; checkpoints need "
                                       "format version 2 (write new rollouts to a new store)")
    listed_at = now()  # before the listing: a table missing from it lands after this time
    catalog = SampleCatalog(backend, manifest, on_duplicate="report")
    rows = catalog.all_rows
    commits = len(catalog.commits)
    if catalog.checkpoint is not None and catalog.covered == set(catalog.commits):
        return CompactResult(key=catalog.checkpoint, written=False, commits=commits, samples=rows.num_rows,
                             nbytes=0, watermark=catalog.watermark)
    if not commits:
        return CompactResult(key=None, written=False, commits=0, samples=0, nbytes=0, watermark=None)
    blob = write_checkpoint(rows, json.dumps(manifest.spec.to_dict()), listed_at=listed_at, version=manifest.version)
    key = checkpoint_key(commits, uuid.uuid4().hex)
    backend.set_if_absent(key, blob)  # a fresh random name: never taken
    return CompactResult(key=key, written=True, commits=commits, samples=rows.num_rows, nbytes=len(blob),
                         watermark=watermark_of(listed_at))
