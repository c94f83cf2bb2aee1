"""The sample catalogue: every committed sample table of a store, checked, merged and indexed.

A commit is visible once its sample table exists (``index/<bucket>/<commit>.parquet`` in
format v2, ``index/<commit>.parquet`` in v1; FORMAT.md section 2); the catalogue is what
readers know of a store besides the route bytes: which commits exist, which sample lives
in which rows of which route array (and which of its rows are missing, which policy
version made which rows), which ids were committed twice, and which route objects belong
to no commit (leftovers of a crashed writer).

The catalogue can start from rows loaded elsewhere (:class:`Preloaded`: a verified
table of sample rows and the set of commits they cover, e.g. a checkpoint); it then reads
only the sample tables of the other commits. A complete catalogue of a format v2 store
starts from the store's newest valid checkpoint (``index/<covered>-<token>.checkpoint``, written by
:func:`r3store.compact`; FORMAT.md section 11) and lists only the buckets that may hold
tables it does not cover; a damaged checkpoint is skipped with a
:class:`r3store.errors.CheckpointWarning`. :meth:`SampleCatalog.refresh` adds commits made
since.

From a version 2 checkpoint (FORMAT.md section 11.1) the catalogue opens from the
checkpoint's header: it reads the tables of the commits the header does not name, checks
their ids against the header's Bloom filter, and counts the visible samples from the
header; the checkpoint's rows are read and checked (every group's digest, every row) on
first use of anything that needs them (:attr:`SampleCatalog.samples`, a lookup, the commit
list, a route array's row count). Rows that then fail their checks are dropped with a
``CheckpointWarning`` and the covered commits' sample tables read instead.

From a version 3 checkpoint (FORMAT.md section 11.2: one Bloom filter per row group, and the
store-order key of its last row), a lookup of one sample (:meth:`SampleCatalog.locate`, ``in``,
the per-row lists at the row it returns, :meth:`SampleCatalog.row`) reads and checks only the
row group(s) whose filter may hold the id (and a neighbour group when the sample's commit
runs over a group boundary, so its route array's row count is whole) while the open was
settled by the header. The row numbers it hands out are those :attr:`SampleCatalog.samples`
gives the same samples once every row is read (checked then: a mismatch is a
``FormatError``). Whatever needs every row still reads them all, once.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import cached_property
from typing import Any, Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from r3store._checks import parse_choice
from r3store._format import (
    CHECKPOINT_PREFIX,
    COMMIT_NAME,
    INDEX_PREFIX,
    MANIFEST_KEY,
    ROUTES_PREFIX,
    CheckpointHeader,
    CheckpointInfo,
    Manifest,
    array_key,
    array_rows,
    commit_of_route_key,
    commit_of_table_key,
    is_bucket,
    parse_checkpoint_key,
    parse_ranges,
    parse_spans,
    parse_table_key,
    read_checkpoint,
    read_checkpoint_groups,
    read_checkpoint_header,
    read_table,
    rows_in_store_order,
    table_key,
    table_schema,
)
from r3store.errors import (
    CheckpointWarning,
    ChecksumError,
    DamagedTableWarning,
    DuplicateSampleError,
    FormatError,
    MetadataTypeWarning,
    ObjectNotFoundError,
    OptionError,
    SampleNotFoundError,
    SampleTooLargeError,
)
from r3store.reader._filter import filter_samples
from r3store.storage import Backend

__all__ = [
    "ON_DAMAGED_TABLE",
    "ON_DUPLICATE",
    "LoadedCheckpoint",
    "OnDamagedTable",
    "OnDuplicate",
    "Preloaded",
    "SampleCatalog",
    "StorageUsage",
    "checkpoint_keys",
    "committed_commits",
    "load_checkpoint",
    "parse_commits",
    "read_all_rows",
    "storage_usage",
    "table_keys",
    "uncommitted_route_objects",
]

OnDuplicate = Literal["raise", "first", "report"]
ON_DUPLICATE = ("raise", "first", "report")

OnDamagedTable = Literal["raise", "skip"]
ON_DAMAGED_TABLE = ("raise", "skip")

V = TypeVar("V")


@dataclass(frozen=True)
class StorageUsage:
    """Bytes a store's objects take, split by commit state."""

    route_bytes: int
    """Storage objects (``routes/<commit>/c/...``) of committed route arrays."""
    index_bytes: int
    """Objects under ``index/`` (the sample tables)."""
    uncommitted: dict[str, int]
    """Bytes under ``routes/<commit>/`` of each commit with no sample table (leftovers)."""


def committed_commits(backend: Backend) -> list[str]:
    """Names of the commits whose sample table exists (sorted), from one listing of ``index/``."""
    found = {commit_of_table_key(key) for key in backend.list_prefix(INDEX_PREFIX)}
    return sorted(commit for commit in found if commit is not None)


def table_keys(keys: list[str], version: int, path_of: Callable[[str], str] = str) -> dict[str, list[str]]:
    """The sample-table keys of a listing of ``index/``, by commit (checked for the format version).

    Parameters
    ----------
    keys : list of str
        Keys under ``index/`` (others, and temporary files, are skipped).
    version : {1, 2}
        Format v2 tables are ``index/<bucket>/<commit>.parquet``; v1 tables
        ``index/<commit>.parquet``.
    path_of : callable, optional
        A key's location, for messages.

    Returns
    -------
    dict of str to list of str
        Commit -> its table keys (one, unless a late retry wrote a second bucket), sorted.

    Raises
    ------
    r3store.errors.FormatError
        A table key of the other layout, a bucket that is not a UTC hour, or a commit name
        that does not match :data:`r3store._format.COMMIT_NAME`.
    """
    out: dict[str, list[str]] = {}
    for key in keys:
        parsed = parse_table_key(key)
        if parsed is None:
            continue
        bucket, commit = parsed
        where = path_of(key)
        if version >= 2 and (bucket is None or not is_bucket(bucket)):
            raise FormatError(where, "a format v2 sample table must be index/<bucket>/<commit>.parquet with <bucket> "
                                     "a UTC hour yyyymmddTHH")
        if version == 1 and bucket is not None:
            raise FormatError(where, f"commit name {bucket + '/' + commit!r} does not match {COMMIT_NAME.pattern} "
                                     "(format v1 tables are index/<commit>.parquet)")
        if not COMMIT_NAME.fullmatch(commit):
            raise FormatError(where, f"commit name {commit!r} does not match {COMMIT_NAME.pattern}")
        out.setdefault(commit, []).append(key)
    return {commit: sorted(found) for commit, found in sorted(out.items())}


@dataclass(frozen=True)
class Preloaded:
    """Sample rows a catalogue starts from, and the commits they cover.

    The rows must be verified by whoever loaded them (e.g. a checkpoint with its digest)
    and have the format v2 columns; the catalogue reads only the sample tables of commits
    not in :attr:`commits`.
    """

    table: pa.Table
    """Sample rows (the columns of ``table_schema(2)``, then user metadata)."""
    commits: frozenset[str]
    """The commits whose rows :attr:`table` holds (all of each commit's rows)."""


def checkpoint_keys(backend: Backend, files: list[str] | None = None) -> list[str]:
    """Keys of a store's checkpoints, newest first (most commits covered, then name).

    Parameters
    ----------
    backend : Backend
    files : list of str, optional
        The keys directly under ``index/`` (from :meth:`Backend.list_children`); listed
        when not given.
    """
    if files is None:
        files = backend.list_children(CHECKPOINT_PREFIX)[0]
    found = [(count, key) for key in files if (count := parse_checkpoint_key(key)) is not None]
    return [key for _, key in sorted(found, reverse=True)]


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint that passed its checks."""

    key: str
    """``index/<covered>-<token>.checkpoint``."""
    table: pa.Table
    """Every row of the commits it covers (format v2 columns, then user metadata)."""
    info: CheckpointInfo
    """The commits it covers and its watermark bucket."""


def load_checkpoint(backend: Backend, manifest: Manifest, *, max_sample_rows: int | None = None,
                    keys: list[str] | None = None) -> LoadedCheckpoint | None:
    """The newest checkpoint of a store that passes its checks, or None.

    Parameters
    ----------
    backend : Backend
    manifest : Manifest
        The store's manifest (its spec is compared with the checkpoint's).
    max_sample_rows : int, optional
        Cap on rows per sample (default: the manifest's).
    keys : list of str, optional
        Checkpoints to try, in order (default: :func:`checkpoint_keys`).

    Raises
    -------
    r3store.errors.SampleTooLargeError
        An intact checkpoint (its digest matches) holds a sample over ``max_sample_rows``:
        the cap's error, as the sample tables would raise it, with no warning before it.

    Warns
    -----
    r3store.errors.CheckpointWarning
        For each checkpoint skipped: damaged, partial, of another spec, of another store
        (format v3: its ``store_id`` differs from the manifest's), or deleted while being read.
        The next older one is tried; with none left the caller reads the sample tables.
    """
    if manifest.version < 2:
        return None
    cap = manifest.max_sample_rows if max_sample_rows is None else max_sample_rows
    for key in checkpoint_keys(backend) if keys is None else keys:
        path = backend.path_of(key)
        try:
            table, info = read_checkpoint(bytes(backend.get(key)), path, spec=manifest.spec,
                                          spec_source=backend.path_of(MANIFEST_KEY), max_sample_rows=cap,
                                          version=manifest.version, store_id=manifest.store_id)
        except SampleTooLargeError:
            raise  # its digest matched: the sample tables hold the same sample, over the same cap (no warning)
        except (FormatError, ObjectNotFoundError) as exc:
            fault = exc.fault if isinstance(exc, FormatError) else "deleted while being read"
            warnings.warn(CheckpointWarning(path, fault), stacklevel=3)
            continue
        return LoadedCheckpoint(key=key, table=table, info=info)
    return None


def read_all_rows(backend: Backend, manifest: Manifest, *, damaged: dict[str, str] | None = None) -> pa.Table:
    """Every row of every sample table of a store (read from the tables, no checkpoint; duplicates
    kept), in store order: what a checkpoint of all commits would hold (audits compare them).

    Parameters
    ----------
    damaged : dict, optional
        Given: a sample table that fails its checks is left out (no warning) and its commit
        added here with the fault (as :attr:`SampleCatalog.skipped`). Not given: it raises.
    """
    if damaged is None:
        return SampleCatalog(backend, manifest, on_duplicate="report", use_checkpoint=False).all_rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedTableWarning)
        catalog = SampleCatalog(backend, manifest, on_duplicate="report", use_checkpoint=False,
                                on_damaged_table="skip")
    damaged.update(catalog.skipped)
    return catalog.all_rows


def uncommitted_route_objects(listing: Mapping[str, V], committed: Collection[str]) -> dict[str, dict[str, V]]:
    """Objects under ``routes/<commit>/`` of commits that have no sample table, by commit.

    The one rule for "uncommitted" (used by ``r3store gc``, ``inspect`` and ``validate``):
    a route array is committed exactly when its sample table (``index/<bucket>/<commit>.parquet``; v1:
    ``index/<commit>.parquet``) exists.

    Parameters
    ----------
    listing : mapping of str to object
        Keys of the store (at least those under ``routes/``) to any per-key value (a
        size, an :class:`r3store.storage.ObjectInfo`).
    committed : collection of str
        The committed commits (:func:`committed_commits`).

    Returns
    -------
    dict of str to dict of str to object
        Commit -> {key: value} of its objects, commits and keys in listing order.

    Examples
    --------
    >>> uncommitted_route_objects({"routes/a/zarr.json": 1, "routes/b/c/0/0/0": 2, "routes/zarr.json": 3}, {"a"})
    {'b': {'routes/b/c/0/0/0': 2}}
    """
    groups: dict[str, dict[str, V]] = {}
    for key, value in listing.items():
        commit = commit_of_route_key(key)
        if commit is not None and commit not in committed:
            groups.setdefault(commit, {})[key] = value
    return groups


def storage_usage(backend: Backend, committed: Collection[str]) -> StorageUsage:
    """Bytes of committed route objects, of sample tables, and of uncommitted leftovers."""
    sizes = backend.list_sizes(ROUTES_PREFIX)
    done = sum(size for key, size in sizes.items()
               if commit_of_route_key(key) in committed and key.split("/")[2] == "c")
    groups = uncommitted_route_objects(sizes, committed)
    leftover = {commit: sum(objects.values()) for commit, objects in groups.items()}
    index_bytes = sum(backend.list_sizes(INDEX_PREFIX).values())
    return StorageUsage(route_bytes=done, index_bytes=index_bytes, uncommitted=leftover)


class SampleCatalog:
    """The committed samples of a store (loaded once, then read-only; shareable across threads).

    Parameters
    ----------
    backend : Backend
    manifest : Manifest
        The store's manifest: its format version, spec (every table's must equal it) and
        cap on rows per sample.
    on_duplicate : {"raise", "first", "report"}
        A sample id committed twice: raise, keep the earliest commit, or keep it and
        list the duplicates in :attr:`duplicates`.
    on_damaged_table : {"raise", "skip"}
        A sample table that fails its checks (a ``ChecksumError``, or a ``FormatError`` that
        is not about the spec, the store's identity, the format version or the row cap):
        raise, or leave its commit out with a :class:`r3store.errors.DamagedTableWarning`
        and list it in :attr:`skipped` (see ``ReaderOptions.on_damaged_table``).
    max_sample_rows : int, optional
        Cap on rows per sample (default: the manifest's).
    preloaded : Preloaded, optional
        Rows already loaded and verified, with the commits they cover.
    commits : collection of str, optional
        Load only these commits' sample tables (format v1: read by key, ``index/`` is not
        listed; format v2: one listing of ``index/`` finds their buckets). Duplicates are
        then resolved among these commits only.

    Attributes
    ----------
    samples : pyarrow.Table
        One row per committed sample (quarantined ones included), in store order
        (``committed_at``, then commit name, then row).
    duplicates : dict of str to list of str
        Ids committed by more than one commit, with the commits (earliest first).
    commits : list of str
        The committed commits (those asked for, with ``commits``), in name order.
    complete : bool
        Whether every committed commit was loaded (no ``commits`` restriction).
    skipped : dict of str to str
        Commits left out because their sample table is damaged (``on_damaged_table="skip"``),
        with the fault (``"<table path>: <what is wrong>"``), in name order.
    array_rows : dict of str to int
        Rows each committed route array must have (``routes/<commit>`` -> the end of its
        table's last sample).

    Raises
    ------
    r3store.errors.FormatError
        A sample table is malformed (see :func:`r3store.open_store`); ChecksumError when it
        fails its checksums, SpecConflictError when its spec differs from the manifest's,
        SampleTooLargeError when a sample has more rows than the cap.
    r3store.errors.DuplicateSampleError
        With ``on_duplicate="raise"``.
    r3store.errors.OptionError
        ``on_duplicate`` is not one of the choices, or ``commits`` holds a string that is
        not a commit name.
    r3store.errors.ObjectNotFoundError
        A commit of ``commits`` has no sample table.
    """

    def __init__(self, backend: Backend, manifest: Manifest, *, on_duplicate: OnDuplicate = "raise",
                 max_sample_rows: int | None = None, preloaded: Preloaded | None = None,
                 commits: Collection[str] | None = None, filter: pc.Expression | None = None,
                 use_checkpoint: bool = True, on_damaged_table: OnDamagedTable = "raise") -> None:
        parse_choice("on_duplicate", on_duplicate, ON_DUPLICATE)
        parse_choice("on_damaged_table", on_damaged_table, ON_DAMAGED_TABLE)
        self.on_damaged_table = on_damaged_table
        self._skipped: dict[str, str] = {}
        if filter is not None and not isinstance(filter, pc.Expression):
            raise OptionError("filter", filter, "must be a pyarrow.compute.Expression, e.g. pc.field('step') == 3")
        self.url = backend.url
        self.manifest = manifest
        self.on_duplicate = on_duplicate
        self.filter = filter
        self.max_sample_rows = manifest.max_sample_rows if max_sample_rows is None else max_sample_rows
        self._commits: list[str] | None = []
        self.complete = commits is None
        self._array_rows: dict[str, int] = {}
        self.array_rows: Mapping[str, int] = _ArrayRows(self._array_rows, self._materialize)
        """Rows each committed route array must have (a mapping that reads a version 2
        checkpoint's rows on first use of an array it does not know otherwise)."""
        self.checkpoint: str | None = None
        """Key of the checkpoint the catalogue started from (None: it read every sample table)."""
        self._watermark: str | None = None
        self._covered_v: frozenset[str] = frozenset()
        self._preloaded: frozenset[str] = frozenset()  # the commits of the preloaded rows
        self._read: set[str] = set()  # the commits whose sample tables were read
        self._pending: _Pending | None = None  # a version 2 checkpoint whose rows are read on first use
        self._lock = threading.RLock()
        wanted = None if commits is None else parse_commits(commits)
        self._buckets: list[str] | None = None
        if preloaded is None and wanted is None and use_checkpoint and manifest.version >= 2:
            files, self._buckets = backend.list_children(INDEX_PREFIX)  # checkpoints and buckets at once
            found = _open_checkpoint(backend, manifest, self.max_sample_rows, checkpoint_keys(backend, files))
            if isinstance(found, _Pending):
                self._open_in_parts(backend, found)
                return
            if found is not None:
                preloaded = Preloaded(found.table, found.info.commits)
                self.checkpoint, self._watermark = found.key, found.info.watermark
                self._covered_v = found.info.commits
        self._rows = self._load_tables(backend, preloaded, wanted)
        self.samples, self.duplicates = _dedupe(self._rows, on_duplicate)
        self._build_lookup()

    def _open_in_parts(self, backend: Backend, pending: _Pending) -> None:
        """Open from a version 2 checkpoint's header (FORMAT.md section 11): read the tables of the
        commits it does not cover, and read its rows now only where the header cannot settle
        the open (a filter, an id it holds twice, a newer id its Bloom filter may hold)."""
        header = pending.header
        self.checkpoint, self._watermark = pending.key, header.info.watermark
        by_commit = self._table_keys(backend, None)
        todo = {commit: keys for commit, keys in by_commit.items() if commit not in header.recent}
        pending.newer = self._read_tables(backend, todo)
        self._pending = pending
        newer = self._merge(list(pending.newer.values())) if pending.newer else None
        ids = [] if newer is None else newer.column("sample_id").to_pylist()
        over_cap = self.max_sample_rows is not None and header.max_rows > self.max_sample_rows
        if self.filter is not None or over_cap or not header.unique_ids or len(set(ids)) != len(ids) or \
                header.bloom.hits(ids):
            self._materialize()
            return
        hidden = 0 if newer is None else int(pc.sum(newer.column("quarantined")).as_py() or 0)
        pending.visible = header.visible + len(ids) - hidden
        pending.newer_rows = newer
        pending.lazy = header.layout >= 3 and header.footer is not None and _after(newer, header.last)
        self._read = set(pending.newer)
        self._build_lookup()

    def _materialize(self) -> None:
        """Read and check the pending checkpoint's rows (every group's digest, every row) and merge
        them with the newer tables. A checkpoint whose rows fail their checks is dropped with a
        :class:`r3store.errors.CheckpointWarning`; the sample tables of the commits it covers
        are read instead (those in buckets before its watermark and its recent ones: not
        commits made since the open)."""
        if self._pending is None:
            return
        with self._lock:
            pending = self._pending
            if pending is None:
                return
            backend = pending.backend
            newer = pending.newer
            try:
                table, info = read_checkpoint(pending.buf, pending.path, spec=self.manifest.spec,
                                              spec_source=backend.path_of(MANIFEST_KEY),
                                              max_sample_rows=self.max_sample_rows,
                                              version=self.manifest.version, store_id=self.manifest.store_id,
                                              check_bloom=False, header=pending.header)
            except SampleTooLargeError:
                raise  # the digests matched: the sample tables hold the same sample, over the same cap (no warning)
            except FormatError as exc:
                warnings.warn(CheckpointWarning(pending.path, f"{exc.fault} (found when its rows were first "
                                                              "needed; its commits' sample tables were read "
                                                              "instead)"), stacklevel=4)
                listed = table_keys(backend.list_prefix(INDEX_PREFIX), self.manifest.version, backend.path_of)
                older = {commit: keys for commit, keys in listed.items() if commit not in newer and
                         (commit in pending.header.recent or keys[0].split("/")[1] < pending.header.info.watermark)}
                newer = {**newer, **self._read_tables(backend, older)}
                table, info = None, CheckpointInfo(frozenset(), pending.header.info.watermark, "")
                self.checkpoint = None
            pieces = [] if table is None else [self._narrow(table)]
            if table is not None:
                self._note_preloaded(Preloaded(table, info.commits))
            pieces += [t for commit, t in newer.items() if commit not in info.commits]
            rows = self._merge(pieces)
            samples, duplicates = _dedupe(rows, self.on_duplicate)
            if pending.visible is not None and (duplicates or _count_visible(samples) != pending.visible):
                raise FormatError(pending.path, f"its header and Bloom filter promised {pending.visible} visible "
                                                f"samples and no id committed again; its rows give "
                                                f"{_count_visible(samples)} and {len(duplicates)} such id(s)")
            _keep_promises(samples, pending)
            self._rows, self.samples, self.duplicates = rows, samples, duplicates
            self._covered_v = info.commits
            self._preloaded = info.commits
            self._read = {commit for commit in newer if commit not in info.commits}
            self._commits = None
            self._build_lookup()
            self._pending = None

    @property
    def samples(self) -> pa.Table:
        """One row per committed sample (quarantined ones included), in store order."""
        self._materialize()
        return self._samples_v

    @samples.setter
    def samples(self, value: pa.Table) -> None:
        self._samples_v = value

    @property
    def duplicates(self) -> dict[str, list[str]]:
        """Ids committed by more than one commit, with the commits (earliest first)."""
        self._materialize()
        return self._duplicates_v

    @duplicates.setter
    def duplicates(self, value: dict[str, list[str]]) -> None:
        self._duplicates_v = value

    @property
    def _rows(self) -> pa.Table:
        self._materialize()
        return self._rows_v

    @_rows.setter
    def _rows(self, value: pa.Table) -> None:
        self._rows_v = value

    @property
    def covered(self) -> frozenset[str]:
        """The commits the checkpoint covers (empty without one)."""
        self._materialize()
        return self._covered_v

    @property
    def skipped(self) -> dict[str, str]:
        """Commits left out because their sample table is damaged (``on_damaged_table="skip"``):
        commit -> ``"<table path>: <fault>"``, in name order."""
        return dict(sorted(self._skipped.items()))

    @property
    def in_parts(self) -> bool:
        """Whether the rows of a version 2 checkpoint are still unread (read on first use)."""
        return self._pending is not None

    def __getstate__(self) -> dict[str, Any]:
        self._materialize()
        state = dict(self.__dict__)
        state.pop("_lock")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def all_rows(self) -> pa.Table:
        """Every loaded row (passing the filter), duplicates included, in store order."""
        return self._rows

    @property
    def commits(self) -> list[str]:
        """The committed commits loaded (those asked for, with ``commits``), in name order
        (sorted on first use)."""
        self._materialize()
        commits = self._commits
        if commits is None:
            commits = self._commits = sorted(self._read.union(self._preloaded))
        return commits

    @property
    def watermark(self) -> str | None:
        """The checkpoint's watermark bucket (None without one)."""
        return self._watermark

    def _table_keys(self, backend: Backend, wanted: list[str] | None) -> dict[str, list[str]]:
        """Each commit's sample-table key(s): all commits (one listing of ``index/``; after a
        checkpoint, one listing of its buckets and one of each bucket from the watermark on) or
        ``wanted``'s."""
        if wanted is not None and self.manifest.version == 1:
            return {commit: [table_key(commit)] for commit in wanted}  # flat keys: no listing needed
        if wanted is None and self._watermark is not None:
            buckets = self._buckets if self._buckets is not None else backend.list_children(INDEX_PREFIX)[1]
            self._buckets = None  # a listing is used once: refresh() lists again
            keys = [key for bucket in buckets if bucket >= self._watermark
                    for key in backend.list_prefix(f"{INDEX_PREFIX}{bucket}/")]
        else:
            keys = backend.list_prefix(INDEX_PREFIX)
        by_commit = table_keys(keys, self.manifest.version, backend.path_of)
        if wanted is None:
            return by_commit
        absent = [commit for commit in wanted if commit not in by_commit]
        if absent:
            raise ObjectNotFoundError(backend.path_of(f"{INDEX_PREFIX}<bucket>/{absent[0]}.parquet"),
                                      f"commit {absent[0]!r} has no sample table")
        return {commit: by_commit[commit] for commit in wanted}

    def _read_tables(self, backend: Backend, todo: dict[str, list[str]]) -> dict[str, pa.Table]:
        """Read and check the sample tables of ``todo`` (commit -> keys); note their array rows;
        return them by commit, narrowed by the filter where a table has the filter's columns.
        With ``on_damaged_table="skip"`` a damaged table's commit is left out (warned, noted
        in :attr:`skipped`)."""
        blobs = backend.get_many([k for keys in todo.values() for k in keys])
        tables = {}
        for commit, keys in todo.items():
            try:
                table = self._read_table(backend, commit, keys, blobs)
            except FormatError as exc:
                if self.on_damaged_table != "skip" or not _is_damage(exc):
                    raise
                self._skipped[commit] = str(exc)
                warnings.warn(DamagedTableWarning(exc.path, commit, exc.fault), stacklevel=5)
                continue
            self._array_rows[array_key(commit)] = array_rows(table)
            tables[commit] = self._narrow(table)
        return tables

    def _read_table(self, backend: Backend, commit: str, keys: list[str], blobs: dict[str, Any]) -> pa.Table:
        """One commit's checked sample table (``keys``: its table keys, whose bytes ``blobs`` holds)."""
        blob = blobs.pop(keys[0])
        for other in keys[1:]:  # a late retry wrote a second bucket: the same bytes, or a fault
            if blobs.pop(other) != blob:
                raise FormatError(backend.path_of(other), f"a second sample table of commit {commit!r} that "
                                                          f"differs from {keys[0]}")
        return read_table(blob, backend.path_of(keys[0]), commit, version=self.manifest.version,
                          spec=self.manifest.spec, spec_source=backend.path_of(MANIFEST_KEY),
                          max_sample_rows=self.max_sample_rows, store_id=self.manifest.store_id)

    def _narrow(self, table: pa.Table) -> pa.Table:
        """``table`` filtered (pushed down before merging); unchanged when it lacks a column the
        filter names (the merged table is filtered again, with every column)."""
        if self.filter is None:
            return table
        try:
            return filter_samples(table, self.filter)
        except OptionError:
            return table

    def _load_tables(self, backend: Backend, preloaded: Preloaded | None, wanted: list[str] | None) -> pa.Table:
        """Read and check the sample tables (all, or ``wanted``'s, less the commits ``preloaded``
        covers); note the rows each route array must have."""
        by_commit = self._table_keys(backend, wanted)
        covered = preloaded.commits if preloaded is not None else frozenset()
        todo = {commit: keys for commit, keys in by_commit.items() if commit not in covered}
        tables = [] if preloaded is None else [self._narrow(preloaded.table)]
        if preloaded is not None:
            self._note_preloaded(preloaded)
        read = self._read_tables(backend, todo)
        tables += read.values()
        self._preloaded, self._read, self._commits = covered, set(read), None
        return self._merge(tables)

    def _merge(self, tables: list[pa.Table]) -> pa.Table:
        """Concatenate pieces (clashing metadata types as strings), in store order, filtered."""
        if not tables:
            table = table_schema().empty_table()
        else:
            try:
                table = pa.concat_tables(tables, promote_options="permissive")
            except (pa.ArrowTypeError, pa.ArrowInvalid):  # writers disagree on a metadata column's type
                table = pa.concat_tables(_clashing_metadata_as_strings(tables), promote_options="permissive")
            if not _in_store_order(table):  # checked (one vectorised pass), not assumed: a checkpoint's rows are
                table = table.take(pc.sort_indices(table, _STORE_ORDER))  # in store order, and so usually all
        if self.filter is None:
            return table
        try:
            return filter_samples(table, self.filter)
        except OptionError:
            if table.num_rows:
                raise
            return table  # nothing committed yet (a growing store): no columns to check the filter against

    def refresh(self, backend: Backend) -> int:
        """Add the commits made since the catalogue was loaded (or last refreshed).

        Lists ``index/`` (after a checkpoint: only the buckets from its watermark on) and
        reads the sample tables of commits not yet known. Nothing changes if a new table
        fails its checks or adds a duplicate id (with ``on_duplicate="raise"``).

        Returns
        -------
        int
            How many visible samples were added (passing the filter, not quarantined).

        Raises
        ------
        r3store.errors.OptionError
            The catalogue was loaded for some commits only (``commits=``).
        r3store.errors.FormatError, r3store.errors.DuplicateSampleError, r3store.errors.StorageError
            As when loading.
        """
        if not self.complete:
            raise OptionError("commits", f"{len(self.commits)} commits",
                              "a reader opened on some commits only cannot refresh; open the whole store")
        self._materialize()
        by_commit = self._table_keys(backend, None)
        todo = {commit: keys for commit, keys in by_commit.items()
                if commit not in self._preloaded and commit not in self._read and commit not in self._skipped}
        if not todo:
            return 0
        before = len(self.visible)
        skipped = dict(self._skipped)
        try:
            read = self._read_tables(backend, todo)
            rows = self._merge([self._rows, *read.values()])
            samples, duplicates = _dedupe(rows, self.on_duplicate)
        except BaseException:
            self._skipped = skipped  # nothing changes
            raise
        self._rows, self.samples, self.duplicates = rows, samples, duplicates
        self._read |= set(read)
        self._commits = None
        self._build_lookup()
        return len(self.visible) - before

    def _note_preloaded(self, preloaded: Preloaded) -> None:
        """Rows each preloaded route array must have (the end of its last sample), computed
        columnwise: one dictionary encoding of ``array`` and a numpy max per array."""
        table = preloaded.table
        if not table.num_rows:
            return
        encoded = table.column("array").combine_chunks().dictionary_encode()
        ends = pc.add(table.column("row_start"), table.column("num_rows")).to_numpy()
        top = np.zeros(len(encoded.dictionary), dtype=np.int64)
        np.maximum.at(top, encoded.indices.to_numpy(), ends)
        found = zip(encoded.dictionary.to_pylist(), top.tolist(), strict=True)
        rows = self._array_rows
        if not rows:  # the usual case: preloaded rows come first
            rows.update(found)
            return
        for array, end in found:
            rows[array] = max(rows.get(array, 0), end)

    def _build_lookup(self) -> None:
        """Forget the per-row lists of :attr:`samples` (rebuilt on first use: a caller that reads
        a few samples, or none, does not pay for Python lists of every row)."""
        for name in _LAZY_LISTS:
            self.__dict__.pop(name, None)
        self._where_map: dict[str, int] | None = None

    def _column(self, name: str, column: str) -> Sequence[Any]:
        """The list ``name`` (built from :attr:`samples`), or while a version 3 checkpoint's rows
        are unread and lookups read single groups, a view of the rows handed out."""
        pending = self._pending
        if pending is not None and pending.lazy:
            return _LazyColumn(self, pending, name, column)
        full: list[Any] = getattr(self, name)
        return full

    @cached_property
    def _ids(self) -> list[str]:
        ids: list[str] = self.samples.column("sample_id").to_pylist()
        return ids

    @property
    def _missing(self) -> Sequence[Any]:
        return self._column("_full_missing", "missing_rows")

    @cached_property
    def _full_missing(self) -> list[str | None]:
        return self.samples.column("missing_rows").to_pylist()  # type: ignore[no-any-return]

    @property
    def _spans(self) -> Sequence[Any]:
        return self._column("_full_spans", "policy_spans")

    @cached_property
    def _full_spans(self) -> list[str | None]:
        return self.samples.column("policy_spans").to_pylist()  # type: ignore[no-any-return]

    @property
    def _quarantined(self) -> Sequence[Any]:
        return self._column("_full_quarantined", "quarantined")

    @cached_property
    def _full_quarantined(self) -> list[bool]:
        return self.samples.column("quarantined").to_pylist()  # type: ignore[no-any-return]

    @property
    def array(self) -> Sequence[Any]:
        """Route array of each row of :attr:`samples`."""
        return self._column("_full_array", "array")

    @cached_property
    def _full_array(self) -> list[str]:
        """Route array of each row of :attr:`samples`."""
        return self.samples.column("array").to_pylist()  # type: ignore[no-any-return]

    @property
    def row_start(self) -> Sequence[Any]:
        """First array row of each sample."""
        return self._column("_full_row_start", "row_start")

    @cached_property
    def _full_row_start(self) -> list[int]:
        """First array row of each sample."""
        return _int_list(self.samples.column("row_start"))

    @property
    def num_rows(self) -> Sequence[Any]:
        """Rows of each sample."""
        return self._column("_full_num_rows", "num_rows")

    @cached_property
    def _full_num_rows(self) -> list[int]:
        """Rows of each sample."""
        return _int_list(self.samples.column("num_rows"))

    @property
    def num_tokens(self) -> Sequence[Any]:
        """Tokens of each sample."""
        return self._column("_full_num_tokens", "num_tokens")

    @cached_property
    def _full_num_tokens(self) -> list[int]:
        """Tokens of each sample."""
        return _int_list(self.samples.column("num_tokens"))

    @cached_property
    def visible(self) -> list[str]:
        """Ids of the committed, non-quarantined samples, in store order."""
        quarantined = self.samples.column("quarantined")
        if pc.any(quarantined).as_py():
            return self.samples.column("sample_id").filter(pc.invert(quarantined)).to_pylist()  # type: ignore[no-any-return]
        return list(self._ids)

    @property
    def num_visible(self) -> int:
        """How many committed samples are not quarantined (``len(visible)``, without building it;
        from a version 2 checkpoint's header, without its rows, while they are unread)."""
        pending = self._pending
        if pending is not None and pending.visible is not None:
            return pending.visible
        if "visible" in self.__dict__:
            return len(self.visible)
        return _count_visible(self.samples)

    @property
    def _where(self) -> Mapping[str, int] | _LazyWhere:
        """Sample id -> row of :attr:`samples` (built once, on first use; ids are unique after
        :func:`_dedupe`). Two threads racing build equal dicts; either one is kept. While a
        version 3 checkpoint's rows are unread (and the open was settled by its header), a
        mapping whose ``get`` reads only the row groups that may hold the id."""
        pending = self._pending
        if pending is not None and pending.lazy:
            return _LazyWhere(self, pending)
        where = self._where_map
        if where is None:
            where = self._where_map = dict(zip(self._ids, range(len(self._ids)), strict=True))
        return where

    def missing_rows(self, i: int) -> list[tuple[int, int]]:
        """Half-open ranges of the rows of sample row ``i`` the engine could not capture."""
        text = self._missing[i]
        return [] if text is None else parse_ranges(text, self.num_rows[i])

    def policy_spans(self, i: int) -> list[tuple[int, int, int]]:
        """``(start, stop, version)`` of sample row ``i`` (empty: no version recorded)."""
        text = self._spans[i]
        return [] if text is None else parse_spans(text, self.num_rows[i])

    def __contains__(self, sample_id: object) -> bool:
        if not isinstance(sample_id, str):
            return False
        i = self._where.get(sample_id)
        return i is not None and not self._quarantined[i]

    def locate(self, sample_id: str, *, include_quarantined: bool = False) -> int:
        """Row of :attr:`samples` holding ``sample_id``.

        Raises
        ------
        r3store.errors.SampleNotFoundError
            No such committed sample, or it is quarantined (and not asked for).
        TypeError
            ``sample_id`` is not a str.
        """
        if not isinstance(sample_id, str):
            raise TypeError(f"sample_id must be a str, got {type(sample_id).__name__}")
        i = self._where.get(sample_id)
        if i is None:
            raise SampleNotFoundError(sample_id, self.url)
        if self._quarantined[i] and not include_quarantined:
            reason = self.row(i)["reason"] or "no reason recorded"
            raise SampleNotFoundError(sample_id, self.url, quarantined=reason)
        return i

    def row(self, i: int) -> dict[str, Any]:
        """Sample row ``i`` (a row :meth:`locate` returned) as a dict of its columns, as
        :attr:`samples` holds it (user metadata merged across commits as there)."""
        pending = self._pending
        if pending is not None and pending.lazy and i in pending.rows:
            try:
                ckpt, newer = _schema_pieces(pending)
            except FormatError:
                self._materialize()  # the full read checks again, warns and falls back to the sample tables
                return {k: v[0] for k, v in self.samples.slice(i, 1).to_pydict().items()}
            one = pending.row_tables[i]
            with warnings.catch_warnings():  # a merge for the columns' types only: the full read warns once
                warnings.simplefilter("ignore")
                merged = self._merge([one, *newer] if i < pending.header.rows else [ckpt, one])
            return {k: v[0] for k, v in merged.to_pydict().items()}
        return {k: v[0] for k, v in self.samples.slice(i, 1).to_pydict().items()}

    def _lazy_get(self, pending: _Pending, sample_id: str) -> int | None:
        """Row of ``sample_id`` while ``pending``'s rows are unread: a newer table's row, or one read
        from the row group(s) whose Bloom filter may hold it (FORMAT.md section 11.2); None when no
        committed sample has the id. A fault in a group reads every row instead (the full checks
        and their fallback), and the answer is then the full catalogue's."""
        if sample_id in pending.where:
            return pending.where[sample_id]
        with self._lock:
            if self._pending is not pending:  # read meanwhile: the full catalogue answers
                return self._where.get(sample_id)
            try:
                found = self._lazy_find(pending, sample_id)
            except SampleTooLargeError:
                raise
            except FormatError:
                self._materialize()  # the full read checks again, warns and falls back to the sample tables
                return self._where.get(sample_id)
            pending.where[sample_id] = found
            return found

    def _lazy_find(self, pending: _Pending, sample_id: str) -> int | None:
        header = pending.header
        newer = pending.newer_rows
        if newer is not None and newer.num_rows:
            if pending.newer_where is None:
                pending.newer_where = dict(zip(newer.column("sample_id").to_pylist(), range(newer.num_rows),
                                               strict=True))
            j = pending.newer_where.get(sample_id)
            if j is not None:
                i = header.rows + j
                self._promise(pending, i, newer.slice(j, 1))
                return i
        assert header.group_blooms is not None
        hits = []
        for g in header.group_blooms.groups_of(sample_id):
            part = self._group(pending, g)
            where = pc.index(part.column("sample_id"), sample_id).as_py()
            if where is not None and where >= 0:
                hits.append((g, int(where)))
        if not hits:
            return None
        if len(hits) > 1:
            raise FormatError(pending.path, f"sample {sample_id!r} is in row groups {[g for g, _ in hits]}, "
                                            "its header says no id repeats")
        g, where = hits[0]
        part = self._group(pending, g)
        commit = part.column("commit")[where].as_py()
        self._note_commit(pending, g, commit)
        i = header.group_start(g) + where
        self._promise(pending, i, part.slice(where, 1))
        return i

    def _group(self, pending: _Pending, g: int) -> pa.Table:
        """Row group ``g`` of the pending checkpoint, read and checked once."""
        part = pending.groups.get(g)
        if part is None:
            part = pending.groups[g] = read_checkpoint_groups(
                pending.buf, pending.path, pending.header, [g], version=self.manifest.version,
                max_sample_rows=self.max_sample_rows)
        return part

    def _note_commit(self, pending: _Pending, g: int, commit: str) -> None:
        """Note the rows ``commit``'s route array must have, reading the neighbouring groups its rows
        run into (rows are in store order, so a commit's rows are consecutive)."""
        array = array_key(commit)
        if array in self._array_rows:
            return
        first = last = g
        while first > 0 and self._group(pending, first).column("commit")[0].as_py() == commit:
            first -= 1
        while last + 1 < len(pending.header.groups) and \
                self._group(pending, last).column("commit")[-1].as_py() == commit:
            last += 1
        end = 0
        for k in range(first, last + 1):
            part = self._group(pending, k)
            mine = pc.equal(part.column("commit"), commit)
            ends = pc.add(part.column("row_start"), part.column("num_rows")).filter(mine)
            end = max(end, int(pc.max(ends).as_py() or 0) if len(ends) else 0)
        self._array_rows[array] = end

    @staticmethod
    def _promise(pending: _Pending, i: int, one: pa.Table) -> None:
        """Remember the row handed out as row ``i`` (checked against :attr:`samples` once read)."""
        pending.row_tables[i] = one
        pending.rows[i] = one.to_pylist()[0]


def _count_visible(table: pa.Table) -> int:
    """Rows of ``table`` not quarantined."""
    return int(table.num_rows) - int(pc.sum(table.column("quarantined")).as_py() or 0)


@dataclass
class _Pending:
    """A version 2 checkpoint opened from its header: its bytes (fetched whole, in one request)
    and the sample tables of the commits read besides it."""

    key: str
    path: str
    buf: bytes
    header: CheckpointHeader
    backend: Backend
    newer: dict[str, pa.Table]
    """Commit -> its checked sample table (narrowed by the filter), for the commits the header
    does not name as covered."""
    visible: int | None = None
    """Visible samples of the store, from the header and the newer tables (None: not settled)."""
    newer_rows: pa.Table | None = None
    """The newer tables' rows, merged in store order (the rows after the checkpoint's)."""
    lazy: bool = False
    """Whether a lookup reads only the groups that may hold the id: a version 3 checkpoint, the
    open settled by its header, and every newer row after its last row in store order."""
    where: dict[str, int | None] = dataclass_field(default_factory=dict)
    """Ids looked up so far -> their row (None: not committed)."""
    newer_where: dict[str, int] | None = None
    groups: dict[int, pa.Table] = dataclass_field(default_factory=dict)
    """Row groups read and checked so far."""
    rows: dict[int, dict[str, Any]] = dataclass_field(default_factory=dict)
    """Rows handed out, by row number (as :attr:`SampleCatalog.samples` will number them)."""
    row_tables: dict[int, pa.Table] = dataclass_field(default_factory=dict)
    schema_pieces: tuple[pa.Table, list[pa.Table]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a catalogue with unread checkpoint rows is read before pickling")


class _ArrayRows(Mapping[str, int]):
    """Rows each route array must have: ``known``, and on a miss the catalogue's rows read
    (``fill``) first (a version 2 checkpoint's arrays are known once its rows are read)."""

    def __init__(self, known: dict[str, int], fill: Callable[[], None]) -> None:
        self._known = known
        self._fill = fill

    def __getitem__(self, key: str) -> int:
        if key not in self._known:
            self._fill()
        return self._known[key]

    def __contains__(self, key: object) -> bool:
        if key not in self._known:
            self._fill()
        return key in self._known

    def __iter__(self) -> Iterator[str]:
        self._fill()
        return iter(self._known)

    def __len__(self) -> int:
        self._fill()
        return len(self._known)


class _LazyWhere:
    """``get`` of the id -> row mapping while a version 3 checkpoint's rows are unread."""

    def __init__(self, catalog: SampleCatalog, pending: _Pending) -> None:
        self._catalog = catalog
        self._pending = pending

    def get(self, sample_id: str, default: int | None = None) -> int | None:
        i: int | None = self._catalog._lazy_get(self._pending, sample_id)
        return default if i is None else i


class _LazyColumn(Sequence[Any]):
    """One column of the rows handed out while a version 3 checkpoint's rows are unread, indexed
    by the row numbers :meth:`SampleCatalog.locate` returned; any other use (another row, a
    slice, ``len``, iteration) reads every row first and answers from the full list (the row
    numbers handed out are the full catalogue's, checked when it is read)."""

    def __init__(self, catalog: SampleCatalog, pending: _Pending, name: str, column: str) -> None:
        self._catalog = catalog
        self._rows = pending.rows
        self._name = name
        self._column = column

    def _full(self) -> list[Any]:
        self._catalog._materialize()
        full: list[Any] = getattr(self._catalog, self._name)
        return full

    def __getitem__(self, i: Any) -> Any:
        row = self._rows.get(i) if isinstance(i, int) and i >= 0 else None
        return self._full()[i] if row is None else row[self._column]

    def __len__(self) -> int:
        return len(self._full())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._full())


def _after(newer: pa.Table | None, last: tuple[int, str] | None) -> bool:
    """Whether every row of ``newer`` (in store order) comes after the key ``last`` (None: no rows
    before): then the checkpoint's rows keep their row numbers in the merged catalogue."""
    if newer is None or not newer.num_rows or last is None:
        return True
    first = newer.slice(0, 1)
    key = (int(pc.cast(first.column("committed_at"), pa.int64())[0].as_py()), first.column("commit")[0].as_py())
    return key > last


def _schema_pieces(pending: _Pending) -> tuple[pa.Table, list[pa.Table]]:
    """Empty tables of the checkpoint's columns and of each newer table's: merged with one row,
    they give it the columns and types :attr:`SampleCatalog.samples` has. A ``FormatError`` when
    the checkpoint's Arrow schema cannot be read."""
    if pending.schema_pieces is None:
        try:
            schema = pq.ParquetFile(pa.BufferReader(pending.buf)).schema_arrow.remove_metadata()
        except (pa.ArrowException, OSError, ValueError) as exc:  # e.g. a damaged ARROW:schema (no digest binds it)
            raise FormatError(pending.path, f"its schema cannot be read: {exc}") from None
        pending.schema_pieces = (schema.empty_table(), [t.slice(0, 0) for t in pending.newer.values()])
    return pending.schema_pieces


def _keep_promises(samples: pa.Table, pending: _Pending) -> None:
    """Every row handed out before the rows were read is the row :attr:`SampleCatalog.samples` has
    at that number, and every id found in no row then is in none now (else a ``FormatError`` naming
    the checkpoint: never another sample's route, nor a sample said not to exist)."""
    for i, promised in pending.rows.items():
        found = samples.slice(i, 1).to_pylist()[0] if i < samples.num_rows else None
        keys = ("sample_id", "array", "row_start", "num_rows", "num_tokens", "quarantined", "missing_rows",
                "policy_spans")
        if found is None or any(found.get(k) != promised.get(k) for k in keys):
            raise FormatError(pending.path, f"row {i} was read from its row group as sample "
                                            f"{promised.get('sample_id')!r}; once every row is read it is "
                                            f"{None if found is None else found.get('sample_id')!r} (rows out of "
                                            "store order, or a header that lies)")
    absent = [sid for sid, i in pending.where.items() if i is None]
    if absent:
        held = pc.is_in(samples.column("sample_id"), pa.array(absent, pa.string()))
        there = samples.column("sample_id").filter(held).to_pylist()
        if there:
            raise FormatError(pending.path, f"sample {there[0]!r} was looked up before the rows were read and "
                                            "not found (its row groups' Bloom filters or the header's recent "
                                            "commits left it out); once every row is read it is there (a header "
                                            "that lies)")


def _open_checkpoint(backend: Backend, manifest: Manifest, cap: int | None,
                     keys: list[str]) -> LoadedCheckpoint | _Pending | None:
    """The newest checkpoint of ``keys`` that passes its checks: a version 1 checkpoint read whole,
    or a version 2 one whose footer and header passed (its rows read later); None if none.
    Each one skipped warns (:class:`r3store.errors.CheckpointWarning`)."""
    for key in keys:
        path = backend.path_of(key)
        try:
            buf = bytes(backend.get(key))
            header = read_checkpoint_header(buf, path, spec=manifest.spec, spec_source=backend.path_of(MANIFEST_KEY),
                                            version=manifest.version, store_id=manifest.store_id)
            if header is not None:
                return _Pending(key=key, path=path, buf=buf, header=header, backend=backend, newer={})
            table, info = read_checkpoint(buf, path, spec=manifest.spec, spec_source=backend.path_of(MANIFEST_KEY),
                                          max_sample_rows=cap, version=manifest.version, store_id=manifest.store_id)
        except SampleTooLargeError:
            raise  # intact (its digest matched): the tables would raise the same (no misleading warning)
        except (FormatError, ObjectNotFoundError) as exc:
            fault = exc.fault if isinstance(exc, FormatError) else "deleted while being read"
            warnings.warn(CheckpointWarning(path, fault), stacklevel=4)
            continue
        return LoadedCheckpoint(key=key, table=table, info=info)
    return None


_STORE_ORDER = [("committed_at", "ascending"), ("commit", "ascending"), ("row_start", "ascending")]
"""Store order: commit time, then commit name, then row (a stable sort keeps equal rows' order)."""


_in_store_order = rows_in_store_order  # the former name (tests)

_LAZY_LISTS = ("_ids", "_full_missing", "_full_spans", "_full_quarantined", "_full_array", "_full_row_start",
               "_full_num_rows", "_full_num_tokens", "visible")
"""The :class:`SampleCatalog` lists built from :attr:`SampleCatalog.samples` on first use."""


def _int_list(column: pa.ChunkedArray) -> list[int]:
    """A non-null int64 column as Python ints (through numpy: no per-row Arrow scalars)."""
    return list(column.to_numpy().tolist())


def parse_commits(commits: Collection[str]) -> list[str]:
    """Sorted distinct commit names; each must be a commit name (no path can be smuggled in)."""
    if isinstance(commits, str) or not isinstance(commits, Collection):
        raise OptionError("commits", commits, "must be a collection of commit names, e.g. a list")
    for commit in commits:
        if not isinstance(commit, str) or not COMMIT_NAME.fullmatch(commit):
            raise OptionError("commits", commit, f"is not a commit name ({COMMIT_NAME.pattern})")
    return sorted(set(commits))


def _clashing_metadata_as_strings(tables: list[pa.Table]) -> list[pa.Table]:
    """Cast user metadata columns that hold different, unmergeable types in different
    commits (int in one writer's commits, str in another's) to string, so the store opens;
    warns (:class:`r3store.errors.MetadataTypeWarning`) naming them."""
    reserved = set(table_schema().names)
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if f.name not in reserved and not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    numeric = {pa.int64(), pa.float64()}
    clash = {name for name, types in kinds.items() if len(types) > 1 and not types <= numeric}
    if clash:
        warnings.warn(MetadataTypeWarning({name: sorted(map(str, kinds[name])) for name in clash}), stacklevel=5)
    out = []
    for t in tables:
        for name in clash.intersection(t.column_names):
            t = t.set_column(t.schema.get_field_index(name), name, pc.cast(t.column(name), pa.string()))
        out.append(t)
    return out


def _is_damage(exc: FormatError) -> bool:
    """Whether a sample table's error is damage to its bytes (checksums, Parquet, columns, rows),
    which ``on_damaged_table="skip"`` may skip; not a table of another spec or store, of an
    unknown format version, or over the row cap (the reader's settings or the store are at
    fault there, not one table)."""
    return type(exc) in (FormatError, ChecksumError)


def _dedupe(table: pa.Table, on_duplicate: OnDuplicate) -> tuple[pa.Table, dict[str, list[str]]]:
    """Keep one row per sample id: the earliest commit, preferring a non-quarantined one."""
    if len(pc.unique(table.column("sample_id"))) == table.num_rows:
        return table, {}  # no id twice (the usual case), found without a Python loop
    ids = table.column("sample_id").to_pylist()
    commits = table.column("commit").to_pylist()
    quarantined = table.column("quarantined").to_pylist()
    chosen: dict[str, int] = {}
    dupes: dict[str, list[str]] = {}
    for i, sid in enumerate(ids):
        j = chosen.setdefault(sid, i)
        if j == i:
            continue
        dupes.setdefault(sid, [commits[j]]).append(commits[i])
        if quarantined[j] and not quarantined[i]:
            chosen[sid] = i  # a valid retry beats an earlier quarantined copy
    keep = sorted(chosen.values())
    if dupes and on_duplicate == "raise":
        sid, where = next(iter(dupes.items()))
        raise DuplicateSampleError(sid, tuple(where), detail=f"{len(dupes)} duplicated id(s); open with "
                                                            "on_duplicate='first' to keep the earliest commit")
    if not dupes:
        return table, {}
    return table.take(pa.array(keep, type=pa.int64())), dupes
