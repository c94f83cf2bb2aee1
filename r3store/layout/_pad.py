"""Pad rows for positions that have no recorded route.

Replay of pad positions is masked, but the trainer's MoE layer still dispatches
them. Rows all routed to experts ``0..k-1`` overload one expert-parallel rank
and ran it out of memory at long context (reported by Miles users), so the default pad
rows spread round-robin over all experts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from r3store._checks import parse_int
from r3store.errors import LayoutOptionError

__all__ = ["pad_routes"]


def _count(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int ``>= minimum`` or raise :class:`LayoutOptionError`."""
    return parse_int(name, value, minimum=minimum, error=LayoutOptionError)


def pad_routes(num_pad_rows: int, n_layers: int, top_k: int, num_experts: int) -> np.ndarray:
    """Build round-robin pad rows that spread evenly over all experts.

    Parameters
    ----------
    num_pad_rows : int
        Number of pad rows ``P`` (``>= 0``).
    n_layers : int
        Number of stored MoE layers ``L`` (``>= 0``).
    top_k : int
        Experts per row ``K`` (``>= 1``).
    num_experts : int
        Routed experts ``E`` per layer (``>= 1``).

    Returns
    -------
    numpy.ndarray of int32, shape (P, L, K)
        Pad row ``p`` holds ids ``(p*K + j) % E`` for ``j in range(K)`` in every layer.

    Raises
    ------
    LayoutOptionError
        If an argument is not an integer or is below its minimum, or if
        ``top_k > num_experts`` (a row could not hold distinct ids).

    Notes
    -----
    The ``P*K`` ids of a layer are consecutive values modulo ``E``, so ids within
    a row are distinct whenever ``K <= E`` and no expert receives more than
    ``ceil(P*K/E)`` pad rows per layer.

    Examples
    --------
    >>> pad_routes(3, 1, 2, 5)[:, 0]
    array([[0, 1],
           [2, 3],
           [4, 0]], dtype=int32)
    """
    p = _count("num_pad_rows", num_pad_rows, 0)
    n_layers = _count("n_layers", n_layers, 0)
    k = _count("top_k", top_k, 1)
    e = _count("num_experts", num_experts, 1)
    if k > e:
        raise LayoutOptionError("num_experts", num_experts,
                                f"pad rows need top_k={k} distinct ids, more than num_experts")
    ids = (np.arange(p * k, dtype=np.int64) % e).astype(np.int32).reshape(p, 1, k)
    return np.ascontiguousarray(np.broadcast_to(ids, (p, n_layers, k)))
