"""Checkpoints: one Parquet file holding the sample rows of many commits (``schema/FORMAT.md`` section 11).

A checkpoint ``index/<covered:012d>-<token>.checkpoint`` is a cache of the sample tables
of the commits it covers, written create-if-absent by ``r3store compact``. The sample
tables stay the source of truth: a reader that ignores checkpoints (any format v2 reader)
reads the same store. A checkpoint is checksummed like a sample table (page CRCs, a
BLAKE2b-128 digest that also binds its ``r3store.checkpoint`` metadata) and its footer is
checked before pyarrow reads it.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from r3store._format._digest import table_digest
from r3store._format._json import canonical_json, loads_document
from r3store._format._keys import BUCKET_NAME, COMMIT_NAME, array_key, bucket_of, is_bucket
from r3store._format._manifest import FORMAT_VERSION, MAX_ROWS
from r3store._format._rows import check_texts
from r3store._format._table import check_columns, read_parquet, table_schema
from r3store._spec import ModelSpec
from r3store.errors import ChecksumError, FormatError, SampleTooLargeError

__all__ = [
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_VERSION",
    "LATE_TABLE_S",
    "CheckpointInfo",
    "checkpoint_key",
    "parse_checkpoint_key",
    "read_checkpoint",
    "watermark_of",
    "write_checkpoint",
]

CHECKPOINT_PREFIX = "index/"
"""Checkpoints lie directly under ``index/`` (not in a bucket, not named ``.parquet``): one
delimited listing of ``index/`` finds them and the buckets at once, and readers of format v2
that know nothing of checkpoints skip them (they read only ``.parquet`` keys)."""
CHECKPOINT_VERSION = 1
"""Version of the checkpoint layout (``r3store.checkpoint`` metadata ``version``)."""
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


def write_checkpoint(table: pa.Table, spec_json: str, *, listed_at: datetime, version: int = FORMAT_VERSION) -> bytes:
    """Serialise checked sample rows as a checkpoint (zstd, page CRCs, digest).

    Parameters
    ----------
    table : pyarrow.Table
        Every row of the covered commits' sample tables (the columns of ``table_schema(2)``,
        then user metadata), as read and checked.
    spec_json : str
        The store's spec as JSON (``r3store.spec``).
    listed_at : datetime
        When the listing of ``index/`` that found the covered commits started.
    version : int
        The store's format version (2 or later), recorded as ``r3store.version``.
    """
    meta = canonical_json({"version": CHECKPOINT_VERSION, "watermark": watermark_of(listed_at),
                           "created_at": listed_at.astimezone(UTC).isoformat(timespec="seconds"),
                           "commits": len(set(table.column("commit").to_pylist()))}).decode()
    table = table.replace_schema_metadata({
        b"r3store.version": str(version).encode(),
        b"r3store.spec": spec_json.encode(),
        b"r3store.checkpoint": meta.encode(),
        b"r3store.digest": table_digest(table, str(version), spec_json, extra=(meta,)).encode(),
    })
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
    return sink.getvalue()


def read_checkpoint(buf: bytes, path: str, *, spec: ModelSpec, spec_source: str = "r3store.json",
                    max_sample_rows: int | None = None,
                    version: int = FORMAT_VERSION) -> tuple[pa.Table, CheckpointInfo]:
    """Parse and check a checkpoint; return its rows and what it covers.

    Checked: the footer before pyarrow, the size caps, page CRCs, the digest (which binds
    the ``r3store.checkpoint`` metadata too), UTF-8, the column types, the spec, and the
    row rules of FORMAT.md section 6.2 applied to each row's own commit (``array`` is
    ``routes/<commit>``, counts in range, no two samples of one array share a row, the
    text columns parse), and the number of covered commits recorded.

    Returns
    -------
    (pyarrow.Table, CheckpointInfo)
        The rows (columns of ``table_schema(2)`` then user metadata, no schema metadata).

    Raises
    ------
    r3store.errors.FormatError
        Malformed or over the caps, or of another format version than ``version`` (the
        store's); ChecksumError on a failed CRC or digest,
        SpecConflictError, SampleTooLargeError as for sample tables.
    """
    table, meta = read_parquet(buf, path)
    if meta.get("r3store.version", b"") != str(version).encode():
        raise FormatError(path, f"checkpoint of format version {meta.get('r3store.version', b'')!r}")
    raw = meta.get("r3store.checkpoint")
    if raw is None:
        raise FormatError(path, "no r3store.checkpoint metadata: not a checkpoint")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(path, "r3store.checkpoint metadata is not UTF-8") from None
    stored = meta.get("r3store.digest", b"").decode(errors="replace")
    computed = table_digest(table, str(version), meta.get("r3store.spec", b"").decode(errors="replace"),
                            path, extra=(text,))
    if stored != computed:
        raise ChecksumError(path, (), f"checkpoint digest {stored[:60]!r} does not match its content ({computed})")
    doc = loads_document(raw, f"{path} (r3store.checkpoint)")
    watermark, created, count = doc.get("watermark"), doc.get("created_at"), doc.get("commits")
    if doc.get("version") != CHECKPOINT_VERSION or not isinstance(watermark, str) or \
            not BUCKET_NAME.fullmatch(watermark) or not is_bucket(watermark) or not isinstance(created, str) or \
            not isinstance(count, int):
        raise FormatError(path, f"r3store.checkpoint metadata {text[:200]!r} is not a version "
                                f"{CHECKPOINT_VERSION} checkpoint description")
    check_columns(table, meta, path, version=version, spec=spec, spec_source=spec_source)
    table = table.replace_schema_metadata(None)
    _check_rows(table, path, max_sample_rows)
    commits = frozenset(pc.unique(table.column("commit")).to_pylist())
    if len(commits) != count:
        raise FormatError(path, f"checkpoint says it covers {count} commits, its rows name {len(commits)}")
    return table, CheckpointInfo(commits=commits, watermark=watermark, created_at=created)


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
