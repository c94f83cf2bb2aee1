"""The Parquet sample table: one row per sample, one file per committed shard."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from r3store._format._manifest import FORMAT_VERSION, load_schema
from r3store.errors import FormatError, FormatVersionError

__all__ = ["RESERVED_COLUMNS", "read_table", "table_schema", "token_hash", "write_table"]

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


def read_table(buf: bytes, path: str) -> pa.Table:
    """Parse and check one shard's sample table.

    Raises
    ------
    r3store.errors.FormatError
        Not Parquet, or a required column is missing or of the wrong type.
    r3store.errors.FormatVersionError
        Written by an unknown format version.
    """
    try:
        table = pq.read_table(pa.BufferReader(buf))
    except (pa.ArrowInvalid, OSError) as exc:
        raise FormatError(path, f"not a Parquet sample table: {exc}") from exc
    version = (table.schema.metadata or {}).get(b"r3store.version", b"").decode()
    if version != str(FORMAT_VERSION):
        raise FormatVersionError(path, f"sample table format version {version!r} is not {FORMAT_VERSION}")
    for field in table_schema():
        got = table.schema.field(field.name).type if field.name in table.schema.names else None
        if got != field.type:
            raise FormatError(path, f"column {field.name!r} should be {field.type}, found {got}")
    return table
