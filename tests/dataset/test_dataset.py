"""RouteDataset: batching, exactly-once delivery, pad rows, resumption, assemble parity."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import r3store
from r3store.errors import AlignmentError, LayerError, LayoutOptionError, ResumeError
from r3store.layout import LayoutOptions
from tests.routes import SPEC_4X16, routes_4x16

SPEC = r3store.ModelSpec(num_layers=6, num_experts=16, top_k=4, moe_layers=[1, 2, 4, 5])


def _routes(rng: np.random.Generator, rows: int) -> np.ndarray:
    keys = rng.random((rows, SPEC.num_moe_layers, SPEC.num_experts))
    return np.argsort(keys, axis=-1)[..., : SPEC.top_k].astype(np.int32)


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A store of 40 samples of 1..120 tokens (one of 700), written by two writers."""
    path = tmp_path_factory.mktemp("ds")
    rng = np.random.default_rng(7)
    source, tokens = {}, {}
    lengths = [int(n) for n in rng.integers(1, 120, size=39)] + [700]
    for w in range(2):
        with r3store.RouteWriter(path, SPEC, config={"chunk_rows": 32}) as writer:
            for i, n in enumerate(lengths):
                if i % 2 != w:
                    continue
                sid = f"s{i:03d}"
                source[sid] = _routes(rng, n - 1)
                tokens[sid] = rng.integers(0, 50_000, size=n)
                writer.append(sid, source[sid], tokens=tokens[sid], metadata={"i": i})
    return path, source, tokens


def _check_batch(batch: dict[str, Any], source: dict[str, np.ndarray]) -> None:
    assert batch["routes"].dtype == torch.int32
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["replay_mask"].dtype == torch.bool
    cu = batch["cu_seqlens"].numpy()
    assert cu[0] == 0
    assert len(cu) == len(batch["sample_ids"]) + 1
    assert batch["routes"].shape == (cu[-1], SPEC.num_moe_layers, SPEC.top_k)
    routes, mask = batch["routes"].numpy(), batch["replay_mask"].numpy()
    for j, sid in enumerate(batch["sample_ids"]):
        seg, seg_mask = routes[cu[j] : cu[j + 1]], mask[cu[j] : cu[j + 1]]
        assert len(seg) == len(source[sid]) + 1
        np.testing.assert_array_equal(seg[:-1], source[sid])
        assert seg_mask[:-1].all()
        assert not seg_mask[-1]


def _pad_bound_holds(batch: dict[str, Any]) -> bool:
    routes, mask = batch["routes"].numpy(), batch["replay_mask"].numpy()
    pads = routes[~mask]
    bound = math.ceil(len(pads) * SPEC.top_k / SPEC.num_experts) + 1
    for layer in range(pads.shape[1]):
        ids = pads[:, layer]
        assert ((ids >= 0) & (ids < SPEC.num_experts)).all()
        assert all(len(set(row)) == SPEC.top_k for row in ids.tolist())
        if np.bincount(ids.reshape(-1), minlength=SPEC.num_experts).max() > bound:
            return False
    return True


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dp_size", [1, 3])
def test_every_sample_exactly_once_across_ranks_and_workers(store_dir, dp_size: int, num_workers: int) -> None:
    path, source, _ = store_dir
    seen: Counter[str] = Counter()
    for dp_rank in range(dp_size):
        ds = r3store.RouteDataset(path, max_tokens_per_batch=256, shuffle=True, seed=3, dp_rank=dp_rank,
                                  dp_size=dp_size)
        for batch in DataLoader(ds, batch_size=None, num_workers=num_workers):
            _check_batch(batch, source)
            assert _pad_bound_holds(batch)
            seen.update(batch["sample_ids"])
    assert seen == Counter(list(source))


def test_order_does_not_depend_on_num_workers(store_dir) -> None:
    path, _, _ = store_dir
    orders = []
    for workers in (0, 1, 2):
        ds = r3store.RouteDataset(path, max_tokens_per_batch=200, shuffle=True, seed=11)
        orders.append([b["sample_ids"] for b in DataLoader(ds, batch_size=None, num_workers=workers)])
    assert all(order == orders[0] for order in orders)


def test_token_budget_and_long_sample_alone(store_dir) -> None:
    path, _source, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=256)
    batches = list(ds)
    for batch in batches:
        total = int(batch["num_tokens"].sum())
        assert total <= 256 or len(batch["sample_ids"]) == 1
    alone = [b for b in batches if "s039" in b["sample_ids"]]
    assert alone[0]["sample_ids"] == ["s039"]
    assert alone[0]["routes"].shape[0] == 700


def test_shuffle_changes_with_epoch_and_is_reproducible(store_dir) -> None:
    path, _, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=100, shuffle=True, seed=5)
    first = [b["sample_ids"] for b in ds]
    assert [b["sample_ids"] for b in ds] == first
    ds.set_epoch(1)
    second = [b["sample_ids"] for b in ds]
    assert second != first
    assert sorted(s for batch in second for s in batch) == sorted(s for batch in first for s in batch)


def test_layer_subset_streams_only_those_layers(store_dir) -> None:
    path, source, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=300, layers=[5, 2])
    batch = next(iter(ds))
    assert batch["layers"] == [5, 2]
    cu = batch["cu_seqlens"].numpy()
    sid = batch["sample_ids"][0]
    np.testing.assert_array_equal(batch["routes"].numpy()[cu[0] : cu[1] - 1], source[sid][:, [3, 1]])
    with pytest.raises(LayerError):
        r3store.RouteDataset(path, layers=[0])


def _resume_roundtrip(path: Path, num_workers: int, stop_after: int, epoch: int) -> None:
    def make() -> StatefulDataLoader:
        ds = r3store.RouteDataset(path, max_tokens_per_batch=150, shuffle=True, seed=1)
        ds.set_epoch(epoch)
        return StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)

    full = [b["sample_ids"] for b in make()]
    loader = make()
    it = iter(loader)
    head = [next(it)["sample_ids"] for _ in range(stop_after)]
    state = loader.state_dict()
    assert head == full[:stop_after]
    resumed = make()
    resumed.load_state_dict(state)
    tail = [b["sample_ids"] for b in resumed]
    assert tail == full[stop_after:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_resumes_mid_epoch(store_dir, num_workers: int) -> None:
    path, _, _ = store_dir
    _resume_roundtrip(path, num_workers, stop_after=3, epoch=0)
    _resume_roundtrip(path, num_workers, stop_after=4, epoch=1)


def test_state_dict_is_json_and_checks_topology(store_dir) -> None:
    import json

    path, _, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=100, dp_rank=0, dp_size=2)
    it = iter(ds)
    next(it)
    state = json.loads(json.dumps(ds.state_dict()))
    assert state["yielded"] == 1
    assert state["dp_size"] == 2
    assert state["version"] == 2
    other = r3store.RouteDataset(path, max_tokens_per_batch=100, dp_rank=1, dp_size=2)
    with pytest.raises(ResumeError, match="dp_rank"):
        other.load_state_dict(state)


def test_state_dict_of_version_1_loads(store_dir) -> None:
    """States saved before the DP rank was named dp_rank (rank/world_size) still resume."""
    path, _, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=100, dp_rank=1, dp_size=2)
    state = ds.state_dict()
    old = {k: v for k, v in state.items() if k not in ("dp_rank", "dp_size")}
    old.update(version=1, rank=1, world_size=2, yielded=2)
    ds.load_state_dict(old)
    assert ds.state_dict()["yielded"] == 2
    with pytest.raises(ResumeError, match="dp_rank"):
        ds.load_state_dict({**old, "rank": 0})


def test_rank_from_torch_distributed(store_dir, tmp_path: Path) -> None:
    import torch.distributed as dist

    path, source, _ = store_dir
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ds = r3store.RouteDataset(path, max_tokens_per_batch=500)
        assert ds.state_dict()["dp_size"] == 1
        assert sorted(s for b in ds for s in b["sample_ids"]) == sorted(source)
    finally:
        dist.destroy_process_group()


def test_assemble_matches_dataset_batch(store_dir) -> None:
    path, _, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=256,
                              options={"cp_size": 2, "cp_rank": 1, "tp_size": 2, "pad_multiple": 2})
    batch = next(iter(ds))
    store = r3store.open_store(path)
    again = store.assemble(batch["sample_ids"], return_tensors="pt",
                           options={"cp_size": 2, "cp_rank": 1, "tp_size": 2, "pad_multiple": 2})
    assert again.keys() == batch.keys()
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, again[key]), key
        else:
            assert value == again[key], key


def test_assemble_lays_tokens_and_routes_out_together(store_dir) -> None:
    path, source, tokens = store_dir
    store = r3store.open_store(path)
    ids = ["s001", "s004", "s007"]
    batch = store.assemble(ids, tokens=[tokens[s] for s in ids], return_tensors="np",
                           options={"cp_size": 2, "cp_rank": 0})
    flat_tokens = np.concatenate([tokens[s] for s in ids])
    flat_routes = np.concatenate([np.concatenate([source[s], np.full((1, 4, 4), -7)]) for s in ids])
    got = batch["tokens"]
    # a position's token id names the source positions it may come from; its route must be
    # the one recorded for one of them
    lookup: dict[int, list[int]] = {}
    for i, t in enumerate(flat_tokens):
        lookup.setdefault(int(t), []).append(i)
    for pos in np.flatnonzero(batch["replay_mask"]):
        candidates = lookup[int(got[pos])]
        assert any(np.array_equal(batch["routes"][pos], flat_routes[c]) for c in candidates)


def test_assemble_rejects_wrong_tokens(store_dir) -> None:
    path, _, tokens = store_dir
    store = r3store.open_store(path)
    bad = tokens["s002"].copy()
    bad[3] += 1
    with pytest.raises(AlignmentError, match="s002") as err:
        store.assemble(["s002"], tokens=[bad])
    assert "hash" in str(err.value)
    with pytest.raises(AlignmentError, match="s002") as err:
        store.assemble(["s002"], tokens=[np.append(tokens["s002"], 5)])
    assert "route rows" in str(err.value)
    with pytest.raises(AlignmentError):
        store.assemble(["s002"], tokens=[tokens["s002"][:-1]])


def test_to_device_moves_tensors(store_dir) -> None:
    path, _, _ = store_dir
    batch = next(iter(r3store.RouteDataset(path, max_tokens_per_batch=100)))
    moved = r3store.to_device(batch, "cpu", non_blocking=False)
    assert moved["sample_ids"] == batch["sample_ids"]
    assert torch.equal(moved["routes"], batch["routes"])


def test_pinned_memory_loader(store_dir) -> None:
    path, source, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=100)
    batch = next(iter(DataLoader(ds, batch_size=None, pin_memory=torch.cuda.is_available())))
    _check_batch(batch, source)


def test_bad_options_rejected(store_dir) -> None:
    path, _, _ = store_dir
    with pytest.raises(ValueError, match="max_tokens_per_batch"):
        r3store.RouteDataset(path, max_tokens_per_batch=0)
    with pytest.raises(r3store.errors.OptionError, match="dp_rank"):
        r3store.RouteDataset(path, dp_rank=2, dp_size=2)
    with pytest.raises(r3store.errors.LayoutOptionError):
        r3store.RouteDataset(path, options={"cp_size": 2, "cp_rank": 2})


@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_apply_plan_tensor_matches_numpy(layout: str) -> None:
    from r3store.dataset import apply_plan_tensor
    from r3store.layout import apply_plan, plan_layout

    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths = [int(n) for n in rng.integers(1, 30, size=int(rng.integers(1, 5)))]
        cp_size = int(rng.integers(1, 4))
        plan = plan_layout(lengths, layout=layout, cp_size=cp_size, cp_rank=cp_size - 1, tp_size=2,
                           sequence_parallel=True, tp_rank=1)
        tokens = rng.integers(0, 1000, size=sum(lengths))
        want = apply_plan(plan, tokens, fill_value=-5)
        got = apply_plan_tensor(plan, torch.from_numpy(tokens), fill_value=-5)
        np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(AlignmentError):
        apply_plan_tensor(plan, torch.zeros(3))


@pytest.mark.parametrize("dp_size", [2, 3, 4, 7])
def test_every_rank_steps_the_same_number_of_times(store_dir, dp_size: int) -> None:
    """Synchronous DP hangs when ranks disagree on the number of steps."""
    path, source, _ = store_dir
    for budget in (100_000, 300, 64):
        datasets = [r3store.RouteDataset(path, max_tokens_per_batch=budget, shuffle=True, dp_rank=r,
                                         dp_size=dp_size) for r in range(dp_size)]
        counts = [len(ds) for ds in datasets]
        if sum(counts) < len(source):  # splitting had room: equal counts are required
            assert len(set(counts)) == 1, (budget, counts)
        else:  # one sample per batch and too few samples for a multiple of dp_size
            assert max(counts) - min(counts) <= 1, (budget, counts)
            assert counts == sorted(counts, reverse=True), (budget, counts)
        seen = Counter(s for ds in datasets for b in ds for s in b["sample_ids"])
        assert seen == Counter(list(source))


def test_dp_size_without_dp_rank_is_an_error(store_dir) -> None:
    path, _, _ = store_dir
    with pytest.raises(r3store.errors.OptionError, match="explicit dp_rank"):
        r3store.RouteDataset(path, dp_size=4)


def test_layout_options_passed_whole(store_dir) -> None:
    """RouteDataset takes LayoutOptions (or its dict form) whole; per-field keywords merge in."""
    path, _, _ = store_dir
    options = LayoutOptions(cp_size=2, cp_rank=1, tp_size=2)
    whole = next(iter(r3store.RouteDataset(path, max_tokens_per_batch=256, options=options)))
    as_dict = next(iter(r3store.RouteDataset(path, max_tokens_per_batch=256, options=options.to_dict())))
    merged = next(iter(r3store.RouteDataset(path, max_tokens_per_batch=256,
                                            options={"cp_size": 2, "cp_rank": 1, "tp_size": 2})))
    for other in (as_dict, merged):
        assert torch.equal(whole["routes"], other["routes"])
        assert torch.equal(whole["cu_seqlens"], other["cu_seqlens"])
    with pytest.warns(r3store.errors.R3StoreDeprecationWarning, match="cp_rank"), \
            pytest.raises(r3store.errors.LayoutOptionError, match="given as a keyword"):
        r3store.RouteDataset(path, options=options, cp_rank=0)


def test_on_duplicate_passes_through(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    first, retry = _routes(rng, 4), _routes(rng, 4)
    for routes in (first, retry):
        with r3store.RouteWriter(tmp_path, SPEC) as w:
            w.append("a", routes)
    with pytest.raises(r3store.errors.DuplicateSampleError):
        r3store.RouteDataset(tmp_path)
    batch = next(iter(r3store.RouteDataset(tmp_path, reader={"on_duplicate": "first"})))
    np.testing.assert_array_equal(batch["routes"].numpy()[:-1], first)


def test_topology_is_one_frozen_object() -> None:
    from dataclasses import FrozenInstanceError

    from r3store.dataset import Topology

    top = Topology.detect(dp_rank=2, dp_size=3)
    assert (top.dp_rank, top.dp_size, top.worker, top.num_workers) == (2, 3, 0, 1)
    assert Topology.detect() == Topology()
    with pytest.raises(FrozenInstanceError):
        top.dp_rank = 0  # type: ignore[misc]
    with pytest.raises(r3store.errors.OptionError, match="dp_rank=3: must be in"):
        Topology.detect(dp_rank=3, dp_size=3)
    with pytest.raises(r3store.errors.OptionError, match="worker"):
        Topology(worker=2, num_workers=2)


def test_assemble_builds_routes_where_allocate_says(store_dir) -> None:
    from r3store.batch import assemble
    from r3store.errors import OptionError

    path, _, _ = store_dir
    reader = r3store.open_store(path)
    ids = reader.sample_ids[:5]
    buffers: list[np.ndarray] = []

    def allocate(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        buffers.append(np.full(shape, 99, dtype=dtype))
        return buffers[-1]

    for opts in ({"cp_size": 2, "cp_rank": 1}, {"layout": "bshd"}, {"layout": "sbhd", "cp_size": 2}):
        want = assemble(reader, ids, {**opts, "dtype": "int16"})["routes"]
        got = assemble(reader, ids, {**opts, "dtype": "int16"}, allocate=allocate)["routes"]
        assert np.shares_memory(got, buffers[-1])
        np.testing.assert_array_equal(got, want)
    with pytest.raises(OptionError, match="allocate"):
        assemble(reader, ids, allocate=lambda shape, dtype: np.empty(shape, dtype=np.int64))
    with pytest.raises(OptionError, match="allocate"):
        assemble(reader, ids, allocate=lambda shape, dtype: np.empty(shape[::-1], dtype=dtype).T)


def test_shared_allocator_hands_back_the_shared_tensor() -> None:
    from r3store.dataset._tensors import SharedAllocator

    allocate = SharedAllocator()
    array = allocate((5, 3, 2), np.dtype("int16"))
    array[...] = np.arange(30).reshape(5, 3, 2)
    tensor = allocate.tensor_of(array.reshape(15, 2))
    assert tensor is not None
    assert tensor.is_shared()
    assert tensor.shape == (15, 2)
    assert tensor.dtype == torch.int16
    assert tensor.data_ptr() == array.ctypes.data
    np.testing.assert_array_equal(tensor.numpy(), np.arange(30).reshape(15, 2))
    assert allocate.tensor_of(np.zeros((15, 2), np.int16)) is None  # not from this allocator


@pytest.mark.parametrize("options", [{"cp_size": 2, "cp_rank": 1, "dtype": "int16"},
                                     {"layout": "sbhd", "cp_size": 2, "cp_rank": 0, "dtype": "uint8"},
                                     {"layout": "bshd", "tp_size": 2, "tp_rank": 1, "sequence_parallel": True}])
def test_workers_yield_the_batches_of_the_main_process(store_dir, options: dict[str, Any]) -> None:
    """Workers build routes in shared memory: same batches, dtypes and shapes as 0 workers."""
    path, _, _ = store_dir
    ds = r3store.RouteDataset(path, max_tokens_per_batch=200, options=options)
    runs = [list(DataLoader(ds, batch_size=None, num_workers=w)) for w in (0, 2)]
    assert len(runs[0]) == len(runs[1]) > 1
    for a, b in zip(*runs, strict=True):
        assert a.keys() == b.keys()
        assert a["sample_ids"] == b["sample_ids"]
        for key, value in a.items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == b[key].dtype, key
                assert torch.equal(value, b[key]), key


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"options": {"pad_policy": "zeros"}}, LayoutOptionError),
    ({"options": {"pad_policy": "fill", "fill_value": "x"}}, LayoutOptionError),
    ({"options": {"pad_policy": "fill", "fill_value": 2**40}}, LayoutOptionError),
    ({"shuffle": True, "seed": -1}, ValueError),
    ({"seed": 1.5}, ValueError),
])
def test_route_dataset_checks_arguments_at_construction(small_store_dir: Path, kwargs: dict[str, Any],
                                                        exc: type) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    with pytest.raises(exc):
        RouteDataset(small_store_dir, max_tokens_per_batch=64, **kwargs)


@pytest.mark.parametrize(("key", "value"), [("yielded", -2), ("yielded", "3"), ("yielded", True), ("epoch", -1)])
def test_load_state_dict_checks_progress(small_store_dir: Path, key: str, value: Any) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    ds = RouteDataset(small_store_dir, max_tokens_per_batch=16)
    state = {**ds.state_dict(), key: value}
    with pytest.raises(ResumeError, match=key):
        ds.load_state_dict(state)


def test_load_state_dict_from_another_store_of_the_same_size(small_store_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    other = tmp_path / "other"
    with r3store.RouteWriter(other, SPEC_4X16) as w:
        for i in range(3):
            w.append(f"other{i}", routes_4x16(10, i))
    ds = RouteDataset(small_store_dir, max_tokens_per_batch=16)
    next(iter(ds))
    state = json.loads(json.dumps(ds.state_dict()))
    with pytest.raises(ResumeError, match="samples"):
        RouteDataset(other, max_tokens_per_batch=16).load_state_dict(state)
    resumed = RouteDataset(small_store_dir, max_tokens_per_batch=16)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == len(resumed) - 1
