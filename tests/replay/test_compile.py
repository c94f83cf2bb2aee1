"""Replay under ``torch.compile(model)``: no recompiles from grad mode or hook state, outputs equal eager.

Backend ``aot_eager`` (Dynamo + AOTAutograd, eager kernels): the recompile rules are
Dynamo's, the same as inductor's, and inductor's C++ compile of every graph takes
minutes on a loaded CPU. Frames compiled are counted by ``CompileCounterWithBackend``.
Each step is the PPO/GRPO pattern: a replayed forward under ``no_grad`` ("old
log-probs"), then a replayed forward + backward, ``rr.clear()``; steps 3 and 4 use a
new sequence length (static shapes: ``dynamic=False``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from r3store.replay import RoutingReplay
from r3store.testing.moe import decision_flips, one_thread, random_batch, tiny_moe, token_logprobs


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.mark.slow
def test_a_compiled_replayed_step_recompiles_only_for_a_new_shape_and_equals_eager() -> None:
    torch._dynamo.reset()
    engine, trainer = tiny_moe("mixtral", engine_dtype="bfloat16", num_hidden_layers=2)
    trainer.train()
    rr_engine, rr = RoutingReplay(engine), RoutingReplay(trainer)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(trainer, backend=counter, dynamic=False)
    frames = []
    for step in range(5):
        ids, mask = random_batch(2, 16 if step < 3 else 24, seed=step)
        with torch.no_grad(), rr_engine.capture(attention_mask=mask) as cap:
            engine(ids, attention_mask=mask, use_cache=False)
        with torch.no_grad(), rr.replay(cap.routes, attention_mask=mask):
            old = compiled(ids, attention_mask=mask, use_cache=False).logits
            eager = trainer(ids, attention_mask=mask, use_cache=False).logits
        torch.testing.assert_close(old, eager, rtol=1e-5, atol=1e-5)
        with rr.replay(cap.routes, attention_mask=mask), rr.capture(attention_mask=mask) as replayed:
            logits = compiled(ids, attention_mask=mask, use_cache=False).logits
        token_logprobs(logits, ids, mask).mean().backward()
        rr.clear()
        assert decision_flips(replayed.routes, cap.routes)[0] == 0, f"step {step}"
        grads = [trainer.get_submodule(name).weight.grad for name in rr.router_names]
        assert all(g is not None and bool(g.abs().sum() > 0) for g in grads), "router gradients under compile"
        trainer.zero_grad(set_to_none=True)
        frames.append(counter.frame_count)
    warm = frames[0]
    assert 1 <= warm <= 2, frames  # one graph per grad mode (no_grad and grad), no graph break in the model
    assert frames[1] == frames[2] == warm, f"recompiled after warm-up: {frames}"
    assert frames[3] - warm <= warm, f"more than one recompile per grad mode for a new shape: {frames}"
    assert frames[4] == frames[3], f"recompiled after the new shape's warm-up: {frames}"


def test_the_compiled_path_replays_like_the_eager_hook() -> None:
    """The op behind the compiled hook, traced with ``backend='eager'`` (cheap): same routes, same logits."""
    torch._dynamo.reset()
    engine, trainer = tiny_moe("qwen3_moe", engine_dtype="bfloat16", num_hidden_layers=2)
    rr_engine, rr = RoutingReplay(engine), RoutingReplay(trainer)
    ids, mask = random_batch(2, 12, seed=0, padding="left")
    with torch.no_grad(), rr_engine.capture(attention_mask=mask) as cap:
        engine(ids, attention_mask=mask, use_cache=False)
    compiled = torch.compile(trainer, backend="eager")
    with torch.no_grad(), rr.replay(cap.routes, attention_mask=mask), rr.capture(attention_mask=mask) as got:
        out = compiled(ids, attention_mask=mask, use_cache=False).logits
    with torch.no_grad(), rr.replay(cap.routes, attention_mask=mask):
        want = trainer(ids, attention_mask=mask, use_cache=False).logits
    assert decision_flips(got.routes, cap.routes)[0] == 0
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # outside any block: live routing, as without hooks
        live = compiled(ids, attention_mask=mask, use_cache=False).logits
    rr.remove()
    with torch.no_grad():
        torch.testing.assert_close(live, trainer(ids, attention_mask=mask, use_cache=False).logits)
