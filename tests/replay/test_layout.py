"""Batch layouts and rows without a route, checked router call by router call.

A probe hook registered after the replay hook sees every router call's input and final
output; calling the router's ``forward`` on that input (no hooks) gives its own choice.
Every routed (position, layer) must carry the recorded ids with the router's live
scores at them; every other one must carry the router's own ids and weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import r3store
from r3store.errors import ReplayError
from r3store.replay import ROUTER_FAMILIES, RoutingReplay
from r3store.testing.moe import (
    FAMILIES,
    one_thread,
    pack,
    random_batch,
    tiny_moe,
    token_logprobs,
)

BATCH, SEQLEN = 4, 24


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


class Probe:
    """Records (router, input, final weights, final ids) of every router call."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        self.calls: list[tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.handles = [model.get_submodule(n).register_forward_hook(self._hook) for n in names]

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.calls.append((module, args[0].detach(), output[1].detach(), output[2].detach()))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _record(models: tuple[nn.Module, nn.Module]) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    engine, _ = models
    ids, mask = random_batch(BATCH, SEQLEN, seed=5)
    rr = RoutingReplay(engine)
    with torch.no_grad(), rr.capture(attention_mask=mask) as cap:
        engine(ids, attention_mask=mask, use_cache=False)
    rr.remove()
    return ids, mask, cap.routes


@pytest.fixture(scope="module")
def models() -> tuple[nn.Module, nn.Module]:
    return tiny_moe("qwen3_moe", engine_dtype="bfloat16")


@pytest.fixture(scope="module")
def recorded(models: tuple[nn.Module, nn.Module]) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    return _record(models)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> tuple[nn.Module, Any]:
    models = tiny_moe(request.param, engine_dtype="bfloat16")
    return models[1], _record(models)


def check_calls(probe: Probe, expected: np.ndarray, has_route: np.ndarray) -> int:
    """Every call: routed positions carry ``expected`` ids and live weights at them; others are live.

    The live weights at the recorded ids come from the family's weight function (each is
    checked against its router's own code in test_replay.py) applied to the router's
    logits for the call's input.

    Returns the number of routed decisions where the router itself would have chosen otherwise.
    """
    assert len(probe.calls) == expected.shape[1]
    overruled = 0
    for j, (router, hidden, weights, ids) in enumerate(probe.calls):
        with torch.no_grad():
            own_logits, own_w, own_ids = router.forward(hidden)
        routed = torch.from_numpy(has_route[:, j])
        want = torch.from_numpy(expected[:, j]).long()
        assert torch.equal(ids[routed], want[routed])
        assert torch.equal(ids[~routed], own_ids[~routed])
        assert torch.equal(weights[~routed], own_w[~routed])
        live = ROUTER_FAMILIES[type(router).__name__].weight_fn(router, own_logits, ids).to(weights.dtype)
        torch.testing.assert_close(weights[routed], live[routed], rtol=1e-6, atol=1e-7)
        assert (weights[routed] > 0).all()  # never the zero-filled post-top-k probabilities
        differ = (ids.sort(-1).values != own_ids.sort(-1).values).any(-1) & routed
        overruled += int(differ.sum())
    return overruled


def flat_expectation(mask: torch.Tensor, routes: list[np.ndarray | None], layers: int, top_k: int,
                     packed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Expected ids and has-route per flattened position, built the slow way, sequence by sequence."""
    real = [np.flatnonzero(m) for m in mask.numpy()]
    n = int(mask.sum()) if packed else mask.numel()
    ids = np.full((n, layers, top_k), -1, np.int64)
    has = np.zeros((n, layers), bool)
    offset = 0
    for b, (pos, r) in enumerate(zip(real, routes, strict=True)):
        flat = offset + np.arange(len(pos)) if packed else b * mask.shape[1] + pos
        offset += len(pos)
        if r is None:
            continue
        ids[flat[:-1]] = r
        has[flat[:-1]] = ~(r == -1).all(-1)
    return ids, has


@pytest.mark.parametrize("layout", ["right", "left", "packed"])
def test_layouts_replay_each_sequence_alike(models: tuple[nn.Module, nn.Module], recorded: Any, layout: str) -> None:
    """Right- and left-padded and packed input replay the same routes to the same tokens."""
    _, trainer = models
    ids, mask, routes = recorded
    rr = RoutingReplay(trainer)
    probe = Probe(trainer, rr.router_names)
    try:
        if layout == "left":
            ids, mask = _to_left(ids, mask)
        if layout == "packed":
            p = pack(ids, mask)
            block, cap = rr.replay(routes, cu_seqlens=p["cu_seqlens"]), rr.capture(cu_seqlens=p["cu_seqlens"])
            with torch.no_grad(), block, cap as replayed:
                logits = trainer(p["input_ids"], position_ids=p["position_ids"], use_cache=False).logits
            lp = token_logprobs(logits, p["input_ids"], torch.ones_like(p["input_ids"]))
            keep = np.ones(lp.shape[0] + 1, bool)
            keep[np.cumsum(mask.sum(1).numpy()) - 1] = False  # no next token across a sequence boundary
            lp = lp[torch.from_numpy(keep[:-1])]
        else:
            with torch.no_grad(), rr.replay(routes, attention_mask=mask), rr.capture(attention_mask=mask) as replayed:
                logits = trainer(ids, attention_mask=mask, use_cache=False).logits
            lp = token_logprobs(logits, ids, mask)
        expected, has = flat_expectation(mask, routes, len(rr.moe_layers), rr.top_k, packed=layout == "packed")
        assert check_calls(probe, expected, has) > 0
    finally:
        probe.remove()
        rr.remove()
    assert all(np.array_equal(a, b) for a, b in zip(replayed.routes, routes, strict=True))
    reference = _reference_logprobs(trainer, recorded)
    torch.testing.assert_close(lp, reference, rtol=1e-4, atol=1e-4)


def _to_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = mask.sum(1)
    shift = mask.shape[1] - lengths
    idx = (torch.arange(mask.shape[1])[None] - shift[:, None]) % mask.shape[1]
    return ids.gather(1, idx), mask.gather(1, idx)


def _reference_logprobs(trainer: nn.Module, recorded: Any) -> torch.Tensor:
    ids, mask, routes = recorded
    rr = RoutingReplay(trainer)
    with torch.no_grad(), rr.replay(routes, attention_mask=mask):
        logits = trainer(ids, attention_mask=mask, use_cache=False).logits
    rr.remove()
    return token_logprobs(logits, ids, mask)


def test_rows_without_route_keep_live_routing(family: tuple[nn.Module, Any]) -> None:
    """Last tokens, padding, a sequence given as None, all -1 rows (one layer or all) route live."""
    trainer, (ids, mask, routes) = family
    routes = [r.copy() for r in routes]
    routes[1][5] = -1          # a row the writer marked missing, every layer
    routes[2][3, 1] = -1       # one layer of one row
    routes[3] = None           # a sequence without routes
    rr = RoutingReplay(trainer)
    probe = Probe(trainer, rr.router_names)
    try:
        with torch.no_grad(), rr.replay(routes, attention_mask=mask):
            trainer(ids, attention_mask=mask, use_cache=False)
        expected, has = flat_expectation(mask, routes, len(rr.moe_layers), rr.top_k)
        assert not has[1 * SEQLEN + 5].any()
        assert has[1 * SEQLEN + 4].all()
        assert not has[2 * SEQLEN + 3, 1]
        assert check_calls(probe, expected, has) > 0  # the trainer would have routed some rows otherwise
    finally:
        probe.remove()
        rr.remove()


@pytest.mark.parametrize("pad_policy", ["spread", "fill"])
def test_batch_pad_rows_keep_live_routing(models: tuple[nn.Module, nn.Module], recorded: Any,
                                          tmp_path: Any, pad_policy: str) -> None:
    """``replay_mask`` False rows of an assembled THD batch route live, whatever ids they hold."""
    _, trainer = models
    ids, mask, routes = recorded
    rr = RoutingReplay(trainer)
    tokens = [ids[i][mask[i].bool()] for i in range(BATCH)]
    with r3store.RouteWriter(str(tmp_path), rr.spec) as w:
        for i, (r, t) in enumerate(zip(routes, tokens, strict=True)):
            w.append(f"s{i}", r, tokens=t)
    batch = r3store.open_store(str(tmp_path)).assemble([f"s{i}" for i in range(BATCH)],
                                                       {"pad_policy": pad_policy, "tp_size": 8},
                                                       tokens=tokens, return_tensors="np")
    assert len(batch["cu_seqlens"]) == BATCH + 2  # TP padding adds a final segment of pad rows
    probe = Probe(trainer, rr.router_names)
    try:
        cu = torch.as_tensor(batch["cu_seqlens"]).long()
        pos = torch.cat([torch.arange(int(n)) for n in cu[1:] - cu[:-1]])[None]
        with torch.no_grad(), rr.replay(batch):
            trainer(torch.as_tensor(batch["tokens"])[None], position_ids=pos, use_cache=False)
        has = np.repeat(batch["replay_mask"][:, None], len(rr.moe_layers), axis=1)
        check_calls(probe, batch["routes"].astype(np.int64), has)
    finally:
        probe.remove()
        rr.remove()


def _random_routes(rows: list[int], layers: int, top_k: int, num_experts: int, seed: int) -> list[np.ndarray]:
    """Distinct random ids per row: they differ from the router's own choice almost everywhere."""
    rng = np.random.default_rng(seed)
    return [rng.random((n, layers, num_experts)).argsort(-1)[..., :top_k].astype(np.int32) for n in rows]


@pytest.mark.parametrize(("batch_size", "seqlen"), [(2, 7), (5, 5)])
def test_assembled_batch_says_its_layout_and_sbhd_is_refused(models: tuple[nn.Module, nn.Module], tmp_path: Any,
                                                              batch_size: int, seqlen: int) -> None:
    """A BSHD batch replays exactly into a (B, T) forward; SBHD (T, B) never replays transposed, B == T too."""
    trainer = models[1]
    rr = RoutingReplay(trainer)
    try:
        routes = _random_routes([seqlen - 1] * batch_size, len(rr.moe_layers), rr.top_k, rr.num_experts, seed=11)
        with r3store.RouteWriter(str(tmp_path / "s"), rr.spec) as w:
            for i, r in enumerate(routes):
                w.append(f"s{i}", r)
        store = r3store.open_store(str(tmp_path / "s"))
        sids = [f"s{i}" for i in range(batch_size)]
        ids = torch.randint(3, 100, (batch_size, seqlen), generator=torch.Generator().manual_seed(1))
        for layout in ("bshd", "thd"):
            batch = store.assemble(sids, {"layout": layout}, return_tensors="pt")
            assert batch["layout"] == layout
            packed = layout == "thd"
            with torch.no_grad(), rr.replay(batch), rr.capture(cu_seqlens=batch["cu_seqlens"] if packed else None) \
                    as cap:
                trainer(ids.reshape(1, -1) if packed else ids, use_cache=False)
            for sid, got in zip(sids, cap.routes, strict=True):
                np.testing.assert_array_equal(got, store.get(sid))
        sbhd = store.assemble(sids, {"layout": "sbhd"}, return_tensors="pt")
        assert sbhd["layout"] == "sbhd"
        shape = re.escape(str((seqlen, batch_size, len(rr.moe_layers), rr.top_k)))
        with pytest.raises(ReplayError, match=rf"this batch is SBHD: routes of shape {shape} = \(seq, batch, MoE "
                                              r"layers, top_k\).*assemble with \{'layout': 'bshd'\}"):
            rr.replay(sbhd).__enter__()
        if batch_size != seqlen:  # a 4-d batch without its layout: the model input's shape tells
            keyless = {k: v for k, v in sbhd.items() if k != "layout"}
            with pytest.raises(ReplayError, match=rf"input has shape \(batch, seq\) = \({batch_size}, {seqlen}\); "
                                                  rf"the routes are laid out for \({seqlen}, {batch_size}\) by the "
                                                  r"BSHD batch .*\(transposed"), \
                    torch.no_grad(), rr.replay(keyless):
                trainer(ids, use_cache=False)
        with pytest.raises(ReplayError, match=r"batch\['layout'\] is 'thd', but batch\['routes'\] has shape"):
            rr.replay({**store.assemble(sids, {"layout": "bshd"}), "layout": "thd"}).__enter__()
    finally:
        rr.remove()


def test_layouts_that_do_not_fit_the_input_raise(models: tuple[nn.Module, nn.Module], tmp_path: Any) -> None:
    """Sequences laid back to back, or a mask of another shape, never land on other tokens of a (B, T) input."""
    trainer = models[1]
    rr = RoutingReplay(trainer)
    try:
        routes = _random_routes([3, 9], len(rr.moe_layers), rr.top_k, rr.num_experts, seed=12)  # 4 + 10 tokens
        ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(2))
        fill = r"as 2 sequences of \[4, 10\] tokens back to back: on a batch of several rows each sequence must fill"
        with pytest.raises(ReplayError, match=r"input has shape \(batch, seq\) = \(2, 7\); the routes are laid out "
                                              r"by the sequences laid back to back " + fill), \
                torch.no_grad(), rr.replay(routes):
            trainer(ids, use_cache=False)
        with r3store.RouteWriter(str(tmp_path / "s"), rr.spec) as w:
            for i, r in enumerate(routes):
                w.append(f"s{i}", r)
        thd = r3store.open_store(str(tmp_path / "s")).assemble(["s0", "s1"], return_tensors="pt")
        with pytest.raises(ReplayError, match=r"by the THD batch of 14 positions " + fill), \
                torch.no_grad(), rr.replay(thd):
            trainer(ids, use_cache=False)
        with torch.no_grad(), rr.replay(thd), rr.capture(cu_seqlens=thd["cu_seqlens"]) as cap:  # packed: fine
            trainer(ids.reshape(1, -1), use_cache=False)
        for got, want in zip(cap.routes, routes, strict=True):
            np.testing.assert_array_equal(got, want)
        square = _random_routes([6, 6], len(rr.moe_layers), rr.top_k, rr.num_experts, seed=13)
        mask = torch.ones(7, 2, dtype=torch.long)  # 14 positions, but sequence first
        with pytest.raises(ReplayError, match="2 route arrays for 7 sequences"):
            rr.replay(square, attention_mask=mask).__enter__()
        mask = torch.ones(2, 7, dtype=torch.long)
        with pytest.raises(ReplayError, match=r"input has shape \(batch, seq\) = \(1, 14\); the routes are laid out "
                                              r"for \(2, 7\) by the attention_mask of shape \(2, 7\)"), \
                torch.no_grad(), rr.replay(square, attention_mask=mask):
            trainer(ids.reshape(1, -1), use_cache=False)
    finally:
        rr.remove()
