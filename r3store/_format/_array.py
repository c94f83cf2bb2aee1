"""Route arrays: zarr v3 arrays of expert ids, sharded, with ``r3store.bitpack`` inner chunks.

One route array per committed writer shard, at ``routes/<shard>/``: shape
``(rows, num_moe_layers, top_k)``, data type int32, samples concatenated along rows.
Each storage object (a zarr *shard*, key ``routes/<shard>/c/<i>/0/0``) covers
``shard_rows`` rows and every layer; inside, inner chunks of ``(chunk_rows,
layers_per_chunk, top_k)`` ids are bitpack frames, stored in C order of the inner-chunk
grid, followed by the zarr sharding index (``(offset, nbytes)`` uint64 pairs per inner
chunk, then its CRC-32C). See ``schema/FORMAT.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from r3store._format._manifest import MAX_ROWS
from r3store.codecs import BitpackCodec
from r3store.errors import ChecksumError, FormatError

__all__ = ["MAX_CHUNK_IDS", "MAX_INDEX_ENTRIES", "ArrayLayout", "decode_index", "encode_shard"]

EMPTY = np.uint64(2**64 - 1)
ZARR_CODEC = "r3store.bitpack"
MAX_CHUNK_IDS = 1 << 26
"""Readers reject inner chunks of more ids (``chunk_rows * layers_per_chunk * top_k``)."""
MAX_INDEX_ENTRIES = 1 << 20
"""Readers reject storage objects whose index has more entries (inner chunks)."""


@dataclass(frozen=True, kw_only=True)
class ArrayLayout:
    """Geometry and chunking of one route array."""

    rows: int
    """Rows of the array (sum of the samples' ``num_tokens - 1``)."""
    num_layers: int
    """Stored (MoE) layers."""
    top_k: int
    """Experts per row and layer."""
    bits: int
    """Bits per expert id."""
    chunk_rows: int
    """Rows per inner chunk."""
    layers_per_chunk: int
    """Layers per inner chunk."""
    shard_rows: int
    """Rows per storage object; a multiple of ``chunk_rows``."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "top_k", "chunk_rows", "layers_per_chunk", "shard_rows"):
            if getattr(self, name) < 1:
                raise FormatError("route array", f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rows < 0 or self.shard_rows % self.chunk_rows:
            raise FormatError("route array", f"bad geometry {self}")

    @classmethod
    def for_rows(cls, rows: int, *, num_layers: int, top_k: int, bits: int, chunk_rows: int,
                 layers_per_chunk: int, shard_rows: int) -> ArrayLayout:
        """Layout for a new array; shrinks shards and chunks to fit a small array."""
        chunk_rows = max(1, min(chunk_rows, rows))
        shard_rows = max(chunk_rows, shard_rows // chunk_rows * chunk_rows)
        shard_rows = min(shard_rows, math.ceil(max(rows, 1) / chunk_rows) * chunk_rows)
        return cls(rows=rows, num_layers=num_layers, top_k=top_k, bits=bits, chunk_rows=chunk_rows,
                   layers_per_chunk=min(layers_per_chunk, num_layers), shard_rows=shard_rows)

    @property
    def layer_chunks(self) -> int:
        """Inner chunks along the layer axis."""
        return math.ceil(self.num_layers / self.layers_per_chunk)

    @property
    def row_chunks_per_shard(self) -> int:
        return self.shard_rows // self.chunk_rows

    @property
    def num_shards(self) -> int:
        return math.ceil(self.rows / self.shard_rows)

    @property
    def chunk_size(self) -> int:
        """Ids per inner chunk."""
        return self.chunk_rows * self.layers_per_chunk * self.top_k

    @property
    def index_nbytes(self) -> int:
        """Bytes of a shard's index, CRC included."""
        return self.row_chunks_per_shard * self.layer_chunks * 16 + 4

    @staticmethod
    def shard_key(shard: int) -> str:
        return f"c/{shard}/0/0"

    def to_zarr_json(self, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The array's ``zarr.json`` document (zarr v3 array metadata)."""
        lp = self.layer_chunks * self.layers_per_chunk
        return {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [self.rows, self.num_layers, self.top_k],
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.shard_rows, lp, self.top_k]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [{
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [self.chunk_rows, self.layers_per_chunk, self.top_k],
                    "codecs": [{"name": ZARR_CODEC, "configuration": {"bits": self.bits}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": "end",
                },
            }],
            "attributes": attributes or {},
            "dimension_names": ["row", "moe_layer", "top_k"],
        }

    @classmethod
    def from_zarr_json(cls, doc: dict[str, Any], path: str) -> ArrayLayout:
        """Parse a ``zarr.json`` written by :meth:`to_zarr_json`.

        Raises
        ------
        r3store.errors.FormatError
            The document does not describe an r3store route array.
        """
        try:
            rows, num_layers, top_k = _ints(doc["shape"], 3)
            outer = _ints(doc["chunk_grid"]["configuration"]["chunk_shape"], 3)
            (sharding,) = doc["codecs"]
            config = sharding["configuration"]
            chunk_rows, lpc, inner_k = _ints(config["chunk_shape"], 3)
            (inner,) = config["codecs"]
            ok = (doc["zarr_format"] == 3 and sharding["name"] == "sharding_indexed"
                  and inner["name"] == ZARR_CODEC and config.get("index_location", "end") == "end")
            (bits,) = _ints([inner["configuration"]["bits"]], 1)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(path, f"not an r3store route array ({type(exc).__name__}: {exc})") from exc
        if not ok:
            raise FormatError(path, "not an r3store route array (codecs or zarr_format differ)")
        try:
            layout = cls(rows=rows, num_layers=num_layers, top_k=top_k, bits=bits, chunk_rows=chunk_rows,
                         layers_per_chunk=lpc, shard_rows=outer[0])
        except FormatError as exc:
            raise FormatError(path, exc.fault) from exc
        layout._check_bounds(path, outer, inner_k)
        return layout

    def _check_bounds(self, path: str, outer: list[int], inner_k: int) -> None:
        """Reject a geometry no writer makes, before anything is sized from it."""
        faults = [
            (self.rows >= MAX_ROWS, f"rows {self.rows} >= {MAX_ROWS}"),
            (self.layers_per_chunk > self.num_layers,
             f"layers_per_chunk {self.layers_per_chunk} > {self.num_layers} layers"),
            (outer[1:] != [self.layer_chunks * self.layers_per_chunk, self.top_k] or inner_k != self.top_k,
             f"chunk shapes {outer} / {[self.chunk_rows, self.layers_per_chunk, inner_k]} do not tile the array"),
            (self.chunk_size > MAX_CHUNK_IDS, f"{self.chunk_size} ids per inner chunk > {MAX_CHUNK_IDS}"),
            (self.row_chunks_per_shard * self.layer_chunks > MAX_INDEX_ENTRIES,
             f"{self.row_chunks_per_shard * self.layer_chunks} inner chunks per storage object > {MAX_INDEX_ENTRIES}"),
        ]
        for bad, fault in faults:
            if bad:
                raise FormatError(path, f"not an r3store route array: {fault}")


def _ints(values: Any, n: int) -> list[int]:
    """``n`` JSON integers (not bools, not floats), or ValueError."""
    if not isinstance(values, list) or len(values) != n or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"expected {n} integers, got {values!r}")
    return list(values)


def encode_shard(blocks: Iterator[np.ndarray], layout: ArrayLayout) -> bytes:
    """Encode one shard (a zarr ``sharding_indexed`` object).

    Parameters
    ----------
    blocks : iterator of ndarray of integer dtype, shape (<= chunk_rows, num_layers, top_k)
        Consecutive row blocks; up to ``layout.row_chunks_per_shard`` of them are
        consumed. Only the last block of the array may be short. Values lie in
        ``[0, 2**bits)``. Each block is encoded before the next is requested, so the
        producer may reuse its buffer.
    layout : ArrayLayout

    Returns
    -------
    bytes
        Inner-chunk frames in C order of the inner-chunk grid, then the index and its
        CRC-32C. Inner chunks past the end of the array are marked missing.
    """
    codec = BitpackCodec(layout.bits)
    lpc, cr = layout.layers_per_chunk, layout.chunk_rows
    index = np.full((layout.row_chunks_per_shard, layout.layer_chunks, 2), EMPTY, dtype="<u8")
    parts: list[bytes] = []
    offset = 0
    padded = np.zeros((cr, lpc, layout.top_k), dtype=np.uint16)
    for a in range(layout.row_chunks_per_shard):
        rows = next(blocks, None)
        if rows is None:
            break
        for b in range(layout.layer_chunks):
            part = rows[:, b * lpc : (b + 1) * lpc]
            if part.shape != padded.shape:
                padded[...] = 0
                padded[: part.shape[0], : part.shape[1]] = part
                part = padded
            frame = codec.encode(part)
            index[a, b] = (offset, len(frame))
            parts.append(frame)
            offset += len(frame)
    raw = index.tobytes()
    parts.append(raw)
    parts.append(np.uint32(google_crc32c.value(raw)).astype("<u4").tobytes())
    return b"".join(parts)


def decode_index(buf: bytes | memoryview, layout: ArrayLayout, array: str, shard: int) -> np.ndarray:
    """Parse and verify a shard index.

    Returns
    -------
    ndarray of uint64, shape (row_chunks_per_shard, layer_chunks, 2)
        ``(offset, nbytes)`` per inner chunk; ``2**64 - 1`` marks a missing chunk.

    Raises
    ------
    r3store.errors.ChecksumError
        The index CRC-32C does not match.
    r3store.errors.FormatError
        The index has the wrong size.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    if data.size != layout.index_nbytes:
        raise FormatError(f"{array}/{ArrayLayout.shard_key(shard)}",
                          f"shard index is {data.size} bytes, expected {layout.index_nbytes}")
    stored = int(data[-4:].view("<u4")[0])
    computed = google_crc32c.value(np.ascontiguousarray(data[:-4]))
    if stored != computed:
        raise ChecksumError(array, (shard * layout.row_chunks_per_shard, 0, 0),
                            f"shard {shard} index CRC-32C mismatch: stored {stored:#010x}, computed {computed:#010x}")
    return data[:-4].view("<u8").reshape(layout.row_chunks_per_shard, layout.layer_chunks, 2)
