"""Capture splits a forward into sequences by the model input's (batch, seq), never by guesswork.

Without ``attention_mask`` every position of a ``(B, T)`` input is a token: the capture
holds ``B`` arrays of ``T - 1`` rows, each equal to capturing that row alone (real
transformers model code from a config, random init). Layouts that do not fit the
input's shape raise instead of cutting sequences at the wrong positions.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from r3store.errors import ReplayError
from r3store.replay import RouterSpec, RoutingReplay
from r3store.testing.moe import one_thread, random_batch, tiny_moe


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return tiny_moe("qwen3_moe")


def _alone(rr: RoutingReplay, model: nn.Module, ids: torch.Tensor) -> list[np.ndarray]:
    out = []
    for row in ids:
        with torch.no_grad(), rr.capture() as cap:
            model(row[None], use_cache=False)
        assert len(cap.routes) == 1
        out.append(cap.routes[0])
    return out


def test_unmasked_batch_is_one_sequence_per_row(model: nn.Module) -> None:
    rr = RoutingReplay(model)
    try:
        ids, _ = random_batch(3, 10, seed=4)
        ids = ids.clamp(min=3)  # every position a real token
        with torch.no_grad(), rr.capture() as cap:
            model(ids, use_cache=False)
        assert [r.shape for r in cap.routes] == [(9, len(rr.moe_layers), rr.top_k)] * 3
        assert cap.flat.shape[0] == 30
        for got, want in zip(cap.routes, _alone(rr, model, ids), strict=True):
            np.testing.assert_array_equal(got, want)
        # the same from inputs_embeds, and with the explicit all-ones mask
        with torch.no_grad(), rr.capture() as emb:
            model(inputs_embeds=model.get_input_embeddings()(ids), use_cache=False)
        ones = torch.ones_like(ids)
        with torch.no_grad(), rr.capture(attention_mask=ones) as masked:
            model(ids, attention_mask=ones, use_cache=False)
        for a, b, c in zip(cap.routes, emb.routes, masked.routes, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)
    finally:
        rr.remove()


def test_layout_that_does_not_fit_the_input_raises(model: nn.Module) -> None:
    rr = RoutingReplay(model)
    try:
        ids, _ = random_batch(2, 12, seed=5)
        ids = ids.clamp(min=3)
        # a transposed mask has as many positions, but cuts the sequences elsewhere
        with pytest.raises(ReplayError, match=r"input has shape \(batch, seq\) = \(2, 12\); the captured "
                                              r"sequences are laid out for \(12, 2\) by the attention_mask of "
                                              r"shape \(12, 2\) \(transposed"), \
                torch.no_grad(), rr.capture(attention_mask=torch.ones(12, 2, dtype=torch.long)):
            model(ids, use_cache=False)
        # packed boundaries on a two-row input: the sequences must each fill one row
        with pytest.raises(ReplayError, match=r"as 2 sequences of \[5, 19\] tokens back to back: on a batch of "
                                              r"several rows each sequence must fill one row of 12 tokens"), \
                torch.no_grad(), rr.capture(cu_seqlens=[0, 5, 24]):
            model(ids, use_cache=False)
        with torch.no_grad(), rr.capture(cu_seqlens=[0, 12, 24]) as cap:  # one row each: fine
            model(ids, use_cache=False)
        for got, want in zip(cap.routes, _alone(rr, model, ids), strict=True):
            np.testing.assert_array_equal(got, want)
        # a packed row keeps its boundaries
        with torch.no_grad(), rr.capture(cu_seqlens=[0, 5, 24]) as packed:
            model(ids.reshape(1, -1), use_cache=False)
        assert [len(r) for r in packed.routes] == [4, 18]
    finally:
        rr.remove()


class FlatRouter(nn.Module):
    """A router outside transformers on flat (tokens, hidden) input, returning (logits, weights, ids)."""

    def __init__(self, hidden: int = 8, num_experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, num_experts, bias=False)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.proj(x)
        top, ids = logits.topk(self.top_k, dim=-1)
        return logits, torch.softmax(top, dim=-1), ids


class FlatMoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FlatRouter() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for router in self.layers:
            _, w, _ = router(x)
            x = x + w.sum(dim=-1, keepdim=True)
        return x


def _flat_weights(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.gather(1, ids), dim=-1)


def test_unknown_batch_shape_asks_for_a_layout() -> None:
    torch.manual_seed(0)
    toy = FlatMoE()
    rr = RoutingReplay(toy, routers={FlatRouter: RouterSpec(_flat_weights, family="flat", num_experts=4)})
    try:
        x = torch.randn(10, 8)  # ten tokens of one or several sequences: nothing tells
        with pytest.raises(ReplayError, match=r"routers saw 10 token positions and the batch shape of the forward is "
                                              r"unknown .* pass attention_mask"), \
                torch.no_grad(), rr.capture():
            toy(x)
        with torch.no_grad(), rr.capture(cu_seqlens=[0, 4, 10]) as cap:
            toy(x)
        assert [len(r) for r in cap.routes] == [3, 5]
    finally:
        rr.remove()
