"""Parquet footers, parsed and checked in Python before pyarrow touches them.

pyarrow's metadata accessors (``FileMetaData.row_group(i).column(j)``) construct C++
objects that throw through ``std::terminate`` on some malformed footers (size statistics
whose level histograms do not fit the schema, byte-array statistics on a numeric
column, ...): one flipped bit in a sample table's footer aborted every process that
opened the store. So r3store never calls those accessors; it decodes the footer itself
(Thrift compact protocol, the subset Parquet uses), checks that it describes the kind of
file r3store writes (flat columns of known types, no encryption, no external column
files, consistent row counts, byte ranges inside the file, statistics that fit their
column) and only then hands the bytes to ``pyarrow.parquet.read_table``. The sizes the
caps need (rows, columns, uncompressed bytes) come from this parse too.

Reference: the Parquet format's ``parquet.thrift`` (FileMetaData and the structs it
holds) and the Thrift compact protocol specification.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from r3store.errors import FormatError

__all__ = ["ColumnChunk", "Footer", "Leaf", "RowGroup", "read_footer"]

MAGIC = b"PAR1"
MAX_DEPTH = 24
"""Nesting depth of Thrift structs and lists accepted (a parquet footer needs about 8)."""

# Thrift compact protocol wire types
_BOOL_TRUE, _BOOL_FALSE, _I8, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_ZIGZAG = frozenset((_I16, _I32, _I64))
_NESTED = frozenset((_LIST, _SET, _MAP, _STRUCT))
_BOOLS = frozenset((_BOOL_TRUE, _BOOL_FALSE))
PHYSICAL_TYPES = {0: "BOOLEAN", 1: "INT32", 2: "INT64", 4: "FLOAT", 5: "DOUBLE", 6: "BYTE_ARRAY"}
"""Parquet physical types a sample table may hold (INT96 and FIXED_LEN_BYTE_ARRAY are refused)."""
_CELL_BYTES = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "FLOAT": 4, "DOUBLE": 8}
_CODECS = range(8)  # UNCOMPRESSED .. LZ4_RAW
_OPTIONAL = 1


_Wire = tuple[int, Any]
"""A value read from the wire: its compact type and the Python value (a list's: its element type
and the elements; a struct's: ``{field id: _Wire}``)."""


class _Reader:
    """Thrift compact protocol decoding of one struct, bounded by the buffer and a depth limit.

    Written for speed in plain Python (locals, no per-byte method calls): a sample table's
    footer of a few KB decodes in well under a millisecond.
    """

    def __init__(self, buf: bytes, pos: int, end: int, path: str) -> None:
        self.buf, self.pos, self.end, self.path = buf, pos, end, path

    def fail(self, what: str) -> FormatError:
        return FormatError(self.path, f"Parquet footer is malformed: {what}")

    def varint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        shift = value = 0
        while True:
            if pos >= end:
                raise self.fail("ends inside a value")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 63:
                raise self.fail("varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def byte(self) -> int:
        if self.pos >= self.end:
            raise self.fail("ends inside a value")
        self.pos += 1
        return self.buf[self.pos - 1]

    def take(self, n: int) -> bytes:
        if n > self.end - self.pos:
            raise self.fail(f"a length of {n} runs past the footer")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, kind: int, depth: int) -> Any:
        if kind in _ZIGZAG:  # the common case first
            n = self.varint()
            return (n >> 1) ^ -(n & 1)
        if kind == _BINARY:
            return self.take(self.varint())
        if kind in _NESTED:
            if depth >= MAX_DEPTH:
                raise self.fail(f"nested deeper than {MAX_DEPTH} levels")
            if kind == _STRUCT:
                return self.struct(depth + 1)
            return self.mapping(depth + 1) if kind == _MAP else self.collection(depth + 1)
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return self.byte() == _BOOL_TRUE  # inside a list: one byte per element
        if kind == _I8:
            b = self.byte()
            return b - 256 if b > 127 else b
        if kind == _DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        raise self.fail(f"unknown Thrift type {kind}")

    def collection(self, depth: int) -> _Wire:
        head = self.byte()
        size, kind = head >> 4, head & 0x0F
        if size == 15:
            size = self.varint()
        if size > self.end - self.pos:  # every element takes at least one byte
            raise self.fail(f"a list of {size} elements runs past the footer")
        value = self.value
        return kind, [value(kind, depth) for _ in range(size)]

    def mapping(self, depth: int) -> _Wire:
        size = self.varint()
        if not size:
            return 0, []
        if 2 * size > self.end - self.pos:
            raise self.fail(f"a map of {size} entries runs past the footer")
        kinds = self.byte()
        return 0, [(self.value(kinds >> 4, depth), self.value(kinds & 0x0F, depth)) for _ in range(size)]

    def struct(self, depth: int) -> dict[int, _Wire]:
        fields: dict[int, _Wire] = {}
        buf, end, value = self.buf, self.end, self.value
        last = 0
        while True:
            if self.pos >= end:
                raise self.fail("ends inside a struct")
            head = buf[self.pos]
            self.pos += 1
            if head == 0:
                return fields
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            if fid in fields:
                raise self.fail(f"field {fid} given twice")
            if kind in _BOOLS:  # the type nibble is the value
                fields[fid] = (kind, kind == _BOOL_TRUE)
            else:
                fields[fid] = (kind, value(kind, depth))
            last = fid


@dataclass(frozen=True)
class Leaf:
    """One column of the flat schema."""

    name: str
    physical_type: str
    """One of :data:`PHYSICAL_TYPES`' values."""
    optional: bool
    """Nullable (max definition level 1) or required (0)."""


@dataclass(frozen=True)
class ColumnChunk:
    """The sizes of one column chunk of a row group."""

    num_values: int
    total_uncompressed_size: int
    total_compressed_size: int


@dataclass(frozen=True)
class RowGroup:
    num_rows: int
    total_byte_size: int
    columns: tuple[ColumnChunk, ...]


@dataclass(frozen=True)
class Footer:
    """What a checked Parquet footer says."""

    num_rows: int
    leaves: tuple[Leaf, ...]
    row_groups: tuple[RowGroup, ...]
    key_value: dict[str, str | None]
    """The file's key-value metadata (keys and values decoded as UTF-8)."""

    @property
    def num_columns(self) -> int:
        return len(self.leaves)

    @property
    def uncompressed_bytes(self) -> int:
        """The larger of the two uncompressed totals the footer declares."""
        by_group = sum(g.total_byte_size for g in self.row_groups)
        by_chunk = sum(c.total_uncompressed_size for g in self.row_groups for c in g.columns)
        return max(by_group, by_chunk)

    @property
    def fixed_bytes(self) -> int:
        """Bytes of the fixed-width cells (every non-string column, num_rows values each)."""
        return sum(self.num_rows * _CELL_BYTES[leaf.physical_type] for leaf in self.leaves
                   if leaf.physical_type in _CELL_BYTES)


def read_footer(buf: bytes, path: str) -> Footer:
    """Decode and check the footer of the Parquet file ``buf`` (nothing of pyarrow runs).

    Raises
    ------
    r3store.errors.FormatError
        Not a Parquet file, or its footer is malformed or describes something other than a
        flat table of BOOLEAN/INT32/INT64/FLOAT/DOUBLE/BYTE_ARRAY columns stored in this
        file (encrypted footers or columns, external column files, nested or repeated
        columns, row counts that disagree, byte ranges outside the file, size statistics
        that do not fit their column).
    """
    if len(buf) < 12 or buf[:4] != MAGIC or buf[-4:] != MAGIC:
        raise FormatError(path, "not a Parquet file (no PAR1 magic at both ends; encrypted footers are refused)")
    (length,) = struct.unpack("<I", buf[-8:-4])
    start = len(buf) - 8 - length
    if start < 4:
        raise FormatError(path, f"Parquet footer length {length} does not fit the {len(buf)}-byte file")
    reader = _Reader(buf, start, len(buf) - 8, path)
    meta = reader.struct(0)
    if reader.pos != reader.end:
        raise reader.fail(f"{reader.end - reader.pos} bytes after the FileMetaData struct")
    return _Check(reader, start).file(meta)


class _Check:
    """Check a decoded FileMetaData; field numbers follow ``parquet.thrift``."""

    def __init__(self, reader: _Reader, data_end: int) -> None:
        self.fail = reader.fail
        self.data_end = data_end
        """Where the column data ends (the footer starts)."""

    def get(self, s: dict[int, _Wire], fid: int, kind: int, what: str, *, required: bool = True) -> Any:
        wire = s.get(fid)
        if wire is None:
            if required:
                raise self.fail(f"{what} is missing")
            return None
        if wire[0] != kind and not (kind == _BOOL_TRUE and wire[0] == _BOOL_FALSE):
            raise self.fail(f"{what} has Thrift type {wire[0]}, expected {kind}")
        return wire[1]

    def ints(self, s: dict[int, _Wire], fid: int, kind: int, what: str, *, required: bool = True,
             low: int = 0, high: int = 2**63) -> int | None:
        value = self.get(s, fid, kind, what, required=required)
        if value is not None and not low <= value < high:
            raise self.fail(f"{what} is {value}, outside [{low}, {high})")
        return value  # type: ignore[no-any-return]

    def list_of(self, s: dict[int, _Wire], fid: int, kind: int, what: str, *, required: bool = True) -> list[Any]:
        wire = self.get(s, fid, _LIST, what, required=required)
        if wire is None:
            return []
        if wire[1] and wire[0] != kind:
            raise self.fail(f"{what} holds Thrift type {wire[0]}, expected {kind}")
        return wire[1]  # type: ignore[no-any-return]

    def text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def file(self, meta: dict[int, _Wire]) -> Footer:
        for fid, what in ((8, "encryption_algorithm"), (9, "footer_signing_key_metadata")):
            if fid in meta:
                raise self.fail(f"{what} is set (encrypted files are refused)")
        self.ints(meta, 1, _I32, "version", low=-(2**31), high=2**31)
        leaves = self.schema(self.list_of(meta, 2, _STRUCT, "schema"))
        num_rows = self.ints(meta, 3, _I64, "num_rows") or 0
        groups = tuple(self.row_group(g, leaves, i) for i, g in enumerate(self.list_of(meta, 4, _STRUCT, "row_groups")))
        if sum(g.num_rows for g in groups) != num_rows:
            raise self.fail(f"row groups hold {sum(g.num_rows for g in groups)} rows, the file says {num_rows}")
        orders = self.list_of(meta, 7, _STRUCT, "column_orders", required=False)
        if 7 in meta and len(orders) != len(leaves):
            raise self.fail(f"{len(orders)} column orders for {len(leaves)} columns")
        key_value: dict[str, str | None] = {}
        for kv in self.list_of(meta, 5, _STRUCT, "key_value_metadata", required=False):
            key = self.text(self.get(kv, 1, _BINARY, "key-value key"), "a key-value key")
            raw = self.get(kv, 2, _BINARY, f"value of {key!r}", required=False)
            key_value[key] = None if raw is None else self.text(raw, f"the value of {key!r}")
        return Footer(num_rows, leaves, groups, key_value)

    def schema(self, elements: list[dict[int, _Wire]]) -> tuple[Leaf, ...]:
        if not elements:
            raise self.fail("the schema is empty")
        root, leaves = elements[0], elements[1:]
        if 1 in root or self.ints(root, 5, _I32, "the root's num_children", high=2**31) != len(leaves):
            raise self.fail(f"the schema root must hold the {len(leaves)} columns that follow it (nested "
                            "columns are refused)")
        out = []
        for i, e in enumerate(leaves):
            name = self.text(self.get(e, 4, _BINARY, f"name of column {i}"), f"name of column {i}")
            kind = self.ints(e, 1, _I32, f"type of column {name!r}", low=0, high=8)
            rep = self.ints(e, 3, _I32, f"repetition of column {name!r}", low=0, high=3)
            if kind not in PHYSICAL_TYPES or rep == 2 or self.get(e, 5, _I32, "num_children", required=False):
                raise self.fail(f"column {name!r} is not a flat BOOLEAN/INT32/INT64/FLOAT/DOUBLE/BYTE_ARRAY column "
                                f"(type {kind}, repetition {rep})")
            out.append(Leaf(name, PHYSICAL_TYPES[kind], rep == _OPTIONAL))
        if len({leaf.name for leaf in out}) != len(out):
            raise self.fail("two columns share a name")
        return tuple(out)

    def row_group(self, g: dict[int, _Wire], leaves: tuple[Leaf, ...], i: int) -> RowGroup:
        num_rows = self.ints(g, 3, _I64, f"num_rows of row group {i}") or 0
        total = self.ints(g, 2, _I64, f"total_byte_size of row group {i}") or 0
        chunks = self.list_of(g, 1, _STRUCT, f"columns of row group {i}")
        if len(chunks) != len(leaves):
            raise self.fail(f"row group {i} has {len(chunks)} column chunks for {len(leaves)} columns")
        return RowGroup(num_rows, total, tuple(self.column_chunk(c, leaf, num_rows)
                                               for c, leaf in zip(chunks, leaves, strict=True)))

    def column_chunk(self, c: dict[int, _Wire], leaf: Leaf, rows: int) -> ColumnChunk:
        what = f"column chunk of {leaf.name!r}"
        for fid, field in ((1, "file_path"), (8, "crypto_metadata"), (9, "encrypted_column_metadata")):
            if fid in c:
                raise self.fail(f"{what} sets {field} (external or encrypted column data is refused)")
        for fid, wire in ((4, _I64), (6, _I64), (5, _I32), (7, _I32)):  # page index offsets and lengths
            self.ints(c, fid, wire, f"page index field {fid} of the {what}", required=False, high=self.data_end)
        m = self.get(c, 3, _STRUCT, f"meta_data of the {what}")
        kind = self.ints(m, 1, _I32, f"type of the {what}", low=0, high=8)
        if kind is None or PHYSICAL_TYPES.get(kind) != leaf.physical_type:
            raise self.fail(f"the {what} has type {kind}, its column {leaf.physical_type}")
        path = [self.text(p, "path_in_schema") for p in self.list_of(m, 3, _BINARY, f"path_in_schema of the {what}")]
        if path != [leaf.name]:
            raise self.fail(f"the {what} names path {path}")
        self.ints(m, 4, _I32, f"codec of the {what}", low=_CODECS.start, high=_CODECS.stop)
        for enc in self.list_of(m, 2, _I32, f"encodings of the {what}"):
            if not 0 <= enc < 16:
                raise self.fail(f"the {what} names encoding {enc}")
        values = self.ints(m, 5, _I64, f"num_values of the {what}") or 0
        if values != rows:
            raise self.fail(f"the {what} holds {values} values in a row group of {rows} rows")
        unc = self.ints(m, 6, _I64, f"total_uncompressed_size of the {what}") or 0
        comp = self.ints(m, 7, _I64, f"total_compressed_size of the {what}", high=self.data_end) or 0
        first = self.ints(m, 9, _I64, f"data_page_offset of the {what}", low=4, high=self.data_end) or 4
        dictionary = self.ints(m, 11, _I64, f"dictionary_page_offset of the {what}", required=False, low=4,
                               high=self.data_end)
        begin = min(first, dictionary) if dictionary is not None else first
        if begin + comp > self.data_end:
            raise self.fail(f"the {what} spans bytes [{begin}, {begin + comp}), past the column data")
        for fid, wire in ((14, _I64), (15, _I32)):  # bloom filter offset and length
            self.ints(m, fid, wire, f"bloom filter field {fid} of the {what}", required=False, high=self.data_end)
        if 17 in m:
            raise self.fail(f"the {what} carries geospatial statistics")
        self.size_statistics(self.get(m, 16, _STRUCT, "size_statistics", required=False), leaf, what)
        return ColumnChunk(values, unc, comp)

    def size_statistics(self, s: dict[int, _Wire] | None, leaf: Leaf, what: str) -> None:
        """The checks whose failure pyarrow throws through ``std::terminate``."""
        if s is None:
            return
        if self.ints(s, 1, _I64, "unencoded_byte_array_data_bytes", required=False) is not None and \
                leaf.physical_type != "BYTE_ARRAY":
            raise self.fail(f"the {what} ({leaf.physical_type}) carries byte-array size statistics")
        for fid, name, max_level in ((2, "repetition", 0), (3, "definition", int(leaf.optional))):
            histogram = self.list_of(s, fid, _I64, f"{name} level histogram", required=False)
            if histogram and len(histogram) != max_level + 1:
                raise self.fail(f"the {what} has a {name} level histogram of {len(histogram)} entries, "
                                f"its column has {max_level + 1} levels")
