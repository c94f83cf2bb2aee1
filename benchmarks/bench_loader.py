"""Loader throughput: RouteDataset vs per-sample int32 .npy files padded with numpy.

A Qwen3-30B-A3B-shaped store (48 MoE layers, 128 experts, top-8) is streamed as THD
batches without context parallel (CP=1) and with CP=2 (zig-zag, rank 0: per rank),
through ``DataLoader`` with 0 and 2 workers. The baseline is today's status quo: one int32
``.npy`` per sample, loaded with ``np.load``, given a pad row, zig-zag split and packed
with numpy in a map-style dataset yielding the same batches. Both read from the same local
disk in the same run; each row is the median of ``--repeats`` epochs, in CPU time of the
process without workers (single-threaded: the shared machine's other jobs do not count)
and in wall time with 2 workers. The RAM bound (issue 21) builds the same batches from
decoded int32 already in memory (no file, no decode, no check), in the main process.

usage: python benchmarks/bench_loader.py [--quick] [--samples N] [--tokens T] [--repeats R]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, Dataset

import r3store
from r3store.dataset import plan_batches
from r3store.testing.synthetic import qwen3_30b_a3b_spec, synthetic_routes

CPS = (1, 2)
BUDGET = 16384
TARGETS = {1: 1.0, 2: 1.5}
"""Issue 10's targets: tokens/s vs the status quo at CP=1, and per rank at CP=2."""
RAM_TARGET = 0.8
"""Issue 21's target: RouteDataset, THD, CP=2, 0 workers, >= 0.8x the RAM bound's tokens/s."""


def make_samples(num_samples: int, tokens: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``num_samples`` realistic traces; 8 are generated, the rest relabel experts of those."""
    spec = qwen3_30b_a3b_spec()
    rng = np.random.default_rng(seed)
    base = [synthetic_routes(num_tokens=tokens, num_layers=48, num_experts=128, top_k=8, seed=seed + i)
            for i in range(min(8, num_samples))]
    out = {}
    for i in range(num_samples):
        perm = rng.permutation(spec.num_experts).astype(np.int32)
        n = int(rng.integers(tokens // 2, tokens + 1))
        out[f"s{i:04d}"] = perm[base[i % len(base)][: n - 1]]
    return out


class NpyBaseline(Dataset[dict[str, Any]]):
    """Status quo: per-sample .npy, pad row of zeros, zig-zag CP split, THD pack, all numpy."""

    def __init__(self, folder: Path, batches: list[list[str]], cp: int, cp_rank: int = 0) -> None:
        self.folder, self.batches, self.cp, self.cp_rank = folder, batches, cp, cp_rank

    def __len__(self) -> int:
        return len(self.batches)

    def load(self, sid: str) -> np.ndarray:
        return np.load(self.folder / f"{sid}.npy")

    def __getitem__(self, i: int) -> dict[str, Any]:
        parts, lengths = [], []
        for sid in self.batches[i]:
            routes = self.load(sid)
            routes = np.concatenate([routes, np.zeros((1, *routes.shape[1:]), routes.dtype)])
            if self.cp == 1:
                parts.append(routes)
                lengths.append(len(routes))
                continue
            unit = 2 * self.cp
            padded = -(-len(routes) // unit) * unit
            routes = np.concatenate([routes, np.zeros((padded - len(routes), *routes.shape[1:]), routes.dtype)])
            chunks = np.split(routes, unit)
            parts += [chunks[self.cp_rank], chunks[unit - 1 - self.cp_rank]]
            lengths.append(padded // self.cp)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        return {"routes": torch.from_numpy(np.concatenate(parts)), "cu_seqlens": torch.from_numpy(cu),
                "sample_ids": self.batches[i]}


class RamBound(NpyBaseline):
    """The RAM bound (issue 21): the same batches from decoded int32 already in memory, sliced
    and packed as the status quo does (no file, no decode, no check)."""

    def __init__(self, samples: dict[str, np.ndarray], batches: list[list[str]], cp: int, cp_rank: int = 0) -> None:
        super().__init__(Path(), batches, cp, cp_rank)
        self.samples = samples

    def load(self, sid: str) -> np.ndarray:
        return self.samples[sid]


def run_loader(loader: DataLoader, tokens_of: dict[str, int], cpu: bool) -> tuple[float, int, float]:
    """Seconds of one epoch, its tokens, and the seconds until its first batch: CPU time of this
    process (``time.process_time``, every thread) without workers, where the loader runs in this
    process alone and wall time mostly measures the other jobs of a shared machine (``cpu``);
    wall time for the rows with workers (their CPU is elsewhere), the RAM bound among them. With
    workers, the first batch's wait is mostly their start-up (shown apart, still counted)."""
    clock = time.process_time if cpu else time.perf_counter
    t0 = clock()
    tokens, first = 0, None
    for batch in loader:
        tokens += sum(tokens_of[s] for s in batch["sample_ids"])
        first = clock() - t0 if first is None else first
    end = clock() - t0
    return end, tokens, end if first is None else first


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 1 repeat")
    parser.add_argument("--samples", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None, help="max tokens per sample")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--codec", choices=["bitpack", "set"], default="bitpack",
                        help="codec of the store (WriterConfig.codec; set: rows read back ascending)")
    args = parser.parse_args()
    num_samples = args.samples or (16 if args.quick else 64)
    tokens = args.tokens or (2048 if args.quick else 8192)
    repeats = args.repeats or (1 if args.quick else 5)
    console = Console(width=170)
    console.print(f"python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
                  f"{os.cpu_count()} CPUs, kernels {r3store.codecs.kernels.implementation()}; {num_samples} samples "
                  f"of {tokens // 2}..{tokens} tokens, 48 layers x top-8 of 128 experts, THD, CP in {CPS} zig-zag "
                  f"(rank 0), budget {BUDGET} tokens, median of {repeats}, codec {args.codec}")
    work = Path(tempfile.mkdtemp(prefix="r3store-bench-loader-"))
    try:
        samples = make_samples(num_samples, tokens)
        tokens_of = {s: len(r) + 1 for s, r in samples.items()}
        npy = work / "npy"
        npy.mkdir()
        for sid, routes in samples.items():
            np.save(npy / f"{sid}.npy", routes.astype(np.int32))
        with r3store.RouteWriter(work / "store", qwen3_30b_a3b_spec(), {"codec": args.codec}) as writer:
            for sid, routes in samples.items():
                writer.append(sid, routes)
        store_bytes = folder_bytes(work / "store")
        results = []
        for cp in CPS:
            ds = r3store.RouteDataset(work / "store", max_tokens_per_batch=BUDGET, options={"cp_size": cp})
            narrow = r3store.RouteDataset(work / "store", max_tokens_per_batch=BUDGET,
                                          options={"cp_size": cp, "dtype": "auto"})
            ids = ds.sample_ids
            order = plan_batches([tokens_of[s] for s in ids], BUDGET, shuffle=False, seed=0, epoch=0)
            batches = [[ids[i] for i in b] for b in order]
            for workers in (0, 2):
                int32 = {s: r.astype(np.int32) for s, r in samples.items()}
                makers = (
                    ("int32 .npy + numpy (status quo)",
                     lambda w=workers, c=cp, b=batches: DataLoader(NpyBaseline(npy, b, c), batch_size=None,
                                                                  num_workers=w)),
                    ("r3store RouteDataset", lambda w=workers, d=ds: DataLoader(d, batch_size=None, num_workers=w)),
                    ("r3store RouteDataset, dtype='auto' (uint8)",
                     lambda w=workers, d=narrow: DataLoader(d, batch_size=None, num_workers=w)),
                    ("decoded int32 in RAM, sliced (RAM bound)",
                     lambda c=cp, b=batches, m=int32: DataLoader(RamBound(m, b, c), batch_size=None,
                                                                 num_workers=0)),
                )
                runs: dict[str, list[tuple[float, int, float]]] = {name: [] for name, _ in makers}
                for _ in range(repeats):  # interleaved, so both sides see the same machine load
                    for name, make in makers:
                        runs[name].append(run_loader(make(), tokens_of, cpu=workers == 0))
                for name, _ in makers:
                    secs = statistics.median(t for t, _, _ in runs[name])
                    first = statistics.median(f for _, _, f in runs[name])
                    results.append((name, cp, workers, runs[name][0][1] / secs, secs, first))
        table = Table(title=f"loader throughput (median of {repeats}; CP=2 rows: one rank; 0 workers: CPU time, "
                            "2 workers: wall time)")
        for col in ("loader", "CP", "workers", "tokens/s", "seconds", "first batch", "vs status quo", "target",
                    "vs RAM bound"):
            table.add_column(col)
        base = {(cp, w): tps for name, cp, w, tps, _, _ in results if name.startswith("int32")}
        ram = {(cp, w): tps for name, cp, w, tps, _, _ in results if name.startswith("decoded")}
        for name, cp, w, tps, secs, first in results:
            ours = name.startswith("r3store")
            bound = f"{tps / ram[(cp, w)]:.2f}x" if ours else ""
            if ours and cp == 2 and w == 0 and name == "r3store RouteDataset":
                bound += f" (>= {RAM_TARGET}x)"
            table.add_row(name, str(cp), str(w), f"{tps:,.0f}", f"{secs:.3f}", f"{first:.3f}",
                          f"{tps / base[(cp, w)]:.2f}x",
                          f">= {TARGETS[cp]:.1f}x" if ours else "", bound)
        console.print(table)
        console.print(f"bytes on disk: status quo {folder_bytes(npy):,}; r3store {store_bytes:,} "
                      f"({store_bytes / folder_bytes(npy):.3f}x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
