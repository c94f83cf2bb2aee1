"""The chunk reader: rows of committed route arrays, read through the fewest ranged requests.

For a row range and a set of stored layer positions it reads each storage object's index
(its last bytes, CRC-checked), coalesces the byte ranges of the needed frames (frames of
consecutive chunks are written back to back), fetches them, checks each frame's id count,
decodes it with the codec the array metadata names (through the codec registry) into a
buffer of the chunk's size, checks (format v2) that the frame is bound to the place it
is read from, and keeps decoded chunks in an LRU cache bounded in bytes.

Before any frame, an array's ``zarr.json`` is checked against its commit: the commit it
names, its format version, its spec (equal to the manifest's) and its geometry.

Not thread-safe (the cache is shared state): give every thread its own reader
(:meth:`ChunkReader.fork`).
"""

from __future__ import annotations

import copy
import inspect
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar, cast

import cachetools
import numpy as np

from r3store._checks import parse_int
from r3store._format import (
    EMPTY,
    MANIFEST_KEY,
    ROUTES_PREFIX,
    ArrayGeometry,
    Manifest,
    decode_index,
    loads_document,
    position_tag,
    route_codec,
    tag_prefix,
)
from r3store._spec import ModelSpec
from r3store.codecs import (
    BitpackCodec,
    Codec,
    SetCodec,
    SupportsBatchDecode,
    SupportsBinding,
    SupportsFrameSize,
    get_codec,
)
from r3store.errors import (
    ChecksumError,
    CodecError,
    FormatError,
    OptionError,
    SpecConflictError,
    SpecError,
    StorageError,
    StoreIdentityError,
    UnknownCodecError,
)
from r3store.reader._pool import BufferPool
from r3store.storage import Backend, ByteRange, SuffixByteRange

__all__ = ["ChunkReader", "merge_ranges"]

K = TypeVar("K")

INDEX_CACHE_BYTES = 64 << 20
"""Verified storage-object indexes kept per reader (least recently used dropped first): an
index takes 16 bytes per inner chunk, about 0.45% of the packed routes at 128-row chunks."""
LAYER_PLANS = 64
"""Layer plans (:meth:`ChunkReader._layer_plan`: how a set of stored layer positions maps onto
layer chunks) kept per reader, for as many distinct layer selections."""
MAX_PLACE_SEARCH = 1 << 16
"""Places tried when naming where an out-of-place frame belongs."""

Chunk = tuple[int, int]
"""(row chunk, layer chunk) of an array's inner-chunk grid."""


def merge_ranges(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort half-open ranges and merge the overlapping or touching ones; drop empty ones.

    Used for byte ranges (frames written back to back become one request) and row
    ranges (each chunk of an audit is read once).

    Examples
    --------
    >>> merge_ranges([(10, 20), (0, 4), (4, 6), (15, 30), (7, 7)])
    [(0, 6), (10, 30)]
    """
    merged: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _range_heads(offsets: np.ndarray, ends: np.ndarray, row_chunks: np.ndarray, gap: int) -> np.ndarray:
    """Which frames (sorted by offset) start a new ranged request: bool per frame.

    Frames overlapping or touching the bytes before them join them. A hole of at most
    ``gap`` bytes (:attr:`r3store.storage.Backend.coalesce_gap`) is read through when it
    separates frames of the same or adjacent row chunks: the hole then holds only layer
    chunks the read skips (a pipeline stage's layer subset), never rows of another rank, so
    a CP/SP rank's bytes stay within its own rows' frames.
    """
    if not len(offsets):
        return np.zeros(0, dtype=bool)
    reach = np.maximum.accumulate(ends)[:-1]
    hole = np.where(np.abs(np.diff(row_chunks)) <= 1, gap, 0)
    heads: np.ndarray = np.concatenate([[True], offsets[1:] > reach + hole])
    return heads


class ChunkReader:
    """Reads rows of the committed route arrays of one store.

    Parameters
    ----------
    backend : Backend
    manifest : Manifest
        The store's manifest; every array must agree with its spec and format version.
    array_rows : mapping of str to int
        Rows each committed route array must have (from the sample catalogue); arrays
        not named here are refused.
    cache_bytes : int
        Budget for decoded chunks kept in memory.
    pool : BufferPool, optional
        Where :meth:`read_rows` builds the arrays it returns (default: a pool of 0 bytes,
        plain ``numpy.empty``).
    """

    def __init__(self, backend: Backend, manifest: Manifest, array_rows: Mapping[str, int], *,
                 cache_bytes: int = 64 << 20, pool: BufferPool | None = None) -> None:
        self.pool = BufferPool(0) if pool is None else pool
        self.backend = backend
        self.manifest = manifest
        self.spec: ModelSpec = manifest.spec
        self.array_rows = array_rows
        self._geometries: dict[str, tuple[ArrayGeometry, Codec]] = {}
        self._indexes: ByteLRU[tuple[str, int]] = ByteLRU(INDEX_CACHE_BYTES)
        self._chunks: ByteLRU[tuple[str, int, int]] = ByteLRU(parse_int("cache_bytes", cache_bytes, minimum=0))
        self._prefetched: dict[str, bytes] = {}
        self._layer_plans: dict[tuple[int, tuple[int, ...]], Any] = {}

    @property
    def cache_bytes(self) -> int:
        """Budget for decoded chunks kept in memory (settable: the chunks kept are kept while they fit)."""
        return int(self._chunks.maxsize)

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        self._chunks = self._chunks.resized(parse_int("cache_bytes", value, minimum=0))

    # -- geometry ---------------------------------------------------------------------

    def geometry(self, array: str, *, partial: bool = False) -> ArrayGeometry:
        """Shape, codec and chunking of a committed route array (see :meth:`RouteReader.geometry_of`)."""
        return self._geometry(array, partial)[0]

    def _geometry(self, array: str, partial: bool) -> tuple[ArrayGeometry, Codec]:
        path = self.backend.path_of(f"{array}/zarr.json")
        expected = self.array_rows.get(array)
        if expected is None:
            raise FormatError(path, f"{array!r} is not a committed route array (no sample table names it)")
        known = self._geometries.get(array)
        if known is None:
            raw = self._prefetched.pop(array, None)
            doc = loads_document(self.backend.get(f"{array}/zarr.json") if raw is None else raw, path)
            geometry = ArrayGeometry.from_zarr_json(doc, path)
            self._check_attributes(doc, array, path)
            codec = _expected_codec(geometry.codec["id"], self.spec, self.manifest.version, path)
            if (geometry.num_moe_layers, geometry.top_k) != (self.spec.num_moe_layers, self.spec.top_k) or \
                    (codec is not None and geometry.codec != codec):
                raise FormatError(path, f"array geometry {geometry} disagrees with the manifest spec (codec "
                                        f"{codec or route_codec(self.spec, self.manifest.version)} expected)")
            known = self._geometries[array] = (geometry, _build_codec(geometry.codec, path))
        geometry = known[0]
        if geometry.rows > expected or (geometry.rows < expected and not partial):
            raise FormatError(path, f"array has {geometry.rows} rows; its sample table ends at row {expected}")
        return known

    def _check_attributes(self, doc: dict[str, Any], array: str, path: str) -> None:
        """``attributes.r3store`` names this array's commit (and format version) and the manifest's spec."""
        attrs = doc.get("attributes")
        ours = attrs.get("r3store") if isinstance(attrs, dict) else None
        commit = array.removeprefix(ROUTES_PREFIX)
        key = "commit" if self.manifest.version >= 2 else "shard"
        if not isinstance(ours, dict) or ours.get(key) != commit:
            named = ours.get(key) if isinstance(ours, dict) else None
            raise FormatError(path, f"attributes.r3store.{key} is {named!r}, not {commit!r}: the array document of "
                                    "another commit")
        if self.manifest.version >= 2 and ours.get("format_version") != self.manifest.version:
            raise FormatError(path, f"attributes.r3store.format_version is {ours.get('format_version')!r} in a "
                                    f"format version {self.manifest.version} store")
        if self.manifest.version >= 3 and ours.get("store_id") != self.manifest.store_id:
            raise StoreIdentityError(path, self.manifest.store_id, str(ours.get("store_id"))[:64],
                                     "route array document")
        try:
            found = ModelSpec.from_dict(ours.get("spec", {})).to_dict()
        except SpecError as exc:
            raise FormatError(path, f"attributes.r3store.spec is not a valid spec: {exc}") from exc
        if found != self.spec.to_dict():
            raise SpecConflictError(path, self.backend.path_of(MANIFEST_KEY), dict(self.spec.to_dict()), dict(found))

    # -- rows -------------------------------------------------------------------------

    def read_rows(self, array: str, start: int, stop: int, positions: Sequence[int],
                  out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of a route array at stored layer positions (see
        :meth:`RouteReader.read_rows`)."""
        if start < 0:
            raise OptionError("start", start, "must be >= 0")
        geometry, codec = self._geometry(array, partial=True)
        if stop > geometry.rows:
            raise FormatError(self.backend.path_of(array),
                              f"rows [{start}, {stop}) beyond the array's {geometry.rows} rows")
        shape = (stop - start, len(positions), geometry.top_k)
        if out is None and stop > start and len(positions):
            per_object = geometry.row_chunks_per_object * geometry.chunk_rows
            for obj in range(start // per_object, (stop - 1) // per_object + 1):  # checked before the allocation
                self.object_index(array, geometry, obj)
            # the rows of the first and last chunks outside [start, stop) get room before and after the
            # result (a view): every chunk then decodes in place, none through a scratch and a copy
            cr = geometry.chunk_rows
            lead, tail = start % cr, -stop % cr
            room = self.pool.empty((lead + stop - start + tail, *shape[1:]), np.int32)
            self._read(array, geometry, codec, [(start - lead, stop + tail, 0)], positions, room, remember=False)
            if self._chunks.maxsize and (lead or tail):  # the chunks this sample shares with its neighbours
                self._remember_edges(array, geometry, positions, room, start - lead)
            return room[lead : lead + stop - start]
        if out is None:
            out = self.pool.empty(shape, np.int32)
        elif out.shape != shape:
            raise OptionError("out", f"<array of shape {out.shape}>", f"must have shape {shape}")
        if stop <= start or not len(positions):
            return out
        return self._read(array, geometry, codec, [(start, stop, 0)], positions, out, remember=True)

    def _remember_edges(self, array: str, geometry: ArrayGeometry, positions: Sequence[int], room: np.ndarray,
                        first_row: int) -> None:
        """Cache the first and last row chunks of ``room`` (array rows from ``first_row``, whole
        chunks, at ``positions``) for the layer chunks read whole: what :meth:`_read` caches when
        it decodes a sample's partial edge chunks through a scratch."""
        cr, lpc = geometry.chunk_rows, geometry.layers_per_chunk
        pos = np.asarray(positions)
        c0, c1 = first_row // cr, first_row // cr + len(room) // cr - 1
        for b in np.unique(pos // lpc).tolist():
            at = np.flatnonzero(pos // lpc == b)
            if not (np.array_equal(pos[at], np.arange(b * lpc, (b + 1) * lpc))
                    and np.array_equal(at, np.arange(at[0], at[0] + lpc))):
                continue  # the layer chunk is not read whole, in order, to adjacent outputs: not kept
            for c in {c0, c1}:
                r = (c - c0) * cr
                self._remember(array, c, b, room[r : r + cr, at[0] : at[0] + lpc].copy())  # never a view of the result

    def read_runs(self, array: str, runs: Sequence[tuple[int, int, int]], positions: Sequence[int],
                  out: np.ndarray) -> np.ndarray:
        """Several row ranges of a route array at stored layer positions, into ``out``.

        The rank-local read: each needed frame is fetched once (frames of several runs in
        one storage object coalesce into one ranged request per contiguous byte span). A
        chunk whose rows all land in one run and whose layers are all wanted, in order, is
        decoded in place (with the compiled kernels, all such frames of a fetched range in
        one :func:`r3store.codecs.kernels.decode_frames` call); the others are decoded one
        at a time and copied. Decoded chunks are taken from the cache when there but not
        added to it, so the scratch is the packed bytes of one storage object's needed
        frames plus one decoded chunk.

        Parameters
        ----------
        array : str
        runs : sequence of (start, stop, at)
            Half-open array row ranges ``[start, stop)`` within the array (any order), each
            copied to output rows ``[at, at + stop - start)``.
        positions : sequence of int
            Stored layer positions, in output order.
        out : ndarray of integer dtype, shape (n, len(positions), top_k)
            Receives the runs (ids cast to its dtype; rows no run names are left alone).

        Returns
        -------
        ndarray
            ``out``.

        Raises
        ------
        r3store.errors.FormatError
            A run lies past the array's end, or a frame or index is malformed.
        r3store.errors.ChecksumError
        r3store.errors.OptionError
            A run is reversed or negative, or ``out`` has the wrong shape.
        """
        geometry, codec = self._geometry(array, partial=True)
        if out.ndim != 3 or out.shape[1:] != (len(positions), geometry.top_k):
            raise OptionError("out", f"<array of shape {out.shape}>",
                              f"must have shape (n, {len(positions)}, {geometry.top_k})")
        for start, stop, at in runs:
            if start < 0 or stop < start or at < 0 or at + stop - start > len(out):
                raise OptionError("runs", (start, stop, at), f"must be ranges 0 <= start <= stop whose output "
                                                             f"rows lie within the {len(out)} of out")
            if stop > geometry.rows:
                raise FormatError(self.backend.path_of(array),
                                  f"rows [{start}, {stop}) beyond the array's {geometry.rows} rows")
        if not len(positions):
            return out
        return self._read(array, geometry, codec, runs, positions, out, remember=False)

    def _read(self, array: str, geometry: ArrayGeometry, codec: Codec, runs: Sequence[tuple[int, int, int]],
              positions: Sequence[int], out: np.ndarray, *, remember: bool) -> np.ndarray:
        """The runs (checked) into ``out``: whole chunks decoded in place, by one batch call per
        fetched range for a :class:`~r3store.codecs.SupportsBatchDecode` codec; the others decoded
        one by one and copied (and cached with ``remember``: the first and last chunks of a
        sample, which its neighbours share)."""
        lpc, cr, per_object = geometry.layers_per_chunk, geometry.chunk_rows, geometry.row_chunks_per_object
        by_chunk, whole, layer_chunks, layer_place = self._layer_plan(lpc, positions)
        # the pieces the runs cut the row chunks into, grouped by chunk (a run's order kept within one):
        # row chunk, first row, stop row, output row of the first
        table = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
        table = table[table[:, 1] > table[:, 0]]
        first_c, counts = table[:, 0] // cr, (table[:, 1] - 1) // cr - table[:, 0] // cr + 1
        run_of = np.repeat(np.arange(len(table)), counts)
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)  # chunk of its run
        p_chunk = np.repeat(first_c, counts) + within
        p_lo, p_hi = np.maximum(table[run_of, 0], p_chunk * cr), np.minimum(table[run_of, 1], (p_chunk + 1) * cr)
        p_at = table[run_of, 2] + p_lo - table[run_of, 0]
        if len(p_chunk) > 1 and (p_chunk[1:] < p_chunk[:-1]).any():  # runs in output order need not be in row order
            order = np.argsort(p_chunk, kind="stable")
            p_chunk, p_lo, p_hi, p_at = p_chunk[order], p_lo[order], p_hi[order], p_at[order]
        begin = np.flatnonzero(np.concatenate(([True], p_chunk[1:] != p_chunk[:-1]))) if len(p_chunk) else \
            np.zeros(0, dtype=np.int64)
        chunks, per_chunk = p_chunk[begin], np.diff(np.append(begin, len(p_chunk)))
        whole_piece = (per_chunk == 1) & (p_lo[begin] == chunks * cr) & (p_hi[begin] == (chunks + 1) * cr)
        chunk_place = np.where(whole_piece, p_at[begin], -1)  # per chunk: the output row it decodes in place to
        piece_map: dict[int, list[tuple[int, int, int]]] = {}

        def pieces(c: int) -> list[tuple[int, int, int]]:
            """The pieces (first row, stop row, output row of the first) row chunk ``c`` serves
            (looked up per chunk asked: a read asks it of its partial chunks only)."""
            known = piece_map.get(c)
            if known is None:
                i = int(np.searchsorted(chunks, c))
                if i >= len(chunks) or int(chunks[i]) != c:
                    raise KeyError(c)
                c0, n0 = int(begin[i]), int(per_chunk[i])
                known = piece_map[c] = list(zip(p_lo[c0 : c0 + n0].tolist(), p_hi[c0 : c0 + n0].tolist(),
                                                p_at[c0 : c0 + n0].tolist(), strict=True))
            return known


        def into(key: Chunk) -> tuple[int, int] | None:
            """Where a frame decodes in place (output row, output layer): its rows form one whole
            piece, and its layers are wanted whole and in order."""
            c, b = key
            if b not in whole or len(pieces(c)) != 1:
                return None
            lo, hi, o = pieces(c)[0]
            dst = by_chunk[b][0]
            return (o, dst.start) if (lo, hi) == (c * cr, (c + 1) * cr) and isinstance(dst, slice) else None

        def copy(c: int, b: int, chunk: np.ndarray) -> None:
            dst, src = by_chunk[b]
            for lo, hi, o in pieces(c):
                out[o : o + hi - lo, dst] = chunk[lo - c * cr : hi - c * cr, src]

        fast = _batch_decodes(codec) and _batch_target(out)
        if not len(chunks):  # empty runs only
            return out
        objects = chunks // per_object
        cuts = (np.flatnonzero(np.diff(objects)) + 1).tolist()
        for lo_i, hi_i in zip([0, *cuts], [*cuts, len(chunks)], strict=True):
            obj, row_chunks = int(objects[lo_i]), chunks[lo_i:hi_i]
            piece_rows = (p_lo, p_hi, p_at, p_chunk, begin[lo_i:hi_i], per_chunk[lo_i:hi_i])
            if fast and self._read_object_fast(array, geometry, codec, obj, row_chunks, layer_chunks,
                                               chunk_place[lo_i:hi_i], layer_place, copy, out, remember, piece_rows):
                continue
            wanted = [(c, b) for c in row_chunks.tolist() for b in by_chunk]
            for (c, b), chunk in self._stream_object(array, geometry, codec, obj, wanted, into, out):
                if chunk is not None:  # else decoded in place
                    copy(c, b, chunk)
                    if remember:
                        self._remember(array, c, b, chunk)
        return out

    def _layer_plan(self, lpc: int, positions: Sequence[int]) -> tuple[
            dict[int, tuple[slice | np.ndarray, slice | np.ndarray]], set[int], np.ndarray, np.ndarray]:
        """How stored layer positions map onto layer chunks (the same for every read of these
        positions; kept per reader): per layer chunk, its output layers and in-chunk layers
        (slices when runs); the layer chunks wanted whole and in order (decoded in place); the
        layer chunks, sorted (int64); and per layer chunk, the output layer it decodes in place
        to, or -1."""
        key = (lpc, tuple(positions))
        plan = self._layer_plans.get(key)
        if plan is None:
            pos = np.asarray(positions, dtype=np.int64)
            by_chunk = {int(b): _as_slices(np.flatnonzero(pos // lpc == b), pos, b * lpc)
                        for b in np.unique(pos // lpc)}
            whole = {b for b, (dst, src) in by_chunk.items()
                     if isinstance(dst, slice) and isinstance(src, slice) and src == slice(0, lpc)}
            layer_chunks = np.array(sorted(by_chunk), dtype=np.int64)
            layer_place = np.array([by_chunk[b][0].start if b in whole else -1  # type: ignore[union-attr]
                                    for b in sorted(by_chunk)], dtype=np.int64)
            if len(self._layer_plans) >= LAYER_PLANS:
                self._layer_plans.clear()
            plan = self._layer_plans[key] = (by_chunk, whole, layer_chunks, layer_place)
        return plan

    def _read_object_fast(self, array: str, geometry: ArrayGeometry, codec: Codec, obj: int, row_chunks: np.ndarray,
                          layer_chunks: np.ndarray, row_place: np.ndarray, layer_place: np.ndarray,
                          copy: Callable[[int, int, np.ndarray], None], out: np.ndarray, remember: bool,
                          pieces: tuple[np.ndarray, ...]) -> bool:
        """The frames of ``row_chunks`` x ``layer_chunks`` of one storage object, vectorised: index
        entries looked up, ranges merged and whole chunks decoded in place by one kernel call
        per fetched range. A run's partial first and last chunks (a CP rank's pieces) whose
        layers are read whole are decoded in place too, by the same call, when the codec's
        ``decode_frames`` takes row ranges (``row_first``/``row_count``, as
        :class:`~r3store.codecs.BitpackCodec`'s does) and they need not be cached;
        the others go by one more call per range into a scratch of whole chunks, then copied.
        ``row_chunks``, ``layer_chunks``: sorted int64. ``row_place``/``layer_place``: per row chunk and layer chunk,
        the output row or layer it decodes in place to, or -1. ``pieces``: the first rows, stop
        rows, output rows and row chunks of the pieces the runs cut, grouped by chunk, then per
        row chunk its first piece and piece count. ``remember``: cache the chunks decoded
        through the scratch.
        False, having read nothing, when an index entry is unusual (a chunk past the array's
        end, a bad entry): the caller's general path handles (or names) it."""
        index = self.object_index(array, geometry, obj)
        first = obj * geometry.row_chunks_per_object
        nr, nl = len(row_chunks), len(layer_chunks)
        rc, lc = np.repeat(row_chunks, nl), np.tile(layer_chunks, nr)
        rows_at, layers_at = np.repeat(row_place, nl), np.tile(layer_place, nr)
        chunk_at = np.repeat(np.arange(nr), nl)  # the frame's row chunk, as a position in row_chunks
        entries = index[row_chunks - first][:, layer_chunks].reshape(-1, 2)
        cached = self._chunks and any((array, int(c), int(b)) in self._chunks for c, b in zip(rc, lc, strict=True))
        if cached or (entries >= np.uint64(1 << 62)).any() or not entries[:, 1].all():
            return False
        offsets, nbytes = entries[:, 0].astype(np.int64), entries[:, 1].astype(np.int64)
        if (offsets[1:] < offsets[:-1]).any():  # frames are written in (row chunk, layer chunk) order
            order = np.argsort(offsets, kind="stable")
            offsets, nbytes, rc, lc = offsets[order], nbytes[order], rc[order], lc[order]
            rows_at, layers_at, chunk_at = rows_at[order], layers_at[order], chunk_at[order]
        ends = offsets + nbytes
        new = _range_heads(offsets, ends, rc, self.backend.coalesce_gap)
        heads = np.flatnonzero(new)
        starts, stops = offsets[heads], np.maximum.reduceat(ends, heads)
        key = f"{array}/{ArrayGeometry.object_key(obj)}"
        blobs = self.backend.get_ranges(key, [ByteRange(int(a), int(b)) for a, b in zip(starts, stops, strict=True)])
        which = np.cumsum(new) - 1
        direct = (rows_at >= 0) & (layers_at >= 0)  # decoded in place: whole rows and whole layers
        cr = geometry.chunk_rows
        ranged: tuple[np.ndarray, ...] | None = None
        if _decodes_row_ranges(codec) and not (remember and self._chunks.maxsize) and \
                ((layers_at >= 0) & ~direct).any():
            ranged = pieces  # partial row chunks read whole in their layers: one entry per piece, rows in place
            direct = layers_at >= 0
        bound = self.manifest.version >= 2 and _has(codec, SupportsBinding)
        for r, blob in enumerate(blobs):
            sel = np.flatnonzero(direct & (which == r))
            if len(sel) and ranged is None:
                cols = np.stack([offsets[sel] - starts[r], nbytes[sel], rows_at[sel], layers_at[sel], rc[sel], lc[sel]])
                self._decode_batch(codec, geometry, array, key, blob, int(starts[r]), cols, bound, out)
            elif len(sel) and ranged is not None:
                p_lo, p_hi, p_at, p_chunk, begin, counts = ranged
                n = counts[chunk_at[sel]]
                fr = np.repeat(sel, n)  # frame of each entry, then its piece among its chunk's
                piece = np.repeat(begin[chunk_at[sel]] - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
                lo, hi = p_lo[piece], p_hi[piece]
                cols = np.stack([offsets[fr] - starts[r], nbytes[fr], p_at[piece], layers_at[fr], rc[fr], lc[fr],
                                 lo - p_chunk[piece] * cr, hi - lo])
                self._decode_batch(codec, geometry, array, key, blob, int(starts[r]), cols, bound, out)
            rest = np.flatnonzero(~direct & (which == r))
            if not len(rest):
                continue
            # the chunks a run only partly covers (a sample's first and last, a CP rank's pieces):
            # decoded by one batch call into a scratch of whole chunks, then copied
            scratch = np.empty((len(rest) * cr, geometry.layers_per_chunk, geometry.top_k), dtype=np.int32)
            cols = np.stack([offsets[rest] - starts[r], nbytes[rest], np.arange(len(rest), dtype=np.int64) * cr,
                             np.zeros(len(rest), dtype=np.int64), rc[rest], lc[rest]])
            self._decode_batch(codec, geometry, array, key, blob, int(starts[r]), cols, bound, scratch)
            for i, f in enumerate(rest.tolist()):
                c, b = int(rc[f]), int(lc[f])
                chunk = scratch[i * cr : (i + 1) * cr]
                copy(c, b, chunk)
                if remember:
                    self._remember(array, c, b, chunk.copy())
        return True

    def _stream_object(self, array: str, geometry: ArrayGeometry, codec: Codec, obj: int, wanted: list[Chunk],
                       into: Callable[[Chunk], tuple[int, int] | None] | None = None, out: np.ndarray | None = None,
                       ) -> Iterator[tuple[Chunk, np.ndarray | None]]:
        """Decoded chunks of one storage object, one at a time: cached ones, then the others
        fetched in coalesced ranges and decoded as they are consumed (not cached).

        ``into``: the place in ``out`` (row, layer) a fetched chunk decodes into, or None;
        such chunks are yielded as ``None``. A :class:`~r3store.codecs.SupportsBatchDecode`
        codec checks and decodes them in one call per fetched range, others one by one.
        """
        missing = []
        for chunk_key in wanted:
            hit = self._chunks.get((array, *chunk_key))
            if hit is None:
                missing.append(chunk_key)
            else:
                yield chunk_key, hit
        if not missing:
            return
        index = self.object_index(array, geometry, obj)
        key = f"{array}/{ArrayGeometry.object_key(obj)}"
        spans = self._spans(index, geometry, obj, missing, key)
        shape = (geometry.chunk_rows, geometry.layers_per_chunk, geometry.top_k)
        stored = np.array([(o, o + n, c) for o, n, c, _ in spans if n], dtype=np.int64).reshape(-1, 3)
        heads = np.flatnonzero(_range_heads(stored[:, 0], stored[:, 1], stored[:, 2], self.backend.coalesce_gap))
        stops = np.maximum.reduceat(stored[:, 1], heads) if len(heads) else stored[:0, 1]
        ranges = [(int(a), int(b)) for a, b in zip(stored[heads, 0], stops, strict=True)]
        blobs = self.backend.get_ranges(key, [ByteRange(s, e) for s, e in ranges]) if ranges else []
        bound = self.manifest.version >= 2 and _has(codec, SupportsBinding)
        batched = into is not None and out is not None and _batch_decodes(codec) and _batch_target(out)
        batches: dict[int, list[tuple[int, int, int, int, int, int]]] = {}  # range -> frames decoded in one call
        r = 0
        for offset, nbytes, c, b in spans:
            if not nbytes:  # not stored: past the array's end
                yield (c, b), np.zeros(shape, np.int32)
                continue
            while offset >= ranges[r][1]:
                r += 1
            place = into((c, b)) if into is not None else None
            if place is not None and batched:
                batches.setdefault(r, []).append((offset - ranges[r][0], nbytes, place[0], place[1], c, b))
                yield (c, b), None
                continue
            dest = None
            if place is not None and out is not None:
                dest = out[place[0] : place[0] + shape[0], place[1] : place[1] + shape[1]]
            chunk = self._decode_frame(codec, geometry, array, key, blobs[r], offset - ranges[r][0], nbytes, offset,
                                       (c, b), bound, dest)
            yield (c, b), None if dest is not None else chunk
        for r, frames in batches.items():
            self._decode_batch(codec, geometry, array, key, blobs[r], ranges[r][0], np.array(frames, np.int64).T, bound,
                               out)

    def _decode_batch(self, codec: Codec, geometry: ArrayGeometry, array: str, key: str, blob: bytes | memoryview,
                      first: int, cols: np.ndarray, bound: bool, out: np.ndarray | None) -> None:
        """Frames of one fetched range (``first``: its object offset), checked and decoded into
        ``out`` by one kernel call; ``cols``: int64 ``(6, n)``, per frame its start in ``blob``,
        size, output row, output layer, row chunk and layer chunk (and, ``(8, n)``, the first
        chunk row written and the rows written, for a codec whose ``decode_frames`` takes row
        ranges). A frame that fails is
        decoded again alone, which names its fault."""
        assert out is not None
        prefix = self._tag_prefix(array.removeprefix(ROUTES_PREFIX))
        ranges = {"row_first": cols[6], "row_count": cols[7]} if len(cols) == 8 else {}  # _decodes_row_ranges
        failed = cast(SupportsBatchDecode, codec).decode_frames(
            blob, cols[0], cols[1], out, cols[2], cols[3], chunk_rows=geometry.chunk_rows,
            layers_per_chunk=geometry.layers_per_chunk, tag_prefix=prefix if bound else None, row_chunks=cols[4],
            layer_chunks=cols[5], **ranges)
        if failed < 0:
            return
        rel, nbytes, _, _, c, b = (int(v) for v in cols[:6, failed])
        self._decode_frame(codec, geometry, array, key, blob, rel, nbytes, first + rel, (c, b), bound)
        raise FormatError(f"{array} chunk {(c, b, 0)}", "frame failed the batch decode's checks")  # not reached

    def _spans(self, index: np.ndarray, geometry: ArrayGeometry, obj: int, keys: list[Chunk],
               key: str) -> list[tuple[int, int, int, int]]:
        """Sorted (offset, nbytes, row chunk, layer chunk) of the frames of ``keys``; nbytes 0 for a
        chunk not stored past the array's end. Raises FormatError on a bad index entry."""
        first = obj * geometry.row_chunks_per_object
        spans: list[tuple[int, int, int, int]] = []
        for c, b in keys:
            offset, nbytes = (int(v) for v in index[c - first, b])
            if offset == EMPTY and c * geometry.chunk_rows >= geometry.rows:
                spans.append((-1, 0, c, b))
            elif EMPTY in (offset, nbytes):  # writers store every chunk holding rows
                raise FormatError(key, f"storage object index marks chunk {(c, b, 0)} missing, inside the "
                                       f"array's {geometry.rows} rows")
            elif nbytes == 0 or offset + nbytes >= 1 << 63:
                raise FormatError(key, f"storage object index gives chunk {(c, b, 0)} the byte range "
                                       f"[{offset}, {offset + nbytes}): not a frame")
            else:
                spans.append((offset, nbytes, c, b))
        spans.sort()
        return spans

    def _decode_frame(self, codec: Codec, geometry: ArrayGeometry, array: str, key: str, blob: bytes | memoryview,
                      rel: int, nbytes: int, offset: int, chunk: Chunk, bound: bool,
                      dest: np.ndarray | None = None) -> np.ndarray:
        """Check and decode the frame at ``blob[rel : rel + nbytes]`` (object bytes from ``offset``),
        into ``dest`` (a view of the chunk's shape, any integer dtype) when given."""
        c, b = chunk
        shape = (geometry.chunk_rows, geometry.layers_per_chunk, geometry.top_k)
        frame = memoryview(blob)[rel : rel + nbytes]
        if len(frame) != nbytes:
            raise FormatError(key, f"storage object ends before chunk {(c, b, 0)} does (its index gives it "
                                   f"bytes [{offset}, {offset + nbytes}))")
        tag = position_tag(self._tag_prefix(array.removeprefix(ROUTES_PREFIX)), c, b) if bound else None
        try:
            return _decode(codec, frame, shape, array, (c, b, 0), tag, dest)
        except ChecksumError as exc:
            if tag is None or not isinstance(codec, SupportsBinding) or codec.frame_tag(frame) == tag:
                raise
            raise ChecksumError(array, (c, b, 0), self._misplaced(codec.frame_tag(frame), geometry, array,
                                                                  (c, b))) from exc

    def prefetch(self, objects: Mapping[str, Sequence[int]], *, threads: int = 16) -> None:
        """Fetch, concurrently, the array documents and object indexes a read of ``objects``
        (route array -> storage object numbers) will need and are not cached yet: one round of
        parallel requests instead of two sequential ones per commit. Checks run as usual when
        they are used; on local disk only the documents are read, in one call."""
        docs = [a for a in objects if a not in self._geometries and a not in self._prefetched and a in self.array_rows]
        if docs:
            got = self.backend.get_many([f"{a}/zarr.json" for a in docs])
            self._prefetched.update({a: got[f"{a}/zarr.json"] for a in docs})
        if self.backend.is_local:
            return
        todo = []
        for array, objs in objects.items():
            if array not in self.array_rows:
                continue
            geometry = self._geometry(array, partial=True)[0]
            todo += [(array, geometry, o) for o in objs if (array, o) not in self._indexes and o < geometry.num_objects]
        if len(todo) < 2:
            return

        def fetch(item: tuple[str, ArrayGeometry, int]) -> bytes | memoryview:
            array, geometry, obj = item
            return self.backend.get(f"{array}/{ArrayGeometry.object_key(obj)}", SuffixByteRange(geometry.index_nbytes))

        with ThreadPoolExecutor(min(threads, len(todo))) as pool:
            raws = list(pool.map(fetch, todo))
        for (array, geometry, obj), raw in zip(todo, raws, strict=True):
            self._keep_index((array, obj), self._decode_index(raw, geometry, array, obj).copy())

    def object_index(self, array: str, geometry: ArrayGeometry, obj: int) -> np.ndarray:
        """The verified index of storage object ``obj``: uint64 ``(row chunks, layer chunks, 2)``."""
        index = self._indexes.get((array, obj))
        if index is None:
            key = f"{array}/{ArrayGeometry.object_key(obj)}"
            raw = self.backend.get(key, SuffixByteRange(geometry.index_nbytes))
            index = self._decode_index(raw, geometry, array, obj).copy()
            self._keep_index((array, obj), index)
        return index

    def _decode_index(self, raw: bytes | memoryview, geometry: ArrayGeometry, array: str, obj: int) -> np.ndarray:
        """:func:`decode_index`; an index that fails its CRC-32C is reported with the object's size
        and, when a neighbouring object of the array is longer than this one could have been
        shortened from, as truncated: the index is the object's last bytes, so an object cut short
        (a partial upload or copy) fails exactly this way."""
        try:
            return decode_index(raw, geometry, array, obj)
        except ChecksumError as exc:
            key = f"{array}/{ArrayGeometry.object_key(obj)}"
            try:
                size = self.backend.info(key).size
            except (StorageError, OSError):
                raise exc from None
            hint = (f"; the object is {size:,} bytes and its index is its last {geometry.index_nbytes:,}: damaged, "
                    "or truncated (a partial upload or copy cuts the index off)")
            if obj + 1 < geometry.num_objects:  # a full object: the next one holds as many row chunks
                try:
                    nxt = self.backend.info(f"{array}/{ArrayGeometry.object_key(obj + 1)}").size
                except (StorageError, OSError):
                    nxt = 0
                if nxt > 2 * size:
                    hint = (f"; the object is {size:,} bytes, the next one of the array {nxt:,}: truncated (a "
                            "partial upload or copy cut its index off)")
            fault = re.sub(r"^chunk \([\d, ]*\): ", "", exc.fault)
            raise ChecksumError(exc.array, exc.chunk, f"{fault}{hint}") from None

    def _keep_index(self, key: tuple[str, int], index: np.ndarray) -> None:
        """Cache a verified object index (least recently used dropped past ``INDEX_CACHE_BYTES``)."""
        self._indexes[key] = index

    def _misplaced(self, tag: int, geometry: ArrayGeometry, array: str, chunk: Chunk) -> str:
        """Where a frame carrying ``tag`` belongs, when that is a place of this store: another chunk
        of the same array (frames or objects swapped), or a chunk of another commit (an object
        copied over from an array of the same geometry)."""
        if tag == 0:
            return "frame is unbound (no position tag) in a format v2 array: not the frame written here"
        own = array.removeprefix(ROUTES_PREFIX)
        others = [a.removeprefix(ROUTES_PREFIX) for a in self.array_rows if a != array]
        places = [(c, b) for c in range(-(-geometry.rows // geometry.chunk_rows)) for b in range(geometry.layer_chunks)]
        candidates = itertools.chain(((own, c, b) for c, b in places), ((o, *chunk) for o in others),
                                     ((o, c, b) for o in others for c, b in places))
        for commit, c, b in itertools.islice(candidates, MAX_PLACE_SEARCH):
            if position_tag(self._tag_prefix(commit), c, b) == tag:
                return f"frame belongs to chunk {(c, b, 0)} of {ROUTES_PREFIX}{commit}, not to this one"
        where = " (or another store)" if self.manifest.store_id is not None else ""
        return f"frame carries position tag {tag:#010x}: it was written for another place{where}"

    def _tag_prefix(self, commit: str) -> str:
        """Position tags of ``commit``'s frames hash this, then ``/<row chunk>/<layer chunk>``."""
        return tag_prefix(commit, self.manifest.store_id if self.manifest.version >= 3 else None)

    def _remember(self, array: str, c: int, b: int, chunk: np.ndarray) -> None:
        self._chunks[(array, c, b)] = chunk

    # -- lifecycle --------------------------------------------------------------------

    def clear(self) -> None:
        """Drop decoded chunks and object indexes held in memory."""
        self._chunks.clear()
        self._indexes.clear()
        self._prefetched.clear()

    def fork(self, backend: Backend, *, cache_bytes: int | None = None) -> ChunkReader:
        """A reader for another thread: same arrays and parsed geometries, own caches, ``backend``."""
        clone = copy.copy(self)
        clone.backend = backend
        clone._geometries = dict(self._geometries)
        clone._indexes = ByteLRU(INDEX_CACHE_BYTES)
        clone._chunks = ByteLRU(self.cache_bytes if cache_bytes is None else parse_int("cache_bytes", cache_bytes,
                                                                                        minimum=0))
        clone._prefetched = {}
        clone._layer_plans = {}
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_chunks=ByteLRU(self.cache_bytes), _indexes=ByteLRU(INDEX_CACHE_BYTES), _prefetched={},
                     _layer_plans={})
        return state


class ByteLRU(cachetools.LRUCache[K, np.ndarray], Generic[K]):
    """Arrays kept least-recently-used first out, bounded by their total ``nbytes``.

    ``cachetools.LRUCache`` sized by ``getsizeof=nbytes``; an array larger than the whole
    budget is simply not kept (a budget of 0 keeps nothing). Not thread-safe.
    """

    def __init__(self, maxbytes: int) -> None:
        super().__init__(maxsize=maxbytes, getsizeof=_nbytes)

    def __setitem__(self, key: K, value: np.ndarray) -> None:
        try:
            super().__setitem__(key, value)
        except ValueError:  # larger than the budget: not kept
            self.pop(key, None)

    def resized(self, maxbytes: int) -> ByteLRU[K]:
        """A cache of another budget holding this one's arrays while they fit."""
        other: ByteLRU[K] = ByteLRU(maxbytes)
        for key, value in list(self.items()):
            other[key] = value
        return other


def _nbytes(value: np.ndarray) -> int:
    return int(value.nbytes)


def _expected_codec(codec_id: str, spec: ModelSpec, version: int, path: str) -> dict[str, Any] | None:
    """The config an r3store codec named by an array must have in a store of ``spec`` and
    ``version`` (None for a plugin codec: its own config is checked when it is built)."""
    if codec_id == SetCodec.codec_id:
        if version < 3:
            raise FormatError(path, f"codec {codec_id} in a format version {version} store (set-coded arrays "
                                    "are format version 3)")
        return route_codec(spec, version, "set")
    if codec_id == BitpackCodec.codec_id:
        return route_codec(spec, version)
    return None


def _build_codec(config: dict[str, Any], path: str) -> Codec:
    """The codec an array's metadata names, from the registry.

    A codec that is not installed raises UnknownCodecError (with an install hint); a
    known codec refusing its configuration makes the array metadata malformed.
    """
    try:
        return get_codec(config)
    except UnknownCodecError:
        raise
    except CodecError as exc:
        raise FormatError(path, f"codec configuration {config!r} is invalid: {exc.fault}") from exc


def _decode(codec: Codec, frame: memoryview, shape: tuple[int, int, int], array: str,
            chunk: tuple[int, int, int], tag: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """One frame as ids of ``shape`` (decoded into a buffer of that size, or into ``out``, a view
    of that shape); faults name the array and chunk. ``tag``: the position the frame must be
    bound to (a binding codec's)."""
    size = shape[0] * shape[1] * shape[2]
    try:
        declared = cast(SupportsFrameSize, codec).frame_size(frame) if _sizes_frames(codec) else size
        if declared != size:  # before decode allocates
            raise FormatError(f"{codec.codec_id} frame", f"header says {declared} ids, the chunk holds {shape}")
        dest = np.empty(shape, dtype=np.int32) if out is None else out
        # a binding codec takes the tag its frame must carry (SupportsBinding)
        ids = codec.decode(frame, out=dest, tag=tag) if tag is not None else codec.decode(frame, out=dest)  # type: ignore[call-arg]
        if ids.size != size:
            raise FormatError(f"{codec.codec_id} frame", f"decodes to {ids.size} ids, the chunk holds {shape}")
        if ids is not dest:  # a codec may hand back its own array
            dest[...] = ids.reshape(shape)
        return dest
    except ChecksumError as exc:
        raise ChecksumError(array, chunk, exc.fault) from exc
    except (FormatError, ValueError) as exc:
        fault = exc.fault if isinstance(exc, FormatError) else str(exc)
        raise FormatError(f"{array} chunk {chunk}", fault) from exc


_ABILITIES: dict[tuple[type, type], bool] = {}


def _has(codec: Codec, ability: type) -> bool:
    """``isinstance(codec, ability)`` for a runtime Protocol, remembered per class (the check is
    slow, and the readers ask it per frame or per object)."""
    key = (type(codec), ability)
    known = _ABILITIES.get(key)
    if known is None:
        known = _ABILITIES[key] = isinstance(codec, ability)
    return known


def _sizes_frames(codec: Codec) -> bool:
    """``isinstance(codec, SupportsFrameSize)``, remembered per class."""
    return _has(codec, SupportsFrameSize)


def _batch_decodes(codec: Codec) -> bool:
    """``isinstance(codec, SupportsBatchDecode)``, remembered per class."""
    return _has(codec, SupportsBatchDecode)


_ROW_RANGES: dict[type, bool] = {}


def _decodes_row_ranges(codec: Codec) -> bool:
    """Whether ``codec.decode_frames`` (:class:`SupportsBatchDecode`) also takes ``row_first`` and
    ``row_count`` (rows of each frame's chunk written from ``rows[f]``), remembered per class: an
    ability beyond the protocol, read from the method's signature, never from the class."""
    known = _ROW_RANGES.get(type(codec))
    if known is None:
        try:
            params = inspect.signature(cast(SupportsBatchDecode, codec).decode_frames).parameters \
                if _batch_decodes(codec) else {}
        except (TypeError, ValueError):
            params = {}
        known = _ROW_RANGES[type(codec)] = "row_first" in params and "row_count" in params
    return known


def _batch_target(out: np.ndarray) -> bool:
    """Whether ``out`` is a buffer :meth:`SupportsBatchDecode.decode_frames` writes into."""
    return bool(out.flags.c_contiguous and out.flags.writeable and out.dtype.kind in "iu" and out.dtype.itemsize <= 4)


def _as_slices(dst: np.ndarray, pos: np.ndarray, first: int) -> tuple[slice | np.ndarray, slice | np.ndarray]:
    """Output positions and in-chunk layer positions, as slices when they are runs (fast copies)."""
    src = pos[dst] - first

    def run(a: np.ndarray) -> slice | np.ndarray:
        return slice(int(a[0]), int(a[0]) + len(a)) if np.array_equal(a, np.arange(a[0], a[0] + len(a))) else a

    return run(dst), run(src)
