"""The reader's output pool against a reader without one: every kept result stays equal.

A reader with ``output_pool_bytes`` builds its outputs (``get``, ``get_many``, ``read_rows``,
``assemble``) in blocks of earlier outputs once CPython's reference count says nothing refers
to them. Each step reads something at random (a sample, a row range, a layer list, several
samples, a batch of random layout and dtype) from the pooled reader and from one opened with
``output_pool_bytes=0``, checks they are equal, then keeps the result in some form (the array,
a slice, a strided view, a ``memoryview``, ``numpy.frombuffer`` of it, a torch tensor, a list,
a reference cycle dropped later and collected, a thread that waits with it) or drops it; now
and then the pooled reader is replaced by a pickled copy of itself (a DataLoader worker's),
or forked (the child reads through the inherited pool and checks every kept result). Every
step checks every kept result against its copy and the pool's bytes against its budget.

    python -m tests.fuzz.pool --steps 2000 --seed 3
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import r3store

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

__all__ = ["main", "run"]

SPEC = r3store.ModelSpec(num_layers=8, num_experts=64, top_k=8)  # 256 B per row as int32: 16,384 rows = 4 MiB


def _routes(rng: np.random.Generator, rows: int) -> np.ndarray:
    keys = rng.random((rows, SPEC.num_layers, SPEC.num_experts), dtype=np.float32)
    return np.argpartition(keys, SPEC.top_k, axis=-1)[..., :SPEC.top_k].astype(np.int32)


class _Cycle:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.me = self


def _keep(rng: np.random.Generator, arr: np.ndarray, threads: list[threading.Event]) -> tuple[Any, Any, Any]:
    """``arr`` kept in some form: (the holder, a function giving the ndarray to compare, the
    same cut of the expected array)."""
    kind = int(rng.integers(9))
    same = lambda w: w  # noqa: E731
    if kind == 0:
        return arr, same, same
    if kind == 1:
        return arr[1:], same, lambda w: w[1:]
    if kind == 2:
        return memoryview(arr), np.asarray, same  # type: ignore[arg-type]
    if kind == 3:
        shape, dtype = arr.shape, arr.dtype
        return np.frombuffer(arr, dtype=np.uint8), lambda h: h.view(dtype).reshape(shape), same
    if kind == 4:
        import torch
        return torch.from_numpy(arr), lambda h: h.numpy(), same
    if kind == 5:
        shape = arr.shape
        return [arr.reshape(-1)], lambda h: h[0].reshape(shape), same
    if kind == 6:
        return _Cycle(arr), lambda h: h.value, same
    if kind == 7:
        stop = threading.Event()
        holder: dict[str, Any] = {}

        ready = threading.Event()

        def hold(a: np.ndarray) -> None:
            holder["a"] = a
            ready.set()
            stop.wait()

        t = threading.Thread(target=hold, args=(arr,), daemon=True)
        t.start()
        ready.wait()
        threads.append(stop)
        return (holder, stop, t), lambda h: h[0]["a"], same
    return arr[::2], same, lambda w: w[::2]


def _forked(pooled: Any, plain: Any, ids: list[str], kept: list[tuple[str, Any, Any, np.ndarray]],
            step: int) -> list[str]:
    """A forked child reads through the inherited pooled reader, keeps nothing, and checks
    every inherited kept result before and after (exit status 0 when all are equal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with holder threads alive (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 0
        try:
            for sid in ids:
                if not np.array_equal(pooled.get(sid), plain.get(sid)):
                    status = 1
            if not all(np.array_equal(np.asarray(back(holder)), want) for _, holder, back, want in kept):
                status = 2
        except BaseException:  # noqa: BLE001 - reported by the status
            status = 3
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return [] if code == 0 else [f"step {step}: forked child exit {code} (1: a read differs, 2: a kept result "
                                 f"changed, 3: an exception)"]


def run(*, steps: int = 200, seed: int = 1, budget_mib: int = 48) -> dict[str, Any]:
    """``steps`` random reads; return ``steps``, ``kept`` (at most at once), ``reused`` (outputs
    the pool built in a released block), ``failures`` and ``seconds``."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    failures: list[str] = []
    threads: list[threading.Event] = []
    most = reused = forks = 0
    with tempfile.TemporaryDirectory() as tmp:
        url = Path(tmp) / "store"
        truth: dict[str, np.ndarray] = {}
        with r3store.RouteWriter(url, SPEC, config={"chunk_rows": int(rng.choice([64, 512, 4096]))}) as w:
            for i in range(6):
                rows = int(rng.choice([100, 9_000, 17_000, 24_000, 33_000]))
                truth[f"s{i}"] = _routes(rng, rows)
                w.append(f"s{i}", truth[f"s{i}"])
        pooled = r3store.open_store(url, reader={"output_pool_bytes": budget_mib << 20})
        plain = r3store.open_store(url, reader={"output_pool_bytes": 0})
        ids = list(truth)
        kept: list[tuple[str, Any, Any, np.ndarray]] = []
        for step in range(steps):
            if rng.random() < 0.02:  # a DataLoader worker's copy: its pool starts empty, the kept results stay
                reused += pooled.buffer_pool.reused
                pooled = pickle.loads(pickle.dumps(pooled))
            op = int(rng.integers(5))
            sid = ids[int(rng.integers(len(ids)))]
            layers = None if rng.random() < 0.5 else sorted(rng.choice(SPEC.num_layers, int(rng.integers(1, 9)),
                                                                          replace=False).tolist())
            try:
                if op == 0:
                    label = f"get({sid}, {layers})"
                    results = [pooled.get(sid, layers)]
                    wants = [plain.get(sid, layers)]
                elif op == 1:
                    n = len(truth[sid])
                    a = int(rng.integers(n))
                    b = int(rng.integers(a, n + 1))
                    label = f"get({sid}, rows={a}:{b})"
                    results = [pooled.get(sid, rows=slice(a, b))]
                    wants = [plain.get(sid, rows=slice(a, b))]
                elif op == 2:
                    many = [ids[int(j)] for j in rng.integers(len(ids), size=int(rng.integers(1, 4)))]
                    label = f"get_many({many})"
                    results = pooled.get_many(many, layers)
                    wants = plain.get_many(many, layers)
                elif op == 3:
                    row = pooled.row(sid)
                    n = int(row["num_rows"])
                    a = int(rng.integers(n))
                    b = int(rng.integers(a, n + 1))
                    pos = list(rng.permutation(SPEC.num_layers)[: int(rng.integers(1, 9))].tolist())
                    label = f"read_rows({sid}, {a}:{b}, {pos})"
                    s0 = int(row["row_start"])
                    results = [pooled.read_rows(row["array"], s0 + a, s0 + b, pos)]
                    wants = [plain.read_rows(row["array"], s0 + a, s0 + b, pos)]
                else:
                    batch = [ids[int(j)] for j in rng.integers(len(ids), size=int(rng.integers(1, 4)))]
                    opts: dict[str, Any] = {"layout": str(rng.choice(["thd", "bshd", "sbhd"])),
                                            "dtype": str(rng.choice(["int32", "int64", "int16", "uint8"]))}
                    label = f"assemble({batch}, {opts})"
                    got, ref = pooled.assemble(batch, opts), plain.assemble(batch, opts)
                    results = [v for k, v in sorted(got.items()) if isinstance(v, np.ndarray)]
                    wants = [v for k, v in sorted(ref.items()) if isinstance(v, np.ndarray)]
            except r3store.errors.OptionError:
                continue
            got = ref = None  # type: ignore[assignment]
            for res, want in zip(results, wants, strict=True):
                if res.shape != want.shape or res.dtype != want.dtype or not np.array_equal(res, want):
                    failures.append(f"step {step}: {label}: differs from the unpooled reader's")
            for res, want in zip(results, wants, strict=True):
                if rng.random() < 0.4:
                    holder, back, cut = _keep(rng, res, threads)
                    kept.append((label, holder, back, cut(want).copy()))
            del results, wants, res, want
            while kept and (len(kept) > 10 or rng.random() < 0.35):
                dropped = kept.pop(int(rng.integers(len(kept))))[1]
                if isinstance(dropped, tuple):  # a thread holding it: let it end
                    dropped[1].set()
                    dropped[2].join()
                del dropped
            if rng.random() < 0.1:
                gc.collect()
            for lab, holder, back, want in kept:
                if not np.array_equal(np.asarray(back(holder)), want):
                    failures.append(f"step {step}: kept {lab} ({type(holder).__name__}) changed")
                    break
            if hasattr(os, "fork") and rng.random() < 0.01:
                failures += _forked(pooled, plain, ids, kept, step)
                forks += 1
            most = max(most, len(kept))
            if pooled.buffer_pool.nbytes > budget_mib << 20:
                failures.append(f"step {step}: pool holds {pooled.buffer_pool.nbytes} bytes over {budget_mib} MiB")
            if failures:
                break
        reused += pooled.buffer_pool.reused
        for ev in threads:
            ev.set()
        kept.clear()
    return {"steps": steps, "kept": most, "reused": reused, "forks": forks, "failures": failures,
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.pool", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget-mib", type=int, default=48)
    args = parser.parse_args(argv)
    report = run(steps=args.steps, seed=args.seed, budget_mib=args.budget_mib)
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
