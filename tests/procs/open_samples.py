"""A rollout worker with many open multi-turn samples, for the writer memory test.

usage: open_samples.py URL SAMPLES TURNS ROWS_PER_TURN BUFFER_BYTES

Appends TURNS turns of ROWS_PER_TURN rows to each of SAMPLES samples, round-robin (all of
them open until their last turn), then prints the peak RSS growth and the commits made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa

import r3store

sys.path.insert(0, str(Path(__file__).parent))
from writer import SPEC, peak_rss_bytes, routes_for


def main() -> None:
    url, samples, turns, rows, buffer_bytes = sys.argv[1], *map(int, sys.argv[2:6])
    pa.array([0])  # pyarrow's one-time imports, before the baseline
    _ = r3store.RouteWriter  # r3store's modules (imported on first use), before the baseline too
    turn = [routes_for(t, rows) for t in range(turns)]  # made before the baseline: not the writer's memory
    baseline = peak_rss_bytes(reset=True)
    with r3store.RouteWriter(url, SPEC, config={"buffer_bytes": buffer_bytes}) as writer:
        for t in range(turns):
            for i in range(samples):
                last = t == turns - 1
                writer.append(f"chat-{i:03d}", turn[t], start=t * rows, final=last,
                              num_tokens=turns * rows + 1 if last else None, policy_version=t)
        commits = len(writer.commits)
    sample_bytes = turns * rows * SPEC.num_moe_layers * SPEC.top_k * 2
    print(json.dumps({"growth_bytes": peak_rss_bytes() - baseline, "commits": commits,
                      "sample_bytes": sample_bytes, "total_bytes": samples * sample_bytes}), flush=True)


if __name__ == "__main__":
    main()
