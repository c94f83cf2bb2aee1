"""The Parquet sample table: one row per sample, one file per commit (its column ``shard`` names it)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from r3store._format._footer import Footer, read_footer
from r3store._format._keys import COMMIT_NAME, array_key
from r3store._format._manifest import FORMAT_VERSION, MAX_ROWS, load_schema
from r3store.errors import FormatError, FormatVersionError

__all__ = [
    "MAX_TABLE_BYTES",
    "MAX_TABLE_CELLS",
    "MAX_TABLE_COLUMNS",
    "RESERVED_COLUMNS",
    "array_rows",
    "check_rows",
    "read_table",
    "table_schema",
    "token_hash",
    "write_table",
]

MAX_TABLE_BYTES = 1 << 30
"""Cap on a sample table's decoded size: uncompressed Parquet bytes, fixed-width cells, strings."""
MAX_TABLE_COLUMNS = 1000
"""Cap on a sample table's columns (reserved ones plus user metadata)."""
MAX_TABLE_CELLS = 1 << 27
"""Cap on rows x columns of a sample table."""

_ARROW_TYPES = {
    "string": pa.string(),
    "int64": pa.int64(),
    "bool": pa.bool_(),
    "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
}


@cache
def table_schema() -> pa.Schema:
    """Arrow schema of the required sample-table columns, built from ``sample_table.schema.json``."""
    doc = load_schema("sample_table")
    fields = [
        pa.field(name, _ARROW_TYPES[prop["x-arrow-type"]], nullable=prop["x-nullable"])
        for name, prop in doc["properties"].items()
    ]
    return pa.schema(fields)


RESERVED_COLUMNS: frozenset[str] = frozenset(table_schema().names)
"""Column names user metadata may not use."""


def token_hash(tokens: Sequence[int] | np.ndarray) -> str:
    """Hex BLAKE2b-128 digest of token ids, taken as little-endian int64.

    Examples
    --------
    >>> token_hash([1, 2, 3])
    'abccad42d03c940bc2b249bf5a4e1e3d'
    """
    arr = np.asarray(tokens)
    return hashlib.blake2b(arr.astype("<i8").tobytes(), digest_size=16).hexdigest()


def write_table(rows: list[dict[str, Any]], metadata_columns: Sequence[str], spec_json: str) -> bytes:
    """Serialise sample rows to Parquet bytes (zstd-compressed)."""
    base = table_schema()
    columns = {name: [row[name] for row in rows] for name in base.names}
    table = pa.Table.from_pydict(columns, schema=base)
    for name in metadata_columns:
        table = table.append_column(name, pa.array([row.get(name) for row in rows]))
    table = table.replace_schema_metadata({
        b"r3store.version": str(FORMAT_VERSION).encode(),
        b"r3store.spec": spec_json.encode(),
    })
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def read_table(buf: bytes, path: str, commit: str | None = None) -> pa.Table:
    """Parse and check one commit's sample table.

    Parameters
    ----------
    buf : bytes
        The Parquet file.
    path : str
        Its location, for messages.
    commit : str, optional
        The commit the file is named after (``index/<commit>.parquet``); when given, every
        row is checked against the rules of ``schema/FORMAT.md`` section 6 (see
        :func:`check_rows`).

    Raises
    ------
    r3store.errors.FormatError
        Not Parquet; larger than the caps on a sample table (:data:`MAX_TABLE_BYTES`
        decoded, :data:`MAX_TABLE_COLUMNS`, :data:`MAX_TABLE_CELLS`; checked before
        anything is decompressed); a required column is missing or of the wrong type;
        or, with ``commit``, a row breaks a rule.
    r3store.errors.FormatVersionError
        Written by an unknown format version.
    """
    table = _read_capped(buf, path)
    version = (table.schema.metadata or {}).get(b"r3store.version", b"").decode(errors="replace")
    if version != str(FORMAT_VERSION):
        raise FormatVersionError(path, f"sample table format version {version!r} is not {FORMAT_VERSION}")
    for field in table_schema():
        got = table.schema.field(field.name).type if field.name in table.schema.names else None
        if got != field.type:
            raise FormatError(path, f"column {field.name!r} should be {field.type}, found {got}")
    if commit is not None:
        check_rows(table, path, commit)
    return table


def _read_capped(buf: bytes, path: str) -> pa.Table:
    """Read a Parquet file whose footer checks out and whose decoded size fits the caps
    (strings measured before decoding); page checksums are verified where written."""
    footer = read_footer(buf, path)  # before pyarrow: some malformed footers abort it
    strings = _check_caps(footer, path)
    try:
        table = pq.read_table(pa.BufferReader(buf), read_dictionary=strings, use_threads=False,
                              page_checksum_verification=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise FormatError(path, f"not a Parquet sample table: {exc}") from exc
    return _decode_dictionaries(table, path)


def _check_caps(footer: Footer, path: str) -> list[str]:
    """Check the footer against the caps; return the string (BYTE_ARRAY) columns."""
    if footer.num_columns > MAX_TABLE_COLUMNS or footer.num_rows * max(1, footer.num_columns) > MAX_TABLE_CELLS:
        raise FormatError(path, f"sample table of {footer.num_rows} rows x {footer.num_columns} columns is over "
                                f"the caps ({MAX_TABLE_COLUMNS} columns, {MAX_TABLE_CELLS} cells)")
    stored = max(footer.uncompressed_bytes, footer.fixed_bytes)
    if stored > MAX_TABLE_BYTES:
        raise FormatError(path, f"sample table decodes to {stored:,} bytes, over the cap of {MAX_TABLE_BYTES:,}")
    return [leaf.name for leaf in footer.leaves if leaf.physical_type == "BYTE_ARRAY"]


def _decode_dictionaries(table: pa.Table, path: str) -> pa.Table:
    """Turn dictionary columns (string columns are read as such) into plain ones, once
    their decoded size is known to fit: a few bytes of Parquet (one long dictionary value
    repeated by run-length encoding) can decode to gigabytes."""
    columns = [i for i, t in enumerate(table.schema.types) if pa.types.is_dictionary(t)]
    size = sum(_decoded_size(chunk, path) for i in columns for chunk in table.column(i).chunks)
    if size > MAX_TABLE_BYTES:
        raise FormatError(path, f"sample table strings decode to {size:,} bytes, over the cap of {MAX_TABLE_BYTES:,}")
    for i in columns:
        column = table.column(i)
        plain = pa.chunked_array([c.dictionary_decode() for c in column.chunks], type=column.type.value_type)
        table = table.set_column(i, table.schema.field(i).with_type(plain.type), plain)
    return table


def _decoded_size(chunk: pa.DictionaryArray, path: str) -> int:
    """Bytes of ``chunk`` once decoded, computed from its dictionary and indices."""
    kind = chunk.type.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_large_binary(kind):
        return int(pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py() or 0)
    try:
        return int(len(chunk) * -(-kind.bit_width // 8))
    except ValueError:  # not fixed-width
        raise FormatError(path, f"dictionary column of {kind} in a sample table") from None


def check_rows(table: pa.Table, path: str, commit: str) -> None:
    """Check the rows of the sample table ``index/<commit>.parquet`` (vectorised).

    No nulls in the non-nullable columns; ``commit`` matches :data:`COMMIT_NAME` and every
    row's ``shard`` is it and ``array`` is ``routes/<commit>``; ``num_tokens >= 1``,
    ``num_rows >= 0``, ``row_start >= 0`` (all below :data:`MAX_ROWS`);
    ``num_rows == num_tokens - 1`` unless quarantined; no two samples share a row.

    Raises
    ------
    r3store.errors.FormatError
        Names ``path``, the column and the first offending row.
    """
    if not COMMIT_NAME.fullmatch(commit):
        raise FormatError(path, f"commit name {commit!r} does not match {COMMIT_NAME.pattern}")
    for field in table_schema():
        if not field.nullable and table.column(field.name).null_count:
            _reject(table, path, field.name, table.column(field.name).is_null(), "must not be null")
    col = table.column
    rules = [
        ("shard", pc.not_equal(col("shard"), commit), f"must be {commit!r}, the commit the file is named after"),
        ("array", pc.not_equal(col("array"), array_key(commit)), f"must be {array_key(commit)!r}"),
        ("num_tokens", _outside(col("num_tokens"), 1, MAX_ROWS + 1), f"must lie in [1, {MAX_ROWS}]"),
        ("num_rows", _outside(col("num_rows"), 0, MAX_ROWS), f"must lie in [0, {MAX_ROWS})"),
        ("row_start", _outside(col("row_start"), 0, MAX_ROWS), f"must lie in [0, {MAX_ROWS})"),
        ("num_rows", pc.and_(pc.invert(col("quarantined")),
                             pc.not_equal(col("num_rows"), pc.subtract(col("num_tokens"), 1))),
         "must be num_tokens - 1 (the sample is not quarantined)"),
    ]
    for name, bad, rule in rules:
        _reject(table, path, name, bad, rule)
    _check_disjoint(table, path)


def _outside(values: pa.ChunkedArray, low: int, high: int) -> pa.ChunkedArray:
    return pc.or_(pc.less(values, low), pc.greater_equal(values, high))


def _reject(table: pa.Table, path: str, column: str, bad: pa.ChunkedArray, rule: str) -> None:
    """Raise naming the first row where ``bad`` is true (nothing when none is)."""
    i = pc.index(bad, True).as_py()
    if i is None or i < 0:
        return
    sid, value = table.column("sample_id")[i].as_py(), table.column(column)[i].as_py()
    raise FormatError(path, f"column {column!r} {rule}; row {i} (sample {sid!r}) has {value!r}")


def _check_disjoint(table: pa.Table, path: str) -> None:
    """No two samples of one array share a row."""
    order = pc.sort_indices(table, [("row_start", "ascending"), ("num_rows", "ascending")])
    starts = table.column("row_start").take(order).to_numpy()
    ends = starts + table.column("num_rows").take(order).to_numpy()
    overlap = np.flatnonzero(ends[:-1] > starts[1:])
    if overlap.size:
        a, b = (int(order[int(overlap[0]) + k].as_py()) for k in (0, 1))
        ids = table.column("sample_id")
        raise FormatError(path, f"samples {ids[a].as_py()!r} and {ids[b].as_py()!r} share rows of the route array")


def array_rows(table: pa.Table) -> int:
    """Rows of the route array a checked sample table describes: the end of its last sample."""
    if not table.num_rows:
        return 0
    return int(pc.max(pc.add(table.column("row_start"), table.column("num_rows"))).as_py())
