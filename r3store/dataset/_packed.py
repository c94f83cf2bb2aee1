"""Bit-packed routes to the device: unpack them there with plain tensor ops."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from r3store._checks import is_int, parse_int
from r3store.errors import OptionError

__all__ = ["unpack_routes"]


def unpack_routes(packed: torch.Tensor, bits: int, shape: Sequence[int], *,
                  dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Expert ids from the bit-packed routes of ``assemble(..., packed=True)``, on ``packed``'s device.

    Send the packed bytes to the GPU (``bits / 32`` of the int32 routes' bytes) and unpack
    them there: plain tensor ops (no custom kernel), so any device torch runs on works.

    Parameters
    ----------
    packed : torch.Tensor of uint8, shape (ceil(n * bits / 8),) (any shape, read flat)
        ``batch["routes"]``: id ``i`` is stream bits ``[i * bits, (i + 1) * bits)``, least
        significant bit first (the ``r3store.bitpack`` payload, FORMAT.md 5.1).
    bits : int
        ``batch["routes_bits"]``, 1 to 16.
    shape : sequence of int
        ``batch["routes_shape"]``; ``n`` is its product.
    dtype : torch.dtype
        Of the result (int32 default; int64 to index with directly).

    Returns
    -------
    torch.Tensor of ``dtype``, ``shape``, on ``packed.device``

    Raises
    ------
    r3store.errors.OptionError
        ``bits`` outside 1..16, ``shape`` not a sequence of ints >= 0, ``packed`` not
        uint8 or shorter than ``ceil(n * bits / 8)``.

    Notes
    -----
    Ids are unpacked 8 at a time: 8 ids of ``bits`` bits fill exactly ``bits`` bytes, so id
    ``j`` of every group starts at the same byte ``j * bits // 8`` and bit ``j * bits % 8``
    and spans at most 3 bytes (``7 + 16 <= 24`` bits): 8 vectorised gathers over the groups.
    """
    if not is_int(bits) or not 1 <= bits <= 16:
        raise OptionError("bits", bits, "must be an int in 1..16")
    if not isinstance(packed, torch.Tensor):
        raise OptionError("packed", f"<{type(packed).__name__}>",
                          "must be a torch tensor (batch['routes'] of RouteDataset, or torch.from_numpy of "
                          "assemble(..., packed=True)['routes'])")
    if packed.dtype != torch.uint8:
        raise OptionError("packed", f"<tensor of {packed.dtype}>", "must be a uint8 tensor (batch['routes'])")
    if isinstance(shape, str) or not isinstance(shape, Sequence):
        raise OptionError("shape", shape, "must be a sequence of ints (batch['routes_shape'])")
    dims = tuple(parse_int(f"shape[{i}]", v, minimum=0) for i, v in enumerate(shape))
    n = math.prod(dims)
    nbytes = (n * bits + 7) // 8
    flat = packed.reshape(-1)
    if flat.numel() < nbytes:
        raise OptionError("packed", f"<{flat.numel()} bytes>", f"must hold {nbytes} bytes: {n} ids of {bits} bits")
    groups = -(-n // 8)
    body = torch.zeros(groups * bits, dtype=torch.uint8, device=packed.device)
    body[:nbytes] = flat[:nbytes]
    # byte k of every group, contiguous: (bits + 2, groups), two zero rows for the 3-byte reads
    grid = torch.zeros((bits + 2, groups), dtype=torch.int32, device=packed.device)
    grid[:bits] = body.view(groups, bits).t()
    out = torch.empty((8, groups), dtype=torch.int32, device=packed.device)
    mask = (1 << bits) - 1
    for j in range(8):
        lo, shift = divmod(j * bits, 8)
        word = grid[lo] | (grid[lo + 1] << 8) | (grid[lo + 2] << 16)
        out[j] = (word >> shift) & mask
    return out.t().reshape(-1)[:n].reshape(dims).to(dtype)
