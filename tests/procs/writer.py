"""A rollout-worker process for concurrency, crash and memory tests.

usage: writer.py URL FIRST COUNT BUFFER_BYTES [ROWS] [STORAGE_OPTIONS_JSON]

Writes samples FIRST .. FIRST+COUNT-1 whose routes are a pure function of the sample
index (see :func:`routes_for`), so a reader can check every committed sample bit for bit.
Prints "flushed <n>" after each commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import r3store

SPEC = r3store.ModelSpec(num_layers=8, num_experts=128, top_k=8)


def routes_for(index: int, rows: int) -> np.ndarray:
    """Deterministic, valid routes of sample ``index``: shape (rows, 8, 8), int32."""
    base = np.arange(SPEC.top_k, dtype=np.int32) * 3
    offsets = (np.arange(rows)[:, None] * 7 + np.arange(SPEC.num_layers)[None, :] * 11 + index * 13) % SPEC.num_experts
    return ((offsets[..., None] + base) % SPEC.num_experts).astype(np.int32)


def peak_rss_bytes(reset: bool = False) -> int:
    """This process's peak RSS (``VmHWM``); ``reset`` first restarts the peak from the current RSS.

    ``ru_maxrss`` is not used: a child inherits its parent's value across fork and exec.
    """
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    url, first, count, buffer_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rows = int(sys.argv[5]) if len(sys.argv) > 5 else 300
    options = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    template = routes_for(0, rows)
    # pyarrow imports pandas (when installed, ~40 MiB) on its first Python-to-Arrow
    # conversion: a one-time import, not memory that grows with the buffer
    pa.array([0])
    baseline = peak_rss_bytes(reset=True)
    with r3store.RouteWriter(url, SPEC, storage_options=options, config={"buffer_bytes": buffer_bytes}) as writer:
        flushed = 0
        for i in range(first, first + count):
            routes = routes_for(i, rows) if rows <= 4096 else (template + i * 13) % SPEC.num_experts
            writer.append(f"sample-{i:06d}", routes, metadata={"index": i})
            if len(writer.commits) != flushed:
                flushed = len(writer.commits)
                print(f"flushed {flushed}", flush=True)
    print(json.dumps({"baseline_bytes": baseline, "peak_bytes": peak_rss_bytes()}), flush=True)


if __name__ == "__main__":
    main()
