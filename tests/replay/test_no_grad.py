"""A forward under ``torch.no_grad()`` never takes part in recompute matching, in train mode too.

The PPO/GRPO pattern: old/reference log-probs under ``no_grad`` with the module still in
train mode, then the replayed policy forward + backward on the same tokens, with
gradient checkpointing on and ``rr.clear()`` after every step. From step 2 on the no_grad
call used to be kept (a replay had armed the keeping) and its recompute twin
matched two forward calls with bitwise-equal inputs and different routes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from r3store.replay import RoutingReplay
from r3store.testing.moe import one_thread, random_batch, tiny_moe, token_logprobs


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


def _steps(reentrant: bool, *, no_grad_forward: str | None) -> list[dict[str, torch.Tensor]]:
    engine, trainer = tiny_moe("mixtral", engine_dtype="bfloat16")
    trainer.train()
    trainer.activation_checkpointing_enable({"use_reentrant": reentrant})
    rr_engine, rr = RoutingReplay(engine), RoutingReplay(trainer)
    grads = []
    for step in range(3):
        ids, mask = random_batch(3, 16, seed=step)
        with torch.no_grad(), rr_engine.capture(attention_mask=mask) as cap:
            engine(ids, attention_mask=mask, use_cache=False)
        if no_grad_forward is not None:
            guard = torch.inference_mode() if no_grad_forward == "inference_mode" else torch.no_grad()
            with guard, rr.replay(cap.routes, attention_mask=mask):  # "old log-probs", train mode
                old = token_logprobs(trainer(ids, attention_mask=mask, use_cache=False).logits, ids, mask)
            assert not old.requires_grad
        with rr.replay(cap.routes, attention_mask=mask):
            logits = trainer(ids, attention_mask=mask, use_cache=False).logits
        (-token_logprobs(logits, ids, mask).mean()).backward()
        rr.clear()
        grads.append({n: p.grad.clone() for n, p in trainer.named_parameters() if p.grad is not None})
        trainer.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("guard", ["no_grad", "inference_mode"])
def test_a_no_grad_forward_before_the_replayed_step_leaves_its_gradients_unchanged(reentrant: bool,
                                                                                    guard: str) -> None:
    with_it = _steps(reentrant, no_grad_forward=guard)
    without = _steps(reentrant, no_grad_forward=None)
    assert len(with_it) == 3
    for step, (a, b) in enumerate(zip(with_it, without, strict=True)):
        assert a.keys() == b.keys()
        assert len(a) > 0
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=f"step {step}, {name}")
