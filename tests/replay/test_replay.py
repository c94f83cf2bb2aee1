"""RoutingReplay's surface: errors, idle hooks, remove(), custom routers, the family table."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import r3store
from r3store.errors import R3StoreError, ReplayError
from r3store.replay import (
    ROUTER_FAMILIES,
    RouterSpec,
    RoutingReplay,
    sigmoid_weights,
    softmax_renorm_weights,
)
from r3store.testing.moe import one_thread, pack, random_batch, tiny_moe


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def model() -> nn.Module:
    return tiny_moe("deepseek_v3")  # decoder layer 0 is dense: MoE layers 1..3


@pytest.fixture(scope="module")
def batch(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """A padded batch and the model's own routes for it."""
    ids, mask = random_batch(3, 16, seed=2)
    rr = RoutingReplay(model)
    with torch.no_grad(), rr.capture(attention_mask=mask) as cap:
        model(ids, attention_mask=mask, use_cache=False)
    rr.remove()
    return ids, mask, cap.routes


def logits(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, attention_mask=mask, use_cache=False).logits


def test_imports_stay_light() -> None:
    code = ("import sys, r3store; assert 'torch' not in sys.modules and 'transformers' not in sys.modules; "
            "import r3store.replay; assert 'transformers' not in sys.modules, 'replay imports transformers'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_surface(model: nn.Module) -> None:
    rr = RoutingReplay(model)
    try:
        assert rr.moe_layers == (1, 2, 3)
        assert (rr.num_experts, rr.top_k) == (64, 8)
        assert rr.spec == r3store.ModelSpec(num_layers=4, num_experts=64, top_k=8, moe_layers=[1, 2, 3])
        assert rr.router_names == ("model.layers.1.mlp.gate", "model.layers.2.mlp.gate", "model.layers.3.mlp.gate")
        assert "deepseek_v3" in repr(rr)
        assert "[1, 2, 3]" in repr(rr)
        assert issubclass(ReplayError, R3StoreError)
        assert issubclass(ReplayError, ValueError)
    finally:
        rr.remove()


def test_idle_hooks_and_remove_restore_exact_behaviour(model: nn.Module, batch: Any) -> None:
    ids, mask, routes = batch
    routers = [model.get_submodule(f"model.layers.{i}.mlp.gate") for i in (1, 2, 3)]
    hooks_before = [dict(r._forward_hooks) for r in routers]
    before = logits(model, ids, mask)
    rr = RoutingReplay(model)
    assert torch.equal(logits(model, ids, mask), before)  # attached, idle
    with rr.replay(routes, attention_mask=mask):
        replayed = logits(model, ids, mask)
    assert torch.equal(replayed, before)  # the model's own routes: same result
    other = [np.roll(r, 1, axis=-2) for r in routes]  # layer axis rotated: other experts
    with rr.replay(other, attention_mask=mask):
        assert not torch.equal(logits(model, ids, mask), before)
    assert torch.equal(logits(model, ids, mask), before)  # idle again after a block (nothing kept in eval)
    rr.remove()
    rr.remove()  # idempotent
    assert [dict(r._forward_hooks) for r in routers] == hooks_before
    assert torch.equal(logits(model, ids, mask), before)
    with pytest.raises(ReplayError, match="removed"):
        rr.replay(routes, attention_mask=mask).__enter__()


def _bad(routes: list[np.ndarray], seq: int, fn: Any) -> list[np.ndarray]:
    out = [r.copy() for r in routes]
    out[seq] = fn(out[seq])
    return out


def _set(r: np.ndarray, index: Any, value: int) -> np.ndarray:
    r[index] = value
    return r


@pytest.mark.parametrize(("change", "match"), [
    (lambda r: r[:, :2], r"routes\[1\] has shape .*expected \(rows, 3, 8\)"),
    (lambda r: r[..., :4], r"routes\[1\] has shape"),
    (lambda r: r[:-1], r"routes\[1\] has \d+ rows; .* num_tokens - 1"),
    (lambda r: np.concatenate([r, r[:1]]), r"routes\[1\] has \d+ rows"),
    (lambda r: _set(r, (2, 0, 3), 64), r"routes\[1\] row 2, decoder layer 1: expert id 64 outside \[0, 64\)"),
    (lambda r: _set(r, (0, 2, 0), -1), r"routes\[1\] row 0, decoder layer 3: expert id -1 outside"),
    (lambda r: _set(r, (4, 1, slice(0, 2)), 7), r"routes\[1\] row 4, decoder layer 2: expert id repeated"),
    (lambda r: r.astype(np.float32), r"must hold integers"),
])
def test_bad_routes_raise(model: nn.Module, batch: Any, change: Any, match: str) -> None:
    _, mask, routes = batch
    rr = RoutingReplay(model)
    try:
        with pytest.raises(ReplayError, match=match):
            rr.replay(_bad(routes, 1, change), attention_mask=mask).__enter__()
        assert rr._plan is None  # nothing half set up
    finally:
        rr.remove()


def test_layout_errors(model: nn.Module, batch: Any) -> None:
    ids, mask, routes = batch
    rr = RoutingReplay(model)
    try:
        with pytest.raises(ReplayError, match="2 route arrays for 3 sequences"):
            rr.replay(routes[:2], attention_mask=mask).__enter__()
        with pytest.raises(ReplayError, match="not both"):
            rr.replay(routes, attention_mask=mask, cu_seqlens=[0, 3]).__enter__()
        with pytest.raises(ReplayError, match=r"one .* array per sequence"):
            rr.replay(routes[0], attention_mask=mask).__enter__()
        # routes laid out for another batch than the forward sees
        with pytest.raises(ReplayError, match=r"input has shape \(batch, seq\) = \(3, 16\); the routes are laid out "
                                              r"by the cu_seqlens as 3 sequences of \[16, 14, 16\] tokens"), \
                rr.replay(routes, cu_seqlens=pack(ids, mask)["cu_seqlens"]):
            logits(model, ids, mask)
        with pytest.raises(ReplayError,
                           match=r"router sees 48 token positions; the routes are laid out for 46 \(cu_seqlens\)"), \
                rr.replay(routes, cu_seqlens=pack(ids, mask)["cu_seqlens"]):
            model(ids.reshape(1, -1), use_cache=False)
        with pytest.raises(ReplayError, match="do not nest"), rr.replay(routes, attention_mask=mask):  # noqa: PT012
            logits(model, ids, mask)
            rr.replay(routes, attention_mask=mask).__enter__()
        with pytest.raises(ReplayError, match=r"routers of decoder layers \[1, 2, 3\] did not run inside the replay"), \
                rr.replay(routes, attention_mask=mask):
            pass  # e.g. a hub kernel replacing the MoE forward: never a silent no-op
        with rr.capture(attention_mask=mask), pytest.raises(ReplayError, match="ran a second time"):  # noqa: PT012
            logits(model, ids, mask)
            logits(model, ids, mask)
        with pytest.raises(ReplayError, match="did not run"), rr.capture(attention_mask=mask):
            pass
    finally:
        rr.remove()


def test_batch_and_spec_checks(model: nn.Module, batch: Any, tmp_path: Any) -> None:
    _, mask, routes = batch
    rr = RoutingReplay(model)
    spec = rr.spec
    try:
        with r3store.RouteWriter(str(tmp_path / "a"), spec) as w:
            for i, r in enumerate(routes):
                w.append(f"s{i}", r)
        store = r3store.open_store(str(tmp_path / "a"))
        rr.check_spec(store)
        assembled = store.assemble(["s0", "s1"], layers=[1, 2], return_tensors="np")
        with pytest.raises(ReplayError, match=r"decoder layers \[1, 2\], the model's routers sit in .*\[1, 2, 3\]"):
            rr.replay(assembled).__enter__()
        with pytest.raises(ReplayError, match="carries its own layout"):
            rr.replay(store.assemble(["s0"], return_tensors="pt"), attention_mask=mask).__enter__()
        with pytest.raises(ReplayError, match="no 'replay_mask' key"):
            rr.replay({"routes": routes[0]}).__enter__()
        other = r3store.ModelSpec(num_layers=4, num_experts=64, top_k=8, moe_layers=[0, 1, 2])
        with pytest.raises(ReplayError, match=r"moe_layers: \(0, 1, 2\) in the store, \(1, 2, 3\) in the model"):
            rr.check_spec(other)
        with pytest.raises(ReplayError, match="top_k: 6 in the store, 8"):
            rr.check_spec(r3store.ModelSpec(num_layers=4, num_experts=64, top_k=6, moe_layers=[1, 2, 3]))
    finally:
        rr.remove()


def test_no_router_found() -> None:
    dense = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ReplayError, match="no MoE router found in Sequential"):
        RoutingReplay(dense)
    with pytest.raises(ReplayError, match="router-like modules found but not known: ToyRouter"):
        RoutingReplay(ToyMoE())
    with pytest.raises(ReplayError, match="do not exist"):
        RoutingReplay(ToyMoE(), routers={"layers.9.router": softmax_renorm_weights})


class ToyRouter(nn.Module):
    """A router outside transformers: returns (ids, logits, weights), softmax over the top-k logits."""

    def __init__(self, hidden: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden, num_experts, bias=False)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.proj(x)
        top, ids = logits.topk(self.top_k, dim=-1)
        return ids, logits, torch.softmax(top, dim=-1)


class ToyMoE(nn.Module):
    def __init__(self, hidden: int = 16, num_experts: int = 6, top_k: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(ToyRouter(hidden, num_experts, top_k) for _ in range(3))
        self.experts = nn.Parameter(torch.randn(num_experts, hidden, hidden) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for router in self.layers:
            ids, _, w = router(x)
            x = x + torch.einsum("nk,nkh->nh", w, torch.einsum("nh,nkhg->nkg", x, self.experts[ids]))
        return x


def toy_weights(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.gather(1, ids), dim=-1)


def test_custom_router_by_class_and_name() -> None:
    torch.manual_seed(0)
    toy = ToyMoE()
    spec = RouterSpec(toy_weights, family="toy", ids_index=0, logits_index=1, weights_index=2, num_experts=6)
    x = torch.randn(10, 16)
    routes = [np.stack([np.stack([np.random.default_rng(t * 3 + j).permutation(6)[:2] for j in range(3)])
                        for t in range(9)]).astype(np.int32)]
    for routers in ({ToyRouter: spec}, {f"layers.{i}": spec for i in range(3)}):
        rr = RoutingReplay(toy, routers=routers)
        assert rr.moe_layers == (0, 1, 2)
        assert rr.spec.num_layers == 3
        assert rr.top_k == 2
        with rr.replay(routes), rr.capture(cu_seqlens=[0, 10]) as cap:  # a flat input: no (batch, seq) to read
            toy(x).square().sum().backward()
        rr.remove()
        assert np.array_equal(cap.routes[0], routes[0])
        for layer in toy.layers:
            assert layer.proj.weight.grad is not None
            assert layer.proj.weight.grad.abs().sum() > 0
            layer.proj.weight.grad = None
    with pytest.raises(ReplayError, match="no usable 'num_experts'"):
        RoutingReplay(toy, routers={ToyRouter: toy_weights})


def test_wrong_weight_function_is_caught(model: nn.Module, batch: Any) -> None:
    """A router whose code is not what its family function assumes raises instead of replaying."""
    ids, mask, routes = batch
    router_cls = type(model.get_submodule("model.layers.1.mlp.gate"))
    rr = RoutingReplay(model, routers={router_cls: softmax_renorm_weights})
    try:
        with pytest.raises(ReplayError, match=r"decoder layer 1: the softmax_renorm_weights weight function does "
                                              r"not reproduce"), rr.replay(routes, attention_mask=mask):
            logits(model, ids, mask)
    finally:
        rr.remove()


# Router classes of transformers 5.x and a config each (small hidden size; geometry from the config).
_ROUTER_CONFIGS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "Qwen3MoeTopKRouter": ("qwen3_moe", "Qwen3MoeConfig", {"norm_topk_prob": True}),
    "Qwen2MoeTopKRouter": ("qwen2_moe", "Qwen2MoeConfig", {}),
    "OlmoeTopKRouter": ("olmoe", "OlmoeConfig", {"norm_topk_prob": True}),
    "FlexOlmoTopKRouter": ("flex_olmo", "FlexOlmoConfig", {}),
    "Qwen3NextTopKRouter": ("qwen3_next", "Qwen3NextConfig", {}),
    "MixtralTopKRouter": ("mixtral", "MixtralConfig", {}),
    "MiniMaxTopKRouter": ("minimax", "MiniMaxConfig", {}),
    "Qwen3VLMoeTextTopKRouter": ("qwen3_vl_moe", "Qwen3VLMoeTextConfig", {}),
    "Qwen3_5MoeTopKRouter": ("qwen3_5_moe", "Qwen3_5MoeTextConfig", {}),
    "DeepseekV3TopkRouter": ("deepseek_v3", "DeepseekV3Config", {}),
    "Glm4MoeTopkRouter": ("glm4_moe", "Glm4MoeConfig", {"norm_topk_prob": False}),
    "Glm4MoeLiteTopkRouter": ("glm4_moe_lite", "Glm4MoeLiteConfig", {}),
    "Dots1TopkRouter": ("dots1", "Dots1Config", {"n_routed_experts": 32, "num_experts_per_tok": 4, "n_group": 4,
                                                 "topk_group": 2}),
    "GptOssTopKRouter": ("gpt_oss", "GptOssConfig", {}),
}


def test_router_table_is_covered() -> None:
    assert set(_ROUTER_CONFIGS) == set(ROUTER_FAMILIES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cls_name", sorted(_ROUTER_CONFIGS))
def test_family_weights_reproduce_each_router(cls_name: str, dtype: torch.dtype) -> None:
    """Each table entry's weight function, at the router's own ids, gives the router's own weights."""
    import transformers

    module, config_name, overrides = _ROUTER_CONFIGS[cls_name]
    config = getattr(transformers, config_name)(hidden_size=64, **overrides)
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), cls_name)
    gen = torch.Generator().manual_seed(0)
    router = cls(config)
    with torch.no_grad():
        for p in [*router.parameters(), *router.buffers()]:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    router = router.to(dtype)
    logits, weights, ids = router(torch.randn(32, 64, generator=gen).to(dtype))
    mine = ROUTER_FAMILIES[cls_name].weight_fn(router, logits, ids).to(weights.dtype)
    torch.testing.assert_close(mine, weights, rtol=0, atol=0)
    if ROUTER_FAMILIES[cls_name].weight_fn is sigmoid_weights:  # bias steers the choice only
        assert router.e_score_correction_bias.abs().sum() > 0
