"""The physical-expert-id test: does a layer's id distribution look EP-remapped?

Logical expert ids are arbitrary labels: nothing about a router ties an expert's *load*
to its *number*. Whatever experts a layer leaves unused (dead experts, or just too few
tokens), the unused ids are, under logical ids, an exchangeable random subset of
``[0, num_experts)``. Physical ids (after expert-parallel load balancing remaps experts to
``num_experts + redundant`` slots, or after a rank offset is added) break that symmetry in
two ways, and the test looks for either:

1. **ids >= num_experts** (the redundant slots) make up at least ``min_fraction`` of the
   layer's ids. A stray out-of-range id is reported per sample as ``id_out_of_range``
   only; a share of 1% or more is a remapped layout, not a glitch.
2. **a shifted block**: an *end* of the id range is unused, ``ids 0..m-1`` or
   ``ids E-m..E-1``, more than chance allows. With ``u`` of ``E`` ids unused, the chance
   that a given end run of ``m`` ids is among them is
   ``C(E-m, u-m) / C(E, u) = prod_{i<m} (u-i)/(E-i)``; the p-value doubles it (either
   end). The layer is flagged when ``p < alpha`` (default 1e-3). This is exact for any
   amount of data: with few tokens many ids are unused, and a long unused end run is then
   likely and not flagged.

A shift by ``s`` (``physical = logical + s``) leaves ``ids 0..s-1`` unused and pushes ids
past ``num_experts``; a layer whose experts were renumbered into a sub-range shows the
unused end block alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["physical_id_test"]

ALPHA = 1e-3
MIN_FRACTION = 0.01


def _end_run_p(num_experts: int, unused: int, run: int) -> float:
    """P(an end run of ``run`` ids is all unused | ``unused`` random unused ids), both ends."""
    if run == 0:
        return 1.0
    log_p = sum(math.log(unused - i) - math.log(num_experts - i) for i in range(run))
    return min(1.0, 2.0 * math.exp(log_p))


def physical_id_test(counts: np.ndarray, num_experts: int, *, alpha: float = ALPHA,
                     min_fraction: float = MIN_FRACTION) -> dict[str, Any]:
    """Test one layer's id histogram for physical (EP-remapped) expert ids.

    Parameters
    ----------
    counts : ndarray of int, shape (2**bits,)
        How often each stored id occurs in the layer (every top-k slot of every row).
    num_experts : int
        Logical experts of the model (ids ``0 .. num_experts - 1`` are valid).
    alpha : float
        Significance level of the unused-end-block test.
    min_fraction : float
        Share of ids ``>= num_experts`` from which the layer counts as remapped.

    Returns
    -------
    dict
        ``ids`` (counted), ``out_of_range`` (ids >= num_experts), ``fraction_out_of_range``,
        ``unused_experts`` (logical ids never seen), ``low_unused_run`` / ``high_unused_run``
        (length of the unused run at id 0 / at ``num_experts - 1``), ``p_value`` (of the
        longer run), ``physical`` (bool) and ``reason`` (str, empty when not physical).

    Examples
    --------
    >>> counts = np.zeros(64, dtype=np.int64)
    >>> counts[16:64] = 100                # logical 0..47 shifted by 16
    >>> r = physical_id_test(counts, 64)
    >>> r["physical"], r["low_unused_run"], r["p_value"] < 1e-12
    (True, 16, True)
    >>> counts = np.full(64, 100); counts[[3, 40]] = 0   # two dead experts, anywhere
    >>> physical_id_test(counts, 64)["physical"]
    False
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    logical = counts[:num_experts]
    above = total - int(logical.sum())
    used = logical > 0
    unused = int(num_experts - used.sum())
    low = int(np.argmax(used)) if used.any() else num_experts
    high = int(np.argmax(used[::-1])) if used.any() else num_experts
    run = max(low, high)
    seen = total > 0 and unused < num_experts
    p_value = _end_run_p(num_experts, unused, run) if seen else 1.0
    fraction = above / total if total else 0.0
    reasons = []
    if total and fraction >= min_fraction:
        top = int(np.flatnonzero(counts)[-1])
        reasons.append(f"{fraction:.1%} of ids are >= num_experts ({num_experts}), max id {top}")
    if seen and p_value < alpha:
        block = f"0-{low - 1}" if low >= high else f"{num_experts - high}-{num_experts - 1}"
        reasons.append(f"ids {block} are never used ({run} of {unused} unused ids form an end block; "
                       f"p = {p_value:.2g} for logical ids)")
    return {
        "ids": total,
        "out_of_range": above,
        "fraction_out_of_range": round(fraction, 6),
        "unused_experts": unused,
        "low_unused_run": low if seen else 0,
        "high_unused_run": high if seen else 0,
        "p_value": float(f"{p_value:.4g}"),
        "physical": bool(reasons),
        "reason": "; ".join(reasons),
    }
