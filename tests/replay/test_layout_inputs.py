"""Hostile layout inputs to ``RoutingReplay.replay`` raise a ``ReplayError``, never a torch error or
an allocation sized by an unchecked number: packed boundaries that claim more tokens than the
routes hold, that do not start at 0 or that decrease (in a batch dict too), object arrays, a
float ``replay_mask``; unsigned ids wider than 8 bits (which torch cannot compare) are read as
the ids they are."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from r3store.errors import ReplayError
from r3store.replay import RoutingReplay
from r3store.testing.moe import one_thread, tiny_moe


@pytest.fixture(scope="module")
def model() -> Iterator[nn.Module]:
    with one_thread():
        yield tiny_moe("qwen3_moe", engine_dtype="bfloat16")[1]


@pytest.fixture
def rr(model: nn.Module) -> Iterator[RoutingReplay]:
    replay = RoutingReplay(model)
    yield replay
    replay.remove()


def _routes(rr: RoutingReplay, rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(rr.num_experts)[: rr.top_k] for _ in range(rows * len(rr.moe_layers))]
                    ).reshape(rows, len(rr.moe_layers), rr.top_k).astype(np.int32)


def _plan(rr: RoutingReplay, routes: Any, **layout: Any) -> None:
    with rr.replay(routes, **layout):
        pass


@pytest.mark.parametrize("total", [2**33, 2**40, 2**62])
def test_boundaries_claiming_more_tokens_than_the_routes_are_refused_before_any_allocation(
        rr: RoutingReplay, total: int) -> None:
    with pytest.raises(ReplayError, match=r"routes\[0\] has 3 rows; the sequence has"):
        _plan(rr, [_routes(rr, 3)], cu_seqlens=np.array([0, total]))


def test_boundaries_that_do_not_start_at_0_or_decrease_are_refused(rr: RoutingReplay) -> None:
    with pytest.raises(ReplayError, match="must start at 0 and not decrease"):
        _plan(rr, [_routes(rr, 3)], cu_seqlens=[1, 5])
    with pytest.raises(ReplayError, match="must start at 0 and not decrease"):
        _plan(rr, [_routes(rr, 3), _routes(rr, 1)], cu_seqlens=[0, 4, 2])


def test_object_arrays_are_refused(rr: RoutingReplay) -> None:
    with pytest.raises(ReplayError, match="cu_seqlens must be an array or tensor of numbers"):
        _plan(rr, [_routes(rr, 3)], cu_seqlens=np.array([0, "4"], dtype=object))
    with pytest.raises(ReplayError, match=r"routes\[0\] must be an array or tensor of numbers"):
        _plan(rr, [_routes(rr, 3).astype(object)], cu_seqlens=[0, 4])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
def test_wide_unsigned_routes_read_as_their_ids(model: nn.Module, rr: RoutingReplay, dtype: type) -> None:
    routes = _routes(rr, 5, seed=3)
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), rr.replay([routes]), rr.capture() as want:
        model(ids, use_cache=False)
    with torch.no_grad(), rr.replay([routes.astype(dtype)]), rr.capture() as got:
        model(ids, use_cache=False)
    np.testing.assert_array_equal(got.routes[0], want.routes[0])
    bad = routes.astype(dtype)
    bad[1, 0, 0] = np.iinfo(dtype).max
    with pytest.raises(ReplayError, match=r"outside|past the int64 range"):
        _plan(rr, [bad])


def test_batch_with_a_float_mask_or_bad_boundaries_is_refused(model: nn.Module, rr: RoutingReplay) -> None:
    routes = _routes(rr, 6)
    batch = {"routes": routes, "replay_mask": np.ones(6, bool), "cu_seqlens": np.array([0, 3, 6], np.int32),
             "layout": "thd"}
    with torch.no_grad(), rr.replay(batch):
        model(torch.arange(3, 9).reshape(1, 6), use_cache=False)
    with pytest.raises(ReplayError, match=r"replay_mask'\] must be bool"):
        _plan(rr, {**batch, "replay_mask": np.full(6, 0.3)})
    for cu in ([0, 5, 3], [2, 6], [0, -1, 6]):
        with pytest.raises(ReplayError, match=r"cu_seqlens'\] must start at 0 and not decrease"):
            _plan(rr, {**batch, "cu_seqlens": np.array(cu)})
