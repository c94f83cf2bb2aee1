"""S3 benchmark (moto on loopback): read and write throughput, requests per sample read,
and writer peak RSS over a long append.

The S3 server (``python -m r3store.testing.s3``) runs in its own process, so its CPU does
not compete with the client for the GIL; its request counter is read over HTTP. Every
r3store number is printed next to a baseline measured in the same run:

* writes: raw s3fs ``pipe_file`` of the same bytes in objects of the same sizes, and
  per-sample int32 ``.npy`` PUTs (the status quo);
* reads: raw s3fs ``cat_file`` of the store's route objects (the same bytes, whole),
  raw s3fs ``cat_file`` replaying r3store's own requests (the same bytes and requests,
  without decoding), and per-sample ``.npy`` GETs plus ``np.load``;
* writer memory: the writer process's RSS before it appends, and its buffer size.

usage: python benchmarks/bench_s3.py [--quick] [--samples N] [--tokens T] [--repeats R]
                                     [--append-gib G] [--s3-append-gib G] [--buffer-mib M]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import s3fs
from rich.console import Console
from rich.table import Table

import r3store
from r3store.storage import open_backend
from r3store.testing.s3 import make_bucket, reset_remote_counter, storage_options
from r3store.testing.synthetic import qwen3_30b_a3b_spec, synthetic_routes

BUCKET = "r3store-bench"
STAGE = list(range(12))  # one pipeline stage of four: 12 of Qwen3-30B-A3B's 48 MoE layers
MIB = 1 << 20


@dataclass
class Result:
    """One measured row: what was done, what went over the wire, how long it took."""

    name: str
    seconds: float
    counts: dict[str, int]
    int32_bytes: int = 0
    """Bytes of the routes as int32 (what the caller appended or got back)."""
    log: list[list[Any]] | None = None
    """``[method, path, range, nbytes]`` of every request, when asked for."""


# -- the server and the data ----------------------------------------------------------------


class Server:
    """``python -m r3store.testing.s3`` in a child process; closes when stdin closes."""

    def __init__(self, repeats: int = 1) -> None:
        self.repeats = repeats
        self.proc = subprocess.Popen([sys.executable, "-m", "r3store.testing.s3"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.endpoint = self.proc.stdout.readline().strip()
        make_bucket(self.endpoint, BUCKET)
        self.options = storage_options(self.endpoint)

    def measure(self, name: str, run: Callable[[], int], *, log: bool = False,
                setup: Callable[[], object] | None = None, repeats: int | None = None) -> Result:
        """Best of ``repeats`` runs of ``run`` (returns int32 bytes handled), each after an
        untimed ``setup``; the requests are those of the best run."""
        best: Result | None = None
        for _ in range(repeats or self.repeats):
            if setup is not None:
                setup()
            reset_remote_counter(self.endpoint)
            t0 = time.perf_counter()
            int32_bytes = run()
            seconds = time.perf_counter() - t0
            counts = reset_remote_counter(self.endpoint, log=log)
            if best is None or seconds < best.seconds:
                best = Result(name, seconds, counts, int32_bytes, counts.pop("log", None))
        assert best is not None
        return best

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def make_samples(num_samples: int, tokens: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Realistic traces of ``tokens // 2 .. tokens`` tokens; 8 are generated, the others
    relabel the experts of those."""
    rng = np.random.default_rng(seed)
    base = [synthetic_routes(num_tokens=tokens, num_layers=48, num_experts=128, top_k=8, seed=seed + i)
            for i in range(min(8, num_samples))]
    out = {}
    for i in range(num_samples):
        perm = rng.permutation(128).astype(np.int32)
        n = int(rng.integers(tokens // 2, tokens + 1))
        out[f"s{i:04d}"] = perm[base[i % len(base)][: n - 1]]
    return out


# -- writes ---------------------------------------------------------------------------------


def bench_writes(server: Server, samples: dict[str, np.ndarray]) -> tuple[list[Result], dict[str, int]]:
    url = f"s3://{BUCKET}/store"
    spec = qwen3_30b_a3b_spec()
    int32_total = sum(r.nbytes for r in samples.values())
    runs = iter(range(1000))

    def write_r3store() -> int:  # the first run writes the store the reads use; later runs go elsewhere
        run = next(runs)
        with r3store.RouteWriter(url + (f"-{run}" if run else ""), spec, storage_options=server.options) as writer:
            for sid, routes in samples.items():
                writer.append(sid, routes)
        return int32_total

    results = [server.measure("r3store RouteWriter", write_r3store)]
    sizes = open_backend(url, server.options).list_sizes("")
    fs = s3fs.S3FileSystem(**server.options)
    payload = np.random.default_rng(1).integers(0, 256, max(sizes.values()), dtype=np.uint8).tobytes()

    def write_raw() -> int:
        for i, size in enumerate(sizes.values()):
            fs.pipe_file(f"{BUCKET}/raw/{i}", payload[:size])
        return int32_total

    def write_npy() -> int:
        for sid, routes in samples.items():
            buf = io.BytesIO()
            np.save(buf, routes.astype(np.int32))
            fs.pipe_file(f"{BUCKET}/npy/{sid}.npy", buf.getvalue())
        return int32_total

    results.append(server.measure("raw s3fs pipe_file, same objects", write_raw))
    results.append(server.measure("int32 .npy per sample (status quo)", write_npy))
    return results, sizes


# -- reads ----------------------------------------------------------------------------------


def replay(fs: Any, log: list[list[Any]]) -> Callable[[], int]:
    """The GETs of ``log``, sent again with plain s3fs ``cat_file`` calls, in order."""
    def run() -> int:
        for method, path, byte_range, _ in log:
            if method != "GET":
                continue
            if byte_range is None:
                fs.cat_file(path.lstrip("/"), max_concurrency=1)
            elif byte_range.startswith("bytes=-"):
                fs.cat_file(path.lstrip("/"), start=int(byte_range[len("bytes="):]))
            else:
                first, last = byte_range[len("bytes="):].split("-")
                fs.cat_file(path.lstrip("/"), start=int(first), end=int(last) + 1)
        return 0
    return run


def bench_reads(server: Server, samples: dict[str, np.ndarray], sizes: dict[str, int],
                cache_dir: Path) -> tuple[list[Result], list[Result]]:
    url = f"s3://{BUCKET}/store"
    ids = sorted(samples)
    full = sum(r.nbytes for r in samples.values())
    holder: dict[str, r3store.RouteStore] = {}

    def opener(**kw: Any) -> Callable[[], int]:
        def run() -> int:
            holder["store"] = r3store.open_store(url, reader=kw, storage_options=server.options)
            return 0
        return run

    def reader(sample_ids: list[str], layers: list[int] | None = None, check: bool = False) -> Callable[[], int]:
        def run() -> int:
            store, got = holder["store"], 0
            for sid in sample_ids:
                routes = store.get(sid, layers)
                got += routes.nbytes
                if check:
                    np.testing.assert_array_equal(routes, samples[sid])
            return got
        return run

    def cold_cache() -> None:
        shutil.rmtree(cache_dir, ignore_errors=True)
        opener(cache_dir=cache_dir)()

    steps = [server.measure("open_store", opener())]
    steps.append(server.measure("first sample (cold)", reader(ids[:1]), log=True, setup=opener()))
    steps.append(server.measure("each further sample", reader(ids[1:]), log=True,
                                setup=lambda: (opener()(), reader(ids[:1])())))
    reader(ids, check=True)()  # the timed reads above return the appended routes, bit for bit
    whole = Result("r3store get, every sample", steps[1].seconds + steps[2].seconds,
                   {k: steps[1].counts[k] + steps[2].counts[k] for k in steps[1].counts}, full)
    stage = server.measure(f"r3store get, PP stage ({len(STAGE)} of 48 layers)", reader(ids, STAGE), setup=opener())
    epoch1 = server.measure("r3store cache_dir, epoch 1", reader(ids), setup=cold_cache)
    # the next epoch, or a new process: a newly opened store on the filled cache
    epoch2 = server.measure("r3store cache_dir, epoch 2", reader(ids), setup=opener(cache_dir=cache_dir))
    fs = s3fs.S3FileSystem(**server.options)
    chunk_keys = [k for k in sizes if "/c/" in k]

    def raw_cat() -> int:
        for key in chunk_keys:
            fs.cat_file(f"{BUCKET}/store/{key}", max_concurrency=1)
        return 0

    def npy_get() -> int:
        return sum(np.load(io.BytesIO(fs.cat_file(f"{BUCKET}/npy/{sid}.npy"))).nbytes for sid in ids)

    raw = server.measure("raw s3fs cat_file, whole route objects", raw_cat)
    same = server.measure("raw s3fs cat_file, r3store's requests replayed",
                          replay(fs, (steps[1].log or []) + (steps[2].log or [])))
    npy = server.measure("int32 .npy per sample (status quo)", npy_get)
    return [raw, same, whole, stage, epoch1, epoch2, npy], [*steps, stage, epoch1, epoch2, npy]


# -- writer memory over a long append -------------------------------------------------------


def _status(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_now() -> int:
    """Resident set size now."""
    return _status("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """Restart the peak-RSS mark at the current RSS (Linux: ``/proc/self/clear_refs``).

    ``ru_maxrss`` cannot be used alone: a child inherits its parent's mark across fork
    and exec, so a child of a big benchmark process starts with the parent's peak.
    """
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """Peak RSS since :func:`reset_peak_rss`."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child_append(url: str, gib: float, buffer_bytes: int, options_json: str) -> None:
    """In a child process: append ``gib`` GiB of int32 routes, print RSS and timings as JSON."""
    spec = qwen3_30b_a3b_spec()
    rows = 4095  # 4096-token samples: 4095 x 48 x 8 int32 = 6.3 MB each
    offsets = (np.arange(rows)[:, None] * 7 + np.arange(48)[None, :] * 11) % 128
    template = ((offsets[..., None] + np.arange(8) * 3) % 128).astype(np.int32)  # distinct ids per row
    count = int(gib * (1 << 30) / template.nbytes)
    options = json.loads(options_json) or None
    before = rss_now()
    reset_peak_rss()
    t0 = time.perf_counter()
    with r3store.RouteWriter(url, spec, {"buffer_bytes": buffer_bytes}, storage_options=options) as writer:
        for i in range(count):
            writer.append(f"s{i:06d}", (template + i) % 128)
    seconds = time.perf_counter() - t0
    peak = peak_rss()
    print(json.dumps({"before": before, "peak": peak, "seconds": seconds, "int32_bytes": count * template.nbytes,
                      "commits": len(writer.commits)}))


def run_append(url: str, gib: float, buffer_bytes: int, options: dict[str, Any] | None) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child-append", url, str(gib), str(buffer_bytes), json.dumps(options)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


# -- tables ---------------------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def write_table(results: list[Result]) -> Table:
    table = Table(title="writes to S3 (loopback): the same samples")
    for col in ("method", "PUTs", "requests", "MB sent", "seconds", "int32 MB/s", "wire MB/s", "vs raw pipe"):
        table.add_column(col, justify="left" if col == "method" else "right")
    raw = results[1]
    for r in results:
        sent = r.counts["bytes_received"]
        table.add_row(r.name, str(r.counts["puts"]), str(r.counts["requests"]), mb(sent), f"{r.seconds:.2f}",
                      mb(r.int32_bytes / r.seconds), mb(sent / r.seconds), f"{raw.seconds / r.seconds:.2f}x")
    return table


def read_table(results: list[Result]) -> Table:
    table = Table(title="reads from S3 (loopback): every sample once, all layers unless stated")
    for col in ("method", "requests", "MB on wire", "seconds", "wire MB/s", "int32 MB/s out", "vs whole cat",
                "vs replay"):
        table.add_column(col, justify="left" if col == "method" else "right")
    whole, same = results[0], results[1]
    for r in results:
        sent = r.counts["bytes_sent"]
        table.add_row(r.name, f"{r.counts['requests']:,}", mb(sent), f"{r.seconds:.3f}",
                      mb(sent / r.seconds), mb(r.int32_bytes / r.seconds) if r.int32_bytes else "-",
                      f"{whole.seconds / r.seconds:.2f}x", f"{same.seconds / r.seconds:.2f}x")
    return table


def request_table(steps: list[Result], num_samples: int) -> Table:
    table = Table(title="requests per sample read")
    for col in ("step", "samples", "requests", "GETs", "HEADs", "KB on wire", "requests/sample", "KB/sample"):
        table.add_column(col, justify="left" if col == "step" else "right")
    for r in steps:
        n = 0 if r.name == "open_store" else 1 if r.name.startswith("first") else \
            num_samples - 1 if r.name.startswith("each") else num_samples
        c = r.counts
        table.add_row(r.name, str(n), f"{c['requests']:,}", f"{c['gets']:,}", f"{c['heads']:,}",
                      f"{c['bytes_sent'] / 1e3:,.1f}", f"{c['requests'] / n:.2f}" if n else "-",
                      f"{c['bytes_sent'] / n / 1e3:,.1f}" if n else "-")
    return table


def memory_table(rows: list[tuple[str, int, dict[str, Any]]]) -> Table:
    table = Table(title="writer process memory over a long append (child process; peak = VmHWM)")
    for col in ("store", "int32 appended", "buffer", "RSS before", "peak RSS", "growth", "growth / buffer",
                "peak / appended", "commits", "seconds", "int32 MB/s"):
        table.add_column(col, justify="left" if col == "store" else "right")
    for name, buffer_bytes, r in rows:
        growth = r["peak"] - r["before"]
        table.add_row(name, f"{r['int32_bytes'] / (1 << 30):.2f} GiB", f"{buffer_bytes // MIB} MiB",
                      f"{r['before'] / MIB:,.0f} MiB", f"{r['peak'] / MIB:,.0f} MiB", f"{growth / MIB:,.0f} MiB",
                      f"{growth / buffer_bytes:.2f}x", f"{r['peak'] / r['int32_bytes']:.3f}x", str(r["commits"]),
                      f"{r['seconds']:.1f}", mb(r["int32_bytes"] / r["seconds"]))
    return table


# -- main -----------------------------------------------------------------------------------


def versions() -> str:
    import botocore
    import fsspec
    import moto

    return (f"python {platform.python_version()}, numpy {np.__version__}, fsspec {fsspec.__version__}, "
            f"s3fs {s3fs.__version__}, botocore {botocore.__version__}, moto {moto.__version__}, "
            f"{os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about 30 s)")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None, help="max tokens per sample")
    parser.add_argument("--append-gib", type=float, default=None, help="int32 GiB the local writer appends")
    parser.add_argument("--s3-append-gib", type=float, default=None, help="int32 GiB the S3 writer appends")
    parser.add_argument("--buffer-mib", type=int, default=64, help="writer buffer for the memory runs")
    parser.add_argument("--repeats", type=int, default=None, help="best of N for reads and writes (default 3)")
    parser.add_argument("--child-append", nargs=4, metavar=("URL", "GIB", "BUFFER", "OPTIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_append:
        url, gib, buffer_bytes, options = args.child_append
        child_append(url, float(gib), int(buffer_bytes), options)
        return
    num_samples = args.samples or (16 if args.quick else 64)
    tokens = args.tokens or (4096 if args.quick else 8192)
    append_gib = args.append_gib or (1.0 if args.quick else 10.0)
    s3_append_gib = args.s3_append_gib or (0.5 if args.quick else 2.0)
    buffer_bytes = args.buffer_mib * MIB
    repeats = args.repeats or (1 if args.quick else 3)
    console = Console(width=160)
    console.print(versions())
    console.print(f"{num_samples} samples of {tokens // 2}..{tokens} tokens, Qwen3-30B-A3B shape (48 MoE layers, "
                  f"top-8 of 128 experts, 7 bits per id); default writer settings (32 MiB objects); "
                  f"reads and writes best of {repeats}")
    work = Path(tempfile.mkdtemp(prefix="r3store-bench-s3-"))
    server = Server(repeats)
    try:
        samples = make_samples(num_samples, tokens)
        writes, sizes = bench_writes(server, samples)
        console.print(write_table(writes))
        console.print(f"store: {len(sizes)} objects, {sum(sizes.values()) / 1e6:,.1f} MB "
                      f"(int32: {sum(r.nbytes for r in samples.values()) / 1e6:,.1f} MB)")
        reads, steps = bench_reads(server, samples, sizes, work / "cache")
        console.print(read_table(reads))
        console.print(request_table(steps, num_samples))
        memory = [("local disk", buffer_bytes, run_append(str(work / "long"), append_gib, buffer_bytes, None))]
        shutil.rmtree(work / "long", ignore_errors=True)
        memory.append(("S3 (loopback)", buffer_bytes,
                       run_append(f"s3://{BUCKET}/long", s3_append_gib, buffer_bytes, server.options)))
        console.print(memory_table(memory))
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
