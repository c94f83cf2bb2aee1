"""Cost of routing replay in a training step of a tiny Qwen3-MoE (transformers, random init).

Run from the repository root (r3store installed with the ``hf`` extra)::

    python benchmarks/bench_replay.py                 # 4 x 256 tokens, 30 interleaved rounds
    python benchmarks/bench_replay.py --quick         # 4 x 128 tokens, 10 rounds (a few seconds)
    python benchmarks/bench_replay.py --device cuda --batch 8 --seqlen 2048 --rounds 50

The model is ``r3store.testing.moe.tiny_moe("qwen3_moe")``: 4 decoder layers, hidden
128, 128 experts, top-8, float32, train mode. The routes replayed are a bf16 copy's own
(captured once, as a rollout engine would record them), for a right-padded batch.

Rows, measured in the same run, **interleaved** (every round runs each row once, in
turn) and reported as the median over rounds:

* ``no RoutingReplay``: a copy of the model (same weights) with no hooks: the baseline;
* ``attached, idle``: the model with a ``RoutingReplay`` attached, outside any block;
* ``replay(routes, attention_mask)``: the whole ``with rr.replay(...)`` block, so the
  per-step set-up (validating the routes, laying them out per token) is included.

Phases: ``forward`` (grad enabled, then the graph is dropped) and ``forward+backward``
(``loss.backward()`` of the mean token log-prob, ``zero_grad`` untimed; with replay,
``rr.clear()`` is in the timed region). ``vs baseline`` is the row's median / the
baseline's median (target: within 1.05x).

**router call**: one MoE router's call alone on ``batch * seqlen`` tokens, without
hooks and inside a replay block (the hook's selection swap, weight gather and input
fingerprint), medians of interleaved rounds, and the fingerprint alone.

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import copy
import gc
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from r3store.replay import RoutingReplay
from r3store.replay._recompute import fingerprint
from r3store.testing.moe import random_batch, tiny_moe, token_logprobs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def interleaved(rows: dict[str, Callable[[], Any]], rounds: int, device: torch.device,
                after: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median seconds of each row over ``rounds`` rounds; each round runs every row once, in turn."""
    for fn in rows.values():  # warm-up
        fn()
        after()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(rounds):
        names = list(rows) if r % 2 == 0 else list(reversed(rows))  # no row always goes first
        for name in names:
            times[name].append(_timed(rows[name], device))
            after()
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="--seqlen 128 --rounds 10")
    args = parser.parse_args()
    if args.quick:
        args.seqlen, args.rounds = 128, 10
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    console = Console()

    engine, model = tiny_moe("qwen3_moe", engine_dtype="bfloat16")
    plain = copy.deepcopy(model)
    engine, model, plain = engine.to(device), model.to(device).train(), plain.to(device).train()
    ids, mask = random_batch(args.batch, args.seqlen, seed=0)
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad(), RoutingReplay(engine) as rr_engine, rr_engine.capture(attention_mask=mask) as cap:
        engine(ids, attention_mask=mask, use_cache=False)
    routes = cap.routes
    rr = RoutingReplay(model)

    def loss(m: torch.nn.Module) -> torch.Tensor:
        return -token_logprobs(m(ids, attention_mask=mask, use_cache=False).logits, ids, mask).mean()

    def replayed(backward: bool) -> None:
        with rr.replay(routes, attention_mask=mask):
            out = loss(model)
            if backward:
                out.backward()
        rr.clear()

    def zero() -> None:
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)

    phases = {
        "forward": {"no RoutingReplay": lambda: loss(plain), "attached, idle": lambda: loss(model),
                    "replay(routes, attention_mask)": lambda: replayed(False)},
        "forward+backward": {"no RoutingReplay": lambda: loss(plain).backward(),
                             "attached, idle": lambda: loss(model).backward(),
                             "replay(routes, attention_mask)": lambda: replayed(True)},
    }
    tokens = int(mask.sum())
    table = Table(title=f"tiny Qwen3-MoE training step: {args.batch} x {args.seqlen} tokens ({tokens} real), "
                        f"{len(rr.moe_layers)} MoE layers, top-{rr.top_k} of {rr.num_experts}; median of "
                        f"{args.rounds} interleaved rounds")
    for col in ("phase", "row", "ms", "vs baseline"):
        table.add_column(col, justify="left" if col in ("phase", "row") else "right")
    for phase, rows in phases.items():
        gc.collect()
        med = interleaved(rows, args.rounds, device, after=zero)
        base = med["no RoutingReplay"]
        for name, t in med.items():
            table.add_row(phase, name, f"{t * 1e3:.2f}", f"{t / base:.3f}x")
    console.print(table)
    console.print(router_table(rr, model, args, device))
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {device}, "
                  f"python {platform.python_version()}")


def router_table(rr: RoutingReplay, model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> Table:
    """One router call alone: no hook vs with the replay hook; the fingerprint; the block's set-up."""
    router = model.get_submodule(rr.router_names[0])
    n = args.batch * args.seqlen
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(n, router.weight.shape[1], generator=gen).to(device).requires_grad_(True)
    routes = [torch.stack([torch.stack([torch.randperm(rr.num_experts, generator=gen)[: rr.top_k]
                                        for _ in rr.moe_layers]) for _ in range(args.seqlen - 1)])
              for _ in range(args.batch)]
    full = torch.ones(args.batch, args.seqlen, dtype=torch.long)

    def setup_only() -> None:
        with rr.replay(routes, attention_mask=full):
            pass

    rounds = max(args.rounds, 50)
    with rr.replay(routes, attention_mask=full):
        med = interleaved({"router, no hook": lambda: router.forward(hidden),
                           "router with the replay hook": lambda: router(hidden),
                           "fingerprint alone": lambda: fingerprint(hidden)}, rounds, device, after=rr.clear)
    med.update(interleaved({"replay block set-up (per step)": setup_only}, rounds, device))
    table = Table(title=f"one router call on {n} tokens, inside a replay block (median of {rounds} interleaved "
                        "rounds); the block's set-up is paid once per step, not per router")
    for col in ("row", "ms", "vs router"):
        table.add_column(col, justify="left" if col == "row" else "right")
    base = med["router, no hook"]
    for name, t in med.items():
        table.add_row(name, f"{t * 1e3:.3f}", f"{t / base:.2f}x")
    return table


if __name__ == "__main__":
    main()
