"""zarr-python v3 adapter for ``r3store.bitpack``.

Registered under zarr's ``zarr.codecs`` entry-point group, so ``zarr.open_array`` reads
r3store route arrays once r3store is installed, without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import ArrayBytesCodec
from zarr.core.common import parse_named_configuration

from r3store.codecs._bitpack import BitpackCodec

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

__all__ = ["ZarrBitpackCodec"]


@dataclass(frozen=True)
class ZarrBitpackCodec(ArrayBytesCodec):
    """zarr v3 array-to-bytes codec ``r3store.bitpack`` (see :class:`r3store.codecs.BitpackCodec`).

    Parameters
    ----------
    bits : int
        Bits per id, 1 to 16.
    """

    is_fixed_size = False

    bits: int

    def __init__(self, *, bits: int) -> None:
        object.__setattr__(self, "bits", BitpackCodec(bits).bits)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        _, config = parse_named_configuration(data, BitpackCodec.codec_id)
        return cls(**config)  # type: ignore[arg-type]  # JSON values, checked by BitpackCodec

    def to_dict(self) -> dict[str, Any]:
        return {"name": BitpackCodec.codec_id, "configuration": {"bits": self.bits}}

    def validate(self, *, shape: tuple[int, ...], dtype: Any, chunk_grid: Any) -> None:
        if not np.issubdtype(dtype.to_native_dtype(), np.integer):
            raise TypeError(f"{BitpackCodec.codec_id} needs an integer data type, got {dtype}")

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        ids = BitpackCodec(self.bits).decode(chunk_bytes.as_numpy_array())
        native = chunk_spec.dtype.to_native_dtype()
        return chunk_spec.prototype.nd_buffer.from_numpy_array(ids.astype(native).reshape(chunk_spec.shape))

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        buf = BitpackCodec(self.bits).encode(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(buf)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("r3store.bitpack frames have a data-dependent size")
