"""Apply a :class:`~r3store.layout.LayoutPlan` to per-token arrays and to routes."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from r3store._checks import parse_choice, parse_int
from r3store.errors import AlignmentError, LayoutOptionError, RouteShapeError
from r3store.layout._options import PAD_POLICIES
from r3store.layout._pad import pad_routes
from r3store.layout._plan import LayoutPlan, route_index

__all__ = ["apply_plan", "apply_routes", "check_pad_args"]

_BATCH = "<batch>"
_INT32 = np.iinfo(np.int32)


def _gather(index: np.ndarray, values: np.ndarray, fill_value: Any) -> np.ndarray:
    """``values[index]`` with ``fill_value`` wherever ``index < 0``.

    Rows are copied whole with ``np.take`` (one memcpy per row), then pad positions are
    overwritten: much faster than boolean-mask scatter for wide rows such as routes.
    """
    out = np.empty(index.shape + values.shape[1:], dtype=values.dtype)
    pad = index < 0
    if len(values):
        np.take(values, np.where(pad, 0, index), axis=0, out=out)
        out[pad] = fill_value
    else:
        out[...] = fill_value
    return out


def apply_plan(plan: LayoutPlan, values: np.ndarray, *, fill_value: Any = 0) -> np.ndarray:
    """Lay out any per-token array (token ids, position ids, loss masks) by ``plan``.

    Parameters
    ----------
    plan : LayoutPlan
    values : numpy.ndarray, shape (N, ...)
        One entry per token in the concatenated token order, ``N = sum(num_tokens)``.
    fill_value : scalar, default 0
        Value written at padding positions (cast to ``values.dtype``).

    Returns
    -------
    numpy.ndarray, shape (T_local, ...) for THD or (B, T_local, ...) for BSHD
        Same dtype as ``values``.

    Raises
    ------
    AlignmentError
        If ``values`` does not have exactly ``N`` entries along axis 0
        (``sample_id`` is ``"<batch>"``).
    """
    values = np.asarray(values)
    if values.ndim == 0 or values.shape[0] != plan.total_tokens:
        got = values.shape[0] if values.ndim else "a scalar"
        fault = f"values have {got} rows but the plan covers {plan.total_tokens} tokens"
        raise AlignmentError(_BATCH, fault)
    return _gather(plan.index, values, fill_value)


def _check_routes(plan: LayoutPlan, routes: Any) -> np.ndarray:
    """Return ``routes`` as int32 ``(R, L, K)`` after checking rank, dtype and row count."""
    routes = np.asarray(routes)
    if routes.ndim != 3:
        raise RouteShapeError(_BATCH, "routes", f"must be 3-D (rows, n_layers, top_k), got shape {routes.shape}")
    if routes.dtype.kind not in "iu":
        raise RouteShapeError(_BATCH, "routes", f"must hold integers, got dtype {routes.dtype}")
    if routes.shape[0] != plan.total_routes:
        fault = (
            f"routes have {routes.shape[0]} rows but the plan's samples need "
            f"sum(num_tokens - 1) = {plan.total_routes}"
        )
        raise AlignmentError(_BATCH, fault)
    checked: np.ndarray = routes.astype(np.int32, copy=False)
    return checked


def check_pad_args(num_experts: Any, pad_policy: Any, fill_value: Any) -> None:
    """Validate the pad arguments of :func:`apply_routes` (before any work is done).

    Raises
    ------
    LayoutOptionError
        ``num_experts`` is not an int >= 1, ``pad_policy`` is not one of
        :data:`PAD_POLICIES`, or ``fill_value`` is not an int32 integer.
    """
    parse_int("num_experts", num_experts, minimum=1, error=LayoutOptionError)
    parse_choice("pad_policy", pad_policy, PAD_POLICIES, error=LayoutOptionError)
    parse_int("fill_value", fill_value, minimum=int(_INT32.min), maximum=int(_INT32.max), error=LayoutOptionError)


def apply_routes(
    plan: LayoutPlan,
    routes: np.ndarray,
    *,
    num_experts: int,
    pad_policy: Literal["spread", "fill"] = "spread",
    fill_value: int = -1,
    missing: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Lay out recorded routes exactly where ``plan`` puts their tokens.

    Parameters
    ----------
    plan : LayoutPlan
    routes : numpy.ndarray of int, shape (R, n_layers, top_k)
        All samples' routes concatenated in sample order, ``R = sum(num_tokens - 1)``.
        Ids are copied as they are (cast to int32).
    num_experts : int
        Routed experts per layer; the range of the ``"spread"`` pad ids.
    pad_policy : {"spread", "fill"}, default "spread"
        ``"spread"``: pad rows from :func:`pad_routes` (over the EP ranks with
        ``plan.options.ep_size``), numbered in row-major order over this rank's output.
        ``"fill"``: every pad id is ``fill_value``.
    fill_value : int, default -1
        Pad id for ``pad_policy="fill"``.
    missing : numpy.ndarray of bool, shape (R,), optional
        Rows of ``routes`` the engine could not capture: laid out as pad rows (values of
        ``pad_policy``) with ``replay_mask`` False, so replay keeps live routing there.

    Returns
    -------
    out : numpy.ndarray of int32
        Shape ``(T_local, n_layers, top_k)`` (THD) or ``(B, T_local, n_layers, top_k)`` (BSHD).
    replay_mask : numpy.ndarray of bool
        Shape ``(T_local,)`` or ``(B, T_local)``: true exactly where a recorded
        route sits; every other position (missing rows included) holds a pad row.

    Raises
    ------
    RouteShapeError
        If ``routes`` is not 3-D or not integer (``sample_id`` is ``"<batch>"``).
    AlignmentError
        If ``routes`` has other than ``sum(num_tokens - 1)`` rows.
    LayoutOptionError
        If ``num_experts``, ``pad_policy`` or ``fill_value`` is invalid, or with
        ``"spread"`` if ``top_k > num_experts`` (pad rows could not hold distinct ids).

    Notes
    -----
    A sample's last token and every CP / BSHD / TP pad position get a pad row
    (Miles' route layout, step 1: one pad row per sample); replay must be masked there.
    """
    check_pad_args(num_experts, pad_policy, fill_value)
    routes = _check_routes(plan, routes)
    ep_size = plan.options.ep_size
    if pad_policy == "spread":  # checks top_k <= num_experts and ep_size before any work
        pad_routes(0, 0, routes.shape[2], num_experts, ep_size=ep_size)
    ridx = route_index(plan)
    if missing is not None:
        missing = np.asarray(missing, dtype=bool)
        if missing.shape != (routes.shape[0],):
            raise AlignmentError(_BATCH, f"missing has shape {missing.shape}, the routes {routes.shape[0]} rows")
        if len(missing):  # no rows (every sample of 1 token): nothing to drop, nothing to index
            ridx = np.where((ridx >= 0) & missing[np.maximum(ridx, 0)], -1, ridx)
    out = _gather(ridx, routes, fill_value)
    mask = ridx >= 0
    if pad_policy == "spread":
        _, n_layers, top_k = routes.shape
        out[~mask] = pad_routes(int((~mask).sum()), n_layers, top_k, num_experts, ep_size=ep_size)
    return out, mask
