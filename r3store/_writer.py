"""`RouteWriter`: the rollout-worker side. Validates, buffers, and commits shards."""

from __future__ import annotations

import json
import math
import os
import re
import uuid
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from r3store._format import (
    INDEX_PREFIX,
    MANIFEST_KEY,
    MAX_CHUNK_IDS,
    MAX_INDEX_ENTRIES,
    ROUTES_PREFIX,
    ArrayGeometry,
    encode_object,
    make_manifest,
    parse_manifest,
    route_codec,
    token_hash,
    write_table,
    zarr_group_json,
)
from r3store._checks import parse_choice, parse_int, parse_optional_int
from r3store._deprecated import renamed_property
from r3store._ingest import decode_sglang
from r3store._spec import ModelSpec
from r3store._validate import as_numpy, check_metadata, check_sample_id, check_routes, check_row_count, check_tokens
from r3store.errors import (
    ContinuationError,
    DiscardedSampleWarning,
    DuplicateSampleError,
    IncompleteSampleError,
    NotAStoreError,
    OptionError,
    RouteValidationError,
    SpecMismatchError,
    StorageError,
    WriterClosedError,
)
from r3store.storage import Backend, open_backend

__all__ = ["RouteWriter"]

_OWN_KEYS = (MANIFEST_KEY, "zarr.json", ROUTES_PREFIX, INDEX_PREFIX)
WRITER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Syntax of a writer id (shard names are ``<writer_id>-<5 digits>``; see schema/FORMAT.md)."""
MAX_TOKENS = 2**40
"""Upper bound on a sample's token count (a forged or garbage value would overflow int64 math)."""


@dataclass
class _Pending:
    """A commit under way: retried under the same shard name with the same bytes."""

    shard: str
    layout: ArrayGeometry
    table: bytes
    count: int
    """How many of the oldest completed samples it commits."""


@dataclass
class _Sample:
    sample_id: str
    parts: list[np.ndarray] = field(default_factory=list)
    rows: int = 0
    num_tokens: int = 0
    token_hash: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None


class RouteWriter:
    """Write routing traces into a store; used inside rollout workers.

    Samples are validated on :meth:`append`, buffered in memory as uint16, and
    committed as one *shard* (a route array plus its Parquet sample table) on
    :meth:`flush`, when the buffer exceeds ``buffer_bytes``, and on :meth:`close` /
    context exit. A reader sees a shard only once its sample table (written last) exists.
    Every writer writes under its own unique shard names, so many writers can share a
    store without locks or a coordinator.

    Parameters
    ----------
    url : str or os.PathLike
        Store location: a local folder or any fsspec URL (``memory://``, ``s3://``).
        Created if absent. A non-empty folder that is not a store is refused.
    spec : ModelSpec
        Must equal the spec of an existing store.
    storage_options : mapping, optional
        Passed to fsspec (``endpoint_url``, ``key``, ``profile``, ...).
    buffer_bytes : int
        Flush once buffered routes exceed this many bytes (2 bytes per id). Peak memory
        is about ``buffer_bytes`` plus one encoded shard object.
    chunk_rows : int
        Rows per inner chunk (the unit of decoding).
    layers_per_chunk : int, optional
        MoE layers per inner chunk (the unit of layer-subset reads). Default: the
        largest divisor of the MoE-layer count up to 4, so a pipeline stage reads
        little beyond its own layers while batches copy 4-layer runs at once.
    shard_bytes : int
        Target size in bytes of one stored object (zarr shard).
    on_invalid : {"raise", "quarantine"}
        ``"quarantine"`` keeps a sample that fails the checks, flagged with the reason,
        instead of raising (it is hidden from readers unless asked for).
    writer_id : str, optional
        Defaults to ``<UTC time>-<random hex>``; must be unique per writer.

    Raises
    ------
    r3store.errors.SpecMismatchError
        The store exists with another spec (nothing is written).
    r3store.errors.NotAStoreError
        The folder holds other files and no ``r3store.json``.
    r3store.errors.StorageError
        The storage backend failed.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    >>> path = tempfile.mkdtemp()
    >>> with r3store.RouteWriter(path, spec) as w:
    ...     w.append("s0", np.array([[[0, 1], [2, 3]]]), num_tokens=2)
    >>> r3store.open_store(path).get("s0").tolist()
    [[[0, 1], [2, 3]]]
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Backend,
        spec: ModelSpec,
        *,
        storage_options: Mapping[str, Any] | None = None,
        buffer_bytes: int = 256 << 20,
        chunk_rows: int = 4096,
        layers_per_chunk: int | None = None,
        shard_bytes: int = 32 << 20,
        on_invalid: Literal["raise", "quarantine"] = "raise",
        writer_id: str | None = None,
    ) -> None:
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be an r3store.ModelSpec, got {type(spec).__name__}")
        parse_choice("on_invalid", on_invalid, ("raise", "quarantine"))
        for name, value in (("buffer_bytes", buffer_bytes), ("chunk_rows", chunk_rows), ("shard_bytes", shard_bytes)):
            parse_int(name, value, minimum=1)
        parse_optional_int("layers_per_chunk", layers_per_chunk, minimum=1)
        if writer_id is not None and (not isinstance(writer_id, str) or not WRITER_ID.fullmatch(writer_id)):
            raise OptionError("writer_id", writer_id, f"must match {WRITER_ID.pattern} (letters, digits, '.', '_', "
                                                      "'-'; no '/', no leading '.')")
        lpc = layers_per_chunk if layers_per_chunk is not None else 1
        if chunk_rows * min(lpc, spec.num_moe_layers) * spec.top_k > MAX_CHUNK_IDS:
            raise OptionError("chunk_rows", chunk_rows,
                              f"chunk_rows x layers_per_chunk x top_k must be <= {MAX_CHUNK_IDS} ids (readers refuse "
                              f"larger chunks), got {chunk_rows} x {lpc} x {spec.top_k}")
        self.spec = spec
        self.store = open_backend(url, storage_options)
        self.writer_id = writer_id or f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"
        self.buffer_bytes = buffer_bytes
        self.chunk_rows = chunk_rows
        self.layers_per_chunk = layers_per_chunk if layers_per_chunk is not None else max(d for d in range(1, 5) if spec.num_moe_layers % d == 0)
        self.shard_bytes = shard_bytes
        self.on_invalid = on_invalid
        self._open: dict[str, _Sample] = {}
        self._done: list[_Sample] = []
        self._buffered = 0
        self._ids: set[str] = set()
        self._meta_types: dict[str, tuple[type, int]] = {}
        self._seq = 0
        self._pending: _Pending | None = None
        self._closed = False
        self.commits: list[str] = []
        """Names of the commits this writer has made (one route array + sample table each)."""
        self._init_store()

    shards = renamed_property("shards", "commits")

    def __repr__(self) -> str:
        return f"RouteWriter({self.store.url!r}, writer_id={self.writer_id!r})"

    # -- store set-up ---------------------------------------------------------------

    def _init_store(self) -> None:
        doc = make_manifest(self.spec)
        if not self.store.exists(MANIFEST_KEY):
            foreign = [k for k in self.store.list_prefix("")
                       if not k.startswith(_OWN_KEYS) and not k.rpartition("/")[2].startswith(".")]
            if foreign:
                raise NotAStoreError(self.store.url, f"folder holds other files ({foreign[0]!r}, ...) and no r3store.json")
            self.store.set_if_absent(MANIFEST_KEY, (json.dumps(doc, indent=2) + "\n").encode())
        self._check_spec()
        for key, attrs in (("zarr.json", {"r3store": {"manifest": MANIFEST_KEY}}), (f"{ROUTES_PREFIX}zarr.json", {})):
            if not self.store.exists(key):
                self.store.set_if_absent(key, json.dumps(zarr_group_json(attrs), indent=2).encode())

    def _check_spec(self) -> None:
        stored = parse_manifest(self.store.get_json(MANIFEST_KEY), self.store.path_of(MANIFEST_KEY))
        if stored != self.spec:
            raise SpecMismatchError(self.store.url, stored.to_dict(), self.spec.to_dict())

    # -- appending ------------------------------------------------------------------

    def append(
        self,
        sample_id: str,
        routes: Any,
        *,
        num_tokens: int | None = None,
        tokens: Any = None,
        metadata: Mapping[str, Any] | None = None,
        start: int = 0,
        final: bool = True,
    ) -> None:
        """Validate and buffer the routes of one sample (or one turn of it).

        Parameters
        ----------
        sample_id : str
            Unique within the store.
        routes : ndarray or torch.Tensor of integer dtype
            Global expert ids, shape ``(rows, num_layers, top_k)`` (all decoder layers,
            dense layers as zero rows, as SGLang sends them) or ``(rows, num_moe_layers,
            top_k)``. Row ``t`` holds the experts chosen for input position ``start + t``.
            Only MoE layers are stored.
        num_tokens : int, optional
            Tokens of the whole sample; the sample must have ``num_tokens - 1`` rows in
            all. Defaults to ``len(tokens)``, else rows + 1. Given with the final call.
        tokens : sequence of int, optional
            Token ids of the whole sample; a BLAKE2b hash is stored so trainers can check
            alignment (:meth:`RouteStore.assemble`).
        metadata : mapping of str to JSON scalar, optional
            User columns for the sample table (step, prompt id, reward, ...).
        start : int
            Multi-turn continuation: first row of these routes within the sample. The
            first call has ``start=0``; each continuation starts where the rows so far end
            (SGLang ``routed_experts_start_len``).
        final : bool
            Whether this call completes the sample. A sample is committed only once final.

        Raises
        ------
        r3store.errors.RouteValidationError
            (and subclasses RouteShapeError, ExpertIdError, RowCountError) the routes are
            malformed; the sample is not buffered (unless ``on_invalid="quarantine"``).
        r3store.errors.DuplicateSampleError
            ``sample_id`` was already appended by this writer.
        r3store.errors.ContinuationError
            ``start`` leaves a gap or overlap.
        r3store.errors.WriterClosedError
        """
        self._check_open()
        check_sample_id(sample_id)
        arr = as_numpy(sample_id, "routes", routes)
        sample = self._sample_for(sample_id, start, len(arr) if arr.ndim else 0)
        types = dict(self._meta_types)  # adopted only if every check passes
        try:
            moe = check_routes(sample_id, arr, self.spec)
            toks = check_tokens(sample_id, tokens) if final else None
            meta = check_metadata(sample_id, metadata, types)
            total = check_row_count(sample_id, sample.rows + len(moe), num_tokens, toks) if final else 0
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            self._quarantine(sample, arr, exc, num_tokens, tokens, metadata, final)
            return
        self._meta_types = types
        self._add_part(sample, moe)
        sample.metadata.update(meta)  # metadata of every turn is kept
        if final:
            sample.num_tokens = total
            sample.token_hash = token_hash(toks) if toks is not None else None
            self._finish(sample)

    def append_sglang(
        self,
        sample_id: str,
        meta_info: Any,
        *,
        num_tokens: int | None = None,
        tokens: Any = None,
        metadata: Mapping[str, Any] | None = None,
        start: int = 0,
        final: bool = True,
    ) -> None:
        """Append SGLang output: ``meta_info["routed_experts"]`` decoded, then :meth:`append`.

        Parameters
        ----------
        meta_info : mapping, str, bytes or array
            SGLang ``/generate`` ``meta_info`` (or the ``routed_experts`` value itself):
            base64 of little-endian int32, flattened ``[rows, num_layers, top_k]``, no
            shape sent (see :func:`r3store.decode_sglang`).

        Other parameters are as for :meth:`append`.

        Raises
        ------
        r3store.errors.PayloadDecodeError
            The payload is not base64 or does not divide into ``(rows, num_layers, top_k)``.
        """
        self._check_open()
        check_sample_id(sample_id)
        try:
            routes = decode_sglang(sample_id, meta_info, self.spec)
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            self._quarantine(self._sample_for(sample_id, start), None, exc, num_tokens, tokens, metadata, final)
            return
        self.append(sample_id, routes, num_tokens=num_tokens, tokens=tokens, metadata=metadata,
                    start=start, final=final)

    def _sample_for(self, sample_id: str, start: int, rows: int = 0) -> _Sample:
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise RouteValidationError(sample_id, "start", f"must be an int >= 0, got {start!r}")
        sample = self._open.get(sample_id)
        if sample is None:
            if sample_id in self._ids:
                raise DuplicateSampleError(sample_id, detail="already appended by this writer")
            if start != 0:
                raise ContinuationError(sample_id, (0, 0), (start, start + rows))
            return _Sample(sample_id)
        if start != sample.rows and sample.reason is None:  # a quarantined sample's rows may be unknown
            raise ContinuationError(sample_id, (0, sample.rows), (start, start + rows))
        return sample

    def _add_part(self, sample: _Sample, moe: np.ndarray) -> None:
        sample.parts.append(moe)
        sample.rows += len(moe)
        self._open[sample.sample_id] = sample
        self._buffered += moe.nbytes

    def _finish(self, sample: _Sample) -> None:
        self._open.pop(sample.sample_id, None)  # absent for a quarantined first call
        self._ids.add(sample.sample_id)
        self._done.append(sample)
        if self._buffered >= self.buffer_bytes:
            self.flush()

    def _quarantine(self, sample: _Sample, arr: np.ndarray | None, exc: RouteValidationError,
                    num_tokens: Any, tokens: Any, metadata: Any, final: bool = True) -> None:
        """Keep a failing sample as received (where it can be bit-packed), flagged.

        A failing turn of a multi-turn sample flags the sample and keeps it open, so its
        later turns append as usual; it is committed, flagged, with its final turn.
        """
        moe = _storable(arr, self.spec)
        stored = "" if moe is not None else " (routes not storable; none kept)"
        if not final:
            if moe is not None:
                self._add_part(sample, moe)
            else:
                self._open[sample.sample_id] = sample
            sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
            return
        self._open.pop(sample.sample_id, None)
        sample.parts = [] if moe is None else sample.parts + [moe]
        sample.rows = sum(len(p) for p in sample.parts)
        self._buffered += 0 if moe is None else moe.nbytes
        valid = isinstance(num_tokens, int | np.integer) and not isinstance(num_tokens, bool)
        nt = int(num_tokens) if valid and 1 <= num_tokens <= MAX_TOKENS else None
        if nt is None and tokens is not None:
            try:
                nt = len(tokens)
            except TypeError:
                nt = None
        sample.num_tokens = max(1, nt if nt is not None else sample.rows + 1)
        try:
            sample.metadata.update(check_metadata(sample.sample_id, metadata, self._meta_types))
        except RouteValidationError:
            pass
        sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
        self._finish(sample)

    # -- committing -----------------------------------------------------------------

    def flush(self) -> str | None:
        """Commit every completed, buffered sample as one shard.

        Returns
        -------
        str or None
            The new shard's name, or None when nothing was buffered.

        Raises
        ------
        r3store.errors.SpecMismatchError
            The store's manifest changed under this writer; nothing is committed.
        r3store.errors.StorageError
            A write failed; nothing is committed and the samples stay buffered.
        """
        self._check_open()
        return self._commit()

    def _commit(self) -> str | None:
        """Commit completed samples; a failed commit is retried under the same name.

        Protocol (schema/FORMAT.md): create ``routes/<shard>/zarr.json`` if absent (this
        reserves the name: a restarted or duplicated writer id moves on to the next
        number), write the shard objects, then create ``index/<shard>.parquet`` if absent.
        If that last create finds our own bytes there, an earlier attempt succeeded
        although its response was lost: the samples are not committed twice.
        """
        shard = None
        while self._done:
            self._check_spec()
            if self._pending is None:
                self._pending = self._reserve(len(self._done))
            shard = self._write_pending(self._pending)
            self.commits.append(shard)
            del self._done[: self._pending.count]
            self._pending = None
            self._buffered = sum(p.nbytes for s in (*self._done, *self._open.values()) for p in s.parts)
        return shard

    def _reserve(self, count: int) -> _Pending:
        layout = self._layout(sum(s.rows for s in self._done[:count]))
        while True:
            shard = f"{self.writer_id}-{self._seq:05d}"
            self._seq += 1
            attrs = {"r3store": {"shard": shard, "writer_id": self.writer_id, "spec": dict(self.spec.to_dict())}}
            doc = (json.dumps(layout.to_zarr_json(attrs), indent=2) + "\n").encode()
            if self.store.set_if_absent(f"{ROUTES_PREFIX}{shard}/zarr.json", doc):
                break
        return _Pending(shard, layout, self._table_bytes(shard, count), count)

    def _write_pending(self, pending: _Pending) -> str:
        array = f"{ROUTES_PREFIX}{pending.shard}"
        parts = (p for s in self._done[: pending.count] for p in s.parts)
        for i, blob in enumerate(self._encode_shards(pending.layout, parts)):
            self.store.set(f"{array}/{ArrayGeometry.object_key(i)}", blob)
        key = f"{INDEX_PREFIX}{pending.shard}.parquet"
        if not self.store.set_if_absent(key, pending.table) and bytes(self.store.get(key)) != pending.table:
            raise StorageError(self.store.path_of(key), "another writer committed this shard name (writer ids must be unique)")
        return pending.shard

    def _layout(self, rows: int) -> ArrayGeometry:
        spec = self.spec
        row_bytes = spec.num_moe_layers * spec.top_k * spec.bits_per_id / 8
        shard_rows = max(self.chunk_rows, math.ceil(self.shard_bytes / row_bytes))
        layer_chunks = math.ceil(spec.num_moe_layers / self.layers_per_chunk)
        shard_rows = min(shard_rows, self.chunk_rows * max(1, MAX_INDEX_ENTRIES // layer_chunks))
        return ArrayGeometry.for_rows(rows, num_moe_layers=spec.num_moe_layers, top_k=spec.top_k,
                                      codec=route_codec(spec), chunk_rows=self.chunk_rows,
                                      layers_per_chunk=self.layers_per_chunk, object_rows=shard_rows)

    @staticmethod
    def _encode_shards(layout: ArrayGeometry, parts: Iterator[np.ndarray]) -> Iterator[bytes]:
        """Yield one encoded object per zarr shard, assembling rows chunk by chunk."""
        blocks = _row_blocks(parts, layout)
        for _ in range(layout.num_objects):
            yield encode_object(blocks, layout)

    def _table_bytes(self, shard: str, count: int) -> bytes:
        now = datetime.now(UTC)
        rows, start = [], 0
        array = f"{ROUTES_PREFIX}{shard}"
        for s in self._done[:count]:
            rows.append({
                "sample_id": s.sample_id, "num_tokens": s.num_tokens, "num_rows": s.rows, "row_start": start,
                "array": array, "shard": shard, "writer_id": self.writer_id, "token_hash": s.token_hash,
                "committed_at": now, "quarantined": s.reason is not None, "reason": s.reason, **s.metadata,
            })
            start += s.rows
        return write_table(rows, sorted(self._meta_types), json.dumps(self.spec.to_dict()))

    # -- lifecycle ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"{self!r} is closed")

    def close(self) -> None:
        """Commit buffered samples and close.

        Raises
        ------
        r3store.errors.StorageError
            The commit failed: the writer stays open with every sample buffered, so
            ``close()`` (or ``flush()``) can be called again.
        r3store.errors.IncompleteSampleError
            Multi-turn samples were still open (non-final); they are not stored, the
            completed samples are committed.
        """
        if self._closed:
            return
        self._commit()
        self._closed = True
        self.store.close()
        if self._open:
            open_ids = sorted(self._open)
            self._open.clear()
            raise IncompleteSampleError(open_ids)

    def __enter__(self) -> RouteWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        discarded = sorted(self._open)
        self._open.clear()
        self.close()  # before warning: a warning filter set to "error" must not skip the commit
        if discarded:
            warnings.warn(DiscardedSampleWarning(f"discarded open samples {discarded}"), stacklevel=2)


def _row_blocks(parts: Iterator[np.ndarray], layout: ArrayGeometry) -> Iterator[np.ndarray]:
    """Re-cut a stream of per-sample arrays into blocks of ``chunk_rows`` rows."""
    block = np.zeros((layout.chunk_rows, layout.num_moe_layers, layout.top_k), dtype=np.uint16)
    fill = 0
    for part in parts:
        i = 0
        while i < len(part):
            take = min(layout.chunk_rows - fill, len(part) - i)
            block[fill : fill + take] = part[i : i + take]
            fill, i = fill + take, i + take
            if fill == layout.chunk_rows:
                yield block
                fill = 0
    if fill:
        yield block[:fill]


def _storable(arr: np.ndarray | None, spec: ModelSpec) -> np.ndarray | None:
    """Routes of a quarantined sample, when they fit the store's array geometry."""
    if arr is None or arr.ndim != 3 or arr.shape[2] != spec.top_k or not np.issubdtype(arr.dtype, np.integer):
        return None
    if arr.shape[1] == spec.num_layers and spec.num_layers != spec.num_moe_layers:
        arr = arr[:, list(spec.moe_layers)]
    if arr.shape[1] != spec.num_moe_layers:
        return None
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << spec.bits_per_id):
        return None
    return arr.astype(np.uint16)
