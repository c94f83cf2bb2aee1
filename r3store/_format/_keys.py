"""Where each object of a store lives (``schema/FORMAT.md`` section 2), and which never change.

::

    r3store.json                  manifest
    zarr.json, routes/zarr.json   zarr v3 group documents
    routes/<commit>/zarr.json     route array metadata
    routes/<commit>/c/<i>/0/0     storage object i of the route array
    index/<commit>.parquet        sample table; its presence commits <commit>

Keys whose last component starts with ``.`` are temporary files (ignored by readers).
"""

from __future__ import annotations

import re

__all__ = [
    "COMMIT_NAME",
    "INDEX_PREFIX",
    "MANIFEST_KEY",
    "ROUTES_PREFIX",
    "array_key",
    "commit_of_route_key",
    "commit_of_table_key",
    "is_immutable_key",
    "is_temporary_key",
    "table_key",
]

MANIFEST_KEY = "r3store.json"
ROUTES_PREFIX = "routes/"
INDEX_PREFIX = "index/"
COMMIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,239}")
"""Syntax of a commit name (``<writer_id>-<seq>``; the sample-table column ``shard`` holds
it): the only names readers accept in ``index/<commit>.parquet`` and ``routes/<commit>``
(no ``/``, no leading ``.``, no ``..`` path)."""


def array_key(commit: str) -> str:
    """``routes/<commit>``: the route array of a commit (the sample table's ``array`` column)."""
    return f"{ROUTES_PREFIX}{commit}"


def table_key(commit: str) -> str:
    """``index/<commit>.parquet``: the sample table whose presence commits ``commit``."""
    return f"{INDEX_PREFIX}{commit}.parquet"


def is_temporary_key(key: str) -> bool:
    """Whether ``key`` is a temporary file (its last component starts with ``.``)."""
    return key.rpartition("/")[2].startswith(".")


def commit_of_table_key(key: str) -> str | None:
    """The commit a sample-table key names (``index/<commit>.parquet``), or None.

    Examples
    --------
    >>> commit_of_table_key("index/w-00001.parquet"), commit_of_table_key("index/.w-00001.parquet.x.tmp")
    ('w-00001', None)
    """
    if not key.startswith(INDEX_PREFIX) or not key.endswith(".parquet") or "/." in key:
        return None
    return key[len(INDEX_PREFIX) : -len(".parquet")]


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

    Route objects and sample tables carry writer-unique commit names and are written
    once (a retried commit writes the same bytes); the manifest and the zarr group
    documents may be re-created if a store is deleted and made again at the same URL.
    Temporary files are not.
    """
    return key.startswith((ROUTES_PREFIX, INDEX_PREFIX)) and not is_temporary_key(key)
