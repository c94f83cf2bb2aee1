"""The commit protocol (``schema/FORMAT.md`` section 2) and the sizing of storage objects.

A commit writes, in this order: ``routes/<commit>/zarr.json`` created only if absent
(this reserves the name), every storage object of the route array, then
``index/<bucket>/<commit>.parquet`` created only if absent (this commits it). A failed
commit is retried under the same name with the same bytes, and every retry rewrites every
object of it (``zarr.json`` is created again if absent, else checked byte-identical), so a
commit whose leftovers ``r3store gc --delete`` removed in between is still complete.
Finding its own sample table already there means an earlier attempt succeeded although its
answer was lost.

``<bucket>`` is the UTC hour of the first attempt to write the table. A retry within
:data:`BUCKET_REUSE` of that attempt writes the same key; a later one first looks for the old
key (found: the commit is done) and otherwise writes under the current hour. So a table that
lands at time ``t`` has a bucket no older than the hour of ``t - 15 min`` (what
checkpoints rely on).

The writer's clock may be wrong. Before it acknowledges a commit the writer reads the
store's timestamp of the table it wrote (file mtime, S3 ``LastModified``) and, when the
table's bucket is older than the hour of that time less 15 minutes (a checkpoint taken just
before it landed would not list that bucket), writes the same bytes again under the bucket
of the store's time (FORMAT.md section 12.2), with a :class:`r3store.errors.ClockSkewWarning`.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from r3store._format import (
    DEFAULT_MAX_SAMPLE_ROWS,
    FORMAT_VERSION,
    INDEX_PREFIX,
    MANIFEST_KEY,
    MAX_CHUNK_IDS,
    MAX_INDEX_ENTRIES,
    MAX_ROWS,
    ROUTES_PREFIX,
    ArrayGeometry,
    Manifest,
    array_key,
    bucket_of,
    encode_object,
    loads_document,
    make_manifest,
    manifest_bytes,
    parse_manifest,
    route_codec,
    table_key,
    tag_prefix,
    watermark_of,
    write_table,
    zarr_group_json,
)
from r3store._spec import ModelSpec
from r3store.codecs import SetCodec
from r3store.errors import (
    ClockSkewWarning,
    FormatError,
    FormatVersionError,
    NotAStoreError,
    OptionError,
    SpecMismatchError,
    StorageError,
    StoreIdentityError,
)
from r3store.storage import Backend
from r3store.writer._buffer import Sample, materialize

__all__ = ["BUCKET_REUSE", "Committer", "default_layers_per_chunk"]

BUCKET_REUSE = timedelta(minutes=10)
"""A retry this soon after the first attempt to write a sample table reuses its bucket."""

_OWN_KEYS = (MANIFEST_KEY, "zarr.json", ROUTES_PREFIX, INDEX_PREFIX)


MANY_LAYERS = 32
"""From this many MoE layers, :func:`default_layers_per_chunk` weighs frame overhead against padding."""
FRAME_OVERHEAD = {"bitpack": 24 + 16, "set": 32 + 16}
"""Bytes a frame costs beyond its ids: its header and its entry in the object index."""


def default_layers_per_chunk(spec: ModelSpec, chunk_rows: int = 128, codec: str = "bitpack") -> int:
    """MoE layers per inner chunk when the writer is not told (1 to 4, so a pipeline stage
    reads little beyond its own layers while batches copy 4-layer runs at once).

    Fewer than :data:`MANY_LAYERS` MoE layers: the largest divisor of their count up to 4.
    From :data:`MANY_LAYERS` on, the ``d`` in 1..4 of the least stored overhead: the padded
    layers (``ceil(n / d) * d - n`` zero layers in the last layer chunk, a fraction of
    ``n``) plus the frame's fixed cost (:data:`FRAME_OVERHEAD`) over its coded ids
    (``chunk_rows * d * top_k`` ids of ``bits_per_id`` bits, ``log2 C(E, k) / k`` for
    ``codec="set"``); ties go to the larger ``d``. A divisor of ``n`` is never worse than
    a smaller one, so 48 or 92 layers keep 4, and 58 layers (divisors 1, 2, 29, 58) keep
    2: a third or fourth layer per chunk would pad 3.4% of the array to save 1% in
    headers. A prime count such as 61 gets 2 (1.6% padding) instead of 1 (1 KiB frames,
    3.9% in headers). Larger frames without padding come from ``chunk_rows``. Stores
    written with any geometry read alike (it is recorded per array).

    Examples
    --------
    >>> default_layers_per_chunk(ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=list(range(3, 61))))
    2
    >>> default_layers_per_chunk(ModelSpec(num_layers=61, num_experts=256, top_k=8))
    2
    """
    n = spec.num_moe_layers
    if n < MANY_LAYERS:
        return max(d for d in range(1, 5) if n % d == 0)
    bits: float = spec.bits_per_id
    if codec == "set" and spec.top_k <= spec.num_experts:
        bits = math.log2(math.comb(spec.num_experts, spec.top_k) + 1) / spec.top_k
    overhead = FRAME_OVERHEAD.get(codec, FRAME_OVERHEAD["bitpack"])

    def cost(d: int) -> float:
        return (math.ceil(n / d) * d - n) / n + overhead / (chunk_rows * d * spec.top_k * bits / 8)

    return min(range(1, 5), key=lambda d: (cost(d), -d))


@dataclass
class _Pending:
    """A commit under way: retried under the same name with the same bytes."""

    commit: str
    geometry: ArrayGeometry
    zarr_json: bytes
    table: bytes
    count: int
    """How many of the oldest completed samples it commits."""
    bucket: str | None = None
    """Bucket of the first attempt to write the sample table (None: not tried yet)."""
    first_try: datetime | None = None
    """When that attempt started."""


class Committer:
    """Commits batches of samples into a store under one writer id.

    Parameters
    ----------
    backend : Backend
    spec : ModelSpec
    writer_id : str
        Commit names are ``<writer_id>-<5 digits>``.
    chunk_rows, layers_per_chunk : int
        Inner-chunk shape.
    object_bytes : int
        Target size of one storage object.
    max_sample_rows : int, optional
        The cap on rows per sample written into a new store's manifest (None: the
        default); an existing store's cap must equal it when given.
    codec : {"bitpack", "set"}
        Codec of the route arrays (:attr:`r3store.writer.WriterConfig.codec`).
    clock : callable, optional
        Returns the current UTC time (:attr:`r3store.WriterConfig.clock`; tests move it to
        exercise bucket changes and clock skew).

    Raises
    ------
    r3store.errors.OptionError
        An inner chunk would hold more ids than readers accept, ``max_sample_rows`` is
        out of range, or ``codec`` is ``"set"`` for a spec beyond its range.
    """

    def __init__(self, backend: Backend, spec: ModelSpec, *, writer_id: str, chunk_rows: int, layers_per_chunk: int,
                 object_bytes: int, max_sample_rows: int | None = None, codec: str = "bitpack",
                 clock: Callable[[], datetime] | None = None) -> None:
        if max_sample_rows is not None and not 1 <= max_sample_rows <= MAX_ROWS:
            raise OptionError("max_sample_rows", max_sample_rows, "must lie in [1, 2**40]")
        if chunk_rows * min(layers_per_chunk, spec.num_moe_layers) * spec.top_k > MAX_CHUNK_IDS:
            raise OptionError("chunk_rows", chunk_rows,
                              f"chunk_rows x layers_per_chunk x top_k must be <= {MAX_CHUNK_IDS} ids (readers refuse "
                              f"larger chunks), got {chunk_rows} x {layers_per_chunk} x {spec.top_k}")
        try:
            self.codec = route_codec(spec, FORMAT_VERSION, codec)
        except FormatError as exc:
            raise OptionError("codec", codec, exc.fault) from None
        self.backend = backend
        self.spec = spec
        self.writer_id = writer_id
        self.chunk_rows = chunk_rows
        self.layers_per_chunk = layers_per_chunk
        self.object_bytes = object_bytes
        self.requested_max_sample_rows = max_sample_rows
        self.max_sample_rows = max_sample_rows or DEFAULT_MAX_SAMPLE_ROWS
        """The store's cap on rows per sample (known after :meth:`init_store`)."""
        self.clock = clock or (lambda: datetime.now(UTC))
        self.store_id: str | None = None
        """The store's identity (known after :meth:`init_store`)."""
        self._seq = 0
        self._pending: _Pending | None = None
        self._scratch: list[np.ndarray] = []
        """The buffer storage objects are encoded into, reused from commit to commit."""
        self._manifest: tuple[bytes, Manifest] | None = None
        """The manifest's bytes as last read and their parse (re-parsed only when they change)."""

    # -- store set-up -----------------------------------------------------------------

    def init_store(self) -> None:
        """Create the store (manifest, group documents) if absent; check its spec.

        Raises
        ------
        r3store.errors.NotAStoreError
            The folder holds other files and no ``r3store.json``.
        r3store.errors.SpecMismatchError
            The store holds another spec.
        r3store.errors.FormatVersionError
            The store is of format version 1 (read-only for this release) or unknown.
        r3store.errors.OptionError
            ``max_sample_rows`` was given and differs from the store's.
        """
        doc = make_manifest(self.spec, max_sample_rows=self.max_sample_rows)
        if not self.backend.exists(MANIFEST_KEY):
            foreign = [k for k in self.backend.list_prefix("")
                       if not k.startswith(_OWN_KEYS) and not k.rpartition("/")[2].startswith(".")]
            if foreign:
                raise NotAStoreError(self.backend.url,
                                     f"folder holds other files ({foreign[0]!r}, ...) and no r3store.json")
            self.backend.set_if_absent(MANIFEST_KEY, manifest_bytes(doc))
        manifest = self.check_spec()
        self.store_id = manifest.store_id
        wanted = self.requested_max_sample_rows
        if wanted is not None and wanted != manifest.max_sample_rows:
            raise OptionError("max_sample_rows", wanted, f"the store at {self.backend.url} caps samples at "
                                                         f"{manifest.max_sample_rows} rows (set when it was created)")
        self.max_sample_rows = manifest.max_sample_rows
        for key, attrs in (("zarr.json", {"r3store": {"manifest": MANIFEST_KEY}}), (f"{ROUTES_PREFIX}zarr.json", {})):
            if not self.backend.exists(key):
                self.backend.set_if_absent(key, json.dumps(zarr_group_json(attrs), indent=2).encode())
        self.backend.sync([MANIFEST_KEY, f"{ROUTES_PREFIX}zarr.json"])

    def check_spec(self) -> Manifest:
        """Re-read the manifest: commit nothing into a store whose spec or version changed.

        Raises
        ------
        r3store.errors.SpecMismatchError
        r3store.errors.FormatVersionError
            The store is not of the version this release writes (format v1 stores are
            read-only: write to a new store).
        r3store.errors.FormatError
            The manifest is damaged (its checksum fails, ...).
        """
        path = self.backend.path_of(MANIFEST_KEY)
        raw = bytes(self.backend.get(MANIFEST_KEY))  # read every commit; parsed again only when it changed
        if self._manifest is not None and self._manifest[0] == raw:
            manifest = self._manifest[1]
        else:
            manifest = parse_manifest(loads_document(raw, path), path)
            self._manifest = (raw, manifest)
        if manifest.version != FORMAT_VERSION:
            raise FormatVersionError(path, f"the store is of format version {manifest.version}; this release reads "
                                           f"it but writes only format version {FORMAT_VERSION} stores (write to a "
                                           "new store)")
        if manifest.spec != self.spec:
            raise SpecMismatchError(self.backend.url, manifest.spec.to_dict(), self.spec.to_dict())
        if self.store_id is not None and manifest.store_id != self.store_id:
            raise StoreIdentityError(path, self.store_id, manifest.store_id, "manifest (the store was replaced)")
        return manifest

    # -- committing -------------------------------------------------------------------

    def commit(self, samples: Sequence[Sample], metadata_columns: Sequence[str]) -> tuple[str, int]:
        """Commit the oldest of ``samples`` (all of them, or those of a retried commit).

        Returns
        -------
        (str, int)
            The commit's name and how many of ``samples`` (from the first) it holds.

        Raises
        ------
        r3store.errors.SpecMismatchError
            The store's manifest changed; nothing is committed.
        r3store.errors.StorageError
            A write failed; nothing is committed, and the next call retries the same
            commit (same name, same samples, same bytes).
        """
        self.check_spec()
        retry = self._pending is not None
        if self._pending is None:
            self._pending = self._reserve(samples, metadata_columns)
        pending = self._pending
        self._write(pending, samples[: pending.count], retry=retry)
        self._pending = None
        return pending.commit, pending.count

    def _reserve(self, samples: Sequence[Sample], metadata_columns: Sequence[str]) -> _Pending:
        geometry = self.geometry(sum(s.rows for s in samples))
        while True:
            commit = f"{self.writer_id}-{self._seq:05d}"
            self._seq += 1
            attrs = {"r3store": {"commit": commit, "writer_id": self.writer_id, "spec": dict(self.spec.to_dict()),
                                 "format_version": FORMAT_VERSION, "store_id": self.store_id}}
            doc = (json.dumps(geometry.to_zarr_json(attrs), indent=2) + "\n").encode()
            if self.backend.set_if_absent(f"{array_key(commit)}/zarr.json", doc):
                break
        return _Pending(commit, geometry, doc, self._table_bytes(commit, samples, metadata_columns), len(samples))

    def _write(self, pending: _Pending, samples: Sequence[Sample], *, retry: bool) -> None:
        """Write every object of the commit (again, on a retry), the sample table last. The
        array document was just created by :meth:`_reserve` unless this is a ``retry``: then
        it is created again if absent, else checked."""
        array = array_key(pending.commit)
        doc_key = f"{array}/zarr.json"
        if retry and not self.backend.set_if_absent(doc_key, pending.zarr_json) and \
                bytes(self.backend.get(doc_key)) != pending.zarr_json:
            raise StorageError(self.backend.path_of(doc_key), "holds another array document than this commit's "
                                                              "(writer ids must be unique)")
        parts = (materialize(p) for s in samples for p in s.parts)  # spilled parts read back one at a time
        objects = _encode_objects(pending.geometry, parts, tag_prefix(pending.commit, self.store_id), self._scratch)
        keys = [doc_key]
        for i, blob in enumerate(objects):
            keys.append(f"{array}/{ArrayGeometry.object_key(i)}")
            self.backend.set(keys[-1], blob)
        self.backend.sync(keys)  # the array's names are durable before the table that commits it
        key = self._table_key(pending)
        self._put_table(key, pending)
        key = self._ensure_visible(key, pending)
        self.backend.sync([key])  # a commit that returns is on disk, its name included

    def _put_table(self, key: str, pending: _Pending) -> None:
        if not self.backend.set_if_absent(key, pending.table) and bytes(self.backend.get(key)) != pending.table:
            raise StorageError(self.backend.path_of(key),
                               "another writer committed this commit name (writer ids must be unique)")

    def _ensure_visible(self, key: str, pending: _Pending) -> str:
        """FORMAT.md 12.2: the table's bucket is no older than the hour of its store timestamp
        less 15 minutes, else the same bytes go again under the bucket of the store's time.
        Returns the key of the table that stays."""
        for _ in range(3):
            landed = _store_time(self.backend, key)
            if landed is None or pending.bucket is None or pending.bucket >= watermark_of(landed):
                return key
            skew = (self.clock() - landed).total_seconds()
            pending.bucket, pending.first_try = bucket_of(landed), self.clock()
            moved = table_key(pending.commit, pending.bucket)
            warnings.warn(ClockSkewWarning(self.backend.path_of(key), skew,
                                           f"commit {pending.commit!r} also written to {moved} so that readers "
                                           "using a checkpoint see it"), stacklevel=6)
            key = moved
            self._put_table(key, pending)
        raise StorageError(self.backend.path_of(key), "the store's timestamps keep moving ahead of the table's "
                                                      "bucket; commit not acknowledged")

    def _table_key(self, pending: _Pending) -> str:
        """Where the sample table goes on this attempt (see the module docstring)."""
        now = self.clock()
        if pending.bucket is None or pending.first_try is None:
            pending.bucket, pending.first_try = bucket_of(now), now
        elif now - pending.first_try > BUCKET_REUSE:
            old = table_key(pending.commit, pending.bucket)
            if not self.backend.exists(old):
                pending.bucket, pending.first_try = bucket_of(now), now
        return table_key(pending.commit, pending.bucket)

    def geometry(self, rows: int) -> ArrayGeometry:
        """Geometry of a new route array of ``rows`` rows: objects of about ``object_bytes``."""
        spec = self.spec
        row_bytes = spec.num_moe_layers * spec.top_k * spec.bits_per_id / 8
        if self.codec["id"] == SetCodec.codec_id:
            row_bytes = spec.num_moe_layers * math.log2(math.comb(spec.num_experts, spec.top_k) + 1) / 8
        object_rows = max(self.chunk_rows, math.ceil(self.object_bytes / row_bytes))
        layer_chunks = math.ceil(spec.num_moe_layers / self.layers_per_chunk)
        object_rows = min(object_rows, self.chunk_rows * max(1, MAX_INDEX_ENTRIES // layer_chunks))
        return ArrayGeometry.for_rows(rows, num_moe_layers=spec.num_moe_layers, top_k=spec.top_k,
                                      codec=self.codec, chunk_rows=self.chunk_rows,
                                      layers_per_chunk=self.layers_per_chunk, object_rows=object_rows)

    def _table_bytes(self, commit: str, samples: Sequence[Sample], metadata_columns: Sequence[str]) -> bytes:
        now = self.clock()
        rows, start = [], 0
        array = array_key(commit)
        for s in samples:
            rows.append({
                "sample_id": s.sample_id, "num_tokens": s.num_tokens, "num_rows": s.rows, "row_start": start,
                "array": array, "commit": commit, "writer_id": self.writer_id, "token_hash": s.token_hash,
                "committed_at": now, "quarantined": s.reason is not None, "reason": s.reason,
                "missing_rows": s.missing_rows, "policy_spans": s.policy_spans, "policy_version": s.policy_version,
                **s.metadata,
            })
            start += s.rows
        return write_table(rows, sorted(metadata_columns), json.dumps(self.spec.to_dict()), store_id=self.store_id)


def _store_time(backend: Backend, key: str) -> datetime | None:
    """The store's timestamp of ``key`` (file mtime, S3 ``LastModified``), or None if unknown."""
    try:
        mtime = backend.info(key).mtime
    except (StorageError, NotImplementedError):
        return None
    if mtime is None or mtime <= 0:
        return None
    return datetime.fromtimestamp(mtime, UTC)


def _encode_objects(geometry: ArrayGeometry, parts: Iterator[np.ndarray], commit: str,
                    scratch: list[np.ndarray] | None = None) -> Iterator[bytes | memoryview]:
    """Yield one encoded storage object after another, assembling rows chunk by chunk; frames
    are bound to their place in ``commit``'s array. Each object may be a view of
    ``scratch``'s buffer, valid until the next is requested (the caller writes it first)."""
    blocks = _row_blocks(parts, geometry)
    scratch = [] if scratch is None else scratch  # one buffer for every object: each is written before the next
    for i in range(geometry.num_objects):
        yield encode_object(blocks, geometry, commit=commit, first_row_chunk=i * geometry.row_chunks_per_object,
                            scratch=scratch)


def _row_blocks(parts: Iterator[np.ndarray], geometry: ArrayGeometry) -> Iterator[np.ndarray]:
    """Re-cut a stream of per-sample arrays into spans of whole ``chunk_rows``-row blocks
    (the array's last may be short) that never cross a storage object's end: runs of
    whole blocks inside one part are views of it (one encode call each), blocks that
    straddle parts are copied into a buffer."""
    cr = geometry.chunk_rows
    block = np.zeros((cr, geometry.num_moe_layers, geometry.top_k), dtype=np.uint16)
    left = geometry.row_chunks_per_object  # row blocks left in the current object
    fill = 0
    for part in parts:
        i = 0
        while i < len(part):
            if not fill and len(part) - i >= cr:  # whole blocks inside one part: a view, not a copy
                m = min((len(part) - i) // cr, left)
                yield part[i : i + m * cr]
                i += m * cr
                left = left - m or geometry.row_chunks_per_object
                continue
            take = min(cr - fill, len(part) - i)
            block[fill : fill + take] = part[i : i + take]
            fill, i = fill + take, i + take
            if fill == cr:
                yield block
                fill = 0
                left = left - 1 or geometry.row_chunks_per_object
    if fill:
        yield block[:fill]
