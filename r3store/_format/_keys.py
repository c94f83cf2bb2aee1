"""Where each object of a store lives (``schema/FORMAT.md`` section 2), and which never change.

::

    r3store.json                      manifest
    zarr.json, routes/zarr.json       zarr v3 group documents
    routes/<commit>/zarr.json         route array metadata
    routes/<commit>/c/<i>/0/0         storage object i of the route array
    index/<bucket>/<commit>.parquet   sample table (format v2); its presence commits <commit>
    index/<commit>.parquet            sample table (format v1)

``<bucket>`` is the UTC hour ``yyyymmddTHH`` in which the writer first tried to write the
table. Keys whose last component starts with ``.`` are temporary files (ignored by readers).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = [
    "BUCKET_NAME",
    "COMMIT_NAME",
    "INDEX_PREFIX",
    "MANIFEST_KEY",
    "ROUTES_PREFIX",
    "array_key",
    "bucket_of",
    "commit_of_route_key",
    "commit_of_table_key",
    "is_bucket",
    "is_immutable_key",
    "is_temporary_key",
    "parse_table_key",
    "table_key",
]

MANIFEST_KEY = "r3store.json"
ROUTES_PREFIX = "routes/"
INDEX_PREFIX = "index/"
COMMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,239}")
"""Syntax of a commit name (``<writer_id>-<seq>``; the sample-table column ``commit`` (v1: ``shard``) holds
it): the only names readers accept in ``index/[<bucket>/]<commit>.parquet`` and ``routes/<commit>``
(no ``/``, no leading ``.``, no ``..`` path)."""


def array_key(commit: str) -> str:
    """``routes/<commit>``: the route array of a commit (the sample table's ``array`` column)."""
    return f"{ROUTES_PREFIX}{commit}"


BUCKET_NAME = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})")
"""Syntax of a sample-table bucket (format v2): a UTC hour ``yyyymmddTHH``."""


def bucket_of(when: datetime) -> str:
    """The bucket (UTC hour ``yyyymmddTHH``) of a time.

    Examples
    --------
    >>> bucket_of(datetime(2026, 11, 29, 7, 59, tzinfo=UTC))
    '20261129T07'
    """
    return when.astimezone(UTC).strftime("%Y%m%dT%H")


def is_bucket(name: str) -> bool:
    """Whether ``name`` is a valid bucket: :data:`BUCKET_NAME` naming a real UTC hour."""
    if not BUCKET_NAME.fullmatch(name):
        return False
    try:
        datetime.strptime(name, "%Y%m%dT%H")
    except ValueError:
        return False
    return True


def table_key(commit: str, bucket: str | None = None) -> str:
    """The sample table whose presence commits ``commit``: ``index/<bucket>/<commit>.parquet``
    (format v2), or ``index/<commit>.parquet`` without a bucket (format v1)."""
    return f"{INDEX_PREFIX}{bucket}/{commit}.parquet" if bucket is not None else f"{INDEX_PREFIX}{commit}.parquet"


def parse_table_key(key: str) -> tuple[str | None, str] | None:
    """``(bucket, name)`` of a key ``index/[<bucket>/]<name>.parquet``, or None (other keys,
    temporary files). Nothing is validated: readers check the names against the store's
    format version.

    Examples
    --------
    >>> parse_table_key("index/20261129T07/w-00001.parquet"), parse_table_key("index/w-00001.parquet")
    (('20261129T07', 'w-00001'), (None, 'w-00001'))
    """
    if not key.startswith(INDEX_PREFIX) or not key.endswith(".parquet") or is_temporary_key(key):
        return None
    middle = key[len(INDEX_PREFIX) : -len(".parquet")]
    bucket, _, name = middle.rpartition("/")
    return (bucket if "/" in middle else None), name


def is_temporary_key(key: str) -> bool:
    """Whether ``key`` is a temporary file (its last component starts with ``.``)."""
    return key.rpartition("/")[2].startswith(".")


def commit_of_table_key(key: str) -> str | None:
    """The commit a sample-table key names (``index/[<bucket>/]<commit>.parquet``), or None.

    Any such key counts (a malformed one too, which readers refuse), so nothing that looks
    committed is ever taken for an uncommitted leftover.

    Examples
    --------
    >>> commit_of_table_key("index/20261129T07/w-00001.parquet"), commit_of_table_key("index/.w-00001.parquet.x.tmp")
    ('w-00001', None)
    """
    parsed = parse_table_key(key)
    return None if parsed is None else parsed[1]


def commit_of_route_key(key: str) -> str | None:
    """The commit of an object under ``routes/<commit>/``, or None (group documents, other keys).

    Examples
    --------
    >>> commit_of_route_key("routes/w-00001/c/0/0/0"), commit_of_route_key("routes/zarr.json")
    ('w-00001', None)
    """
    parts = key.split("/")
    return parts[1] if len(parts) >= 3 and key.startswith(ROUTES_PREFIX) else None


def is_immutable_key(key: str) -> bool:
    """Whether the object under ``key`` never changes once written.

    Route objects, sample tables and checkpoints carry unique names and are written
    once (a retried commit writes the same bytes); the manifest and the zarr group
    documents may be re-created if a store is deleted and made again at the same URL.
    Temporary files are not.
    """
    return key.startswith((ROUTES_PREFIX, INDEX_PREFIX)) and not is_temporary_key(key)
