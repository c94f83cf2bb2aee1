"""Pad rows spread over expert-parallel ranks: ``LayoutOptions(ep_size=...)`` (issue 18, item 3)."""

from __future__ import annotations

import numpy as np
import pytest

import r3store
from r3store.batch import assemble
from r3store.errors import LayoutOptionError
from r3store.layout import LayoutOptions, apply_routes, pad_ids, pad_routes, plan_layout


def ep_counts(ids: np.ndarray, num_experts: int, ep_size: int) -> np.ndarray:
    """Pad ids per EP rank (expert e on rank e // (E // ep_size))."""
    return np.bincount((ids.reshape(-1) // (num_experts // ep_size)), minlength=ep_size)


def check_balanced(pads: np.ndarray, num_experts: int, ep_size: int) -> None:
    """pads: (P, L, K). In every layer, EP-rank counts differ by <= 1; rows hold distinct in-range ids."""
    p, n_layers, _ = pads.shape
    assert ((pads >= 0) & (pads < num_experts)).all()
    assert (np.diff(np.sort(pads, axis=-1), axis=-1) != 0).all()
    for layer in range(n_layers):
        counts = ep_counts(pads[:, layer], num_experts, ep_size)
        assert counts.max() - counts.min() <= 1, (p, layer, counts)


@pytest.mark.parametrize("ep_size", [8, 32])
@pytest.mark.parametrize(("num_experts", "top_k"), [(64, 1), (64, 6), (128, 8), (256, 8), (32, 4)])
def test_pad_rows_balance_ep_ranks(ep_size: int, num_experts: int, top_k: int) -> None:
    if num_experts % ep_size:
        pytest.skip("ep_size must divide num_experts")
    for rows in range(1, 41):
        check_balanced(pad_routes(rows, 3, top_k, num_experts, ep_size=ep_size), num_experts, ep_size)


def test_default_pad_rows_crowd_ep_ranks() -> None:
    """The issue's finding, pinned so the balance test above can fail: ids (p*k + j) % E leave
    EP ranks idle (E=128, k=8, EP=8: one pad row touches one rank of eight)."""
    pads = pad_routes(1, 1, 8, 128)
    assert np.count_nonzero(ep_counts(pads, 128, 8)) == 1
    assert np.count_nonzero(ep_counts(pad_routes(1, 1, 8, 128, ep_size=8), 128, 8)) == 8


def test_ep_size_one_or_all_experts_keeps_the_default_ids() -> None:
    np.testing.assert_array_equal(pad_ids(13, 4, 16, 16), pad_ids(13, 4, 16))
    np.testing.assert_array_equal(pad_ids(13, 4, 16, 1), pad_ids(13, 4, 16))
    np.testing.assert_array_equal(pad_ids(5, 4, 16, 4, start=3), pad_ids(8, 4, 16, 4)[3:])


def test_ep_size_must_divide_num_experts() -> None:
    with pytest.raises(LayoutOptionError, match="ep_size"):
        pad_routes(3, 1, 2, 12, ep_size=8)
    with pytest.raises(LayoutOptionError, match="ep_size"):
        LayoutOptions(ep_size=0)


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
@pytest.mark.parametrize("ep_size", [8, 32])
def test_batch_pad_rows_balance_ep_ranks(tmp_path, layout: str, ep_size: int) -> None:
    """Through apply_routes and assemble (every layout, CP/SP slices): one rank's pad rows are balanced."""
    spec = r3store.ModelSpec(num_layers=2, num_experts=64, top_k=6)
    rng = np.random.default_rng(0)
    lengths = [5, 1, 17, 3, 9]
    routes = [np.argsort(rng.random((n - 1, 2, 64)), axis=-1)[..., :6].astype(np.int32) for n in lengths]
    ids = [f"s{i}" for i in range(len(lengths))]
    with r3store.RouteWriter(tmp_path / "s", spec, config={"chunk_rows": 4}) as writer:
        for sid, r in zip(ids, routes, strict=True):
            writer.append(sid, r, num_tokens=len(r) + 1)
    reader = r3store.open_store(tmp_path / "s")
    for cp_rank in range(2):
        opts = LayoutOptions(layout=layout, cp_size=2, cp_rank=cp_rank, tp_size=2, sequence_parallel=True,
                             tp_rank=1, ep_size=ep_size)  # type: ignore[arg-type]
        got, mask = apply_routes(plan_layout(lengths, opts), np.concatenate(routes), num_experts=64)
        check_balanced(got[~mask], 64, ep_size)
        batch = assemble(reader, ids, opts)
        np.testing.assert_array_equal(batch["routes"], got)
        np.testing.assert_array_equal(batch["replay_mask"], mask)
