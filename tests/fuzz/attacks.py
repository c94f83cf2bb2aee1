"""Whole-object attacks on the golden format v3 store, with the fuzz targets' oracle.

swap
    Objects of another store whose commits have the same names (a fork with explicit writer
    ids, a restored backup) copied over the golden store ``v3-ckpt``: its checkpoint (under
    its own key, and under a key claiming more commits), each sample table, each route array
    document and storage object, one at a time. Each store must be refused with an r3store
    error (or a :class:`r3store.errors.CheckpointWarning`, then the sample tables) or serve
    exactly the golden routes, rows and batch (:func:`tests.fuzz.targets.check_store`).
sweep
    Writer and compaction clocks swept from hours behind to hours ahead of the store's: a
    store is written, compacted (with the compaction's clock), written again (with the
    writer's clock); every acknowledged sample must be served by a default reader (from the
    checkpoint) exactly as written, and by a reader that lists every sample table.

``python -m tests.fuzz.attacks`` runs both and prints one JSON line per attack.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

import r3store
from r3store._format import MANIFEST_KEY, make_manifest, manifest_bytes
from tests.fuzz.targets import CHECKPOINT_STORE, GOLDEN, Failure, base_objects, check_store

__all__ = ["swap", "sweep"]

CLOCK_OFFSETS = (-3 * 3600, -2 * 3600, -3600, -20 * 60, -16 * 60, -5 * 60, 0, 5 * 60, 20 * 60, 3600, 2 * 3600)
"""Seconds the writer's (or the compaction's) clock is ahead of the store's (negative: behind)."""


def _fork_objects() -> dict[str, bytes]:
    """A store with the golden store's spec and commit names (explicit writer ids, the same
    sample ids in another order, other routes), compacted after its first commit, as bytes."""
    golden = r3store.open_store(GOLDEN[CHECKPOINT_STORE][0], reader={"use_checkpoint": False})
    root = Path(tempfile.mkdtemp(prefix="r3-fork-"))
    try:
        (root / MANIFEST_KEY).write_bytes(manifest_bytes(make_manifest(golden.spec)))
        rng = np.random.default_rng(5)

        def routes(rows: int) -> np.ndarray:
            return np.stack([np.stack([rng.permutation(32)[:2] for _ in range(3)]) for _ in range(rows)]).astype(
                np.int32)

        config = r3store.WriterConfig(chunk_rows=16, writer_id="golden-v3-a")
        with r3store.RouteWriter(root, golden.spec, config) as w:
            w.append("a1", routes(23), metadata={"step": 2, "note": "fork"})
            w.append("a0", routes(40), metadata={"step": 1})
        r3store.compact(root)
        with r3store.RouteWriter(root, golden.spec, dict(config.to_dict(), writer_id="golden-v3-b")) as w:
            w.append("b0", routes(70), metadata={"step": 3})
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _swaps() -> Iterator[tuple[str, dict[str, bytes]]]:
    golden = base_objects(CHECKPOINT_STORE)
    fork = _fork_objects()
    (theirs,) = [k for k in fork if k.endswith(".checkpoint")]
    (ours,) = [k for k in golden if k.endswith(".checkpoint")]
    yield "foreign checkpoint under our key", {**golden, ours: fork[theirs]}
    claims_more = "index/000000000099-" + "f" * 32 + ".checkpoint"
    yield "foreign checkpoint claiming more commits", {**golden, claims_more: fork[theirs]}
    yield "foreign checkpoint as the only one", {**{k: v for k, v in golden.items() if k != ours},
                                                  claims_more: fork[theirs]}
    for key in sorted(golden):
        if key.endswith(".checkpoint") or key == MANIFEST_KEY:
            continue
        same = key if key in fork else next((k for k in fork if k.rpartition("/")[2] == key.rpartition("/")[2]
                                             and k.split("/")[0] == key.split("/")[0]
                                             and ("golden-v3-a" in k) == ("golden-v3-a" in key)), None)
        if same is not None:
            yield f"foreign {key}", {**golden, key: fork[same]}


def swap() -> dict[str, object]:
    """Run every swap; raise :class:`Failure` on a silent wrong read or a foreign exception."""
    outcomes: dict[str, str] = {}
    for name, objects in _swaps():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = check_store(objects, CHECKPOINT_STORE)
        warned = [str(w.message) for w in caught if issubclass(w.category, r3store.errors.CheckpointWarning)]
        if "checkpoint" in name and result == "ok" and not warned:
            raise Failure(f"{name}: used without a warning")
        outcomes[name] = "CheckpointWarning, then the tables" if warned and result == "ok" else result
    return {"attack": "swap", "cases": len(outcomes), "failures": 0, "outcomes": outcomes}


def _routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(8)[:2] for _ in range(rows)]).reshape(rows, 1, 2).astype(np.int32)


def _sweep_one(writer_skew: int, compact_skew: int) -> None:
    spec = r3store.ModelSpec(num_layers=1, num_experts=8, top_k=2)
    root = Path(tempfile.mkdtemp(prefix="r3-sweep-"))
    try:
        def clock(skew: int) -> r3store.WriterConfig:
            return r3store.WriterConfig(clock=lambda: dt.datetime.now(dt.UTC) + dt.timedelta(seconds=skew))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", r3store.errors.ClockSkewWarning)  # expected for skewed writers
            with r3store.RouteWriter(root, spec, clock(writer_skew)) as w:
                w.append("before", _routes(3, 1))
            ahead = dt.timedelta(seconds=compact_skew)
            r3store.compact(root, clock=lambda: dt.datetime.now(dt.UTC) + ahead)
            with r3store.RouteWriter(root, spec, clock(writer_skew)) as w:
                w.append("after", _routes(4, 2))
        for use_checkpoint in (True, False):
            store = r3store.open_store(root, reader={"use_checkpoint": use_checkpoint})
            if sorted(store.sample_ids) != ["after", "before"]:
                raise Failure(f"writer clock {writer_skew:+d} s, compaction clock {compact_skew:+d} s: "
                              f"{'checkpoint' if use_checkpoint else 'listing'} reader sees {store.sample_ids}")
            for sid, routes in (("before", _routes(3, 1)), ("after", _routes(4, 2))):
                if not np.array_equal(store.get(sid), routes):
                    raise Failure(f"writer clock {writer_skew:+d} s: {sid!r} read back different routes")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def sweep(offsets: tuple[int, ...] = CLOCK_OFFSETS) -> dict[str, object]:
    """Every writer clock offset with a true compaction clock, and every compaction offset with a
    true writer clock; raise :class:`Failure` if an acknowledged sample is hidden or wrong."""
    cases = [(w, 0) for w in offsets] + [(0, c) for c in offsets if c]
    for writer_skew, compact_skew in cases:
        _sweep_one(writer_skew, compact_skew)
    return {"attack": "sweep", "cases": len(cases), "failures": 0}


if __name__ == "__main__":
    for attack in (swap, sweep):
        print(json.dumps(attack()), flush=True)
