"""``r3store.bitpack``: expert ids packed in ``ceil(log2(num_experts))`` bits, with a checksum.

Frame layout (all integers little-endian; byte offsets)::

    0   4  magic      b"R3BP"
    4   1  version    1
    5   1  bits       bits per id, 1..16
    6   2  reserved   0
    8   4  n_total    number of ids in the chunk
    12  4  n_encoded  number of ids in the payload (trailing zero ids are trimmed)
    16  4  crc32c     CRC-32C (Castagnoli) of bytes [0, 16) followed by the payload
    20  .  payload    ceil(n_encoded * bits / 8) bytes

Id ``i`` of the payload occupies stream bits ``[i * bits, (i + 1) * bits)``, least
significant bit first; stream bit ``j`` is bit ``j % 8`` of payload byte ``j // 8``.
Ids ``n_encoded .. n_total - 1`` decode to 0. The reserved bytes and the unused high bits
of the last payload byte are 0 (decoding checks both). The trim makes the zero fill that zarr's
regular grid puts past the end of an array (and all-zero chunks) cost nothing.
"""

from __future__ import annotations

import struct
from typing import ClassVar

import google_crc32c
import numpy as np
import numpy.typing as npt

from r3store._checks import parse_int
from r3store.codecs import kernels
from r3store.codecs._abc import Codec
from r3store.errors import ChecksumError, CodecError, FormatError

__all__ = ["BitpackCodec", "pack_bits", "pack_bits_reference", "unpack_bits", "unpack_bits_reference"]

MAGIC = b"R3BP"
VERSION = 1
HEADER = struct.Struct("<4sBBHIII")
MAX_BITS = 16
_FRAME = "r3store.bitpack frame"


def _codec_error(name: str, value: object, fault: str) -> CodecError:
    return CodecError(BitpackCodec.codec_id, f"{name} {fault}, got {value!r}")


def _check_bits(bits: object) -> int:
    return parse_int("bits", bits, minimum=1, maximum=MAX_BITS, error=_codec_error)


def pack_bits(ids: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative ids below ``2**bits`` into a little-endian bit stream.

    Parameters
    ----------
    ids : ndarray of integer dtype, shape (n,)
        Values in ``[0, 2**bits)``; not checked here.
    bits : int
        Bits per id, 1 to 16.

    Returns
    -------
    ndarray of uint8, shape (ceil(n * bits / 8),)

    Notes
    -----
    Runs :func:`r3store.codecs.kernels.pack_bits` (compiled, or its numpy twin).
    """
    return kernels.pack_bits(ids, bits)


def unpack_bits(payload: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`.

    Parameters
    ----------
    payload : ndarray of uint8, shape (ceil(n * bits / 8),)
    n : int
        Number of ids to read.
    bits : int

    Returns
    -------
    ndarray of int32, shape (n,)

    Notes
    -----
    Runs :func:`r3store.codecs.kernels.unpack_bits` (compiled, or its numpy twin); that
    function also writes int16, uint16 and uint8.
    """
    return kernels.unpack_bits(payload, n, bits)


def pack_bits_reference(ids: npt.ArrayLike, bits: int) -> bytes:
    """Plain reference twin of :func:`pack_bits` (Python integers; slow, obviously right)."""
    acc = 0
    values = [int(v) for v in np.asarray(ids).reshape(-1)]
    for i, v in enumerate(values):
        acc |= v << (i * bits)
    return acc.to_bytes((len(values) * bits + 7) // 8, "little")


def unpack_bits_reference(payload: bytes, n: int, bits: int) -> np.ndarray:
    """Plain reference twin of :func:`unpack_bits`."""
    acc = int.from_bytes(bytes(payload), "little")
    mask = (1 << bits) - 1
    return np.array([(acc >> (i * bits)) & mask for i in range(n)], dtype=np.int32)


def _trimmed_size(flat: np.ndarray) -> int:
    """Number of ids up to and including the last non-zero one."""
    if not flat.size:
        return 0
    from_end = int((flat != 0)[::-1].argmax())
    return 0 if flat[flat.size - 1 - from_end] == 0 else flat.size - from_end


class BitpackCodec(Codec):
    """Bit-pack expert ids in ``bits`` bits each, with a CRC-32C per frame.

    Parameters
    ----------
    bits : int
        Bits per id, 1 to 16; r3store uses ``max(1, ceil(log2(num_experts)))``
        (6 for 64 experts, 9 for 512).

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` is out of range.

    Notes
    -----
    The byte layout is given in this module's docstring and in ``schema/FORMAT.md``.
    CRC-32C is the checksum zarr's ``crc32c`` codec uses.

    Examples
    --------
    >>> codec = BitpackCodec(bits=6)
    >>> buf = codec.encode(np.array([3, 63, 0, 17]))
    >>> len(buf)  # 20-byte header + 4 ids * 6 bits
    23
    >>> codec.decode(buf).tolist()
    [3, 63, 0, 17]
    """

    codec_id: ClassVar[str] = "r3store.bitpack"

    def __init__(self, bits: int) -> None:
        self.bits = _check_bits(bits)

    def get_config(self) -> dict[str, object]:
        return {"id": self.codec_id, "bits": self.bits}

    def encode(self, ids: npt.ArrayLike) -> bytes:
        arr = np.asarray(ids)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise CodecError(self.codec_id, f"ids must be integers, got dtype {arr.dtype}")
        if arr.size >= 1 << 32:
            raise CodecError(self.codec_id, f"a frame holds fewer than 2**32 ids, got {arr.size}")
        native = kernels.native_module()
        if native is not None and arr.dtype.kind in "iu" and arr.dtype.isnative:
            frame: bytes | None = native.encode_frame(arr, self.bits)  # any layout: no copy
            if frame is not None:
                return frame
        flat = arr.reshape(-1)
        if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= 1 << self.bits):
            raise CodecError(
                self.codec_id,
                f"ids must lie in [0, {1 << self.bits}) for {self.bits} bits, "
                f"got range [{int(flat.min())}, {int(flat.max())}]",
            )
        n_encoded = _trimmed_size(flat)
        payload = pack_bits(flat[:n_encoded], self.bits).tobytes()
        head = HEADER.pack(MAGIC, VERSION, self.bits, 0, flat.size, n_encoded, 0)[:16]
        crc = google_crc32c.extend(google_crc32c.value(head), payload)
        return head + struct.pack("<I", crc) + payload

    def decode(self, buf: bytes | memoryview | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)
        native = kernels.native_module()
        if native is not None and (out is None or (out.dtype.kind in "iu" and out.dtype.isnative
                                                   and out.flags.writeable)):
            status, n_total, n_encoded = native.check_frame(data, self.bits)
            if status:
                self._check_frame(data)  # names the fault
                raise FormatError(_FRAME, f"invalid frame (check {status})")
            if out is None:
                out = np.empty(n_total, dtype=np.int32)
            elif out.size != n_total:
                raise FormatError(_FRAME, f"out holds {out.size} ids, the frame {n_total}")
            native.unpack(data, HEADER.size, n_encoded, self.bits, out)  # zeros after n_encoded
            return out
        n_total, n_encoded = self._check_frame(data)
        if out is not None and out.size != n_total:
            raise FormatError(_FRAME, f"out holds {out.size} ids, the frame {n_total}")
        ids = unpack_bits(data[HEADER.size :], n_encoded, self.bits)
        if out is None:
            if n_encoded == n_total:
                return ids  # a fresh array: no second pass
            out = np.zeros(n_total, dtype=np.int32)
        # reshape(-1) of a non-contiguous out is a copy: write through .flat instead
        flat_out = out.reshape(-1) if out.flags.c_contiguous else out.flat
        flat_out[:n_encoded] = ids
        flat_out[n_encoded:] = 0
        return out

    @staticmethod
    def frame_size(buf: bytes | memoryview | np.ndarray) -> int:
        """Number of ids a frame decodes to (``n_total``), read from its header without checks."""
        data = np.frombuffer(buf, dtype=np.uint8, count=min(len(buf), HEADER.size)) \
            if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)[: HEADER.size]
        if data.size < HEADER.size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {HEADER.size}-byte header")
        return int(data[8:12].view("<u4")[0])

    def _check_frame(self, data: np.ndarray) -> tuple[int, int]:
        if data.size < HEADER.size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {HEADER.size}-byte header")
        magic, version, bits, reserved, n_total, n_encoded, crc = HEADER.unpack(data[: HEADER.size].tobytes())
        if magic != MAGIC:
            raise FormatError(_FRAME, f"bad magic {magic!r} (expected {MAGIC!r})")
        payload = data[HEADER.size :]
        computed = google_crc32c.extend(google_crc32c.value(data[:16].tobytes()), np.ascontiguousarray(payload))
        if computed != crc:
            raise ChecksumError(_FRAME, (), f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}")
        if version != VERSION:
            raise FormatError(_FRAME, f"unsupported frame version {version}")
        if bits != self.bits or n_encoded > n_total:
            raise FormatError(_FRAME, f"header says {bits} bits, {n_encoded}/{n_total} ids; codec has {self.bits} bits")
        if payload.size != (n_encoded * bits + 7) // 8:
            raise FormatError(_FRAME, f"payload is {payload.size} bytes, expected {(n_encoded * bits + 7) // 8}")
        if reserved:
            raise FormatError(_FRAME, f"reserved header bytes are {reserved:#06x}, not 0")
        used = n_encoded * bits % 8
        if used and int(payload[-1]) >> used:
            raise FormatError(_FRAME, f"unused high bits of the last payload byte are set ({int(payload[-1]):#04x})")
        return n_total, n_encoded
