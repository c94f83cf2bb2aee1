"""`diff`: R3 mismatch figures between two stores holding routes of the same samples.

Typical use: routes an inference engine recorded during rollout (store A) against routes
a trainer recomputed for the same tokens (store B). A *routing decision* is one (token,
MoE layer) pair; two decisions agree when their top-k expert **sets** are equal (order
is ignored: the routing map is a set, the routing map is the set of chosen ids). The R3 paper reports
about 10% of decisions and 94% of tokens differing between SGLang and Megatron on
Qwen3-30B-A3B (the R3 paper, arXiv 2510.11370).
"""

from __future__ import annotations

import fnmatch
import functools
import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from r3store._format import array_key
from r3store.audit._scan import ProgressCallback, ScanPlan, ScanUnit, run_plan, select_samples
from r3store.errors import SpecMismatchError
from r3store.reader import RouteReader

__all__ = ["compare_routes", "diff", "plan_diff"]

BLOCK_CELLS = 1 << 22
WORST = 10
EXAMPLES = 20


@dataclass
class _Tally:
    """Sums over compared rows; adds up across samples and threads."""

    num_layers: int
    rows: int = 0
    rows_with_diff: int = 0
    overlap: int = 0
    differing: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.differing = np.zeros(self.num_layers, np.int64)

    def add(self, other: _Tally) -> None:
        self.rows += other.rows
        self.rows_with_diff += other.rows_with_diff
        self.overlap += other.overlap
        self.differing += other.differing


def compare_routes(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (row, layer): whether the top-k expert sets differ, and the size of their intersection.

    Rows are compared sorted, so the top-k order is ignored (a row repeating an id, a
    fault :func:`validate` reports, compares as a multiset).

    Parameters
    ----------
    a, b : ndarray of integer dtype, shape (rows, layers, top_k)

    Returns
    -------
    differ : ndarray of bool, shape (rows, layers)
    overlap : ndarray of int64, shape (rows, layers)
        ``|set(a[t, l]) & set(b[t, l])|``.

    Examples
    --------
    >>> differ, overlap = compare_routes(np.array([[[1, 2], [3, 4]]]), np.array([[[2, 1], [3, 5]]]))
    >>> differ.tolist(), overlap.tolist()
    ([[False, True]], [[2, 1]])
    """
    sa, sb = np.sort(a, axis=-1), np.sort(b, axis=-1)
    first = np.ones(sa.shape, bool)  # first occurrence of each id in a's sorted row: set semantics
    first[..., 1:] = sa[..., 1:] != sa[..., :-1]
    differ = (sa != sb).any(axis=-1)
    present = (sa[..., :, None] == sb[..., None, :]).any(axis=-1)
    return differ, (present & first).sum(axis=-1, dtype=np.int64)


def diff(store_a: RouteReader, store_b: RouteReader, *, sample_filter: str | None = None, limit: int | None = None,
         workers: int | None = None, progress: ProgressCallback | None = None) -> dict[str, Any]:
    """R3 mismatch figures for the samples present (and not quarantined) in both stores.

    Parameters
    ----------
    store_a, store_b : RouteReader
        Same ``num_experts`` and ``top_k``; compared on the MoE layers they share.
    sample_filter : str, optional
        ``fnmatch`` glob on sample ids: compare, and count as only in A or only in B, only
        the samples whose id matches.
    limit : int, optional
        Compare the first ``limit`` (matching) common samples, in store A's order. When the
        limit is reached, ``only_in_a`` / ``only_in_b`` count the samples of each store (in
        its own order) up to its last compared sample, not the whole store.
    workers : int, optional
        Threads (one sample per task, each thread with its own RouteReaders); default 1
        when both stores are on local disk, else 8.
    progress : callable, optional
        ``progress(rows_done, rows_total)``.

    Returns
    -------
    dict
        JSON-ready (``schema/cli-diff.schema.json``): ``samples_compared``,
        ``only_in_a`` / ``only_in_b`` (counts, with up to 20 ``*_examples``),
        ``row_mismatch`` (samples whose row counts differ; their common leading rows
        are compared), ``tokens`` (rows compared; rows the engine could not capture in
        either store are left out), ``decisions`` (tokens x layers),
        ``differing_decisions``, ``decision_flip_rate`` (fraction of decisions whose
        expert sets differ), ``token_flip_rate`` (fraction of tokens with at least one
        differing layer), ``mean_differing_layers_per_token``, ``set_overlap`` (mean
        ``|A & B| / top_k``), ``per_layer`` (flip rate per decoder layer) and
        ``worst_samples`` (highest decision flip rates).

    Raises
    ------
    r3store.errors.SpecMismatchError
        ``num_experts`` or ``top_k`` differ, or the stores share no MoE layer.
    """
    plan = plan_diff(store_a, store_b, sample_filter=sample_filter, limit=limit)
    return run_plan(plan, [store_a, store_b], workers=workers, progress=progress)


def plan_diff(store_a: RouteReader, store_b: RouteReader, *, sample_filter: str | None = None,
              limit: int | None = None) -> ScanPlan[dict[str, Any]]:
    """:func:`diff` as a :class:`r3store.audit.ScanPlan`: one unit per compared sample
    (naming the commit of its copy in each store), the merge adds the tallies up.

    Parameters are as for :func:`diff`; ``run_plan(plan_diff(a, b, ...), [a, b])`` is
    :func:`diff`.

    Raises
    ------
    r3store.errors.SpecMismatchError
        ``num_experts`` or ``top_k`` differ, or the stores share no MoE layer.
    """
    spec_a, spec_b = store_a.spec, store_b.spec
    layers = sorted(set(spec_a.moe_layers) & set(spec_b.moe_layers))
    if (spec_a.num_experts, spec_a.top_k) != (spec_b.num_experts, spec_b.top_k) or not layers:
        raise SpecMismatchError(store_b.url, spec_b.to_dict(), spec_a.to_dict())
    ids_a = store_a.sample_ids
    in_b = set(store_b.sample_ids)
    in_a = set(ids_a)
    selected = select_samples(store_a.samples, sample_filter, None, visible_only=True)
    matching = set(selected.column("sample_id").to_pylist())
    scope_a = [s for s in ids_a if s in matching]
    scope_b = [s for s in store_b.sample_ids if sample_filter is None or fnmatch.fnmatchcase(s, sample_filter)]
    chosen = [s for s in scope_a if s in in_b][: limit if limit is not None else None]
    if limit is not None and len(chosen) >= limit:  # the limit was reached: each store up to its last compared sample
        compared = set(chosen)
        last_b = max((i for i, s in enumerate(scope_b) if s in compared), default=-1)
        scope_a = scope_a[: scope_a.index(chosen[-1]) + 1] if chosen else []
        scope_b = scope_b[: last_b + 1]
    only_a = [s for s in scope_a if s not in in_b]
    only_b = [s for s in scope_b if s not in in_a]
    where_a, where_b = _where(store_a), _where(store_b)
    samples = [(s, where_a[s][0], where_b[s][0]) for s in chosen]
    units = tuple(ScanUnit(i, min(na, nb), ((where_a[sid][1],), (where_b[sid][1],)), (sid, na, nb))
                  for i, (sid, na, nb) in enumerate(samples))
    merge = functools.partial(_merge, layers=layers, figures=functools.partial(
        _figures, store_a.url, store_b.url, store_a.spec.num_experts, store_a.spec.top_k, layers, samples=samples,
        only_a=only_a, only_b=only_b, sample_filter=sample_filter, limit=limit))
    return ScanPlan("diff", units, functools.partial(_compare_unit, layers=layers), merge, on_duplicate="report")


def _where(store: RouteReader) -> dict[str, tuple[int, str]]:
    """Rows and commit of each visible sample."""
    commit_of = {array_key(commit): commit for commit in store.commits}
    cols = store.samples.select(["sample_id", "num_rows", "array", "quarantined"]).to_pydict()
    return {sid: (n, commit_of[array]) for sid, n, array, q in zip(*cols.values(), strict=True) if not q}


def _compare_unit(stores: Sequence[RouteReader], unit: ScanUnit, advance: Callable[[int], None], *,
                  layers: list[int]) -> tuple[str, _Tally]:
    """The mapper: compare one sample's routes in the two stores."""
    sid, rows_a, rows_b = unit.work
    a, b = stores
    tally = _Tally(len(layers))
    rows = min(rows_a, rows_b)
    step = max(1, BLOCK_CELLS // (len(layers) * a.spec.top_k ** 2))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        ra, rb = a.get(sid, layers, rows=slice(lo, hi)), b.get(sid, layers, rows=slice(lo, hi))
        captured = ~((ra[:, 0, 0] < 0) | (rb[:, 0, 0] < 0))  # rows missing in either store are not compared
        if not captured.all():
            ra, rb = ra[captured], rb[captured]
        differ, overlap = compare_routes(ra, rb)
        tally.rows += len(ra)
        tally.differing += differ.sum(axis=0)
        tally.rows_with_diff += int(differ.any(axis=1).sum())
        tally.overlap += int(overlap.sum())
        advance(hi - lo)
    return sid, tally


def _merge(partials: Iterable[tuple[str, _Tally]], *, layers: list[int],
           figures: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The merge: add the tallies (any order) and keep the worst samples (a total order)."""
    tally = _Tally(len(layers))
    worst: list[tuple[float, str]] = []
    for sid, part in partials:
        tally.add(part)
        if part.rows:
            heapq.heappush(worst, (float(part.differing.sum()) / (part.rows * len(layers)), sid))
            if len(worst) > WORST:
                heapq.heappop(worst)
    return figures(tally=tally, worst=sorted(worst, reverse=True))


def _figures(url_a: str, url_b: str, num_experts: int, top_k: int, layers: list[int], *, tally: _Tally,
             samples: list[tuple[str, int, int]], only_a: list[str], only_b: list[str],
             worst: list[tuple[float, str]], sample_filter: str | None, limit: int | None) -> dict[str, Any]:
    plan = samples
    decisions = tally.rows * len(layers)
    differing = int(tally.differing.sum())

    def rate(num: float, den: int) -> float:
        return num / den if den else 0.0

    return {
        "store_a": url_a,
        "store_b": url_b,
        "num_experts": num_experts,
        "top_k": top_k,
        "layers": layers,
        "sample_filter": sample_filter,
        "limit": limit,
        "samples_compared": len(plan),
        "only_in_a": len(only_a),
        "only_in_b": len(only_b),
        "only_in_a_examples": only_a[:EXAMPLES],
        "only_in_b_examples": only_b[:EXAMPLES],
        "row_mismatch": sum(na != nb for _, na, nb in plan),
        "row_mismatch_examples": [sid for sid, na, nb in plan if na != nb][:EXAMPLES],
        "tokens": tally.rows,
        "decisions": decisions,
        "differing_decisions": differing,
        "decision_flip_rate": rate(differing, decisions),
        "token_flip_rate": rate(tally.rows_with_diff, tally.rows),
        "tokens_with_diff": tally.rows_with_diff,
        "mean_differing_layers_per_token": rate(differing, tally.rows),
        "set_overlap": rate(tally.overlap, decisions * top_k),
        "per_layer": [{"layer": layer, "differing": int(n), "flip_rate": rate(int(n), tally.rows)}
                      for layer, n in zip(layers, tally.differing.tolist(), strict=True)],
        "worst_samples": [{"sample_id": sid, "decision_flip_rate": r} for r, sid in worst],
    }
