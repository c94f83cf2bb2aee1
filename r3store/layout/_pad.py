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

__all__ = ["pad_ids", "pad_routes"]


def _count(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int ``>= minimum`` or raise :class:`LayoutOptionError`."""
    return parse_int(name, value, minimum=minimum, error=LayoutOptionError)


def _ep_group(ep_size: Any, num_experts: int) -> int:
    """Experts per EP rank, ``num_experts // ep_size``; ``ep_size`` must divide ``num_experts``."""
    ep = _count("ep_size", ep_size, 1)
    if num_experts % ep:
        raise LayoutOptionError("ep_size", ep_size, f"must divide num_experts={num_experts} (expert e lives on EP "
                                                    f"rank e // (num_experts // ep_size))")
    return num_experts // ep


def pad_ids(num_pad_rows: int, top_k: int, num_experts: int, ep_size: int | None = None,
            start: int = 0) -> np.ndarray:
    """The ids of pad rows ``start .. start + num_pad_rows - 1``, one row per pad row.

    Parameters
    ----------
    num_pad_rows, top_k, num_experts : int
    ep_size : int or None
        ``None``: id slot ``m = p*top_k + j`` holds ``m % num_experts``. An EP size:
        slot ``m`` holds expert ``(m % ep_size) * G + (m // ep_size) % G`` with
        ``G = num_experts // ep_size``: consecutive slots visit the EP ranks in turn,
        and within a rank its experts in turn.
    start : int
        Number of the first pad row.

    Returns
    -------
    numpy.ndarray of int64, shape (num_pad_rows, top_k)

    Raises
    ------
    LayoutOptionError
        ``ep_size`` does not divide ``num_experts``.

    Notes
    -----
    Slot ``m`` and slot ``m + num_experts`` hold the same id and the ``num_experts``
    slots of a period hold every id once, so the ``top_k <= num_experts`` ids of a row
    are distinct. With ``ep_size``, the first ``n`` slots give each EP rank ``n //
    ep_size`` or one more (the counts differ by at most 1), and each rank's experts
    likewise. ``ep_size = num_experts`` (or 1) gives the ids of ``None``.
    """
    slots = np.arange(start * top_k, (start + num_pad_rows) * top_k, dtype=np.int64)
    if ep_size is None:
        ids = slots % num_experts
    else:
        group = _ep_group(ep_size, num_experts)
        ep = num_experts // group
        ids = (slots % ep) * group + (slots // ep) % group
    return ids.reshape(num_pad_rows, top_k)


def pad_routes(num_pad_rows: int, n_layers: int, top_k: int, num_experts: int, *,
               ep_size: int | None = None) -> np.ndarray:
    """Build round-robin pad rows that spread evenly over all experts (and EP ranks).

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
    ep_size : int, optional
        Expert-parallel size (must divide ``E``): the ids visit the EP ranks in turn
        (see :func:`pad_ids`), so the pad-id counts of the EP ranks differ by at most 1.

    Returns
    -------
    numpy.ndarray of int32, shape (P, L, K)
        Pad row ``p`` holds ids ``(p*K + j) % E`` for ``j in range(K)`` in every layer
        (without ``ep_size``; see :func:`pad_ids` for the EP order).

    Raises
    ------
    LayoutOptionError
        If an argument is not an integer or is below its minimum, if
        ``top_k > num_experts`` (a row could not hold distinct ids), or if ``ep_size``
        does not divide ``num_experts``.

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
    ids = pad_ids(p, k, e, ep_size).astype(np.int32).reshape(p, 1, k)
    return np.ascontiguousarray(np.broadcast_to(ids, (p, n_layers, k)))
