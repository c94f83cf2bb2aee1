"""numpy reference of the ``r3store.set`` codec: the oracle of its C kernel, and its fallback.

A row of a route chunk (the ``top_k`` ids of one token in one layer) is a set: replay
gathers the routing weights again from the live router scores and sums the expert
outputs, and the audits compare sets. So a row is coded as one *digit* in
``[0, R)``, ``R = C(E, k) + 1`` (``k >= 2``; ``R = E`` for ``k = 1``):

* a *set row* (``k`` distinct ids below ``E``) is its colex rank
  ``sum_i C(c_i, i)`` over its ids sorted ascending ``c_1 < ... < c_k``
  (``i`` from 1), in ``[0, C(E, k))``;
* the all-zero row (zarr's fill past the end of an array, a chunk's padded layers, a
  missing row) is the digit ``C(E, k)``;
* any other row (an id repeated, or in ``[E, 2**bits)``: a quarantined sample's routes)
  is an *exception*, stored verbatim.

Digits are grouped ``m`` to a block (``m``: :func:`block_rows`), each block the
mixed-radix number ``sum_j d_j R**j`` written in ``bit_length(R**m - 1)`` bits, so a row
costs within 1.5% of ``log2 C(E, k)`` bits. The frame layout is in
:mod:`r3store.codecs._set` and ``schema/FORMAT.md`` (section 5.2).

Everything here is plain numpy (Python integers where a rank or block exceeds 64 bits):
obviously right, and fast enough to be the fallback without the C extension.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import google_crc32c
import numpy as np

from r3store.codecs._kernels_numpy import pack_bits_numpy, unpack_bits_numpy

__all__ = [
    "MAX_EXPERTS",
    "MAX_TOP_K",
    "SET_HEADER",
    "SET_MAGIC",
    "SetCheck",
    "SetParams",
    "block_rows",
    "check_set_frame_numpy",
    "decode_set_frame_numpy",
    "encode_set_frame_numpy",
    "set_params",
]

SET_MAGIC = b"R3ST"
SET_VERSION = 1
SET_HEADER = struct.Struct("<4sBBHIIIBBHII")
"""magic, version, top_k, num_experts, n_total, n_rows, n_except, block_rows, block_bits,
reserved, tag, crc32c: 32 bytes."""
MAX_EXPERTS = 1024
MAX_TOP_K = 16
NARROW = 64
"""Blocks of values below ``2**64`` are decoded with 64-bit arithmetic."""
WIDE = 120
"""No block holds more bits (a block is read with one 16-byte load)."""
SLACK = 1.0175
"""Bits of a block over ``m * log2 R`` tolerated before more rows per block are tried (leaves
0.25% of the 2% a set codec may spend over the bound to frame headers and indexes)."""


@dataclass(frozen=True)
class SetParams:
    """Derived constants of an ``r3store.set`` codec of ``num_experts`` x ``top_k``."""

    num_experts: int
    top_k: int
    bits: int
    """Bits per id of exception rows and the tail: ``max(1, ceil(log2(num_experts)))``."""
    sets: int
    """``C(num_experts, top_k)``."""
    radix: int
    """Digits per row: ``sets + 1`` (the all-zero row) when ``top_k >= 2``, else ``sets``."""
    block_rows: int
    """Digits per block ``m``."""
    widths: tuple[int, ...]
    """``widths[j]``: bits of a block of ``j`` digits, ``bit_length(radix**j - 1)`` (j = 0..m)."""

    @property
    def block_bits(self) -> int:
        """Bits of a full block."""
        return self.widths[self.block_rows]

    @property
    def narrow(self) -> bool:
        """Whether every block value is below ``2**64``."""
        return bool(self.radix**self.block_rows <= 1 << NARROW)

    @property
    def bound_bits(self) -> float:
        """``log2 C(E, k)``: the fewest bits a uniformly random set row can cost on average."""
        return math.log2(self.sets)


def block_rows(radix: int) -> int:
    """Digits per block for ``radix``: the smallest ``m`` whose block of ``bit_length(radix**m - 1)``
    bits is within :data:`SLACK` of ``m * log2(radix)``, trying blocks below ``2**64`` first,
    then below ``2**120``; else the ``m`` (block below ``2**120``) with the fewest bits per digit.

    Examples
    --------
    >>> block_rows(math.comb(256, 8) + 1), block_rows(math.comb(64, 6) + 1)
    (1, 2)
    """
    if radix <= 2:
        return 1
    per_digit = math.log2(radix)
    for limit in (NARROW, WIDE):
        m = 1
        while m <= 64 and radix**m <= 1 << limit:
            if (radix**m - 1).bit_length() <= SLACK * m * per_digit:
                return m
            m += 1
    fits = [m for m in range(1, 65) if radix**m <= 1 << WIDE]
    return min(fits, key=lambda m: ((radix**m - 1).bit_length() / m, m))


@lru_cache(maxsize=64)
def set_params(num_experts: int, top_k: int) -> SetParams:
    """The derived constants (callers check ``1 <= top_k <= min(num_experts, 16)``, ``num_experts <= 1024``)."""
    sets = math.comb(num_experts, top_k)
    radix = sets + 1 if top_k >= 2 else sets
    m = block_rows(radix)
    widths = tuple((radix**j - 1).bit_length() for j in range(m + 1))
    bits = max(1, (num_experts - 1).bit_length())
    return SetParams(num_experts, top_k, bits, sets, radix, m, widths)


@lru_cache(maxsize=64)
def _comb_table(num_experts: int, top_k: int, wide: bool) -> list[np.ndarray]:
    """``table[i][c] = C(c, i)`` for ``i`` in ``0..top_k``, ``c`` in ``0..num_experts - 1``
    (uint64, or Python ints in object arrays when ``wide``)."""
    dtype = object if wide else np.uint64
    return [np.array([math.comb(c, i) for c in range(num_experts)], dtype=dtype) for i in range(top_k + 1)]


def _wide(p: SetParams) -> bool:
    """Ranks and blocks need Python integers (a block value reaches ``2**64``)."""
    return not p.narrow


class SetCheck(NamedTuple):
    """What :func:`check_set_frame_numpy` found in a frame's header and sizes."""

    status: int
    """0: valid so far; else the first failed check: 1 shorter than the header, 2 magic,
    3 CRC-32C, 4 unknown version, 5 header disagrees with the codec (top_k, num_experts,
    block shape) or its counts with each other, 6 payload length, 7 reserved bytes."""
    n_total: int
    n_rows: int
    n_except: int
    tag: int


def _digit_bits(p: SetParams, digits: int) -> int:
    full, part = divmod(digits, p.block_rows)
    return full * p.block_bits + p.widths[part]


def _payload_size(p: SetParams, n_total: int, n_rows: int, n_except: int) -> int:
    raw = n_except * p.top_k + n_total % p.top_k
    return (_digit_bits(p, n_rows - n_except) + 7) // 8 + 4 * n_except + (raw * p.bits + 7) // 8


def check_set_frame_numpy(data: np.ndarray, p: SetParams) -> SetCheck:
    """Header, CRC-32C and size checks of an ``r3store.set`` frame (not its digits)."""
    data = np.asarray(data).view(np.uint8).reshape(-1)
    size = SET_HEADER.size
    if data.size < size:
        return SetCheck(1, 0, 0, 0, 0)
    magic, version, top_k, experts, n_total, n_rows, n_except, m, w, reserved, tag, crc = \
        SET_HEADER.unpack(data[:size].tobytes())
    if magic != SET_MAGIC:
        return SetCheck(2, 0, 0, 0, 0)
    computed = google_crc32c.extend(google_crc32c.value(data[: size - 4].tobytes()), np.ascontiguousarray(data[size:]))
    if computed != crc:
        return SetCheck(3, 0, 0, 0, 0)
    if version != SET_VERSION:
        return SetCheck(4, 0, 0, 0, 0)
    found = SetCheck(0, n_total, n_rows, n_except, tag)
    if (top_k, experts, m, w) != (p.top_k, p.num_experts, p.block_rows, p.block_bits) or \
            n_rows > n_total // p.top_k or n_except > n_rows:
        return found._replace(status=5)
    if data.size - size != _payload_size(p, n_total, n_rows, n_except):
        return found._replace(status=6)
    if reserved:
        return found._replace(status=7)
    return found


# -- ranks ---------------------------------------------------------------------------


def _rows_of(flat: np.ndarray, p: SetParams) -> tuple[np.ndarray, int]:
    """The full rows of ``flat`` up to its last non-zero one, and how many that is."""
    full = flat.size // p.top_k
    rows = flat[: full * p.top_k].reshape(full, p.top_k)
    nonzero = np.flatnonzero(rows.any(axis=1))
    n_rows = int(nonzero[-1]) + 1 if nonzero.size else 0
    return rows[:n_rows], n_rows


def _digits(rows: np.ndarray, p: SetParams) -> tuple[np.ndarray, np.ndarray]:
    """Digits of the rows that have one, and the indices of the exception rows."""
    ordered = np.sort(rows, axis=1)
    is_set = ordered[:, -1] < p.num_experts
    if p.top_k > 1:
        is_set &= (ordered[:, 1:] != ordered[:, :-1]).all(axis=1)
    zero = ~rows.any(axis=1) if p.top_k > 1 else np.zeros(len(rows), dtype=bool)
    table = _comb_table(p.num_experts, p.top_k, _wide(p))
    sets = ordered[is_set]
    rank = np.zeros(len(sets), dtype=table[0].dtype)
    for i in range(1, p.top_k + 1):
        rank = rank + table[i][sets[:, i - 1]]
    kept = is_set | zero
    digits = np.zeros(len(rows), dtype=table[0].dtype)
    digits[is_set] = rank
    digits[zero] = p.sets
    return digits[kept], np.flatnonzero(~kept)


def _unrank(digits: np.ndarray, p: SetParams, out: np.ndarray) -> None:
    """Rows of ``digits`` (each < radix) into ``out`` (shape (len(digits), top_k)), ascending."""
    table = _comb_table(p.num_experts, p.top_k, _wide(p))
    zero = digits == p.sets if p.top_k > 1 else np.zeros(len(digits), dtype=bool)
    r = np.where(zero, 0, digits) if zero.any() else digits.copy()
    for i in range(p.top_k, 0, -1):
        c = np.searchsorted(table[i], r, side="right") - 1
        out[:, i - 1] = c
        r = r - table[i][c]
    out[zero] = 0


# -- blocks and bits -----------------------------------------------------------------


def _bits_of(values: np.ndarray, width: int, wide: bool) -> np.ndarray:
    """The low ``width`` bits of each value, least significant first, as a bool matrix."""
    if wide:
        raw = np.frombuffer(b"".join(int(v).to_bytes(16, "little") for v in values), dtype=np.uint8)
    else:
        raw = np.ascontiguousarray(values, dtype="<u8").view(np.uint8)
    return np.unpackbits(raw.reshape(len(values), -1), axis=1, bitorder="little")[:, :width]


def _values_of(bits: np.ndarray, wide: bool) -> np.ndarray:
    """Inverse of :func:`_bits_of` (``bits``: (n, width) of 0/1)."""
    n, width = bits.shape
    padded = np.zeros((n, 128 if wide else 64), dtype=np.uint8)
    padded[:, :width] = bits
    raw = np.packbits(padded, axis=1, bitorder="little")
    if not wide:
        return raw.view("<u8").reshape(n).astype(np.uint64)
    return np.array([int.from_bytes(row.tobytes(), "little") for row in raw], dtype=object)


def _encode_digits(digits: np.ndarray, p: SetParams) -> bytes:
    m, wide = p.block_rows, _wide(p)
    full, part = divmod(len(digits), m)
    pieces = []
    for count, width, blocks in ((m, p.block_bits, full), (part, p.widths[part], 1 if part else 0)):
        if not blocks:
            continue
        chunk = digits[: full * m].reshape(full, m) if count == m else digits[full * m :].reshape(1, part)
        value = np.zeros(blocks, dtype=object if wide else np.uint64)
        for j in range(count - 1, -1, -1):  # Horner: first row least significant
            value = value * (p.radix if wide else np.uint64(p.radix)) + (
                chunk[:, j] if wide else chunk[:, j].astype(np.uint64))
        pieces.append(_bits_of(value, width, wide).reshape(-1))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint8)
    return np.packbits(stream, bitorder="little").tobytes()


def _decode_digits(payload: np.ndarray, count: int, p: SetParams) -> np.ndarray | None:
    """``count`` digits from the start of ``payload``; None when a block value is out of range
    or the padding bits of the last byte are set."""
    m, wide = p.block_rows, _wide(p)
    full, part = divmod(count, m)
    nbits = full * p.block_bits + p.widths[part]
    stream = np.unpackbits(payload[: (nbits + 7) // 8], bitorder="little")
    if stream[nbits:].any():
        return None
    dtype = object if wide else np.uint64
    out = np.empty(count, dtype=dtype)
    at = 0
    for blocks, digits_per, width in ((full, m, p.block_bits), (1 if part else 0, part, p.widths[part])):
        if not blocks:
            continue
        value = _values_of(stream[at : at + blocks * width].reshape(blocks, width), wide)
        at += blocks * width
        radix = p.radix if wide else np.uint64(p.radix)
        digits = np.empty((blocks, digits_per), dtype=dtype)
        for j in range(digits_per):
            digits[:, j] = value % radix
            value = value // radix
        if (value != 0).any():
            return None
        start = 0 if digits_per == m else full * m
        out[start : start + blocks * digits_per] = digits.reshape(-1)
    return out


# -- frames --------------------------------------------------------------------------


def encode_set_frame_numpy(ids: np.ndarray, p: SetParams, tag: int = 0) -> bytes | None:
    """One ``r3store.set`` frame of ``ids`` (any shape, read in C order); None when an id lies
    outside ``[0, 2**bits)`` (the caller names it)."""
    flat = np.asarray(ids).reshape(-1)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= 1 << p.bits):
        return None
    flat = flat.astype(np.int64)
    rows, n_rows = _rows_of(flat, p)
    digits, exceptions = _digits(rows, p)
    raw = np.concatenate([rows[exceptions].reshape(-1), flat[flat.size // p.top_k * p.top_k :]])
    payload = b"".join((_encode_digits(digits, p), exceptions.astype("<u4").tobytes(),
                        pack_bits_numpy(raw, p.bits).tobytes()))
    head = SET_HEADER.pack(SET_MAGIC, SET_VERSION, p.top_k, p.num_experts, flat.size, n_rows, exceptions.size,
                           p.block_rows, p.block_bits, 0, tag, 0)[:-4]
    crc = google_crc32c.extend(google_crc32c.value(head), payload)
    return head + struct.pack("<I", crc) + payload


def decode_set_frame_numpy(data: np.ndarray, p: SetParams, check: SetCheck, out: np.ndarray) -> int:
    """Decode a frame that passed :func:`check_set_frame_numpy` into ``out`` (``n_total``
    integers, C order). Returns 0, or the status of the first fault found in the payload
    (``out`` then untouched): 8 a block out of range or set padding bits, 9 exception
    rows not strictly increasing below ``n_rows``, 10 set padding bits of the verbatim ids."""
    k = p.top_k
    payload = np.asarray(data).view(np.uint8).reshape(-1)[SET_HEADER.size :]
    n_digits = check.n_rows - check.n_except
    digits = _decode_digits(payload, n_digits, p)
    if digits is None:
        return 8
    at = (_digit_bits(p, n_digits) + 7) // 8
    exceptions = payload[at : at + 4 * check.n_except].view("<u4").astype(np.int64)
    if exceptions.size and (exceptions[0] < 0 or (np.diff(exceptions) <= 0).any()
                            or exceptions[-1] >= check.n_rows):
        return 9
    at += 4 * check.n_except
    n_raw = check.n_except * k + check.n_total % k
    raw_bytes = payload[at:]
    used = n_raw * p.bits % 8
    if used and int(raw_bytes[-1]) >> used:
        return 10
    raw = unpack_bits_numpy(raw_bytes, n_raw, p.bits).astype(np.int64)
    rows = np.zeros((check.n_rows, k), dtype=np.int64)
    is_digit = np.ones(check.n_rows, dtype=bool)
    is_digit[exceptions] = False
    decoded = np.empty((n_digits, k), dtype=np.int64)
    _unrank(digits, p, decoded)
    rows[is_digit] = decoded
    rows[exceptions] = raw[: check.n_except * k].reshape(-1, k)
    flat = out.reshape(-1) if out.flags.c_contiguous else out.flat
    flat[: rows.size] = rows.reshape(-1)
    full = check.n_total // k * k
    flat[rows.size : full] = 0
    flat[full : check.n_total] = raw[check.n_except * k :]
    return 0
