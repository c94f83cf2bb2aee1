"""A framework layout builds only this rank's positions: one rank's index is checked against
``MAX_LOCAL_LENGTH`` before it is built, so building the whole (global) padded stream first,
``cp_size`` times larger, let a large ``cp_size`` allocate without bound (``cp_size=2**31``
under slime asked for 32 GiB to plan 8 tokens)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from r3store.layout import plan_layout

CP = 2**24  # the old code built 2 * CP positions (256 MiB of int64) per sequence


@pytest.mark.parametrize(("framework", "cp_mode"), [("slime", "zigzag"), ("miles", "zigzag"), ("verl", "zigzag"),
                                                    ("slime", "contiguous"), ("prime_rl", "zigzag")])
def test_a_large_cp_size_allocates_only_the_local_positions(framework: str, cp_mode: str) -> None:
    tracemalloc.start()
    try:
        pad = CP if framework == "prime_rl" else 1  # prime-rl pads the stream to a multiple of cp_size
        plans = [plan_layout([8, 3], cp_size=CP, cp_rank=r, cp_mode=cp_mode, framework=framework, pad_multiple=pad)
                 for r in (0, 1, CP - 1)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak:,} bytes"
    landed = np.concatenate([p.index[p.index >= 0] for p in plans])
    assert len(landed) == len(set(landed.tolist()))


@pytest.mark.parametrize("framework", ["slime", "prime_rl"])
def test_the_stream_split_keeps_every_token_once(framework: str) -> None:
    seqlens = [5, 1, 9, 4]
    for cp in (1, 2, 3, 4):
        mode, pad = ("contiguous", 3) if framework == "slime" else ("zigzag", 3 * cp)
        seen = np.concatenate([plan_layout(seqlens, cp_size=cp, cp_rank=r, cp_mode=mode, framework=framework,
                                           pad_multiple=pad).index for r in range(cp)])
        assert sorted(seen[seen >= 0].tolist()) == list(range(sum(seqlens)))
