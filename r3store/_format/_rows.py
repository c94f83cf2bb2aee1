"""Row rules of a sample table (``schema/FORMAT.md`` section 6), and the text forms of the
v2 columns ``missing_rows`` (``"a:b,c:d"``) and ``policy_spans`` (``"start:stop=version;..."``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from r3store._format._keys import COMMIT_NAME, array_key
from r3store._format._manifest import MAX_ROWS
from r3store.errors import FormatError, SampleTooLargeError

__all__ = [
    "check_rows",
    "check_texts",
    "format_ranges",
    "format_spans",
    "parse_ranges",
    "parse_spans",
]

_NUMBER = r"(?:0|[1-9][0-9]*)"
_RANGES = re.compile(rf"{_NUMBER}:{_NUMBER}(?:,{_NUMBER}:{_NUMBER})*")
_SPANS = re.compile(rf"(?:{_NUMBER}:{_NUMBER}={_NUMBER}(?:;{_NUMBER}:{_NUMBER}={_NUMBER})*)?")


def format_ranges(ranges: Iterable[tuple[int, int]]) -> str | None:
    """Half-open row ranges as ``"a:b,c:d"`` (sorted and merged first); None when there are none.

    Examples
    --------
    >>> format_ranges([(5, 7), (0, 2), (2, 3)]), format_ranges([])
    ('0:3,5:7', None)
    """
    merged: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges if b > a):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return ",".join(f"{a}:{b}" for a, b in merged) or None


def parse_ranges(text: str, num_rows: int) -> list[tuple[int, int]]:
    """Inverse of :func:`format_ranges`, checked: canonical decimal numbers, ``a < b``, sorted and
    merged (``b < next a``), inside ``[0, num_rows)``.

    Raises
    ------
    ValueError
        ``text`` breaks a rule (the caller names the table and sample).

    Examples
    --------
    >>> parse_ranges("0:3,5:7", 10)
    [(0, 3), (5, 7)]
    """
    if not _RANGES.fullmatch(text):
        raise ValueError(f"{text[:60]!r} is not 'a:b,c:d' ranges of decimal row numbers")
    out = [(int(a), int(b)) for a, b in (part.split(":") for part in text.split(","))]
    end: int | None = None
    for a, b in out:
        if a >= b or (end is not None and a <= end):
            raise ValueError(f"ranges {text[:60]!r} are not sorted, merged and non-empty")
        end = b
    if out and out[-1][1] > num_rows:
        raise ValueError(f"ranges {text[:60]!r} reach past the sample's {num_rows} rows")
    return out


def format_spans(spans: Sequence[tuple[int, int, int]]) -> str:
    """Policy spans ``(start, stop, version)`` as ``"start:stop=version;..."`` (adjacent spans of one
    version merged, empty ones dropped).

    Examples
    --------
    >>> format_spans([(0, 4, 7), (4, 6, 7), (6, 6, 9), (6, 10, 8)])
    '0:6=7;6:10=8'
    """
    merged: list[list[int]] = []
    for a, b, v in spans:
        if b <= a:
            continue
        if merged and merged[-1][1] == a and merged[-1][2] == v:
            merged[-1][1] = b
        else:
            merged.append([a, b, v])
    return ";".join(f"{a}:{b}={v}" for a, b, v in merged)


def parse_spans(text: str, num_rows: int) -> list[tuple[int, int, int]]:
    """Inverse of :func:`format_spans`, checked: the spans cover ``[0, num_rows)`` in order,
    each non-empty (an empty text for a sample of no rows).

    Raises
    ------
    ValueError
        ``text`` breaks a rule.

    Examples
    --------
    >>> parse_spans("0:6=7;6:10=8", 10)
    [(0, 6, 7), (6, 10, 8)]
    """
    if not _SPANS.fullmatch(text):
        raise ValueError(f"{text[:60]!r} is not 'start:stop=version;...' spans of decimal numbers")
    out: list[tuple[int, int, int]] = []
    for part in filter(None, text.split(";")):
        span, _, version = part.partition("=")
        first, _, last = span.partition(":")
        out.append((int(first), int(last), int(version)))
    at = 0
    for start, stop, v in out:
        if start != at or stop <= start or v >= 2**63:
            raise ValueError(f"spans {text[:60]!r} do not cover the rows in order without gaps")
        at = stop
    if at != num_rows:
        raise ValueError(f"spans {text[:60]!r} cover {at} rows, the sample has {num_rows}")
    return out


def check_rows(table: pa.Table, path: str, commit: str, *, required: Sequence[str], version: int = 2,
               max_sample_rows: int | None = None) -> None:
    """Check the rows of the sample table of ``commit`` (vectorised where it can be).

    No nulls in the ``required`` (non-nullable) columns; ``commit`` matches :data:`COMMIT_NAME` and every
    row's commit column is it and ``array`` is ``routes/<commit>``; ``num_tokens >= 1``,
    ``num_rows >= 0``, ``row_start >= 0`` (all below :data:`MAX_ROWS`); ``num_rows ==
    num_tokens - 1`` unless quarantined; no two samples share a row; and, when the table
    has them (format v2), ``missing_rows`` and ``policy_spans`` parse and lie inside the
    sample, and ``policy_version`` is null exactly when ``policy_spans`` is. Format v1 names
    the commit column ``shard``.

    Raises
    ------
    r3store.errors.SampleTooLargeError
        A sample has more than ``max_sample_rows`` rows.
    r3store.errors.FormatError
        Names ``path``, the column and the first offending row.
    """
    if not COMMIT_NAME.fullmatch(commit):
        raise FormatError(path, f"commit name {commit!r} does not match {COMMIT_NAME.pattern}")
    for name in required:
        if table.column(name).null_count:
            _reject(table, path, name, table.column(name).is_null(), "must not be null")
    col = table.column
    commit_column = "commit" if version >= 2 else "shard"
    rules = [
        (commit_column, pc.not_equal(col(commit_column), commit),
         f"must be {commit!r}, the commit the file is named after"),
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
    if max_sample_rows is not None and len(table):
        i = int(pc.index(pc.greater(col("num_rows"), max_sample_rows), True).as_py())
        if i >= 0:
            raise SampleTooLargeError(path, col("sample_id")[i].as_py(), col("num_rows")[i].as_py(), max_sample_rows)
    _check_disjoint(table, path)
    if version >= 2:
        check_texts(table, path)


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


def check_texts(table: pa.Table, path: str) -> None:
    """``missing_rows`` and ``policy_spans`` parse and fit their sample; ``policy_version`` agrees."""
    cols = table.select(["sample_id", "num_rows", "missing_rows", "policy_spans", "policy_version"]).to_pydict()
    for i, (sid, rows, missing, spans, version) in enumerate(zip(*cols.values(), strict=True)):
        try:
            if missing is not None:
                parse_ranges(missing, rows)
            if (spans is None) != (version is None):
                raise ValueError("policy_version must be null exactly when policy_spans is")
            if spans is not None:
                parsed = parse_spans(spans, rows)
                if version < 0 or (parsed and version != max(v for _, _, v in parsed)):
                    raise ValueError(f"policy_version {version} is not the largest version of {spans[:60]!r}")
        except ValueError as exc:
            raise FormatError(path, f"row {i} (sample {sid!r}): {exc}") from None
