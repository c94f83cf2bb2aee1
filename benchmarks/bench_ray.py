"""Ray benchmark: ``validate`` in one process vs as Ray tasks, and the bytes of the hand-off.

1. One store (Qwen3-30B-A3B geometry, several commits, realistic synthetic routes) is
   validated in this process (``r3store.audit.validate``, what ``r3store validate`` runs)
   and on a local Ray cluster of ``--workers`` CPUs (``r3store.ray.validate``, what
   ``r3store validate --ray`` runs), best of ``--repeats`` each, in the same run; the two
   reports must be equal (the script exits if not). Throughput is given in samples/s,
   in stored bytes/s (the bit-packed route objects read) and in int32 bytes/s (the
   routes as int32, what frameworks move today).
2. The hand-off: for one RL step of ``--step-samples`` samples of ``--step-tokens`` tokens,
   the bytes Ray's serializer makes (:func:`r3store.ray.object_store_bytes`: what
   ``ray.put`` stores, or an actor call carries) of the message a rollout actor sends
   with r3store (sample ids, int32 token ids, commit name) against the message with the
   int32 routes in it; and the bytes of the routes in the store (written once, read by
   each trainer rank that needs them), measured on one sample written for real.

usage: python benchmarks/bench_ray.py [--quick] [--read-only] [--crossover C ...] [--commits N]
                                      [--samples-per-commit S] [--tokens T]
                                      [--repeats R] [--workers W] [--step-samples B] [--step-tokens T]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from typing import Any

import numpy as np
import ray
from rich.console import Console
from rich.table import Table

import r3store
import r3store.ray as r3ray
from r3store.audit import validate
from r3store.testing.synthetic import qwen3_30b_a3b_spec, synthetic_routes

MB = 1e6


def make_store(path: str, commits: int, per_commit: int, tokens: int) -> tuple[int, int, int]:
    """``commits`` writers of ``per_commit`` samples of ``tokens // 2 .. tokens`` tokens each.

    Returns (samples, int32 bytes, stored route bytes)."""
    spec = qwen3_30b_a3b_spec()
    rng = np.random.default_rng(0)
    base = [synthetic_routes(num_tokens=tokens, num_layers=48, num_experts=128, top_k=8, seed=i) for i in range(4)]
    int32_bytes = 0
    for c in range(commits):
        with r3store.RouteWriter(path, spec, {"writer_id": f"rollout-{c:03d}"}) as w:
            for i in range(per_commit):
                n = int(rng.integers(tokens // 2, tokens + 1))
                routes = rng.permutation(128).astype(np.int32)[base[(c + i) % len(base)][: n - 1]]
                w.append(f"c{c:03d}-s{i:03d}", routes)
                int32_bytes += routes.nbytes
    store = r3store.open_store(path)
    return len(store), int32_bytes, store.storage_usage().route_bytes


def _burn(_: int = 0) -> float:
    """A fixed piece of numpy work (sorting); its own wall time."""
    x = np.random.default_rng(0).random(1_000_000)
    t0 = time.perf_counter()
    for _ in range(20):
        np.sort(x)
    return time.perf_counter() - t0


def parallel_headroom(workers: int) -> float:
    """How much faster ``workers`` processes finish ``workers`` equal pieces of work than one
    process finishes one of them would suggest: ``workers * t_alone / t_together`` (``workers``
    on idle cores; about 1 when other jobs hold the cores)."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        list(pool.map(_burn, range(workers)))  # start the processes
        alone = min(pool.submit(_burn).result() for _ in range(3))
        together = min(max(pool.map(_burn, range(workers))) for _ in range(3))
    return workers * alone / together


def best_of(repeats: int, run: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - t0)
    return best, result


def bench_validate(args: argparse.Namespace, console: Console, tmp: str) -> None:
    path = os.path.join(tmp, "store")
    t0 = time.perf_counter()
    samples, int32_bytes, stored = make_store(path, args.commits, args.samples_per_commit, args.tokens)
    console.print(f"store: {samples} samples in {args.commits} commits, {int32_bytes / MB:,.1f} MB as int32, "
                  f"{stored / MB:,.1f} MB stored ({time.perf_counter() - t0:.1f} s to write)")

    def local() -> Any:
        return validate(r3store.open_store(path, reader={"on_duplicate": "report"}))

    headroom = parallel_headroom(args.workers)
    t_local, report_local = best_of(args.repeats, local)
    rows, starts = [], []
    for niceness in (None, 0):  # Ray's default worker niceness (15), then 0 like this process
        if niceness is None:
            os.environ.pop("RAY_worker_niceness", None)
        else:
            os.environ["RAY_worker_niceness"] = str(niceness)  # noqa: SIM112 - Ray's own spelling
        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        starts.append(time.perf_counter() - t0)
        for tasks in (None, args.workers):
            t0 = time.perf_counter()
            first = r3ray.validate(path, num_tasks=tasks)
            t_cold = time.perf_counter() - t0
            t_warm, report_ray = best_of(args.repeats, lambda tasks=tasks: r3ray.validate(path, num_tasks=tasks))
            if report_ray.to_dict() != report_local.to_dict() or first.to_dict() != report_local.to_dict():
                raise SystemExit("the --ray report differs from the local one")
            n = tasks or args.workers * 4
            nice = "15 (Ray's default)" if niceness is None else str(niceness)
            rows.append((f"--ray, {args.workers} workers at nice {nice}, {n} tasks", t_warm, t_cold))
        ray.shutdown()
    os.environ.pop("RAY_worker_niceness", None)
    assert report_local.ok, report_local.counts

    table = Table(title=f"validate: {samples} samples, {report_local.rows_checked:,} rows, "
                        f"{report_local.frames_checked:,} chunks (reports equal: yes)", title_justify="left")
    for name in ("run", "seconds (best)", "samples/s", "stored MB/s", "int32 MB/s", "vs one process",
                 "first run (cold workers)"):
        table.add_column(name, justify="right" if name != "run" else "left")
    table.add_row("one process (r3store validate)", f"{t_local:.2f}", f"{samples / t_local:,.0f}",
                  f"{stored / MB / t_local:,.1f}", f"{int32_bytes / MB / t_local:,.1f}", "1.00x", "")
    for name, t_warm, t_cold in rows:
        table.add_row(name, f"{t_warm:.2f}", f"{samples / t_warm:,.0f}", f"{stored / MB / t_warm:,.1f}",
                      f"{int32_bytes / MB / t_warm:,.1f}", f"{t_local / t_warm:.2f}x", f"{t_cold:.2f} s")
    console.print(table)
    console.print(f"Ray cluster start (ray.init, {args.workers} CPUs): {min(starts):.1f} s, not in the timings above. "
                  f"Parallel headroom of this machine now: {args.workers} processes did {headroom:.2f}x the work of "
                  f"one in the same time (a numpy sort; {args.workers:.2f}x on idle cores): the most --ray can gain "
                  "here.")


def bench_read_routes(args: argparse.Namespace, console: Console, tmp: str) -> None:
    """``read_routes`` on the cluster against the same reads in this process (``get`` of every sample)."""
    path = os.path.join(tmp, "store")
    if not os.path.exists(path):
        make_store(path, args.commits, args.samples_per_commit, args.tokens)
    reader = r3store.open_reader(path)
    ids = list(reader.sample_ids)

    def own() -> int:
        with r3store.open_reader(path) as r:
            return sum(r.get(sid).nbytes for sid in ids)

    t_get, int32_bytes = best_of(args.repeats, own)
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        rows = []
        for blocks in (args.workers, args.workers * 4):
            def read(blocks: int = blocks) -> Any:
                return r3ray.read_routes(path, override_num_blocks=blocks).materialize()

            read()  # warm the workers
            t_ray, ds = best_of(args.repeats, read)
            carried = sum(ray.get(ref).column("routes").nbytes for ref in ds.to_arrow_refs())
            rows.append((blocks, ds.num_blocks(), t_ray, carried))
    finally:
        ray.shutdown()
    table = Table(title=f"read_routes: {len(ids)} samples, {int32_bytes / MB:,.1f} MB as int32 "
                        f"(block dtype {r3ray.block_dtype(reader.spec.num_experts)})", title_justify="left")
    for name in ("run", "seconds (best)", "vs get in one process (target <= 1.5x)",
                 "routes bytes in blocks", "vs int32 (target <= 0.5x)"):
        table.add_column(name, justify="right" if name != "run" else "left")
    table.add_row("get of every sample, one process", f"{t_get:.2f}", "1.00x", f"{int32_bytes / MB:,.1f} MB", "1.00x")
    for asked, made, t_ray, carried in rows:
        table.add_row(f"read_routes, {asked} tasks asked, {made} blocks, {args.workers} workers", f"{t_ray:.2f}",
                      f"{t_ray / t_get:.2f}x", f"{carried / MB:,.1f} MB", f"{carried / int32_bytes:.3f}x")
    console.print(table)


def bench_crossover(args: argparse.Namespace, console: Console, tmp: str) -> None:
    """``validate`` in one process vs ``--ray`` on stores of growing size: where Ray starts to win,
    on a warm cluster and counting a cold start (a new local cluster, as ``r3store validate --ray``
    without an address makes)."""
    t0 = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    t_init = time.perf_counter() - t0
    t0 = time.perf_counter()
    ray.get([ray.remote(lambda: __import__("r3store.ray._audit")).remote() for _ in range(args.workers)])
    t_workers = time.perf_counter() - t0  # workers started, r3store imported
    table = Table(title=f"validate, one process vs --ray ({args.workers} workers, default tasks)", title_justify="left")
    for name in ("store", "int32 MB", "stored MB", "one process s", "--ray s (warm)", "warm speed-up",
                 "with cold start"):
        table.add_column(name, justify="right")
    try:
        for commits in args.crossover:
            path = os.path.join(tmp, f"cross-{commits}")
            samples, int32_bytes, stored = make_store(path, commits, args.samples_per_commit, args.tokens)
            t_local, _ = best_of(args.repeats, lambda path=path: validate(r3store.open_reader(path,
                                                                                            on_duplicate="report")))
            r3ray.validate(path)
            t_ray, _ = best_of(args.repeats, lambda path=path: r3ray.validate(path))
            cold = t_ray + t_init + t_workers
            table.add_row(f"{samples} samples", f"{int32_bytes / MB:,.0f}", f"{stored / MB:,.0f}", f"{t_local:.2f}",
                          f"{t_ray:.2f}", f"{t_local / t_ray:.2f}x", f"{t_local / cold:.2f}x")
            shutil.rmtree(path, ignore_errors=True)
    finally:
        ray.shutdown()
    console.print(table)
    console.print(f"Cold start: ray.init {t_init:.1f} s + first task on each worker (r3store imported) "
                  f"{t_workers:.1f} s; 'with cold start' adds both to the --ray time.")


def bench_handoff(args: argparse.Namespace, console: Console, tmp: str) -> None:
    spec = qwen3_30b_a3b_spec()
    n, rows = args.step_samples, args.step_tokens - 1
    rng = np.random.default_rng(1)
    ids = [f"step17/prompt{i // 8:03d}/sample{i % 8}" for i in range(n)]
    tokens = [rng.integers(0, 151_000, args.step_tokens).astype(np.int32) for _ in range(n)]
    routes = [np.zeros((rows, spec.num_layers, spec.top_k), np.int32) for _ in range(n)]  # size is all that counts
    message = {"commits": ["20260101T000000-0123456789ab-00000"], "sample_ids": ids, "tokens": tokens}
    with_routes = {"sample_ids": ids, "tokens": tokens, "routes": routes}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    small, large = r3ray.object_store_bytes(message), r3ray.object_store_bytes(with_routes)
    ray.shutdown()
    path = os.path.join(tmp, "one")
    one = synthetic_routes(num_tokens=args.step_tokens, num_layers=48, num_experts=128, top_k=8, seed=7)
    with r3store.RouteWriter(path, spec) as w:
        w.append("s", one)
    stored = r3store.open_store(path).storage_usage().route_bytes * n
    table = Table(title=f"hand-off of one step: {n} samples x {args.step_tokens:,} tokens, Qwen3-30B-A3B "
                        "(48 MoE layers, top-8)", title_justify="left")
    for name in ("what moves", "through the object store", "vs int32 routes", "routes in storage"):
        table.add_column(name, justify="right" if name != "what moves" else "left")
    table.add_row("int32 routes (+ ids, tokens), pickled by Ray", f"{large / MB:,.2f} MB", "1.000", "")
    table.add_row("r3store: sample ids + int32 token ids + commit", f"{small / MB:,.3f} MB",
                  f"{small / large:.4f}", f"{stored / MB:,.2f} MB ({stored / sum(r.nbytes for r in routes):.1%})")
    console.print(table)
    console.print("Object-store bytes are what Ray's serializer makes of each message "
                  "(r3store.ray.object_store_bytes); a message is fetched by every trainer rank on another node. "
                  "With r3store the routes go to storage once, bit-packed, and each rank reads only its samples "
                  "(and its layers: a pipeline stage reads a quarter of them).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller store, 1 repeat")
    parser.add_argument("--read-only", action="store_true", help="only the read_routes part")
    parser.add_argument("--crossover", type=int, nargs="*", metavar="COMMITS",
                        help="only validate vs --ray on stores of these many commits (e.g. 2 8 32)")
    parser.add_argument("--commits", type=int, default=16)
    parser.add_argument("--samples-per-commit", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4096, help="longest sample (samples are T/2..T tokens)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--step-samples", type=int, default=256, help="samples of one RL step (hand-off)")
    parser.add_argument("--step-tokens", type=int, default=32768, help="tokens per sample (hand-off)")
    args = parser.parse_args()
    if args.quick:
        args.commits, args.samples_per_commit, args.tokens, args.repeats = 8, 4, 2048, 1
        args.step_samples = 32
    console = Console(width=160)
    console.print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
                  f"{platform.python_version()}, ray {ray.__version__}, r3store kernels "
                  f"{r3store.codecs.kernels.IMPLEMENTATION}")
    tmp = tempfile.mkdtemp(prefix="r3store-bench-ray-")
    try:
        if args.crossover:
            bench_crossover(args, console, tmp)
            return
        if not args.read_only:
            bench_validate(args, console, tmp)
        bench_read_routes(args, console, tmp)
        if not args.read_only:
            bench_handoff(args, console, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
