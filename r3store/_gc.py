"""Find and remove uncommitted leftovers: route arrays of shards that were never committed."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from r3store._format import INDEX_PREFIX, MANIFEST_KEY, ROUTES_PREFIX
from r3store.errors import NotAStoreError
from r3store.storage import Backend, open_backend

__all__ = ["Leftover", "collect_garbage"]


@dataclass(frozen=True)
class Leftover:
    """Objects of one uncommitted shard (or one stray temporary file)."""

    shard: str
    """Shard name, or the key of a temporary file."""
    keys: tuple[str, ...]
    """Keys of its objects."""
    nbytes: int
    """Their total size in bytes."""
    age_s: float
    """Seconds since the newest of them was modified."""

    def to_dict(self) -> dict[str, Any]:
        age = round(self.age_s, 1) if self.age_s != float("inf") else None
        return {"shard": self.shard, "keys": list(self.keys), "nbytes": self.nbytes, "age_s": age}


def collect_garbage(
    url: str | os.PathLike[str] | Backend,
    *,
    older_than_s: float = 3600.0,
    delete: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> list[Leftover]:
    """List (and with ``delete`` remove) uncommitted leftovers older than ``older_than_s``.

    A leftover is a ``routes/<shard>/`` array with no ``index/<shard>.parquet`` (a writer
    died or failed before committing), or a temporary file (``.<name>.tmp``). Committed
    shards are never touched: the commit record is re-checked right before each delete.

    Parameters
    ----------
    url : str, os.PathLike or Backend
    older_than_s : float
        Only leftovers whose newest object is at least this old (seconds). Choose it
        longer than any writer's flush, so a shard still being written is left alone.
    delete : bool
        Remove what is found; otherwise only list it.

    Returns
    -------
    list of Leftover

    Raises
    ------
    r3store.errors.NotAStoreError
    r3store.errors.StorageError
    """
    store = open_backend(url, storage_options)
    if not store.exists(MANIFEST_KEY):
        raise NotAStoreError(store.url)
    now = time.time()
    committed = {k[len(INDEX_PREFIX) : -len(".parquet")] for k in store.list_prefix(INDEX_PREFIX)}
    listing = store.list_info("")
    groups: dict[str, list[str]] = {}
    for key in listing:
        name = key.rpartition("/")[2]
        shard = key.split("/")[1] if key.startswith(ROUTES_PREFIX) and key.count("/") >= 2 else None
        if shard is not None and shard not in committed:
            groups.setdefault(shard, []).append(key)
        elif name.startswith(".") and name.endswith(".tmp"):
            groups[key] = [key]
    found = []
    for shard, keys in sorted(groups.items()):
        times = [listing[k].mtime for k in keys if listing[k].mtime is not None]
        age = now - max(times) if times else float("inf")
        if age < older_than_s:
            continue
        found.append(Leftover(shard=shard, keys=tuple(keys), nbytes=sum(listing[k].size for k in keys), age_s=age))
        if delete and not store.exists(f"{INDEX_PREFIX}{shard}.parquet"):
            for key in keys:
                store.delete(key)
    return found
