"""The Parquet sample table: one row per sample, one file per commit (its column ``commit`` names it).

Format v2 tables (``index/<bucket>/<commit>.parquet``) carry Parquet page CRCs and, in their
key-value metadata, ``r3store.version = "2"``, ``r3store.spec`` and ``r3store.digest``
(:func:`r3store._format.table_digest`). Format v3 tables are v2 tables with
``r3store.version = "3"`` and ``r3store.store_id`` (the manifest's), bound by the digest.
Format v1 tables (``index/<commit>.parquet``) name the commit column ``shard`` and have no
checksums; readers expose all with the v2 columns (:func:`read_table`).
"""

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

from r3store._format._digest import table_digest
from r3store._format._footer import Footer, read_footer
from r3store._format._json import loads_document
from r3store._format._manifest import FORMAT_VERSION, STORE_ID, load_schema
from r3store._format._rows import check_rows
from r3store._spec import ModelSpec
from r3store.errors import (
    ChecksumError,
    FormatError,
    FormatVersionError,
    SpecConflictError,
    SpecError,
    StoreIdentityError,
)

__all__ = [
    "MAX_TABLE_BYTES",
    "MAX_TABLE_CELLS",
    "MAX_TABLE_COLUMNS",
    "RESERVED_COLUMNS",
    "array_rows",
    "check_columns",
    "check_identity",
    "check_spec",
    "identity_of",
    "read_parquet",
    "read_parquet_groups",
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
_V2_ONLY = ("missing_rows", "policy_spans", "policy_version")
"""Columns format v1 tables do not have (readers add them, null)."""


@cache
def table_schema(version: int = FORMAT_VERSION) -> pa.Schema:
    """Arrow schema of the required sample-table columns of a format version.

    Version 2 is built from ``sample_table.schema.json``; version 1 names the commit column
    ``shard`` and lacks ``missing_rows``, ``policy_spans`` and ``policy_version``.
    """
    doc = load_schema("sample_table")
    fields = [
        pa.field(name, _ARROW_TYPES[prop["x-arrow-type"]], nullable=prop["x-nullable"])
        for name, prop in doc["properties"].items()
    ]
    if version == 1:
        fields = [f.with_name("shard") if f.name == "commit" else f for f in fields if f.name not in _V2_ONLY]
    return pa.schema(fields)


RESERVED_COLUMNS: frozenset[str] = frozenset(table_schema(2).names) | {"shard"}
"""Column names user metadata may not use (``shard``: the v1 name of ``commit``)."""


def token_hash(tokens: Sequence[int] | np.ndarray) -> str:
    """Hex BLAKE2b-128 digest of token ids, taken as little-endian int64.

    Examples
    --------
    >>> token_hash([1, 2, 3])
    'abccad42d03c940bc2b249bf5a4e1e3d'
    """
    arr = np.asarray(tokens)
    return hashlib.blake2b(arr.astype("<i8").tobytes(), digest_size=16).hexdigest()


def write_table(rows: list[dict[str, Any]], metadata_columns: Sequence[str], spec_json: str,
                store_id: str | None = None) -> bytes:
    """Serialise sample rows to a format v3 Parquet sample table (zstd, page CRCs, digest).

    Parameters
    ----------
    rows : list of dict
        One dict per sample with every column of :func:`table_schema` (and metadata).
    metadata_columns : sequence of str
        User metadata columns, in the order to write them.
    spec_json : str
        The store's spec as JSON (``r3store.spec``).
    store_id : str, optional
        The store's identity (``r3store.store_id``, bound by the digest); required by
        format v3 readers.
    """
    base = table_schema()
    columns = {name: [row[name] for row in rows] for name in base.names}
    table = pa.Table.from_pydict(columns, schema=base)
    for name in metadata_columns:
        table = table.append_column(name, pa.array([row.get(name) for row in rows]))
    version = str(FORMAT_VERSION)
    meta = {b"r3store.version": version.encode(), b"r3store.spec": spec_json.encode()}
    extra: tuple[str, ...] = ()
    if store_id is not None:
        meta[b"r3store.store_id"] = store_id.encode()
        extra = (store_id,)
    meta[b"r3store.digest"] = table_digest(table, version, spec_json, extra=extra).encode()
    table = table.replace_schema_metadata(meta)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
    return sink.getvalue()


def read_table(buf: bytes, path: str, commit: str | None = None, *, version: int = FORMAT_VERSION,
               spec: ModelSpec | None = None, spec_source: str = "r3store.json",
               max_sample_rows: int | None = None, store_id: str | None = None) -> pa.Table:
    """Parse and check one commit's sample table; return it with the format v2 columns.

    Parameters
    ----------
    buf : bytes
        The Parquet file.
    path : str
        Its location, for messages.
    commit : str, optional
        The commit the file is named after; when given, every row is checked against the
        rules of ``schema/FORMAT.md`` section 6.
    version : {1, 2}
        The store's format version; the table must have it.
    spec : ModelSpec, optional
        The manifest's spec; the table's ``r3store.spec`` must equal it.
    spec_source : str
        Where ``spec`` comes from, for messages.
    max_sample_rows : int, optional
        Refuse a sample of more rows (checked with ``commit``).
    store_id : str, optional
        The manifest's ``store_id`` (format v3): the table's ``r3store.store_id`` must equal it.

    Returns
    -------
    pyarrow.Table
        Columns of :func:`table_schema` (version 2; a v1 table's ``shard`` renamed
        ``commit`` and the v2-only columns added, null) then user metadata; no schema
        metadata.

    Raises
    ------
    r3store.errors.FormatError
        Not Parquet, or a malformed footer (checked before pyarrow reads it); larger than
        the caps (:data:`MAX_TABLE_BYTES` decoded, :data:`MAX_TABLE_COLUMNS`,
        :data:`MAX_TABLE_CELLS`; before anything is decompressed); a string that is not
        UTF-8; a required column missing or of the wrong type; or a row that breaks a rule.
    r3store.errors.ChecksumError
        A Parquet page CRC fails, or (version 2) the digest does not match the content.
    r3store.errors.SpecConflictError
        The table's spec differs from ``spec``.
    r3store.errors.SampleTooLargeError
        A sample has more than ``max_sample_rows`` rows.
    r3store.errors.FormatVersionError
        Written by another format version than the store's.
    r3store.errors.StoreIdentityError
        (Format v3) the table's ``r3store.store_id`` is not ``store_id``: a table of another store.
    """
    table, meta = read_parquet(buf, path)
    found = meta.get("r3store.version", b"").decode(errors="replace")
    if found != str(version):
        raise FormatVersionError(path, f"sample table format version {found!r} in a format version {version} store")
    if version >= 2:
        _check_digest(table, meta, found, path, extra=identity_of(meta, version, path))
        check_identity(meta, version, path, store_id, "sample table")
    check_columns(table, meta, path, version=version, spec=spec, spec_source=spec_source)
    if commit is not None:
        required = [f.name for f in table_schema(version) if not f.nullable]
        check_rows(table, path, commit, required=required, version=version, max_sample_rows=max_sample_rows)
    table = table.replace_schema_metadata(None)
    return _as_v2(table) if version == 1 else table


def read_parquet(buf: bytes, path: str) -> tuple[pa.Table, dict[str, bytes]]:
    """Read a Parquet file of sample rows whose footer checks out and whose decoded size fits the
    caps (footer checked before pyarrow; page CRCs verified; strings checked to be UTF-8).

    Returns
    -------
    (pyarrow.Table, dict of str to bytes)
        The table (with its schema metadata) and its key-value metadata.

    Raises
    ------
    r3store.errors.FormatError, r3store.errors.ChecksumError
        See :func:`read_table`.
    """
    table = _read_capped(buf, path)
    meta = {k.decode(errors="replace"): v for k, v in (table.schema.metadata or {}).items()}
    _check_utf8(table, path)
    return table, meta


def read_parquet_groups(buf: bytes, path: str, groups: list[int], footer: Footer | None = None) -> list[pa.Table]:
    """Read some row groups of a Parquet file of sample rows, each as a table (no schema metadata),
    with the checks of :func:`read_parquet`: the footer (``footer``: already checked, for these
    bytes) and caps of the whole file, page CRCs, decoded sizes, UTF-8.

    Raises
    ------
    r3store.errors.FormatError, r3store.errors.ChecksumError
        See :func:`read_table`.
    """
    footer = read_footer(buf, path) if footer is None else footer
    strings = _check_caps(footer, path)
    try:
        reader = pq.ParquetFile(pa.BufferReader(buf), read_dictionary=strings, page_checksum_verification=True)
        raw = [reader.read_row_group(g, use_threads=False) for g in groups]
        decoded = [_decode_dictionaries(part, path) for part in raw]  # indices past a damaged dictionary raise here
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        if "CRC checksum verification failed" in str(exc):
            raise ChecksumError(path, (), f"a Parquet page of row groups {groups} fails its CRC: {exc}") from exc
        raise FormatError(path, f"row groups {groups} do not read: {exc}") from exc
    out = []
    for part in decoded:
        _check_utf8(part, path)
        out.append(part.replace_schema_metadata(None))
    return out


def check_columns(table: pa.Table, meta: dict[str, bytes], path: str, *, version: int,
                  spec: ModelSpec | None, spec_source: str) -> None:
    """The required columns of ``version`` have their types, and ``r3store.spec`` equals ``spec``.

    Raises
    ------
    r3store.errors.FormatError, r3store.errors.SpecConflictError
    """
    for field in table_schema(version):
        got = table.schema.field(field.name).type if field.name in table.schema.names else None
        if got != field.type:
            raise FormatError(path, f"column {field.name!r} should be {field.type}, found {got}")
    if spec is not None:
        check_spec(meta.get("r3store.spec", b""), spec, path, spec_source)


def _check_utf8(table: pa.Table, path: str) -> None:
    """Every string is valid UTF-8 (pyarrow does not check what it reads from Parquet)."""
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid:
                raise FormatError(path, f"column {field.name!r} holds a string that is not valid UTF-8") from None


def identity_of(meta: dict[str, bytes], version: int | str, path: str) -> tuple[str, ...]:
    """``(store_id,)`` from a format v3 table's or checkpoint's ``r3store.store_id`` metadata
    (what the digest binds after the spec); ``()`` for format v2.

    Raises
    ------
    r3store.errors.FormatError
        A format v3 object without a well-formed ``r3store.store_id``.
    """
    if int(version) < 3:
        return ()
    raw = meta.get("r3store.store_id")
    text = raw.decode("ascii", errors="replace") if raw is not None else None
    if text is None or not STORE_ID.fullmatch(text):
        raise FormatError(path, f"r3store.store_id metadata {text!r} is not a store identity (32 lowercase hex)")
    return (text,)


def check_identity(meta: dict[str, bytes], version: int | str, path: str, store_id: str | None, what: str) -> None:
    """A format v3 object's ``r3store.store_id`` equals the manifest's ``store_id`` (when given).

    Raises
    ------
    r3store.errors.StoreIdentityError
    """
    found = identity_of(meta, version, path)
    if found and store_id is not None and found[0] != store_id:
        raise StoreIdentityError(path, store_id, found[0], what)


def _check_digest(table: pa.Table, meta: dict[str, bytes], version: str, path: str,
                  extra: tuple[str, ...] = ()) -> None:
    stored = meta.get("r3store.digest", b"").decode(errors="replace")
    spec = meta.get("r3store.spec", b"")
    try:
        spec_text = spec.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(path, "r3store.spec metadata is not UTF-8") from None
    computed = table_digest(table, version, spec_text, path, extra=extra)
    if stored != computed:
        raise ChecksumError(path, (), f"sample table digest {stored[:60]!r} does not match its content ({computed})")


def check_spec(raw: bytes, spec: ModelSpec, path: str, source: str) -> None:
    """The ``r3store.spec`` metadata ``raw`` parses and equals ``spec`` (``source``: where ``spec`` came from).

    Raises
    ------
    r3store.errors.FormatError, r3store.errors.SpecConflictError
    """
    doc = loads_document(raw, f"{path} (r3store.spec)")
    try:
        found = ModelSpec.from_dict(doc).to_dict()
    except SpecError as exc:
        raise FormatError(path, f"r3store.spec metadata is not a valid spec: {exc}") from exc
    if found != spec.to_dict():
        raise SpecConflictError(path, source, dict(spec.to_dict()), dict(found))


def _as_v2(table: pa.Table) -> pa.Table:
    """A format v1 table with the v2 columns: ``shard`` renamed ``commit``, the v2-only columns
    added (null). A v1 metadata column named like a v2 column is kept as ``v1.<name>``, except
    an int64 ``policy_version``, which becomes the v2 column."""
    schema = table_schema(2)
    reserved = set(table_schema(1).names)
    names = []
    for name in table.column_names:
        if name == "shard":
            names.append("commit")
        elif name in schema.names and name not in reserved and \
                not (name == "policy_version" and table.schema.field(name).type == pa.int64()):
            names.append(f"v1.{name}")
        else:
            names.append(name)
    table = table.rename_columns(names)
    for name in _V2_ONLY:
        if name not in table.column_names:
            table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    order = schema.names + [n for n in table.column_names if n not in schema.names]
    return table.select(order)


def _read_capped(buf: bytes, path: str) -> pa.Table:
    """Read a Parquet file whose footer checks out and whose decoded size fits the caps
    (strings measured before decoding); page checksums are verified where written."""
    footer = read_footer(buf, path)  # before pyarrow: some malformed footers abort it
    strings = _check_caps(footer, path)
    try:
        reader = pq.ParquetFile(pa.BufferReader(buf), read_dictionary=strings, page_checksum_verification=True)
        table = reader.read(use_threads=False)
        return _decode_dictionaries(table, path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        if "CRC checksum verification failed" in str(exc):
            raise ChecksumError(path, (), f"a Parquet page fails its CRC: {exc}") from exc
        raise FormatError(path, f"not a Parquet sample table: {exc}") from exc


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


def array_rows(table: pa.Table) -> int:
    """Rows of the route array a checked sample table describes: the end of its last sample."""
    if not table.num_rows:
        return 0
    return int(pc.max(pc.add(table.column("row_start"), table.column("num_rows"))).as_py())
