"""The content digest of a sample table (format v2 key-value metadata ``r3store.digest``).

Parquet page CRCs catch damaged pages, but not a footer edited to another value, a page
rewritten with a fresh CRC, or metadata changed in place. The digest binds what a reader
takes from the table: every column's name, type, validity and values, plus the
``r3store.version`` and ``r3store.spec`` metadata. It is BLAKE2b with a 16-byte digest
over, for each column in file order::

    u32 len + UTF-8 name, u32 len + Arrow type string, u64 num_rows,
    validity: num_rows bytes (1 valid, 0 null),
    values:   int64 / timestamp: <i8 per row (nulls 0); double: <f8 (nulls 0); bool: u8 (nulls 0);
              string: per row u32 len + UTF-8 bytes (null: len 0); null: nothing

then u32 len + the ``r3store.version`` value and u32 len + the ``r3store.spec`` value (all
integers little-endian). The text form is ``"blake2b128:<32 lowercase hex>"``.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from r3store.errors import FormatError

__all__ = ["DIGEST_TYPES", "table_digest"]

DIGEST_TYPES = ("int64", "double", "bool", "string", "timestamp[us, tz=UTC]", "null")
"""Arrow types a format v2 sample table may hold (the digest defines bytes for these only)."""


def _text(value: str) -> bytes:
    raw = value.encode("utf-8")
    return struct.pack("<I", len(raw)) + raw


def _validity(column: pa.ChunkedArray) -> np.ndarray:
    if column.null_count == 0:
        return np.ones(len(column), np.uint8)
    return np.concatenate([np.asarray(c.is_valid(), dtype=np.uint8) for c in column.chunks] or
                          [np.zeros(0, np.uint8)])


def _fixed(column: pa.ChunkedArray, dtype: str) -> bytes:
    """Values of a fixed-width column as ``dtype``, nulls as 0."""
    values = column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column
    if pa.types.is_boolean(values.type):
        arr = np.asarray(values.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8)
    else:
        arr = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False)).astype(dtype)
    return arr.tobytes()


def _strings_joined(chunk: pa.Array) -> bytes:
    """:func:`_strings` of one chunk, by Arrow: each row (nulls as "") joined after its u32 length."""
    n = len(chunk)
    filled = chunk.fill_null("") if chunk.null_count else chunk
    lengths = np.asarray(pc.binary_length(filled).to_numpy(zero_copy_only=False)).astype("<u4")
    prefix = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(0, 4 * n + 1, 4, dtype=np.int32)),
                                                   pa.py_buffer(lengths.tobytes())])
    joined = pc.binary_join_element_wise(prefix, filled.cast(pa.binary()), b"")
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int32, count=n + 1, offset=joined.offset * 4)
    data = joined.buffers()[2]
    return b"" if data is None else data.to_pybytes()[int(offsets[0]) : int(offsets[-1])]


def _strings(column: pa.ChunkedArray) -> bytes:
    """Per row: u32 length + UTF-8 bytes (a null row: length 0)."""
    parts = []
    for chunk in column.chunks:
        n = len(chunk)
        if not n:
            continue
        if chunk.null_count == n:  # every row null: n zero lengths, no bytes
            parts.append(bytes(4 * n))
            continue
        if 4 * n + chunk.nbytes < 2**31 - 1:  # joined rows fit int32 offsets: Arrow writes them
            parts.append(_strings_joined(chunk))
            continue
        offsets = np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=n + 1, offset=chunk.offset * 4)
        data_buf = chunk.buffers()[2]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        valid = np.asarray(chunk.is_valid(), dtype=bool)
        lengths = np.where(valid, np.diff(offsets), 0).astype(np.int64)
        starts = offsets[:-1].astype(np.int64)
        out_starts = 4 * np.arange(n, dtype=np.int64) + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out = np.empty(4 * n + int(lengths.sum()), dtype=np.uint8)
        out[(out_starts[:, None] + np.arange(4)).ravel()] = lengths.astype("<u4").view(np.uint8)
        total = int(lengths.sum())
        if total and int(offsets[-1]) - int(offsets[0]) == total:  # null rows hold no bytes: one contiguous run
            is_prefix = np.zeros(out.size, dtype=bool)
            is_prefix[(out_starts[:, None] + np.arange(4)).ravel()] = True
            out[~is_prefix] = data[int(offsets[0]) : int(offsets[-1])]
        elif total:
            row_of = np.repeat(np.arange(n), lengths)
            within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            out[out_starts[row_of] + 4 + within] = data[starts[row_of] + within]
        parts.append(out.tobytes())
    return b"".join(parts)


def table_digest(table: pa.Table, version: str, spec: str, path: str = "sample table", *,
                 extra: tuple[str, ...] = ()) -> str:
    """``"blake2b128:<hex>"`` of a sample table's content and metadata (see the module docstring).

    Parameters
    ----------
    table : pyarrow.Table
        Columns as read (dictionary columns decoded), in file order.
    version, spec : str
        The ``r3store.version`` and ``r3store.spec`` key-value metadata.
    path : str
        For messages.
    extra : tuple of str
        Further metadata values hashed after the spec, each as ``u32 len + UTF-8`` (a
        checkpoint's ``r3store.checkpoint``; FORMAT.md section 11).

    Raises
    ------
    r3store.errors.FormatError
        A column has a type outside :data:`DIGEST_TYPES`.

    Examples
    --------
    >>> t = pa.table({"a": pa.array([1, None], pa.int64()), "s": pa.array(["x", None])})
    >>> table_digest(t, "2", "{}")
    'blake2b128:eacb4f5256d1bfaa259414cd9da349c5'
    """
    h = hashlib.blake2b(digest_size=16)
    for field, column in zip(table.schema, table.columns, strict=True):
        kind = str(field.type)
        if kind not in DIGEST_TYPES:
            raise FormatError(path, f"column {field.name!r} has type {kind}; a sample table holds only "
                                    f"{', '.join(DIGEST_TYPES)}")
        h.update(_text(field.name))
        h.update(_text(kind))
        h.update(struct.pack("<Q", len(column)))
        h.update(_validity(column).tobytes())
        if kind in ("int64", "timestamp[us, tz=UTC]"):
            h.update(_fixed(column, "<i8"))
        elif kind == "double":
            h.update(_fixed(column, "<f8"))
        elif kind == "bool":
            h.update(_fixed(column, "u1"))
        elif kind == "string":
            h.update(_strings(column))
    h.update(_text(version))
    h.update(_text(spec))
    for value in extra:
        h.update(_text(value))
    return f"blake2b128:{h.hexdigest()}"
