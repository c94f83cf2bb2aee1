"""``BufferPool``: the memory of released output arrays, kept to build later outputs in.

A read's output is new memory (``numpy.empty``). A large one is mapped fresh by the C
library each time (glibc maps allocations above its mmap threshold, at most 32 MiB, on
their own and unmaps them when freed), so every page of it is first touched inside the
read: a page fault and the kernel zeroing the page, about 3 ms per 50 MB here, as much
as reading the routes themselves. A training loop reads outputs of the same few sizes
over and over (a sample's routes, a micro-batch), and drops each before long.

The pool keeps the arrays it handed out and gives one again once nothing refers to it any
more: CPython's reference count of the pooled array is then back to the pool's own
references (every view of it, a ``torch.from_numpy`` tensor, a ``memoryview``... holds a
reference to it, directly or through the view it was made from). Its pages are resident
and mapped, so the next read writes into them without faults.
"""

from __future__ import annotations

import sys
import threading
from math import prod

import numpy as np

__all__ = ["BufferPool"]

GRAIN = 2 << 20
"""Pooled arrays are whole multiples of this many bytes (a huge page on x86-64)."""

MIN_POOLED = 4 << 20
"""Outputs smaller than this come from ``numpy.empty`` (the C library recycles small blocks itself)."""



def _own_refs() -> int:
    probe = [np.empty(1)]
    return sys.getrefcount(probe[0])  # the same expression as in BufferPool._take


_EXACT = hasattr(sys, "getrefcount") and bool(getattr(sys, "_is_gil_enabled", lambda: True)())
"""Reference counts tell when a block is free: CPython with its GIL. Elsewhere (a free-threaded
build, where counts are split per thread) every output is a plain ``numpy.empty`` array."""

_OWN_REFS = _own_refs() if _EXACT else 0
"""``sys.getrefcount(arrays[i])`` of a pooled array nothing else refers to: the pool's list entry,
plus the reference the call itself holds (measured, not assumed: it depends on the interpreter)."""


class BufferPool:
    """Output memory of a reader, reused once the caller has released it.

    ``empty(shape, dtype)`` returns an uninitialised C-contiguous array, like
    ``numpy.empty``: a view of a pooled block (bytes, a multiple of 2 MiB) that nothing
    refers to any more when one of a fitting size is free (at least the size asked for,
    at most twice it), else of a new block, kept while the pool's blocks, busy or free,
    stay within ``max_bytes`` (free blocks are dropped oldest first to make room), else a
    plain ``numpy.empty`` array the pool does not keep. Outputs under 4 MiB are always
    plain ``numpy.empty`` arrays.

    A block is free again when its reference count says nothing but the pool holds it
    (CPython reference counting: a view, a ``memoryview``, a tensor sharing the memory
    all keep it busy). Code that keeps a raw pointer to an array's memory without a
    reference to the array is already wrong with ``numpy.empty`` (the memory is freed).

    Thread-safe. ``max_bytes`` 0, or an interpreter without exact reference counts (a
    free-threaded build): every output is a plain ``numpy.empty`` array.

    Parameters
    ----------
    max_bytes : int
        The most bytes of blocks the pool keeps (``>= 0``).

    Examples
    --------
    >>> pool = BufferPool(64 << 20)
    >>> a = pool.empty((1024, 1024, 2), np.int32)
    >>> address = a.ctypes.data
    >>> del a  # released: its block is free again
    >>> pool.empty((1024, 1024, 2), np.int32).ctypes.data == address
    True
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._arrays: list[np.ndarray] = []  # uint8 blocks, least recently handed out first
        self._lock = threading.Lock()
        self.reused = 0
        """Outputs built in a free pooled block so far."""

    @property
    def nbytes(self) -> int:
        """Bytes of the blocks the pool keeps, busy or free."""
        with self._lock:
            return sum(a.nbytes for a in self._arrays)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type | str) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (see the class)."""
        dtype = np.dtype(dtype)
        nbytes = prod(shape) * dtype.itemsize
        if nbytes < MIN_POOLED or nbytes > self.max_bytes or not _EXACT:
            return np.empty(shape, dtype)
        with self._lock:
            block = self._take(nbytes)
        return block[:nbytes].view(dtype).reshape(shape)

    def _take(self, nbytes: int) -> np.ndarray:
        arrays = self._arrays
        best = -1
        for i in range(len(arrays)):
            size = arrays[i].nbytes
            if nbytes <= size <= 2 * nbytes + GRAIN and sys.getrefcount(arrays[i]) == _OWN_REFS \
                    and (best < 0 or size < arrays[best].nbytes):
                best = i
        if best >= 0:
            block = arrays.pop(best)
            arrays.append(block)
            self.reused += 1
            return block
        size = -(-nbytes // GRAIN) * GRAIN
        held = sum(a.nbytes for a in arrays)
        i = 0
        while held + size > self.max_bytes and i < len(arrays):
            if sys.getrefcount(arrays[i]) == _OWN_REFS:  # free: dropped, oldest first
                held -= arrays.pop(i).nbytes
            else:
                i += 1
        block = np.empty(size, np.uint8)
        if held + size <= self.max_bytes:
            arrays.append(block)
        return block

    def clear(self) -> None:
        """Forget every block (busy ones stay valid: their arrays keep them alive)."""
        with self._lock:
            self._arrays.clear()

    def __getstate__(self) -> dict[str, int]:
        return {"max_bytes": self.max_bytes}  # pickles empty (a DataLoader worker builds its own)

    def __setstate__(self, state: dict[str, int]) -> None:
        self.__init__(state["max_bytes"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"BufferPool(max_bytes={self.max_bytes}, blocks={len(self._arrays)}, nbytes={self.nbytes})"
