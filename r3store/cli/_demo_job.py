"""The main job on the bundled real trace: parallel rollout writers -> store -> DataLoader."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from r3store import RouteWriter, encode_sglang, open_store
from r3store.audit import summarize
from r3store.data import flame_samples, flame_spec

__all__ = ["run_demo"]


def _rollout_worker(url: str, worker: int, num_workers: int) -> list[str]:
    """One rollout worker process: even samples via ``append``, odd via SGLang base64 payloads."""
    spec = flame_spec()
    samples = flame_samples()
    written = []
    with RouteWriter(url, spec) as writer:
        for i, (sample_id, routes) in enumerate(samples.items()):
            if i % num_workers != worker:
                continue
            meta = {"worker": worker, "sequence": i}
            if i % 2 == 0:
                writer.append(sample_id, routes, num_tokens=len(routes) + 1, metadata=meta)
            else:
                full = np.zeros((len(routes), spec.num_layers, spec.top_k), dtype=np.int32)
                full[:, list(spec.moe_layers)] = routes
                meta_info = {"routed_experts": encode_sglang(full), "prompt_tokens": 16,
                             "completion_tokens": len(routes) + 1 - 16}
                writer.append_sglang(sample_id, meta_info, num_tokens=len(routes) + 1, metadata=meta)
            written.append(sample_id)
    return written


def _check_batch(batch: dict[str, Any], source: dict[str, np.ndarray], num_experts: int) -> int:
    """Verify one streamed batch against the source trace; return the tokens in it."""
    cu = batch["cu_seqlens"].numpy()
    routes = batch["routes"].numpy()
    mask = batch["replay_mask"].numpy()
    for j, sample_id in enumerate(batch["sample_ids"]):
        seg, seg_mask = routes[cu[j] : cu[j + 1]], mask[cu[j] : cu[j + 1]]
        want = source[sample_id]
        if not (np.array_equal(seg[:-1], want) and seg_mask[:-1].all() and not seg_mask[-1]):
            raise AssertionError(f"sample {sample_id!r}: streamed routes differ from the source trace")
        pad = seg[-1]
        if not ((pad >= 0) & (pad < num_experts)).all():
            raise AssertionError(f"sample {sample_id!r}: pad row ids out of range")
    return int(cu[len(batch["sample_ids"])])


def run_demo(directory: str | Path, *, num_writers: int = 4, loader_workers: int = 2,
             max_tokens_per_batch: int = 512, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the FLAME trace with parallel writer processes, stream it back, verify every route.

    Returns
    -------
    dict
        ``write_s``, ``read_s``, ``samples``, ``tokens``, ``batches``, ``tokens_per_s``,
        ``expert_ids_per_s``, ``summary`` (see :func:`r3store.audit.summarize`).
    """
    from torch.utils.data import DataLoader

    from r3store.dataset import RouteDataset

    url = str(directory)
    source = flame_samples()
    log(f"writing {len(source)} samples of 64 tokens with {num_writers} rollout-worker processes -> {url}")
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(num_writers) as pool:
        written = pool.starmap(_rollout_worker, [(url, w, num_writers) for w in range(num_writers)])
    write_s = time.perf_counter() - t0
    if sorted(s for part in written for s in part) != sorted(source):
        raise AssertionError("the writers did not write every sample exactly once")
    store = open_store(url)
    ds = RouteDataset(store, max_tokens_per_batch=max_tokens_per_batch, shuffle=True, seed=0)
    log(f"streaming {len(ds)} packed THD batches through DataLoader(num_workers={loader_workers})")
    t0 = time.perf_counter()
    seen, tokens, batches = [], 0, 0
    for batch in DataLoader(ds, batch_size=None, num_workers=loader_workers):
        tokens += _check_batch(batch, source, store.spec.num_experts)
        seen += batch["sample_ids"]
        batches += 1
    read_s = time.perf_counter() - t0
    if sorted(seen) != sorted(source):
        raise AssertionError("the DataLoader did not yield every sample exactly once")
    ids = tokens * store.spec.num_moe_layers * store.spec.top_k
    return {"write_s": write_s, "read_s": read_s, "samples": len(seen), "tokens": tokens, "batches": batches,
            "tokens_per_s": tokens / read_s, "expert_ids_per_s": ids / read_s, "summary": summarize(store)}
