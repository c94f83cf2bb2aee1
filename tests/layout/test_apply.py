"""Tests for r3store.layout: token / route layout parity under THD, BSHD, CP, TP, SP, PP."""

from __future__ import annotations

import doctest
import importlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import r3store
from r3store.errors import AlignmentError, LayerError, R3StoreError, RouteShapeError
from r3store.layout import (
    LayoutOptionError,
    LayoutOptions,
    LayoutPlan,
    apply_plan,
    apply_routes,
    pad_routes,
    plan_layout,
    route_index,
    select_layers,
)

# ---------------------------------------------------------------------------
# helpers


def encode_routes(num_tokens, n_layers, top_k):
    """Routes whose row for token g (global position) holds g*L*K + l*K + j."""
    n = np.asarray(num_tokens)
    offsets = np.concatenate(([0], np.cumsum(n)))
    tokens = np.concatenate([np.arange(offsets[i], offsets[i + 1] - 1) for i in range(len(n))])
    return encode(tokens, n_layers, top_k), tokens


def encode(tokens, n_layers, top_k):
    lk = np.arange(n_layers * top_k).reshape(n_layers, top_k)
    return (np.asarray(tokens)[..., None, None] * n_layers * top_k + lk).astype(np.int32)


def reference_full_index(num_tokens, opts):
    """Naive per-token reimplementation of the layout before the SP split (list of rows)."""
    cp, r = opts.cp_size, opts.cp_rank
    unit = 1 if cp == 1 else (2 * cp if opts.cp_mode == "zigzag" else cp)
    if opts.layout == "bshd":
        length = opts.max_seqlen or max(num_tokens)
        length = -(-length // unit) * unit
    rows, offset = [], 0
    for n in num_tokens:
        padded = length if opts.layout == "bshd" else -(-n // unit) * unit
        seq = [offset + t if t < n else -1 for t in range(padded)]
        if cp > 1 and opts.cp_mode == "zigzag":
            c = padded // (2 * cp)
            seq = seq[r * c:(r + 1) * c] + seq[(2 * cp - 1 - r) * c:(2 * cp - r) * c]
        elif cp > 1:
            c = padded // cp
            seq = seq[r * c:(r + 1) * c]
        rows.append(seq)
        offset += n
    m = opts.tp_size * opts.pad_multiple
    if opts.layout == "thd":
        flat = [x for row in rows for x in row]
        return [flat + [-1] * (-len(flat) % m)]
    return [row + [-1] * (-len(row) % m) for row in rows]


def last_token_mask(num_tokens):
    n = np.asarray(num_tokens)
    is_last = np.zeros(int(n.sum()), dtype=bool)
    is_last[np.cumsum(n) - 1] = True
    return is_last


def check_spread(pads, num_experts):
    """Pad ids in range, distinct within a row, per-layer load within ceil(P*K/E) + 1."""
    p, n_layers, k = pads.shape
    assert ((pads >= 0) & (pads < num_experts)).all()
    if k <= num_experts:
        srt = np.sort(pads, axis=-1)
        assert (np.diff(srt, axis=-1) != 0).all()
    bound = math.ceil(p * k / num_experts) + 1
    for layer in range(n_layers):
        rows_per_expert = [(pads[:, layer] == e).any(axis=-1).sum() for e in range(num_experts)]
        assert max(rows_per_expert) <= bound


# ---------------------------------------------------------------------------
# explicit worked examples


def test_zigzag_cp_odd_length():
    # 5 tokens, cp=2: pad to 8, chunks [0,1] [2,3] [4,p] [p,p]; rank 0 keeps 0 and 3.
    p0 = plan_layout([5], cp_size=2, cp_rank=0)
    p1 = plan_layout([5], cp_size=2, cp_rank=1)
    assert p0.index.tolist() == [0, 1, -1, -1]
    assert p1.index.tolist() == [2, 3, 4, -1]
    assert p0.cu_seqlens.tolist() == [0, 4]
    assert p0.cu_seqlens.dtype == np.int32
    assert p0.index.dtype == np.int64
    assert p0.seqlens.tolist() == [5]
    assert p0.seqlens.dtype == np.int32


def test_zigzag_cp_two_samples_and_routes():
    plan = plan_layout([5, 3], cp_size=2, cp_rank=0)
    # sample 1 (3 tokens): pad to 4, chunks [5] [6] [7] [p]; rank 0 keeps chunks 0 and 3.
    assert plan.index.tolist() == [0, 1, -1, -1, 5, -1]
    assert plan.cu_seqlens.tolist() == [0, 4, 6]
    # routes rows: sample 0 -> 0..3, sample 1 -> 4..5 (tokens 5, 6).
    assert route_index(plan).tolist() == [0, 1, -1, -1, 4, -1]


def test_zigzag_cp4_chunk_order():
    plan = plan_layout([16], cp_size=4, cp_rank=1)
    assert plan.index.tolist() == [2, 3, 12, 13]


def test_contiguous_cp():
    # 5 tokens, cp=2 contiguous: pad to 6, rank r keeps chunk r of 3.
    assert plan_layout([5], cp_size=2, cp_rank=0, cp_mode="contiguous").index.tolist() == [0, 1, 2]
    assert plan_layout([5], cp_size=2, cp_rank=1, cp_mode="contiguous").index.tolist() == [3, 4, -1]


def test_pad_multiple_adds_final_segment():
    plan = plan_layout([3, 2], tp_size=2, pad_multiple=3)
    assert plan.index.tolist() == [0, 1, 2, 3, 4, -1]
    assert plan.cu_seqlens.tolist() == [0, 3, 5, 6]
    assert plan.sp_range == (0, 6)


def test_no_final_segment_when_already_aligned():
    plan = plan_layout([3, 3], tp_size=2)
    assert plan.cu_seqlens.tolist() == [0, 3, 6]
    assert plan.index.tolist() == list(range(6))


def test_sequence_parallel_split():
    r0 = plan_layout([3, 2], tp_size=2, tp_rank=0, sequence_parallel=True)
    r1 = plan_layout([3, 2], tp_size=2, tp_rank=1, sequence_parallel=True)
    assert r0.index.tolist() == [0, 1, 2]
    assert r0.sp_range == (0, 3)
    assert r1.index.tolist() == [3, 4, -1]
    assert r1.sp_range == (3, 6)
    assert r1.cu_seqlens.tolist() == [0, 3, 5, 6]  # before the SP split
    assert r1.local_length == 3


def test_tp_without_sp_replicates():
    plan = plan_layout([3, 2], tp_size=2, tp_rank=1)
    assert plan.index.tolist() == [0, 1, 2, 3, 4, -1]
    assert plan.sp_range == (0, 6)


def test_bshd_batch_max_and_max_seqlen():
    plan = plan_layout([3, 1], layout="bshd")
    assert plan.index.tolist() == [[0, 1, 2], [3, -1, -1]]
    assert plan.cu_seqlens.tolist() == [0, 3, 6]
    plan = plan_layout([3, 1], layout="bshd", max_seqlen=4)
    assert plan.index.tolist() == [[0, 1, 2, -1], [3, -1, -1, -1]]
    assert route_index(plan).tolist() == [[0, 1, -1, -1], [-1, -1, -1, -1]]


def test_bshd_cp_pads_before_cut_and_tp_after():
    # max_seqlen 5 -> T=8 (multiple of 2*cp); rank 0 keeps chunks 0 and 3 of 2; tp pads 4 -> 6.
    plan = plan_layout([3, 1], layout="bshd", max_seqlen=5, cp_size=2, tp_size=3)
    assert plan.index.tolist() == [[0, 1, -1, -1, -1, -1], [3, -1, -1, -1, -1, -1]]
    assert plan.cu_seqlens.tolist() == [0, 6, 12]


def test_bshd_max_seqlen_too_small_names_sample():
    with pytest.raises(LayoutOptionError, match=r"max_seqlen.*sample 1 has 5 tokens") as info:
        plan_layout([2, 5], layout="bshd", max_seqlen=4)
    assert info.value.option == "max_seqlen"


def test_apply_plan_and_routes_fill():
    plan = plan_layout([3, 2], tp_size=2, pad_multiple=3)
    token_ids = np.array([10, 11, 12, 20, 21])
    assert apply_plan(plan, token_ids, fill_value=0).tolist() == [10, 11, 12, 20, 21, 0]
    routes = np.arange(3 * 2 * 1, dtype=np.int32).reshape(3, 2, 1)  # 2 + 1 rows
    out, mask = apply_routes(plan, routes, num_experts=8, pad_policy="fill", fill_value=-1)
    assert mask.tolist() == [True, True, False, True, False, False]
    assert out.dtype == np.int32
    assert out.shape == (6, 2, 1)
    assert out[:, :, 0].tolist() == [[0, 1], [2, 3], [-1, -1], [4, 5], [-1, -1], [-1, -1]]


def test_apply_routes_spread():
    plan = plan_layout([2], tp_size=4)
    routes = np.array([[[5, 6]]], dtype=np.int32)
    out, mask = apply_routes(plan, routes, num_experts=4)
    assert mask.tolist() == [True, False, False, False]
    assert out[:, 0].tolist() == [[5, 6], [0, 1], [2, 3], [0, 1]]


def test_apply_plan_multidim_values():
    plan = plan_layout([2, 1], layout="bshd")
    values = np.arange(6).reshape(3, 2)
    out = apply_plan(plan, values, fill_value=-7)
    assert out.shape == (2, 2, 2)
    assert out.tolist() == [[[0, 1], [2, 3]], [[4, 5], [-7, -7]]]


def test_pad_routes_shape_and_values():
    pads = pad_routes(5, 2, 3, 4)
    assert pads.shape == (5, 2, 3)
    assert pads.dtype == np.int32
    assert pads[:, 0].ravel().tolist() == [i % 4 for i in range(15)]
    check_spread(pads, 4)
    assert pad_routes(0, 2, 3, 4).shape == (0, 2, 3)


def test_select_layers():
    moe = [1, 2, 3, 5]  # decoder layers 0 and 4 are dense
    assert select_layers(moe, [5, 1]).tolist() == [3, 0]
    assert select_layers(moe, None).tolist() == [0, 1, 2, 3]
    assert select_layers(moe, None).dtype == np.int64
    with pytest.raises(LayerError) as info:
        select_layers(moe, [3, 4])
    assert isinstance(info.value, IndexError)
    assert info.value.layer == 4
    assert info.value.moe_layers == (1, 2, 3, 5)
    with pytest.raises(LayerError, match="requested twice"):  # one error policy with ModelSpec.layer_positions
        select_layers(moe, [3, 3])
    with pytest.raises(LayerError, match="listed twice in moe_layers"):
        select_layers([1, 1], None)
    with pytest.raises(TypeError, match="ints"):
        select_layers(moe, [3.0])
    with pytest.raises(TypeError, match=r"use \[3\]"):
        select_layers(moe, 3)  # type: ignore[arg-type]
    spec = r3store.ModelSpec(num_layers=6, num_experts=8, top_k=2, moe_layers=moe)
    for wanted in (None, [5, 1], [2]):
        assert spec.layer_positions(wanted) == tuple(select_layers(moe, wanted).tolist())


def test_doctests():
    for name in ("_plan", "_pad", "_layers"):
        module = importlib.import_module(f"r3store.layout.{name}")
        assert doctest.testmod(module).failed == 0


# ---------------------------------------------------------------------------
# options


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"layout": "hbsd"}, "layout"),
        ({"cp_size": 0}, "cp_size"),
        ({"cp_size": True}, "cp_size"),
        ({"cp_size": 2.0}, "cp_size"),
        ({"cp_size": 2, "cp_rank": 2}, "cp_rank"),
        ({"cp_rank": -1}, "cp_rank"),
        ({"cp_mode": "ring"}, "cp_mode"),
        ({"tp_size": 0}, "tp_size"),
        ({"tp_rank": 1}, "tp_rank"),
        ({"pad_multiple": 0}, "pad_multiple"),
        ({"sequence_parallel": "yes"}, "sequence_parallel"),
        ({"layout": "bshd", "max_seqlen": 0}, "max_seqlen"),
        ({"max_seqlen": 8}, "max_seqlen"),  # THD has no max_seqlen
    ],
)
def test_bad_options(kwargs, option):
    with pytest.raises(LayoutOptionError) as info:
        LayoutOptions(**kwargs)
    err = info.value
    assert isinstance(err, ValueError)
    assert isinstance(err, R3StoreError)
    assert err.option == option
    assert option in str(err)
    with pytest.raises(LayoutOptionError):
        plan_layout([4], **kwargs)


def test_options_dict_round_trip_and_overrides():
    opts = LayoutOptions(layout="bshd", cp_size=2, cp_rank=1, tp_size=2, max_seqlen=9)
    assert LayoutOptions.from_dict(opts.to_dict()) == opts
    assert LayoutOptions.from_dict({}) == LayoutOptions()
    with pytest.raises(LayoutOptionError, match="cp_sise"):
        LayoutOptions.from_dict({"cp_sise": 2})
    plan = plan_layout([5], opts, cp_rank=0)
    assert plan.options.cp_rank == 0
    assert plan.options.cp_size == 2
    assert LayoutOptions(cp_size=np.int64(2)).cp_size == 2


@pytest.mark.parametrize("num_tokens", [[], [0], [3, -1], [[1, 2]], [1.5]])
def test_bad_num_tokens(num_tokens):
    with pytest.raises(LayoutOptionError, match="num_tokens"):
        plan_layout(num_tokens)


def test_bad_apply_arguments():
    plan = plan_layout([3, 2])
    routes = np.zeros((3, 1, 2), dtype=np.int32)
    with pytest.raises(AlignmentError):
        apply_plan(plan, np.arange(4))
    with pytest.raises(AlignmentError):
        apply_routes(plan, routes[:2], num_experts=4)
    with pytest.raises(RouteShapeError):
        apply_routes(plan, routes[:, 0], num_experts=4)
    with pytest.raises(LayoutOptionError, match="pad_policy"):
        apply_routes(plan, routes, num_experts=4, pad_policy="zeros")
    with pytest.raises(LayoutOptionError, match="num_experts"):
        apply_routes(plan, routes, num_experts=0)
    with pytest.raises(LayoutOptionError, match="top_k"):
        pad_routes(1, 1, 0, 4)


def test_plan_is_read_only():
    plan = plan_layout([3])
    assert isinstance(plan, LayoutPlan)
    with pytest.raises(ValueError, match="read-only"):
        plan.index[0] = 5


# ---------------------------------------------------------------------------
# parity property


@st.composite
def batches(draw):
    num_tokens = draw(st.lists(st.integers(1, 50), min_size=1, max_size=6))
    layout = draw(st.sampled_from(["thd", "bshd"]))
    max_seqlen = None
    if layout == "bshd" and draw(st.booleans()):
        max_seqlen = max(num_tokens) + draw(st.integers(0, 7))
    base = {
        "layout": layout,
        "cp_size": draw(st.integers(1, 4)),
        "cp_mode": draw(st.sampled_from(["zigzag", "contiguous"])),
        "tp_size": draw(st.integers(1, 4)),
        "pad_multiple": draw(st.integers(1, 3)),
        "sequence_parallel": draw(st.booleans()),
        "max_seqlen": max_seqlen,
    }
    top_k = draw(st.integers(1, 4))
    geometry = (draw(st.integers(1, 3)), top_k, draw(st.integers(top_k, 16)))
    policy = draw(st.sampled_from(["spread", "fill"]))
    return num_tokens, base, geometry, policy


def check_one_rank(plan, num_tokens, geometry, policy):
    """Check one rank's plan; return its token tensor (token positions, -1 for padding)."""
    n_layers, top_k, num_experts = geometry
    routes, _ = encode_routes(num_tokens, n_layers, top_k)
    tokens = apply_plan(plan, np.arange(sum(num_tokens)), fill_value=-1)
    out, mask = apply_routes(plan, routes, num_experts=num_experts, pad_policy=policy, fill_value=-3)
    assert tokens.shape == plan.index.shape == mask.shape
    assert out.shape == (*plan.index.shape, n_layers, top_k)
    assert out.dtype == np.int32
    # replay mask: exactly the real tokens that are not a sample's last token
    expected_mask = (tokens >= 0) & ~last_token_mask(num_tokens)[np.maximum(tokens, 0)]
    np.testing.assert_array_equal(mask, expected_mask)
    # every replayed route row sits at the position of the token it was recorded for
    np.testing.assert_array_equal(out[mask], encode(tokens[mask], n_layers, top_k))
    pads = out[~mask]
    if policy == "fill":
        assert (pads == -3).all()
    else:
        check_spread(pads, num_experts)
    return tokens


def check_reference_and_cu(plans, num_tokens):
    """Compare the pre-SP tensor of one CP rank with the naive reference; check cu_seqlens."""
    full = np.concatenate([p.index for p in plans], axis=-1)
    opts = plans[0].options
    ref = reference_full_index(num_tokens, opts)
    np.testing.assert_array_equal(full, np.array(ref).reshape(full.shape))
    cu = plans[0].cu_seqlens
    assert cu.dtype == np.int32
    assert cu[-1] == full.size
    if opts.layout == "thd":
        assert len(cu) in (len(num_tokens) + 1, len(num_tokens) + 2)
        offsets = np.concatenate(([0], np.cumsum(num_tokens)))
        for i in range(len(num_tokens)):
            seg = full[cu[i]:cu[i + 1]]
            seg = seg[seg >= 0]
            assert ((seg >= offsets[i]) & (seg < offsets[i + 1])).all()
        assert (full[cu[len(num_tokens)]:] == -1).all()
    else:
        assert len(cu) == len(num_tokens) + 1


@settings(max_examples=300, deadline=None)
@given(batches())
def test_parity_property(batch):
    num_tokens, base, geometry, policy = batch
    opts = LayoutOptions(**base)
    seen = []
    for cp_rank in range(opts.cp_size):
        tp_plans = [
            plan_layout(num_tokens, opts, cp_rank=cp_rank, tp_rank=tp_rank) for tp_rank in range(opts.tp_size)
        ]
        tp_tokens = [check_one_rank(p, num_tokens, geometry, policy) for p in tp_plans]
        if opts.sequence_parallel:
            assert [p.sp_range for p in tp_plans] == sorted({p.sp_range for p in tp_plans})
            check_reference_and_cu(tp_plans, num_tokens)
            seen.extend(t[t >= 0] for t in tp_tokens)
        else:
            for t in tp_tokens[1:]:
                np.testing.assert_array_equal(t, tp_tokens[0])
            check_reference_and_cu(tp_plans[:1], num_tokens)
            seen.append(tp_tokens[0][tp_tokens[0] >= 0])
    # reassembling all CP (and SP) ranks recovers every token exactly once
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(sum(num_tokens)))


def test_options_resolve_merges_keywords_and_refuses_conflicts():
    opts = LayoutOptions(cp_size=2, cp_rank=1)
    assert LayoutOptions.resolve(None) == LayoutOptions()
    assert LayoutOptions.resolve(opts) is opts
    assert LayoutOptions.resolve({"cp_size": 2, "cp_rank": 1}) == opts
    assert LayoutOptions.resolve(opts, tp_size=2, cp_rank=1) == LayoutOptions(cp_size=2, cp_rank=1, tp_size=2)
    assert LayoutOptions.resolve(opts, layout=None, max_seqlen=None) is opts  # None: not given
    with pytest.raises(LayoutOptionError, match="cp_rank=0: given as a keyword and as 1 in options"):
        LayoutOptions.resolve(opts, cp_rank=0)
    with pytest.raises(LayoutOptionError, match="given as a keyword and as 1 in options"):
        LayoutOptions.resolve({"tp_size": 1}, tp_size=2)  # a dict says exactly which fields it sets
    with pytest.raises(LayoutOptionError, match="options"):
        LayoutOptions.resolve("thd")  # type: ignore[arg-type]
    with pytest.raises(LayoutOptionError, match="cp_sise"):
        LayoutOptions.resolve({"cp_sise": 2})


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
def test_apply_routes_missing_on_a_batch_without_rows(layout: str) -> None:
    """Finding: ``apply_routes(..., missing=<0 rows>)`` on samples of 1 token raised IndexError."""
    plan = plan_layout([1, 1], LayoutOptions(layout=layout))
    out, mask = apply_routes(plan, np.zeros((0, 3, 2), np.int32), num_experts=8, missing=np.zeros(0, bool))
    ref, ref_mask = apply_routes(plan, np.zeros((0, 3, 2), np.int32), num_experts=8)
    assert np.array_equal(out, ref)
    assert np.array_equal(mask, ref_mask)
    assert not mask.any()
