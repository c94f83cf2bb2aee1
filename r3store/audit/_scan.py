"""Shared machinery of the audit scans: plans (map + merge), sample selection, row blocks, worker threads.

Every scan streams: route arrays are read row block by row block through
:meth:`RouteReader.read_rows` (at most ``block_rows`` rows of all layers at a time), so
memory stays bounded whatever the size of the store. Work is cut into *units* (one route
array, or one sample for ``diff``) and, on remote backends, units run on a thread pool.

Map and merge: a scan is a :class:`ScanPlan`, made on one machine from the sample
tables (``plan_validate``, ``plan_stats``, ``plan_diff``). Each of its
:class:`ScanUnit` s names the commits it reads and runs through the plan's *mapper*
anywhere a reader of those commits can be opened (a thread here, a Ray task elsewhere:
``r3store.ray``); the plan's *merge* folds the partial results into the report. The
merge is pure and does not depend on the order or grouping of the partials, so a scan
split over any number of threads, processes or machines gives the single-process
result exactly; :func:`run_plan` (the single-process path) goes through the same
mapper and merge.

Thread safety: a :class:`RouteReader` keeps an LRU cache of decoded chunks that is not
thread-safe, so every worker thread gets its **own** reader, made by
:meth:`RouteReader.fork` (own chunk cache and backend handles: a local backend's own
descriptors, an fsspec backend's shared thread-safe filesystem). The forks share the immutable
sample catalogue, so no sample table is re-read. No lock is held around I/O.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pyarrow as pa

from r3store._checks import parse_int, parse_optional_int
from r3store.reader import RouteReader, merge_ranges

__all__ = [
    "Mapper",
    "Progress",
    "ProgressCallback",
    "ScanPlan",
    "ScanUnit",
    "aligned_ranges",
    "default_workers",
    "row_blocks",
    "run_plan",
    "run_units",
    "select_samples",
    "worker_store",
]

U = TypeVar("U")
R = TypeVar("R")

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` (rows) while a scan runs; may be called from worker threads."""


@dataclass(frozen=True)
class ScanUnit:
    """One piece of an audit scan: reads only the commits it names, runs anywhere."""

    index: int
    """Position in :attr:`ScanPlan.units`."""
    rows: int
    """Route rows it reads (progress, and balancing units over tasks)."""
    commits: tuple[tuple[str, ...], ...]
    """Per store of the scan (one; two for ``diff``), the commits it reads: a reader opened
    with ``RouteReader.open(url, reader={"commits": ...})`` on them (or on more) is enough."""
    work: Any
    """What the mapper needs to know (plain, picklable data)."""


Mapper = Callable[[Sequence[RouteReader], ScanUnit, Callable[[int], None]], Any]
"""``mapper(stores, unit, advance) -> partial``: scans one unit with one reader per store of
the scan, calling ``advance(rows)`` as rows are done. Uses nothing but its arguments, and
pickles by reference (a module-level function, possibly inside ``functools.partial``)."""


@dataclass(frozen=True)
class ScanPlan(Generic[R]):
    """An audit scan cut into units (map) and a pure merge.

    Run it in one process with :func:`run_plan`, or spread its units over a cluster
    (``r3store.ray``): the result is the same.
    """

    command: str
    """``"validate"``, ``"stats"`` or ``"diff"``."""
    units: tuple[ScanUnit, ...]
    """The independent pieces, ``units[i].index == i``."""
    mapper: Mapper
    """Scans one unit (see :data:`Mapper`); small and picklable."""
    merge: Callable[[Iterable[Any]], R]
    """Folds the partial results of every unit, in any order and grouping, into the result
    (pure: reads no store). Holds the plan-time findings and figures; not meant to travel."""
    on_duplicate: str = "report"
    """How a reader of a unit's commits must treat duplicate ids (the planning reader's
    rule, applied to the unit's commits)."""

    @property
    def total_rows(self) -> int:
        """Rows of every unit."""
        return sum(u.rows for u in self.units)


def run_plan(plan: ScanPlan[R], stores: Sequence[RouteReader], *, workers: int | None = None,
             progress: ProgressCallback | None = None) -> R:
    """Run every unit of ``plan`` in this process (threads on remote backends) and merge.

    Parameters
    ----------
    plan : ScanPlan
    stores : sequence of RouteReader
        One per store of the scan (the readers the plan was made from, or readers of at
        least the commits its units name).
    workers : int, optional
        Threads (one unit per task, each thread with its own RouteReaders); default 1
        when every store is on local disk, else 8.
    progress : callable, optional
        ``progress(rows_done, rows_total)``.

    Raises
    ------
    r3store.errors.OptionError
        ``workers`` is invalid.
    """
    workers = check_workers(workers, *stores)
    counter = Progress(progress, plan.total_rows)

    def call(rs: Sequence[RouteReader], unit: ScanUnit) -> Any:
        return plan.mapper(rs, unit, counter.advance)

    return plan.merge(run_units(stores, plan.units, call, workers))

REMOTE_WORKERS = 8
WORKER_CACHE_BYTES = 16 << 20


def default_workers(*stores: RouteReader) -> int:
    """1 when every store is on local disk (page-cache reads gain nothing from threads), else 8."""
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
