"""``read_routes``: a store as a Ray Dataset, one row per sample, read in parallel by groups of commits."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask
from ray.data.extensions import ArrowVariableShapedTensorArray

from r3store._format import RESERVED_COLUMNS, array_key
from r3store.errors import OptionError
from r3store.reader import OnDuplicate, RouteReader, filter_samples

__all__ = ["RouteDatasource", "block_dtype", "read_routes"]

BLOCK_BYTES = 64 << 20
"""A read task yields a block once its routes reach this many bytes (in the block's dtype)."""

_ALWAYS = ("sample_id", "num_tokens")
_LOCATION = ["array", "row_start", "num_rows"]


def block_dtype(num_experts: int) -> np.dtype[Any]:
    """The dtype of :func:`read_routes`'s ``routes`` column: the narrowest unsigned integer
    holding every expert id ``0 .. num_experts - 1`` (uint8 up to 256 experts, uint16 up to
    65,536, the format's limit).

    Examples
    --------
    >>> block_dtype(128), block_dtype(256), block_dtype(257)
    (dtype('uint8'), dtype('uint8'), dtype('uint16'))
    """
    return np.dtype(np.uint8) if num_experts <= 1 << 8 else np.dtype(np.uint16)


@dataclasses.dataclass(frozen=True)
class _Piece:
    """Samples of one route array read by one task, in store order (row indices into the plan table)."""

    commit: str
    rows: tuple[int, ...]
    nbytes: int


class RouteDatasource(Datasource):
    """A store's samples as a Ray Data source: one row per sample (see :func:`read_routes`).

    The sample tables are read once, here (on the driver): quarantined samples are
    dropped, duplicate ids resolved over the whole store (as :func:`r3store.open_store`
    does) and ``filter`` applied, so that each read task only reads the routes of the
    samples it is given, with a reader of its own commits
    (``RouteReader.open(url, reader={"commits": ...})``).

    Parameters are as for :func:`read_routes`.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        filter: pc.Expression | None = None,
        layers: Sequence[int] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        on_duplicate: OnDuplicate = "raise",
        include_quarantined: bool = False,
        columns: Sequence[str] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if not isinstance(url, str | os.PathLike):
            raise OptionError("url", url, "must be a path or an fsspec URL (read tasks open it on other machines)")
        self.url = os.fspath(url)
        self.storage_options = dict(storage_options or {})
        reader = RouteReader.open(self.url, storage_options=self.storage_options, reader={"on_duplicate": on_duplicate})
        self.spec = reader.spec
        self.positions = reader.spec.layer_positions(layers)
        self.layers = tuple(reader.spec.moe_layers[p] for p in self.positions)
        table = reader.samples
        if not include_quarantined:
            table = table.filter(pc.invert(table.column("quarantined")))
        table = filter_samples(table, filter)
        self.columns = _output_columns(table, columns)
        self.table = table.select(list(dict.fromkeys([*_ALWAYS, *self.columns, *_LOCATION])))
        self.commit_of = {array_key(commit): commit for commit in reader.commits}
        self.dtype = block_dtype(self.spec.num_experts)
        self.row_bytes = len(self.positions) * self.spec.top_k * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"RouteDatasource({self.url!r}, samples={self.table.num_rows}, layers={list(self.layers)})"

    def get_name(self) -> str:
        return "ReadRoutes"

    def estimate_inmemory_data_size(self) -> int:
        return int(pc.sum(self.table.column("num_rows")).as_py() or 0) * self.row_bytes

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        """One task per group of commits (a large commit's storage objects may be split over tasks)."""
        groups = _group(self._pieces(max(1, parallelism)), max(1, parallelism))
        tasks = []
        for group in groups:
            rows = [i for piece in group for i in piece.rows]
            commits = sorted({piece.commit for piece in group})
            meta = _metadata(len(rows), sum(p.nbytes for p in group))
            read = _ReadGroup(self.url, self.storage_options, commits, self.table.take(pa.array(rows, pa.int64())),
                              self.positions, self.columns, self.dtype)
            kwargs: dict[str, Any] = {}
            if per_task_row_limit is not None and "per_task_row_limit" in _READ_TASK_ARGS:
                kwargs["per_task_row_limit"] = per_task_row_limit
            tasks.append(ReadTask(read, meta, **kwargs))
        return tasks

    def _pieces(self, parallelism: int) -> list[_Piece]:
        """The samples of each route array; when the store has fewer route arrays than
        ``parallelism``, an array's samples are cut, in proportion to its rows, at storage
        object boundaries (a sample goes with the object holding its first row), so that
        no two tasks decode the same object except for a sample that straddles two."""
        arrays = self.table.column("array").to_pylist()
        num_rows = self.table.column("num_rows").to_numpy(zero_copy_only=False)
        row_start = self.table.column("row_start").fill_null(0).to_numpy(zero_copy_only=False)
        by_array: dict[str, list[int]] = {}
        for i, array in enumerate(arrays):
            by_array.setdefault(array, []).append(i)
        total = max(1, int(num_rows.sum()))
        cut = len(by_array) < parallelism  # few commits: split them by storage objects
        per_object = self._rows_per_object([a for a in by_array if a is not None]) if cut else {}
        pieces = []
        for array, rows in by_array.items():
            parts: list[np.ndarray] = [np.asarray(rows, dtype=np.int64)]
            if array in per_object:
                wanted = max(1, round(parallelism * int(num_rows[rows].sum()) / total))
                objects = row_start[rows] // per_object[array]
                bounds = np.flatnonzero(np.diff(objects)) + 1  # where a new object's samples begin
                groups = np.split(parts[0], bounds)
                cuts = np.array_split(np.arange(len(groups)), min(wanted, len(groups)))  # whole objects per part
                parts = [np.concatenate([groups[k] for k in cut]) for cut in cuts]
            for part in parts:
                nbytes = int(num_rows[part].sum()) * self.row_bytes
                pieces.append(_Piece(self.commit_of[array], tuple(int(i) for i in part), nbytes))
        return pieces

    def _rows_per_object(self, arrays: list[str]) -> dict[str, int]:
        """Rows each storage object of these route arrays holds (read from their array documents)."""
        commits = [self.commit_of[a] for a in arrays]
        with RouteReader.open(self.url, storage_options=self.storage_options,
                              reader={"commits": commits, "on_duplicate": "report"}) as reader:
            out = {}
            for array in arrays:
                geometry = reader.geometry_of(array, partial=True)
                out[array] = max(1, geometry.row_chunks_per_object * geometry.chunk_rows)
            return out


_READ_TASK_ARGS = set(inspect.signature(ReadTask.__init__).parameters)


def _output_columns(table: pa.Table, columns: Sequence[str] | None) -> list[str]:
    """Sample-table columns of each row besides ``sample_id``, ``routes`` and ``num_tokens``."""
    if columns is None:  # the user metadata (a column named like the routes column is left out)
        return [c for c in table.column_names if c not in RESERVED_COLUMNS and c != "routes"]
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise OptionError("columns", columns, "must be a list of sample-table column names")
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise OptionError("columns", columns, f"names {missing}, not columns of the sample table "
                                              f"({', '.join(table.column_names)})")
    if "routes" in columns:
        raise OptionError("columns", columns, "'routes' is always the routes column")
    return [c for c in dict.fromkeys(columns) if c not in _ALWAYS]


def _metadata(num_rows: int, size_bytes: int) -> BlockMetadata:
    kwargs: dict[str, Any] = {"num_rows": num_rows, "size_bytes": int(size_bytes), "input_files": None,
                              "exec_stats": None}
    if "schema" in {f.name for f in dataclasses.fields(BlockMetadata)}:  # Ray < 2.46 keeps the schema here
        kwargs["schema"] = None
    return BlockMetadata(**kwargs)


def _group(pieces: list[_Piece], parallelism: int) -> list[list[_Piece]]:
    """At most ``parallelism`` groups of about equal bytes (largest piece first onto the lightest group),
    each group's pieces back in store order."""
    if not pieces:
        return []
    order = {id(p): i for i, p in enumerate(pieces)}
    groups: list[list[_Piece]] = [[] for _ in range(min(parallelism, len(pieces)))]
    loads = [0] * len(groups)
    for piece in sorted(pieces, key=lambda p: -p.nbytes):
        g = loads.index(min(loads))
        groups[g].append(piece)
        loads[g] += max(piece.nbytes, 1)
    return [sorted(g, key=lambda p: order[id(p)]) for g in groups if g]


class _ReadGroup:
    """The read function of one task: open a reader of the task's commits, decode the
    task's samples of each route array in one batched read per block."""

    def __init__(self, url: str, storage_options: dict[str, Any], commits: list[str], table: pa.Table,
                 positions: tuple[int, ...], columns: list[str], dtype: np.dtype[Any]) -> None:
        self.url = url
        self.storage_options = storage_options
        self.commits = commits
        self.table = table
        self.positions = positions
        self.columns = columns
        self.dtype = dtype

    def __call__(self) -> Iterator[pa.Table]:
        reader = RouteReader.open(self.url, storage_options=self.storage_options,
                                  reader={"commits": self.commits, "on_duplicate": "report"})
        arrays = self.table.column("array").to_pylist()
        starts = self.table.column("row_start").fill_null(0).to_numpy(zero_copy_only=False)
        counts = self.table.column("num_rows").to_numpy(zero_copy_only=False).astype(np.int64)
        shape = (len(self.positions), reader.spec.top_k)
        row_bytes = int(np.prod(shape)) * self.dtype.itemsize
        checked: set[str] = set()
        with reader:
            for runs in _blocks(arrays, counts, row_bytes):
                lo, hi = runs[0][0], runs[-1][1]
                at = np.concatenate([[0], np.cumsum(counts[lo:hi])])  # each sample's first row in the block
                out = np.empty((int(at[-1]), *shape), dtype=self.dtype)  # the block's routes, one buffer
                for i, j in runs:  # samples i..j-1: one array, one batched read
                    array = arrays[i]
                    if at[j - lo] > at[i - lo]:
                        if array not in checked:
                            reader.geometry_of(array)  # the whole array must match its sample table, as for get()
                            checked.add(array)
                        reader.read_runs(array, [(int(starts[k]), int(starts[k] + counts[k]), int(at[k - lo]))
                                                 for k in range(i, j)], self.positions, out)
                # views of one buffer, back to back: the ragged tensor column wraps it without a copy
                yield self._block(lo, hi, np.split(out, at[1:-1]))

    def _block(self, lo: int, hi: int, routes: list[np.ndarray]) -> pa.Table:
        rows = self.table.slice(lo, hi - lo)
        columns = {"sample_id": rows.column("sample_id"),
                   "routes": ArrowVariableShapedTensorArray.from_numpy(routes),
                   "num_tokens": rows.column("num_tokens")}
        columns.update((name, rows.column(name)) for name in self.columns)
        return pa.table(columns)


def _blocks(arrays: list[Any], counts: np.ndarray, row_bytes: int) -> Iterator[list[tuple[int, int]]]:
    """Cut the task's samples into blocks of about :data:`BLOCK_BYTES`: each block a list of
    runs ``(i, j)`` (samples ``i..j-1`` of one route array, read in one batched call), the
    runs of a block consecutive; a block ends once its routes reach ``BLOCK_BYTES``."""
    runs: list[tuple[int, int]] = []
    nbytes, i, n = 0, 0, len(arrays)
    while i < n:
        j, size = i, 0
        while j < n and arrays[j] == arrays[i] and (j == i or nbytes + size < BLOCK_BYTES):
            size += int(counts[j]) * row_bytes
            j += 1
        runs.append((i, j))
        nbytes += size
        i = j
        if nbytes >= BLOCK_BYTES:
            yield runs
            runs, nbytes = [], 0
    if runs:
        yield runs


def read_routes(
    url: str | os.PathLike[str],
    *,
    filter: pc.Expression | None = None,
    layers: Sequence[int] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    on_duplicate: OnDuplicate = "raise",
    include_quarantined: bool = False,
    columns: Sequence[str] | None = None,
    override_num_blocks: int | None = None,
    concurrency: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
) -> ray.data.Dataset:
    """A store as a Ray Dataset: one row per sample, read in parallel by groups of commits.

    Parameters
    ----------
    url : str or os.PathLike
        Local folder (on a shared file system when the cluster has several nodes) or
        fsspec URL (``s3://bucket/prefix``).
    filter : pyarrow.compute.Expression, optional
        Keep the samples whose sample-table row satisfies it, e.g.
        ``pc.field("step") >= 3`` (see :func:`r3store.reader.filter_samples`). Evaluated
        once, on the driver, before any route is read.
    layers : sequence of int, optional
        Global decoder-layer indices (MoE layers only), in the order wanted; only the
        chunks of these layers are read and decoded. Default: every MoE layer.
    storage_options : mapping, optional
        fsspec options; sent to every read task (an S3 endpoint, credentials, ...).
    on_duplicate : {"raise", "first"}
        An id committed twice: raise (here, before any task runs) or keep the earliest
        valid copy, exactly as :func:`r3store.open_store`; resolved over the whole store,
        not per task.
    include_quarantined : bool
        Also return samples the writer quarantined (hidden by default, as by readers).
    columns : sequence of str, optional
        Sample-table columns to add to each row (``committed_at``, ``writer_id``,
        ``token_hash``, ``reason``, ...). Default: the user metadata columns.
    override_num_blocks : int, optional
        Number of read tasks wanted (Ray Data chooses by default); never more than the
        number of samples, nor than the storage objects holding them. Commits are grouped
        into tasks; when there are fewer commits than tasks, a commit's storage objects
        are split over several (a sample goes with the object holding its first row).
        Each task decodes each frame it needs once, in one batched read per route array
        and block.
    concurrency : int, optional
        Most read tasks running at once.
    ray_remote_args : mapping, optional
        Passed to the read tasks (``num_cpus``, ``memory``, ...).

    Returns
    -------
    ray.data.Dataset
        Columns ``sample_id`` (string), ``routes`` (tensor of shape
        ``(num_tokens - 1, len(layers), top_k)`` per row, variable-shaped: Ray Data's
        ragged tensor extension; rows come back as numpy arrays), ``num_tokens`` (int64),
        then ``columns``. ``routes`` holds the expert ids in the narrowest unsigned dtype
        that holds them (:func:`block_dtype`: uint8 up to 256 experts, else uint16), so
        blocks carry 1/4 (1/2) of the int32 bytes through the object store; a consumer
        that needs int32 casts in its own process (``routes.astype(np.int32)``, or
        ``torch.from_numpy(routes).long()`` on the device). Rows the engine could not
        capture (:meth:`r3store.RouteReader.missing_rows`) hold what is stored there
        (zeros), as with :meth:`r3store.RouteReader.get_runs`, not -1 as with ``get``.
        Row order is store order within a task; tasks finish in any order.

    Raises
    ------
    r3store.errors.NotAStoreError, r3store.errors.FormatError, r3store.errors.StorageError
        Opening the store failed (on the driver).
    r3store.errors.DuplicateSampleError
        With ``on_duplicate="raise"``, names the id and both commits.
    r3store.errors.LayerError
        A layer is not an MoE layer.
    r3store.errors.OptionError
        ``filter`` or ``columns`` cannot be applied to the sample table.

    Notes
    -----
    A chunk that fails its checksum raises :class:`r3store.errors.ChecksumError` in the
    read task; Ray Data reports it when the dataset is consumed.

    Examples
    --------
    >>> import pyarrow.compute as pc
    >>> ds = read_routes("s3://bucket/run-7/routes", filter=pc.field("step") == 3,   # doctest: +SKIP
    ...                  layers=range(12, 24), storage_options={"profile": "train"})
    >>> for batch in ds.iter_batches(batch_size=8, batch_format="numpy"):              # doctest: +SKIP
    ...     batch["routes"]    # object array of uint8 (num_tokens - 1, 12, top_k) arrays
    """
    source = RouteDatasource(url, filter=filter, layers=layers, storage_options=storage_options,
                             on_duplicate=on_duplicate, include_quarantined=include_quarantined, columns=columns)
    kwargs: dict[str, Any] = {"override_num_blocks": override_num_blocks, "concurrency": concurrency}
    if ray_remote_args:
        kwargs["ray_remote_args"] = dict(ray_remote_args)
    ds: ray.data.Dataset = ray.data.read_datasource(source, **kwargs)
    return ds
