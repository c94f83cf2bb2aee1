"""Realistic synthetic routing traces, for tests and benchmarks.

Real traces are neither uniform nor independent, and both properties matter to anything
that compresses, balances or audits them. :func:`synthetic_routes` reproduces the three
statistics published for real traces (Mixtral, OLMoE, DeepSeek-V3, FLAME-MoE):

* **load skew** -- per-layer max/mean expert load of 1.1 to 1.9 (Mixtral, FLAME-MoE) and
  2.5 to 8 (OLMoE, DeepSeek-V3, depending on domain). The bundled FLAME-MoE-290M trace
  measures 1.4 to 1.9;
* **adjacent-layer correlation** -- mutual information of 0.2 to 0.9 bits between the
  routing of consecutive layers;
* **token repetition** -- consecutive tokens repeat their first-choice expert about 2x
  more often than chance in Mixtral, barely at all in models with shared experts.

:data:`MODEL_GEOMETRIES` holds the routing geometry of widely used MoE models (from their
published configs), and :func:`routing_stats` measures the three statistics on any trace.

Examples
--------
>>> from r3store.testing.synthetic import qwen3_30b_a3b_spec, synthetic_routes
>>> spec = qwen3_30b_a3b_spec()
>>> routes = synthetic_routes(num_tokens=1025, num_layers=spec.num_moe_layers,
...                           num_experts=spec.num_experts, top_k=spec.top_k, seed=0)
>>> routes.shape, routes.dtype
((1024, 48, 8), dtype('int32'))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from r3store._checks import is_int
from r3store._spec import ModelSpec

__all__ = [
    "MODEL_GEOMETRIES",
    "RoutingStats",
    "qwen3_30b_a3b_spec",
    "routing_stats",
    "synthetic_routes",
    "uniform_routes",
    "zipf_exponent_for_skew",
]

#: Routing geometry of the models in the models' published configs. ``num_layers`` counts
#: decoder layers, dense ones included; the dense layers (the first ``first_k_dense``
#: decoder layers in every model listed) are left out of ``moe_layers``.
MODEL_GEOMETRIES: dict[str, ModelSpec] = {
    "gpt-oss-20b": ModelSpec(num_layers=24, num_experts=32, top_k=4),
    "GLM-4.7-Flash": ModelSpec(num_layers=47, num_experts=64, top_k=4, moe_layers=range(1, 47)),
    "Qwen3-30B-A3B": ModelSpec(num_layers=48, num_experts=128, top_k=8),
    "Qwen3-Next-80B-A3B": ModelSpec(num_layers=48, num_experts=512, top_k=10),
    "GLM-4.5": ModelSpec(num_layers=92, num_experts=160, top_k=8, moe_layers=range(3, 92)),
    "DeepSeek-V3": ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=range(3, 61)),
    "Kimi-K2": ModelSpec(num_layers=61, num_experts=384, top_k=8, moe_layers=range(1, 61)),
}


def qwen3_30b_a3b_spec() -> ModelSpec:
    """Routing geometry of Qwen3-30B-A3B: 48 MoE layers, 128 experts, top-8.

    Returns
    -------
    ModelSpec
        ``ModelSpec(num_layers=48, num_experts=128, top_k=8)``; every layer is an MoE
        layer. An int32 trace of it takes 1,536 bytes per token (the models' published configs).

    Examples
    --------
    >>> qwen3_30b_a3b_spec().bits_per_id
    7
    """
    return ModelSpec(num_layers=48, num_experts=128, top_k=8)


# -- popularity --------------------------------------------------------------------


def _inclusion(weights: np.ndarray, top_k: int) -> np.ndarray:
    """Approximate inclusion probabilities of weighted sampling without replacement.

    Rosen's approximation for successive (Plackett-Luce) sampling: ``pi_i = 1 -
    exp(-w_i * t)`` with ``t`` chosen so that ``sum(pi) == top_k``. ``weights`` has
    shape (..., num_experts) and sums to 1 along the last axis; every row is solved at
    once, by Newton's method from ``t = 0`` (``sum(pi)`` is concave in ``t``, so the
    iterates increase monotonically to the root).
    """
    if top_k >= weights.shape[-1]:
        return np.ones_like(weights)
    t = np.zeros((*weights.shape[:-1], 1))
    for _ in range(200):
        e = np.exp(-weights * t)
        f = weights.shape[-1] - e.sum(-1, keepdims=True) - top_k
        step = -f / (weights * e).sum(-1, keepdims=True)
        t = t + step
        if (np.abs(step) <= 1e-12 * t).all():
            break
    inclusion: np.ndarray = 1 - np.exp(-weights * t)
    return inclusion


def _zipf(num_experts: int, exponent: float | np.ndarray) -> np.ndarray:
    """Zipf popularity by rank, normalised; shape (num_experts,) or (len(exponent), num_experts)."""
    s = np.asarray(exponent, dtype=np.float64)[..., None]
    w = np.arange(1, num_experts + 1, dtype=np.float64) ** -s
    popularity: np.ndarray = w / w.sum(-1, keepdims=True)
    return popularity


@functools.lru_cache(maxsize=32)
def _load_curve(num_experts: int, top_k: int) -> np.ndarray:
    """Expected max/mean load at each exponent of ``_EXPONENT_GRID`` (non-decreasing)."""
    loads = _inclusion(_zipf(num_experts, _EXPONENT_GRID), top_k).max(-1) * (num_experts / top_k)
    loads = np.maximum.accumulate(loads)  # guard the interpolation against rounding wiggles
    loads.flags.writeable = False
    return loads


# Exponents at which the load curve is tabulated; load is monotone in the exponent.
_EXPONENT_GRID = np.concatenate([np.linspace(0.0, 4.0, 161)[:-1], np.geomspace(4.0, 64.0, 41)])


def zipf_exponent_for_skew(skew: float | np.ndarray, num_experts: int, top_k: int) -> float | np.ndarray:
    """Zipf exponent whose top-k routing gives an expected max/mean expert load of ``skew``.

    Expert popularity by rank ``r`` is ``(r + 1) ** -s``; a token's ``top_k`` experts are
    drawn from it without replacement. The expected load of an expert is its inclusion
    probability (Rosen's approximation for successive sampling), and the mean load is
    ``top_k / num_experts``. The load curve is tabulated over ``s`` and interpolated.

    Parameters
    ----------
    skew : float or ndarray of float
        Target max/mean load, in ``[1, num_experts / top_k)`` (1 is uniform routing).
    num_experts, top_k : int

    Returns
    -------
    float or ndarray of float64 (shaped like ``skew``)
        The exponent ``s >= 0``.

    Raises
    ------
    ValueError
        A ``skew`` is out of range.

    Examples
    --------
    >>> float(zipf_exponent_for_skew(1.0, 128, 8))
    0.0
    """
    limit = num_experts / top_k
    target = np.asarray(skew, dtype=np.float64)
    ok = (target >= 1.0) & ((target < limit) | (target == 1.0))
    if not ok.all():
        raise ValueError(f"skew must lie in [1, num_experts / top_k = {limit:g}), got {skew!r}")
    found = np.interp(target, _load_curve(num_experts, top_k), _EXPONENT_GRID)
    return float(found) if found.ndim == 0 else found


# -- sampling ----------------------------------------------------------------------


_GUIDE_BITS = 16


@dataclass(frozen=True)
class _Sampler:
    """Exact inverse-CDF sampling of expert ids, sped up by a guide table.

    ``lo[g]`` and ``hi[g]`` are the experts at the ends of bucket ``g`` of ``[0, 1)`` split
    into ``2**16`` buckets; only a draw whose bucket straddles a CDF step (at most
    ``num_experts`` of the buckets) needs a binary search.
    """

    cdf: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def from_weights(cls, weights: np.ndarray) -> _Sampler:
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        edges = np.arange((1 << _GUIDE_BITS) + 1) / (1 << _GUIDE_BITS)
        at = np.minimum(np.searchsorted(cdf, edges, side="right"), weights.size - 1)
        return cls(cdf=cdf, lo=at[:-1], hi=at[1:])

    def draw(self, shape: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        u = rng.random(shape)
        g = (u * (1 << _GUIDE_BITS)).astype(np.intp)
        out = self.lo[g]
        amb = out != self.hi[g]
        if amb.any():
            out[amb] = np.minimum(np.searchsorted(self.cdf, u[amb], side="right"), self.cdf.size - 1)
        return out


def _collisions(x: np.ndarray, fixed: np.ndarray | None) -> np.ndarray:
    """bool (top_k, n): free slots equal to an earlier slot or to any fixed slot of their row."""
    top_k = x.shape[0]
    bad = np.zeros(x.shape, dtype=bool)
    for j in range(top_k):
        for i in range(top_k):
            if i < j:
                bad[j] |= x[j] == x[i]
            elif i > j and fixed is not None:
                bad[j] |= (x[j] == x[i]) & fixed[i]
    if fixed is not None:
        bad &= ~fixed
    return bad


def _fill_distinct(x: np.ndarray, fixed: np.ndarray | None, sampler: _Sampler, weights: np.ndarray,
                   rng: np.random.Generator) -> None:
    """Draw the non-``fixed`` slots of ``x`` (top_k, rows; slot-major), distinct per row.

    Free slots are drawn i.i.d. from ``sampler`` and redrawn while they repeat a fixed slot
    or an earlier slot of their row (rejection sampling, close to Plackett-Luce order).
    Slots still colliding after a few rounds (heavy skew, or ``top_k`` close to
    ``num_experts``) are drawn exactly, one at a time, with weighted reservoir keys
    (Efraimidis-Spirakis) among the row's unused experts. ``fixed=None``: all slots free.
    """
    top_k, rows = x.shape
    if fixed is None:
        x[...] = sampler.draw(x.shape, rng)
    else:
        np.copyto(x, sampler.draw(x.shape, rng), where=~fixed)
    sub, sub_fixed = x, fixed
    todo: np.ndarray | None = None  # columns (rows of the trace) still colliding; None: all
    # Rejection pays while collisions are rare; with top_k near num_experts go exact at once.
    for _ in range(16 if 2 * top_k <= weights.size else 0):
        bad = _collisions(sub, sub_fixed)
        hit = np.flatnonzero(bad.any(axis=0))
        if not hit.size:
            return
        todo = hit if todo is None else todo[hit]
        bad = bad[:, hit]
        sub = sub[:, hit]
        sub[bad] = sampler.draw(int(bad.sum()), rng)
        x[:, todo] = sub
        if sub_fixed is not None:
            sub_fixed = sub_fixed[:, hit]
    if todo is None:
        todo = np.arange(rows)
    # Exact for the rest: per slot, the largest key log(u) / w among unused experts.
    n = todo.size
    sub = x[:, todo]
    sub_free = np.ones(sub.shape, dtype=bool) if fixed is None else ~fixed[:, todo]
    used = np.zeros((n, weights.size), dtype=bool)
    cols = np.arange(n)
    for j in range(top_k):
        keep = ~sub_free[j]
        used[cols[keep], sub[j, keep]] = True
    inv_w = 1.0 / np.maximum(weights, 1e-300)
    for j in range(top_k):
        keys = np.log(rng.random((n, weights.size))) * inv_w
        keys[used] = -np.inf
        pick = keys.argmax(axis=1)
        sub[j] = np.where(sub_free[j], pick, sub[j])
        used[cols, sub[j]] = True
    x[:, todo] = sub


def synthetic_routes(
    *,
    num_tokens: int,
    num_layers: int,
    num_experts: int,
    top_k: int,
    seed: int,
    skew: float = 2.0,
    layer_correlation: float = 0.2,
    token_repeat: float = 2.0,
) -> np.ndarray:
    """A realistic routing trace: skewed, layer-correlated, with repeating first choices.

    Parameters
    ----------
    num_tokens : int
        Tokens of the sample (>= 1); the trace has ``num_tokens - 1`` rows, as an engine
        returns it (the R3 paper, arXiv 2510.11370).
    num_layers : int
        MoE layers (the stored layer axis; dense layers are not generated).
    num_experts : int
        Routed experts per layer.
    top_k : int
        Experts per token and layer, ``1 <= top_k <= num_experts``.
    seed : int
        Seed of the generator; equal arguments give equal traces.
    skew : float
        Target per-layer max/mean expert load (published routing statistics: 1.1 to 1.9 for
        Mixtral and FLAME-MoE, 2.5 to 8 for OLMoE and DeepSeek-V3). Each layer gets its
        own random expert popularity, a Zipf profile over a random ranking of the experts
        whose exponent gives a load ratio of ``skew`` times a per-layer jitter of up to
        +/-10%. Must be >= 1 (1 is uniform routing). The load ratio cannot reach
        ``num_experts / top_k`` (every token picking the same experts); per-layer targets
        are capped halfway there, so small geometries such as 8 experts, top-4 (cap 1.5)
        stay random.
    layer_correlation : float
        In ``[0, 1]``: probability that a top-k slot of layer ``l + 1`` copies the same
        slot of layer ``l`` through a fixed per-layer mapping of experts (the expert of the
        same popularity rank); other slots are drawn afresh. 0 gives independent layers.
        The default, 0.2, gives about 0.4 to 0.9 bits of mutual information between
        adjacent layers' first choices for 32 to 512 experts (0.7 bits for 128 experts,
        top-8; published traces: 0.2 to 0.9 bits); 1 copies every slot.
    token_repeat : float
        Target ratio (>= 1) of P(token ``t`` has the first-choice expert of token
        ``t - 1`` in the same layer) to its chance level ``sum_e p_e**2``. Section 7:
        about 2 for Mixtral, about 1 (no extra repetition) for models with shared
        experts.

    Returns
    -------
    ndarray of int32, shape (num_tokens - 1, num_layers, top_k)
        Expert ids in ``[0, num_experts)``, distinct within every ``[t, l, :]`` row.
        Slot 0 is the first choice; slots follow a Plackett-Luce (score) order.

    Raises
    ------
    ValueError
        An argument is out of range.

    Notes
    -----
    Sampling is vectorised over tokens: per layer, one batch of inverse-CDF draws plus a
    few rounds of rejection for repeated ids. 32K tokens x 48 layers x top-8 take about
    half a second. Measured statistics of the output (see :func:`routing_stats`) are
    within a few percent of the targets for traces of a few thousand tokens or more;
    the repetition of layer 0 and the copied slots' repetition are compensated so that
    every layer has about the same repeat ratio.

    Examples
    --------
    >>> r = synthetic_routes(num_tokens=5, num_layers=2, num_experts=8, top_k=2, seed=1)
    >>> r.shape
    (4, 2, 2)
    >>> bool((r[..., 0] != r[..., 1]).all())
    True
    """
    for name, value in (("num_tokens", num_tokens), ("num_layers", num_layers),
                        ("num_experts", num_experts), ("top_k", top_k)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if top_k > num_experts:
        raise ValueError(f"top_k ({top_k}) must not exceed num_experts ({num_experts})")
    if not 0.0 <= layer_correlation <= 1.0:
        raise ValueError(f"layer_correlation must lie in [0, 1], got {layer_correlation!r}")
    if not token_repeat >= 1.0:
        raise ValueError(f"token_repeat must be >= 1, got {token_repeat!r}")
    if not skew >= 1.0:
        raise ValueError(f"skew must be >= 1, got {skew!r}")

    rng = np.random.default_rng(seed)
    rows = num_tokens - 1
    dtype = np.int16 if num_experts <= 1 << 15 else np.int32
    if rows == 0:
        return np.empty((0, num_layers, top_k), dtype=np.int32)

    # Per-layer popularity: a jittered Zipf profile over a random ranking of the experts.
    limit = num_experts / top_k
    if skew > 1.0 and limit > 1.0:
        targets = np.clip(skew * np.exp(rng.uniform(-0.1, 0.1, num_layers)), 1.0, 1 + (limit - 1) * 0.5)
        exponents = np.asarray(zipf_exponent_for_skew(targets, num_experts, top_k))
    else:
        exponents = np.zeros(num_layers)
    by_rank = _zipf(num_experts, exponents)  # (num_layers, num_experts)
    order = np.argsort(rng.random((num_layers, num_experts)), axis=1)  # rank -> expert
    rank_of = np.argsort(order, axis=1)  # expert -> rank
    weights = np.empty_like(by_rank)
    np.put_along_axis(weights, order, by_rank, axis=1)

    rho = float(layer_correlation)
    work = np.empty((num_layers, top_k, rows), dtype=dtype)  # layer- and slot-major while generating
    for layer in range(num_layers):
        cur = work[layer]
        sampler = _Sampler.from_weights(weights[layer])
        if layer == 0 or rho == 0.0:
            _fill_distinct(cur, None, sampler, weights[layer], rng)
        else:
            # Copy slots of the previous layer through the map that keeps popularity rank.
            fixed = rng.random((top_k, rows), dtype=np.float32) < rho
            mapping = order[layer][rank_of[layer - 1]].astype(dtype)
            np.copyto(cur, mapping[work[layer - 1]], where=fixed)
            _fill_distinct(cur, fixed, sampler, weights[layer], rng)
        if token_repeat > 1.0 and rows > 1:
            _repeat_first_choice(cur, weights[layer], token_repeat, rho if layer else 0.0, rng)
    out = np.empty((rows, num_layers, top_k), dtype=np.int32)
    out[...] = work.transpose(2, 0, 1)
    return out


def _repeat_first_choice(cur: np.ndarray, weights: np.ndarray, ratio: float, inherited: float,
                         rng: np.random.Generator) -> None:
    """Make token ``t`` reuse token ``t - 1``'s first choice with the probability that
    lifts the repeat rate to ``ratio`` times chance; keep rows distinct by swapping.

    ``cur`` is one layer, slot-major: shape (top_k, rows).
    """
    chance = float((weights**2).sum())
    target = min(ratio * chance, 1.0)
    # Both tokens copied slot 0 from the previous layer with probability inherited**2, in
    # which case they repeat as often as that layer did (target); otherwise at chance.
    base = inherited**2 * target + (1 - inherited**2) * chance
    q = max(0.0, (target - base) / (1 - base)) if base < 1 else 0.0
    if q == 0.0:
        return
    rows = cur.shape[1]
    rep = rng.random(int(rows)) < q
    rep[0] = False
    # Chains of repeats take the first choice of the last token that did not repeat.
    src = np.maximum.accumulate(np.where(rep, 0, np.arange(rows)))
    sel = np.flatnonzero(rep)
    sub, first = cur[:, sel], cur[0, src[sel]]
    match = sub == first
    has = np.flatnonzero(match.any(axis=0))
    pos = match.argmax(axis=0)[has]
    # The repeated expert moves to slot 0; the old first choice takes its slot (or leaves).
    sub[pos, has] = sub[0, has]
    sub[0] = first
    cur[:, sel] = sub


# -- measuring ---------------------------------------------------------------------


@dataclass(frozen=True)
class RoutingStats:
    """Statistics of a routing trace, per layer (as published for Mixtral, OLMoE, DeepSeek-V3 and FLAME-MoE)."""

    max_mean_load: np.ndarray
    """float64 (num_layers,): max over experts of the load, over the mean load."""
    repeat_ratio: np.ndarray
    """float64 (num_layers,): P(first choice of token t == that of t - 1) / chance."""
    adjacent_mi_bits: np.ndarray
    """float64 (num_layers - 1,): mutual information (bits) of layers l, l + 1 first
    choices, minus that of a token-shuffled pairing (removes most of the plug-in bias)."""


def _mi_bits(a: np.ndarray, b: np.ndarray, num_experts: int) -> float:
    """Plug-in mutual information (bits) of two id sequences, from sparse joint counts."""
    pairs, joint = np.unique(a.astype(np.int64) * num_experts + b, return_counts=True)
    n = a.size
    pa = np.bincount(a, minlength=num_experts)[pairs // num_experts]
    pb = np.bincount(b, minlength=num_experts)[pairs % num_experts]
    return float((joint / n * np.log2(joint * n / (pa * pb.astype(np.float64)))).sum())


def routing_stats(routes: np.ndarray, num_experts: int, *, seed: int = 0) -> RoutingStats:
    """Measure load skew, first-choice repetition and adjacent-layer mutual information.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, num_layers, top_k)
        Expert ids in ``[0, num_experts)``; slot 0 is the first choice.
    num_experts : int
    seed : int
        Seed of the token shuffle used as the mutual-information baseline.

    Returns
    -------
    RoutingStats
    """
    routes = np.asarray(routes)
    rows, num_layers, _top_k = routes.shape
    rng = np.random.default_rng(seed)
    load = np.empty(num_layers)
    rep = np.empty(num_layers)
    mi = np.empty(max(num_layers - 1, 0))
    for layer in range(num_layers):
        counts = np.bincount(routes[:, layer].reshape(-1).astype(np.int64), minlength=num_experts)
        load[layer] = counts.max() / counts.mean()
        first = routes[:, layer, 0].astype(np.int64)
        p = np.bincount(first, minlength=num_experts) / rows
        rep[layer] = float((first[1:] == first[:-1]).mean() / (p**2).sum()) if rows > 1 else math.nan
        if layer:
            a = routes[:, layer - 1, 0].astype(np.int64)
            mi[layer - 1] = _mi_bits(a, first, num_experts) - _mi_bits(a, rng.permutation(first), num_experts)
    return RoutingStats(max_mean_load=load, repeat_ratio=rep, adjacent_mi_bits=mi)


def uniform_routes(rng: np.random.Generator, rows: int, layers: int, num_experts: int, top_k: int) -> np.ndarray:
    """Valid routes with no structure: per (row, layer), ``top_k`` distinct ids drawn uniformly.

    Returns
    -------
    ndarray of int64, shape (rows, layers, top_k)
        Ids in ``[0, num_experts)``, distinct within each row, in random order.
    """
    n = rows * layers
    if n == 0:
        return np.zeros((rows, layers, top_k), dtype=np.int64)
    if top_k * 4 > num_experts:  # dense draw: a random permutation prefix per row
        ids = np.argsort(rng.random((n, num_experts)), axis=-1)[:, :top_k]
    else:  # sparse draw: rejection-sample the rows that repeat an id
        ids = rng.integers(0, num_experts, size=(n, top_k))
        while True:
            s = np.sort(ids, axis=-1)
            bad = np.flatnonzero((s[:, 1:] == s[:, :-1]).any(axis=-1))
            if not bad.size:
                break
            ids[bad] = rng.integers(0, num_experts, size=(bad.size, top_k))
    return ids.reshape(rows, layers, top_k).astype(np.int64)
