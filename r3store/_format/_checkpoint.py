"""Checkpoints: one Parquet file holding the sample rows of many commits (``schema/FORMAT.md`` section 11).

A checkpoint ``index/<covered:012d>-<token>.checkpoint`` is a cache of the sample tables
of the commits it covers, written create-if-absent by ``r3store compact``. The sample
tables stay the source of truth: a reader that ignores checkpoints (any format v2 reader)
reads the same store. A checkpoint is checksummed like a sample table (page CRCs, a
BLAKE2b-128 digest that also binds its ``r3store.checkpoint`` metadata) and its footer is
checked before pyarrow reads it. In a format v3 store a checkpoint carries the store's
identity (``store_id`` in ``r3store.checkpoint`` and ``r3store.store_id``, both bound by the
digest): readers refuse a checkpoint of another store (FORMAT.md section 12).

Checkpoint version 2 (written since 0.3.x) is read in parts: its rows are stored in row
groups of :data:`GROUP_ROWS`, each with its own digest, listed in a small header (the
``r3store.checkpoint`` document) with what an open needs without the rows (rows, visible
samples, whether an id repeats, the covered commits whose tables lie in buckets from the
watermark on) and a Bloom filter of the sample ids (``r3store.bloom``); one root digest
(``r3store.digest``) binds the header, the Bloom filter, the spec and the identity.
:func:`read_checkpoint_header` checks the footer and the header only;
:func:`read_checkpoint` checks everything (every group's digest, every row).
Version 1 checkpoints (one digest over every cell) still read, whole.

Checkpoint version 3 (written since issue 21) is version 2 with one Bloom filter per row
group instead of one for the file, and the store-order key of its last row in the header:
a reader finds the group(s) that may hold an id from the header alone and reads and checks
only those (:func:`read_checkpoint_groups`), so the first ``get`` after an open does not read
every row (FORMAT.md section 11.2).
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import re
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from r3store._checks import is_int
from r3store._format._digest import table_digest
from r3store._format._footer import Footer, read_footer
from r3store._format._json import canonical_json, loads_document
from r3store._format._keys import BUCKET_NAME, COMMIT_NAME, array_key, bucket_of, is_bucket
from r3store._format._manifest import FORMAT_VERSION, MAX_ROWS
from r3store._format._rows import check_texts
from r3store._format._table import (
    check_columns,
    check_identity,
    check_spec,
    identity_of,
    read_parquet,
    read_parquet_groups,
    table_schema,
)
from r3store._spec import ModelSpec
from r3store.errors import ChecksumError, FormatError, SampleTooLargeError

__all__ = [
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_VERSION",
    "GROUP_ROWS",
    "LATE_TABLE_S",
    "CheckpointHeader",
    "CheckpointInfo",
    "GroupBlooms",
    "checkpoint_key",
    "parse_checkpoint_key",
    "read_checkpoint",
    "read_checkpoint_groups",
    "read_checkpoint_header",
    "rows_in_store_order",
    "watermark_of",
    "write_checkpoint",
]

CHECKPOINT_PREFIX = "index/"
"""Checkpoints lie directly under ``index/`` (not in a bucket, not named ``.parquet``): one
delimited listing of ``index/`` finds them and the buckets at once, and readers of format v2
that know nothing of checkpoints skip them (they read only ``.parquet`` keys)."""
CHECKPOINT_VERSION = 3
"""Version of the checkpoint layout written (``r3store.checkpoint`` metadata ``version``); 1, 2 and 3 read."""
GROUP_ROWS = 16_384
"""Rows per row group of a version 2 checkpoint (the last group may hold fewer). Each group has
its own digest. Not smaller: r3store checks a Parquet footer in Python before pyarrow reads it,
and that check costs about 0.3 ms per row group of sample rows (4,096-row groups made the
footer of a 100,000-row checkpoint cost more to check than a 2,000-row checkpoint to read)."""
BLOOM_BITS_PER_ID = 16
"""Bloom filter size of a version 2 checkpoint, in bits per row (at least 1,024 bits in all)."""
BLOOM_HASHES = 11
"""Bloom filter probes per id (about 0.05% false positives at 16 bits per id)."""
GROUP_BLOOM_BITS_PER_ID = 20
"""Bits per row of each row group's Bloom filter in a version 3 checkpoint (at least 64 per group):
about 0.007% false positives per group, so a test of an id against every group's filter of a
7-group checkpoint errs about as often (0.05%) as version 2's one filter of 16 bits per id."""
GROUP_BLOOM_HASHES = 14
"""Probes per id of a version 3 checkpoint's group filters (optimal for 20 bits per id)."""
LATE_TABLE_S = 15 * 60
"""A sample table that lands after time ``t`` has a bucket no older than the hour of
``t - LATE_TABLE_S`` (FORMAT.md section 2.1)."""
_KEY = re.compile(r"index/(\d{12})-([0-9a-f]{32})\.checkpoint")


def checkpoint_key(covered: int, token: str) -> str:
    """``index/<covered:012d>-<token>.checkpoint``: names sort by the number of commits covered.

    Examples
    --------
    >>> checkpoint_key(1000, "0" * 32)
    'index/000000001000-00000000000000000000000000000000.checkpoint'
    """
    return f"{CHECKPOINT_PREFIX}{covered:012d}-{token}.checkpoint"


def parse_checkpoint_key(key: str) -> int | None:
    """The number of covered commits a checkpoint key names, or None for any other key."""
    match = _KEY.fullmatch(key)
    return None if match is None else int(match.group(1))


def watermark_of(listed_at: datetime) -> str:
    """The oldest bucket a sample table landing after ``listed_at`` may have (FORMAT.md 2.1).

    Examples
    --------
    >>> watermark_of(datetime(2026, 11, 29, 7, 10, tzinfo=UTC)), watermark_of(datetime(2026, 11, 29, 7, 20, tzinfo=UTC))
    ('20261129T06', '20261129T07')
    """
    return bucket_of(listed_at - timedelta(seconds=LATE_TABLE_S))


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint says about itself (its ``r3store.checkpoint`` metadata)."""

    commits: frozenset[str]
    """The commits whose rows it holds (every row of each): the distinct values of its ``commit`` column."""
    watermark: str
    """Bucket ``yyyymmddTHH``: a commit it does not cover has its table in this bucket or a newer one."""
    created_at: str
    """When the compaction listed ``index/`` (ISO 8601, UTC)."""
    store_id: str | None = None
    """The identity of the store it was written for (format v3; None in format v2)."""


def write_checkpoint(table: pa.Table, spec_json: str, *, listed_at: datetime, version: int = FORMAT_VERSION,
                     store_id: str | None = None, recent: Collection[str] = (), layout: int | None = None) -> bytes:
    """Serialise checked sample rows as a version 3 checkpoint (zstd, page CRCs, group and root digests,
    one Bloom filter per row group).

    Parameters
    ----------
    table : pyarrow.Table
        Every row of the covered commits' sample tables (the columns of ``table_schema(2)``,
        then user metadata), as read and checked, in store order.
    spec_json : str
        The store's spec as JSON (``r3store.spec``).
    listed_at : datetime
        When the listing of ``index/`` that found the covered commits started.
    version : int
        The store's format version (2 or 3).
    store_id : str, optional
        The store's identity (format v3: required).
    recent : collection of str
        The covered commits whose sample tables lie in buckets at or after the watermark
        (:func:`watermark_of` of ``listed_at``): the only covered commits a reader must tell
        apart from newer ones (FORMAT.md section 11). Each must name rows of ``table``.
    layout : {2, 3}, optional
        The checkpoint version (default :data:`CHECKPOINT_VERSION`; 2: one Bloom filter for the
        file, as r3store wrote before issue 21, for tests and fixtures).

    Raises
    ------
    r3store.errors.FormatError
        A format v3 checkpoint without ``store_id``, or a ``recent`` commit with no row.
    """
    if version >= 3 and store_id is None:
        raise FormatError("checkpoint", "a format v3 checkpoint needs the store's store_id")
    layout = CHECKPOINT_VERSION if layout is None else layout
    if layout not in (2, 3):
        raise FormatError("checkpoint", f"checkpoint version {layout} is not written (2 or 3)")
    text = str(version)
    commits = set(pc.unique(table.column("commit")).to_pylist())
    stray = sorted(set(recent) - commits)
    if stray:
        raise FormatError("checkpoint", f"recent commit {stray[0]!r} has no row in the checkpoint")
    ids = table.column("sample_id").to_pylist()
    unique = len(set(ids)) == len(ids)
    hidden = int(pc.sum(table.column("quarantined")).as_py() or 0)
    parts = _groups(table, [GROUP_ROWS] * -(-len(table) // GROUP_ROWS))
    groups: list[list[object]] = [[len(part), table_digest(part, text, spec_json, extra=(f"group {i}",))]
                                  for i, part in enumerate(parts)]
    if layout == 2:
        bits = max(1024, -(-BLOOM_BITS_PER_ID * len(ids) // 64) * 64)
        words, hashes = BloomFilter.build(ids, bits, BLOOM_HASHES).bits, BLOOM_HASHES
    else:
        filters = []
        for entry, part in zip(groups, parts, strict=True):
            size = max(64, -(-GROUP_BLOOM_BITS_PER_ID * len(part) // 64) * 64)
            filters.append(BloomFilter.build(part.column("sample_id").to_pylist(), size, GROUP_BLOOM_HASHES).bits)
            entry.append(size)
        words = np.concatenate(filters) if filters else np.zeros(0, np.uint64)
        bits, hashes = 64 * len(words), GROUP_BLOOM_HASHES
    doc: dict[str, object] = {"version": layout, "watermark": watermark_of(listed_at),
                              "created_at": listed_at.astimezone(UTC).isoformat(timespec="seconds"),
                              "commits": len(commits), "rows": len(table), "visible": len(table) - hidden,
                              "unique_ids": unique, "groups": groups, "recent": sorted(recent),
                              "max_rows": int(pc.max(table.column("num_rows")).as_py() or 0) if len(table) else 0,
                              "bloom": {"bits": bits, "hashes": hashes}}
    if layout >= 3:
        doc["last"] = _last_key(table)
    if version >= 3:
        doc["store_id"] = store_id
    meta = canonical_json(doc).decode()
    bloom_text = base64.b64encode(words.astype("<u8").tobytes()).decode()
    kv = {b"r3store.version": text.encode(), b"r3store.spec": spec_json.encode(), b"r3store.checkpoint": meta.encode(),
          b"r3store.bloom": bloom_text.encode()}
    if version >= 3:
        kv[b"r3store.store_id"] = str(store_id).encode()
    kv[b"r3store.digest"] = _root_digest(text, spec_json, meta, bloom_text,
                                         (str(store_id),) if version >= 3 else ()).encode()
    table = table.replace_schema_metadata(kv)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True, row_group_size=GROUP_ROWS,
                   write_statistics=False)
    return sink.getvalue()


def _last_key(table: pa.Table) -> list[object] | None:
    """``[committed_at as microseconds since the epoch, commit]`` of the last row (None: no rows):
    the store-order key a newer row must exceed for the rows to stay in place (section 11.2)."""
    if not table.num_rows:
        return None
    last = table.slice(table.num_rows - 1)
    return [int(pc.cast(last.column("committed_at"), pa.int64())[0].as_py()), last.column("commit")[0].as_py()]


def rows_in_store_order(table: pa.Table) -> bool:
    """Whether every row's (committed_at, commit, row_start) is >= the previous row's (a null: no),
    so that the stable sort into store order would leave ``table`` as it is."""
    if table.num_rows < 2:
        return True
    before, after = table.slice(0, table.num_rows - 1), table.slice(1)
    ordered = pc.less_equal(before.column("row_start"), after.column("row_start"))
    for name in ("commit", "committed_at"):
        a, b = before.column(name), after.column(name)
        ordered = pc.or_(pc.less(a, b), pc.and_(pc.equal(a, b), ordered))
    return bool(pc.all(pc.fill_null(ordered, False)).as_py())


def _root_digest(version: str, spec: str, header: str, bloom: str, identity: tuple[str, ...]) -> str:
    """``blake2b128:<hex>`` over ``u32 len + UTF-8`` of the version, spec, header, Bloom filter
    (base64) and, in format v3, the store id (FORMAT.md section 11, checkpoint version 2)."""
    h = hashlib.blake2b(digest_size=16)
    for value in (version, spec, header, bloom, *identity):
        raw = value.encode()
        h.update(struct.pack("<I", len(raw)))
        h.update(raw)
    return f"blake2b128:{h.hexdigest()}"


def _groups(table: pa.Table, sizes: Sequence[int]) -> list[pa.Table]:
    """``table`` cut into consecutive slices of ``sizes`` rows."""
    out, start = [], 0
    for size in sizes:
        out.append(table.slice(start, size))
        start += size
    return out


@dataclass(frozen=True)
class BloomFilter:
    """A Bloom filter of sample ids: ``bits`` bits (a multiple of 64, stored little-endian
    as uint64 words, bit ``p`` is bit ``p % 64`` of word ``p // 64``), ``hashes`` probes per id.

    Probe ``i`` of an id is ``(h1 + i * h2) mod bits`` (unsigned 64-bit arithmetic), with
    ``h1``, ``h2`` the two little-endian uint64 halves of BLAKE2b-128 of the id's UTF-8 bytes
    (``h2`` with its lowest bit set): double hashing (Kirsch and Mitzenmacher, "Less Hashing,
    Same Performance", 2006).
    """

    bits: np.ndarray
    """uint64 words."""
    hashes: int

    @staticmethod
    def _halves(ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``h1``, ``h2`` (lowest bit set) of each id, as uint64 column vectors."""
        raw = b"".join(hashlib.blake2b(i.encode(), digest_size=16).digest() for i in ids)
        halves = np.frombuffer(raw, dtype="<u8").reshape(len(ids), 2)
        return halves[:, 0:1], halves[:, 1:2] | np.uint64(1)

    @staticmethod
    def _probes(ids: Sequence[str], nbits: int, hashes: int,
                halves: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        h1, h2 = BloomFilter._halves(ids) if halves is None else halves
        steps = np.arange(hashes, dtype=np.uint64)[None, :]
        with np.errstate(over="ignore"):
            probes: np.ndarray = (h1 + steps * h2) % np.uint64(nbits)
        return probes

    @classmethod
    def build(cls, ids: Sequence[str], nbits: int, hashes: int) -> BloomFilter:
        """The filter of ``ids`` in ``nbits`` bits (a multiple of 64)."""
        words = np.zeros(nbits // 64, dtype=np.uint64)
        if ids:
            probes = cls._probes(ids, nbits, hashes).ravel()
            np.bitwise_or.at(words, probes // np.uint64(64), np.uint64(1) << (probes % np.uint64(64)))
        return cls(words, hashes)

    def held(self, ids: Sequence[str], halves: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Boolean mask: whether the filter may hold each id (``halves``: :meth:`_halves` of ``ids``)."""
        if not ids:
            return np.zeros(0, dtype=bool)
        probes = self._probes(ids, len(self.bits) * 64, self.hashes, halves)
        found = (self.bits[probes // np.uint64(64)] >> (probes % np.uint64(64))) & np.uint64(1)
        held: np.ndarray = np.all(found, axis=1)
        return held

    def hits(self, ids: Sequence[str]) -> list[str]:
        """The ids of ``ids`` the filter may hold (each one it holds, and about 0.05% of others)."""
        return [i for i, hit in zip(ids, self.held(ids), strict=True) if hit]


@dataclass(frozen=True)
class GroupBlooms:
    """The Bloom filters of a version 3 checkpoint, one per row group (in file order): each of the
    ``sample_id`` of its group's rows, laid out as :class:`BloomFilter`."""

    filters: tuple[BloomFilter, ...]

    def hits(self, ids: Sequence[str]) -> list[str]:
        """The ids of ``ids`` some group's filter may hold (each one the checkpoint holds, and a few others)."""
        if not ids or not self.filters:
            return []
        halves = BloomFilter._halves(ids)
        held = np.zeros(len(ids), dtype=bool)
        for bloom in self.filters:
            held |= bloom.held(ids, halves)
        return [i for i, hit in zip(ids, held, strict=True) if hit]

    def groups_of(self, sample_id: str) -> list[int]:
        """The row groups whose filter may hold ``sample_id`` (the one holding it, if any, and a
        false positive now and then: about 0.007% per group), in file order."""
        halves = BloomFilter._halves([sample_id])
        return [g for g, bloom in enumerate(self.filters) if bloom.held([sample_id], halves)[0]]


@dataclass(frozen=True)
class CheckpointHeader:
    """What a version 2 checkpoint's header says (checked by its root digest; rows not read)."""

    info: CheckpointInfo
    """Watermark, creation time and identity; ``commits`` holds only :attr:`recent` (the full set
    needs the rows)."""
    commits: int
    """How many commits it covers."""
    rows: int
    """Sample rows it holds (quarantined and duplicated ones included)."""
    visible: int
    """Rows not quarantined."""
    unique_ids: bool
    """Whether no sample id appears in two of its rows (checked when the rows are read)."""
    groups: tuple[tuple[int, str], ...]
    """(rows, digest) of each row group, in file order."""
    recent: frozenset[str]
    """The covered commits whose sample tables lie in buckets at or after the watermark."""
    bloom: BloomFilter | GroupBlooms
    """The sample ids it holds (``hits``)."""
    max_rows: int = 0
    """The largest ``num_rows`` of its rows (a reader with a lower cap reads the rows at open)."""
    layout: int = 2
    """The checkpoint version (2 or 3)."""
    group_blooms: GroupBlooms | None = None
    """Version 3: one Bloom filter per row group (:attr:`bloom` is then the same filters, as one)."""
    last: tuple[int, str] | None = None
    """Version 3: ``(committed_at in microseconds since the epoch, commit)`` of the last row (None: no rows)."""
    footer: Footer | None = dataclass_field(default=None, compare=False, repr=False)
    """The checked Parquet footer (row groups are read from it without checking it again)."""

    def group_start(self, group: int) -> int:
        """The file row of the first row of row group ``group``."""
        return sum(rows for rows, _ in self.groups[:group])


def read_checkpoint_header(buf: bytes, path: str, *, spec: ModelSpec, spec_source: str = "r3store.json",
                           version: int = FORMAT_VERSION, store_id: str | None = None) -> CheckpointHeader | None:
    """Check a checkpoint's footer and header without reading its rows; None for a version 1 checkpoint.

    Version 3 headers also give each row group's Bloom filter (``groups`` entries ``[rows,
    digest, bits]``, the filters back to back in ``r3store.bloom``) and ``last``; the footer
    must list the header's row groups, of the header's sizes.

    Checked: the Parquet footer (before pyarrow, which does not run here), the format
    version, the root digest (binding the header, the Bloom filter, the spec and the
    identity), the header's fields, the spec and the store identity. The rows are checked
    by :func:`read_checkpoint`.

    Raises
    ------
    r3store.errors.FormatError
        Malformed footer or header; ChecksumError when the root digest does not match,
        SpecConflictError, StoreIdentityError as :func:`read_checkpoint`.
    """
    footer = read_footer(buf, path)
    kv = footer.key_value
    meta = {k: (v or "").encode() for k, v in kv.items()}
    _check_version(meta, path, version)
    text = _header_text(meta, path)
    doc = loads_document(text, f"{path} (r3store.checkpoint)")
    if doc.get("version") == 1:
        return None
    identity = identity_of(meta, version, path)
    bloom_text = kv.get("r3store.bloom") or ""
    stored = kv.get("r3store.digest") or ""
    computed = _root_digest(str(version), kv.get("r3store.spec") or "", text, bloom_text, identity)
    if stored != computed:
        raise ChecksumError(path, (), f"checkpoint root digest {stored[:60]!r} does not match its header ({computed})")
    layout = doc.get("version")
    info = _info(doc, text, meta, path, version, store_id, expect=3 if layout == 3 else 2)
    check_spec(meta.get("r3store.spec", b""), spec, path, spec_source)
    rows, visible, unique, groups, recent, bloom, max_rows, last = (
        doc.get(k) for k in ("rows", "visible", "unique_ids", "groups", "recent", "bloom", "max_rows", "last"))
    fault = f"r3store.checkpoint metadata {text[:200]!r} is not a version {layout} checkpoint header"
    width = 3 if layout == 3 else 2
    if not (is_int(rows) and is_int(visible) and 0 <= visible <= rows and isinstance(unique, bool) and is_int(max_rows)
            and isinstance(groups, list) and isinstance(recent, list) and isinstance(bloom, dict)
            and all(isinstance(c, str) and COMMIT_NAME.fullmatch(c) for c in recent)
            and all(isinstance(g, list) and len(g) == width and is_int(g[0]) and 0 < g[0] <= GROUP_ROWS
                    and isinstance(g[1], str) and (width == 2 or (is_int(g[2]) and g[2] >= 64 and g[2] % 64 == 0))
                    for g in groups)):
        raise FormatError(path, fault)
    if layout == 3 and not (last is None if rows == 0 else (
            isinstance(last, list) and len(last) == 2 and is_int(last[0]) and isinstance(last[1], str)
            and COMMIT_NAME.fullmatch(last[1]))):
        raise FormatError(path, f"{fault}: last must be [committed_at in microseconds, commit] (null without rows)")
    nbits, hashes = bloom.get("bits"), bloom.get("hashes")
    if not (is_int(nbits) and is_int(hashes) and 1 <= hashes <= 64 and nbits >= 64 and nbits % 64 == 0):
        raise FormatError(path, f"{fault}: bloom must give bits (a multiple of 64) and hashes (1 to 64)")
    try:
        raw = base64.b64decode(bloom_text, validate=True)
    except ValueError:
        raise FormatError(path, "r3store.bloom is not base64") from None
    if len(raw) * 8 != nbits:
        raise FormatError(path, f"r3store.bloom holds {len(raw) * 8} bits, the header says {nbits}")
    if sum(g[0] for g in groups) != rows:
        raise FormatError(path, f"the header's row groups hold {sum(g[0] for g in groups)} rows, it says {rows}")
    words = np.frombuffer(raw, dtype="<u8").copy()
    blooms = None
    if layout == 3:
        if sum(g[2] for g in groups) != nbits:
            raise FormatError(path, f"the header's row groups' Bloom filters hold {sum(g[2] for g in groups)} bits, "
                                    f"its bloom says {nbits}")
        ends = np.cumsum([0] + [g[2] // 64 for g in groups]).tolist()
        blooms = GroupBlooms(tuple(BloomFilter(words[a:b], int(hashes)) for a, b in itertools.pairwise(ends)))
        if len(footer.row_groups) != len(groups) or any(
                rg.num_rows != g[0] for rg, g in zip(footer.row_groups, groups, strict=False)):
            raise FormatError(path, f"the file's {len(footer.row_groups)} row groups of "
                                    f"{[rg.num_rows for rg in footer.row_groups][:8]} rows are not the header's "
                                    f"{len(groups)} of {[g[0] for g in groups][:8]}")
    return CheckpointHeader(info=CheckpointInfo(commits=frozenset(recent), watermark=info.watermark,
                                                created_at=info.created_at, store_id=info.store_id),
                            commits=int(info_count(doc)), rows=rows, visible=visible, unique_ids=unique,
                            groups=tuple((int(g[0]), str(g[1])) for g in groups), recent=frozenset(recent),
                            max_rows=int(max_rows),
                            bloom=blooms if blooms is not None else BloomFilter(words, int(hashes)),
                            layout=3 if layout == 3 else 2, group_blooms=blooms,
                            last=None if last is None or layout != 3 else (int(last[0]), str(last[1])),
                            footer=footer)


def info_count(doc: dict[str, object]) -> int:
    """The ``commits`` count of a checked header document."""
    count = doc["commits"]
    assert isinstance(count, int)
    return count


def _check_version(meta: dict[str, bytes], path: str, version: int) -> None:
    if meta.get("r3store.version", b"") != str(version).encode():
        raise FormatError(path, f"checkpoint of format version {meta.get('r3store.version', b'')!r} in a format "
                                f"version {version} store")


def _header_text(meta: dict[str, bytes], path: str) -> str:
    raw = meta.get("r3store.checkpoint")
    if raw is None:
        raise FormatError(path, "no r3store.checkpoint metadata: not a checkpoint")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(path, "r3store.checkpoint metadata is not UTF-8") from None


def _info(doc: dict[str, object], text: str, meta: dict[str, bytes], path: str, version: int,
          store_id: str | None, *, expect: int) -> CheckpointInfo:
    """The checked common fields of a checkpoint document (``commits`` left empty)."""
    watermark, created, count = doc.get("watermark"), doc.get("created_at"), doc.get("commits")
    if doc.get("version") != expect or not isinstance(watermark, str) or \
            not BUCKET_NAME.fullmatch(watermark) or not is_bucket(watermark) or not isinstance(created, str) or \
            not is_int(count):
        raise FormatError(path, f"r3store.checkpoint metadata {text[:200]!r} is not a version "
                                f"{expect} checkpoint description")
    named = doc.get("store_id")
    if version >= 3 and named != identity_of(meta, version, path)[0]:
        raise FormatError(path, f"r3store.checkpoint names store_id {named!r}, r3store.store_id says otherwise")
    if version < 3 and named is not None:
        raise FormatError(path, "a format v2 checkpoint names a store_id")
    check_identity(meta, version, path, store_id, "checkpoint")
    return CheckpointInfo(commits=frozenset(), watermark=watermark, created_at=created,
                          store_id=named if isinstance(named, str) else None)


def read_checkpoint(buf: bytes, path: str, *, spec: ModelSpec, spec_source: str = "r3store.json",
                    max_sample_rows: int | None = None, version: int = FORMAT_VERSION,
                    store_id: str | None = None, check_bloom: bool = True,
                    header: CheckpointHeader | None = None) -> tuple[pa.Table, CheckpointInfo]:
    """Parse and check a checkpoint (version 1 or 2), every row; return its rows and what it covers.

    Checked: the footer before pyarrow, the size caps, page CRCs, the digests (version 1:
    one over every cell and the ``r3store.checkpoint`` metadata; version 2: the root digest
    over the header, then each row group's digest as the header lists it), UTF-8, the column
    types, the spec, and the row rules of FORMAT.md section 6.2 applied to each row's own
    commit (``array`` is ``routes/<commit>``, counts in range, no two samples of one array
    share a row, the text columns parse), and the number of covered commits recorded;
    version 2 also the header's rows, visible rows, unique-id fact and recent commits
    against the rows, and (``check_bloom``) that its Bloom filter holds every id (about
    0.6 us per row; a reader that compares what it found without the rows with what the
    rows say may skip it). ``header``: what :func:`read_checkpoint_header` returned for these
    same bytes (not parsed again).

    Returns
    -------
    (pyarrow.Table, CheckpointInfo)
        The rows (columns of ``table_schema(2)`` then user metadata, no schema metadata).

    Raises
    ------
    r3store.errors.FormatError
        Malformed or over the caps; ChecksumError on a failed CRC or digest (naming the row
        group of a version 2 checkpoint), SpecConflictError, SampleTooLargeError as for
        sample tables; StoreIdentityError (format v3) when it was written for another store
        than ``store_id``.
    """
    if header is None:
        header = read_checkpoint_header(buf, path, spec=spec, spec_source=spec_source, version=version,
                                        store_id=store_id)
    table, meta = read_parquet(buf, path)
    _check_version(meta, path, version)
    text = _header_text(meta, path)
    if header is None:
        stored = meta.get("r3store.digest", b"").decode(errors="replace")
        computed = table_digest(table, str(version), meta.get("r3store.spec", b"").decode(errors="replace"),
                                path, extra=(text, *identity_of(meta, version, path)))
        if stored != computed:
            raise ChecksumError(path, (), f"checkpoint digest {stored[:60]!r} does not match its content ({computed})")
        doc = loads_document(text, f"{path} (r3store.checkpoint)")
        info = _info(doc, text, meta, path, version, store_id, expect=1)
        count = info_count(doc)
    else:
        info, count = header.info, header.commits
        if table.num_rows != header.rows:
            raise FormatError(path, f"checkpoint holds {table.num_rows} rows, its header says {header.rows}")
        plain = table.replace_schema_metadata(None)
        spec_text = meta.get("r3store.spec", b"").decode(errors="replace")
        for i, (part, (_, digest)) in enumerate(zip(_groups(plain, [g[0] for g in header.groups]), header.groups,
                                                    strict=True)):
            computed = table_digest(part, str(version), spec_text, path, extra=(f"group {i}",))
            if computed != digest:
                raise ChecksumError(path, (), f"row group {i} (rows {i * GROUP_ROWS} to "
                                              f"{i * GROUP_ROWS + len(part) - 1}) does not match its digest "
                                              f"{digest[:60]!r} ({computed})")
    check_columns(table, meta, path, version=version, spec=spec, spec_source=spec_source)
    table = table.replace_schema_metadata(None)
    _check_rows(table, path, max_sample_rows)
    commits = frozenset(pc.unique(table.column("commit")).to_pylist())
    if len(commits) != count:
        raise FormatError(path, f"checkpoint says it covers {count} commits, its rows name {len(commits)}")
    if header is not None:
        _check_header(table, header, commits, path, check_bloom)
    return table, CheckpointInfo(commits=commits, watermark=info.watermark, created_at=info.created_at,
                                 store_id=info.store_id)


def _check_header(table: pa.Table, header: CheckpointHeader, commits: frozenset[str], path: str,
                  check_bloom: bool) -> None:
    """A version 2 header's facts hold for the rows."""
    visible = table.num_rows - int(pc.sum(table.column("quarantined")).as_py() or 0)
    if visible != header.visible:
        raise FormatError(path, f"checkpoint header says {header.visible} visible rows, its rows hold {visible}")
    top = int(pc.max(table.column("num_rows")).as_py() or 0) if table.num_rows else 0
    if top != header.max_rows:
        raise FormatError(path, f"checkpoint header says max_rows={header.max_rows}, its rows say {top}")
    unique = len(pc.unique(table.column("sample_id"))) == table.num_rows
    if unique != header.unique_ids:
        raise FormatError(path, f"checkpoint header says unique_ids={header.unique_ids}, its rows say {unique}")
    stray = sorted(header.recent - commits)
    if stray:
        raise FormatError(path, f"checkpoint header names recent commit {stray[0]!r}, which has no row")
    if header.layout >= 3:
        _check_order(table, header, path)
    ids = table.column("sample_id").to_pylist() if check_bloom else []
    if header.group_blooms is not None and ids:
        starts = np.cumsum([0] + [rows for rows, _ in header.groups]).tolist()
        missing = sum(len(part) - len(bloom.hits(part)) for bloom, part in zip(
            header.group_blooms.filters, (ids[a:b] for a, b in itertools.pairwise(starts)), strict=True))
    else:
        missing = len(ids) - len(header.bloom.hits(ids))
    if missing:
        raise FormatError(path, f"checkpoint Bloom filter misses {missing} of its sample ids")


def _check_order(table: pa.Table, header: CheckpointHeader, path: str, *, first_row: int = 0) -> None:
    """Version 3: the rows (file rows ``first_row`` on) are in store order, and the file's last row
    has the header's ``last`` key (checked when ``table`` ends the file)."""
    if not rows_in_store_order(table):
        raise FormatError(path, f"checkpoint rows {first_row} to {first_row + table.num_rows - 1} are not in store "
                                "order (committed_at, commit, row_start), as a version 3 checkpoint must be")
    if first_row + table.num_rows == header.rows:
        last = _last_key(table)
        found = None if last is None else (last[0], last[1])
        if found != header.last:
            raise FormatError(path, f"checkpoint header says its last row is {header.last}, its rows end with {found}")


def read_checkpoint_groups(buf: bytes, path: str, header: CheckpointHeader, groups: Sequence[int], *,
                           version: int = FORMAT_VERSION, max_sample_rows: int | None = None) -> pa.Table:
    """Read and check some row groups of a version 2 or 3 checkpoint whose header passed
    :func:`read_checkpoint_header` (same bytes): what a lookup of a few ids needs.

    Checked, for those groups: the size caps and footer (as checked with the header), the
    page CRCs, each group's digest against the header, UTF-8, the column types, the row
    rules of FORMAT.md section 6.2 among the rows read (array, counts, overlaps, text
    columns), the cap on rows per sample, no sample id twice when the header says
    ``unique_ids``, and (version 3) store order and the header's ``last``. What needs every
    row (the commit count, ``visible``, ``recent``, overlaps with rows of other groups) is
    checked when every row is read (:func:`read_checkpoint`).

    Parameters
    ----------
    groups : sequence of int
        Row groups to read, ascending and consecutive (e.g. ``[3]`` or ``[3, 4]``).

    Returns
    -------
    pyarrow.Table
        The rows of those groups, in file order (no schema metadata).

    Raises
    ------
    r3store.errors.FormatError
        A fault in those groups; ChecksumError on a failed CRC or group digest (naming the
        group and its rows); SampleTooLargeError over ``max_sample_rows``.
    """
    groups = list(groups)
    if not groups or groups != list(range(groups[0], groups[0] + len(groups))) or groups[0] < 0 \
            or groups[-1] >= len(header.groups):
        raise FormatError(path, f"row groups {groups[:8]} are not consecutive groups of the checkpoint's "
                                f"{len(header.groups)}")
    footer = header.footer if header.footer is not None else read_footer(buf, path)
    if len(footer.row_groups) != len(header.groups):
        raise FormatError(path, f"the file has {len(footer.row_groups)} row groups, its header lists "
                                f"{len(header.groups)}")
    spec_text = footer.key_value.get("r3store.spec") or ""
    first = header.group_start(groups[0])
    parts = []
    start = first
    for g, plain in zip(groups, read_parquet_groups(buf, path, groups, footer), strict=True):
        rows, digest = header.groups[g]
        computed = table_digest(plain, str(version), spec_text, path, extra=(f"group {g}",))
        if plain.num_rows != rows or computed != digest:
            raise ChecksumError(path, (), f"row group {g} (rows {start} to {start + rows - 1}) does not match its "
                                          f"digest {digest[:60]!r} ({computed})")
        parts.append(plain)
        start += rows
    table = pa.concat_tables(parts)
    meta = {k: (v or "").encode() for k, v in footer.key_value.items()}
    check_columns(table, meta, path, version=version, spec=None, spec_source="")
    _check_rows(table, path, max_sample_rows)
    if header.unique_ids and len(pc.unique(table.column("sample_id"))) != table.num_rows:
        raise FormatError(path, f"checkpoint header says unique_ids=True, row groups {groups} repeat a sample id")
    if header.layout >= 3:
        _check_order(table, header, path, first_row=first)
    return table


def _check_rows(table: pa.Table, path: str, max_sample_rows: int | None) -> None:
    """FORMAT.md 6.2 row rules, each row against its own commit (vectorised)."""
    col = table.column
    for field in table_schema(2):
        if not field.nullable and col(field.name).null_count:
            raise FormatError(path, f"column {field.name!r} must not be null")
    bad_name = pc.invert(pc.match_substring_regex(col("commit"), f"^(?:{COMMIT_NAME.pattern})$"))
    prefix = array_key("")
    rules = [
        ("commit", bad_name, f"must match {COMMIT_NAME.pattern}"),
        ("array", pc.not_equal(col("array"), pc.binary_join_element_wise(prefix, col("commit"), "")),
         "must be routes/<commit>"),
        ("num_tokens", pc.or_(pc.less(col("num_tokens"), 1), pc.greater(col("num_tokens"), MAX_ROWS)),
         f"must lie in [1, {MAX_ROWS}]"),
        ("num_rows", pc.or_(pc.less(col("num_rows"), 0), pc.greater_equal(col("num_rows"), MAX_ROWS)),
         f"must lie in [0, {MAX_ROWS})"),
        ("row_start", pc.or_(pc.less(col("row_start"), 0), pc.greater_equal(col("row_start"), MAX_ROWS)),
         f"must lie in [0, {MAX_ROWS})"),
        ("num_rows", pc.and_(pc.invert(col("quarantined")),
                             pc.not_equal(col("num_rows"), pc.subtract(col("num_tokens"), 1))),
         "must be num_tokens - 1 (the sample is not quarantined)"),
    ]
    for name, bad, rule in rules:
        i = pc.index(bad, True).as_py() if len(table) else -1
        if i is not None and i >= 0:
            raise FormatError(path, f"column {name!r} {rule}; row {i} (sample {col('sample_id')[i].as_py()!r}) "
                                    f"has {col(name)[i].as_py()!r}")
    if max_sample_rows is not None and len(table):
        i = int(pc.index(pc.greater(col("num_rows"), max_sample_rows), True).as_py())
        if i >= 0:
            raise SampleTooLargeError(path, col("sample_id")[i].as_py(), col("num_rows")[i].as_py(), max_sample_rows)
    if len(table) > 1:
        order = pc.sort_indices(table, [("array", "ascending"), ("row_start", "ascending"),
                                        ("num_rows", "ascending")])
        arrays = table.column("array").take(order)
        starts = table.column("row_start").take(order).to_numpy()
        ends = starts + table.column("num_rows").take(order).to_numpy()
        same = pc.equal(arrays.slice(0, len(table) - 1), arrays.slice(1)).to_numpy(zero_copy_only=False)
        overlap = (ends[:-1] > starts[1:]) & same
        if overlap.any():
            raise FormatError(path, "two samples of one commit share rows of its route array")
    texts = pc.or_(pc.is_valid(col("missing_rows")), pc.is_valid(col("policy_spans")))
    if pc.any(pc.or_(texts, pc.is_valid(col("policy_version")))).as_py():
        check_texts(table.filter(pc.or_(texts, pc.is_valid(col("policy_version")))), path)
