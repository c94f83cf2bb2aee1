"""`stats`: per-layer expert load and the sequence-length distribution of a store."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from r3store._format import array_key, parse_ranges, parse_spans
from r3store._spec import ModelSpec
from r3store.audit._scan import (
    ProgressCallback,
    ScanPlan,
    ScanUnit,
    row_blocks,
    run_plan,
    select_samples,
)
from r3store.reader import RouteReader, merge_ranges

__all__ = ["plan_stats", "stats"]

BLOCK_IDS = 1 << 22
MAX_UNUSED_LISTED = 64


def stats(store: RouteReader, *, sample_filter: str | None = None, limit: int | None = None,
          workers: int | None = None, progress: ProgressCallback | None = None, top: int = 10,
          length_bins: int = 20) -> dict[str, Any]:
    """Expert load per MoE layer and sequence lengths, over the committed samples.

    Quarantined samples are left out. Routes are read row block by row block (one route
    array per task; threads on remote backends, each with its own RouteReader).

    Parameters
    ----------
    store : RouteReader
    sample_filter : str, optional
        ``fnmatch`` glob on sample ids.
    limit : int, optional
        Use the first ``limit`` (matching) samples, in store order.
    workers : int, optional
        Reader threads; default 1 on local disk, 8 on remote backends.
    progress : callable, optional
        ``progress(rows_done, rows_total)``.
    top : int
        How many of the hottest (layer, expert) pairs to list.
    length_bins : int
        Bins of the sequence-length histogram.

    Returns
    -------
    dict
        JSON-ready (``schema/cli-stats.schema.json``): ``url``, ``spec``, ``samples``,
        ``tokens``, ``rows`` (routed rows: rows the engine could not capture are left out
        of every figure), ``missing_rows`` and ``samples_with_missing_rows``, ``policy``
        (``samples_with_version``, ``mixed_version_samples`` (samples whose rows came
        from more than one policy version), ``min_version``, ``max_version``), ``layers``
        (per MoE layer: ``layer``, ``rows`` (tokens routed),
        ``assignments`` (in-range ids: rows x top_k), ``mean_load`` (tokens per expert
        if balanced), ``max_load``, ``max_over_mean``,
        ``entropy_bits`` of the load distribution and its maximum ``log2(num_experts)``,
        ``unused_experts`` and the first ids of them, ``hottest_expert``,
        ``ids_out_of_range``), ``hottest`` (the ``top`` most loaded (layer, expert)
        pairs), ``load`` (tokens per expert, shape (moe layers, num_experts)) and
        ``lengths`` (``num_tokens`` distribution: min, max, mean, percentiles, histogram).

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)
    >>> path = tempfile.mkdtemp()
    >>> with r3store.RouteWriter(path, spec) as w:
    ...     w.append("s", np.array([0, 0, 1, 2]).reshape(4, 1, 1))
    >>> s = stats(r3store.open_store(path))
    >>> s["layers"][0]["max_over_mean"], s["layers"][0]["entropy_bits"], s["layers"][0]["unused"]
    (2.0, 1.5, [3])
    """
    plan = plan_stats(store, sample_filter=sample_filter, limit=limit, top=top, length_bins=length_bins)
    return run_plan(plan, [store], workers=workers, progress=progress)


def plan_stats(store: RouteReader, *, sample_filter: str | None = None, limit: int | None = None, top: int = 10,
               length_bins: int = 20) -> ScanPlan[dict[str, Any]]:
    """:func:`stats` as a :class:`r3store.audit.ScanPlan`: one unit per route array (its
    selected rows), the merge adds the per-unit id counts up.

    Parameters are as for :func:`stats`; ``run_plan(plan_stats(store, ...), [store])`` is
    :func:`stats`.
    """
    spec = store.spec
    table = select_samples(store.samples, sample_filter, limit, visible_only=True)
    commit_of = {array_key(commit): commit for commit in store.commits}
    arrays, missing = _units(table)
    units = tuple(ScanUnit(i, sum(b - a for a, b in ranges), ((commit_of[array],),), (array, ranges))
                  for i, (array, ranges) in enumerate(arrays))
    head = {
        "url": store.url,
        "spec": dict(spec.to_dict()),
        "sample_filter": sample_filter,
        "limit": limit,
        "samples": len(table),
        "tokens": int(sum(table.column("num_tokens").to_pylist())),
        "rows": sum(u.rows for u in units),
        "missing_rows": missing,
        "samples_with_missing_rows": int(len(table) - table.column("missing_rows").null_count),
        "policy": _policy(table),
    }
    merge = functools.partial(_merge, spec=spec, head=head, top=top, lengths=_lengths(table, length_bins))
    return ScanPlan("stats", units, _count_unit, merge, on_duplicate="report")


def _count_unit(stores: Sequence[RouteReader], unit: ScanUnit, advance: Callable[[int], None]) -> np.ndarray:
    """The mapper: id counts of one route array's selected rows, shape (moe layers, 2**bits)."""
    return _count_array(stores[0], unit.work, advance)


def _merge(partials: Iterable[np.ndarray], *, spec: ModelSpec, head: dict[str, Any], top: int,
           lengths: dict[str, Any]) -> dict[str, Any]:
    """The merge: sum the counts (any order) and derive the per-layer figures."""
    counts = np.zeros((spec.num_moe_layers, 1 << spec.bits_per_id), np.int64)
    for part in partials:
        counts += part
    load = counts[:, : spec.num_experts]
    layers = [_layer_stats(layer, load[pos], int(counts[pos, spec.num_experts :].sum()), head["rows"])
              for pos, layer in enumerate(spec.moe_layers)]
    return {**head, "layers": layers, "hottest": _hottest(load, spec.moe_layers, top), "load": load.tolist(),
            "lengths": lengths}


def _units(table: pa.Table) -> tuple[list[tuple[str, list[tuple[int, int]]]], int]:
    """Per route array, the merged row ranges of the selected samples (their missing rows left
    out), and the number of missing rows."""
    cols = table.select(["array", "row_start", "num_rows", "missing_rows"]).to_pydict()
    by_array: dict[str, list[tuple[int, int]]] = {}
    missing = 0
    for array, start, n, gaps in zip(*cols.values(), strict=True):
        at = 0
        for a, b in [] if gaps is None else parse_ranges(gaps, n):
            by_array.setdefault(array, []).append((start + at, start + a))
            missing, at = missing + b - a, b
        by_array.setdefault(array, []).append((start + at, start + n))
    return [(array, merge_ranges(ranges)) for array, ranges in by_array.items()], missing


def _policy(table: pa.Table) -> dict[str, Any]:
    """Policy versions of the selected samples: how many carry one, how many mix several, and
    the smallest and largest version of any row (``policy_version`` is only a sample's largest)."""
    cols = table.select(["num_rows", "policy_spans", "policy_version"]).to_pydict()
    low: list[int] = []
    high: list[int] = []
    mixed = 0
    for n, spans, version in zip(cols["num_rows"], cols["policy_spans"], cols["policy_version"], strict=True):
        if version is None:
            continue
        used = {v for _, _, v in parse_spans(spans, n)} if spans else {version}  # no rows: the version given
        low.append(min(used))
        high.append(max(used))
        mixed += len(used) > 1
    return {"samples_with_version": len(high), "mixed_version_samples": mixed,
            "min_version": min(low) if low else None, "max_version": max(high) if high else None}


def _count_array(rs: RouteReader, unit: tuple[str, list[tuple[int, int]]],
                 advance: Callable[[int], None]) -> np.ndarray:
    array, ranges = unit
    spec = rs.spec
    nbins = 1 << spec.bits_per_id
    counts = np.zeros(spec.num_moe_layers * nbins, np.int64)
    offsets = (np.arange(spec.num_moe_layers, dtype=np.int64) * nbins)[None, :, None]
    positions = list(range(spec.num_moe_layers))
    block_rows = max(1, BLOCK_IDS // (spec.num_moe_layers * spec.top_k))
    for lo, hi in row_blocks(ranges, block_rows):
        x = rs.read_rows(array, lo, hi, positions)
        counts += np.bincount((x + offsets).ravel(), minlength=counts.size)
        advance(hi - lo)
    rs.clear_cache()
    return counts.reshape(spec.num_moe_layers, nbins)


def _layer_stats(layer: int, load: np.ndarray, out_of_range: int, rows: int) -> dict[str, Any]:
    num_experts = load.size
    total = int(load.sum())
    mean = total / num_experts
    p = load[load > 0] / total if total else np.zeros(0)
    entropy = float(-(p * np.log2(p)).sum()) if total else 0.0
    unused = np.flatnonzero(load == 0)
    hot = int(load.argmax())
    return {
        "layer": layer,
        "rows": rows,
        "assignments": total,
        "mean_load": round(mean, 4),
        "max_load": int(load.max()),
        "max_over_mean": round(float(load.max()) / mean, 4) if total else 0.0,
        "entropy_bits": round(entropy, 4),
        "max_entropy_bits": round(math.log2(num_experts), 4),
        "unused_experts": int(unused.size),
        "unused": unused[:MAX_UNUSED_LISTED].tolist(),
        "hottest_expert": hot,
        "ids_out_of_range": out_of_range,
    }


def _hottest(load: np.ndarray, moe_layers: tuple[int, ...], top: int) -> list[dict[str, Any]]:
    flat = load.ravel()
    if not flat.size or top <= 0:
        return []
    order = np.argsort(-flat, kind="stable")[:top]
    out = []
    for i in order.tolist():
        pos, expert = divmod(i, load.shape[1])
        total = int(load[pos].sum())
        out.append({
            "layer": moe_layers[pos],
            "expert": expert,
            "tokens": int(flat[i]),
            "share": round(int(flat[i]) / total, 6) if total else 0.0,
            "load_over_mean": round(int(flat[i]) * load.shape[1] / total, 4) if total else 0.0,
        })
    return out


def _lengths(table: pa.Table, bins: int) -> dict[str, Any]:
    n = np.asarray(table.column("num_tokens").to_numpy(zero_copy_only=False), dtype=np.int64)
    if not n.size:
        return {"samples": 0, "min": 0, "max": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0,
                "histogram": {"edges": [], "counts": []}}
    lo, hi = int(n.min()), int(n.max())
    counts, edges = np.histogram(n, bins=max(1, min(bins, hi - lo + 1)), range=(lo, hi + 1))
    p50, p90, p99 = (float(v) for v in np.percentile(n, [50, 90, 99]))
    return {
        "samples": int(n.size),
        "min": lo,
        "max": hi,
        "mean": round(float(n.mean()), 3),
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "histogram": {"edges": [round(float(e), 3) for e in edges], "counts": counts.tolist()},
    }
