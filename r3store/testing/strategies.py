"""Hypothesis strategies for r3store: expert ids, model geometries, specs and routes.

Large arrays are built with numpy from a drawn seed, never element by element, so a
strategy stays fast at thousands of ids; small cases are drawn as plain lists, so
hypothesis can still shrink a failure to a readable example.

Examples
--------
>>> from hypothesis import given
>>> @given(spec_routes())
... def check(pair):
...     spec, routes = pair
...     assert routes.shape[1:] == (spec.num_moe_layers, spec.top_k)
>>> check()
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from r3store._spec import ModelSpec

__all__ = [
    "bit_widths",
    "distinct_ids",
    "expert_ids",
    "geometries",
    "model_specs",
    "payloads",
    "seeds",
    "spec_routes",
    "valid_routes",
]

T = TypeVar("T")
SEED_MAX = 2**32 - 1


def seeds() -> st.SearchStrategy[int]:
    """Seeds for ``numpy.random.default_rng``."""
    return st.integers(0, SEED_MAX)


def _int_or(value: int | st.SearchStrategy[int], draw: st.DrawFn) -> int:
    return value if isinstance(value, int) else draw(value)


def bit_widths(min_bits: int = 1, max_bits: int = 16) -> st.SearchStrategy[int]:
    """Bits per id accepted by ``r3store.bitpack`` (1 to 16)."""
    return st.integers(min_bits, max_bits)


@st.composite
def expert_ids(
    draw: st.DrawFn,
    bits: int | st.SearchStrategy[int],
    *,
    min_size: int = 0,
    max_size: int = 2000,
    dtype: npt.DTypeLike = np.int64,
) -> np.ndarray:
    """Flat arrays of ids in ``[0, 2**bits)``.

    Returns
    -------
    ndarray of ``dtype``, shape (n,) with ``min_size <= n <= max_size``
        Up to 16 ids are drawn one by one (shrinkable); longer arrays come from a seeded
        generator in one of several patterns: uniform, sparse (mostly zero), runs of the
        largest id, and uniform with a zero tail (which ``r3store.bitpack`` trims).
    """
    bits = _int_or(bits, draw)
    top = (1 << bits) - 1
    small_max = min(max_size, 16)
    if min_size <= small_max and draw(st.booleans()):
        values = draw(st.lists(st.integers(0, top), min_size=min_size, max_size=small_max))
        return np.array(values, dtype=dtype)
    lo = max(min_size, small_max + 1) if max_size > small_max else min_size
    n = draw(st.integers(lo, max_size))
    rng = np.random.default_rng(draw(seeds()))
    pattern = draw(st.sampled_from(["uniform", "sparse", "max", "zero-tail"]))
    ids = rng.integers(0, top + 1, size=n, dtype=np.int64)
    if pattern == "sparse":
        ids[rng.random(n) < 0.9] = 0
    elif pattern == "max":
        ids[rng.random(n) < 0.7] = top
    elif pattern == "zero-tail":
        ids[rng.integers(0, n + 1) :] = 0
    return ids.astype(dtype)


@st.composite
def payloads(draw: st.DrawFn, n: int, bits: int) -> bytes:
    """Arbitrary bytes of the packed size of ``n`` ids of ``bits`` bits (padding bits random)."""
    rng = np.random.default_rng(draw(seeds()))
    return rng.integers(0, 256, size=(n * bits + 7) // 8, dtype=np.uint8).tobytes()


@st.composite
def geometries(
    draw: st.DrawFn,
    *,
    max_layers: int = 100,
    min_experts: int = 2,
    max_experts: int = 1024,
    max_top_k: int = 16,
) -> tuple[int, int, int]:
    """``(num_layers, num_experts, top_k)`` with ``1 <= top_k <= min(max_top_k, num_experts)``."""
    num_layers = draw(st.integers(1, max_layers))
    num_experts = draw(
        st.one_of(st.integers(min_experts, max_experts), st.sampled_from(_powers_of_two(min_experts, max_experts)))
    )
    top_k = draw(st.integers(1, min(max_top_k, num_experts)))
    return num_layers, num_experts, top_k


def _powers_of_two(lo: int, hi: int) -> list[int]:
    found = [1 << b for b in range(17) if lo <= 1 << b <= hi]
    return found or [lo]


@st.composite
def model_specs(
    draw: st.DrawFn,
    *,
    moe_layers: bool | None = None,
    max_layers: int = 100,
    min_experts: int = 2,
    max_experts: int = 1024,
    max_top_k: int = 16,
) -> ModelSpec:
    """Valid :class:`r3store.ModelSpec` values.

    Parameters
    ----------
    moe_layers : bool or None
        ``False``: every layer is an MoE layer (``moe_layers=None``); ``True``: a random
        non-empty sorted subset (dense layers exist when the subset is proper, e.g. the
        leading dense layers of DeepSeek-V3); ``None`` (default): either.
    """
    num_layers, num_experts, top_k = draw(
        geometries(max_layers=max_layers, min_experts=min_experts, max_experts=max_experts, max_top_k=max_top_k)
    )
    subset = draw(st.booleans()) if moe_layers is None else moe_layers
    layers: list[int] | None = None
    if subset:
        kind = draw(st.sampled_from(["leading-dense", "random"]))
        if kind == "leading-dense":
            first = draw(st.integers(0, num_layers - 1))
            layers = list(range(first, num_layers))
        else:
            rng = np.random.default_rng(draw(seeds()))
            count = draw(st.integers(1, num_layers))
            layers = sorted(rng.choice(num_layers, size=count, replace=False).tolist())
    return ModelSpec(num_layers=num_layers, num_experts=num_experts, top_k=top_k, moe_layers=layers)


def distinct_ids(rng: np.random.Generator, shape: tuple[int, ...], num_experts: int, top_k: int) -> np.ndarray:
    """Random ids, distinct along the last axis, in O(size) time and memory.

    Returns
    -------
    ndarray of int64, shape ``shape + (top_k,)``
        Each last-axis row holds ``top_k`` distinct ids in ``[0, num_experts)``, in random
        order. Built from ``top_k`` sorted draws in ``[0, num_experts - top_k]`` plus
        ``arange(top_k)`` (a bijection between multisets and subsets), then shuffled.
    """
    base = np.sort(rng.integers(0, num_experts - top_k + 1, size=(*shape, top_k)), axis=-1)
    ids = base + np.arange(top_k)
    order = np.argsort(rng.random(ids.shape), axis=-1)
    return np.take_along_axis(ids, order, axis=-1)


@st.composite
def valid_routes(
    draw: st.DrawFn,
    spec: ModelSpec,
    num_rows: int | st.SearchStrategy[int],
    *,
    all_layers: bool = False,
    dtype: npt.DTypeLike = np.int32,
) -> np.ndarray:
    """Routes a writer must accept for ``spec``.

    Parameters
    ----------
    spec : ModelSpec
    num_rows : int or strategy of int
        Rows (``num_tokens - 1``).
    all_layers : bool
        ``False``: MoE layers only; ``True``: every decoder layer, dense layers all zero
        (SGLang's ``routed_experts`` layout).
    dtype : numpy dtype
        Integer dtype of the result.

    Returns
    -------
    ndarray of ``dtype``, shape (num_rows, num_moe_layers or num_layers, top_k)
        Ids in ``[0, num_experts)``, distinct within each (row, layer). When there are at
        least two rows, the first holds the ``top_k`` largest ids and the last the ``top_k``
        smallest, so the extremes are always exercised.
    """
    rows = _int_or(num_rows, draw)
    rng = np.random.default_rng(draw(seeds()))
    moe = distinct_ids(rng, (rows, spec.num_moe_layers), spec.num_experts, spec.top_k)
    if rows >= 2:
        moe[0] = np.arange(spec.num_experts - spec.top_k, spec.num_experts)[::-1]
        moe[-1] = np.arange(spec.top_k)
    if not all_layers:
        return moe.astype(dtype)
    full = np.zeros((rows, spec.num_layers, spec.top_k), dtype=dtype)
    full[:, list(spec.moe_layers)] = moe
    return full


@st.composite
def spec_routes(
    draw: st.DrawFn,
    specs: st.SearchStrategy[ModelSpec] | None = None,
    *,
    max_rows: int = 64,
    all_layers: bool = False,
) -> tuple[ModelSpec, np.ndarray]:
    """A spec and valid routes for it, with 0 to ``max_rows`` rows."""
    spec = draw(specs if specs is not None else model_specs(max_layers=16, max_experts=256))
    routes = draw(valid_routes(spec, st.integers(0, max_rows), all_layers=all_layers))
    return spec, routes
