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
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from r3store._checks import parse_int
from r3store._format import (
    MANIFEST_KEY,
    ROUTES_PREFIX,
    ArrayGeometry,
    Manifest,
    decode_index,
    loads_document,
    position_tag,
    route_codec,
)
from r3store._spec import ModelSpec
from r3store.codecs import Codec, SupportsBinding, SupportsFrameSize, get_codec
from r3store.errors import (
    ChecksumError,
    CodecError,
    FormatError,
    OptionError,
    SpecConflictError,
    SpecError,
    UnknownCodecError,
)
from r3store.storage import Backend, ByteRange, SuffixByteRange

__all__ = ["ChunkReader", "merge_ranges"]

MISSING = 2**64 - 1
"""Index entry of a chunk that is not stored (past the end of the array)."""
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
    """

    def __init__(self, backend: Backend, manifest: Manifest, array_rows: Mapping[str, int], *,
                 cache_bytes: int = 64 << 20) -> None:
        self.backend = backend
        self.manifest = manifest
        self.spec: ModelSpec = manifest.spec
        self.array_rows = array_rows
        self.cache_bytes = parse_int("cache_bytes", cache_bytes, minimum=0)
        self._geometries: dict[str, tuple[ArrayGeometry, Codec]] = {}
        self._indexes: dict[tuple[str, int], np.ndarray] = {}
        self._chunks: OrderedDict[tuple[str, int, int], np.ndarray] = OrderedDict()
        self._cached = 0
        self._prefetched: dict[str, bytes] = {}

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
            codec = route_codec(self.spec, self.manifest.version)
            if (geometry.num_moe_layers, geometry.top_k) != (self.spec.num_moe_layers, self.spec.top_k) or \
                    (geometry.codec["id"] == codec["id"] and geometry.codec != codec):
                raise FormatError(path, f"array geometry {geometry} disagrees with the manifest spec (codec "
                                        f"{codec} expected)")
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
        if out is None:
            if stop > start:  # what the storage objects hold is checked before the output is allocated
                per_object = geometry.row_chunks_per_object * geometry.chunk_rows
                for obj in range(start // per_object, (stop - 1) // per_object + 1):
                    self.object_index(array, geometry, obj)
            out = np.empty(shape, dtype=np.int32)
        elif out.shape != shape:
            raise OptionError("out", f"<array of shape {out.shape}>", f"must have shape {shape}")
        if stop <= start or not len(positions):
            return out
        pos = np.asarray(positions)
        lpc, cr, per_object = geometry.layers_per_chunk, geometry.chunk_rows, geometry.row_chunks_per_object
        by_chunk = {int(b): _as_slices(np.flatnonzero(pos // lpc == b), pos, b * lpc) for b in np.unique(pos // lpc)}
        first, last = start // cr, (stop - 1) // cr
        for obj in range(first // per_object, last // per_object + 1):
            row_chunks = range(max(first, obj * per_object), min(last, (obj + 1) * per_object - 1) + 1)
            chunks = self._fetch(array, geometry, codec, obj, [(c, b) for c in row_chunks for b in by_chunk])
            for c in row_chunks:
                lo, hi = max(start, c * cr), min(stop, (c + 1) * cr)
                for b, (dst, src) in by_chunk.items():
                    out[lo - start : hi - start, dst] = chunks[(c, b)][lo - c * cr : hi - c * cr, src]
        return out

    def _fetch(self, array: str, geometry: ArrayGeometry, codec: Codec, obj: int,
               wanted: list[Chunk]) -> dict[Chunk, np.ndarray]:
        """Decoded chunks of one storage object, from the cache or storage."""
        got: dict[Chunk, np.ndarray] = {}
        missing = []
        for c, b in wanted:
            hit = self._chunks.get((array, c, b))
            if hit is None:
                missing.append((c, b))
            else:
                self._chunks.move_to_end((array, c, b))
                got[(c, b)] = hit
        if missing:
            got.update(self._fetch_object(array, geometry, codec, obj, missing))
        return got

    def prefetch(self, objects: Mapping[str, Sequence[int]], *, threads: int = 16) -> None:
        """Fetch, concurrently, the array documents and object indexes a read of ``objects``
        (route array -> storage object numbers) will need and are not cached yet: one round of
        parallel requests instead of two sequential ones per commit. Checks run as usual when
        they are used; on local disk (mmap) only the documents are read, in one call."""
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
            self._indexes[(array, obj)] = decode_index(raw, geometry, array, obj).copy()

    def prefetch_rows(self, spans: Mapping[str, Sequence[tuple[int, int]]], *, threads: int = 16) -> None:
        """Read and decode, concurrently, the chunks (all layers) holding rows ``[start, stop)`` of
        each array (route array -> row ranges) that are not cached, while they fit in half the
        cache; one request per storage object, in parallel. Only for object stores (local disks
        read through mmap); the reads that follow find the chunks in the cache."""
        if self.backend.is_local:
            return
        todo: list[tuple[str, ArrayGeometry, Codec, int, list[Chunk]]] = []
        budget = self.cache_bytes // 2
        for array, ranges in spans.items():
            geometry, codec = self._geometry(array, partial=True)
            cr, per_object = geometry.chunk_rows, geometry.row_chunks_per_object
            chunk_bytes = cr * geometry.layers_per_chunk * geometry.top_k * 4
            ends = [(a, min(b, geometry.rows)) for a, b in ranges]
            wanted = sorted({c for a, b in ends if b > a for c in range(a // cr, (b - 1) // cr + 1)})
            by_object: dict[int, list[Chunk]] = {}
            for c in wanted:
                for b in range(geometry.layer_chunks):
                    if (array, c, b) not in self._chunks:
                        by_object.setdefault(c // per_object, []).append((c, b))
            for obj, chunks in by_object.items():
                budget -= chunk_bytes * len(chunks)
                if budget < 0:
                    break
                todo.append((array, geometry, codec, obj, chunks))
        if len(todo) < 2:
            return

        def fetch(item: tuple[str, ArrayGeometry, Codec, int, list[Chunk]]) -> dict[Chunk, np.ndarray]:
            worker = copy.copy(self)  # (copies drop the caches: see __getstate__)
            worker._indexes = self._indexes  # shared (a dict: safe across threads); own chunk cache
            worker._chunks, worker._cached, worker.cache_bytes = OrderedDict(), 0, 1 << 62
            return worker._fetch_object(*item)

        with ThreadPoolExecutor(min(threads, len(todo))) as pool:
            results = list(pool.map(fetch, todo))
        for (array, *_), got in zip(todo, results, strict=True):
            for (c, b), chunk in got.items():
                self._remember(array, c, b, chunk)

    def object_index(self, array: str, geometry: ArrayGeometry, obj: int) -> np.ndarray:
        """The verified index of storage object ``obj``: uint64 ``(row chunks, layer chunks, 2)``."""
        index = self._indexes.get((array, obj))
        if index is None:
            key = f"{array}/{ArrayGeometry.object_key(obj)}"
            raw = self.backend.get(key, SuffixByteRange(geometry.index_nbytes))
            index = decode_index(raw, geometry, array, obj).copy()
            self._indexes[(array, obj)] = index
        return index

    def _fetch_object(self, array: str, geometry: ArrayGeometry, codec: Codec, obj: int,
                      keys: list[Chunk]) -> dict[Chunk, np.ndarray]:
        """Read (coalescing adjacent frames into one range), verify and decode chunks."""
        index = self.object_index(array, geometry, obj)
        first = obj * geometry.row_chunks_per_object
        shape = (geometry.chunk_rows, geometry.layers_per_chunk, geometry.top_k)
        key = f"{array}/{ArrayGeometry.object_key(obj)}"
        got: dict[Chunk, np.ndarray] = {}
        spans: list[tuple[int, int, int, int]] = []  # (offset, nbytes, row chunk, layer chunk)
        for c, b in keys:
            offset, nbytes = (int(v) for v in index[c - first, b])
            if offset == MISSING and c * geometry.chunk_rows >= geometry.rows:
                got[(c, b)] = np.zeros(shape, np.int32)
            elif MISSING in (offset, nbytes):  # writers store every chunk holding rows
                raise FormatError(key, f"storage object index marks chunk {(c, b, 0)} missing, inside the "
                                       f"array's {geometry.rows} rows")
            elif nbytes == 0 or offset + nbytes >= 1 << 63:
                raise FormatError(key, f"storage object index gives chunk {(c, b, 0)} the byte range "
                                       f"[{offset}, {offset + nbytes}): not a frame")
            else:
                spans.append((offset, nbytes, c, b))
        spans.sort()
        ranges = merge_ranges((o, o + n) for o, n, _, _ in spans)
        blobs = self.backend.get_ranges(key, [ByteRange(s, e) for s, e in ranges])
        bound = self.manifest.version >= 2 and isinstance(codec, SupportsBinding)
        r = 0
        for offset, nbytes, c, b in spans:
            while offset >= ranges[r][1]:
                r += 1
            rel = offset - ranges[r][0]
            frame = memoryview(blobs[r])[rel : rel + nbytes]
            if len(frame) != nbytes:
                raise FormatError(key, f"storage object ends before chunk {(c, b, 0)} does (its index gives it "
                                       f"bytes [{offset}, {offset + nbytes}))")
            tag = position_tag(array.removeprefix(ROUTES_PREFIX), c, b) if bound else None
            try:
                got[(c, b)] = _decode(codec, frame, shape, array, (c, b, 0), tag)
            except ChecksumError as exc:
                if tag is None or not isinstance(codec, SupportsBinding) or codec.frame_tag(frame) == tag:
                    raise
                raise ChecksumError(array, (c, b, 0), self._misplaced(codec.frame_tag(frame), geometry, array,
                                                                      (c, b))) from exc
        for (c, b), chunk in got.items():
            self._remember(array, c, b, chunk)
        return got

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
            if position_tag(commit, c, b) == tag:
                return f"frame belongs to chunk {(c, b, 0)} of {ROUTES_PREFIX}{commit}, not to this one"
        return f"frame carries position tag {tag:#010x}: it was written for another place"

    def _remember(self, array: str, c: int, b: int, chunk: np.ndarray) -> None:
        self._chunks[(array, c, b)] = chunk
        self._cached += chunk.nbytes
        while self._cached > self.cache_bytes and len(self._chunks) > 1:
            _, old = self._chunks.popitem(last=False)
            self._cached -= old.nbytes

    # -- lifecycle --------------------------------------------------------------------

    def clear(self) -> None:
        """Drop decoded chunks and object indexes held in memory."""
        self._chunks.clear()
        self._indexes.clear()
        self._prefetched.clear()
        self._cached = 0

    def fork(self, backend: Backend, *, cache_bytes: int | None = None) -> ChunkReader:
        """A reader for another thread: same arrays and parsed geometries, own caches, ``backend``."""
        clone = copy.copy(self)
        clone.backend = backend
        clone.cache_bytes = self.cache_bytes if cache_bytes is None else cache_bytes
        clone._geometries = dict(self._geometries)
        clone._indexes, clone._chunks, clone._cached, clone._prefetched = {}, OrderedDict(), 0, {}
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_chunks"], state["_cached"], state["_indexes"], state["_prefetched"] = OrderedDict(), 0, {}, {}
        return state


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
            chunk: tuple[int, int, int], tag: int | None = None) -> np.ndarray:
    """One frame as ids of ``shape`` (decoded into a buffer of that size); faults name the array
    and chunk. ``tag``: the position the frame must be bound to (a binding codec's)."""
    size = shape[0] * shape[1] * shape[2]
    try:
        if isinstance(codec, SupportsFrameSize) and codec.frame_size(frame) != size:  # before decode allocates
            raise FormatError(f"{codec.codec_id} frame", f"header says {codec.frame_size(frame)} ids, "
                                                         f"the chunk holds {shape}")
        out = np.empty(shape, dtype=np.int32)
        # a binding codec takes the tag its frame must carry (SupportsBinding)
        ids = codec.decode(frame, out=out, tag=tag) if tag is not None else codec.decode(frame, out=out)  # type: ignore[call-arg]
        if ids.size != size:
            raise FormatError(f"{codec.codec_id} frame", f"decodes to {ids.size} ids, the chunk holds {shape}")
        return ids.reshape(shape)
    except ChecksumError as exc:
        raise ChecksumError(array, chunk, exc.fault) from exc
    except (FormatError, ValueError) as exc:
        fault = exc.fault if isinstance(exc, FormatError) else str(exc)
        raise FormatError(f"{array} chunk {chunk}", fault) from exc


def _as_slices(dst: np.ndarray, pos: np.ndarray, first: int) -> tuple[slice | np.ndarray, slice | np.ndarray]:
    """Output positions and in-chunk layer positions, as slices when they are runs (fast copies)."""
    src = pos[dst] - first

    def run(a: np.ndarray) -> slice | np.ndarray:
        return slice(int(a[0]), int(a[0]) + len(a)) if np.array_equal(a, np.arange(a[0], a[0] + len(a))) else a

    return run(dst), run(src)
