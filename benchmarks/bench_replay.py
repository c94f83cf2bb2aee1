"""Cost of routing replay in a training step of a tiny Qwen3-MoE (transformers, random init).

Run from the repository root (r3store installed with the ``hf`` extra)::

    python benchmarks/bench_replay.py                 # 4 x 256 tokens, 30 interleaved rounds
    python benchmarks/bench_replay.py --quick         # 4 x 128 tokens, 10 rounds (a few seconds)
    python benchmarks/bench_replay.py --device cuda --batch 8 --seqlen 2048 --rounds 50
    python benchmarks/bench_replay.py --batch 8 --seqlen 512 --phases fb   # 4K tokens, forward+backward only
    python benchmarks/bench_replay.py --compile --backend aot_eager       # torch.compile: with vs without replay

The model is ``r3store.testing.moe.tiny_moe("qwen3_moe")``: 4 decoder layers, hidden
128, 128 experts, top-8, float32, train mode. The routes replayed are a bf16 copy's own
(captured once, as a rollout engine would record them), for a right-padded batch.

Rows, measured in the same run on the same model (hooks attached and removed between
calls, untimed; the one-time weight check of each router is left out), **interleaved** (every
round runs each row once, in turn) and reported as the median over rounds:

* ``no RoutingReplay``: the model with no hooks: the baseline;
* ``attached, idle``: the same model with a ``RoutingReplay`` attached, outside any block;
* ``replay(routes, attention_mask)``: the whole ``with rr.replay(...)`` block, so the
  per-step set-up (validating the routes, laying them out per token) is included;
* ``replay(own routes)``: the same block replaying the fp32 model's *own* routes, so the
  experts do exactly the baseline's work and the row measures r3store's code alone (the
  bf16 routes move tokens between experts, which changes the experts' work a little).

Phases: ``forward`` (grad enabled, then the graph is dropped) and ``forward+backward``
(``loss.backward()`` of the mean token log-prob, ``zero_grad`` untimed; with replay,
``rr.clear()`` is in the timed region). ``vs baseline`` is the row's median / the
baseline's median (target: within 1.05x). Times are this process's CPU time on CPU
(``time.process_time``: other processes on a shared machine do not inflate it) and wall
time with ``torch.cuda.synchronize`` on CUDA.

**router call**: one MoE router's call alone on ``batch * seqlen`` tokens, without
hooks and inside a replay block (the hook's selection swap, weight gather and input
fingerprint), medians of interleaved rounds, and the fingerprint alone.

**--compile**: ``torch.compile(model, backend=...)`` (default ``aot_eager``: inductor's
C++ build of each graph takes minutes on a loaded CPU), forward+backward of a replayed
step vs the compiled model without hooks, after a warm-up of two steps (the compile
itself is reported apart), and the frames Dynamo compiled in the timed rounds (0: no
recompiles).

Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
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
    """CPU time of this process on CPU (steadier than wall time on a shared machine); wall time on CUDA."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    _sync(device)
    t0 = clock()
    fn()
    _sync(device)
    return clock() - t0


Row = tuple[Callable[[], Any], Callable[[], Any]]
"""(untimed set-up, timed call)."""


def interleaved(rows: dict[str, Row], rounds: int, device: torch.device,
                after: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median seconds of each row over ``rounds`` rounds; each round runs every row once, in turn."""
    for setup, fn in rows.values():  # warm-up
        setup()
        fn()
        after()
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(rounds):
        names = list(rows) if r % 2 == 0 else list(reversed(rows))  # no row always goes first
        for name in names:
            setup, fn = rows[name]
            setup()
            times[name].append(_timed(fn, device))
            after()
    return {name: statistics.median(ts) for name, ts in times.items()}


class Hooks:
    """Attach and detach a RoutingReplay on one model between timed calls (untimed)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.rr: RoutingReplay | None = None

    def attach(self) -> RoutingReplay:
        if self.rr is None:  # the one-time weight check is left out: it runs once per router per run
            self.rr = RoutingReplay(self.model, check_weights=False)
        return self.rr

    def detach(self) -> None:
        if self.rr is not None:
            self.rr.remove()
            self.rr = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="--seqlen 128 --rounds 10")
    parser.add_argument("--phases", default="f,fb", help="f (forward), fb (forward+backward), comma-separated")
    parser.add_argument("--compile", action="store_true", help="time torch.compile with vs without replay instead")
    parser.add_argument("--backend", default="aot_eager", help="torch.compile backend for --compile")
    args = parser.parse_args()
    if args.quick:
        args.seqlen, args.rounds = 128, 10
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    console = Console()

    engine, model = tiny_moe("qwen3_moe", engine_dtype="bfloat16")
    engine, model = engine.to(device), model.to(device).train()
    ids, mask = random_batch(args.batch, args.seqlen, seed=0)
    ids, mask = ids.to(device), mask.to(device)
    with torch.no_grad(), RoutingReplay(engine) as rr_engine, rr_engine.capture(attention_mask=mask) as cap:
        engine(ids, attention_mask=mask, use_cache=False)
    routes = cap.routes
    with torch.no_grad(), RoutingReplay(model) as rr_own, rr_own.capture(attention_mask=mask) as own:
        model(ids, attention_mask=mask, use_cache=False)
    if args.compile:
        console.print(compile_table(model, ids, mask, routes, args, device))
        return
    hooks = Hooks(model)

    def loss() -> torch.Tensor:
        return -token_logprobs(model(ids, attention_mask=mask, use_cache=False).logits, ids, mask).mean()

    def replayed(backward: bool, which: list[Any] = routes) -> None:
        rr = hooks.attach()
        with rr.replay(which, attention_mask=mask):
            out = loss()
            if backward:
                out.backward()
        rr.clear()

    def zero() -> None:
        model.zero_grad(set_to_none=True)

    def rows(backward: bool) -> dict[str, Row]:
        def plain() -> None:
            out = loss()
            if backward:
                out.backward()

        return {"no RoutingReplay": (hooks.detach, plain), "attached, idle": (hooks.attach, plain),
                "replay(routes, attention_mask)": (hooks.attach, lambda: replayed(backward)),
                "replay(own routes)": (hooks.attach, lambda: replayed(backward, own.routes))}

    tokens = int(mask.sum())
    table = Table(title=f"tiny Qwen3-MoE training step: {args.batch} x {args.seqlen} tokens ({tokens} real), "
                        f"4 MoE layers, top-8 of 128; median of {args.rounds} interleaved rounds")
    for col in ("phase", "row", "ms", "vs baseline"):
        table.add_column(col, justify="left" if col in ("phase", "row") else "right")
    phases = [p for p in (("forward", False), ("forward+backward", True))
              if {"forward": "f", "forward+backward": "fb"}[p[0]] in args.phases.split(",")]
    for phase, backward in phases:
        gc.collect()
        med = interleaved(rows(backward), args.rounds, device, after=zero)
        base = med["no RoutingReplay"]
        for name, t in med.items():
            table.add_row(phase, name, f"{t * 1e3:.2f}", f"{t / base:.3f}x")
    console.print(table)
    console.print(router_table(hooks.attach(), model, args, device))
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {device}, "
                  f"python {platform.python_version()}")


def compile_table(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, routes: list[Any],
                  args: argparse.Namespace, device: torch.device) -> Table:
    """Compiled forward+backward: without hooks vs with ``rr.replay`` (two compiled copies, same weights)."""
    import copy

    from torch._dynamo.testing import CompileCounterWithBackend

    plain_model = copy.deepcopy(model)
    rr = RoutingReplay(model, check_weights=False)
    counters = {"compiled, no RoutingReplay": CompileCounterWithBackend(args.backend),
                "compiled, replay(routes, attention_mask)": CompileCounterWithBackend(args.backend)}
    compiled = {"compiled, no RoutingReplay": torch.compile(plain_model, backend=counters[
        "compiled, no RoutingReplay"]), "compiled, replay(routes, attention_mask)": torch.compile(
        model, backend=counters["compiled, replay(routes, attention_mask)"])}

    def step(name: str) -> None:
        fn = compiled[name]
        if "replay" in name:
            with rr.replay(routes, attention_mask=mask):
                out = -token_logprobs(fn(ids, attention_mask=mask, use_cache=False).logits, ids, mask).mean()
                out.backward()
            rr.clear()
        else:
            (-token_logprobs(fn(ids, attention_mask=mask, use_cache=False).logits, ids, mask).mean()).backward()

    warm = {}
    for name in compiled:  # warm-up: compile (timed apart) and one more step
        t0 = time.perf_counter()
        step(name)
        step(name)
        warm[name] = time.perf_counter() - t0
    before = {name: c.frame_count for name, c in counters.items()}

    def zero() -> None:
        model.zero_grad(set_to_none=True)
        plain_model.zero_grad(set_to_none=True)

    med = interleaved({name: (_nothing, lambda name=name: step(name)) for name in compiled}, args.rounds, device,
                      after=zero)
    table = Table(title=f"torch.compile (backend {args.backend}), forward+backward, {args.batch} x {args.seqlen} "
                        f"tokens; median of {args.rounds} interleaved rounds after warm-up")
    for col in ("row", "ms", "vs baseline", "warm-up s (compile)", "frames compiled in the rounds"):
        table.add_column(col, justify="left" if col == "row" else "right")
    base = med["compiled, no RoutingReplay"]
    for name, t in med.items():
        table.add_row(name, f"{t * 1e3:.2f}", f"{t / base:.3f}x", f"{warm[name]:.1f}",
                      str(counters[name].frame_count - before[name]))
    return table


def _nothing() -> None:
    return None


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
        rr._make_plan(routes, full, None)  # what entering a replay block does: check and lay out the routes

    rounds = max(args.rounds, 50)
    with rr.replay(routes, attention_mask=full):
        med = interleaved({"router, no hook": (_nothing, lambda: router.forward(hidden)),
                           "router with the replay hook": (_nothing, lambda: router(hidden)),
                           "fingerprint alone": (_nothing, lambda: fingerprint(hidden))},
                          rounds, device, after=rr.clear)
        with torch.no_grad():  # every router must run in a replay block (else it raises): one whole forward
            model(torch.randint(3, 512, (args.batch, args.seqlen), device=device), use_cache=False)
    med.update(interleaved({"replay block set-up (per step)": (_nothing, setup_only)}, rounds, device))
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
