"""Route arrays: zarr v3 arrays of expert ids, in storage objects of codec frames.

One route array per writer commit, at ``routes/<commit>/``: shape
``(rows, num_moe_layers, top_k)``, data type int32, samples concatenated along rows.
Each storage object (key ``routes/<commit>/c/<i>/0/0``; a *shard* of zarr's sharding
codec) covers ``object_rows`` rows and every layer; inside, inner chunks of
``(chunk_rows, layers_per_chunk, top_k)`` ids are codec frames (``r3store.bitpack``;
format v2: version-2 frames bound to their place by :func:`position_tag`), stored in C
order of the inner-chunk grid, followed by the zarr sharding index (``(offset, nbytes)``
uint64 pairs per inner chunk, then its CRC-32C). See ``schema/FORMAT.md``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import google_crc32c
import numpy as np

from r3store._checks import is_int
from r3store._format._manifest import FORMAT_VERSION, MAX_ROWS
from r3store._spec import ModelSpec
from r3store.codecs import BitpackCodec, SetCodec, SupportsBatchEncode, SupportsBinding, get_codec
from r3store.errors import ChecksumError, FormatError

__all__ = [
    "EMPTY",
    "MAX_CHUNK_IDS",
    "MAX_INDEX_ENTRIES",
    "ROUTE_CODECS",
    "ArrayGeometry",
    "decode_index",
    "encode_object",
    "position_tag",
    "tag_prefix",
    "route_codec",
]

EMPTY = np.uint64(2**64 - 1)
"""Object-index entry (offset and size) of a chunk that is not stored (past the end of the array)."""
MAX_CHUNK_IDS = 1 << 26
"""Readers reject inner chunks of more ids (``chunk_rows * layers_per_chunk * top_k``)."""
MAX_INDEX_ENTRIES = 1 << 20
"""Readers reject storage objects whose index has more entries (inner chunks)."""


ROUTE_CODECS = ("bitpack", "set")
"""Codecs r3store writes route arrays with (``WriterConfig.codec``)."""


def route_codec(spec: ModelSpec, version: int = FORMAT_VERSION, codec: str = "bitpack") -> dict[str, Any]:
    """The codec config of the route arrays of a store with ``spec``: ``"bitpack"`` (format v2
    and later with version-2 frames) or ``"set"`` (format v3 and later: ``r3store.set``).

    Raises
    ------
    r3store.errors.FormatError
        ``codec`` is unknown, or ``"set"`` for a format version before 3 or a spec beyond
        its range (more than 1024 experts or top-16).

    Examples
    --------
    >>> route_codec(ModelSpec(num_layers=2, num_experts=64, top_k=2))
    {'id': 'r3store.bitpack', 'bits': 6, 'frame_version': 2}
    >>> route_codec(ModelSpec(num_layers=2, num_experts=64, top_k=2), version=1)
    {'id': 'r3store.bitpack', 'bits': 6}
    >>> route_codec(ModelSpec(num_layers=2, num_experts=64, top_k=2), codec="set")
    {'id': 'r3store.set', 'num_experts': 64, 'top_k': 2}
    """
    if codec == "set":
        if version < 3:
            raise FormatError("route array", f"codec 'set' needs format version 3 or later (got {version})")
        if spec.num_experts > SetCodec.MAX_EXPERTS or spec.top_k > SetCodec.MAX_TOP_K:
            raise FormatError("route array", f"codec 'set' holds at most {SetCodec.MAX_EXPERTS} experts and "
                                             f"top-{SetCodec.MAX_TOP_K} (got {spec.num_experts} experts, "
                                             f"top-{spec.top_k})")
        return {"id": SetCodec.codec_id, "num_experts": spec.num_experts, "top_k": spec.top_k}
    if codec != "bitpack":
        raise FormatError("route array", f"codec must be one of {ROUTE_CODECS}, got {codec!r}")
    config: dict[str, Any] = {"id": BitpackCodec.codec_id, "bits": spec.bits_per_id}
    if version >= 2:
        config["frame_version"] = 2
    return config


def tag_prefix(commit: str, store_id: str | None = None) -> str:
    """What position tags of ``commit``'s frames start with: the commit name (format v2) or
    ``"<store_id>/<commit>"`` (format v3: frames are bound to their store too, FORMAT.md 12.1).

    Examples
    --------
    >>> tag_prefix("w-00000"), tag_prefix("w-00000", "5e1f0c3a9b7d4e2f8a6c1b0d3e5f7a9c")
    ('w-00000', '5e1f0c3a9b7d4e2f8a6c1b0d3e5f7a9c/w-00000')
    """
    return commit if store_id is None else f"{store_id}/{commit}"


def position_tag(commit: str, row_chunk: int, layer_chunk: int) -> int:
    """The tag binding a frame to inner chunk ``(row_chunk, layer_chunk)`` of commit ``commit``:
    CRC-32C of the UTF-8 text ``"<commit>/<row_chunk>/<layer_chunk>"`` (decimal; ``row_chunk``
    counts inner chunks from the array's first row, ``first row // chunk_rows``).

    Examples
    --------
    >>> hex(position_tag("w-00000", 0, 0))
    '0x2472bb0'
    """
    return int(google_crc32c.value(f"{commit}/{row_chunk}/{layer_chunk}".encode()))


@dataclass(frozen=True, kw_only=True)
class ArrayGeometry:
    """Shape, codec and chunking of one route array."""

    rows: int
    """Rows of the array (sum of the samples' ``num_tokens - 1``)."""
    num_moe_layers: int
    """Stored (MoE) layers."""
    top_k: int
    """Experts per row and layer."""
    codec: dict[str, Any]
    """Config of the inner-chunk codec, ``{"id": ..., **configuration}`` (JSON values;
    build the codec with :func:`r3store.codecs.get_codec`). Read-only."""
    chunk_rows: int
    """Rows per inner chunk."""
    layers_per_chunk: int
    """Layers per inner chunk."""
    object_rows: int
    """Rows per storage object; a multiple of ``chunk_rows``."""

    def __post_init__(self) -> None:
        for name in ("num_moe_layers", "top_k", "chunk_rows", "layers_per_chunk", "object_rows"):
            if getattr(self, name) < 1:
                raise FormatError("route array", f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rows < 0 or self.object_rows % self.chunk_rows:
            raise FormatError("route array", f"bad geometry {self}")

    @classmethod
    def for_rows(cls, rows: int, *, num_moe_layers: int, top_k: int, codec: dict[str, Any], chunk_rows: int,
                 layers_per_chunk: int, object_rows: int) -> ArrayGeometry:
        """Geometry for a new array; shrinks objects and chunks to fit a small array."""
        chunk_rows = max(1, min(chunk_rows, rows))
        object_rows = max(chunk_rows, object_rows // chunk_rows * chunk_rows)
        object_rows = min(object_rows, math.ceil(max(rows, 1) / chunk_rows) * chunk_rows)
        return cls(rows=rows, num_moe_layers=num_moe_layers, top_k=top_k, codec=dict(codec), chunk_rows=chunk_rows,
                   layers_per_chunk=min(layers_per_chunk, num_moe_layers), object_rows=object_rows)

    @property
    def layer_chunks(self) -> int:
        """Inner chunks along the layer axis."""
        return math.ceil(self.num_moe_layers / self.layers_per_chunk)

    @property
    def row_chunks_per_object(self) -> int:
        """Inner chunks along the row axis of one storage object."""
        return self.object_rows // self.chunk_rows

    @property
    def num_objects(self) -> int:
        """Storage objects of the array."""
        return math.ceil(self.rows / self.object_rows)

    @property
    def chunk_size(self) -> int:
        """Ids per inner chunk."""
        return self.chunk_rows * self.layers_per_chunk * self.top_k

    @property
    def index_nbytes(self) -> int:
        """Bytes of a storage object's index, CRC included."""
        return self.row_chunks_per_object * self.layer_chunks * 16 + 4

    @staticmethod
    def object_key(i: int) -> str:
        """Key of storage object ``i`` relative to the array (``c/<i>/0/0``)."""
        return f"c/{i}/0/0"

    def to_zarr_json(self, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """The array's ``zarr.json`` document (zarr v3 array metadata)."""
        lp = self.layer_chunks * self.layers_per_chunk
        configuration = {k: v for k, v in self.codec.items() if k != "id"}
        return {
            "zarr_format": 3,
            "node_type": "array",
            "shape": [self.rows, self.num_moe_layers, self.top_k],
            "data_type": "int32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [self.object_rows, lp, self.top_k]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0,
            "codecs": [{
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [self.chunk_rows, self.layers_per_chunk, self.top_k],
                    "codecs": [{"name": self.codec["id"], "configuration": configuration}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": "end",
                },
            }],
            "attributes": attributes or {},
            "dimension_names": ["row", "moe_layer", "top_k"],
        }

    @classmethod
    def from_zarr_json(cls, doc: dict[str, Any], path: str) -> ArrayGeometry:
        """Parse a ``zarr.json`` written by :meth:`to_zarr_json`.

        The inner codec is taken as named (``{"id": name, **configuration}``); whether
        it is registered is for :func:`r3store.codecs.get_codec` to say.

        Raises
        ------
        r3store.errors.FormatError
            The document does not describe an r3store route array.
        """
        try:
            rows, num_moe_layers, top_k = _ints(doc["shape"], 3)
            outer = _ints(doc["chunk_grid"]["configuration"]["chunk_shape"], 3)
            (sharding,) = doc["codecs"]
            config = sharding["configuration"]
            chunk_rows, lpc, inner_k = _ints(config["chunk_shape"], 3)
            (inner,) = config["codecs"]
            codec = _codec_config(inner)
            ok = (doc["zarr_format"] == 3 and sharding["name"] == "sharding_indexed"
                  and config.get("index_location", "end") == "end")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(path, f"not an r3store route array ({type(exc).__name__}: {exc})") from exc
        if not ok:
            raise FormatError(path, "not an r3store route array (codecs or zarr_format differ)")
        try:
            geometry = cls(rows=rows, num_moe_layers=num_moe_layers, top_k=top_k, codec=codec, chunk_rows=chunk_rows,
                           layers_per_chunk=lpc, object_rows=outer[0])
        except FormatError as exc:
            raise FormatError(path, exc.fault) from exc
        geometry._check_bounds(path, outer, inner_k)
        return geometry

    def _check_bounds(self, path: str, outer: list[int], inner_k: int) -> None:
        """Reject a geometry no writer makes, before anything is sized from it."""
        faults = [
            (self.rows >= MAX_ROWS, f"rows {self.rows} >= {MAX_ROWS}"),
            (self.layers_per_chunk > self.num_moe_layers,
             f"layers_per_chunk {self.layers_per_chunk} > {self.num_moe_layers} layers"),
            (outer[1:] != [self.layer_chunks * self.layers_per_chunk, self.top_k] or inner_k != self.top_k,
             f"chunk shapes {outer} / {[self.chunk_rows, self.layers_per_chunk, inner_k]} do not tile the array"),
            (self.chunk_size > MAX_CHUNK_IDS, f"{self.chunk_size} ids per inner chunk > {MAX_CHUNK_IDS}"),
            (self.row_chunks_per_object * self.layer_chunks > MAX_INDEX_ENTRIES,
             f"{self.row_chunks_per_object * self.layer_chunks} inner chunks per storage object > {MAX_INDEX_ENTRIES}"),
        ]
        for bad, fault in faults:
            if bad:
                raise FormatError(path, f"not an r3store route array: {fault}")


def _codec_config(inner: Any) -> dict[str, Any]:
    """``{"id": name, **configuration}`` of a zarr codec entry (names must be str)."""
    name, configuration = inner["name"], inner.get("configuration", {})
    if not isinstance(name, str) or not isinstance(configuration, dict) or "id" in configuration:
        raise ValueError(f"codec entry {inner!r} is not {{'name': str, 'configuration': {{...}}}}")
    return {"id": name, **configuration}


def _ints(values: Any, n: int) -> list[int]:
    """``n`` JSON integers (not bools, not floats), or ValueError."""
    if not isinstance(values, list) or len(values) != n or \
            not all(is_int(v) for v in values):
        raise ValueError(f"expected {n} integers, got {values!r}")
    return list(values)


def _page_aligned(nbytes: int, align: int = 4096) -> np.ndarray:
    """An uninitialised uint8 buffer of ``nbytes`` whose first byte is ``align``-aligned."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start : start + nbytes]


def encode_object(blocks: Iterator[np.ndarray], geometry: ArrayGeometry, *, commit: str | None = None,
                  first_row_chunk: int = 0, scratch: list[np.ndarray] | None = None) -> bytes | memoryview:
    """Encode one storage object (a zarr ``sharding_indexed`` shard).

    Parameters
    ----------
    blocks : iterator of ndarray of integer dtype, shape (rows, num_moe_layers, top_k)
        Consecutive row spans of whole inner-chunk rows: ``rows`` a multiple of
        ``chunk_rows`` (one block or several), except the array's last span, which may end
        short. Spans are consumed until the object holds ``geometry.row_chunks_per_object``
        row blocks; a span must not run past the object's end. Values are ids the codec
        can hold (the writer has checked them). Each span is encoded before the next is
        requested, so the producer may reuse its buffer.
    geometry : ArrayGeometry
    commit : str, optional
        Bind each frame to its place in this commit's array (:func:`position_tag` of
        :func:`tag_prefix`: the commit, in format v3 prefixed by the store id; needs a
        codec that supports :class:`r3store.codecs.SupportsBinding`, such as version-2
        bitpack). None: unbound frames.
    first_row_chunk : int
        Row-chunk index of the object's first inner chunk in the array (object ``i``:
        ``i * geometry.row_chunks_per_object``).
    scratch : list, optional
        A one-item list holding a uint8 buffer reused from object to object (replaced
        when too small; an empty list gets one): the returned view then points into it
        and is valid until the next call with the same list. Saves faulting in fresh
        pages for every object. None: a new buffer per object.

    Returns
    -------
    bytes or memoryview
        Inner-chunk frames in C order of the inner-chunk grid, then the index and its
        CRC-32C. Inner chunks past the end of the array are marked missing. Bitpack
        objects (with the C kernels) are encoded span by span straight into one buffer,
        whose view is returned (no join of per-frame bytes).

    Raises
    ------
    ValueError
        A span runs past the object's end.
    """
    codec = get_codec(geometry.codec)
    bind = commit is not None and isinstance(codec, SupportsBinding)  # once per object: a Protocol check is slow
    prefix = google_crc32c.value(f"{commit}/".encode()) if bind else 0
    lpc, cr, per_object = geometry.layers_per_chunk, geometry.chunk_rows, geometry.row_chunks_per_object
    index = np.full((per_object, geometry.layer_chunks, 2), EMPTY, dtype="<u8")
    # bitpack: every whole row block of a span in one C call, into one buffer of the object
    fast = isinstance(codec, BitpackCodec) and geometry.num_moe_layers % lpc == 0
    out = np.empty(0, dtype=np.uint8)
    sizes = np.zeros((per_object, geometry.layer_chunks), dtype=np.int64)
    if fast:
        bound = cast(BitpackCodec, codec).frame_bound(cr * lpc * geometry.top_k)
        need = per_object * geometry.layer_chunks * bound + geometry.index_nbytes
        if scratch is not None and scratch and scratch[0].size >= need:
            out = scratch[0]
        else:
            out = _page_aligned(need)  # a local disk writes an aligned buffer with O_DIRECT (LocalBackend.set)
            if scratch is not None:
                scratch[:] = [out]
    parts: list[bytes | memoryview] = []
    offset = 0
    padded = np.zeros((cr, lpc, geometry.top_k), dtype=np.uint16)
    batch = isinstance(codec, SupportsBatchEncode) and geometry.num_moe_layers % lpc == 0
    a = 0
    while a < per_object:
        span = next(blocks, None)
        if span is None:
            break
        whole = len(span) // cr
        if a + -(-len(span) // cr) > per_object:
            raise ValueError(f"a span of {len(span)} rows runs past the object's end ({per_object - a} row "
                             f"blocks of {cr} left)")
        if fast and whole:
            n = cast(BitpackCodec, codec).encode_rows_into(
                span[: whole * cr], cr, lpc, out[offset:], sizes[a : a + whole].reshape(-1),
                prefix_crc=prefix if bind else None, first_row_chunk=first_row_chunk + a)
            if n >= 0:
                got = sizes[a : a + whole]
                index[a : a + whole, :, 1] = got
                index[a : a + whole, :, 0] = offset + (np.cumsum(got.reshape(-1)) - got.reshape(-1)).reshape(got.shape)
                offset += n
                a += whole
                span = span[whole * cr :]
        for j in range(0, len(span), cr):  # the rest block by block (a short last block, no C kernels, ...)
            rows = span[j : j + cr]
            frames = _encode_block(codec, rows, geometry, padded, prefix if bind else None, first_row_chunk + a,
                                   batch)
            for b, frame in enumerate(frames):
                size = len(frame)
                index[a, b] = (offset, size)
                if fast:
                    out[offset : offset + size] = np.frombuffer(frame, dtype=np.uint8)
                else:
                    parts.append(frame)
                offset += size
            a += 1
    raw = index.tobytes()
    crc = np.uint32(google_crc32c.value(raw)).astype("<u4").tobytes()
    if fast:
        out[offset : offset + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        out[offset + len(raw) : offset + len(raw) + 4] = np.frombuffer(crc, dtype=np.uint8)
        return out[: offset + len(raw) + 4].data
    parts.append(raw)
    parts.append(crc)
    return b"".join(parts)


def _encode_block(codec: Any, rows: np.ndarray, geometry: ArrayGeometry, padded: np.ndarray, prefix: int | None,
                  row_chunk: int, batch: bool) -> list[bytes | memoryview]:
    """The frames of one row block (layer chunk by layer chunk), bound to row chunk
    ``row_chunk`` from the commit's CRC state ``prefix`` (None: unbound)."""
    lpc, cr = geometry.layers_per_chunk, geometry.chunk_rows
    if batch and rows.shape[0] == cr:  # every frame of the block in one call
        tags = [google_crc32c.extend(prefix, f"{row_chunk}/{b}".encode()) if prefix is not None else 0
                for b in range(geometry.layer_chunks)]
        blob, sizes = cast(SupportsBatchEncode, codec).encode_chunks(rows, lpc, tags)
        view = memoryview(blob)
        starts = np.cumsum([0, *sizes])
        return [view[int(starts[b]) : int(starts[b + 1])] for b in range(len(sizes))]
    frames: list[bytes | memoryview] = []
    for b in range(geometry.layer_chunks):
        part = rows[:, b * lpc : (b + 1) * lpc]
        if part.shape != padded.shape:
            padded[...] = 0
            padded[: part.shape[0], : part.shape[1]] = part
            part = padded
        if prefix is not None:  # position_tag(commit, row chunk, b), from the commit's CRC state
            tag = google_crc32c.extend(prefix, f"{row_chunk}/{b}".encode())
            frames.append(codec.encode(part, tag=tag))
        else:
            frames.append(codec.encode(part))
    return frames


def decode_index(buf: bytes | memoryview, geometry: ArrayGeometry, array: str, i: int) -> np.ndarray:
    """Parse and verify the index of storage object ``i`` of ``array``.

    Returns
    -------
    ndarray of uint64, shape (row_chunks_per_object, layer_chunks, 2)
        ``(offset, nbytes)`` per inner chunk; ``2**64 - 1`` marks a missing chunk.

    Raises
    ------
    r3store.errors.ChecksumError
        The index CRC-32C does not match.
    r3store.errors.FormatError
        The index has the wrong size.
    """
    data = np.frombuffer(buf, dtype=np.uint8)
    if data.size != geometry.index_nbytes:
        raise FormatError(f"{array}/{ArrayGeometry.object_key(i)}",
                          f"storage object index is {data.size} bytes, expected {geometry.index_nbytes}")
    stored = int(data[-4:].view("<u4")[0])
    computed = google_crc32c.value(np.ascontiguousarray(data[:-4]))
    if stored != computed:
        raise ChecksumError(array, (i * geometry.row_chunks_per_object, 0, 0),
                            f"storage object {i} index CRC-32C mismatch: stored {stored:#010x}, "
                            f"computed {computed:#010x}")
    return data[:-4].view("<u8").reshape(geometry.row_chunks_per_object, geometry.layer_chunks, 2)
