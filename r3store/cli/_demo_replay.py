"""The end of ``r3store demo``: R3 on a tiny Qwen3-MoE, rollout (bf16) -> store -> trainer (fp32).

A randomly initialised 4-layer Qwen3-MoE (128 experts, top-8) in bfloat16 plays the
rollout engine: it samples completions of a left-padded batch of random prompts with
``model.generate()`` (KV cache on), and the routes of every decode step are captured by
``RoutingReplay.capture_generate`` and written with ``RouteWriter``, with the sampled
tokens' log-probs. The same weights in float32 play the trainer: ``RouteDataset``
streams packed batches, and each batch runs once with its own (live) routing and once
with ``RoutingReplay.replay(batch)`` (forward and backward). The trainer's routes of
both runs are written to two more stores and compared with the engine's by
:func:`r3store.audit.diff`, the flip rate ``r3store diff`` prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["render_replay_demo", "replay_demo_cli", "run_replay_demo"]

HINT = "replay demo skipped: it needs PyTorch and transformers: pip install 'r3store[hf]'"


def run_replay_demo(directory: str | Path, *, num_samples: int = 8, seqlen: int = 48, seed: int = 0,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the replay loop; write three stores under ``directory``.

    Returns
    -------
    dict
        ``samples``, ``tokens`` (route rows compared), ``batches``, ``moe_layers``,
        ``num_experts``, ``top_k``; ``live`` and ``replay``: ``decision_flip_rate`` and
        ``token_flip_rate`` against the rollout (from :func:`r3store.audit.diff`) and
        ``logprob_gap`` (mean absolute difference of the trainer's log-probs of the
        sampled completion tokens from the rollout's); ``router_grads_ok`` (finite and non-zero in every MoE layer);
        ``seconds``; ``stores`` (the three paths).

    Raises
    ------
    ImportError
        torch or transformers is missing.
    """
    import torch

    from r3store.testing.moe import one_thread, random_batch, tiny_moe, token_logprobs

    with one_thread():  # a tiny model: OpenMP threads only compete for the cores
        return _run(directory, num_samples, seqlen, seed, log, torch, random_batch, tiny_moe, token_logprobs)


def _run(directory: str | Path, num_samples: int, seqlen: int, seed: int, log: Callable[[str], None],
         torch: Any, random_batch: Any, tiny_moe: Any, token_logprobs: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    root = Path(directory)
    paths = {name: root / name for name in ("engine", "trainer-live", "trainer-replay")}
    engine, trainer = tiny_moe("qwen3_moe", engine_dtype="bfloat16", seed=seed)
    ids, mask = random_batch(num_samples, seqlen // 2, seed=seed, padding="left")
    tokens, rollout_logprobs = _rollout(engine, ids, mask, seqlen - seqlen // 2, paths["engine"], seed)
    lengths = [len(t) for t in tokens.values()]
    log(f"rollout: tiny Qwen3-MoE in bfloat16 (4 layers, 128 experts, top-8, random init) sampled {num_samples} "
        f"completions with generate() (KV cache; sequences of {min(lengths)}-{max(lengths)} tokens); routes of "
        f"every decode step and the sampled tokens' log-probs -> {paths['engine']}")
    result = _train(trainer, paths, tokens, rollout_logprobs, token_logprobs, torch)
    log(f"trainer: the same weights in float32; RouteDataset streamed {result['batches']} packed batches, each run "
        "without and with RoutingReplay.replay(batch) (forward and backward)")
    return {**result, **_diffs(paths), "seconds": time.perf_counter() - t0,
            "stores": {k: str(v) for k, v in paths.items()}}


def _rollout(engine: Any, ids: Any, mask: Any, new_tokens: int, url: Path,
             seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from r3store import RouteWriter
    from r3store.replay import RoutingReplay

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.no_grad(), RoutingReplay(engine) as rr, rr.capture_generate() as cap:
            out = engine.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=new_tokens,
                                  pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    cap.check(out)
    width = ids.shape[1]
    step_logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # (rows, steps, vocab)
    tokens, logprobs = {}, {}
    with RouteWriter(str(url), rr.spec) as writer:
        for i, routes in enumerate(cap.routes):
            sid = f"rollout-{i:02d}"
            new = cap.lengths[i] - cap.prompt_lengths[i]  # generated tokens, up to and with the first EOS
            completion = out.sequences[i, width:width + new]
            tokens[sid] = torch.cat([ids[i][mask[i].bool()], completion])
            logprobs[sid] = step_logprobs[i, :new].gather(-1, completion[:, None])[:, 0]
            writer.append(sid, routes, tokens=tokens[sid], metadata={"sample": i, "completion_tokens": new})
    return tokens, logprobs


def _train(trainer: Any, paths: dict[str, Path], tokens: dict[str, Any], rollout_logprobs: dict[str, Any],
           token_logprobs: Any, torch: Any) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from r3store import RouteWriter, open_store
    from r3store.dataset import RouteDataset
    from r3store.replay import RoutingReplay

    store = open_store(str(paths["engine"]))
    rr = RoutingReplay(trainer)
    rr.check_spec(store)
    gaps: dict[str, list[Any]] = {"live": [], "replay": []}
    batches = 0
    ds = RouteDataset(store, max_tokens_per_batch=128, shuffle=True, seed=0)
    with RouteWriter(str(paths["trainer-live"]), rr.spec) as live_w, \
            RouteWriter(str(paths["trainer-replay"]), rr.spec) as replay_w:
        for batch in DataLoader(ds, batch_size=None):
            sids = batch["sample_ids"]
            cu = batch["cu_seqlens"].long()
            packed = torch.cat([tokens[s] for s in sids])[None]
            pos = torch.cat([torch.arange(len(tokens[s])) for s in sids])[None]
            with torch.no_grad(), rr.capture(cu_seqlens=cu) as live:
                live_logits = trainer(packed, position_ids=pos, use_cache=False).logits
            with rr.replay(batch), rr.capture(cu_seqlens=cu) as replayed:
                logits = trainer(packed, position_ids=pos, use_cache=False).logits
                per_sample = [_sample_logprobs(logits, packed, cu, j, token_logprobs) for j in range(len(sids))]
                (-torch.cat(per_sample).mean()).backward()
            rr.clear()
            for j, sid in enumerate(sids):
                live_w.append(sid, live.routes[j], tokens=tokens[sid])
                replay_w.append(sid, replayed.routes[j], tokens=tokens[sid])
                ref = rollout_logprobs[sid]  # the sampled completion tokens: the last len(ref) of the sequence
                live_lp = _sample_logprobs(live_logits, packed, cu, j, token_logprobs)
                gaps["live"].append((live_lp[-len(ref):] - ref).abs())
                gaps["replay"].append((per_sample[j].detach()[-len(ref):] - ref).abs())
            batches += 1
    grads = [trainer.get_submodule(name).weight.grad for name in rr.router_names]
    ok = all(g is not None and bool(torch.isfinite(g).all()) and float(g.abs().sum()) > 0 for g in grads)
    rr.remove()
    return {"samples": len(tokens), "batches": batches, "moe_layers": list(rr.moe_layers),
            "num_experts": rr.num_experts, "top_k": rr.top_k, "router_grads_ok": ok,
            "logprob_gap": {k: float(torch.cat(v).mean()) for k, v in gaps.items()}}


def _sample_logprobs(logits: Any, packed: Any, cu: Any, j: int, token_logprobs: Any) -> Any:
    lo, hi = int(cu[j]), int(cu[j + 1])
    ids = packed[:, lo:hi]
    return token_logprobs(logits[:, lo:hi], ids, ids.new_ones(ids.shape))


def _diffs(paths: dict[str, Path]) -> dict[str, Any]:
    from r3store import open_store
    from r3store.audit import diff

    engine = open_store(str(paths["engine"]))
    out: dict[str, Any] = {}
    for name in ("live", "replay"):
        d = diff(engine, open_store(str(paths[f"trainer-{name}"])))
        out[name] = {"decision_flip_rate": d["decision_flip_rate"], "token_flip_rate": d["token_flip_rate"],
                     "differing_decisions": d["differing_decisions"], "decisions": d["decisions"]}
        out["tokens"] = d["tokens"]
    return out


def render_replay_demo(report: dict[str, Any], console: Any) -> None:
    """Print the demo's result as a table (rich console)."""
    from rich.table import Table

    table = Table(title="R3: fp32 trainer vs bf16 rollout of the same weights")
    for col in ("trainer", "decisions flipped", "tokens flipped", "log-prob gap"):
        table.add_column(col, justify="left" if col == "trainer" else "right")
    for name, label in (("live", "without replay"), ("replay", "with replay")):
        r = report[name]
        table.add_row(label, f"{r['decision_flip_rate']:.2%} ({r['differing_decisions']:,}/{r['decisions']:,})",
                      f"{r['token_flip_rate']:.1%}", f"{report['logprob_gap'][name]:.4f}")
    console.print(table)
    from rich.text import Text

    grads = ("finite and non-zero", "") if report["router_grads_ok"] else ("missing or not finite", "bold red")
    console.print(Text.assemble("router gradients under replay: ", grads,
                                f" in all {len(report['moe_layers'])} MoE layers "
                                f"(replay demo {report['seconds']:.1f} s)"), highlight=False, soft_wrap=True)


def replay_demo_cli(directory: Path | None, console: Any) -> dict[str, Any] | None:
    """Run and print the replay demo into ``directory / "replay-demo"`` (a temporary folder when None).

    Prints a one-line hint and returns None when torch or transformers is missing.
    """
    import shutil
    import tempfile

    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        console.print(HINT, markup=False, highlight=False)
        return None
    target = directory / "replay-demo" if directory is not None else Path(tempfile.mkdtemp(prefix="r3store-replay-"))
    try:
        report = run_replay_demo(target, log=lambda line: console.print(line, markup=False, highlight=False,
                                                                     soft_wrap=True))
    finally:
        if directory is None:
            shutil.rmtree(target, ignore_errors=True)
    render_replay_demo(report, console)
    return report
