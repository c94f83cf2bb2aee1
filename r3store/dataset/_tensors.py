"""numpy batches to torch tensors, and layouts of per-token tensors on any device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from r3store.errors import AlignmentError
from r3store.layout import LayoutPlan

__all__ = ["SharedAllocator", "apply_plan_tensor", "batch_to_tensors", "to_device"]


class SharedAllocator:
    """Allocates arrays in shared memory, remembering the torch tensors behind them.

    A DataLoader worker hands tensors to the main process through shared memory: a
    tensor in private memory is copied there first (``share_memory_``). Built in shared
    memory from the start (``assemble(..., allocate=allocator)``), the batch's routes
    cross without that copy: :meth:`tensor_of` gives the tensor behind an array.
    Uses torch's sharing strategy (``torch.multiprocessing.get_sharing_strategy``).
    """

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous ``dtype`` array of ``shape`` in shared memory."""
        tdtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
        if new_shared is None:  # not in this torch: share (copy) an empty tensor once
            tensor = torch.empty(shape, dtype=tdtype)
            tensor.share_memory_()  # type: ignore[no-untyped-call]
        else:
            storage: torch.UntypedStorage = new_shared(max(nbytes, 1))
            tensor = torch.empty(0, dtype=tdtype).set_(storage, 0, shape, _contiguous_strides(shape))
        array: np.ndarray = tensor.numpy()
        self._tensors[array.ctypes.data] = tensor
        return array

    def tensor_of(self, array: np.ndarray) -> torch.Tensor | None:
        """The shared tensor ``array`` (C-contiguous, from this allocator) views, reshaped alike; else None."""
        tensor = self._tensors.pop(array.ctypes.data, None)
        if tensor is None or not array.flags.c_contiguous or tensor.numel() != array.size:
            return None
        return tensor.view(array.shape)


def batch_to_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a numpy batch to CPU torch tensors (zero-copy where possible).

    ``routes`` int32, ``replay_mask`` bool, ``cu_seqlens`` int32, ``num_tokens`` int32
    and ``tokens`` int64 become tensors; ``sample_ids``, ``layers`` and ``sp_range``
    stay Python lists/tuples.
    """
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides, in elements, of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


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


