"""Attacks on version 2 checkpoints (FORMAT.md section 11.1), with the fuzz targets' oracle.

Every attack builds a store (the golden ``v3-ckpt2``, or one compacted here into row groups of
4 rows with commits made after the compaction), damages or forges its checkpoint, and opens
it from memory (:class:`tests.fuzz.targets.MemoryBackend`). The store is then used in one of
several orders, so that the checkpoint's rows are first read by a different call each time
(``len`` from the header, the id list, ``get``, ``row``, ``in``, the commit list, a pickle,
``assemble``, ``refresh``). Each call must either raise an r3store error or give exactly what
a reader of the sample tables alone gives (``use_checkpoint=False``); the only warning allowed
is a :class:`r3store.errors.CheckpointWarning`. ``len`` may count from a header that lies about
its visible rows (FORMAT.md: only a resealed header can), but then every later call that reads
the rows must raise.

flips
    A byte of the golden checkpoint changed at every position (``stride`` > 1: every
    ``stride``-th position from a seeded start), each position with another order of calls.
truncations
    The golden checkpoint cut to every length (or every ``stride``-th), and extended
    (bytes appended, the footer repeated, a copy of itself appended).
reseal
    Header lies resealed with a correct root digest (an editor who knows the format): each
    field of the header (``rows``, ``visible``, ``unique_ids``, ``groups``, ``recent``,
    ``max_rows``, ``commits``, ``watermark``, ``created_at``, ``bloom``, ``store_id``), the Bloom
    filter's bits (empty, full, another size), group digests swapped, row groups swapped in
    the file, a header taken from another store, a checkpoint under a key claiming more
    commits; on a compacted store with commits after it, some of which repeat ids.
bloom
    The Bloom filter of random ids (ASCII, unicode, the empty id, ids of 10,000 characters)
    holds every one of them (no false negative), and equals a filter computed here from
    FORMAT.md's text alone (the golden checkpoint's bits included).

``python -m tests.fuzz.checkpoints [--stride N] [--seed S]`` runs every attack and prints one
JSON line per attack (``--stride 1``: every byte position, a few minutes).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import datetime as dt
import hashlib
import io
import json
import pickle
import random
import shutil
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import r3store
from r3store._format import _checkpoint
from r3store._format._checkpoint import _root_digest
from r3store._format._digest import table_digest
from r3store.errors import CheckpointWarning, R3StoreError
from tests.fuzz.targets import FIXTURES, Failure, MemoryBackend, outcome

__all__ = ["ATTACKS", "bloom", "flips", "reseal", "truncations"]

GOLDEN_CKPT2 = FIXTURES / "stores" / "v3-ckpt2"
GOLDEN_CKPT3 = FIXTURES / "stores" / "v3-ckpt3"
"""The golden store of checkpoint version 3 (one row group per 16,384 rows, a Bloom filter each)."""
CALLS = ("len", "ids", "get", "row", "contains", "commits", "pickle", "assemble", "refresh", "num_visible")
"""The calls a store is used with; each order starts with a different one."""
LOOKUPS = ("get", "row", "contains", "assemble")
"""Calls that read only the row groups that may hold an id while a version 3 checkpoint's rows are
unread (FORMAT.md 11.2): the header's Bloom filters and recent commits are trusted for them, as its
counts are for ``len``; a lie they serve must make every later call that reads the rows raise."""

Objects = dict[str, bytes]


def golden_objects(root: Path = GOLDEN_CKPT2) -> Objects:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def ckpt_key(objects: Objects) -> str:
    (key,) = [k for k in objects if k.endswith(".checkpoint")]
    return key


class Truth:
    """What a reader of the sample tables alone serves for a store (no checkpoint)."""

    def __init__(self, objects: Objects, reader: dict[str, Any]) -> None:
        store = r3store.open_store(MemoryBackend(dict(objects), "truth"), reader={**reader, "use_checkpoint": False})
        self.ids = sorted(store.sample_ids)
        self.all_ids = sorted(store.samples.column("sample_id").to_pylist())
        self.hidden = sorted(set(self.all_ids) - set(self.ids))
        self.commits = list(store.commits)
        self.rows = {sid: store.row(sid, include_quarantined=True) for sid in self.all_ids}
        self.routes = {sid: store.get(sid, include_quarantined=True) for sid in self.all_ids}
        self.batch = store.assemble(self.ids) if self.ids else None
        self.reader = reader


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _call(store: r3store.RouteStore, name: str, truth: Truth, rng: random.Random) -> tuple[bool, str]:
    """Run one call; (whether it read the checkpoint's rows or could have, what differs or "")."""
    sid = rng.choice(truth.all_ids) if truth.all_ids else "none"
    quarantined = sid in truth.hidden
    if name == "len":
        return False, "" if len(store) == len(truth.ids) else f"len {len(store)}, the tables give {len(truth.ids)}"
    if name == "num_visible":
        got = store._catalog.num_visible
        return False, "" if got == len(truth.ids) else f"num_visible {got}, the tables give {len(truth.ids)}"
    if name == "ids":
        got = sorted(store.sample_ids)
        return True, "" if got == truth.ids else f"sample_ids {got}"
    if name == "get":
        got = store.get(sid, include_quarantined=quarantined)
        return True, "" if _same(got, truth.routes[sid]) else f"get({sid!r}) differs"
    if name == "row":
        got = store.row(sid, include_quarantined=quarantined)
        return True, "" if _same(got, truth.rows[sid]) else f"row({sid!r}) {got} differs from {truth.rows[sid]}"
    if name == "contains":
        probes = [*truth.all_ids, "never-written", ""]
        got = [p for p in probes if p in store]
        return True, "" if got == [p for p in probes if p in truth.ids] else f"'in' gives {got}"
    if name == "commits":
        got = list(store.commits)
        return True, "" if got == truth.commits else f"commits {got}"
    if name == "pickle":
        clone = pickle.loads(pickle.dumps(store))
        got = clone.get(sid, include_quarantined=quarantined)
        return True, "" if _same(got, truth.routes[sid]) else f"get({sid!r}) of a pickled copy differs"
    if name == "assemble":
        if truth.batch is None:
            return True, ""
        batch = store.assemble(truth.ids)
        bad = [k for k in truth.batch if not _same(batch.get(k), truth.batch[k])]
        return True, "" if not bad else f"assemble: {bad[0]!r} differs"
    if name == "refresh":
        got = store.refresh()
        return True, "" if got == 0 else f"refresh found {got} new samples in an unchanged store"
    raise AssertionError(name)


def check_uses(objects: Objects, truth: Truth, order: list[str], seed: int = 0) -> str:
    """Open ``objects`` and run ``order``'s calls; an outcome label, or :class:`Failure`."""
    rng = random.Random(seed)
    labels: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = r3store.open_store(MemoryBackend(dict(objects)), reader=truth.reader)
        except R3StoreError as exc:
            store, labels = None, [outcome(exc)]
        except Exception as exc:  # the oracle
            raise Failure(f"open: {type(exc).__name__} outside r3store.errors: {exc}") from exc
        counted_wrong = ""
        for name in order if store is not None else ():
            pending = store._catalog._pending
            lookup = pending is not None and pending.lazy and name in LOOKUPS
            try:
                reads, wrong = _call(store, name, truth, rng)
                reads = reads and not lookup
            except R3StoreError as exc:
                labels.append(f"{name}: {outcome(exc)}")
                continue
            except Exception as exc:  # the oracle
                raise Failure(f"{name} after {labels}: {type(exc).__name__} outside r3store.errors: {exc}") from exc
            if wrong and not reads:  # a lying header's count or lookup, allowed until the rows are read
                counted_wrong = counted_wrong or wrong
                labels.append(f"{name}: from the header")
                continue
            if wrong:
                raise Failure(f"{name} (order {order}): {wrong} without an error")
            if counted_wrong and reads:
                raise Failure(f"{name} read the rows without an error after {counted_wrong} (order {order})")
            labels.append(f"{name}: ok")
    others = [w for w in caught if not issubclass(w.category, CheckpointWarning)]
    if others:
        raise Failure(f"unexpected warning {others[0].category.__name__}: {others[0].message}")
    warned = "CheckpointWarning; " if caught else ""
    refusals = sorted({lab.split(": ", 1)[1] for lab in labels if not lab.endswith((": ok", "from the header"))})
    return warned + ("; ".join(refusals) if refusals else "ok")


def orders(rng: random.Random) -> Iterator[list[str]]:
    """Orders of :data:`CALLS`, each starting with the next call (then the rest shuffled)."""
    while True:
        for first in CALLS:
            rest = [c for c in CALLS if c != first]
            rng.shuffle(rest)
            yield [first, *rest, "get", "len"]


# -- byte damage ----------------------------------------------------------------------------------


def _positions(size: int, stride: int, rng: random.Random) -> list[int]:
    return list(range(rng.randrange(stride) if stride > 1 else 0, size, stride))


def flips(stride: int = 1, seed: int = 0, golden: Path = GOLDEN_CKPT2) -> dict[str, Any]:
    """Change the golden checkpoint's byte at every ``stride``-th position (each by another value);
    ``golden``: the store (:data:`GOLDEN_CKPT3` for a version 3 checkpoint)."""
    rng = random.Random(seed)
    objects = golden_objects(golden)
    key = ckpt_key(objects)
    blob = objects[key]
    truth = Truth(objects, {})
    seen: dict[str, int] = {}
    positions = _positions(len(blob), stride, rng)
    for pos, order in zip(positions, orders(rng), strict=False):
        buf = bytearray(blob)
        buf[pos] ^= rng.choice((1 << rng.randrange(8), 0xFF, rng.randrange(1, 256)))
        label = _checked(f"byte {pos} changed", {**objects, key: bytes(buf)}, truth, order, seed + pos)
        seen[label] = seen.get(label, 0) + 1
    return {"attack": "flips", "cases": len(positions), "failures": 0, "outcomes": len(seen)}


def truncations(stride: int = 1, seed: int = 0, golden: Path = GOLDEN_CKPT2) -> dict[str, Any]:
    """Cut the golden checkpoint to every ``stride``-th length; extend it in several ways."""
    rng = random.Random(seed)
    objects = golden_objects(golden)
    key = ckpt_key(objects)
    blob = objects[key]
    truth = Truth(objects, {})
    cases: list[tuple[str, bytes]] = [(f"cut to {n} bytes", blob[:n]) for n in _positions(len(blob), stride, rng)]
    cases += [("zeros appended", blob + bytes(64)), ("copy appended", blob + blob),
              ("footer repeated", blob + blob[-8 - struct.unpack("<I", blob[-8:-4])[0] - 8:]),
              ("magic prepended", b"PAR1" + blob), ("empty", b""), ("PAR1 only", b"PAR1PAR1")]
    for (name, data), order in zip(cases, orders(rng), strict=False):
        _checked(name, {**objects, key: data}, truth, order, seed)
    return {"attack": "truncations", "cases": len(cases), "failures": 0}


def _checked(name: str, objects: Objects, truth: Truth, order: list[str], seed: int) -> str:
    try:
        return check_uses(objects, truth, order, seed)
    except Failure as exc:
        raise Failure(f"{name}: {exc}") from None


# -- resealed forgeries ---------------------------------------------------------------------------


def _kv(blob: bytes) -> dict[bytes, bytes]:
    return dict(pq.read_metadata(io.BytesIO(blob)).metadata)


def forge(blob: bytes, *, header: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
          bloom: Callable[[bytes], bytes] | None = None, rows: Callable[[pa.Table], pa.Table] | None = None,
          kv_from: bytes | None = None, group_rows: int = 4, regroup: bool = False) -> bytes:
    """The checkpoint ``blob`` with its header (a JSON edit), Bloom bits or rows edited (or
    the metadata of ``kv_from``), then resealed: the root digest recomputed, as an editor who
    knows the format would (group digests are left as they were, unless ``regroup``: then
    recomputed too, a whole forgery no reader can tell from a true checkpoint)."""
    table = pq.read_table(io.BytesIO(blob))
    kv = _kv(kv_from if kv_from is not None else blob)
    if regroup:
        plain = (rows(table) if rows is not None else table).replace_schema_metadata(None)
        doc = json.loads(kv[b"r3store.checkpoint"])
        version, spec = kv[b"r3store.version"].decode(), kv[b"r3store.spec"].decode()
        doc["groups"] = [[g[0], table_digest(part, version, spec, extra=(f"group {i}",))] for i, (g, part) in
                         enumerate(zip(doc["groups"], _checkpoint._groups(plain, [g[0] for g in doc["groups"]]),
                                       strict=True))]
        kv[b"r3store.checkpoint"] = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    if header is not None:
        kv[b"r3store.checkpoint"] = json.dumps(header(json.loads(kv[b"r3store.checkpoint"])), sort_keys=True,
                                               separators=(",", ":"), ensure_ascii=False).encode()
    if bloom is not None:
        kv[b"r3store.bloom"] = base64.b64encode(bloom(base64.b64decode(kv[b"r3store.bloom"])))
    if rows is not None:
        table = rows(table)
    ident = (kv[b"r3store.store_id"].decode(),) if b"r3store.store_id" in kv else ()
    kv[b"r3store.digest"] = _root_digest(kv[b"r3store.version"].decode(), kv[b"r3store.spec"].decode(),
                                         kv[b"r3store.checkpoint"].decode(), kv[b"r3store.bloom"].decode(),
                                         ident).encode()
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(kv), sink, compression="zstd", write_page_checksum=True,
                   row_group_size=group_rows, write_statistics=False)
    return sink.getvalue()


SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def _routes(i: int, rows: int = 3) -> np.ndarray:
    rng = np.random.default_rng(i)
    return np.stack([rng.permutation(16)[:2] for _ in range(rows * 2)]).reshape(rows, 2, 2).astype(np.int32)


def compacted_store(before: int = 10, after: list[str] | None = None, *, quarantine: tuple[str, ...] = (),
                    long_sample: str | None = None) -> Objects:
    """A store of ``before`` one-sample commits ``s0``.., compacted in row groups of 4 rows,
    then one commit per id of ``after`` (an id may repeat one of the checkpoint's); ids in
    ``quarantine`` are written with a repeated expert (quarantined); ``long_sample`` has 40 rows."""
    root = Path(tempfile.mkdtemp(prefix="r3-ckpt2-"))
    saved = _checkpoint.GROUP_ROWS
    try:
        config = r3store.WriterConfig(on_invalid="quarantine")

        def commit(sid: str, i: int) -> None:
            routes = _routes(i, 40 if sid == long_sample else 3)
            if sid in quarantine:
                routes[1, 0] = [3, 3]
            with r3store.RouteWriter(root, SPEC, config) as w:
                w.append(sid, routes, metadata={"step": i // 4, "who": sid})

        for i in range(before):
            commit(f"s{i}", i)
        _checkpoint.GROUP_ROWS = 4
        r3store.compact(root)
        _checkpoint.GROUP_ROWS = saved
        for j, sid in enumerate(after or []):
            commit(sid, 100 + j)
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    finally:
        _checkpoint.GROUP_ROWS = saved
        shutil.rmtree(root, ignore_errors=True)


def _set(field: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def edit(doc: dict[str, Any]) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        doc[field] = value(doc[field]) if callable(value) else value
        return doc
    return edit


def _swap_groups(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["groups"][0], doc["groups"][1] = doc["groups"][1], doc["groups"][0]
    return doc


def _swap_row_groups(table: pa.Table) -> pa.Table:
    return pa.concat_tables([table.slice(4, 4), table.slice(0, 4), table.slice(8)])


def _rebuilt(blob: bytes, ids: list[str], nbits: int | None = None) -> Callable[[bytes], bytes]:
    """Bloom bits of ``ids`` (of the header's size unless ``nbits``)."""
    def bits(raw: bytes) -> bytes:
        return _checkpoint.BloomFilter.build(ids, nbits or len(raw) * 8, 11).bits.astype("<u8").tobytes()
    return bits


def _header_lies(doc: dict[str, Any]) -> Iterator[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]]:
    """One edit per header field (values that pass the header's own checks where possible)."""
    groups = doc["groups"]
    yield "rows + 1", _set("rows", lambda v: v + 1)
    yield "rows - 1 and the last group one row shorter", lambda d: {**_set("rows", d["rows"] - 1)(d), "groups": [
        *d["groups"][:-1], [d["groups"][-1][0] - 1, d["groups"][-1][1]]]}
    yield "visible + 1", _set("visible", lambda v: v + 1)
    yield "visible - 1", _set("visible", lambda v: v - 1)
    yield "visible 0", _set("visible", 0)
    yield "unique_ids flipped", _set("unique_ids", lambda v: not v)
    yield "max_rows 0", _set("max_rows", 0)
    yield "max_rows 1", _set("max_rows", 1)
    yield "max_rows huge", _set("max_rows", 2**40)
    yield "commits + 1", _set("commits", lambda v: v + 1)
    yield "commits - 1", _set("commits", lambda v: v - 1)
    yield "commits 0", _set("commits", 0)
    yield "recent empty", _set("recent", [])
    yield "recent names a commit it does not cover", _set("recent", lambda v: sorted([*v, "zz-writer-00000"]))
    yield "watermark an hour later", _set("watermark", lambda v: _bucket(v, +1))
    yield "watermark a day later", _set("watermark", lambda v: _bucket(v, +24))
    yield "watermark a day earlier", _set("watermark", lambda v: _bucket(v, -24))
    yield "watermark far future", _set("watermark", "29991231T23")
    yield "created_at garbage", _set("created_at", "yesterday")
    yield "created_at far future", _set("created_at", "2999-12-31T23:00:00+00:00")
    yield "store_id of another store", _set("store_id", "0" * 32)
    yield "version 1", _set("version", 1)
    yield "version 3", _set("version", 3)
    yield "groups digests swapped", lambda d: {**d, "groups": [[g[0], groups[(i + 1) % len(groups)][1]]
                                                               for i, g in enumerate(d["groups"])]}
    yield "groups merged", lambda d: {**d, "groups": [[d["rows"], d["groups"][0][1]]]} if d["rows"] <= 16384 else d
    yield "group of 0 rows added", lambda d: {**d, "groups": [*d["groups"], [0, d["groups"][0][1]]]}
    yield "bloom hashes 1", _set("bloom", lambda v: {**v, "hashes": 1})
    yield "bloom hashes 64", _set("bloom", lambda v: {**v, "hashes": 64})
    yield "bloom bits doubled", _set("bloom", lambda v: {**v, "bits": v["bits"] * 2})
    yield "field of another type: rows as text", _set("rows", lambda v: str(v))
    yield "field of another type: visible true", _set("visible", True)
    yield "field of another type: unique_ids 1", _set("unique_ids", 1)
    yield "field missing: recent", lambda d: {k: v for k, v in d.items() if k != "recent"}
    yield "unknown field added", _set("extra", {"a": [1, 2]})


def _bucket(bucket: str, hours: int) -> str:
    when = dt.datetime.strptime(bucket, "%Y%m%dT%H").replace(tzinfo=dt.UTC) + dt.timedelta(hours=hours)
    return when.strftime("%Y%m%dT%H")


def _forgeries(objects: Objects, other: Objects) -> Iterator[tuple[str, Objects]]:
    key = ckpt_key(objects)
    blob = objects[key]
    doc = json.loads(_kv(blob)[b"r3store.checkpoint"])
    ids = pq.read_table(io.BytesIO(blob)).column("sample_id").to_pylist()
    for name, edit in _header_lies(doc):
        yield name, {**objects, key: forge(blob, header=edit)}
    covered = set(pq.read_table(io.BytesIO(blob)).column("commit").to_pylist())
    newer = sorted({k.rpartition("/")[2].removesuffix(".parquet") for k in objects if k.endswith(".parquet")}
                   - covered)
    if newer:
        yield "recent names a newer commit", {**objects, key: forge(
            blob, header=_set("recent", lambda v: sorted([*v, newer[0]])))}
        yield "recent names only a newer commit", {**objects, key: forge(blob, header=_set("recent", [newer[-1]]))}
    nbytes = len(base64.b64decode(_kv(blob)[b"r3store.bloom"]))
    yield "bloom empty", {**objects, key: forge(blob, bloom=lambda raw: bytes(len(raw)))}
    yield "bloom full", {**objects, key: forge(blob, bloom=lambda raw: b"\xff" * len(raw))}
    yield "bloom of all but the last id", {**objects, key: forge(blob, bloom=_rebuilt(blob, ids[:-1]))}
    yield "bloom of other ids", {**objects, key: forge(blob, bloom=_rebuilt(blob, [f"x{i}" for i in ids]))}
    yield "bloom of the ids, other size (and header)", {**objects, key: forge(
        blob, bloom=_rebuilt(blob, ids, nbytes * 16), header=_set("bloom", lambda v: {**v, "bits": nbytes * 16}))}
    yield "bloom truncated, header resized", {**objects, key: forge(
        blob, bloom=lambda raw: raw[: max(8, len(raw) // 2) // 8 * 8],
        header=_set("bloom", lambda v: {**v, "bits": max(8, nbytes // 2) // 8 * 64}))}
    if len(ids) > 8:
        yield "row groups swapped in the file", {**objects, key: forge(blob, rows=_swap_row_groups)}
        yield "row groups and header groups swapped", {**objects, key: forge(blob, rows=_swap_row_groups,
                                                                             header=_swap_groups)}
        yield "one row group dropped, header rows kept", {**objects, key: forge(blob, rows=lambda t: t.slice(4))}
        yield "one row group dropped, header says so", {**objects, key: forge(
            blob, rows=lambda t: t.slice(4),
            header=lambda d: {**d, "rows": d["rows"] - 4, "groups": d["groups"][1:]})}
        yield "rows reversed", {**objects, key: forge(blob, rows=lambda t: t.take(list(range(len(t)))[::-1]))}
        yield "row groups of 3 rows", {**objects, key: forge(blob, group_rows=3)}
    okey = ckpt_key(other)
    yield "header and bloom of another store's checkpoint", {**objects, key: forge(blob, kv_from=other[okey])}
    yield "another store's checkpoint under our key", {**objects, key: other[okey]}
    claims = "index/000000009999-" + "f" * 32 + ".checkpoint"
    yield "another store's checkpoint claiming more commits", {**objects, claims: other[okey]}
    yield "our checkpoint twice (one claiming more commits)", {**objects, claims: blob}
    yield "a resealed lie claiming more commits beside the true one", {
        **objects, claims: forge(blob, header=_set("visible", lambda v: v + 1))}
    yield "two ids swapped in the rows, group digests kept", {**objects, key: forge(blob, rows=swap_first_ids)}
    yield "no checkpoint", {k: v for k, v in objects.items() if k != key}


def swap_first_ids(table: pa.Table) -> pa.Table:
    """Rows 0 and 1 with their sample ids exchanged (each id then names the other's routes)."""
    i = table.schema.get_field_index("sample_id")
    ids = table.column(i).to_pylist()
    ids[0], ids[1] = ids[1], ids[0]
    return table.set_column(i, table.schema.field(i), pa.array(ids, pa.string()))


def _stores() -> Iterator[tuple[str, Objects, dict[str, Any]]]:
    yield "golden v3-ckpt2", golden_objects(), {}
    yield "compacted, a new commit repeats s4", compacted_store(10, ["s4", "s10"]), {"on_duplicate": "first"}
    yield "compacted, 3 new commits", compacted_store(10, ["s10", "s11", "s12"]), {}
    yield "compacted, s3 quarantined then retried", compacted_store(10, ["s3", "s11"], quarantine=("s3",)), {
        "on_duplicate": "report"}
    yield "compacted, a 40-row sample, cap 39", compacted_store(10, ["s10"], long_sample="s2"), {
        "max_sample_rows": 39}
    yield "compacted, a 40-row sample, cap 40", compacted_store(10, ["s10"], long_sample="s2"), {
        "max_sample_rows": 40}


def reseal(seed: int = 0, orders_per_case: int = 2, stores: int | None = None) -> dict[str, Any]:
    """Every forgery on every store (the first ``stores`` of them), used in ``orders_per_case`` orders."""
    rng = random.Random(seed)
    other = compacted_store(12, [])
    cases = 0
    failures: list[str] = []
    outcomes: dict[str, dict[str, int]] = {}
    order_iter = orders(rng)
    for n, (store_name, objects, reader) in enumerate(_stores()):
        if stores is not None and n >= stores:
            break
        truth = None
        try:
            truth = Truth(objects, reader)
        except R3StoreError as exc:  # a cap under a sample's rows: the tables refuse the store too
            truth_error = outcome(exc)
        for name, forged in _forgeries(objects, other):
            for _ in range(orders_per_case):
                cases += 1
                order = next(order_iter)
                try:
                    if truth is None:
                        label = _refused_alike(forged, reader, truth_error, f"{store_name}: {name}")
                    else:
                        label = _checked(f"{store_name}: {name}", forged, truth, order, seed + cases)
                except Failure as exc:
                    if not name.startswith(LATER_WATERMARK):
                        failures.append(str(exc))
                        label = "FAILURE"
                    else:  # the header is trusted for where newer commits lie; validate names the hidden ones
                        label = _validate_names_hidden(forged, reader, f"{store_name}: {name}: {exc}", failures)
                outcomes.setdefault(name, {}).setdefault(label, 0)
                outcomes[name][label] += 1
    return {"attack": "reseal", "cases": cases, "failures": failures, "outcomes": outcomes}


LATER_WATERMARK = "watermark an hour later", "watermark a day later", "watermark far future"
"""Forgeries that move the watermark past commits the checkpoint does not cover: a reader trusts
the header for where newer commits lie (FORMAT.md 11, "Watermark") and does not see them;
``r3store validate`` must name them."""


def _validate_names_hidden(objects: Objects, reader: dict[str, Any], what: str, failures: list[str]) -> str:
    from r3store.audit import validate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        try:
            report = validate(r3store.open_store(MemoryBackend(dict(objects)), reader=reader))
        except R3StoreError as exc:
            return "validate: " + outcome(exc)
    kinds = {f.kind for f in report.findings}
    if "checkpoint" not in kinds:
        failures.append(f"{what}; validate does not name the hidden commits")
        return "FAILURE"
    if "uncommitted" in kinds:
        failures.append(f"{what}; validate calls a committed route array an uncommitted leftover")
        return "FAILURE"
    return "commits hidden, named by validate"


def _refused_alike(objects: Objects, reader: dict[str, Any], want: str, name: str) -> str:
    """A store the sample tables refuse (a cap): the checkpoint must not make it open."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        try:
            store = r3store.open_store(MemoryBackend(dict(objects)), reader=reader)
            store.get(sorted(store.samples.column("sample_id").to_pylist())[0], include_quarantined=True)
        except R3StoreError as exc:
            return outcome(exc)
        except Exception as exc:  # the oracle
            raise Failure(f"{name}: {type(exc).__name__} outside r3store.errors: {exc}") from exc
    raise Failure(f"{name}: the sample tables refuse this store ({want}), a reader from the checkpoint does not")


# -- Bloom filter ---------------------------------------------------------------------------------


def reference_bloom(ids: list[str], nbits: int, hashes: int) -> bytes:
    """The Bloom filter bits of FORMAT.md section 11.1, written from its text alone."""
    words = [0] * (nbits // 64)
    for sid in ids:
        digest = hashlib.blake2b(sid.encode("utf-8"), digest_size=16).digest()
        h1, h2 = struct.unpack("<QQ", digest)
        h2 |= 1
        for i in range(hashes):
            p = (h1 + i * h2) % (1 << 64) % nbits
            words[p // 64] |= 1 << (p % 64)
    return b"".join(struct.pack("<Q", w) for w in words)


def _random_id(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return ""
    if kind == 1:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_/.") for _ in range(rng.randint(1, 40)))
    if kind == 2:
        return "".join(chr(rng.choice((rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xD7FF),
                                       rng.randint(0xE000, 0xFFFF), rng.randint(0x10000, 0x10FFFF))))
                       for _ in range(rng.randint(1, 20)))
    if kind == 3:
        return rng.choice("xé漢😀\n\t\x00 ") * rng.randint(1000, 10_000)
    if kind == 4:
        return str(rng.randrange(10**12))
    return "".join(chr(rng.randrange(1, 0x300)) for _ in range(rng.randint(1, 8)))


def bloom(seed: int = 0, cases: int = 200) -> dict[str, Any]:
    """No false negative for random ids; bits equal to the reference (and the golden checkpoint's)."""
    rng = random.Random(seed)
    checks = 0
    blob = golden_objects()[ckpt_key(golden_objects())]
    kv = _kv(blob)
    doc = json.loads(kv[b"r3store.checkpoint"])
    ids = pq.read_table(io.BytesIO(blob)).column("sample_id").to_pylist()
    if base64.b64decode(kv[b"r3store.bloom"]) != reference_bloom(ids, doc["bloom"]["bits"], doc["bloom"]["hashes"]):
        raise Failure("the golden checkpoint's Bloom filter differs from FORMAT.md's")
    for _ in range(cases):
        ids = [_random_id(rng) for _ in range(rng.choice((0, 1, 2, 5, 50, 400)))]
        nbits = rng.choice((64, 1024, 64 * rng.randint(1, 100), max(1024, 16 * len(ids) // 64 * 64)))
        hashes = rng.choice((1, 2, 11, 64))
        built = _checkpoint.BloomFilter.build(ids, nbits, hashes)
        if built.bits.astype("<u8").tobytes() != reference_bloom(ids, nbits, hashes):
            raise Failure(f"Bloom filter of {len(ids)} ids ({nbits} bits, {hashes} hashes) differs from FORMAT.md's")
        held = built.hits(ids)
        if held != ids:
            missed = [i for i in ids if i not in held]
            raise Failure(f"Bloom filter false negative: {missed[0][:40]!r} ({len(missed)} of {len(ids)})")
        checks += 2
    return {"attack": "bloom", "cases": cases, "checks": checks, "failures": 0}






# -- version 3: lookups that read single row groups ------------------------------------------------

V3_CALLS = ("get", "get_many", "num_tokens", "row", "info", "contains", "absent", "len", "iter", "sample_ids",
            "validate", "missing_rows")
"""Calls of the version 3 attack: lookups (which read only the row groups that may hold an id while
the rows are unread) mixed with whole-list uses (which read every row)."""


def v3_store(rng: random.Random) -> tuple[str, Objects, dict[str, Any]]:
    """A random store compacted into a version 3 checkpoint of row groups of 1..5 rows, with commits
    of 1..3 samples (some quarantined, some with missing rows), then commits made after the
    compaction: new ids, ids of the checkpoint again, retries of quarantined ones, some by a
    writer whose clock is behind the compaction's (its rows sort before the checkpoint's last)."""
    root = Path(tempfile.mkdtemp(prefix="r3-ckpt3-"))
    saved = _checkpoint.GROUP_ROWS
    group_rows = rng.randint(1, 5)
    names: list[str] = []
    quarantined: list[str] = []
    counter = [0]
    parts: list[str] = [f"groups of {group_rows}"]

    def commit(ids: list[str], skew: float = 0.0) -> None:
        now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew)
        config = r3store.WriterConfig(on_invalid="quarantine", clock=lambda: now)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", r3store.errors.ClockSkewWarning)
            with r3store.RouteWriter(root, SPEC, config) as w:
                for sid in ids:
                    counter[0] += 1
                    routes = _routes(counter[0], rng.choice((1, 3, 7)))
                    bad = rng.random() < 0.15
                    if bad:
                        routes[0, 0] = [5, 5]
                        quarantined.append(sid)
                    missing = not bad and rng.random() < 0.2
                    if missing:
                        routes[0] = -1
                    w.append(sid, routes, metadata={"n": counter[0]}, allow_missing=missing)

    try:
        for c in range(rng.randint(1, 7)):
            ids = [f"c{c}-{k}" for k in range(rng.randint(1, 3))]
            names += ids
            commit(ids)
        _checkpoint.GROUP_ROWS = group_rows
        r3store.compact(root)
        _checkpoint.GROUP_ROWS = saved
        for c in range(rng.choice((0, 1, 1, 2, 3))):
            kind = rng.randrange(4)
            if kind == 1 and names:
                ids, what = [rng.choice(names)], "an id again"
            elif kind == 2 and quarantined:
                ids, what = [rng.choice(quarantined)], "a quarantined id retried"
            else:
                ids, what = [f"n{c}-{k}" for k in range(rng.randint(1, 2))], "new ids"
            skew = rng.choice((0.0, 0.0, -7200.0, -2.0))
            parts.append(what + (f" (writer clock {skew:+.0f} s)" if skew else ""))
            commit(ids, skew)
        objects = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        reader = {"on_duplicate": rng.choice(("first", "report", "raise"))}
        return "; ".join(parts), objects, reader
    finally:
        _checkpoint.GROUP_ROWS = saved
        shutil.rmtree(root, ignore_errors=True)


def _v3_damage(rng: random.Random, objects: Objects) -> tuple[str, Objects]:
    """One damage of the store's version 3 checkpoint (or none): (its name, the objects)."""
    key = ckpt_key(objects)
    blob = objects[key]
    doc = json.loads(_kv(blob)[b"r3store.checkpoint"])
    kind = rng.randrange(9)
    if kind == 0:
        return "none", objects
    if kind == 1:
        buf = bytearray(blob)
        pos = rng.randrange(4, max(5, len(buf) - 8))
        buf[pos] ^= 1 << rng.randrange(8)
        return f"byte {pos} flipped", {**objects, key: bytes(buf)}
    if kind == 2 and doc["rows"]:
        ts, name = doc["last"]
        edits: list[tuple[str, Any]] = [("last earlier", [ts - 10**10, name]), ("last later", [ts + 10**12, name]),
                                        ("last null", None), ("last 0", [0, name]), ("last as text", [str(ts), name])]
        what, value = rng.choice(edits)
        forged = forge(blob, header=_set("last", value), group_rows=_rows_of(doc))
        return what + " (resealed)", {**objects, key: forged}
    if kind == 3 and len(doc["groups"]) > 1:
        return "group digests rotated (resealed)", {**objects, key: forge(blob, header=lambda d: {**d, "groups": [
            [g[0], d["groups"][(i + 1) % len(d["groups"])][1], g[2]] for i, g in enumerate(d["groups"])]},
            group_rows=_rows_of(doc))}
    if kind == 4 and doc["groups"]:
        g = rng.randrange(len(doc["groups"]))
        start = sum(x[2] for x in doc["groups"][:g]) // 8
        size = doc["groups"][g][2] // 8

        def zero(raw: bytes) -> bytes:
            return raw[:start] + bytes(size) + raw[start + size:]
        return f"group {g}'s Bloom filter emptied (resealed)", {**objects, key: forge(
            blob, bloom=zero, group_rows=_rows_of(doc))}
    if kind == 5 and doc["groups"]:
        return "every Bloom filter full (resealed)", {**objects, key: forge(
            blob, bloom=lambda raw: b"\xff" * len(raw), group_rows=_rows_of(doc))}
    if kind == 6 and len(doc["groups"]) > 1:
        def shift(d: dict[str, Any]) -> dict[str, Any]:
            groups = copy.deepcopy(d["groups"])
            groups[0][2] += 64
            groups[-1][2] -= 64
            return {**d, "groups": groups} if groups[-1][2] >= 64 else d
        return "Bloom filter sizes shifted between groups (resealed)", {**objects, key: forge(
            blob, header=shift, group_rows=_rows_of(doc))}
    if kind == 7 and doc["rows"] > 1:
        return "two ids swapped, group digests kept (resealed)", {**objects, key: forge(
            blob, rows=swap_first_ids, group_rows=_rows_of(doc))}
    if kind == 8 and doc["rows"]:
        return "visible + 1 (resealed)", {**objects, key: forge(blob, header=_set("visible", lambda v: v + 1),
                                                                 group_rows=_rows_of(doc))}
    return "none", objects


def _rows_of(doc: dict[str, Any]) -> int:
    return int(doc["groups"][0][0]) if doc["groups"] else 4


class _V3Truth:
    def __init__(self, objects: Objects, reader: dict[str, Any]) -> None:
        from r3store.audit import validate

        store = r3store.open_store(MemoryBackend(dict(objects), "truth"), reader={**reader, "use_checkpoint": False})
        self.reader = reader
        self.ids = list(store.sample_ids)
        self.all_ids = sorted(store.samples.column("sample_id").to_pylist())
        self.hidden = set(self.all_ids) - set(self.ids)
        self.rows = {sid: store.row(sid, include_quarantined=True) for sid in self.all_ids}
        self.routes = {sid: store.get(sid, include_quarantined=True) for sid in self.all_ids}
        self.tokens = {sid: store.num_tokens(sid, include_quarantined=True) for sid in self.all_ids}
        self.missing = {sid: store.missing_rows(sid, include_quarantined=True) for sid in self.all_ids}
        report = validate(store)
        self.valid, self.kinds = report.ok, {f.kind for f in report.findings}
        self.damaged = False
        self.last_kinds: set[str] = set()


def _v3_call(store: r3store.RouteStore, name: str, truth: _V3Truth, rng: random.Random) -> str:
    """Run one call; what differs from the truth, or ""."""
    from r3store.audit import validate

    sid = rng.choice(truth.all_ids) if truth.all_ids else "none"
    q = sid in truth.hidden
    if name == "get":
        return "" if _same(store.get(sid, include_quarantined=q), truth.routes[sid]) else f"get({sid!r}) differs"
    if name == "get_many":
        pick = rng.sample(truth.ids, min(len(truth.ids), rng.randint(1, 4)))
        got = store.get_many(pick)
        return "" if all(_same(a, truth.routes[s]) for a, s in zip(got, pick, strict=True)) else \
            f"get_many({pick}) differs"
    if name == "num_tokens":
        got = store.num_tokens(sid, include_quarantined=q)
        return "" if got == truth.tokens[sid] else f"num_tokens({sid!r}) {got}, the tables give {truth.tokens[sid]}"
    if name in ("row", "info"):
        got = store.row(sid, include_quarantined=q)
        return "" if _same(got, truth.rows[sid]) else f"row({sid!r}) {got} differs from {truth.rows[sid]}"
    if name == "missing_rows":
        got = store.missing_rows(sid, include_quarantined=q)
        return "" if got == truth.missing[sid] else f"missing_rows({sid!r}) {got}"
    if name == "contains":
        got = [p for p in truth.all_ids if p in store]
        return "" if got == [p for p in truth.all_ids if p in truth.ids] else f"'in' gives {got}"
    if name == "absent":
        probe = rng.choice(["never-written", "", "c0-9", *[f"{s}x" for s in truth.all_ids[:2]]])
        try:
            store.get(probe)
        except r3store.errors.SampleNotFoundError:
            return "" if probe not in truth.ids else f"get({probe!r}) not found"
        return "" if probe in truth.ids else f"get({probe!r}) of an id never written answered"
    if name == "len":
        return "" if len(store) == len(truth.ids) else f"len {len(store)}, the tables give {len(truth.ids)}"
    if name == "iter":
        got = list(store)
        return "" if got == truth.ids else f"iteration gives {got}, the tables {truth.ids}"
    if name == "sample_ids":
        got = list(store.sample_ids)
        return "" if got == truth.ids else f"sample_ids {got}, the tables {truth.ids}"
    if name == "validate":
        report = validate(store)
        kinds = truth.last_kinds = {f.kind for f in report.findings}
        if report.ok == truth.valid:
            return ""
        if truth.damaged and truth.valid and kinds - truth.kinds == {"checkpoint"}:
            return ""  # the damaged checkpoint, named
        return f"validate ok={report.ok} ({sorted(kinds)}), the tables' store {truth.valid}"
    raise AssertionError(name)


V3_LOOKUPS = ("get", "get_many", "num_tokens", "row", "info", "contains", "absent", "missing_rows")
"""Calls answered from the row groups that may hold an id while the rows are unread."""


def check_v3(objects: Objects, truth: _V3Truth, order: list[str], seed: int, strict: bool) -> str:
    """Open ``objects`` and run ``order``; an outcome label, or :class:`Failure`. ``strict``: an
    undamaged checkpoint, so no error and no warning is allowed either. Otherwise a lookup made
    while the rows are unread (or ``len``) may serve what a resealed header says (its Bloom
    filters, its counts), but then every later call that reads every row must raise (``validate``:
    or name the checkpoint)."""
    rng = random.Random(seed)
    labels: list[str] = []
    served = ""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = r3store.open_store(MemoryBackend(dict(objects)), reader=truth.reader)
        except R3StoreError as exc:
            if strict:
                raise Failure(f"open of an undamaged store: {exc!r}") from exc
            return outcome(exc)
        except Exception as exc:  # the oracle
            raise Failure(f"open: {type(exc).__name__} outside r3store.errors: {exc}") from exc
        for name in order:
            pending = store._catalog._pending
            trusted = name == "len" or (name in V3_LOOKUPS and pending is not None and pending.lazy)
            try:
                wrong = _v3_call(store, name, truth, rng)
            except R3StoreError as exc:
                if strict:
                    raise Failure(f"{name} after {labels} on an undamaged store: {exc!r}") from exc
                labels.append(f"{name}: {outcome(exc)}")
                continue
            except Exception as exc:  # the oracle
                raise Failure(f"{name} after {labels}: {type(exc).__name__} outside r3store.errors: {exc!r}") from exc
            if wrong and trusted and not strict:
                served = served or wrong
                labels.append(f"{name}: served from the header")
                continue
            if wrong:
                raise Failure(f"{name} (after {labels}): {wrong} without an error")
            if served and name not in V3_LOOKUPS and name != "len" and not (
                    name == "validate" and "checkpoint" in truth.last_kinds):
                raise Failure(f"{name} read every row without an error after {served} (after {labels})")
            labels.append(f"{name}: ok")
    others = [w for w in caught if not issubclass(w.category, CheckpointWarning)]
    if others:
        raise Failure(f"unexpected warning {others[0].category.__name__}: {others[0].message}")
    if strict and caught:
        raise Failure(f"undamaged store: {caught[0].message}")
    refusals = sorted({lab.split(": ", 1)[1] for lab in labels if not lab.endswith(": ok")})
    return ("CheckpointWarning; " if caught else "") + ("; ".join(refusals) if refusals else "ok")


def lookups(seed: int = 0, stores: int = 40, orders_per_store: int = 3) -> dict[str, Any]:
    """Random version 3 stores (:func:`v3_store`), each used in ``orders_per_store`` random orders of
    :data:`V3_CALLS`: undamaged first (every answer equal to the sample tables', no warning), then
    damaged one way each (:func:`_v3_damage`)."""
    rng = random.Random(seed)
    cases = 0
    outcomes: dict[str, int] = {}
    skipped: dict[str, int] = {}
    failures: list[str] = []
    for n in range(stores):
        what, objects, reader = v3_store(rng)
        try:
            truth = _V3Truth(objects, reader)
        except R3StoreError as exc:  # e.g. a duplicate with on_duplicate="raise": a checkpoint must not hide it
            skipped[outcome(exc)] = skipped.get(outcome(exc), 0) + 1
            try:
                _refused_alike(objects, reader, outcome(exc), f"store {n} ({what})")
            except Failure as fail:
                failures.append(str(fail))
            continue
        for k in range(orders_per_store):  # the first order on the undamaged store
            damage, forged = ("none", objects) if k == 0 else _v3_damage(rng, objects)
            order = [rng.choice(V3_CALLS) for _ in range(rng.randint(1, 8))]
            truth.damaged = damage != "none"
            cases += 1
            try:
                label = check_v3(forged, truth, order, seed * 1000 + cases, strict=damage == "none")
            except Failure as exc:
                failures.append(f"store {n} ({what}, reader {reader}), {damage}: {exc}")
                continue
            key = f"{damage.split(' (')[0] if 'byte' not in damage else 'byte flipped'}: {label}"
            outcomes[key] = outcomes.get(key, 0) + 1
    return {"attack": "lookups", "stores": stores, "cases": cases, "failures": failures,
            "outcomes": outcomes, "refused alike": skipped}


ATTACKS: dict[str, Callable[..., dict[str, Any]]] = {"flips": flips, "truncations": truncations, "reseal": reseal,
                                                     "bloom": bloom, "lookups": lookups}

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.checkpoints", description=__doc__.split("\n")[0])
    parser.add_argument("--attack", default="all", help=f"one of {', '.join(ATTACKS)}, or all (default)")
    parser.add_argument("--stride", type=int, default=1, help="flips/truncations: every N-th byte position")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--golden", choices=("v3-ckpt2", "v3-ckpt3"), default="v3-ckpt2",
                        help="flips/truncations: the golden store (checkpoint version 2 or 3)")
    args = parser.parse_args(argv)
    status = 0
    for name, attack in ATTACKS.items():
        if args.attack not in ("all", name):
            continue
        start = time.monotonic()
        kwargs: dict[str, Any] = {"seed": args.seed}
        if name in ("flips", "truncations"):
            kwargs["stride"] = args.stride
            kwargs["golden"] = FIXTURES / "stores" / args.golden
        try:
            report = attack(**kwargs)
        except Failure as exc:
            report, status = {"attack": name, "failures": [str(exc)]}, 1
        report["seconds"] = round(time.monotonic() - start, 1)
        if name == "reseal" and not status:
            report["outcomes"] = len(report["outcomes"])
        status = status or int(bool(report.get("failures")))
        print(json.dumps(report, ensure_ascii=False), flush=True)
    return status


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
