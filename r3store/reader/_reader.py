"""``RouteReader``: random access to committed routes by sample id, row range and layer range."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from r3store._checks import check_id_sequence, parse_int, resolve_config
from r3store._deprecated import warn
from r3store._format import (
    MANIFEST_KEY,
    ArrayGeometry,
    Manifest,
    is_immutable_key,
    loads_document,
    parse_manifest,
)
from r3store._spec import ModelSpec
from r3store.errors import ChecksumError, NotAStoreError, ObjectNotFoundError, OptionError, SampleNotFoundError
from r3store.reader._catalog import (
    Preloaded,
    SampleCatalog,
    StorageUsage,
    committed_commits,
    storage_usage,
)
from r3store.reader._chunks import ChunkReader
from r3store.reader._options import ReaderOptions, ReaderOptionsDict
from r3store.reader._pool import BufferPool
from r3store.reader._ranges import sample_layers, sample_rows, sample_span
from r3store.storage import Backend, open_backend

__all__ = ["RouteReader", "open_reader"]


class RouteReader:
    """A committed store, opened for reading (users: :func:`r3store.open_store`, which returns
    a :class:`r3store.RouteStore`, this class plus ``assemble``).

    The read core: the sample catalogue (which sample lives where) and a chunk reader
    (ranged reads, decode, cache). It returns numpy arrays; laying routes out for a
    trainer is :func:`r3store.batch.assemble` (or :meth:`r3store.RouteStore.assemble`).
    The layers below the facade (dataset, ray, audit, CLI) open stores with
    :meth:`RouteReader.open`.

    Parameters
    ----------
    backend : Backend
        Where the store's objects are.
    manifest : Manifest
        The store's checked manifest (format version, spec, cap on rows per sample).
    reader : ReaderOptions or ReaderOptionsDict, optional
        The reader's options passed whole (see :class:`r3store.reader.ReaderOptions`);
        ``cache_dir`` is not applied here (the backend is given: :meth:`open` applies it).
    preloaded : r3store.reader.Preloaded, optional
        Sample rows loaded and verified elsewhere, with the commits they cover (only the
        other commits' sample tables are read).
    **deprecated
        ``on_duplicate``, ``cache_bytes``, ``max_sample_rows``, ``commits``, ``filter``,
        ``use_checkpoint``: fields of ``reader`` given one by one; they warn
        (:class:`r3store.errors.R3StoreDeprecationWarning`) and are removed in 0.4.0.

    Attributes
    ----------
    backend : Backend
    options : ReaderOptions
        The options in effect.
    spec : ModelSpec
    format_version : int
        The store's format version (1 or 2).
    samples : pyarrow.Table
        One row per committed sample, quarantined ones included (columns of
        ``schema/sample_table.schema.json`` plus user metadata), in store order. A
        metadata column whose type differs between writers (int here, str there) is
        read as strings.
    duplicates : dict of str to list of str
        Sample ids committed by more than one commit, with the commits (earliest first).

    Notes
    -----
    Not thread-safe (the chunk cache is shared state): give each thread its own reader
    with :meth:`fork`. Pickles without its caches (DataLoader workers).
    """

    def __init__(self, backend: Backend, manifest: Manifest, *,
                 reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
                 preloaded: Preloaded | None = None, **deprecated: Any) -> None:
        opts = resolve_config(ReaderOptions, "RouteReader", "reader", reader, deprecated)
        self.options = opts
        self.backend = backend
        self.spec: ModelSpec = manifest.spec
        self.format_version = manifest.version
        self._catalog = SampleCatalog(backend, manifest, on_duplicate=opts.on_duplicate,
                                      max_sample_rows=opts.max_sample_rows, preloaded=preloaded,
                                      commits=opts.commits, filter=opts.filter, use_checkpoint=opts.use_checkpoint,
                                      on_damaged_table=opts.on_damaged_table)
        self._chunks = ChunkReader(backend, manifest, self._catalog.array_rows, cache_bytes=opts.cache_bytes,
                                   pool=BufferPool(opts.output_pool_bytes))

    @classmethod
    def open(
        cls,
        url: str | os.PathLike[str] | Backend,
        *,
        reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        **deprecated: Any,
    ) -> Self:
        """Open the store at ``url`` (users: :func:`r3store.open_store`, which takes the same
        parameters and is documented there; this is the constructor of the layers below it).

        Raises
        ------
        r3store.errors.NotAStoreError, r3store.errors.FormatError, r3store.errors.DuplicateSampleError,
        r3store.errors.OptionError, r3store.errors.StorageError
            As :func:`r3store.open_store`.
        """
        opts = resolve_config(ReaderOptions, f"{cls.__name__}.open", "reader", reader, deprecated)
        return cls._open(url, opts, storage_options)

    @classmethod
    def _open(cls, url: str | os.PathLike[str] | Backend, options: ReaderOptions,
              storage_options: Mapping[str, Any] | None) -> Self:
        backend = open_backend(url, storage_options, cache_dir=options.cache_dir, immutable=is_immutable_key)
        try:
            raw = backend.get(MANIFEST_KEY)
        except ObjectNotFoundError as exc:
            raise NotAStoreError.missing_manifest(backend) from exc
        path = backend.path_of(MANIFEST_KEY)
        manifest = parse_manifest(loads_document(raw, path), path)
        return cls(backend, manifest, reader=options)

    # -- the catalogue ----------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL (credentials masked)."""
        return self.backend.url

    @property
    def samples(self) -> pa.Table:
        """One row per committed sample (see the class attributes)."""
        return self._catalog.samples

    @property
    def duplicates(self) -> dict[str, list[str]]:
        """Sample ids committed by more than one commit, with the commits (earliest first)."""
        return self._catalog.duplicates

    @property
    def commits(self) -> list[str]:
        """Names of the committed commits (one per writer commit) this reader reads, in name order."""
        return list(self._catalog.commits)

    @property
    def skipped_commits(self) -> dict[str, str]:
        """Commits left out because their sample table fails its checks, with the fault
        (``"<table path>: <what is wrong>"``), in name order; empty unless the reader was
        opened with ``on_damaged_table="skip"`` (see :class:`r3store.reader.ReaderOptions`).
        Each was warned about once (:class:`r3store.errors.DamagedTableWarning`)."""
        return self._catalog.skipped

    @property
    def manifest(self) -> Manifest:
        """The store's checked manifest (format version, spec, cap on rows per sample)."""
        return self._catalog.manifest

    @property
    def checkpoint(self) -> str | None:
        """Key of the checkpoint the reader started from (``index/<covered>-<token>.checkpoint``), or None when it
        read every sample table (no valid checkpoint, ``use_checkpoint=False``, ``commits=``)."""
        return self._catalog.checkpoint

    @property
    def filter(self) -> pc.Expression | None:
        """The ``filter=`` the reader was opened with (None: every sample)."""
        return self._catalog.filter

    def refresh(self) -> int:
        """Pick up the commits made since the reader was opened (or last refreshed).

        One listing of ``index/`` (after a checkpoint: of its buckets, then of each bucket
        from the checkpoint's watermark on) and one read per new sample table; samples
        already known keep their place, the new ones are merged in store order (so
        :attr:`sample_ids` may grow in the middle when a commit's clock was behind).
        The ``filter=`` applies to the new samples too. Nothing changes when a new table
        fails its checks (with ``on_damaged_table="skip"``: its commit is skipped, warned
        and added to :attr:`skipped_commits`; the others are added).

        Returns
        -------
        int
            Number of samples added (visible ones: not quarantined, passing the filter).

        Raises
        ------
        r3store.errors.OptionError
            The reader was opened on some commits only (``commits=``).
        r3store.errors.FormatError, r3store.errors.DuplicateSampleError, r3store.errors.StorageError
            As :func:`open_reader`.
        """
        return self._catalog.refresh(self.backend)

    @property
    def is_partial(self) -> bool:
        """Whether the reader was opened on some commits only (``commits=``)."""
        return not self._catalog.complete

    @property
    def sample_ids(self) -> list[str]:
        """Ids of the committed, non-quarantined samples, in store order."""
        return list(self._catalog.visible)

    @property
    def is_local(self) -> bool:
        """Whether the store is on a local disk (reads are ``pread`` calls)."""
        return self.backend.is_local

    @property
    def cache_bytes(self) -> int:
        """Budget for decoded chunks kept in memory (settable)."""
        return self._chunks.cache_bytes

    @cache_bytes.setter
    def cache_bytes(self, value: int) -> None:
        self._chunks.cache_bytes = parse_int("cache_bytes", value, minimum=0)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, samples={len(self)}, spec={self.spec})"

    def __len__(self) -> int:
        """Committed, non-quarantined samples."""
        return self._catalog.num_visible

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self._catalog

    def __iter__(self) -> Iterator[str]:
        return iter(self._catalog.visible)

    def num_tokens(self, sample_id: str, *, include_quarantined: bool = False) -> int:
        """Token count of a sample (its routes have ``num_tokens - 1`` rows).

        Raises
        ------
        r3store.errors.SampleNotFoundError
        """
        return int(self._catalog.num_tokens[self._catalog.locate(sample_id, include_quarantined=include_quarantined)])

    def row(self, sample_id: str, *, include_quarantined: bool = False) -> dict[str, Any]:
        """The sample-table row of one sample, as a dict.

        Raises
        ------
        r3store.errors.SampleNotFoundError
        """
        catalog = self._catalog
        return catalog.row(catalog.locate(sample_id, include_quarantined=include_quarantined))

    def missing_rows(self, sample_id: str, *, include_quarantined: bool = False) -> list[tuple[int, int]]:
        """Half-open row ranges of a sample the engine could not capture (``get`` returns -1 there).

        Empty for a sample without missing rows and for every sample of a format v1 store.

        Raises
        ------
        r3store.errors.SampleNotFoundError
        """
        return self._catalog.missing_rows(self._catalog.locate(sample_id, include_quarantined=include_quarantined))

    def policy_spans(self, sample_id: str, *, include_quarantined: bool = False) -> list[tuple[int, int, int]]:
        """Which policy (weight) version produced which rows of a sample.

        Returns
        -------
        list of (int, int, int)
            ``(start, stop, version)``: half-open row ranges covering the sample's rows in
            order, as given to :meth:`r3store.RouteWriter.append` (``policy_version=``) part by
            part (adjacent parts of one version merged). Empty when no version was given.

        Raises
        ------
        r3store.errors.SampleNotFoundError

        Examples
        --------
        >>> import numpy as np, r3store, tempfile
        >>> spec = r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)
        >>> path = tempfile.mkdtemp()
        >>> with r3store.RouteWriter(path, spec) as w:
        ...     w.append("chat", np.zeros((3, 1, 1), int), final=False, policy_version=7)
        ...     w.append("chat", np.ones((2, 1, 1), int), start=3, policy_version=8)
        >>> r3store.open_store(path).policy_spans("chat")
        [(0, 3, 7), (3, 5, 8)]
        """
        return self._catalog.policy_spans(self._catalog.locate(sample_id, include_quarantined=include_quarantined))

    def storage_usage(self) -> StorageUsage:
        """Bytes of committed route objects, sample tables and uncommitted leftovers (lists the store;
        a reader of some commits only, or one that started from a checkpoint (which lists only the
        buckets from its watermark on), lists ``index/`` too, so no committed array is taken for a leftover)."""
        catalog = self._catalog
        complete = catalog.complete and catalog.watermark is None
        committed = catalog.commits if complete else committed_commits(self.backend)
        return storage_usage(self.backend, set(committed).union(catalog.skipped))  # a damaged table is a table

    # -- reading ----------------------------------------------------------------------

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
            Global decoder-layer indices (MoE layers only, each at most once), in the order
            wanted, e.g. one pipeline stage's layers. Only the chunks of these layers are read
            and decoded.
        rows : slice, optional
            Row range (step 1) within the sample; a negative index counts from the sample's
            end. A range reaching past the sample is refused, never clipped
            (``r3store.reader._ranges`` states the rules).
        include_quarantined : bool
            Also return samples the writer quarantined.
        out : ndarray of int32, optional
            Destination of the result's shape (e.g. a slice of a batch buffer): writable, of
            a signed integer dtype holding every expert id (int16, int32, int64).

        Returns
        -------
        ndarray of int32, shape (num_tokens - 1, len(layers), top_k)
            Row ``t``: expert ids chosen for input position ``t``; layers default to all
            MoE layers in ``spec.moe_layers`` order; ``rows`` keeps its rows only. Rows the
            engine could not capture (:meth:`missing_rows`) hold -1 in every slot. Without
            ``out``, a new C-contiguous view of a buffer with room for the rest of the
            sample's first and last row chunks (so every chunk decodes in place; at most
            ``2 * chunk_rows - 2`` rows more): two calls never share memory. With ``out``:
            ``out`` itself, in its dtype.

        Raises
        ------
        TypeError
            A plain ``TypeError`` (no r3store error, raised before anything is read):
            ``sample_id`` is not a str; ``rows`` is not a slice (an int, a tuple, a str:
            the message shows the slice to use); ``layers`` is not a sequence (an int, a
            str) or holds other than ints (bools and floats included).
        r3store.errors.SampleNotFoundError
            (a KeyError) no such committed sample, or a quarantined sample whose routes
            could not be stored (none were kept), with or without ``include_quarantined``.
        r3store.errors.LayerError
            (an IndexError) a layer is not an MoE layer of the spec, or is asked for twice
            (names the sample and ``layers``).
        r3store.errors.RangeError
            (an OptionError and an IndexError) ``rows`` reaches past either end of the
            sample, ends before it starts, has a step other than 1, or a bound that is not
            an int; names the sample, ``rows`` and the sample's rows.
        r3store.errors.OptionError
            ``out`` is not a numpy array, has the wrong shape, is read-only, or its dtype
            is not a signed integer holding -1 and every expert id.
        r3store.errors.ChecksumError
            (a FormatError) a chunk fails its CRC-32C or its position tag; names the array
            and chunk ``(row chunk, layer chunk, 0)``, and the sample, its rows and the
            decoder layer(s) the chunk holds.
        r3store.errors.FormatError
            The sample's route array document is malformed or disagrees with its sample
            table or the manifest, or a frame or object index is malformed.
        r3store.errors.UnknownCodecError
            The array's codec is not registered (the message says how to install it).
        r3store.errors.StorageError
            Reading an object failed (its subclass ``ObjectNotFoundError``: an object of a
            committed sample is gone).
        """
        catalog = self._catalog
        try:
            i = catalog.locate(sample_id, include_quarantined=include_quarantined)
        except SampleNotFoundError as exc:
            if exc.quarantined is None:
                raise
            i = catalog.locate(sample_id, include_quarantined=True)  # no rows: say so now, not after a retry
            if catalog.num_rows[i] > 0 or self.num_tokens(sample_id, include_quarantined=True) <= 1:
                raise
        if catalog.num_rows[i] == 0 and self.num_tokens(sample_id, include_quarantined=True) > 1:
            row = self.row(sample_id, include_quarantined=True)
            raise SampleNotFoundError(sample_id, self.url, quarantined=row["reason"] or "",
                                      hint="its routes could not be stored (none were kept), so it has no rows to "
                                           "read, with or without include_quarantined=True; "
                                           "store.row(sample_id, include_quarantined=True) returns its sample-table "
                                           "row (reason, tokens, metadata)")
        positions = sample_layers(self.spec, sample_id, layers)
        start, stop = sample_rows(sample_id, rows, int(catalog.num_rows[i]))
        base = int(catalog.row_start[i])
        array = catalog.array[i]
        _check_out(out, self.spec.num_experts - 1, signed=True)
        geometry = self._chunks.geometry(array)  # the whole array must match its sample table
        try:
            got = self._chunks.read_rows(array, base + start, base + stop, positions, out=out)
        except ChecksumError as exc:
            raise _in_sample(exc, sample_id, base, int(catalog.num_rows[i]), geometry, self.spec) from None
        for a, b in catalog.missing_rows(i):
            if a < stop and b > start:
                got[max(a, start) - start : min(b, stop) - start] = -1
        return got

    def get_runs(self, runs: Sequence[tuple[str, int, int]], layers: Sequence[int] | None = None, *,
                 out: np.ndarray, at: Sequence[int] | None = None) -> np.ndarray:
        """Row ranges of several samples, back to back in ``out``: a rank-local read.

        Only the frames holding the asked rows and layers are fetched and decoded; the
        frames of all runs in one storage object are coalesced into the fewest ranged
        requests, each frame is fetched once, and decoded chunks are not cached (scratch:
        the packed bytes of one storage object's needed frames and one decoded chunk).

        Parameters
        ----------
        runs : sequence of (sample_id, start, stop)
            Rows ``[start, stop)`` of a committed sample, in output order.
        layers : sequence of int, optional
            Global decoder-layer indices (MoE layers only), in the order wanted.
        out : ndarray of integer dtype, shape (n, len(layers), top_k)
            Destination (int32, or a narrower dtype holding every expert id). Rows the
            engine could not capture (:meth:`missing_rows`) hold what is stored there
            (zeros), unlike :meth:`get`: callers mask them. Whole frames are decoded
            straight into it.
        at : sequence of int, optional
            Output row of each run's first row; default: the runs back to back from row 0
            (then ``n`` must be the sum of the run lengths).

        Returns
        -------
        ndarray
            ``out``.

        Raises
        ------
        r3store.errors.SampleNotFoundError
        r3store.errors.LayerError
        r3store.errors.OptionError
            A run is not a ``(str, int, int)`` within its sample's rows, ``at`` holds
            other than ints >= 0, or ``out`` has the wrong shape, is read-only, or is not
            of an integer dtype holding every expert id.
        r3store.errors.ChecksumError, r3store.errors.FormatError, r3store.errors.StorageError
        """
        catalog = self._catalog
        positions = tuple(range(self.spec.num_moe_layers)) if layers is None else self.spec.layer_positions(layers)
        runs = [_parse_run(run) for run in runs]
        top_id = self.spec.num_experts - 1
        if not isinstance(out, np.ndarray) or out.dtype.kind not in "iu" or np.iinfo(out.dtype).max < top_id \
                or not out.flags.writeable:
            what = f"<array of {out.dtype}>" if isinstance(out, np.ndarray) else f"<{type(out).__name__}>"
            raise OptionError("out", what, f"must be a writable integer array holding expert id {top_id}")
        lengths = [stop - start for _, start, stop in runs]
        rows_out = sum(lengths) if at is None else len(out)
        shape = (rows_out, len(positions), self.spec.top_k)
        if out.shape != shape:
            raise OptionError("out", f"<array of shape {out.shape}>", f"must have shape {shape}")
        starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)[:-1]]).tolist() if at is None else \
            [parse_int("at", v, minimum=0) for v in at]
        if len(starts) != len(runs):
            raise OptionError("at", f"<{len(starts)} rows>", f"must give one output row per run ({len(runs)})")
        by_array: dict[str, list[tuple[int, int, int]]] = {}
        for (sample_id, start, stop), first in zip(runs, starts, strict=True):
            i = catalog.locate(sample_id)
            sample_span(sample_id, "runs", (sample_id, start, stop), start, stop, int(catalog.num_rows[i]))
            base = int(catalog.row_start[i])
            by_array.setdefault(catalog.array[i], []).append((base + start, base + stop, int(first)))
        for array, array_runs in by_array.items():
            self._chunks.geometry(array)  # the whole array must match its sample table
            self._chunks.read_runs(array, array_runs, positions, out)
        return out

    def prefetch(self, sample_ids: Sequence[str]) -> None:
        """Fetch concurrently the metadata reading these samples needs and is not cached yet:
        the array documents of their commits, then the indexes of the storage objects holding
        them. On object stores that is two rounds of parallel requests instead of two sequential
        requests per commit before the first frame; on local disk only the documents are read.
        The frames themselves are left to the (rank-local) read that follows, which fetches only
        the rows and layers it needs. Unknown ids are skipped (the read reports them).

        Raises
        ------
        r3store.errors.StorageError
        r3store.errors.FormatError
            An array document is malformed.
        """
        catalog = self._catalog
        spans: dict[str, list[tuple[int, int]]] = {}
        for sid in sample_ids:
            i = catalog._where.get(sid) if isinstance(sid, str) else None
            if i is not None:
                start = int(catalog.row_start[i])
                spans.setdefault(catalog.array[i], []).append((start, start + max(1, int(catalog.num_rows[i]))))
        if not spans:
            return
        self._chunks.prefetch({a: [] for a in spans})  # the documents, to learn each array's geometry
        wanted: dict[str, list[int]] = {}
        for array, ranges in spans.items():
            geometry = self._chunks.geometry(array, partial=True)
            per_object = geometry.row_chunks_per_object * geometry.chunk_rows
            wanted[array] = sorted({o for a, b in ranges for o in range(a // per_object, (b - 1) // per_object + 1)})
        self._chunks.prefetch(wanted)

    def get_many(self, sample_ids: Sequence[str], layers: Sequence[int] | None = None) -> list[np.ndarray]:
        """Routes of several samples (see :meth:`get`), in the order given.

        A sample id may appear more than once (oversampling is legitimate): each occurrence
        gets its own array holding the sample's routes (no two share memory).

        Parameters
        ----------
        sample_ids : sequence of str
            Not a single str (refused: it would be iterated as its characters).
        layers : sequence of int, optional
            As for :meth:`get`, the same for every sample.

        Returns
        -------
        list of ndarray of int32
            One ``(num_tokens - 1, len(layers), top_k)`` array per id (see :meth:`get`).

        Raises
        ------
        TypeError
            ``sample_ids`` is a str, bytes, a set (no order) or not iterable, or an
            id is not a str; ``layers`` as in :meth:`get`.
        r3store.errors.SampleNotFoundError, r3store.errors.LayerError
            As in :meth:`get`, for the first id that fails (no list is returned).
        r3store.errors.ChecksumError, r3store.errors.FormatError
            As in :meth:`get`.
        r3store.errors.UnknownCodecError, r3store.errors.StorageError
            As in :meth:`get`.
        """
        check_id_sequence(sample_ids)
        return [self.get(s, layers) for s in sample_ids]

    def geometry_of(self, array: str, *, partial: bool = False) -> ArrayGeometry:
        """Shape, codec and chunking of a committed route array (parsed from its ``zarr.json``).

        Parameters
        ----------
        array : str
            ``routes/<commit>`` of a committed commit (the sample table's ``array``).
        partial : bool
            Accept an array with fewer rows than its sample table names (audits report
            the samples past its end); never more.

        Raises
        ------
        r3store.errors.FormatError
            ``array`` is not a committed route array, or its ``zarr.json`` is malformed,
            disagrees with the manifest spec, has other than the rows its sample table
            names (the end of its last sample), or configures its codec wrongly.
        r3store.errors.UnknownCodecError
            The array's codec is not registered (the message says how to install it).
        """
        return self._chunks.geometry(array, partial=partial)

    def read_rows(self, array: str, start: int, stop: int, positions: Sequence[int],
                  out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of a route array, at stored layer positions.

        The low-level read under :meth:`get` (no sample table rows, no missing-row fill).

        Parameters
        ----------
        array : str
            ``routes/<commit>`` of a committed commit (the sample table's ``array``).
        start, stop : int
            Rows of the array (not of a sample: a sample's rows start at its ``row_start``).
        positions : sequence of int
            Stored layer positions, ``0 .. num_moe_layers - 1`` (what
            ``spec.layer_positions(layers)`` returns), in the order wanted, each once.
        out : ndarray, optional
            Destination of shape ``(stop - start, len(positions), top_k)``, of an integer
            dtype holding every expert id (unsigned allowed: nothing is filled with -1).

        Returns
        -------
        ndarray of int32, shape (stop - start, len(positions), top_k)
            ``out`` when given (in its dtype). Rows the engine could not capture hold what
            is stored there (zeros), unlike :meth:`get`.

        Raises
        ------
        r3store.errors.FormatError
            ``array`` is not a committed route array, its document is malformed, the rows
            lie past the array's end (an array shorter than its sample table is read up to
            its end, for audits; see :meth:`geometry_of`), or a frame or index is malformed.
        r3store.errors.ChecksumError
            (a FormatError) a chunk fails its CRC-32C or its position tag.
        r3store.errors.OptionError
            ``start`` or ``stop`` is no int, ``start`` is negative or ``stop < start``, a
            position is no int, out of range or repeated, or ``out`` is not a numpy array,
            has the wrong shape, is read-only or is not of an integer dtype holding every
            expert id.
        r3store.errors.UnknownCodecError
            The array's codec is not registered.
        r3store.errors.StorageError
            Reading an object failed.
        """
        start = parse_int("start", start, minimum=0)
        stop = parse_int("stop", stop, minimum=start)
        positions = _check_positions(positions, self.spec.num_moe_layers)
        _check_out(out, self.spec.num_experts - 1, signed=False)
        return self._chunks.read_rows(array, start, stop, positions, out)

    def read_runs(self, array: str, runs: Sequence[tuple[int, int, int]], positions: Sequence[int],
                  out: np.ndarray) -> np.ndarray:
        """Several row ranges ``(start, stop, at)`` of one route array at stored layer
        positions, into ``out`` rows ``[at, at + stop - start)``: each needed frame is
        fetched and decoded once (in place, batched, where the rows and layers allow).

        ``out`` is an integer array of shape ``(n, len(positions), top_k)`` (ids cast to
        its dtype: int32 or a narrower one holding every expert id). Rows are not checked
        against the sample table (call :meth:`geometry_of` first, as :meth:`get` does);
        rows the engine could not capture hold what is stored (zeros).

        Raises
        ------
        r3store.errors.FormatError
            A run lies past the array's end, or a frame or index is malformed.
        r3store.errors.ChecksumError
        r3store.errors.OptionError
            A run is reversed or negative, a position is no int, out of range or repeated,
            or ``out`` has the wrong shape, is read-only or is not of an integer dtype
            holding every expert id.
        """
        positions = _check_positions(positions, self.spec.num_moe_layers)
        _check_out(out, self.spec.num_experts - 1, signed=False)
        return self._chunks.read_runs(array, runs, positions, out)

    # -- lifecycle --------------------------------------------------------------------

    def fork(self, *, cache_bytes: int | None = None) -> Self:
        """A reader of the same store for another thread: shares the catalogue (read-only),
        has its own chunk cache and backend handles (a local backend's own descriptors; an fsspec
        backend shares its thread-safe filesystem)."""
        clone = copy.copy(self)
        clone.backend = copy.copy(self.backend)
        clone._chunks = self._chunks.fork(clone.backend, cache_bytes=cache_bytes)
        return clone

    @property
    def buffer_pool(self) -> BufferPool:
        """Where the arrays this reader returns are built (``ReaderOptions.output_pool_bytes``;
        shared by :meth:`fork`'s readers, empty in a pickled copy)."""
        return self._chunks.pool

    def clear_cache(self) -> None:
        """Drop decoded chunks and object indexes held in memory (the output memory of
        :attr:`buffer_pool` stays: :meth:`close` releases it)."""
        self._chunks.clear()

    def close(self) -> None:
        """Release caches, pooled output memory and file maps; the reader reopens them on
        demand (arrays already returned stay valid)."""
        self.clear_cache()
        self._chunks.pool.clear()
        self.backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_reader(
    url: str | os.PathLike[str] | Backend,
    *,
    reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **deprecated: Any,
) -> RouteReader:
    """Deprecated (removed in r3store 0.4.0): use :func:`r3store.open_store`, which takes the
    same parameters and returns a :class:`r3store.RouteStore` (a RouteReader plus
    ``assemble``); code below the facade uses :meth:`RouteReader.open`.

    Warns
    -----
    r3store.errors.R3StoreDeprecationWarning
        Always; once more per loose reader keyword (``on_duplicate=``, ``commits=``, ...).
    """
    warn("r3store.open_reader", "r3store.open_store(url, reader=ReaderOptions(...))")
    opts = resolve_config(ReaderOptions, "open_reader", "reader", reader, deprecated)
    return RouteReader._open(url, opts, storage_options)


def _check_positions(positions: Sequence[int], num_moe_layers: int) -> list[int]:
    """Stored layer positions as a list of ints, each in ``[0, num_moe_layers)`` and given once
    (a negative one would read another layer's frames and fail their position tags, one past
    the end index out of the object's table)."""
    if isinstance(positions, str | bytes) or not isinstance(positions, Sequence | np.ndarray):
        raise OptionError("positions", positions, "must be a sequence of stored layer positions (ints)")
    out = [parse_int("positions", p, minimum=0, maximum=num_moe_layers - 1) for p in positions]
    if len(set(out)) != len(out):
        raise OptionError("positions", list(positions), "must name each stored layer position once")
    return out


def _check_out(out: np.ndarray | None, top_id: int, *, signed: bool) -> None:
    """Refuse an ``out`` that would not hold every expert id (``signed``: and -1, the fill of
    missing rows), or is read-only: ids would wrap silently, or a write fail half-way."""
    if out is None:
        return
    kinds = "i" if signed else "iu"
    if isinstance(out, np.ndarray) and out.dtype.kind in kinds and np.iinfo(out.dtype).max >= top_id \
            and out.flags.writeable:
        return
    what = f"<array of {out.dtype}>" if isinstance(out, np.ndarray) else f"<{type(out).__name__}>"
    need = "signed integer array holding -1 (missing rows) and" if signed else "integer array holding"
    raise OptionError("out", what, f"must be a writable {need} expert id {top_id}")


def _parse_run(run: Any) -> tuple[str, int, int]:
    """One ``(sample_id, start, stop)`` of :meth:`RouteReader.get_runs`, checked for types."""
    if not isinstance(run, tuple | list) or len(run) != 3 or not isinstance(run[0], str):
        raise OptionError("runs", run, "each run must be (sample_id: str, start: int, stop: int)")
    start, stop = parse_int("runs", run[1]), parse_int("runs", run[2])
    if stop < start:
        raise OptionError("runs", run, "stop must be >= start")
    return run[0], start, stop


def _in_sample(exc: ChecksumError, sample_id: str, base: int, num_rows: int, geometry: ArrayGeometry,
               spec: ModelSpec) -> ChecksumError:
    """``exc`` (a chunk of a route array failing its checks during a read of ``sample_id``, whose
    rows start at array row ``base``) with the sample, its rows and the decoder layers the chunk
    holds; an object index (its first chunk's coordinates) holds every layer of its rows."""
    if len(exc.chunk) != 3:
        return exc
    c, b, _ = exc.chunk
    fault = re.sub(r"^chunk \([\d, ]*\): ", "", exc.fault)
    if "index" in fault:  # the object index: every row chunk of the object, every layer
        lo, hi = c * geometry.chunk_rows, (c + geometry.row_chunks_per_object) * geometry.chunk_rows
        layers = list(spec.moe_layers)
        what = f"storage object {c // geometry.row_chunks_per_object}: array rows {lo}-{hi - 1}, every layer"
    else:
        lo, hi = c * geometry.chunk_rows, (c + 1) * geometry.chunk_rows
        lpc = geometry.layers_per_chunk
        layers = list(spec.moe_layers[b * lpc : (b + 1) * lpc])
        what = f"row chunk {c}: array rows {lo}-{hi - 1}; layer chunk {b}"
    first, last = max(lo, base) - base, min(hi, base + num_rows) - base - 1
    rows = f"rows {first}-{last}" if last >= first else "no rows"
    named = f"decoder layer {layers[0]}" if len(layers) == 1 else \
        f"decoder layers {', '.join(map(str, layers[:8]))}{' ...' if len(layers) > 8 else ''}"
    return ChecksumError(exc.array, exc.chunk, f"{fault}; sample {sample_id!r}, its {rows}, {named} ({what})")
