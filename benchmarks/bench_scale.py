"""Stores of many commits (async RL at scale): open time and requests before and after ``compact``.

Builds stores of N commits of small samples (2 samples of 16 tokens per commit, metadata
``step = commit // 100``) with the writer's own commit code in a loop (one ``RouteWriter``,
``flush()`` after every commit: the same objects many writer processes would make), its
clock set so that 100 commits land per hour, ending an hour ago (a store grown over
N / 100 hours: 50,000 commits are three weeks of hourly buckets), then
measures, each against the store without a checkpoint in the same run:

* ``open_store``: time (and, on the loopback S3 server, requests);
* ``RouteDataset`` construction + first batch;
* the same after ``r3store.compact`` with ``--after`` commits made after the checkpoint;
* ``open_store(filter=step == last step)`` after the compaction;
* ``open_store`` + the first ``get`` of one sample the checkpoint holds (issue 21: a rank that
  reads a few samples should not pay for the whole catalogue), with the checkpoint as
  ``compact`` writes it (version 3: only the row group holding the id is read) and the same
  rows rewritten as a version 2 checkpoint (every row read on first use: the code before);
* the baseline of the open without a checkpoint: ``pyarrow.parquet.read_table`` of every
  sample table (the held target: the open <= 2.5x it).

The S3 stores are built locally and uploaded (``s3fs.put``); the S3 server runs in its own
process (``python -m r3store.testing.s3``) and counts requests at the server.

usage: python benchmarks/bench_scale.py [--local 1000,10000,50000] [--s3 1000,5000]
                                        [--after 10] [--repeats 3] [--json PATH] [--open-baseline-max N]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import s3fs
from rich.console import Console
from rich.table import Table

import r3store
from r3store._format import _checkpoint, read_checkpoint, read_checkpoint_header
from r3store.testing.s3 import make_bucket, reset_remote_counter, storage_options

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)
PER_COMMIT = 2
TOKENS = 16
BUCKET = "r3store-scale"


def build(path: Path, first: int, commits: int, *, past: bool = True) -> float:
    """Commits ``first .. first + commits - 1`` of PER_COMMIT samples each; returns seconds taken.

    The local writer fsyncs every object it writes (three per commit) and re-reads the
    manifest before each commit; the builder turns both off (the stores are scratch data,
    and the build is not what is measured). With
    ``past``, commit ``c`` is dated ``(first + commits - c) * 36 s + 1 h`` ago (100 per hour),
    and so is its sample table's mtime (the store's clock, FORMAT.md section 12.2: without
    it a format 3 writer sees a clock hours behind the store's and adds every table to the
    current hour's bucket); otherwise now.
    """
    rng = np.random.default_rng(first)
    base = np.argsort(rng.random((TOKENS - 1, SPEC.num_moe_layers, SPEC.num_experts)), axis=-1)[..., : SPEC.top_k]
    t0 = time.perf_counter()
    fsync, os.fsync = os.fsync, lambda fd: None
    try:
        with r3store.RouteWriter(path, SPEC, {"writer_id": f"bench{first:08d}"}) as w:
            w._committer.check_spec = lambda: None  # type: ignore[method-assign]  # re-read once, not per commit
            end = datetime.now(UTC) - timedelta(hours=1)
            for c in range(first, first + commits):
                if past:
                    when = end - timedelta(seconds=36 * (first + commits - c))
                    w._committer.clock = lambda when=when: when  # the writer's commit code, dated in the past
                    # ...and the store's clock with it (the table's mtime): a store that grew over weeks, not one
                    # whose clock is ahead of the writer's (FORMAT.md 12.2 would add each table to this hour's bucket)
                    def landed(key: str, pending: object, stamp: float = when.timestamp()) -> str:
                        os.utime(path / key, (stamp, stamp))
                        return key  # the table stays where it was written

                    w._committer._ensure_visible = landed  # type: ignore[method-assign]
                for k in range(PER_COMMIT):
                    w.append(f"c{c:06d}-{k}", (base + c + k) % SPEC.num_experts, metadata={"step": c // 100})
                w.flush()
    finally:
        os.fsync = fsync
    return time.perf_counter() - t0


def best(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Best wall time and best CPU time (``time.process_time``: the machine is shared) of
    ``repeats`` calls, and the last result."""
    times, cpu, out = [], [], None
    for _ in range(repeats):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        cpu.append(time.process_time() - c0)
        times.append(time.perf_counter() - t0)
    return min(times), min(cpu), out


def first_batch(url: str, options: dict[str, Any] | None, use_checkpoint: bool) -> int:
    reader = r3store.open_store(url, reader={"use_checkpoint": use_checkpoint}, storage_options=options)
    ds = r3store.RouteDataset(reader, max_tokens_per_batch=4096)
    batch = next(iter(ds))
    return len(batch["sample_ids"])


def measure_store(url: str, n: int, options: dict[str, Any] | None, repeats: int,
                  counter: Callable[[], dict[str, Any]] | None, *, full: bool = True) -> list[dict[str, Any]]:
    """Rows: open / dataset+first batch / filtered open, without and with the checkpoint."""
    rows = []
    last_step = (n - 1) // 100

    def row(what: str, fn: Callable[[], Any], reps: int = repeats) -> None:
        if counter is not None:
            counter()
        seconds, cpu, out = best(fn, reps)
        requests = None
        if counter is not None:
            requests = counter()["requests"] // reps
        rows.append({"commits": n, "what": what, "seconds": seconds, "cpu": cpu, "requests": requests, "result": out})

    row("open_store, no checkpoint", lambda: len(r3store.open_store(url, reader={"use_checkpoint": False},
                                                                    storage_options=options)), max(1, repeats // 2))
    if options is None:  # local: the same tables read by pyarrow alone (the baseline of the open's 2.5x target)
        tables = sorted(str(p) for p in Path(url).glob("index/*/*.parquet"))
        row("pyarrow read_table of every sample table (baseline)",
            lambda: sum(pq.read_table(t).num_rows for t in tables), max(1, repeats // 2))
    if not full:
        return rows
    row("RouteDataset + first batch, no checkpoint", lambda: first_batch(url, options, False), 1)
    row("open_store(filter=step==last), no checkpoint",
        lambda: len(r3store.open_store(url, reader={"use_checkpoint": False, "filter": pc.field("step") == last_step},
                                       storage_options=options)), 1)
    return rows


def measure_after(url: str, n: int, after: int, options: dict[str, Any] | None, repeats: int,
                  counter: Callable[[], dict[str, Any]] | None) -> list[dict[str, Any]]:
    rows = []
    last_step = (n + after - 1) // 100

    def row(what: str, fn: Callable[[], Any], reps: int = repeats) -> None:
        if counter is not None:
            counter()
        seconds, cpu, out = best(fn, reps)
        requests = counter()["requests"] // reps if counter is not None else None
        rows.append({"commits": n, "what": what, "seconds": seconds, "cpu": cpu, "requests": requests, "result": out})

    row(f"open_store, checkpoint + {after} newer commits",
        lambda: len(r3store.open_store(url, storage_options=options)))
    row(f"RouteDataset + first batch, checkpoint + {after}", lambda: first_batch(url, options, True), 1)
    row(f"open_store(filter=step==last), checkpoint + {after}",
        lambda: len(r3store.open_store(url, reader={"filter": pc.field("step") == last_step}, storage_options=options)))
    sid = f"c{n // 2:06d}-0"  # a sample the checkpoint holds, mid-store
    row(f"open_store + first get, checkpoint + {after}", lambda: first_get(url, options, sid))
    if options is None:
        as_version_2(Path(url))
        row(f"open_store + first get, checkpoint version 2 + {after}", lambda: first_get(url, options, sid))
    return rows


def first_get(url: str, options: dict[str, Any] | None, sample_id: str) -> int:
    """Open, then read one sample's routes (what a rank reading a few samples pays)."""
    return int(r3store.open_store(url, storage_options=options).get(sample_id).shape[0])


def as_version_2(root: Path) -> None:
    """Rewrite the store's checkpoint in place as checkpoint version 2 (the same rows, watermark
    and recent commits; one Bloom filter for the file): the layout compacted stores had before."""
    store = r3store.open_store(root, reader={"use_checkpoint": False})
    key = next(p for p in (root / "index").iterdir() if p.suffix == ".checkpoint")
    buf = key.read_bytes()
    manifest = store.manifest
    header = read_checkpoint_header(buf, str(key), spec=manifest.spec, version=manifest.version,
                                    store_id=manifest.store_id)
    assert header is not None
    table, _ = read_checkpoint(buf, str(key), spec=manifest.spec, version=manifest.version,
                               store_id=manifest.store_id)
    listed_at = datetime.fromisoformat(header.info.created_at)
    key.write_bytes(_checkpoint.write_checkpoint(table, json.dumps(manifest.spec.to_dict()), listed_at=listed_at,
                                                 version=manifest.version, store_id=manifest.store_id,
                                                 recent=header.recent, layout=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", default="1000,10000,50000", help="commit counts of the local stores")
    parser.add_argument("--s3", default="1000,5000", help="commit counts of the S3 stores ('' for none)")
    parser.add_argument("--after", type=int, default=10, help="commits made after the checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-baseline-max", type=int, default=10_000,
                        help="above this many commits, only open_store is measured without a checkpoint")
    parser.add_argument("--json", help="also write the rows as JSON here (rewritten after every store)")
    parser.add_argument("--open-baseline-max", type=int, default=None,
                        help="above this many commits, skip the rows without a checkpoint (local stores)")
    args = parser.parse_args()
    console = Console()
    tmp = Path(tempfile.mkdtemp(prefix="r3store-scale-"))
    rows: list[dict[str, Any]] = []
    builds: list[tuple[int, float]] = []

    def report(new: list[dict[str, Any]]) -> None:
        rows.extend(new)
        for r in new:
            req = "" if r["requests"] is None else f", {r['requests']:,} requests"
            cpu = "" if r.get("cpu") is None else f" ({r['cpu'] * 1e3:.1f} ms CPU)"
            console.print(f"{r.get('where', 'local')} {r['commits']:,}: {r['what']}: {r['seconds']:.3f} s{cpu}{req} "
                          f"({r['result']})", highlight=False)
        if args.json:
            Path(args.json).write_text(json.dumps({"builds": builds, "rows": rows}, indent=2, default=str))

    def built(n: int) -> Path:
        path = tmp / f"store-{n}"
        if not path.exists():
            seconds = build(path, 0, n)
            builds.append((n, seconds))
            console.print(f"built {n:,} commits in {seconds:.1f} s", highlight=False)
        return path

    try:
        local = [int(v) for v in args.local.split(",") if v]
        s3_counts = [int(v) for v in args.s3.split(",") if v]
        if s3_counts:
            server = subprocess.Popen([sys.executable, "-m", "r3store.testing.s3"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            try:
                assert server.stdout is not None
                endpoint = server.stdout.readline().strip()
                make_bucket(endpoint, BUCKET)
                options = storage_options(endpoint)
                fs = s3fs.S3FileSystem(**options)
                counter = lambda: reset_remote_counter(endpoint)  # noqa: E731
                for n in s3_counts:
                    url = f"s3://{BUCKET}/store-{n}"
                    t0 = time.perf_counter()
                    fs.put(str(built(n)) + "/", f"{BUCKET}/store-{n}/", recursive=True)
                    console.print(f"uploaded {n:,} commits in {time.perf_counter() - t0:.1f} s", highlight=False)
                    report([dict(r, where="s3") for r in measure_store(url, n, options, 1, counter, full=True)])
                    counter()
                    t0 = time.perf_counter()
                    result = r3store.compact(url, storage_options=options)
                    seconds = time.perf_counter() - t0
                    report([{"commits": n, "what": "compact", "seconds": seconds, "requests": counter()["requests"],
                             "result": f"{result.nbytes:,} bytes", "where": "s3"}])
                    for c in range(n, n + args.after):
                        local_extra = tmp / f"extra-{n}"
                        local_extra.mkdir()  # the uploaded store's manifest: its identity (format 3)
                        shutil.copy(built(n) / "r3store.json", local_extra / "r3store.json")
                        build(local_extra, c, 1, past=False)
                        fs.put(str(local_extra / "routes") + "/", f"{BUCKET}/store-{n}/routes/", recursive=True)
                        fs.put(str(local_extra / "index") + "/", f"{BUCKET}/store-{n}/index/", recursive=True)
                        shutil.rmtree(local_extra)
                    report([dict(r, where="s3") for r in measure_after(url, n, args.after, options, 1, counter)])
            finally:
                assert server.stdin is not None
                server.stdin.close()
                server.wait(timeout=30)
        for n in local:
            work = tmp / f"work-{n}"
            shutil.copytree(built(n), work)
            shutil.rmtree(tmp / f"store-{n}")
            if args.open_baseline_max is None or n <= args.open_baseline_max:
                report(measure_store(str(work), n, None, args.repeats, None, full=n <= args.full_baseline_max))
            t0 = time.perf_counter()
            result = r3store.compact(work)
            report([{"commits": n, "what": "compact", "seconds": time.perf_counter() - t0, "requests": None,
                     "result": f"{result.nbytes:,} bytes"}])
            build(work, n, args.after, past=False)
            report(measure_after(str(work), n, args.after, None, args.repeats, None))
            shutil.rmtree(work)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table = Table(title=f"bench_scale ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
                        f"{PER_COMMIT} samples of {TOKENS} tokens per commit)")
    for col in ("where", "commits", "what", "seconds", "CPU ms", "requests", "result"):
        table.add_column(col, justify="right" if col in ("commits", "seconds", "CPU ms", "requests") else "left")
    for r in rows:
        table.add_row(r.get("where", "local"), f"{r['commits']:,}", r["what"], f"{r['seconds']:.3f}",
                      "" if r.get("cpu") is None else f"{r['cpu'] * 1e3:.1f}",
                      "" if r["requests"] is None else f"{r['requests']:,}", str(r["result"]))
    console.print(table)
    for prefix, what in (("open_store, checkpoint", "open after compaction"),
                         ("open_store + first get, checkpoint +", "open + first get after compaction"),
                         ("open_store + first get, checkpoint version 2", "open + first get, version 2 checkpoint")):
        opened = {(r.get("where", "local"), r["commits"]): r["cpu"] for r in rows if r["what"].startswith(prefix)}
        for where in ("local", "s3"):
            counts = sorted(n for w, n in opened if w == where)
            if len(counts) > 1:
                ratio = opened[(where, counts[-1])] / opened[(where, counts[0])]
                console.print(f"{where}: {what}, {counts[-1]:,} vs {counts[0]:,} commits: {ratio:.2f}x "
                              "in CPU time (target <= 2x)", highlight=False)
    cpu = {(r["commits"], r["what"]): r.get("cpu") for r in rows if r.get("where", "local") == "local"}
    for n in sorted({n for n, _ in cpu}):
        base = cpu.get((n, "pyarrow read_table of every sample table (baseline)"))
        if base:
            ratio = cpu[(n, "open_store, no checkpoint")] / base
            console.print(f"local {n:,}: open without a checkpoint vs pyarrow reading the same tables: {ratio:.2f}x "
                          "in CPU time (target <= 2.5x)", highlight=False)


if __name__ == "__main__":
    main()
