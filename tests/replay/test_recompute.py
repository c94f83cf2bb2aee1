"""Replay under activation recompute (gradient checkpointing, reentrant and not).

The order that defeats a forward/backward FIFO: two micro-batches, each forward in its
own ``replay(...)`` block, then one ``(loss1 + loss2).backward()`` after both blocks
(backward recomputes the later micro-batch first). Gradients must equal those of the
same replay without checkpointing.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from r3store.errors import ReplayError
from r3store.replay import RoutingReplay
from r3store.testing.moe import (
    FAMILIES,
    one_thread,
    random_batch,
    tiny_moe,
    token_logprobs,
)


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


MicroBatch = tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]


class Setup:
    def __init__(self, family: str) -> None:
        self.family = family
        engine, self.trainer = tiny_moe(family, engine_dtype="bfloat16")
        self.trainer.train()
        rr_engine = RoutingReplay(engine)
        self.micro_batches: list[MicroBatch] = []
        for seed in (1, 2):  # same shape: only the contents tell the micro-batches apart
            ids, mask = random_batch(3, 24, seed=seed)
            with torch.no_grad(), rr_engine.capture(attention_mask=mask) as cap:
                engine(ids, attention_mask=mask, use_cache=False)
            self.micro_batches.append((ids, mask, cap.routes))
        self.rr = RoutingReplay(self.trainer)
        self.reference: dict[str, torch.Tensor] = {}

    def loss(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.trainer(ids, attention_mask=mask, use_cache=False).logits
        return -token_logprobs(logits, ids, mask).mean()

    def summed_loss_grads(self, *, replay: bool = True) -> dict[str, torch.Tensor]:
        """Each micro-batch's forward in its own replay block; one backward of the sum after both."""
        losses = []
        for ids, mask, routes in self.micro_batches:
            if replay:
                with self.rr.replay(routes, attention_mask=mask):
                    losses.append(self.loss(ids, mask))
            else:
                losses.append(self.loss(ids, mask))
        (losses[0] + losses[1]).backward()
        self.rr.clear()
        return self.grads()

    def grads(self) -> dict[str, torch.Tensor]:
        out = {n: p.grad.clone() for n, p in self.trainer.named_parameters() if p.grad is not None}
        self.trainer.zero_grad(set_to_none=True)
        return out

    def checkpointing(self, reentrant: bool | None) -> None:
        if reentrant is None:
            self.trainer.activation_checkpointing_disable()
        else:
            self.trainer.activation_checkpointing_enable({"use_reentrant": reentrant})


@pytest.fixture(scope="module", params=FAMILIES)
def setup(request: pytest.FixtureRequest) -> Setup:
    s = Setup(request.param)
    s.reference = s.summed_loss_grads()
    return s


def rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in a)
    den = sum(float((a[k] ** 2).sum()) for k in a)
    return (num / den) ** 0.5


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_summed_loss_recompute_equals_no_checkpointing(setup: Setup, reentrant: bool) -> None:
    reference = setup.reference
    setup.checkpointing(reentrant)
    try:
        grads = setup.summed_loss_grads()
        live = setup.summed_loss_grads(replay=False)
    finally:
        setup.checkpointing(None)
    assert rel_err(reference, grads) < 1e-4
    for name in setup.rr.router_names:
        assert grads[f"{name}.weight"].abs().sum() > 0, name
    # the comparison can fail: live routing gives other gradients
    assert rel_err(reference, live) > 1e-3


def test_recompute_without_kept_routes_raises(setup: Setup) -> None:
    """rr.clear() between forward and backward: the recompute cannot be matched, never silently live."""
    setup.checkpointing(False)
    try:
        ids, mask, routes = setup.micro_batches[0]
        with setup.rr.replay(routes, attention_mask=mask):
            loss = setup.loss(ids, mask)
        setup.rr.clear()
        with pytest.raises(ReplayError, match=r"recompute .* matches none"):
            loss.backward()
    finally:
        setup.rr.clear()
        setup.trainer.zero_grad(set_to_none=True)
        setup.checkpointing(None)
