"""The commit protocol (``schema/FORMAT.md`` section 2) and the sizing of storage objects.

A commit writes, in this order: ``routes/<commit>/zarr.json`` created only if absent
(this reserves the name), every storage object of the route array, then
``index/<commit>.parquet`` created only if absent (this commits it). A failed commit is
retried under the same name with the same bytes; finding its own sample table already
there means an earlier attempt succeeded although its answer was lost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from r3store._format import (
    INDEX_PREFIX,
    MANIFEST_KEY,
    MAX_CHUNK_IDS,
    MAX_INDEX_ENTRIES,
    ROUTES_PREFIX,
    ArrayGeometry,
    array_key,
    encode_object,
    loads_document,
    make_manifest,
    parse_manifest,
    route_codec,
    table_key,
    write_table,
    zarr_group_json,
)
from r3store._spec import ModelSpec
from r3store.errors import NotAStoreError, OptionError, SpecMismatchError, StorageError
from r3store.storage import Backend
from r3store.writer._buffer import Sample

__all__ = ["Committer", "default_layers_per_chunk"]

_OWN_KEYS = (MANIFEST_KEY, "zarr.json", ROUTES_PREFIX, INDEX_PREFIX)


def default_layers_per_chunk(spec: ModelSpec) -> int:
    """The largest divisor of the MoE-layer count up to 4."""
    return max(d for d in range(1, 5) if spec.num_moe_layers % d == 0)


@dataclass
class _Pending:
    """A commit under way: retried under the same name with the same bytes."""

    commit: str
    geometry: ArrayGeometry
    table: bytes
    count: int
    """How many of the oldest completed samples it commits."""


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

    Raises
    ------
    r3store.errors.OptionError
        An inner chunk would hold more ids than readers accept.
    """

    def __init__(self, backend: Backend, spec: ModelSpec, *, writer_id: str, chunk_rows: int, layers_per_chunk: int,
                 object_bytes: int) -> None:
        if chunk_rows * min(layers_per_chunk, spec.num_moe_layers) * spec.top_k > MAX_CHUNK_IDS:
            raise OptionError("chunk_rows", chunk_rows,
                              f"chunk_rows x layers_per_chunk x top_k must be <= {MAX_CHUNK_IDS} ids (readers refuse "
                              f"larger chunks), got {chunk_rows} x {layers_per_chunk} x {spec.top_k}")
        self.backend = backend
        self.spec = spec
        self.writer_id = writer_id
        self.chunk_rows = chunk_rows
        self.layers_per_chunk = layers_per_chunk
        self.object_bytes = object_bytes
        self._seq = 0
        self._pending: _Pending | None = None

    # -- store set-up -----------------------------------------------------------------

    def init_store(self) -> None:
        """Create the store (manifest, group documents) if absent; check its spec.

        Raises
        ------
        r3store.errors.NotAStoreError
            The folder holds other files and no ``r3store.json``.
        r3store.errors.SpecMismatchError
            The store holds another spec.
        """
        doc = make_manifest(self.spec)
        if not self.backend.exists(MANIFEST_KEY):
            foreign = [k for k in self.backend.list_prefix("")
                       if not k.startswith(_OWN_KEYS) and not k.rpartition("/")[2].startswith(".")]
            if foreign:
                raise NotAStoreError(self.backend.url,
                                     f"folder holds other files ({foreign[0]!r}, ...) and no r3store.json")
            self.backend.set_if_absent(MANIFEST_KEY, (json.dumps(doc, indent=2) + "\n").encode())
        self.check_spec()
        for key, attrs in (("zarr.json", {"r3store": {"manifest": MANIFEST_KEY}}), (f"{ROUTES_PREFIX}zarr.json", {})):
            if not self.backend.exists(key):
                self.backend.set_if_absent(key, json.dumps(zarr_group_json(attrs), indent=2).encode())

    def check_spec(self) -> None:
        """Re-read the manifest: commit nothing into a store whose spec changed.

        Raises
        ------
        r3store.errors.SpecMismatchError
        """
        path = self.backend.path_of(MANIFEST_KEY)
        stored = parse_manifest(loads_document(self.backend.get(MANIFEST_KEY), path), path)
        if stored != self.spec:
            raise SpecMismatchError(self.backend.url, stored.to_dict(), self.spec.to_dict())

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
        if self._pending is None:
            self._pending = self._reserve(samples, metadata_columns)
        pending = self._pending
        self._write(pending, samples[: pending.count])
        self._pending = None
        return pending.commit, pending.count

    def _reserve(self, samples: Sequence[Sample], metadata_columns: Sequence[str]) -> _Pending:
        geometry = self.geometry(sum(s.rows for s in samples))
        while True:
            commit = f"{self.writer_id}-{self._seq:05d}"
            self._seq += 1
            attrs = {"r3store": {"shard": commit, "writer_id": self.writer_id, "spec": dict(self.spec.to_dict())}}
            doc = (json.dumps(geometry.to_zarr_json(attrs), indent=2) + "\n").encode()
            if self.backend.set_if_absent(f"{array_key(commit)}/zarr.json", doc):
                break
        return _Pending(commit, geometry, self._table_bytes(commit, samples, metadata_columns), len(samples))

    def _write(self, pending: _Pending, samples: Sequence[Sample]) -> None:
        array = array_key(pending.commit)
        parts = (p for s in samples for p in s.parts)
        for i, blob in enumerate(_encode_objects(pending.geometry, parts)):
            self.backend.set(f"{array}/{ArrayGeometry.object_key(i)}", blob)
        key = table_key(pending.commit)
        if not self.backend.set_if_absent(key, pending.table) and bytes(self.backend.get(key)) != pending.table:
            raise StorageError(self.backend.path_of(key),
                               "another writer committed this commit name (writer ids must be unique)")

    def geometry(self, rows: int) -> ArrayGeometry:
        """Geometry of a new route array of ``rows`` rows: objects of about ``object_bytes``."""
        spec = self.spec
        row_bytes = spec.num_moe_layers * spec.top_k * spec.bits_per_id / 8
        object_rows = max(self.chunk_rows, math.ceil(self.object_bytes / row_bytes))
        layer_chunks = math.ceil(spec.num_moe_layers / self.layers_per_chunk)
        object_rows = min(object_rows, self.chunk_rows * max(1, MAX_INDEX_ENTRIES // layer_chunks))
        return ArrayGeometry.for_rows(rows, num_moe_layers=spec.num_moe_layers, top_k=spec.top_k,
                                      codec=route_codec(spec), chunk_rows=self.chunk_rows,
                                      layers_per_chunk=self.layers_per_chunk, object_rows=object_rows)

    def _table_bytes(self, commit: str, samples: Sequence[Sample], metadata_columns: Sequence[str]) -> bytes:
        now = datetime.now(UTC)
        rows, start = [], 0
        array = array_key(commit)
        for s in samples:
            rows.append({
                "sample_id": s.sample_id, "num_tokens": s.num_tokens, "num_rows": s.rows, "row_start": start,
                "array": array, "shard": commit, "writer_id": self.writer_id, "token_hash": s.token_hash,
                "committed_at": now, "quarantined": s.reason is not None, "reason": s.reason, **s.metadata,
            })
            start += s.rows
        return write_table(rows, sorted(metadata_columns), json.dumps(self.spec.to_dict()))


def _encode_objects(geometry: ArrayGeometry, parts: Iterator[np.ndarray]) -> Iterator[bytes]:
    """Yield one encoded storage object after another, assembling rows chunk by chunk."""
    blocks = _row_blocks(parts, geometry)
    for _ in range(geometry.num_objects):
        yield encode_object(blocks, geometry)


def _row_blocks(parts: Iterator[np.ndarray], geometry: ArrayGeometry) -> Iterator[np.ndarray]:
    """Re-cut a stream of per-sample arrays into blocks of ``chunk_rows`` rows."""
    block = np.zeros((geometry.chunk_rows, geometry.num_moe_layers, geometry.top_k), dtype=np.uint16)
    fill = 0
    for part in parts:
        i = 0
        while i < len(part):
            take = min(geometry.chunk_rows - fill, len(part) - i)
            block[fill : fill + take] = part[i : i + take]
            fill, i = fill + take, i + take
            if fill == geometry.chunk_rows:
                yield block
                fill = 0
    if fill:
        yield block[:fill]
