"""`RouteStore`: random access to committed routes by sample id and layer range."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from r3store._format import (
    INDEX_PREFIX,
    MANIFEST_KEY,
    ROUTES_PREFIX,
    ArrayGeometry,
    array_rows,
    decode_index,
    is_immutable_key,
    parse_manifest,
    read_table,
    route_codec,
)
from r3store._checks import parse_choice
from r3store._spec import ModelSpec
from r3store.codecs import Codec, SupportsFrameSize, get_codec
from r3store.errors import (
    ChecksumError,
    CodecError,
    DuplicateSampleError,
    FormatError,
    NotAStoreError,
    ObjectNotFoundError,
    OptionError,
    SampleNotFoundError,
    UnknownCodecError,
)
from r3store.storage import Backend, ByteRange, SuffixByteRange, open_backend

__all__ = ["RouteStore", "open_store"]

OnDuplicate = Literal["raise", "first", "report"]


def open_store(
    url: str | os.PathLike[str] | Backend,
    *,
    storage_options: Mapping[str, Any] | None = None,
    on_duplicate: OnDuplicate = "raise",
    cache_bytes: int = 64 << 20,
    cache_dir: str | os.PathLike[str] | None = None,
) -> RouteStore:
    """Open a store for reading.

    Parameters
    ----------
    url : str, os.PathLike or Backend
        Local folder or fsspec URL (``memory://``, ``s3://bucket/prefix``).
    storage_options : mapping, optional
        Passed to fsspec (``endpoint_url``, ``key``, ``secret``, ``profile``, ...).
    on_duplicate : {"raise", "first", "report"}
        A sample id committed by two shards: raise, keep the earliest commit, or keep the
        earliest and list every duplicate in :attr:`RouteStore.duplicates` (for audits).
    cache_bytes : int
        Budget for decoded chunks kept in memory (sequential reads of small samples
        decode each chunk once).
    cache_dir : str or os.PathLike, optional
        Local read-through cache for remote stores (repeated epochs): each route and
        index object is downloaded whole on first use and read from this folder
        afterwards (see :class:`r3store.storage.CachingBackend`).

    Returns
    -------
    RouteStore

    Raises
    ------
    r3store.errors.NotAStoreError
        No ``r3store.json`` at ``url``.
    r3store.errors.FormatError
        The manifest or a sample table is malformed (FormatVersionError: unknown version):
        a table over the size caps, named other than ``index/<shard>.parquet`` with a valid
        shard name, or with a row that breaks the rules of ``schema/FORMAT.md`` section 6
        (an ``array`` other than ``routes/<shard>``, nulls, counts out of range, shared rows).
    r3store.errors.DuplicateSampleError
        With ``on_duplicate="raise"``: names the id and both shards.
    r3store.errors.StorageError
    """
    backend = open_backend(url, storage_options, cache_dir=cache_dir, immutable=is_immutable_key)
    try:
        manifest = backend.get_json(MANIFEST_KEY)
    except ObjectNotFoundError as exc:
        raise NotAStoreError(backend.url) from exc
    spec = parse_manifest(manifest, backend.path_of(MANIFEST_KEY))
    return RouteStore(backend, spec, on_duplicate=on_duplicate, cache_bytes=cache_bytes)


class RouteStore:
    """A committed store, opened for reading (see :func:`open_store`).

    Attributes
    ----------
    spec : ModelSpec
    samples : pyarrow.Table
        One row per committed sample, quarantined ones included (columns of
        ``schema/sample_table.schema.json`` plus user metadata), in store order. A
        metadata column whose type differs between writers (int here, str there) is
        read as strings.
    duplicates : dict of str to list of str
        Sample ids committed by more than one shard, with the shards (earliest first).
    """

    def __init__(self, backend: Backend, spec: ModelSpec, *, on_duplicate: OnDuplicate = "raise",
                 cache_bytes: int = 64 << 20) -> None:
        parse_choice("on_duplicate", on_duplicate, ("raise", "first", "report"))
        self.backend = backend
        self.spec = spec
        self.cache_bytes = cache_bytes
        self._geometries: dict[str, tuple[ArrayGeometry, Codec]] = {}
        self._array_rows: dict[str, int] = {}  # rows each committed array must have, from its sample table
        self._indexes: dict[tuple[str, int], np.ndarray] = {}
        self._chunks: OrderedDict[tuple[str, int, int], np.ndarray] = OrderedDict()
        self._cached = 0
        table = self._load_tables()
        self.samples, self.duplicates = _dedupe(table, on_duplicate)
        self._build_lookup()

    # -- index ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.backend.url

    def _load_tables(self) -> pa.Table:
        """Read and check every committed sample table; note the rows each route array must have."""
        keys = [k for k in self.backend.list_prefix(INDEX_PREFIX) if k.endswith(".parquet") and "/." not in k]
        self.committed_shards = [k[len(INDEX_PREFIX) : -len(".parquet")] for k in keys]
        blobs = self.backend.get_many(keys)
        tables = []
        for key, shard in zip(keys, self.committed_shards, strict=True):
            tables.append(read_table(blobs.pop(key), self.backend.path_of(key), shard))
            self._array_rows[f"{ROUTES_PREFIX}{shard}"] = array_rows(tables[-1])
        if not tables:
            from r3store._format import table_schema

            return table_schema().empty_table()
        tables = [t.replace_schema_metadata(None) for t in tables]
        try:
            table = pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowTypeError, pa.ArrowInvalid):  # writers disagree on a metadata column's type
            table = pa.concat_tables(_clashing_metadata_as_strings(tables), promote_options="permissive")
        order = pc.sort_indices(table, [("committed_at", "ascending"), ("shard", "ascending"), ("row_start", "ascending")])
        return table.take(order)

    def _build_lookup(self) -> None:
        cols = self.samples.select(["sample_id", "array", "row_start", "num_rows", "num_tokens", "quarantined"]).to_pydict()
        self._where = {sid: i for i, sid in enumerate(cols["sample_id"])}
        self._array = cols["array"]
        self._row_start = cols["row_start"]
        self._num_rows = cols["num_rows"]
        self._num_tokens = cols["num_tokens"]
        self._quarantined = cols["quarantined"]
        self._visible = [sid for sid, q in zip(cols["sample_id"], cols["quarantined"], strict=True) if not q]

    def __repr__(self) -> str:
        return f"RouteStore({self.url!r}, samples={len(self)}, spec={self.spec})"

    def __len__(self) -> int:
        """Committed, non-quarantined samples."""
        return len(self._visible)

    def __contains__(self, sample_id: object) -> bool:
        if not isinstance(sample_id, str):
            return False
        i = self._where.get(sample_id)
        return i is not None and not self._quarantined[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._visible)

    @property
    def sample_ids(self) -> list[str]:
        """Ids of the committed, non-quarantined samples, in store order."""
        return list(self._visible)

    @property
    def shards(self) -> list[str]:
        """Names of the committed shards (one per writer commit)."""
        return list(self.committed_shards)

    def _locate(self, sample_id: str, include_quarantined: bool) -> int:
        if not isinstance(sample_id, str):
            raise TypeError(f"sample_id must be a str, got {type(sample_id).__name__}")
        i = self._where.get(sample_id)
        if i is None:
            raise SampleNotFoundError(sample_id, self.url)
        if self._quarantined[i] and not include_quarantined:
            reason = self.samples.column("reason")[i].as_py() or "no reason recorded"
            raise SampleNotFoundError(sample_id, self.url, quarantined=reason)
        return i

    def num_tokens(self, sample_id: str, *, include_quarantined: bool = False) -> int:
        """Token count of a sample (its routes have ``num_tokens - 1`` rows).

        Raises
        ------
        r3store.errors.SampleNotFoundError
        """
        return int(self._num_tokens[self._locate(sample_id, include_quarantined)])

    def row(self, sample_id: str, *, include_quarantined: bool = False) -> dict[str, Any]:
        """The sample-table row of one sample, as a dict."""
        i = self._locate(sample_id, include_quarantined)
        return {k: v[0] for k, v in self.samples.slice(i, 1).to_pydict().items()}

    # -- reading --------------------------------------------------------------------

    def get(
        self,
        sample_id: str,
        layers: Sequence[int] | None = None,
        *,
        rows: slice | None = None,
        include_quarantined: bool = False,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Routes of one sample.

        Parameters
        ----------
        sample_id : str
        layers : sequence of int, optional
            Global decoder-layer indices (MoE layers only), in the order wanted, e.g. one
            pipeline stage's layers. Only the chunks of these layers are read and decoded.
        rows : slice, optional
            Row range (step 1) within the sample.
        include_quarantined : bool
            Also return samples the writer quarantined.
        out : ndarray of int32, optional
            Destination of the result's shape (e.g. a slice of a batch buffer).

        Returns
        -------
        ndarray of int32, shape (num_tokens - 1, len(layers), top_k)
            Row ``t``: expert ids chosen for input position ``t``; layers default to all
            MoE layers in ``spec.moe_layers`` order.

        Raises
        ------
        r3store.errors.SampleNotFoundError
            (a KeyError) no such committed sample.
        r3store.errors.LayerError
            (an IndexError) a layer is not an MoE layer.
        r3store.errors.ChecksumError
            A chunk fails its CRC-32C; names the array and chunk.
        r3store.errors.StorageError
        """
        i = self._locate(sample_id, include_quarantined)
        positions = self.spec.layer_positions(layers)
        if rows is not None and not isinstance(rows, slice):
            hint = f"; use slice{tuple(rows)!r}" if isinstance(rows, tuple) and len(rows) == 2 else ""
            raise TypeError(f"rows must be a slice such as slice(0, 1024), got {type(rows).__name__}{hint}")
        start, stop, step = (rows or slice(None)).indices(int(self._num_rows[i]))
        if step != 1:
            raise OptionError("rows", rows, "must have step 1")
        base = int(self._row_start[i])
        self.layout_of(self._array[i])  # the whole array must match its sample table
        return self.read_rows(self._array[i], base + start, base + max(start, stop), positions, out=out)

    def get_many(self, sample_ids: Sequence[str], layers: Sequence[int] | None = None) -> list[np.ndarray]:
        """Routes of several samples (see :meth:`get`), in the order given."""
        return [self.get(s, layers) for s in sample_ids]

    def layout_of(self, array: str, *, partial: bool = False) -> ArrayGeometry:
        """Shape, codec and chunking of a committed route array (parsed from its ``zarr.json``).

        Parameters
        ----------
        array : str
            ``routes/<commit>`` of a committed commit.
        partial : bool
            Accept an array with fewer rows than its sample table names (audits report
            the samples past its end); never more.

        Raises
        ------
        r3store.errors.FormatError
            ``array`` is not a committed array, or its ``zarr.json`` is malformed,
            disagrees with the manifest spec, has other than the rows its sample table
            names (the end of its last sample), or configures its codec wrongly.
        r3store.errors.UnknownCodecError
            The array's codec is not registered (the message says how to install it).
        """
        return self._geometry(array, partial)[0]

    def _geometry(self, array: str, partial: bool) -> tuple[ArrayGeometry, Codec]:
        path = self.backend.path_of(f"{array}/zarr.json")
        expected = self._array_rows.get(array)
        if expected is None:
            raise FormatError(path, f"{array!r} is not the route array of a committed shard")
        known = self._geometries.get(array)
        if known is None:
            geometry = ArrayGeometry.from_zarr_json(self.backend.get_json(f"{array}/zarr.json"), path)
            codec = route_codec(self.spec)
            if (geometry.num_moe_layers, geometry.top_k) != (self.spec.num_moe_layers, self.spec.top_k) or \
                    (geometry.codec["id"] == codec["id"] and geometry.codec != codec):
                raise FormatError(path, f"array geometry {geometry} disagrees with the manifest spec")
            known = self._geometries[array] = (geometry, _build_codec(geometry.codec, path))
        geometry = known[0]
        if geometry.rows > expected or (geometry.rows < expected and not partial):
            raise FormatError(path, f"array has {geometry.rows} rows; its sample table ends at row {expected}")
        return known

    def read_rows(self, array: str, start: int, stop: int, positions: Sequence[int],
                  out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of a route array, at stored layer positions.

        Returns
        -------
        ndarray of int32, shape (stop - start, len(positions), top_k)
            ``out`` when given (it must have this shape).

        Raises
        ------
        r3store.errors.FormatError
            The rows lie past the array's end (an array shorter than its sample table is
            read up to its end, for audits; see :meth:`layout_of`).
        """
        if start < 0:
            raise OptionError("start", start, "must be >= 0")
        layout, codec = self._geometry(array, partial=True)
        if stop > layout.rows:
            raise FormatError(self.backend.path_of(array), f"rows [{start}, {stop}) beyond the array's {layout.rows} rows")
        shape = (stop - start, len(positions), layout.top_k)
        if out is None:
            out = np.empty(shape, dtype=np.int32)
        elif out.shape != shape:
            raise OptionError("out", f"<array of shape {out.shape}>", f"must have shape {shape}")
        if stop <= start or not len(positions):
            return out
        pos = np.asarray(positions)
        lpc, cr, per_shard = layout.layers_per_chunk, layout.chunk_rows, layout.row_chunks_per_object
        by_chunk = {int(b): _as_slices(np.flatnonzero(pos // lpc == b), pos, b * lpc) for b in np.unique(pos // lpc)}
        first, last = start // cr, (stop - 1) // cr
        for shard in range(first // per_shard, last // per_shard + 1):
            row_chunks = range(max(first, shard * per_shard), min(last, (shard + 1) * per_shard - 1) + 1)
            chunks = self._fetch(array, layout, codec, shard, [(c, b) for c in row_chunks for b in by_chunk])
            for c in row_chunks:
                lo, hi = max(start, c * cr), min(stop, (c + 1) * cr)
                for b, (dst, src) in by_chunk.items():
                    out[lo - start : hi - start, dst] = chunks[(c, b)][lo - c * cr : hi - c * cr, src]
        return out

    def _fetch(self, array: str, layout: ArrayGeometry, codec: Codec, shard: int,
               wanted: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """Decoded chunks ``(row_chunk, layer_chunk)`` of one shard, from the cache or storage."""
        got: dict[tuple[int, int], np.ndarray] = {}
        missing = []
        for c, b in wanted:
            hit = self._chunks.get((array, c, b))
            if hit is None:
                missing.append((c, b))
            else:
                self._chunks.move_to_end((array, c, b))
                got[(c, b)] = hit
        if missing:
            got.update(self._fetch_shard(array, layout, codec, shard, missing))
        return got

    def _shard_index(self, array: str, layout: ArrayGeometry, shard: int) -> np.ndarray:
        index = self._indexes.get((array, shard))
        if index is None:
            key = f"{array}/{ArrayGeometry.object_key(shard)}"
            raw = self.backend.get(key, SuffixByteRange(layout.index_nbytes))
            index = decode_index(raw, layout, array, shard).copy()
            self._indexes[(array, shard)] = index
        return index

    def _fetch_shard(self, array: str, layout: ArrayGeometry, codec: Codec, shard: int,
                     keys: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """Read (coalescing adjacent frames into one range), verify and decode chunks."""
        index = self._shard_index(array, layout, shard)
        first = shard * layout.row_chunks_per_object
        shape = (layout.chunk_rows, layout.layers_per_chunk, layout.top_k)
        got: dict[tuple[int, int], np.ndarray] = {}
        spans: list[tuple[int, int, int, int]] = []  # (offset, nbytes, row chunk, layer chunk)
        for c, b in keys:
            offset, nbytes = (int(v) for v in index[c - first, b])
            if offset == 2**64 - 1 and c * layout.chunk_rows >= layout.rows:
                got[(c, b)] = np.zeros(shape, np.int32)
            elif offset == 2**64 - 1 or nbytes == 2**64 - 1:  # writers store every chunk holding rows
                raise FormatError(f"{array}/{ArrayGeometry.object_key(shard)}",
                                  f"shard index marks chunk {(c, b, 0)} missing, inside the array's {layout.rows} rows")
            else:
                spans.append((offset, nbytes, c, b))
        spans.sort()
        ranges = _coalesce([(o, o + n) for o, n, _, _ in spans])
        blobs = self.backend.get_ranges(f"{array}/{ArrayGeometry.object_key(shard)}", [ByteRange(s, e) for s, e in ranges])
        r = 0
        for offset, nbytes, c, b in spans:
            while offset >= ranges[r][1]:
                r += 1
            rel = offset - ranges[r][0]
            got[(c, b)] = self._decode(codec, memoryview(blobs[r])[rel : rel + nbytes], shape, array, (c, b, 0))
        for (c, b), chunk in got.items():
            self._remember(array, c, b, chunk)
        return got

    @staticmethod
    def _decode(codec: Codec, frame: memoryview, shape: tuple[int, int, int], array: str,
                chunk: tuple[int, int, int]) -> np.ndarray:
        size = shape[0] * shape[1] * shape[2]
        try:
            if isinstance(codec, SupportsFrameSize) and codec.frame_size(frame) != size:  # before decode allocates
                raise FormatError(f"{codec.codec_id} frame", f"header says {codec.frame_size(frame)} ids, "
                                                             f"the chunk holds {shape}")
            ids = codec.decode(frame)
            if ids.size != size:
                raise FormatError(f"{codec.codec_id} frame", f"decodes to {ids.size} ids, the chunk holds {shape}")
            return ids.reshape(shape)
        except ChecksumError as exc:
            raise ChecksumError(array, chunk, exc.fault) from exc
        except (FormatError, ValueError) as exc:
            fault = exc.fault if isinstance(exc, FormatError) else str(exc)
            raise FormatError(f"{array} chunk {chunk}", fault) from exc

    def _remember(self, array: str, c: int, b: int, chunk: np.ndarray) -> None:
        self._chunks[(array, c, b)] = chunk
        self._cached += chunk.nbytes
        while self._cached > self.cache_bytes and len(self._chunks) > 1:
            _, old = self._chunks.popitem(last=False)
            self._cached -= old.nbytes

    # -- trainer batches ------------------------------------------------------------

    def assemble(
        self,
        sample_ids: Sequence[str],
        *,
        layout: Literal["thd", "bshd"] = "thd",
        layers: Sequence[int] | None = None,
        cp_size: int = 1,
        cp_rank: int = 0,
        cp_mode: Literal["zigzag", "contiguous"] = "zigzag",
        tp_size: int = 1,
        pad_multiple: int = 1,
        sequence_parallel: bool = False,
        tp_rank: int = 0,
        max_seqlen: int | None = None,
        pad_policy: Literal["spread", "fill"] = "spread",
        fill_value: int = -1,
        tokens: Sequence[Any] | None = None,
        return_tensors: Literal["pt", "np"] = "pt",
    ) -> dict[str, Any]:
        """The batch for exactly ``sample_ids``, in that order, laid out like the trainer's tokens.

        For trainers that choose their own micro-batches (Miles, verl). Keys and types
        match :class:`r3store.RouteDataset` batches.

        Parameters
        ----------
        sample_ids : sequence of str
        layout : {"thd", "bshd"}
            Packed with ``cu_seqlens``, or padded to ``max_seqlen`` / the batch maximum.
        layers : sequence of int, optional
            Global decoder layers to keep (a pipeline stage's MoE layers).
        cp_size, cp_rank, cp_mode
            Context parallel split (Megatron zig-zag, or contiguous all-gather).
        tp_size, tp_rank, pad_multiple, sequence_parallel
            Pad the packed length to a multiple of ``tp_size * pad_multiple``; with
            sequence parallel keep only ``tp_rank``'s contiguous part.
        max_seqlen : int, optional
            BSHD only.
        pad_policy : {"spread", "fill"}
            Pad rows get distinct in-range ids spread over all experts, or ``fill_value``.
        tokens : sequence of int sequences, optional
            Each sample's token ids: checked against the stored token hash and
            ``len(tokens) - 1 == rows``, and laid out as ``batch["tokens"]``.
        return_tensors : {"pt", "np"}
            torch tensors (CPU) or numpy arrays.

        Returns
        -------
        dict
            ``routes`` int32 ``(T, n_layers, top_k)`` or ``(B, T, n_layers, top_k)``,
            ``replay_mask`` bool, ``cu_seqlens`` int32, ``num_tokens`` int32 ``(B,)``,
            ``sample_ids``, ``layers``, ``sp_range`` (and ``tokens``); see
            :func:`r3store.layout.plan_layout` for ``cu_seqlens`` under CP/TP.

        Raises
        ------
        r3store.errors.AlignmentError
            A sample's tokens do not match its routes (hash, or row count off by one).
        r3store.errors.SampleNotFoundError, r3store.errors.LayerError,
        r3store.errors.LayoutOptionError
        """
        from r3store._batch import build_batch
        from r3store.layout import LayoutOptions

        if isinstance(sample_ids, str):
            raise TypeError(f"sample_ids must be a sequence of ids, got the str {sample_ids!r}; use [{sample_ids!r}]")
        if return_tensors not in ("pt", "np"):
            parse_choice("return_tensors", return_tensors, ("pt", "np"))

        options = LayoutOptions(layout=layout, cp_size=cp_size, cp_rank=cp_rank, cp_mode=cp_mode, tp_size=tp_size,
                                tp_rank=tp_rank, pad_multiple=pad_multiple, sequence_parallel=sequence_parallel,
                                max_seqlen=max_seqlen)
        batch = build_batch(self, sample_ids, options, layers=layers, pad_policy=pad_policy,
                            fill_value=fill_value, tokens=tokens)
        if return_tensors == "np":
            return batch
        from r3store.dataset import batch_to_tensors

        return batch_to_tensors(batch)

    # -- lifecycle ------------------------------------------------------------------

    def clear_cache(self) -> None:
        """Drop decoded chunks and shard indexes held in memory."""
        self._chunks.clear()
        self._indexes.clear()
        self._cached = 0

    def close(self) -> None:
        """Release caches and file maps; the store reopens them on demand."""
        self.clear_cache()
        self.backend.close()

    def __enter__(self) -> RouteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_chunks"], state["_cached"], state["_indexes"] = OrderedDict(), 0, {}
        return state


def _build_codec(config: dict[str, Any], path: str) -> Codec:
    """The codec an array's metadata names, from the registry.

    A codec that is not installed raises UnknownCodecError (with an install hint); a
    known codec with a configuration it refuses makes the array metadata malformed.
    """
    try:
        return get_codec(config)
    except UnknownCodecError:
        raise
    except CodecError as exc:
        raise FormatError(path, f"codec configuration {config!r} is invalid: {exc.fault}") from exc


def _clashing_metadata_as_strings(tables: list[pa.Table]) -> list[pa.Table]:
    """Cast user metadata columns that hold different, unmergeable types in different
    shards (int in one writer's shards, str in another's) to string, so the store opens."""
    from r3store._format import table_schema

    reserved = set(table_schema().names)
    kinds: dict[str, set[pa.DataType]] = {}
    for t in tables:
        for f in t.schema:
            if f.name not in reserved and not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    numeric = {pa.int64(), pa.float64()}
    clash = {name for name, types in kinds.items() if len(types) > 1 and not types <= numeric}
    out = []
    for t in tables:
        for name in clash.intersection(t.column_names):
            t = t.set_column(t.schema.get_field_index(name), name, pc.cast(t.column(name), pa.string()))
        out.append(t)
    return out


def _as_slices(dst: np.ndarray, pos: np.ndarray, first: int) -> tuple[slice | np.ndarray, slice | np.ndarray]:
    """Output positions and in-chunk layer positions, as slices when they are runs (fast copies)."""
    src = pos[dst] - first

    def run(a: np.ndarray) -> slice | np.ndarray:
        return slice(int(a[0]), int(a[0]) + len(a)) if np.array_equal(a, np.arange(a[0], a[0] + len(a))) else a

    return run(dst), run(src)


def _coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge sorted, touching byte ranges (frames written back to back)."""
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _dedupe(table: pa.Table, on_duplicate: OnDuplicate) -> tuple[pa.Table, dict[str, list[str]]]:
    """Keep one row per sample id: the earliest commit, preferring a non-quarantined one."""
    ids = table.column("sample_id").to_pylist()
    shards = table.column("shard").to_pylist()
    quarantined = table.column("quarantined").to_pylist()
    chosen: dict[str, int] = {}
    dupes: dict[str, list[str]] = {}
    for i, sid in enumerate(ids):
        j = chosen.setdefault(sid, i)
        if j == i:
            continue
        dupes.setdefault(sid, [shards[j]]).append(shards[i])
        if quarantined[j] and not quarantined[i]:
            chosen[sid] = i  # a valid retry beats an earlier quarantined copy
    keep = sorted(chosen.values())
    if dupes and on_duplicate == "raise":
        sid, where = next(iter(dupes.items()))
        raise DuplicateSampleError(sid, tuple(where), detail=f"{len(dupes)} duplicated id(s); open with on_duplicate='first' to keep the earliest commit")
    if not dupes:
        return table, {}
    return table.take(pa.array(keep, type=pa.int64())), dupes
