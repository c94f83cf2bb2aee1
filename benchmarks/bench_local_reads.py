"""Local-disk reads: ``pread`` (r3store's ``LocalBackend``) vs the ``mmap`` reads it replaced.

A Qwen3-30B-A3B-shaped store (48 MoE layers, 128 experts, top-8) is read back with
``RouteStore.get`` (whole samples, then 12-layer slices of 256 rows: the small ranged reads
of a pipeline stage), once through ``LocalBackend`` and once through a subclass that serves
ranges from ``mmap`` views as r3store 0.2 did, in the same run, page cache warm for both.
The chunk cache is off so every call reads and verifies its frames.

usage: python benchmarks/bench_local_reads.py [--quick] [--samples N] [--tokens T] [--repeats R]
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
from pathlib import Path

import r3store
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 samples, 1 repeat")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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
