"""A small store holding one of each fault ``r3store validate`` reports, on any backend.

For tests of the audits and of anything that must give the same answer on a faulty
store (a scan split over threads, processes or a Ray cluster). Faults are injected the
way they arise: through a writer that quarantines bad samples, two writers committing
one id, a writer that died before its sample table, and one flipped byte in a stored
frame (read back and rewritten through the storage backend, so ``s3://`` works too).

Examples
--------
>>> import tempfile
>>> from r3store.audit import validate
>>> import r3store
>>> store = write_faulty_store(tempfile.mkdtemp())
>>> report = validate(r3store.open_store(store.url, reader={"on_duplicate": "report"}))
>>> sorted(report.counts)  # doctest: +NORMALIZE_WHITESPACE
['checksum', 'duplicate_sample', 'id_out_of_range', 'quarantined', 'repeated_ids', 'row_count', 'uncommitted',
 'zero_layer']
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from r3store._format import INDEX_PREFIX, ArrayGeometry, array_key, commit_of_table_key, decode_index
from r3store._spec import ModelSpec
from r3store.reader import RouteReader
from r3store.storage import open_backend
from r3store.writer import RouteWriter, WriterConfig

__all__ = ["FAULTY_SPEC", "FaultyStore", "write_faulty_store"]

FAULTY_SPEC = ModelSpec(num_layers=5, num_experts=48, top_k=2, moe_layers=[1, 2, 3, 4])
"""Decoder layer 0 dense; 48 experts, so ids 48..63 still fit the 6-bit codec and an
out-of-range id of a quarantined sample is stored (and found)."""


@dataclass
class FaultyStore:
    """What :func:`write_faulty_store` wrote."""

    url: str
    spec: ModelSpec
    routes: dict[str, np.ndarray] = field(default_factory=dict)
    """Routes of every visible sample as a reader sees them (MoE layers only, int32);
    ``dup`` is the first writer's copy."""
    quarantined: set[str] = field(default_factory=set)
    """Ids of the quarantined samples."""
    commits: list[str] = field(default_factory=list)
    """Committed commits, in name order."""
    corrupt: str | None = None
    """The sample whose frame was corrupted (its routes cannot be read), if any."""
    leftover: str | None = None
    """The commit whose sample table was deleted."""


def distinct_routes(rng: np.random.Generator, rows: int, num_layers: int, num_experts: int, top_k: int) -> np.ndarray:
    """Valid routes, int32 ``(rows, num_layers, top_k)``: distinct ids in every (row, layer)."""
    return np.argsort(rng.random((rows, num_layers, num_experts)), axis=-1)[..., :top_k].astype(np.int32)


def write_faulty_store(url: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None,
                       seed: int = 0, corrupt: bool = True, clean_samples: int = 12) -> FaultyStore:
    """Write a store (spec :data:`FAULTY_SPEC`, 8-row chunks, one layer per chunk) with faults.

    Commits (writer ids ``w0`` .. ``w3``, several commits each):

    * ``w0``: clean samples, ``rep`` (an id repeated in rows 2-4 of decoder layer 2),
      ``fork`` (a row for the last token too), ``zero`` (decoder layer 3 all zeros),
      ``wide`` (id 50 >= num_experts in row 1 of layer 4): all four quarantined;
    * ``w1``: clean samples and ``dup``; with ``corrupt``, one byte of the frame holding
      rows 0-7 of decoder layer 1 of its first commit is flipped (a checksum error,
      affecting the first sample of that commit);
    * ``w2``: ``dup`` again, and clean samples;
    * ``w3``: a commit whose sample table is then deleted (an uncommitted leftover).

    Parameters
    ----------
    url : str or os.PathLike
        Where to write (a new store).
    storage_options : mapping, optional
        fsspec options (``s3://`` on a loopback server).
    seed : int
        Seed of the routes.
    corrupt : bool
        Flip the byte (without it every committed route is readable).
    clean_samples : int
        Clean samples spread over ``w0``, ``w1`` and ``w2``.

    Returns
    -------
    FaultyStore
    """
    rng = np.random.default_rng(seed)
    spec = FAULTY_SPEC
    url = os.fspath(url)
    out = FaultyStore(url, spec)
    moe, ne, k = spec.num_moe_layers, spec.num_experts, spec.top_k

    def clean(w: RouteWriter, sid: str, rows: int) -> None:
        out.routes[sid] = distinct_routes(rng, rows, moe, ne, k)
        w.append(sid, out.routes[sid], metadata={"writer": w.writer_id, "step": len(out.routes) % 3})

    per_writer = [clean_samples // 3 + (i < clean_samples % 3) for i in range(3)]
    def config(writer_id: str, **more: Any) -> WriterConfig:
        return WriterConfig(chunk_rows=8, layers_per_chunk=1, writer_id=writer_id, **more)

    with RouteWriter(url, spec, config("w0", on_invalid="quarantine"), storage_options=storage_options) as w:
        for i in range(per_writer[0]):
            clean(w, f"w0-{i:03d}", 5 + 3 * i)
            if i == 1:
                w.flush()
        faulty = {name: distinct_routes(rng, 12, moe, ne, k) for name in ("rep", "fork", "zero", "wide")}
        faulty["rep"][2:5, 1] = 7
        faulty["zero"][:, 2] = 0
        faulty["wide"][1, 3, 0] = 50
        for name, routes in faulty.items():
            w.append(name, routes, num_tokens=12 if name == "fork" else 13, metadata={"writer": "w0", "step": 9})
        out.quarantined.update(faulty)
    with RouteWriter(url, spec, config("w1"), storage_options=storage_options) as w:
        first = f"w1-{0:03d}"
        for i in range(per_writer[1]):
            clean(w, f"w1-{i:03d}", 9 + 2 * i)
        w.flush()
        out.routes["dup"] = distinct_routes(rng, 6, moe, ne, k)
        w.append("dup", out.routes["dup"], metadata={"writer": "w1", "step": 0})
        corrupt_commit = w.commits[0]
    with RouteWriter(url, spec, config("w2"), storage_options=storage_options) as w:
        w.append("dup", distinct_routes(rng, 7, moe, ne, k), metadata={"writer": "w2", "step": 0})
        for i in range(per_writer[2]):
            clean(w, f"w2-{i:03d}", 4 + 4 * i)
    with RouteWriter(url, spec, config("w3"), storage_options=storage_options) as w:
        w.append("lost", distinct_routes(rng, 5, moe, ne, k))
    backend = open_backend(url, storage_options)
    (out.leftover,) = w.commits
    for key in backend.list_prefix(INDEX_PREFIX):  # its sample table, in whatever bucket it landed
        if commit_of_table_key(key) == out.leftover:
            backend.delete(key)
    if corrupt:
        array = array_key(corrupt_commit)
        geometry = RouteReader.open(url, storage_options=storage_options,
                                    reader={"commits": [corrupt_commit]}).geometry_of(array)
        key = f"{array}/{ArrayGeometry.object_key(0)}"
        data = bytearray(backend.get(key))
        index = decode_index(bytes(data[-geometry.index_nbytes :]), geometry, array, 0)
        offset, nbytes = (int(v) for v in index[0, 0])
        data[offset + nbytes - 1] ^= 0x40
        backend.set(key, bytes(data))
        out.corrupt = first
    out.commits = RouteReader.open(url, storage_options=storage_options, reader={"on_duplicate": "report"}).commits
    backend.close()
    return out
