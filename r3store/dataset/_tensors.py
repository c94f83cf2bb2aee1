"""numpy batches to torch tensors, and layouts of per-token tensors on any device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from r3store.errors import AlignmentError
from r3store.layout import LayoutPlan

__all__ = ["apply_plan_tensor", "batch_to_tensors", "to_device"]


def batch_to_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a numpy batch to CPU torch tensors (zero-copy where possible).

    ``routes`` int32, ``replay_mask`` bool, ``cu_seqlens`` int32, ``num_tokens`` int32
    and ``tokens`` int64 become tensors; ``sample_ids``, ``layers`` and ``sp_range``
    stay Python lists/tuples.
    """
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def apply_plan_tensor(plan: LayoutPlan, values: torch.Tensor, *, fill_value: float | int | bool = 0) -> torch.Tensor:
    """Lay out a per-token tensor by ``plan``, on the tensor's own device (CPU or GPU).

    The torch twin of :func:`r3store.layout.apply_plan`, so token ids, position ids and
    loss masks already on the GPU land exactly where the routes of the same plan do.

    Parameters
    ----------
    plan : r3store.layout.LayoutPlan
    values : torch.Tensor, shape (sum(num_tokens), ...)
        One entry per token, samples concatenated in plan order.
    fill_value : scalar
        Value at padding positions.

    Returns
    -------
    torch.Tensor, shape (T_local, ...) (THD) or (B, T_local, ...) (BSHD), same dtype and device

    Raises
    ------
    r3store.errors.AlignmentError
        ``values`` does not have one entry per token of the plan.
    """
    if values.dim() == 0 or values.shape[0] != plan.total_tokens:
        got = values.shape[0] if values.dim() else "a scalar"
        raise AlignmentError("<batch>", f"values have {got} rows but the plan covers {plan.total_tokens} tokens")
    index = torch.as_tensor(np.array(plan.index), device=values.device)  # plan arrays are read-only
    keep = index >= 0
    out = values.new_full(tuple(index.shape) + tuple(values.shape[1:]), fill_value)
    out[keep] = values[index[keep]]
    return out


def to_device(batch: Mapping[str, Any], device: torch.device | str, *, non_blocking: bool = True) -> dict[str, Any]:
    """Move every tensor of a batch to ``device`` (``non_blocking`` copies from pinned memory).

    Use with ``DataLoader(..., pin_memory=True)`` so host-to-device copies overlap compute.
    """
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


