"""Replay on real transformers model code, per family: engine (bf16) -> store -> trainer (fp32).

For each of the six families: the engine's routes go through ``RouteWriter`` into a
store and come back through ``store.get`` / ``store.assemble`` / ``RouteDataset``; the
trainer replays them with 0 flips on every routed row while its own routing flips, its
log-probs move closer to the engine's, and every MoE layer's router gets a gradient.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import r3store
from r3store.replay import RoutingReplay
from r3store.testing.moe import (
    FAMILIES,
    decision_flips,
    one_thread,
    random_batch,
    tiny_moe,
    token_logprobs,
)

BATCH, SEQLEN = 4, 32


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield



class Rollout:
    """One family's engine and trainer, a padded batch, the engine's routes in a store."""

    def __init__(self, family: str, directory: Path) -> None:
        self.family = family
        self.engine, self.trainer = tiny_moe(family, engine_dtype="bfloat16")
        self.rr_engine, self.rr = RoutingReplay(self.engine), RoutingReplay(self.trainer)
        self.input_ids, self.mask = random_batch(BATCH, SEQLEN, seed=1)
        with torch.no_grad(), self.rr_engine.capture(attention_mask=self.mask) as cap:
            self.engine_logits = self.engine(self.input_ids, attention_mask=self.mask, use_cache=False).logits.float()
        self.captured = cap.routes
        self.url = str(directory / family)
        self.sample_ids = [f"{family}/s{i}" for i in range(BATCH)]
        self.tokens = [self.input_ids[i][self.mask[i].bool()] for i in range(BATCH)]
        with r3store.RouteWriter(self.url, self.rr_engine.spec) as writer:
            for sid, routes, toks in zip(self.sample_ids, cap.routes, self.tokens, strict=True):
                writer.append(sid, routes, tokens=toks)
        self.store = r3store.open_store(self.url)

    def forward(self, **kwargs: Any) -> torch.Tensor:
        return self.trainer(use_cache=False, **kwargs).logits


@pytest.fixture(scope="module", params=FAMILIES)
def rollout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rollout:
    return Rollout(request.param, tmp_path_factory.mktemp("replay"))


def test_spec_matches_store_and_model(rollout: Rollout) -> None:
    rr, config = rollout.rr, rollout.trainer.config
    assert rollout.store.spec == rr.spec == rollout.rr_engine.spec
    rr.check_spec(rollout.store)
    assert rr.spec.num_layers == config.num_hidden_layers == 4
    dense = (0,) if rollout.family == "deepseek_v3" else ()
    assert rr.moe_layers == tuple(i for i in range(4) if i not in dense)
    assert rr.top_k == config.num_experts_per_tok
    assert all(r.shape == (int(m.sum()) - 1, len(rr.moe_layers), rr.top_k)
               for r, m in zip(rollout.captured, rollout.mask, strict=True))


def test_replay_from_store_get(rollout: Rollout) -> None:
    """0 flips on every routed row, live routing flips, log-probs closer, router grads everywhere."""
    rr, mask, ids = rollout.rr, rollout.mask, rollout.input_ids
    routes = [rollout.store.get(sid) for sid in rollout.sample_ids]
    assert all(np.array_equal(a, b) for a, b in zip(routes, rollout.captured, strict=True))
    with torch.no_grad(), rr.capture(attention_mask=mask) as live:
        live_logits = rollout.forward(input_ids=ids, attention_mask=mask)
    rollout.trainer.zero_grad(set_to_none=True)
    with rr.replay(routes, attention_mask=mask), rr.capture(attention_mask=mask) as replayed:
        logits = rollout.forward(input_ids=ids, attention_mask=mask)
        (-token_logprobs(logits, ids, mask).mean()).backward()
    rr.clear()

    flips_live = decision_flips(live.routes, routes)
    assert flips_live[0] > 0, f"{rollout.family}: the fp32 trainer routes exactly like the bf16 engine"
    assert decision_flips(replayed.routes, routes)[0] == 0
    assert all(np.array_equal(a, b) for a, b in zip(replayed.routes, routes, strict=True))  # order too

    engine_lp = token_logprobs(rollout.engine_logits, ids, mask)
    gap_live = (token_logprobs(live_logits, ids, mask) - engine_lp).abs().mean()
    gap_replay = (token_logprobs(logits.detach(), ids, mask) - engine_lp).abs().mean()
    assert gap_replay < gap_live, f"{rollout.family}: replay gap {gap_replay:.3e} vs live {gap_live:.3e}"

    for name in rr.router_names:
        grad = rollout.trainer.get_submodule(name).weight.grad
        assert grad is not None, name
        assert torch.isfinite(grad).all(), name
        assert grad.abs().sum() > 0, name
    rollout.trainer.zero_grad(set_to_none=True)


def test_replay_left_padded(rollout: Rollout) -> None:
    """Routes recorded right-padded replay into the same sequences left-padded."""
    shift = rollout.mask.shape[1] - rollout.mask.sum(1)
    idx = (torch.arange(rollout.mask.shape[1])[None] - shift[:, None]) % rollout.mask.shape[1]
    ids, mask = rollout.input_ids.gather(1, idx), rollout.mask.gather(1, idx)
    assert (mask[:, -1] == 1).all()
    assert (mask[:, 0] == 0).any()
    with torch.no_grad(), rollout.rr.capture(attention_mask=mask) as live:
        rollout.forward(input_ids=ids, attention_mask=mask)
    with torch.no_grad(), rollout.rr.replay(rollout.captured, attention_mask=mask), \
            rollout.rr.capture(attention_mask=mask) as replayed:
        rollout.forward(input_ids=ids, attention_mask=mask)
    rollout.rr.clear()
    assert all(np.array_equal(a, b) for a, b in zip(replayed.routes, rollout.captured, strict=True))
    assert decision_flips(live.routes, rollout.captured)[0] > 0


def _positions(cu_seqlens: torch.Tensor) -> torch.Tensor:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    return torch.cat([torch.arange(n) for n in lengths])[None]


@pytest.mark.parametrize("return_tensors", ["pt", "np"])
def test_replay_packed_batch_from_assemble(rollout: Rollout, return_tensors: str) -> None:
    """A THD batch of ``store.assemble`` replays in a packed forward (position ids restart per sequence)."""
    batch = rollout.store.assemble(rollout.sample_ids, tokens=rollout.tokens, return_tensors=return_tensors)
    cu = torch.as_tensor(batch["cu_seqlens"]).long()
    tokens = torch.as_tensor(batch["tokens"])[None]
    with torch.no_grad(), rollout.rr.replay(batch), rollout.rr.capture(cu_seqlens=cu) as replayed:
        rollout.forward(input_ids=tokens, position_ids=_positions(cu))
    with torch.no_grad(), rollout.rr.capture(cu_seqlens=cu) as live:
        rollout.forward(input_ids=tokens, position_ids=_positions(cu))
    rollout.rr.clear()
    assert all(np.array_equal(a, b) for a, b in zip(replayed.routes, rollout.captured, strict=True))
    assert decision_flips(live.routes, rollout.captured)[0] > 0


def test_replay_bshd_batch_from_assemble(rollout: Rollout) -> None:
    """A BSHD batch (right-padded rows) replays in a padded forward."""
    batch = rollout.store.assemble(rollout.sample_ids, layout="bshd", tokens=rollout.tokens, return_tensors="pt")
    tokens = batch["tokens"]
    mask = (torch.arange(tokens.shape[1])[None] < batch["num_tokens"][:, None]).long()
    with torch.no_grad(), rollout.rr.replay(batch), rollout.rr.capture(attention_mask=mask) as replayed:
        rollout.forward(input_ids=tokens, attention_mask=mask)
    rollout.rr.clear()
    assert all(np.array_equal(a, b) for a, b in zip(replayed.routes, rollout.captured, strict=True))


@pytest.mark.parametrize("rollout", ["qwen3_moe", "deepseek_v3"], indirect=True)  # a softmax and a sigmoid family
def test_replay_batches_from_route_dataset(rollout: Rollout) -> None:
    """Packed batches streamed by ``RouteDataset`` replay with 0 flips, sample by sample."""
    tokens = dict(zip(rollout.sample_ids, rollout.tokens, strict=True))
    captured = dict(zip(rollout.sample_ids, rollout.captured, strict=True))
    ds = r3store.RouteDataset(rollout.store, max_tokens_per_batch=2 * SEQLEN, shuffle=True, seed=3)
    seen = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        packed = torch.cat([tokens[s] for s in batch["sample_ids"]])[None]
        cu = batch["cu_seqlens"].long()
        with torch.no_grad(), rollout.rr.replay(batch), rollout.rr.capture(cu_seqlens=cu) as replayed:
            rollout.forward(input_ids=packed, position_ids=_positions(cu))
        for sid, routes in zip(batch["sample_ids"], replayed.routes, strict=True):
            assert np.array_equal(routes, captured[sid]), sid
        seen += batch["sample_ids"]
    rollout.rr.clear()
    assert sorted(seen) == sorted(rollout.sample_ids)
