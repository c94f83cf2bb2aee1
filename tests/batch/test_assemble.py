"""Rank-local reads and output dtypes of ``assemble`` (issue 10, items 1, 2 and 5).

The oracle is the layout of the whole micro-batch as it was computed before rank-local
reads existed: every sample read whole (``RouteReader.get``), then laid out by
``r3store.layout.apply_routes``. Bytes are counted at the storage layer
(:class:`r3store.testing.counting.CountingBackend`), memory with tracemalloc.
"""

from __future__ import annotations

import dataclasses
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import r3store
from r3store import open_store
from r3store.batch import assemble, route_dtype
from r3store.errors import LayoutOptionError, OptionError
from r3store.layout import LayoutOptions, apply_routes, plan_layout
from r3store.storage import REMOTE_COALESCE_GAP, open_backend
from r3store.testing.counting import CountingBackend

SPEC = r3store.ModelSpec(num_layers=7, num_experts=16, top_k=4, moe_layers=[1, 2, 3, 4, 6])


def _routes(rng: np.random.Generator, rows: int, spec: r3store.ModelSpec = SPEC) -> np.ndarray:
    keys = rng.random((rows, spec.num_moe_layers, spec.num_experts))
    return np.argsort(keys, axis=-1)[..., : spec.top_k].astype(np.int32)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two commits of samples of 1..90 tokens, small chunks (8 rows, 2 layers) and objects,
    one sample with missing rows."""
    path = tmp_path_factory.mktemp("ranklocal")
    rng = np.random.default_rng(3)
    ids = []
    for w in range(2):
        with r3store.RouteWriter(path, SPEC,
                                 config={"chunk_rows": 8, "layers_per_chunk": 2, "object_bytes": 300}) as writer:
            for i in range(7):
                sid = f"w{w}s{i}"
                n = int(rng.integers(1, 90)) if i else 61
                routes = _routes(rng, n - 1)
                if w == 0 and i == 0:
                    routes[5:17] = -1  # rows the engine could not capture
                writer.append(sid, routes, allow_missing=True)
                ids.append(sid)
    return path, ids


def _reference(reader: r3store.RouteReader, ids: list[str], opts: LayoutOptions, layers: Any = None,
               pad_policy: Any = "spread", fill_value: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Today's (pre rank-local) batch: read every sample whole, lay the batch out."""
    spec = reader.spec
    parts = [reader.get(s, layers) for s in ids]
    routes = np.concatenate(parts)
    missing = np.concatenate([np.zeros(len(p), bool) for p in parts])
    at = 0
    for s, p in zip(ids, parts, strict=True):
        for a, b in reader.missing_rows(s):
            missing[at + a : at + b] = True
        at += len(p)
    plan = plan_layout([reader.num_tokens(s) for s in ids], opts)
    return apply_routes(plan, routes, num_experts=spec.num_experts, pad_policy=pad_policy, fill_value=fill_value,
                        missing=missing)


LAYOUT_CASES = [
    *[{"layout": lay, "cp_size": cp, "cp_rank": r, "cp_mode": mode}
      for lay in ("thd", "bshd", "sbhd") for cp, mode in ((1, "zigzag"), (2, "zigzag"), (3, "zigzag"),
                                                          (2, "contiguous")) for r in range(cp)],
    *[{"layout": lay, "tp_size": 3, "tp_rank": r, "sequence_parallel": True, "pad_multiple": 2}
      for lay in ("thd", "bshd", "sbhd") for r in range(3)],
    *[{"layout": "thd", "cp_size": 2, "cp_rank": c, "tp_size": 2, "tp_rank": t, "sequence_parallel": True}
      for c in range(2) for t in range(2)],
    {"layout": "bshd", "max_seqlen": 100, "tp_size": 2},
]


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("layers", [None, [6, 2], [3]])
def test_rank_local_equals_full_layout(store, case: dict[str, Any], layers: Any) -> None:
    path, ids = store
    reader = r3store.open_store(path)
    opts = LayoutOptions.from_dict(case)
    batch_ids = [ids[0], ids[3], ids[9], ids[4], ids[13]]  # both commits, out of store order
    want, mask = _reference(reader, batch_ids, opts, layers)
    got = assemble(reader, batch_ids, opts, layers=layers)
    assert got["routes"].dtype == np.int32
    np.testing.assert_array_equal(got["routes"], want)
    np.testing.assert_array_equal(got["replay_mask"], mask)
    if opts.layout == "sbhd":  # sequence first: the batch-first layout transposed (pad ids: fill)
        bshd_opts = LayoutOptions.from_dict({**case, "layout": "bshd"})
        fill = {"pad_policy": "fill", "fill_value": -1}
        bshd = assemble(reader, batch_ids, dataclasses.replace(bshd_opts, **fill), layers=layers)
        sbhd = assemble(reader, batch_ids, dataclasses.replace(opts, **fill), layers=layers)
        np.testing.assert_array_equal(sbhd["routes"], bshd["routes"].transpose(1, 0, 2, 3))
        np.testing.assert_array_equal(got["replay_mask"], bshd["replay_mask"].T)


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
def test_sp_rank_is_a_slice_of_the_whole(store, layout: str) -> None:
    path, ids = store
    reader = r3store.open_store(path)
    fill = {"pad_policy": "fill", "fill_value": -1}  # spread pad ids are numbered over each rank's output
    whole = assemble(reader, ids[:6], {"layout": layout, "tp_size": 4, **fill})["routes"]
    parts = [assemble(reader, ids[:6], {"layout": layout, "tp_size": 4, "tp_rank": r, "sequence_parallel": True,
                                        **fill})
             for r in range(4)]
    axis = 0 if layout in ("thd", "sbhd") else 1
    np.testing.assert_array_equal(np.concatenate([p["routes"] for p in parts], axis=axis), whole)


def test_sbhd_tokens_follow_routes(store) -> None:
    path, ids = store
    reader = r3store.open_store(path)
    batch_ids = ids[1:4]
    tokens = [np.arange(reader.num_tokens(s)) + 1000 * i for i, s in enumerate(batch_ids)]
    # stored without tokens: no hash to check, the row count is
    sb = assemble(reader, batch_ids, {"layout": "sbhd", "cp_size": 2, "cp_rank": 1}, tokens=tokens)
    bs = assemble(reader, batch_ids, {"layout": "bshd", "cp_size": 2, "cp_rank": 1}, tokens=tokens)
    np.testing.assert_array_equal(sb["tokens"], bs["tokens"].T)
    assert sb["routes"].shape[:2] == sb["tokens"].shape == sb["replay_mask"].shape


@pytest.mark.parametrize("dtype", ["int32", "int16", "uint8", "auto", np.int16, np.dtype("uint8")])
@pytest.mark.parametrize("case", [{"layout": "thd", "cp_size": 2, "cp_rank": 1}, {"layout": "bshd"},
                                  {"layout": "sbhd", "tp_size": 2, "tp_rank": 1, "sequence_parallel": True}])
@pytest.mark.parametrize("pad", [("spread", -1), ("fill", 7), ("fill", -1)])
def test_dtype_equals_int32_cast(store, dtype: Any, case: dict[str, Any], pad: tuple[str, int]) -> None:
    path, ids = store
    reader = r3store.open_store(path)
    pad_policy, fill = pad
    if pad == ("fill", -1) and np.dtype("uint8" if dtype == "auto" else dtype) == np.uint8 and dtype != "auto":
        with pytest.raises(LayoutOptionError, match="fill_value"):
            assemble(reader, ids[:4], {**case, "dtype": dtype, "pad_policy": "fill", "fill_value": fill})
        return
    ref = assemble(reader, ids[:4], {**case, "pad_policy": pad_policy, "fill_value": fill})["routes"]
    got = assemble(reader, ids[:4], {**case, "dtype": dtype, "pad_policy": pad_policy, "fill_value": fill})["routes"]
    want_dtype = route_dtype(dtype, SPEC.num_experts, pad_policy=pad_policy, fill_value=fill)  # type: ignore[arg-type]
    assert got.dtype == want_dtype
    np.testing.assert_array_equal(got, ref.astype(want_dtype))
    np.testing.assert_array_equal(got.astype(np.int32), ref)


def test_route_dtype_choices() -> None:
    assert route_dtype("auto", 128) == np.uint8
    assert route_dtype("auto", 256) == np.uint8
    assert route_dtype("auto", 257) == np.int16
    assert route_dtype("auto", 128, pad_policy="fill", fill_value=-1) == np.int16
    assert route_dtype("auto", 128, pad_policy="fill", fill_value=200) == np.uint8
    assert route_dtype("auto", 40000) == np.int32
    assert route_dtype("int16", 128, pad_policy="fill", fill_value=-1) == np.int16
    with pytest.raises(OptionError, match=r"dtype.*expert id 256"):
        route_dtype("uint8", 257)
    with pytest.raises(OptionError, match=r"dtype.*one of"):
        route_dtype("float32", 8)
    with pytest.raises(OptionError, match=r"dtype.*one of"):
        route_dtype("int8", 8)
    with pytest.raises(LayoutOptionError, match=r"fill_value.*int16"):
        route_dtype("int16", 8, pad_policy="fill", fill_value=40000)


def test_dataset_dtype_and_sbhd(store) -> None:
    torch = pytest.importorskip("torch")
    path, _ = store
    ds = r3store.RouteDataset(path, max_tokens_per_batch=200,
                              options={"dtype": "auto", "layout": "sbhd", "cp_size": 2, "cp_rank": 1})
    reader = r3store.open_store(path)
    n = 0
    for batch in ds:
        assert batch["routes"].dtype == torch.uint8
        ref = assemble(reader, batch["sample_ids"], {"layout": "sbhd", "cp_size": 2, "cp_rank": 1})
        np.testing.assert_array_equal(batch["routes"].numpy(), ref["routes"].astype(np.uint8))
        n += 1
    assert n == len(ds) > 1
    with pytest.raises(OptionError, match="dtype"):
        r3store.RouteDataset(path, options={"dtype": "uint4"})


def test_store_assemble_passes_dtype(store) -> None:
    path, ids = store
    got = r3store.open_store(path).assemble(ids[:3], options={"dtype": "int16", "layout": "sbhd"})
    assert got["routes"].dtype == np.int16


# -- bytes fetched and memory, per rank, at realistic sizes -----------------------------------------

BIG = r3store.ModelSpec(num_layers=8, num_experts=128, top_k=8, moe_layers=list(range(8)))


def _packed_bytes(rows: int, spec: r3store.ModelSpec, layers: int | None = None) -> float:
    return rows * (layers or spec.num_moe_layers) * spec.top_k * spec.bits_per_id / 8


@pytest.fixture(scope="module")
def big_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """8 samples of 8K..16K tokens (128 experts, top-8, 8 MoE layers) at the default geometry."""
    path = tmp_path_factory.mktemp("bigranklocal")
    rng = np.random.default_rng(5)
    ids = []
    with r3store.RouteWriter(path, BIG) as writer:
        for i in range(8):
            n = [8192, 16384, 12000, 8200, 16384, 9999, 8192, 15000][i]
            writer.append(f"b{i}", _routes(rng, n - 1, BIG))
            ids.append(f"b{i}")
    return path, ids


RANK_CASES = [{"cp_size": 8}, {"tp_size": 8, "sequence_parallel": True}, {"cp_size": 8, "cp_mode": "contiguous"},
              {"cp_size": 4, "tp_size": 2, "sequence_parallel": True}]


def _ranks(case: dict[str, Any]) -> list[dict[str, Any]]:
    cps, tps = range(case.get("cp_size", 1)), range(case.get("tp_size", 1) if case.get("sequence_parallel") else 1)
    return [{**case, "cp_rank": c, "tp_rank": t} for c in cps for t in tps]


@pytest.mark.parametrize("gap", [0, REMOTE_COALESCE_GAP], ids=["local", "remote-gap"])
@pytest.mark.parametrize("case", RANK_CASES, ids=["cp8", "tp8sp", "cp8contig", "cp4tp2sp"])
def test_rank_fetches_at_most_1_5x_its_packed_rows(big_store, case: dict[str, Any], gap: int) -> None:
    """Every batch of 8K..16K-token samples (one sample, or four): each rank's reader fetches at
    most 1.5x the packed size of its own rows (its object indexes already read: a reader is
    long-lived, and an index serves every batch of its storage object); also with the holes
    object stores read through (``coalesce_gap``)."""
    path, ids = big_store
    counting = CountingBackend(open_backend(str(path)))
    counting.coalesce_gap = gap
    for batch_ids in (ids[:4], ids[4:], *([s] for s in ids)):
        for opts in _ranks(case):
            reader = r3store.open_store(counting)
            assemble(reader, ids, None, layers=[0])  # reads the arrays' documents and object indexes
            counting.reset()
            batch = assemble(reader, batch_ids, opts)
            own = _packed_bytes(int(batch["replay_mask"].sum()), BIG)
            assert counting.bytes_read <= 1.5 * own, (opts, batch_ids, counting.bytes_read / own)


@pytest.mark.parametrize("gap", [0, REMOTE_COALESCE_GAP], ids=["local", "remote-gap"])
@pytest.mark.parametrize("case", RANK_CASES, ids=["cp8", "tp8sp", "cp8contig", "cp4tp2sp"])
def test_rank_fetches_within_bound_from_a_fresh_reader(big_store, case: dict[str, Any], gap: int) -> None:
    """The issue's case, 4 samples of 8K..16K tokens, from a fresh reader: array document and
    object index counted too."""
    path, ids = big_store
    counting = CountingBackend(open_backend(str(path)))
    counting.coalesce_gap = gap
    for opts in _ranks(case):
        reader = r3store.open_store(counting)
        counting.reset()
        batch = assemble(reader, ids[:4], opts)
        own = _packed_bytes(int(batch["replay_mask"].sum()), BIG)
        assert counting.bytes_read <= 1.5 * own, (opts, counting.bytes_read / own)


def test_single_rank_read_requests_not_more_than_samples(big_store) -> None:
    """CP=1: the whole batch of one commit's samples comes in one ranged request per storage object."""
    path, ids = big_store
    counting = CountingBackend(open_backend(str(path)))
    reader = r3store.open_store(counting)
    reader.geometry_of(reader.row(ids[0])["array"])
    counting.reset()
    assemble(reader, ids[:4], None)
    geometry = reader.geometry_of(reader.row(ids[0])["array"])
    rows = sum(reader.num_tokens(s) - 1 for s in ids[:4])
    objects = -(-rows // geometry.object_rows) + 1
    assert counting.requests <= 2 * objects  # each object: its index + one coalesced range


def test_pipeline_stage_read_on_an_object_store_merges_the_holes(big_store) -> None:
    """A pipeline stage's layers are one layer chunk of each 128-row chunk: on local disk one
    ranged read per frame, on an object store (``coalesce_gap``) the holes between them are read
    through, so a batch costs about one request per storage object, not one per row chunk."""
    path, ids = big_store
    stage = [4, 5, 6, 7]  # the second layer chunk of the 8 MoE layers
    counts = {}
    for gap in (0, REMOTE_COALESCE_GAP):
        counting = CountingBackend(open_backend(str(path)))
        counting.coalesce_gap = gap
        reader = r3store.open_store(counting)
        assemble(reader, ids, None, layers=[0])  # documents and object indexes
        counting.reset()
        batch = assemble(reader, ids[:4], None, layers=stage)
        counts[gap] = counting.requests, counting.bytes_read
        np.testing.assert_array_equal(batch["routes"], _reference(reader, ids[:4], LayoutOptions(), stage)[0])
    reader = r3store.open_store(path)
    geometry = reader.geometry_of(reader.row(ids[0])["array"])
    rows = sum(reader.num_tokens(s) - 1 for s in ids[:4])
    objects = -(-rows // geometry.object_rows) + 1
    assert counts[0][0] >= rows // geometry.chunk_rows  # one per frame without holes read through
    assert counts[REMOTE_COALESCE_GAP][0] <= objects
    assert counts[REMOTE_COALESCE_GAP][1] <= 2.2 * _packed_bytes(rows, BIG)  # at most the whole samples' frames


def test_object_stores_read_through_holes_local_disk_does_not(tmp_path: Path) -> None:
    assert open_backend(str(tmp_path)).coalesce_gap == 0
    assert open_backend("memory://gap-test").coalesce_gap == 0
    assert REMOTE_COALESCE_GAP > 0


@pytest.mark.parametrize("case", [{"cp_size": 8, "cp_rank": 3},
                                  {"tp_size": 8, "tp_rank": 5, "sequence_parallel": True}])
def test_rank_peak_memory_bounded_by_its_output(big_store, case: dict[str, Any]) -> None:
    path, ids = big_store
    reader = r3store.open_store(path)
    reader.cache_bytes = 0
    assemble(reader, ids[:1], case)  # warm up imports and indexes
    tracemalloc.start()
    try:
        batch = assemble(reader, ids[:4], case)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = batch["routes"].nbytes
    full = sum(reader.num_tokens(s) - 1 for s in ids[:4]) * BIG.num_moe_layers * BIG.top_k * 4
    assert peak <= 2.6 * out + (4 << 20), (peak, out, full)
    assert peak < full / 2


# -- packed to the device --------------------------------------------------------------------------

@pytest.mark.parametrize("bits", range(1, 17))
def test_unpack_routes_every_width(bits: int) -> None:
    torch = pytest.importorskip("torch")
    from r3store.codecs import kernels
    from r3store.dataset import unpack_routes

    rng = np.random.default_rng(bits)
    for shape in ((1, 1, 1), (3, 5, 7), (13, 2, 6), (64, 4, 8)):  # odd sizes: n % 8 != 0
        ids = rng.integers(0, 1 << bits, shape)
        packed = kernels.pack_bits(ids, bits)
        assert packed.nbytes == -(-ids.size * bits // 8)
        got = unpack_routes(torch.from_numpy(packed), bits, shape)
        assert got.dtype == torch.int32
        assert tuple(got.shape) == shape
        np.testing.assert_array_equal(got.numpy(), ids)
        np.testing.assert_array_equal(got.numpy().reshape(-1), kernels.unpack_bits(packed, ids.size, bits))


@pytest.mark.parametrize("case", [{"layout": "thd", "cp_size": 2, "cp_rank": 1}, {"layout": "bshd"},
                                  {"layout": "sbhd", "tp_size": 3, "tp_rank": 2, "sequence_parallel": True}])
@pytest.mark.parametrize("pad", [("spread", -1), ("fill", 3), ("fill", 300)])
def test_packed_batch_unpacks_to_the_routes(store, case: dict[str, Any], pad: tuple[str, int]) -> None:
    torch = pytest.importorskip("torch")
    from r3store.dataset import batch_to_tensors, unpack_routes

    path, ids = store
    reader = r3store.open_store(path)
    pad_policy, fill = pad
    want = assemble(reader, ids[:5], {**case, "pad_policy": pad_policy, "fill_value": fill})
    got = assemble(reader, ids[:5], {**case, "pad_policy": pad_policy, "fill_value": fill, "packed": True})
    bits = got["routes_bits"]
    assert bits == (SPEC.bits_per_id if pad_policy == "spread" else max(SPEC.bits_per_id, fill.bit_length()))
    assert got["routes_shape"] == want["routes"].shape
    assert got["routes"].dtype == np.uint8
    assert got["routes"].nbytes == -(-want["routes"].size * bits // 8)  # bits/32 of int32's bytes
    tensors = batch_to_tensors(got)
    routes = unpack_routes(tensors["routes"], tensors["routes_bits"], tensors["routes_shape"], dtype=torch.int64)
    np.testing.assert_array_equal(routes.numpy(), want["routes"])
    np.testing.assert_array_equal(got["replay_mask"], want["replay_mask"])


def test_packed_refuses_a_negative_fill(store) -> None:
    path, ids = store
    with pytest.raises(LayoutOptionError, match="fill_value"):
        assemble(r3store.open_store(path), ids[:2], {"pad_policy": "fill", "fill_value": -1, "packed": True})
    with pytest.raises(LayoutOptionError, match="fill_value"):
        r3store.RouteDataset(path, options={"pad_policy": "fill", "fill_value": -1, "packed": True})


def test_dataset_packed(store) -> None:
    torch = pytest.importorskip("torch")
    from r3store.dataset import unpack_routes

    path, _ = store
    reader = r3store.open_store(path)
    for batch in r3store.RouteDataset(path, max_tokens_per_batch=150,
                                      options={"packed": True, "cp_size": 2, "cp_rank": 0}):
        ref = assemble(reader, batch["sample_ids"], {"cp_size": 2, "cp_rank": 0})["routes"]
        got = unpack_routes(batch["routes"], batch["routes_bits"], batch["routes_shape"])
        assert got.dtype == torch.int32
        np.testing.assert_array_equal(got.numpy(), ref)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rank_local_matches_full_layout_on_random_batches(store, data: st.DataObject) -> None:
    path, ids = store
    reader = r3store.open_store(path)
    batch_ids = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=6, unique=True))
    layout = data.draw(st.sampled_from(["thd", "bshd", "sbhd"]))
    cp = data.draw(st.integers(1, 4))
    tp = data.draw(st.integers(1, 3))
    opts = LayoutOptions(layout=layout, cp_size=cp, cp_rank=data.draw(st.integers(0, cp - 1)),
                         cp_mode=data.draw(st.sampled_from(["zigzag", "contiguous"])), tp_size=tp,
                         tp_rank=data.draw(st.integers(0, tp - 1)), sequence_parallel=data.draw(st.booleans()),
                         pad_multiple=data.draw(st.integers(1, 3)))
    layers = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(SPEC.moe_layers), min_size=1, unique=True)))
    dtype = data.draw(st.sampled_from(["int32", "int16", "uint8"]))
    want, mask = _reference(reader, batch_ids, opts, layers)
    got = assemble(reader, batch_ids, dataclasses.replace(opts, dtype=dtype), layers=layers)
    np.testing.assert_array_equal(got["routes"], want.astype(dtype))
    np.testing.assert_array_equal(got["replay_mask"], mask)


FALLBACK_SCRIPT = """
import sys
import numpy as np
import torch
import r3store
from r3store.batch import assemble
from r3store.codecs import kernels
from r3store.dataset import unpack_routes
from torch.utils.data import DataLoader

assert kernels.IMPLEMENTATION == "numpy", kernels.IMPLEMENTATION
path, out = sys.argv[1], sys.argv[2]
reader = r3store.open_store(path)
ids = reader.sample_ids
got = {}
for name, opts in CASES.items():
    for dtype in ("int32", "int16", "uint8", "auto"):
        got[f"{name}/{dtype}"] = assemble(reader, ids, {**opts, "dtype": dtype})["routes"]
    b = assemble(reader, ids, {**opts, "packed": True})
    got[f"{name}/packed"] = unpack_routes(torch.from_numpy(b["routes"]), b["routes_bits"], b["routes_shape"]).numpy()
ds = r3store.RouteDataset(path, max_tokens_per_batch=150, options={"cp_size": 2, "cp_rank": 1, "dtype": "int16"})
for i, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
    got[f"dataset/{i}/" + ",".join(batch["sample_ids"])] = batch["routes"].numpy()
np.savez(out, **got)
"""
FALLBACK_CASES = {"cp2": {"cp_size": 2, "cp_rank": 1}, "sbhd-cp2": {"layout": "sbhd", "cp_size": 2, "cp_rank": 0},
                  "tp2sp": {"tp_size": 2, "tp_rank": 1, "sequence_parallel": True}}


def test_cp_dtype_and_packed_paths_without_the_extension(store, tmp_path: Path) -> None:
    """With ``R3STORE_NO_NATIVE=1`` (the numpy fallback, in a fresh interpreter) CP=2, SP,
    every dtype, packed routes and DataLoader workers give today's layout."""
    import os
    import subprocess
    import sys

    path, _ = store
    root = Path(__file__).resolve().parents[2]
    script = f"CASES = {FALLBACK_CASES!r}\n" + FALLBACK_SCRIPT
    out = tmp_path / "fallback.npz"
    subprocess.run([sys.executable, "-c", script, str(path), str(out)], check=True, timeout=300, cwd=root,
                   env={**os.environ, "PYTHONPATH": str(root), "R3STORE_NO_NATIVE": "1"})
    reader = r3store.open_store(path)
    ids = reader.sample_ids
    with np.load(out, allow_pickle=False) as got:
        keys = set(got.files)
        for name, opts in FALLBACK_CASES.items():
            ref = _reference(reader, ids, LayoutOptions.resolve(opts))[0]
            for dtype in ("int32", "int16", "uint8", "auto", "packed"):
                want = ref.astype(route_dtype(dtype if dtype != "packed" else "int32", SPEC.num_experts))
                value = got[f"{name}/{dtype}"]
                assert value.dtype == want.dtype, (name, dtype)
                np.testing.assert_array_equal(value, want, err_msg=f"{name}/{dtype}")
                keys.discard(f"{name}/{dtype}")
        assert keys, "the DataLoader yielded no batch"
        for key in keys:
            batch_ids = key.split("/", 2)[2].split(",")
            want = _reference(reader, batch_ids, LayoutOptions(cp_size=2, cp_rank=1))[0].astype(np.int16)
            assert got[key].dtype == np.int16
            np.testing.assert_array_equal(got[key], want, err_msg=key)


SPEC_3X8 = r3store.ModelSpec(num_layers=3, num_experts=8, top_k=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Samples of 1 token (0 route rows) and one of 6 tokens with a missing row."""
    path = tmp_path_factory.mktemp("tiny")
    routes = np.tile(np.array([[0, 1], [2, 3], [4, 5]], np.int32), (5, 1, 1))
    routes[2] = -1
    with r3store.RouteWriter(path, SPEC_3X8, config={"chunk_rows": 2}) as writer:
        writer.append("empty", np.zeros((0, 3, 2), np.int32), num_tokens=1)
        writer.append("empty2", np.zeros((0, 3, 2), np.int32), num_tokens=1)
        writer.append("five", routes, allow_missing=True)
    return path


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
def test_assemble_zero_row_samples(tiny: Path, layout: str) -> None:
    reader = open_store(tiny)
    batch = assemble(reader, ["empty", "empty2"], {"layout": layout})
    assert not batch["replay_mask"].any()
    assert batch["routes"].shape[-2:] == (3, 2)


def test_max_seqlen_error_names_the_sample(tiny: Path) -> None:
    """Finding: an over-long sample was named by its batch position ("sample 2") only."""
    reader = open_store(tiny)
    with pytest.raises(r3store.errors.LayoutOptionError, match="sample 'five' has 6 tokens"):
        assemble(reader, ["empty", "empty2", "five"], {"layout": "sbhd", "max_seqlen": 4})


@pytest.mark.parametrize("tokens", [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], None, "abcdef", 7, [True] * 6])
def test_assemble_refuses_tokens_that_are_not_integer_ids(tiny: Path, tokens: object) -> None:
    """Finding: float token ids were truncated to int64 silently; None, a str or a scalar
    gave a misleading "len(tokens) - 1 = 0" message."""
    reader = open_store(tiny)
    with pytest.raises(r3store.errors.AlignmentError, match=r"'five'.*integer token ids"):
        assemble(reader, ["five"], tokens=[tokens])
    batch = assemble(reader, ["five"], tokens=[np.arange(6, dtype=np.uint16)])
    assert batch["tokens"][:6].tolist() == list(range(6))


def test_assemble_errors_name_the_argument_at_fault(tmp_path: Path) -> None:
    """New-user findings: ``assemble([])`` named ``num_tokens=[]``; a short ``tokens`` list named
    sample ``'<batch>'``."""
    from r3store.errors import AlignmentError, OptionError
    from tests.routes import make_store

    make_store(tmp_path / "s", n=2, rows=10)
    store = r3store.open_store(tmp_path / "s")
    with pytest.raises(OptionError, match=r"^sample_ids=\[\]: is empty") as empty:
        store.assemble([])
    assert empty.value.option == "sample_ids"
    with pytest.raises(AlignmentError, match=r"^tokens has 1 entry for 2 sample\(s\) in sample_ids") as short:
        store.assemble(["s0", "s1"], tokens=[np.arange(11)])
    assert short.value.sample_id is None
    assert "<batch>" not in str(short.value)
