"""Local-disk reads: ``pread`` (r3store's ``LocalBackend``) vs the ``mmap`` reads it replaced.

A Qwen3-30B-A3B-shaped store (48 MoE layers, 128 experts, top-8) is read back with
``RouteStore.get`` (whole samples, then 12-layer slices of 256 rows: the small ranged reads
of a pipeline stage), once through ``LocalBackend`` and once through a subclass that serves
ranges from ``mmap`` views as r3store 0.2 did, in the same run, page cache warm for both.
The chunk cache is off so every call reads and verifies its frames.

With ``--paths`` it measures instead issue 21's single-process paths against baselines in
the same run, in CPU time (``time.process_time``, median of ``--repeats``; ``get``, ``assemble``
and ``np.load`` interleaved call by call), on one sample of
``--tokens`` tokens of the same shape (default 32,768): ``get`` vs ``np.load`` of the same
int32 ``.npy`` (target <= 1.5x), ``assemble`` THD CP=1 vs the same ``np.load`` (<= 1.2x),
``validate`` vs reading every route back with ``get`` (<= 2.5x), and the writer
(``append`` + ``flush``, the commit, of the int32 array to an open store) vs ``np.save`` of
it to a file (<= 2.0x). Under the table, the writer interleaved call by call with
``np.save`` overwriting one file, ``np.save`` into a new file and the writer with every
write through the page cache: user and system CPU, ranges, per-round ratios, and the files
and ``os`` calls of one commit.

usage: python benchmarks/bench_local_reads.py [--quick] [--samples N] [--tokens T] [--repeats R] [--paths]
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np

import r3store
from r3store.audit import validate
from r3store.layout import LayoutOptions
from r3store.storage import ByteRange, LocalBackend, SuffixByteRange
from r3store.testing.synthetic import qwen3_30b_a3b_spec, synthetic_routes


class MmapBackend(LocalBackend):
    """The baseline: ranged reads served as views of cached read-only maps (r3store 0.2)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        super().__init__(root)
        self._mmaps: dict[str, tuple[mmap.mmap | None, int]] = {}

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes | memoryview:
        if byte_range is None:
            return super().get(key)
        entry = self._mmaps.get(key)
        if entry is None:
            with open(self._open(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                entry = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None, size)
            self._mmaps[key] = entry
        mapped, size = entry
        if isinstance(byte_range, SuffixByteRange):
            start, end = max(0, size - byte_range.nbytes), size
        else:
            start, end = min(byte_range.start, size), min(byte_range.end, size)
        return b"" if mapped is None else memoryview(mapped)[start:end]


def timed(store: r3store.RouteStore, ids: list[str], repeats: int) -> tuple[float, float]:
    """Best-of-``repeats`` seconds of whole-sample gets and of sliced gets."""
    whole = sliced = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for sid in ids:
            store.get(sid)
        t1 = time.perf_counter()
        for sid in ids:
            for start in range(0, 2048, 256):
                store.get(sid, layers=range(12, 24), rows=slice(start, start + 256))
        t2 = time.perf_counter()
        whole, sliced = min(whole, t1 - t0), min(sliced, t2 - t1)
    return whole, sliced


def cpu_median(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU seconds of ``fn()`` over ``repeats`` calls (after one untimed call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def cpu_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median CPU seconds (user + system) of each of ``fns``, timed by :func:`interleaved_cpu`
    (one call of each per round, so that a path and its baseline see the same machine: on a
    shared machine the load moves between blocks of calls)."""
    return {name: statistics.median(u + k for u, k in times)
            for name, times in interleaved_cpu(fns, repeats).items()}


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process so far (single-threaded here: the thread's)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


def interleaved_cpu(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(user, system) CPU seconds of each call, ``repeats`` rounds of one call of each in turn
    (A B C A B C ...), after one untimed round, so that the machine's load drift hits every
    call alike. ``resource.getrusage`` splits user and system time; their sum is the
    process's CPU time (``time.process_time``)."""
    for fn in calls.values():
        fn()
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            u0, s0 = _cpu()
            fn()
            u1, s1 = _cpu()
            out[name].append((u1 - u0, s1 - s0))
    return out


SYSCALLS = ("open", "write", "pwrite", "fsync", "link", "replace", "unlink", "mkdir", "stat", "lseek", "close")
"""The ``os`` calls :func:`count_syscalls` counts (the local backend's writes go through them)."""


def count_syscalls(fn: Callable[[], object]) -> dict[str, int]:
    """How many of each of :data:`SYSCALLS` one ``fn()`` makes (``os`` functions wrapped for
    the call; ``strace -c`` of a commit agrees within the reads of the manifest's file)."""
    counts = dict.fromkeys(SYSCALLS, 0)
    saved = {name: getattr(os, name) for name in SYSCALLS}

    def counted(name: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            counts[name] += 1
            return saved[name](*args, **kwargs)
        return call

    try:
        for name in SYSCALLS:
            setattr(os, name, counted(name))
        fn()
    finally:
        for name, f in saved.items():
            setattr(os, name, f)
    return counts


def writer_rows(routes: np.ndarray, spec: r3store.ModelSpec, folder: Path, repeats: int) -> dict[str, object]:
    """The writer (``append`` + ``flush``: one commit to an open store) against ``np.save`` of
    the same int32, interleaved call by call: the writer as it is (storage objects written
    with ``O_DIRECT``), the writer with every write through the page cache
    (``WriterConfig.direct_write_bytes=None``: the writer before this change), ``np.save``
    overwriting one file (issue 21's baseline) and ``np.save`` into a new file each call (a
    commit always writes new files). Every commit is fsynced as the store does it."""
    counter = iter(range(1 << 30))
    fresh = iter(range(1 << 30))
    with r3store.RouteWriter(folder / "written", spec, config={"writer_id": "w"}) as direct, \
            r3store.RouteWriter(folder / "buffered", spec,
                                config={"writer_id": "b", "direct_write_bytes": None}) as buffered:

        def commit(writer: r3store.RouteWriter) -> Callable[[], None]:
            def write() -> None:  # one sample appended and committed (its own commit)
                writer.append(f"s{next(counter)}", routes)
                writer.flush()
            return write

        calls = {"append + commit": commit(direct), "append + commit, page cache": commit(buffered),
                 "np.save": lambda: np.save(folder / "b.npy", routes),
                 "np.save, new file": lambda: np.save(folder / f"n{next(fresh)}.npy", routes)}
        cpu = interleaved_cpu(calls, repeats)
        before = {p for p in (folder / "written").rglob("*") if p.is_file()}
        syscalls = count_syscalls(calls["append + commit"])
        files = len({p for p in (folder / "written").rglob("*") if p.is_file()} - before)
    return {"cpu": cpu, "syscalls": syscalls, "files": files}


def paths(tokens: int, repeats: int) -> None:
    """Issue 21's targets: get, assemble CP=1, validate and the writer against their baselines."""
    spec = qwen3_30b_a3b_spec()
    routes = synthetic_routes(num_tokens=tokens, num_layers=spec.num_moe_layers, num_experts=spec.num_experts,
                              top_k=spec.top_k, seed=0).astype(np.int32)
    folder = Path(tempfile.mkdtemp(prefix="r3-paths-"))
    try:
        np.save(folder / "a.npy", routes)
        writes = writer_rows(routes, spec, folder, repeats)
        cpu = cast(dict[str, list[tuple[float, float]]], writes["cpu"])
        totals = {name: [u + k for u, k in calls] for name, calls in cpu.items()}
        write_cpu, save_cpu = statistics.median(totals["append + commit"]), statistics.median(totals["np.save"])
        with r3store.RouteWriter(folder / "store", spec, config={"writer_id": "r"}) as w:
            w.append("before", routes[:100])  # the sample starts mid-chunk, as most do
            w.append("a", routes)
        store = r3store.open_store(folder / "store", reader={"cache_bytes": 0})
        fresh = r3store.open_store(folder / "store", reader={"cache_bytes": 0, "output_pool_bytes": 0})
        assert (store.get("a") == routes).all()
        thd = LayoutOptions(layout="thd")
        held: dict[str, object] = {}

        def hold(name: str, fn: Callable[[], object]) -> Callable[[], None]:
            def call() -> None:  # a training loop's `batch = ...`: the last result lives until the next returns
                held[name] = fn()
            return call

        reads = cpu_medians({"load": hold("load", lambda: np.load(folder / "a.npy")),
                             "get": hold("get", lambda: store.get("a")),
                             "assemble": hold("assemble", lambda: store.assemble(["a"], thd)),
                             "get_fresh": hold("get_fresh", lambda: fresh.get("a")),
                             "assemble_fresh": hold("assemble_fresh", lambda: fresh.assemble(["a"], thd))}, repeats)
        held.clear()
        load, get, assemble = reads["load"], reads["get"], reads["assemble"]
        report = validate(store)
        assert report.ok, report.findings
        read_all = cpu_median(lambda: [store.get(s) for s in store.sample_ids], repeats)
        validate_cpu = cpu_median(lambda: validate(store), repeats)
        rows = [
            ("get", get, "np.load", load, 1.5),
            ("assemble THD CP=1", assemble, "np.load", load, 1.2),
            ("validate", validate_cpu, "get of every sample", read_all, 2.5),
            ("append + commit", write_cpu, "np.save", save_cpu, 2.0),
        ]
        mb = routes.nbytes / 1e6
        print(f"one sample of {tokens} tokens, 48 layers x top-8 of 128 experts ({mb:.0f} MB of int32), "
              f"CPU time, median of {repeats}, kernels {r3store.codecs.kernels.implementation()}")
        print(f"{'path':<20} {'ms':>8} {'baseline':<22} {'ms':>8} {'ratio':>7} {'target':>8}")
        for name, ours, base_name, base, target in rows:
            verdict = "met" if ours / base <= target else "missed"
            print(f"{name:<20} {ours * 1e3:>8.1f} {base_name:<22} {base * 1e3:>8.1f} {ours / base:>6.2f}x "
                  f"<= {target}x {verdict}")
        print(f"  (outputs in fresh memory, output_pool_bytes=0: get {reads['get_fresh'] * 1e3:.1f} ms "
              f"{reads['get_fresh'] / load:.2f}x, assemble THD CP=1 {reads['assemble_fresh'] * 1e3:.1f} ms "
              f"{reads['assemble_fresh'] / load:.2f}x; {store.buffer_pool.reused} outputs built in reused memory)")
        print(f"\nthe writer, interleaved call by call with its baselines (CPU ms, median of {repeats}, "
              f"[min - max]; user + system from getrusage):")
        for name, calls in cpu.items():
            tot = totals[name]
            user, system = statistics.median(u for u, _ in calls), statistics.median(k for _, k in calls)
            pairs = [t / b for t, b in zip(tot, totals["np.save"], strict=True)]
            med = statistics.median(tot)
            print(f"  {name:<28} {med * 1e3:>6.1f} [{min(tot) * 1e3:.1f} - {max(tot) * 1e3:.1f}] "
                  f"user {user * 1e3:.1f} system {system * 1e3:.1f}; vs np.save {med / save_cpu:.2f}x "
                  f"(per round {min(pairs):.2f}x - {max(pairs):.2f}x)")
        calls_made = cast(dict[str, int], writes["syscalls"])
        print(f"  one commit of one sample: {writes['files']} new files; os calls: "
              + ", ".join(f"{n} {name}" for name, n in calls_made.items() if n))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 samples, 1 repeat")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", action="store_true", help="issue 21's targets (get, assemble, validate, writer)")
    args = parser.parse_args()
    if args.paths:
        tokens = 8192 if args.quick else (args.tokens if args.tokens != 4096 else 32768)
        paths(tokens, 3 if args.quick else max(args.repeats, 5))
        return
    samples, repeats = (8, 1) if args.quick else (args.samples, args.repeats)
    spec = qwen3_30b_a3b_spec()
    base = synthetic_routes(num_tokens=args.tokens, num_layers=spec.num_moe_layers, num_experts=spec.num_experts,
                            top_k=spec.top_k, seed=0)
    folder = Path(tempfile.mkdtemp(prefix="r3-local-reads-"))
    try:
        with r3store.RouteWriter(folder, spec) as w:
            for i in range(samples):
                w.append(f"s{i}", (base + i) % spec.num_experts)
        ids = [f"s{i}" for i in range(samples)]
        results = {}
        for name, cls in (("mmap (baseline)", MmapBackend), ("pread", LocalBackend)):
            store = r3store.open_store(cls(folder), reader={"cache_bytes": 0})
            store.get(ids[0])  # warm: page cache, tables
            results[name] = timed(store, ids, repeats)
        mb = samples * base.size * 4 / 1e6
        print(f"{samples} samples x {args.tokens} tokens ({mb:.0f} MB of int32 ids), best of {repeats}")
        print(f"{'backend':<16} {'whole gets':>11} {'sliced gets':>12}")
        for name, (whole, sliced) in results.items():
            print(f"{name:<16} {whole:>10.3f}s {sliced:>11.3f}s")
        (bw, bs), (pw, ps) = results["mmap (baseline)"], results["pread"]
        print(f"pread / mmap time: whole {pw / bw:.2f}x, sliced {ps / bs:.2f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
