"""The audits (``validate``, ``stats``, ``diff``) as Ray tasks over groups of commits.

The driver makes the scan's :class:`r3store.audit.ScanPlan` from the sample tables (one
catalogue read), groups its units into tasks by the commits they read, and sends each
task only its units and the plan's mapper. A task opens readers of its commits only
(``RouteReader.open(url, reader={"commits": ...})``), runs its units and returns their partial results;
the driver folds them with the plan's merge as tasks finish. The merge is the one the
single-process scan uses and does not depend on order or grouping, so the report is
the single-process report, findings and JSON included.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import ray

from r3store._checks import parse_optional_int
from r3store.audit import ScanPlan, ScanUnit, ValidationReport, plan_diff, plan_stats, plan_validate
from r3store.audit import run_plan as run_plan_here
from r3store.errors import DamagedTableWarning, OptionError
from r3store.ray._cluster import r3store_errors
from r3store.reader import RouteReader

__all__ = ["diff", "group_units", "run_plan", "stats", "validate"]

R = TypeVar("R")

TaskProgress = Callable[[int, int], None]
"""``progress(tasks_done, tasks_total)``."""

TASKS_PER_CPU = 4


def group_units(units: Sequence[ScanUnit], num_tasks: int) -> list[list[ScanUnit]]:
    """Cut units into at most ``num_tasks`` groups of about equal rows, keeping units of one
    commit together in order (so a task opens few commits).

    Examples
    --------
    >>> units = [ScanUnit(i, rows, ((c,),), None) for i, (rows, c) in enumerate([(5, "b"), (5, "a"), (10, "c")])]
    >>> [[u.index for u in g] for g in group_units(units, 2)]
    [[1, 0], [2]]
    """
    if not units:
        return []
    ordered = sorted(units, key=lambda u: (u.commits, u.index))
    num_tasks = max(1, min(num_tasks, len(ordered)))
    total = sum(max(u.rows, 1) for u in ordered)
    groups: list[list[ScanUnit]] = [[]]
    done = 0
    for u in ordered:
        target = total * len(groups) / num_tasks
        if groups[-1] and done >= target and len(groups) < num_tasks:
            groups.append([])
        groups[-1].append(u)
        done += max(u.rows, 1)
    return groups


def _default_tasks() -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)) * TASKS_PER_CPU)  # type: ignore[no-untyped-call]


def _scan_units(mapper: Any, urls: Sequence[str], storage_options: Mapping[str, Any] | None, on_duplicate: str,
                units: Sequence[ScanUnit], workers: int | None) -> list[Any]:
    """One task: readers of the commits these units read, then the units, through the
    single-process runner (threads on remote stores); returns their partial results."""
    readers: list[RouteReader] = []
    for i, url in enumerate(urls):
        commits = sorted({c for u in units for c in u.commits[i]})
        readers.append(RouteReader.open(url, storage_options=storage_options,
                                        reader={"commits": commits, "on_duplicate": on_duplicate}))
    part: ScanPlan[list[Any]] = ScanPlan("task", tuple(units), mapper, list, on_duplicate)
    try:
        return run_plan_here(part, readers, workers=workers)
    finally:
        for r in readers:
            r.close()


_scan_task = ray.remote(_scan_units)


def run_plan(plan: ScanPlan[R], urls: Sequence[str | os.PathLike[str]], *,
             storage_options: Mapping[str, Any] | None = None, num_tasks: int | None = None,
             workers: int | None = None, progress: TaskProgress | None = None,
             ray_remote_args: Mapping[str, Any] | None = None) -> R:
    """Run the units of ``plan`` as Ray tasks and merge their results (as they finish).

    Parameters
    ----------
    plan : r3store.audit.ScanPlan
        Made on this machine (``plan_validate``, ``plan_stats``, ``plan_diff``).
    urls : sequence of str or os.PathLike
        The store(s) the plan was made from, one per store of the scan, as URLs every
        worker can open (a shared file system, or ``s3://``).
    storage_options : mapping, optional
        fsspec options, sent to every task.
    num_tasks : int, optional
        Tasks to cut the units into; default 4 per CPU of the cluster (never more than
        units).
    workers : int, optional
        Threads per task (default 1 on local disk, 8 on remote stores).
    progress : callable, optional
        ``progress(tasks_done, tasks_total)``, called on this process.
    ray_remote_args : mapping, optional
        Options of the tasks (``num_cpus``, ``memory``, ...); default one CPU each.

    Returns
    -------
    The plan's result, equal to ``r3store.audit.run_plan(plan, stores)``.

    Raises
    ------
    r3store.errors.R3StoreError
        An r3store error raised in a task is raised here as itself (the other tasks are
        cancelled).
    r3store.errors.OptionError
        ``num_tasks`` or ``workers`` is invalid, or ``urls`` does not match the plan.
    """
    if isinstance(urls, str | os.PathLike) or len(urls) != (len(plan.units[0].commits) if plan.units else len(urls)):
        raise OptionError("urls", urls, "must hold one URL per store of the scan")
    paths = [os.fspath(u) for u in urls]
    num_tasks = parse_optional_int("num_tasks", num_tasks, minimum=1) or _default_tasks()
    workers = parse_optional_int("workers", workers, minimum=1)
    groups = group_units(plan.units, num_tasks)
    task = _scan_task.options(**{"num_cpus": 1, **(ray_remote_args or {})})
    refs = [task.remote(plan.mapper, paths, storage_options, plan.on_duplicate, group, workers) for group in groups]
    return plan.merge(_results(refs, progress))


def _results(refs: list[ray.ObjectRef[list[Any]]], progress: TaskProgress | None) -> Iterator[Any]:
    """Partial results as tasks finish; progress counted in tasks."""
    pending = list(refs)
    total = len(pending)
    if progress is not None:
        progress(0, total)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            with r3store_errors():
                parts = ray.get(done[0])
            yield from parts
            if progress is not None:
                progress(total - len(pending), total)
    finally:
        for ref in pending:
            ray.cancel(ref)


def validate(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
             sample_filter: str | None = None, limit: int | None = None, max_findings: int = 10_000,
             num_tasks: int | None = None, workers: int | None = None,
             progress: TaskProgress | None = None) -> ValidationReport:
    """:func:`r3store.audit.validate` of the store at ``url``, its route arrays scanned by Ray tasks.

    Opens the store here (``on_duplicate="report"`` and ``on_damaged_table="skip"``: a damaged
    sample table is a ``damaged_table`` finding, as with ``r3store validate``), plans,
    runs the units on the connected cluster (:func:`connect` first) and merges: the
    report equals the single-process one. Parameters are those of
    :func:`r3store.audit.validate` and :func:`run_plan`.
    """
    with warnings.catch_warnings():  # each skipped table is a finding of the report
        warnings.simplefilter("ignore", DamagedTableWarning)
        store = RouteReader.open(url, storage_options=storage_options,
                                 reader={"on_duplicate": "report", "on_damaged_table": "skip"})
    plan = plan_validate(store, sample_filter=sample_filter, limit=limit, max_findings=max_findings)
    return run_plan(plan, [url], storage_options=storage_options, num_tasks=num_tasks, workers=workers,
                    progress=progress)


def stats(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
          sample_filter: str | None = None, limit: int | None = None, top: int = 10, length_bins: int = 20,
          num_tasks: int | None = None, workers: int | None = None,
          progress: TaskProgress | None = None) -> dict[str, Any]:
    """:func:`r3store.audit.stats` of the store at ``url`` on Ray (opened with
    ``on_duplicate="first"``, as ``r3store stats``); equal to the single-process result."""
    store = RouteReader.open(url, storage_options=storage_options, reader={"on_duplicate": "first"})
    plan = plan_stats(store, sample_filter=sample_filter, limit=limit, top=top, length_bins=length_bins)
    return run_plan(plan, [url], storage_options=storage_options, num_tasks=num_tasks, workers=workers,
                    progress=progress)


def diff(url_a: str | os.PathLike[str], url_b: str | os.PathLike[str], *,
         storage_options: Mapping[str, Any] | None = None, sample_filter: str | None = None,
         limit: int | None = None, num_tasks: int | None = None, workers: int | None = None,
         progress: TaskProgress | None = None) -> dict[str, Any]:
    """:func:`r3store.audit.diff` of two stores on Ray (both opened with ``on_duplicate="first"``,
    as ``r3store diff``; ``storage_options`` apply to both); equal to the single-process result."""
    store_a = RouteReader.open(url_a, storage_options=storage_options, reader={"on_duplicate": "first"})
    store_b = RouteReader.open(url_b, storage_options=storage_options, reader={"on_duplicate": "first"})
    plan = plan_diff(store_a, store_b, sample_filter=sample_filter, limit=limit)
    return run_plan(plan, [url_a, url_b], storage_options=storage_options, num_tasks=num_tasks, workers=workers,
                    progress=progress)


