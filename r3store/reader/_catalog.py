"""The sample catalogue: every committed sample table of a store, checked, merged and indexed.

A commit is visible once its sample table ``index/<commit>.parquet`` exists (FORMAT.md
section 2); the catalogue is what readers know of a store besides the route bytes:
which commits exist, which sample lives in which rows of which route array, which ids
were committed twice, and which route objects belong to no commit (leftovers of a
crashed writer).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from r3store._checks import parse_choice
from r3store._format import (
    COMMIT_NAME,
    INDEX_PREFIX,
    ROUTES_PREFIX,
    array_key,
    array_rows,
    commit_of_route_key,
    commit_of_table_key,
    read_table,
    table_key,
    table_schema,
)
from r3store.errors import DuplicateSampleError, OptionError, SampleNotFoundError
from r3store.storage import Backend

__all__ = [
    "OnDuplicate",
    "SampleCatalog",
    "StorageUsage",
    "committed_commits",
    "storage_usage",
    "uncommitted_route_objects",
]

OnDuplicate = Literal["raise", "first", "report"]
ON_DUPLICATE = ("raise", "first", "report")

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
    found = (commit_of_table_key(key) for key in backend.list_prefix(INDEX_PREFIX))
    return [commit for commit in found if commit is not None]


def uncommitted_route_objects(listing: Mapping[str, V], committed: Collection[str]) -> dict[str, dict[str, V]]:
    """Objects under ``routes/<commit>/`` of commits that have no sample table, by commit.

    The one rule for "uncommitted" (used by ``r3store gc``, ``inspect`` and ``validate``):
    a route array is committed exactly when ``index/<commit>.parquet`` exists.

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
    on_duplicate : {"raise", "first", "report"}
        A sample id committed twice: raise, keep the earliest commit, or keep it and
        list the duplicates in :attr:`duplicates`.
    commits : collection of str, optional
        Load only these commits' sample tables (read by key: ``index/`` is not listed).
        Duplicates are then resolved among these commits only.

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
    array_rows : dict of str to int
        Rows each committed route array must have (``routes/<commit>`` -> the end of its
        table's last sample).

    Raises
    ------
    r3store.errors.FormatError
        A sample table is malformed (see :func:`r3store.open_reader`).
    r3store.errors.DuplicateSampleError
        With ``on_duplicate="raise"``.
    r3store.errors.OptionError
        ``on_duplicate`` is not one of the choices, or ``commits`` holds a string that is
        not a commit name.
    r3store.errors.ObjectNotFoundError
        A commit of ``commits`` has no sample table.
    """

    def __init__(self, backend: Backend, *, on_duplicate: OnDuplicate = "raise",
                 commits: Collection[str] | None = None) -> None:
        parse_choice("on_duplicate", on_duplicate, ON_DUPLICATE)
        self.url = backend.url
        self.commits: list[str] = []
        self.complete = commits is None
        self.array_rows: dict[str, int] = {}
        table = self._load_tables(backend, None if commits is None else _parse_commits(commits))
        self.samples, self.duplicates = _dedupe(table, on_duplicate)
        self._build_lookup()

    def _load_tables(self, backend: Backend, commits: list[str] | None) -> pa.Table:
        """Read and check every committed sample table (or those of ``commits``); note the rows
        each route array must have."""
        if commits is None:
            keys = [k for k in backend.list_prefix(INDEX_PREFIX) if commit_of_table_key(k) is not None]
        else:
            keys = [table_key(commit) for commit in commits]
        self.commits = [commit_of_table_key(k) or "" for k in keys]
        blobs = backend.get_many(keys)
        tables = []
        for key, commit in zip(keys, self.commits, strict=True):
            tables.append(read_table(blobs.pop(key), backend.path_of(key), commit))
            self.array_rows[array_key(commit)] = array_rows(tables[-1])
        if not tables:
            return table_schema().empty_table()
        tables = [t.replace_schema_metadata(None) for t in tables]
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # writers disagree on a metadata column's type
            table = pa.concat_tables(_clashing_metadata_as_strings(tables), promote_options="permissive")
        sort_keys = [("committed_at", "ascending"), ("shard", "ascending"), ("row_start", "ascending")]
        order = pc.sort_indices(table, sort_keys)
        return table.take(order)

    def _build_lookup(self) -> None:
        names = ["sample_id", "array", "row_start", "num_rows", "num_tokens", "quarantined"]
        cols = self.samples.select(names).to_pydict()
        self._where = {sid: i for i, sid in enumerate(cols["sample_id"])}
        self.array: list[str] = cols["array"]
        """Route array of each row of :attr:`samples`."""
        self.row_start: list[int] = cols["row_start"]
        """First array row of each sample."""
        self.num_rows: list[int] = cols["num_rows"]
        """Rows of each sample."""
        self.num_tokens: list[int] = cols["num_tokens"]
        """Tokens of each sample."""
        self._quarantined: list[bool] = cols["quarantined"]
        self.visible = [sid for sid, q in zip(cols["sample_id"], cols["quarantined"], strict=True) if not q]
        """Ids of the committed, non-quarantined samples, in store order."""

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
            reason = self.samples.column("reason")[i].as_py() or "no reason recorded"
            raise SampleNotFoundError(sample_id, self.url, quarantined=reason)
        return i


def _parse_commits(commits: Collection[str]) -> list[str]:
    """Sorted distinct commit names; each must be a commit name (no path can be smuggled in)."""
    if isinstance(commits, str) or not isinstance(commits, Collection):
        raise OptionError("commits", commits, "must be a collection of commit names, e.g. a list")
    for commit in commits:
        if not isinstance(commit, str) or not COMMIT_NAME.fullmatch(commit):
            raise OptionError("commits", commit, f"is not a commit name ({COMMIT_NAME.pattern})")
    return sorted(set(commits))


def _clashing_metadata_as_strings(tables: list[pa.Table]) -> list[pa.Table]:
    """Cast user metadata columns that hold different, unmergeable types in different
    commits (int in one writer's commits, str in another's) to string, so the store opens."""
    reserved = set(table_schema().names)
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if f.name not in reserved and not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    numeric = {pa.int64(), pa.float64()}
    clash = {name for name, types in kinds.items() if len(types) > 1 and not types <= numeric}
    out = []
    for t in tables:
        for name in clash.intersection(t.column_names):
            t = t.set_column(t.schema.get_field_index(name), name, pc.cast(t.column(name), pa.string()))
        out.append(t)
    return out


def _dedupe(table: pa.Table, on_duplicate: OnDuplicate) -> tuple[pa.Table, dict[str, list[str]]]:
    """Keep one row per sample id: the earliest commit, preferring a non-quarantined one."""
    ids = table.column("sample_id").to_pylist()
    commits = table.column("shard").to_pylist()
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
