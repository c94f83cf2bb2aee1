"""Shared machinery of the audit scans: sample selection, row blocks, worker threads.

Every scan streams: route arrays are read row block by row block through
:meth:`RouteReader.read_rows` (at most ``block_rows`` rows of all layers at a time), so
memory stays bounded whatever the size of the store. Work is cut into *units* (one route
array, or one sample for ``diff``) and, on remote backends, units run on a thread pool.

Thread safety: a :class:`RouteReader` keeps an LRU cache of decoded chunks that is not
thread-safe, so every worker thread gets its **own** reader, made by
:meth:`RouteReader.fork` (own chunk cache and backend handles: a local backend's own
mmaps, an fsspec backend's shared thread-safe filesystem). The forks share the immutable
sample catalogue, so no sample table is re-read. No lock is held around I/O.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

import pyarrow as pa

from r3store._checks import parse_int, parse_optional_int
from r3store.reader import RouteReader, merge_ranges

__all__ = [
    "Progress",
    "ProgressCallback",
    "aligned_ranges",
    "default_workers",
    "row_blocks",
    "run_units",
    "select_samples",
    "worker_store",
]

U = TypeVar("U")
R = TypeVar("R")

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` (rows) while a scan runs; may be called from worker threads."""

REMOTE_WORKERS = 8
WORKER_CACHE_BYTES = 16 << 20


def default_workers(*stores: RouteReader) -> int:
    """1 when every store is on local disk (mmap reads gain nothing from threads), else 8."""
    return 1 if all(s.is_local for s in stores) else REMOTE_WORKERS


def check_workers(workers: int | None, *stores: RouteReader) -> int:
    if workers is None:
        return default_workers(*stores)
    return parse_int("workers", workers, minimum=1)


def select_samples(table: pa.Table, sample_filter: str | None = None, limit: int | None = None, *,
                   visible_only: bool = False) -> pa.Table:
    """Rows of a sample table to audit, in store order.

    Parameters
    ----------
    table : pyarrow.Table
        ``RouteReader.samples``.
    sample_filter : str, optional
        ``fnmatch`` glob on sample ids (case-sensitive), e.g. ``"step-3-*"``.
    limit : int, optional
        Keep the first ``limit`` matching samples.
    visible_only : bool
        Drop quarantined samples.
    """
    limit = parse_optional_int("limit", limit, minimum=0)
    keep = list(range(len(table)))
    if visible_only:
        quarantined = table.column("quarantined").to_pylist()
        keep = [i for i in keep if not quarantined[i]]
    if sample_filter is not None:
        ids = table.column("sample_id").to_pylist()
        keep = [i for i in keep if fnmatch.fnmatchcase(ids[i], sample_filter)]
    if limit is not None:
        keep = keep[:limit]
    if len(keep) == len(table):
        return table
    return table.take(pa.array(keep, type=pa.int64()))


def aligned_ranges(ranges: Iterable[tuple[int, int]], chunk_rows: int, rows: int) -> list[tuple[int, int]]:
    """Ranges widened to whole chunks (clipped to ``rows``), merged: each chunk is read once."""
    widened = ((a // chunk_rows * chunk_rows, min(rows, -(-b // chunk_rows) * chunk_rows)) for a, b in ranges)
    return merge_ranges(widened)


def row_blocks(ranges: Sequence[tuple[int, int]], block_rows: int) -> Iterator[tuple[int, int]]:
    """Cut half-open ranges into blocks of at most ``block_rows`` rows."""
    for a, b in ranges:
        for lo in range(a, b, block_rows):
            yield lo, min(b, lo + block_rows)


def worker_store(store: RouteReader) -> RouteReader:
    """A RouteReader for one worker thread: own chunk cache and backend handles (see module doc)."""
    return store.fork(cache_bytes=min(store.cache_bytes, WORKER_CACHE_BYTES))


class Progress:
    """Thread-safe running total of rows done, forwarded to a :data:`ProgressCallback`."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        if callback is not None:
            callback(0, total)

    def advance(self, rows: int) -> None:
        if self.callback is None:
            return
        with self._lock:
            self.done += rows
            self.callback(min(self.done, self.total), self.total)


def run_units(stores: Sequence[RouteReader], units: Iterable[U],
              fn: Callable[[Sequence[RouteReader], U], R], workers: int) -> Iterator[R]:
    """Run ``fn(worker_stores, unit)`` for every unit; yield results as they complete.

    With ``workers == 1`` units run in order in the calling thread. Otherwise at most
    ``2 * workers`` units are in flight, so results never pile up in memory.
    """
    made: list[RouteReader] = []
    made_lock = threading.Lock()
    local = threading.local()

    def stores_here() -> Sequence[RouteReader]:
        mine = getattr(local, "stores", None)
        if mine is None:
            mine = local.stores = [worker_store(s) for s in stores]
            with made_lock:
                made.extend(mine)
        return mine

    def call(unit: U) -> R:
        return fn(stores_here(), unit)

    try:
        if workers <= 1:
            for unit in units:
                yield call(unit)
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="r3store-audit") as pool:
            yield from _bounded(pool, call, iter(units), 2 * workers)
    finally:
        for s in made:
            s.close()


def _bounded(pool: ThreadPoolExecutor, call: Callable[[Any], R], units: Iterator[Any], window: int) -> Iterator[R]:
    pending: set[Future[R]] = set()
    try:
        for unit in units:
            pending.add(pool.submit(call, unit))
            if len(pending) >= window:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        for fut in pending:
            fut.cancel()
