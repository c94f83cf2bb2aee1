"""On-disk format v1: manifest, route arrays, sample tables (see ``schema/FORMAT.md``)."""

from r3store._format._array import (
    MAX_CHUNK_IDS,
    MAX_INDEX_ENTRIES,
    ArrayGeometry,
    decode_index,
    encode_object,
    route_codec,
)
from r3store._format._manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_PREFIX,
    MANIFEST_KEY,
    MAX_ROWS,
    ROUTES_PREFIX,
    SHARD_NAME,
    load_schema,
    make_manifest,
    parse_manifest,
    zarr_group_json,
)
from r3store._format._table import (
    RESERVED_COLUMNS,
    array_rows,
    read_table,
    table_schema,
    token_hash,
    write_table,
)

__all__ = [
    "ArrayGeometry",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INDEX_PREFIX",
    "MANIFEST_KEY",
    "MAX_CHUNK_IDS",
    "MAX_INDEX_ENTRIES",
    "MAX_ROWS",
    "RESERVED_COLUMNS",
    "ROUTES_PREFIX",
    "SHARD_NAME",
    "array_rows",
    "decode_index",
    "encode_object",
    "load_schema",
    "make_manifest",
    "parse_manifest",
    "read_table",
    "route_codec",
    "table_schema",
    "token_hash",
    "write_table",
    "zarr_group_json",
]
