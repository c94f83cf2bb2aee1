"""``write_routes``: a Ray Dataset of routes into a store, each write task one RouteWriter.

Retries. Ray re-runs a write task whose worker died (Ray Data's tasks retry system
failures without limit), with the same input and the same task index. Each task
writes as ``<write_id>-<task index>`` (its RouteWriter's writer id), so an attempt
first reads the sample tables its earlier attempts committed under that name
(``RouteReader.open(url, reader={"commits": ...})``) and skips their samples: a sample committed before
the crash is not committed again, one that was not is committed by the retry. Commit
names are reserved create-if-absent (the commit protocol, ``schema/FORMAT.md``
section 2), so the retry never reuses a name of the dead attempt; a commit the dead
attempt had begun but not finished (route objects, no sample table) stays invisible to
readers and is an ``uncommitted`` leftover for ``r3store gc``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict, cast

import numpy as np
import pyarrow as pa
import ray
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from r3store._checks import config_from_dict, merge_config, parse_choice, strict_fields
from r3store._deprecated import warn
from r3store._spec import ModelSpec
from r3store.errors import OptionError
from r3store.ray._cluster import r3store_errors
from r3store.reader import RouteReader, committed_commits
from r3store.storage import Backend, open_backend
from r3store.writer import RouteWriter, WriterConfig, WriterConfigDict

__all__ = ["RouteColumns", "RouteColumnsDict", "RouteDatasink", "WriteSummary", "write_routes"]

ROWS_PER_WRITE = 256
"""Rows bundled into one write task where Ray Data cannot bundle by bytes."""

_BYTES_BUNDLING = hasattr(Datasink, "min_bytes_per_write")

Payload = Literal["array", "sglang"]
PAYLOADS = ("array", "sglang")


class RouteColumnsDict(TypedDict, total=False):
    """Dict form of :class:`RouteColumns` (every key optional; missing keys take defaults)."""

    sample_id: str
    routes: str
    payload: Payload
    num_tokens: str | None
    tokens: str | None
    metadata: Sequence[str] | None


@strict_fields
@dataclasses.dataclass(frozen=True, kw_only=True)
class RouteColumns:
    """Which columns of a Ray Dataset :func:`write_routes` reads, and what its routes column holds.

    Parameters
    ----------
    sample_id : str
        Column of the sample ids.
    routes : str
        Column of the routes.
    payload : {"array", "sglang"}
        What ``routes`` holds: integer arrays ``(num_tokens - 1, num_layers or num_moe_layers,
        top_k)`` (a Ray tensor column, list column or numpy), or SGLang
        ``meta_info["routed_experts"]`` payloads (base64 of int32, see :func:`r3store.decode_sglang`).
    num_tokens : str or None
        Optional column of token counts (used when present; nulls mean not given).
    tokens : str or None
        Optional column of token ids (used when present; nulls mean not given).
    metadata : tuple[str, ...] or None
        Columns to store as sample metadata (JSON scalars); ``None``: every other column.

    Raises
    ------
    r3store.errors.OptionError
        A column name is not a str (or None where allowed), or ``payload`` is not a choice.
    r3store.errors.UnknownOptionError
        (also a ``TypeError``) a keyword is no field: names the closest fields ("did you mean ...?").

    Examples
    --------
    >>> RouteColumns(routes="routed_experts", payload="sglang").sample_id
    'sample_id'
    """

    sample_id: str = "sample_id"
    routes: str = "routes"
    payload: Payload = "array"
    num_tokens: str | None = "num_tokens"
    tokens: str | None = "tokens"
    metadata: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("sample_id", "routes", "num_tokens", "tokens"):
            value = getattr(self, name)
            if not isinstance(value, str) and not (value is None and name in ("num_tokens", "tokens")):
                raise OptionError(f"columns.{name}", value, "must be a column name (str)")
        parse_choice("columns.payload", self.payload, PAYLOADS)
        if self.metadata is not None:
            if isinstance(self.metadata, str) or not all(isinstance(c, str) for c in self.metadata):
                raise OptionError("columns.metadata", self.metadata, "must be a sequence of column names")
            object.__setattr__(self, "metadata", tuple(self.metadata))

    def to_dict(self) -> RouteColumnsDict:
        """The columns as a dict."""
        return cast(RouteColumnsDict, dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: RouteColumnsDict | Mapping[str, Any]) -> RouteColumns:
        """Columns from a mapping such as :meth:`to_dict` returns (missing keys: defaults).

        Raises
        ------
        r3store.errors.OptionError
            ``d`` is not a mapping, holds an unknown key, or a value is invalid.
        """
        return config_from_dict(cls, d, name="columns", unknown="is not a field of RouteColumns")

    @classmethod
    def resolve(cls, columns: RouteColumns | RouteColumnsDict | Mapping[str, Any] | None = None,
                **fields: Any) -> RouteColumns:
        """One :class:`RouteColumns` from ``columns`` and per-field keywords (``None``: not given)."""
        return merge_config(cls, columns, fields, from_dict=cls.from_dict, name="columns")


_COLUMN_LOOSE = {"payload": "payload", "sample_id_column": "sample_id", "routes_column": "routes",
                 "num_tokens_column": "num_tokens", "tokens_column": "tokens", "metadata_columns": "metadata"}
"""Keywords of :func:`write_routes` that became fields of ``columns=`` (deprecated, removed in 0.4.0)."""


def _sink_settings(config: Any, columns: Any, deprecated: dict[str, Any]) -> tuple[WriterConfig, RouteColumns]:
    """The writer config and columns of a sink: the objects merged with the deprecated keywords
    (each warns, naming the caller of the entry point that called this)."""
    on_invalid = deprecated.pop("on_invalid", None)
    old_columns = {k: deprecated.pop(k) for k in list(_COLUMN_LOOSE) if k in deprecated}
    if deprecated:
        raise TypeError(f"write_routes() got an unexpected keyword argument {next(iter(deprecated))!r}")
    cols = RouteColumns.resolve(columns)
    if old_columns:  # None is a value here (num_tokens_column=None: no such column)
        warn(f"write_routes({', '.join(f'{k}=...' for k in old_columns)})",
             f"columns={{{', '.join(f'{_COLUMN_LOOSE[k]!r}: ...' for k in old_columns)}}}", stacklevel=4)
        cols = dataclasses.replace(cols, **{_COLUMN_LOOSE[k]: v for k, v in old_columns.items()})
    if on_invalid is not None:
        warn("write_routes(on_invalid=...)", "config={'on_invalid': ...}", stacklevel=4)
    return WriterConfig.resolve(config, on_invalid=on_invalid), cols


@dataclasses.dataclass(frozen=True)
class WriteSummary:
    """What a :func:`write_routes` wrote."""

    write_id: str
    """Prefix of the writer ids (``<write_id>-<task index>``) and so of the commit names."""
    commits: tuple[str, ...]
    """Commits made, sorted (by the successful attempt of each task)."""
    samples: int
    """Samples appended by the successful attempts (quarantined ones included)."""
    resumed: int
    """Samples a retried task found already committed by its earlier attempt (not written again)."""
    quarantined: int
    """Samples quarantined (``on_invalid="quarantine"``)."""
    tasks: int
    """Write tasks that ran to completion."""


class RouteDatasink(Datasink[dict[str, Any]]):
    """Writes a dataset of routes into a store (see :func:`write_routes`); one write only.

    Parameters are as for :func:`write_routes`; use it with ``ds.write_datasink(sink)``,
    then read :attr:`summary`.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Backend,
        spec: ModelSpec,
        *,
        config: WriterConfig | WriterConfigDict | Mapping[str, Any] | None = None,
        columns: RouteColumns | RouteColumnsDict | Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        write_id: str | None = None,
        **deprecated: Any,
    ) -> None:
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be an r3store.ModelSpec, got {type(spec).__name__}")
        self.url = url if isinstance(url, Backend) else os.fspath(url)
        self.spec = spec
        self.storage_options = dict(storage_options or {})
        self.config, self.columns = _sink_settings(config, columns, dict(deprecated))
        if self.config.writer_id is not None:
            raise OptionError("config.writer_id", self.config.writer_id,
                              "is set by the sink (<write_id>-<task index>); pass write_id= instead")
        cols = self.columns
        self.payload = cols.payload
        self.sample_id_column = cols.sample_id
        self.routes_column = cols.routes
        self.num_tokens_column = cols.num_tokens
        self.tokens_column = cols.tokens
        self.metadata_columns = None if cols.metadata is None else list(cols.metadata)
        self.write_id = write_id or f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        WriterConfig(writer_id=f"{self.write_id}-00000")  # the write id must make valid writer ids
        self.summary: WriteSummary | None = None
        """Set once the write completes."""

    def __repr__(self) -> str:
        where = self.url if isinstance(self.url, str) else self.url.url
        return f"RouteDatasink({where!r}, write_id={self.write_id!r})"

    def get_name(self) -> str:
        return "WriteRoutes"

    # -- how Ray Data cuts the rows into write tasks --------------------------------------

    @property
    def min_bytes_per_write(self) -> int | None:
        """Blocks are bundled into write tasks of at least the writer's ``buffer_bytes`` of
        input (Ray >= 2.50), so each task commits about one writer buffer's worth of rows
        instead of one commit per block (40 samples from ``ray.data.from_items`` are one
        commit, not 40)."""
        return self.config.buffer_bytes if _BYTES_BUNDLING else None

    @property
    def min_rows_per_write(self) -> int | None:
        """On a Ray without byte bundling: at least :data:`ROWS_PER_WRITE` rows per write task."""
        return None if _BYTES_BUNDLING else ROWS_PER_WRITE

    # -- driver side ------------------------------------------------------------------

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """Create the store (or check its spec) and refuse a write id used before.

        ``schema`` is not checked: when the write is fused with a read, it is the schema
        of the read's input (a file listing), not of the rows; each task checks its rows.

        Raises
        ------
        r3store.errors.OptionError
            This sink's write id has commits in the store (a sink writes once).
        r3store.errors.SpecMismatchError, r3store.errors.NotAStoreError, r3store.errors.StorageError
            As :class:`r3store.RouteWriter`.
        """
        RouteWriter(self.url, self.spec, dataclasses.replace(self.config, writer_id=f"{self.write_id}-init"),
                    storage_options=self.storage_options).close()  # creates the store; commits nothing
        pattern = re.compile(re.escape(self.write_id) + r"-\d+-\d{5,}")
        used = [c for c in committed_commits(open_backend(self.url, self.storage_options)) if pattern.fullmatch(c)]
        if used:
            raise OptionError("write_id", self.write_id, f"was used before (commit {used[0]!r}): a sink writes once; "
                                                         "make a new one, or pass a new write_id")

    def on_write_complete(self, write_result: WriteResult[dict[str, Any]]) -> None:
        parts = [r for r in write_result.write_returns if r is not None]
        self.summary = WriteSummary(
            write_id=self.write_id, commits=tuple(sorted(c for r in parts for c in r["commits"])),
            samples=sum(r["samples"] for r in parts), resumed=sum(r["resumed"] for r in parts),
            quarantined=sum(r["quarantined"] for r in parts), tasks=len(parts))

    # -- one write task ---------------------------------------------------------------

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        """Append every row of this task's blocks with one RouteWriter; skip the samples an
        earlier attempt of this task committed."""
        writer_id = f"{self.write_id}-{ctx.task_idx:05d}"
        done = self._committed_by(writer_id)
        samples = quarantined = resumed = 0
        with RouteWriter(self.url, self.spec, dataclasses.replace(self.config, writer_id=writer_id),
                         storage_options=self.storage_options) as w:
            for row in self._rows(blocks):
                sid = row.pop("sample_id")
                if sid in done:
                    resumed += 1
                    continue
                if self.payload == "sglang":
                    w.append_sglang(sid, row.pop("routes"), **row)
                else:
                    w.append(sid, row.pop("routes"), **row)
                samples += 1
        if w.commits:
            mine = RouteReader.open(self.url, storage_options=self.storage_options, reader={"commits": w.commits})
            quarantined = int(sum(mine.samples.column("quarantined").to_pylist()))
        return {"writer_id": writer_id, "commits": list(w.commits), "samples": samples, "resumed": resumed,
                "quarantined": quarantined}

    def _committed_by(self, writer_id: str) -> set[str]:
        """Sample ids committed by earlier attempts of this task (an empty set on the first)."""
        pattern = re.compile(re.escape(writer_id) + r"-\d{5,}")
        backend = open_backend(self.url, self.storage_options)
        mine = [c for c in committed_commits(backend) if pattern.fullmatch(c)]
        if not mine:
            return set()
        reader = RouteReader.open(self.url, storage_options=self.storage_options,
                                  reader={"commits": mine, "on_duplicate": "report"})
        return set(reader.samples.column("sample_id").to_pylist())

    def _rows(self, blocks: Iterable[Block]) -> Iterator[dict[str, Any]]:
        """Each row as the keyword arguments of an append (routes as numpy, metadata as Python scalars)."""
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            names = table.column_names
            for name in (self.sample_id_column, self.routes_column):
                if name not in names:
                    raise OptionError("columns", names, f"lack {name!r} (columns.sample_id, columns.routes)")
            special = {self.sample_id_column, self.routes_column, self.num_tokens_column, self.tokens_column}
            meta = [c for c in names if c not in special] if self.metadata_columns is None else self.metadata_columns
            ids = table.column(self.sample_id_column).to_pylist()
            routes = _values(table.column(self.routes_column))
            num_tokens = _optional(table, self.num_tokens_column)
            tokens = _optional(table, self.tokens_column, arrays=True)
            meta_values = {c: table.column(c).to_pylist() for c in meta}
            for i, sid in enumerate(ids):
                row: dict[str, Any] = {"sample_id": sid, "routes": routes[i],
                                       "metadata": {c: v[i] for c, v in meta_values.items()} or None}
                if num_tokens is not None and num_tokens[i] is not None:
                    row["num_tokens"] = num_tokens[i]
                if tokens is not None and tokens[i] is not None:
                    row["tokens"] = tokens[i]
                yield row


def _values(column: pa.ChunkedArray) -> list[Any]:
    """Per row: a numpy array for tensor and list columns, the Python value otherwise."""
    if isinstance(column.type, pa.ExtensionType):  # Ray's tensor extensions (fixed or variable shape)
        return [a for chunk in column.chunks for a in chunk.to_numpy(zero_copy_only=False)]
    values: list[Any] = column.to_pylist()
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
            pa.types.is_fixed_size_list(column.type):
        return [None if v is None else np.asarray(v) for v in values]
    return values


def _optional(table: pa.Table, name: str | None, *, arrays: bool = False) -> list[Any] | None:
    if name is None or name not in table.column_names:
        return None
    return _values(table.column(name)) if arrays else table.column(name).to_pylist()


def write_routes(
    ds: ray.data.Dataset,
    url: str | os.PathLike[str] | Backend,
    spec: ModelSpec,
    *,
    config: WriterConfig | WriterConfigDict | Mapping[str, Any] | None = None,
    columns: RouteColumns | RouteColumnsDict | Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    write_id: str | None = None,
    concurrency: int | None = None,
    ray_remote_args: Mapping[str, Any] | None = None,
    **deprecated: Any,
) -> WriteSummary:
    """Write a Ray Dataset of routes into a store; each write task is one :class:`r3store.RouteWriter`.

    One row per sample. Ray Data bundles the dataset's blocks into write tasks of at least
    ``config.buffer_bytes`` of input (256 MiB by default; on a Ray without byte bundling,
    :data:`ROWS_PER_WRITE` rows), so a task commits about one writer buffer's worth of
    rows: its writer commits when the buffer fills and once at the end of the task
    (small blocks, such as ``from_items``'s one row each, are not one commit each).
    Every row goes through the writer's checks (a bad sample raises
    :class:`r3store.errors.RouteValidationError` naming it, or is quarantined with
    ``on_invalid="quarantine"``); each task commits its own commits, so tasks need no
    coordination; a task Ray retries after its worker died skips the samples its
    earlier attempt committed (no duplicate, no loss; see the module docstring).

    Parameters
    ----------
    ds : ray.data.Dataset
        Rows with a sample id, routes, and optionally ``num_tokens``, ``tokens`` and
        metadata columns.
    url : str, os.PathLike or Backend
        Store location every worker can reach (a shared file system, ``s3://``); created
        if absent.
    spec : ModelSpec
        Must equal the spec of an existing store.
    config : WriterConfig or its dict form, optional
        Writer settings passed whole (``buffer_bytes``, ``chunk_rows``, ``on_invalid``,
        ...; see :class:`r3store.WriterConfig`); not ``writer_id``.
    columns : RouteColumns or its dict form, optional
        The columns read (``sample_id``, ``routes``, optional ``num_tokens`` and
        ``tokens``, ``metadata``: default every other column) and what the routes column
        holds (``payload``: integer arrays or SGLang payloads); see :class:`RouteColumns`.
    storage_options : mapping, optional
        fsspec options, sent to every write task.
    write_id : str, optional
        Writer ids are ``<write_id>-<task index>``; default ``<UTC time>-<12 hex digits>``.
        Must not have been used in the store before.
    concurrency : int, optional
        Most write tasks running at once.
    ray_remote_args : mapping, optional
        Options of the write tasks.
    **deprecated
        ``on_invalid`` (now ``config``), ``payload``, ``sample_id_column``,
        ``routes_column``, ``num_tokens_column``, ``tokens_column``, ``metadata_columns``
        (now ``columns``): each warns (:class:`r3store.errors.R3StoreDeprecationWarning`)
        and is removed in 0.4.0.

    Returns
    -------
    WriteSummary

    Raises
    ------
    r3store.errors.OptionError
        A setting is invalid, a column is missing (raised by the write tasks), or
        ``write_id`` was used before.
    r3store.errors.SpecMismatchError, r3store.errors.NotAStoreError
        As :class:`r3store.RouteWriter` (before any task runs).
    r3store.errors.R3StoreError
        A task's error (e.g. an ``ExpertIdError`` naming the sample) as the class it was
        raised as (unwrapped from Ray's ``RayTaskError``); the commits made before it stay
        (each whole and readable). Other task errors as Ray Data raises them.

    Examples
    --------
    >>> import ray, r3store
    >>> spec = r3store.ModelSpec(num_layers=48, num_experts=128, top_k=8)
    >>> ds = ray.data.read_parquet("s3://bucket/sglang-outputs/")  # doctest: +SKIP
    >>> write_routes(ds, "s3://bucket/run-7/routes", spec,          # doctest: +SKIP
    ...              columns={"routes": "routed_experts", "payload": "sglang"})
    """
    settings, cols = _sink_settings(config, columns, dict(deprecated))
    sink = RouteDatasink(url, spec, config=settings, columns=cols, storage_options=storage_options,
                         write_id=write_id)
    sink.on_write_start()  # on the driver, before Ray runs anything: a reused write_id, a spec mismatch
    with r3store_errors():  # a task's error reaches the caller as the r3store error it was
        ds.write_datasink(sink, concurrency=concurrency, ray_remote_args=dict(ray_remote_args or {}))
    assert sink.summary is not None, "on_write_complete sets the summary"
    return sink.summary
