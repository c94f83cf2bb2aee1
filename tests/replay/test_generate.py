"""Capture across ``model.generate()`` (KV cache on), then replay over the full sequences.

The reference is an independent record written here: a forward hook on every router
keeping the top-k ids of each call, and the sequence ends read from ``generate``'s
output the way TRL builds its completion mask (up to and including the first EOS).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from r3store.errors import ReplayError
from r3store.replay import RoutingReplay
from r3store.testing.moe import decision_flips, one_thread, random_batch, tiny_moe

EOS = list(range(3, 40))
"""Many EOS ids, so that sampled sequences of a random model end at different steps."""


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


class StepRecord:
    """Every router call's top-k ids, per model call (hooks written here, not r3store's)."""

    def __init__(self, model: Any, rr: RoutingReplay) -> None:
        self.calls: list[list[torch.Tensor]] = []
        routers = [model.get_submodule(name) for name in rr.router_names]
        self.handles = [model.register_forward_pre_hook(lambda *_: self.calls.append([]))]
        self.handles += [r.register_forward_hook(lambda m, a, out: self.calls[-1].append(out[2].detach().clone()))
                         for r in routers]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def expected(self, rows: int, prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> list[np.ndarray]:
        prefill = torch.stack(self.calls[0], dim=1)  # (rows * P, L, K)
        prefill = prefill.reshape(rows, prompt_mask.shape[1], *prefill.shape[1:])
        steps = [torch.stack(c, dim=1) for c in self.calls[1:]]
        decode = torch.stack(steps, dim=1) if steps else prefill[:, :0]
        new = completion_mask.sum(dim=1)
        return [torch.cat([prefill[i][prompt_mask[i].bool()], decode[i, : int(new[i]) - 1]]).int().numpy()
                for i in range(rows)]


def completion_mask(completion: torch.Tensor, eos: list[int]) -> torch.Tensor:
    """1 up to and including each row's first EOS (TRL's GRPOTrainer rule)."""
    is_eos = torch.isin(completion, torch.tensor(eos))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), completion.shape[1])
    return (torch.arange(completion.shape[1])[None] <= first[:, None]).long()


@pytest.mark.parametrize(("family", "sample", "num_return"), [("mixtral", True, 3), ("qwen3_moe", False, 1)])
def test_generate_capture_equals_each_steps_router_choices_and_replays_with_0_flips(
        family: str, sample: bool, num_return: int) -> None:
    engine, trainer = tiny_moe(family, engine_dtype="bfloat16", seed=3)
    rr_engine = RoutingReplay(engine)
    ids, mask = random_batch(3, 10, seed=1, padding="left")
    assert (mask == 0).any(), "the prompt batch must have left padding"
    record = StepRecord(engine, rr_engine)
    torch.manual_seed(0)
    with torch.no_grad(), rr_engine.capture_generate(eos_token_id=EOS) as cap:
        out = engine.generate(ids, attention_mask=mask, do_sample=sample, max_new_tokens=12, pad_token_id=0,
                              eos_token_id=EOS, num_return_sequences=num_return)
    record.remove()
    cap.check(out)
    rows = ids.shape[0] * num_return
    prompt_mask = mask.repeat_interleave(num_return, dim=0)
    done = completion_mask(out[:, ids.shape[1]:], EOS)
    if sample:
        assert len(set(done.sum(1).tolist())) > 1, "sequences should end at different steps"
    want = record.expected(rows, prompt_mask, done)
    assert len(cap.routes) == rows
    for i in range(rows):
        assert cap.routes[i].shape == (int(prompt_mask[i].sum() + done[i].sum()) - 1, len(rr_engine.moe_layers),
                                       rr_engine.top_k)
        np.testing.assert_array_equal(cap.routes[i], want[i], err_msg=f"sequence {i}")
    assert cap.lengths == [len(r) + 1 for r in cap.routes]
    assert cap.prompt_lengths == prompt_mask.sum(1).tolist()

    # the training forward over prompt + completion: 0 flips with replay (live routing would flip some)
    trainer.train()
    rr = RoutingReplay(trainer)
    full = torch.cat([prompt_mask, done], dim=1)
    with rr.replay(cap.routes, attention_mask=full), rr.capture(attention_mask=full) as replayed:
        logits = trainer(out, attention_mask=full, use_cache=False).logits
        logits.float().logsumexp(-1)[full.bool()].mean().backward()
    assert decision_flips(replayed.routes, cap.routes)[0] == 0
    assert all(p.grad is not None for n, p in trainer.named_parameters() if n.endswith("mlp.gate.weight"))


def test_static_cache_and_chunked_prefill_capture_the_same_routes_as_the_dynamic_cache() -> None:
    model = tiny_moe("qwen3_moe", seed=1)
    rr = RoutingReplay(model)
    ids, mask = random_batch(2, 9, seed=4, padding="left")
    caps = {}
    for name, extra in (("dynamic", {}), ("static", {"cache_implementation": "static"}),
                        ("chunked", {"prefill_chunk_size": 4})):
        with torch.no_grad(), rr.capture_generate() as cap:
            out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=5, pad_token_id=0,
                                 **extra)
        cap.check(out)
        caps[name] = cap.routes
    assert [len(r) for r in caps["dynamic"]] == [int(mask[i].sum()) + 5 - 1 for i in range(2)]
    for name in ("static", "chunked"):
        assert decision_flips(caps[name], caps["dynamic"])[0] == 0, name


@pytest.mark.parametrize("extra", [{"num_beams": 2}, {"prompt_lookup_num_tokens": 2}],
                         ids=["beam search", "prompt lookup (assisted)"])
def test_decoding_methods_that_reorder_or_verify_rows_are_refused(extra: dict[str, Any]) -> None:
    model = tiny_moe("mixtral")
    rr = RoutingReplay(model)
    ids, mask = random_batch(1, 8, seed=0)
    with pytest.raises(ReplayError, match="greedy search and sampling"), torch.no_grad(), rr.capture_generate():
        model.generate(ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0, **extra)


def test_check_names_sequences_the_capture_did_not_produce() -> None:
    model = tiny_moe("mixtral")
    rr = RoutingReplay(model)
    ids, mask = random_batch(2, 8, seed=0, padding="left")
    with torch.no_grad(), rr.capture_generate() as cap:
        out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=4, pad_token_id=0)
    other = out.clone()
    other[1, -2] = (other[1, -2] + 1) % 512
    with pytest.raises(ReplayError, match=r"sequences \[1\]"):
        cap.check(other)
    with pytest.raises(ReplayError, match="do not continue"):
        cap.check(out[:1])


def test_a_capture_block_inside_capture_generate_is_refused() -> None:
    model = tiny_moe("mixtral")
    rr = RoutingReplay(model)
    with pytest.raises(ReplayError, match="do not nest"), rr.capture_generate(), rr.capture():
        pass
