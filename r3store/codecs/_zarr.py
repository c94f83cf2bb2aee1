"""zarr-python v3 adapters for ``r3store.bitpack`` and ``r3store.set``.

Registered under zarr's ``zarr.codecs`` entry-point group, so ``zarr.open_array`` reads
r3store route arrays once r3store is installed, without importing it. It checks every
frame's CRC-32C and that the frame holds exactly the ids of its chunk (read from zarr's
chunk spec, before anything is allocated), but not position tags: zarr does not tell
codecs which chunk they decode, so frames of a format v2 array read through zarr are not
checked against their place (r3store's own reader checks them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import parse_named_configuration

from r3store.codecs._bitpack import MAGIC, BitpackCodec, check_zero_tail
from r3store.codecs._set import SetCodec
from r3store.errors import FormatError

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

__all__ = ["ZarrBitpackCodec", "ZarrSetCodec"]


class _ZarrAdapter(ArrayBytesCodec):
    """What both adapters share: the codec name, ``from_dict`` through the r3store codec's own
    checks, an integer data type, frames of data-dependent size, and decode/encode through
    the r3store codec (:meth:`_codec`) into the chunk's own buffers."""

    is_fixed_size = False

    codec_id: ClassVar[str]
    """The zarr codec name (the r3store codec's ``codec_id``)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        _, config = parse_named_configuration(data, cls.codec_id)
        return cls(**config)  # JSON values, checked by the r3store codec the constructor builds

    def validate(self, *, shape: tuple[int, ...], dtype: Any, chunk_grid: Any) -> None:
        if not np.issubdtype(dtype.to_native_dtype(), np.integer):
            raise TypeError(f"{self.codec_id} needs an integer data type, got {dtype}")

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError(f"{self.codec_id} frames have a data-dependent size")

    def _codec(self) -> BitpackCodec | SetCodec:
        """The r3store codec of this configuration."""
        raise NotImplementedError

    def _check_frame(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> None:
        """Refuse a frame that cannot be the chunk's before anything is allocated (default: no check)."""

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        self._check_frame(chunk_bytes, chunk_spec)
        out = np.empty(chunk_spec.shape, dtype=chunk_spec.dtype.to_native_dtype())
        self._codec().decode(chunk_bytes.as_numpy_array(), out=out)
        return chunk_spec.prototype.nd_buffer.from_numpy_array(out)

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        buf = self._codec().encode(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(buf)


@dataclass(frozen=True)
class ZarrBitpackCodec(_ZarrAdapter):
    """zarr v3 array-to-bytes codec ``r3store.bitpack`` (see :class:`r3store.codecs.BitpackCodec`).

    Parameters
    ----------
    bits : int
        Bits per id, 1 to 16.
    frame_version : {1, 2}
        Version of the frames written (both are read); version-2 frames written through
        zarr are unbound (tag 0).
    """

    codec_id: ClassVar[str] = BitpackCodec.codec_id

    bits: int
    frame_version: int

    def __init__(self, *, bits: int, frame_version: int = 1) -> None:
        codec = BitpackCodec(bits, frame_version)
        object.__setattr__(self, "bits", codec.bits)
        object.__setattr__(self, "frame_version", codec.frame_version)

    def to_dict(self) -> dict[str, Any]:
        config = BitpackCodec(self.bits, self.frame_version).get_config()
        return {"name": BitpackCodec.codec_id, "configuration": {k: v for k, v in config.items() if k != "id"}}

    def _codec(self) -> BitpackCodec:
        return BitpackCodec(self.bits, self.frame_version)

    def _check_frame(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> None:
        # the header is checked against the chunk's shape before anything is allocated: a frame
        # of another size, or one asking for more zeros than MAX_ZERO_TAIL_IDS, is refused
        data = chunk_bytes.as_numpy_array().view(np.uint8).reshape(-1)
        want = math.prod(chunk_spec.shape)
        if len(data) >= 16 and bytes(data[:4]) == MAGIC:
            n_total, n_encoded = (int(v) for v in data[8:16].view("<u4"))
            if n_total != want:
                raise FormatError("r3store.bitpack frame", f"frame of another chunk size: out holds {want} ids, the "
                                                           f"frame {n_total} (chunk shape {tuple(chunk_spec.shape)})")
            check_zero_tail(n_total, min(n_encoded, n_total), len(data))


@dataclass(frozen=True)
class ZarrSetCodec(_ZarrAdapter):
    """zarr v3 array-to-bytes codec ``r3store.set`` (see :class:`r3store.codecs.SetCodec`).

    Chunks read through zarr hold each set row ascending, as r3store's reader returns
    them; frames written through zarr are unbound (tag 0).

    Parameters
    ----------
    num_experts : int
        1 to 1024.
    top_k : int
        1 to ``min(16, num_experts)``; the chunk's ids are read in C order, ``top_k`` to a row.
    """

    codec_id: ClassVar[str] = SetCodec.codec_id

    num_experts: int
    top_k: int

    def __init__(self, *, num_experts: int, top_k: int) -> None:
        codec = SetCodec(num_experts, top_k)
        object.__setattr__(self, "num_experts", codec.num_experts)
        object.__setattr__(self, "top_k", codec.top_k)

    def to_dict(self) -> dict[str, Any]:
        return {"name": SetCodec.codec_id, "configuration": {"num_experts": self.num_experts, "top_k": self.top_k}}

    def _codec(self) -> SetCodec:
        return SetCodec(self.num_experts, self.top_k)
