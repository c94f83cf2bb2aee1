"""The real FLAME-MoE-290M trace (64 experts, top-6, MoE decoder layers 2..9) through the
writer -- as numpy arrays and as real SGLang base64 payloads -- and back, bit for bit."""

from __future__ import annotations

import base64
import math
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest
import zarr

import r3store

FILE = "flame_moe_290m_prefill_2048tok_8layers_top6.npz"
SPEC = r3store.ModelSpec(num_layers=10, num_experts=64, top_k=6, moe_layers=range(2, 10))


@pytest.fixture(scope="module")
def trace() -> np.ndarray:
    with files("r3store.data").joinpath("flame-moe-290m", FILE).open("rb") as f, np.load(f, allow_pickle=False) as npz:
        ids = npz["expert_ids"].copy()
        layers = npz["layers"].copy()
    assert ids.shape == (2048, 8, 6)
    assert ids.dtype == np.int16
    assert layers.tolist() == list(range(2, 10))
    return ids


@pytest.fixture(scope="module")
def samples(trace: np.ndarray) -> dict[str, np.ndarray]:
    """Sequence i = trace rows [64 i, 64 i + 63): 63 rows for 64 tokens (no row for the last token)."""
    return {f"flame-{i:02d}": trace[64 * i : 64 * i + 63] for i in range(32)}


def sglang_payload(moe: np.ndarray) -> str:
    """What SGLang sends: all 10 decoder layers (0 and 1 as zero rows), int32 LE, base64."""
    full = np.zeros((moe.shape[0], SPEC.num_layers, SPEC.top_k), dtype=moe.dtype)
    full[:, 2:] = moe
    payload = r3store.encode_sglang(full)
    raw = base64.b64decode(payload)
    assert len(raw) == moe.shape[0] * 10 * 6 * 4
    np.testing.assert_array_equal(np.frombuffer(raw, "<i4").reshape(-1, 10, 6), full)  # independent decode
    return payload


def write_flame(url: str, samples: dict[str, np.ndarray], **kwargs) -> None:
    with r3store.RouteWriter(url, SPEC, **kwargs) as w:
        for i, (sid, moe) in enumerate(samples.items()):
            meta = {"seq": i}
            if i < 16:
                w.append(sid, moe, num_tokens=64, metadata=meta)  # int16, MoE layers only
            elif i == 31:  # the whole meta_info dict, as SGLang's /generate returns it
                meta_info = {"routed_experts": sglang_payload(moe), "prompt_tokens": 64, "completion_tokens": 0,
                             "e2e_latency": 0.05, "id": "abc"}
                w.append_sglang(sid, meta_info, num_tokens=64, metadata=meta)
            else:
                w.append_sglang(sid, sglang_payload(moe), num_tokens=64, metadata=meta)


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_flame_round_trip(backend, tmp_path: Path, memory_url: str, samples) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    write_flame(url, samples)
    store = r3store.open_store(url)
    assert store.spec == SPEC
    assert store.sample_ids == list(samples)
    assert store.samples.column("num_tokens").to_pylist() == [64] * 32
    assert store.samples.column("num_rows").to_pylist() == [63] * 32
    assert store.samples.column("seq").to_pylist() == list(range(32))
    for sid, moe in samples.items():
        got = store.get(sid)
        assert got.dtype == np.int32
        assert got.shape == (63, 8, 6)
        np.testing.assert_array_equal(got, moe)
        np.testing.assert_array_equal(store.get(sid, layers=[9, 2]), moe[:, [7, 0]])
        np.testing.assert_array_equal(store.get(sid, layers=range(4, 7), rows=slice(10, 50)), moe[10:50, 2:5])
    with pytest.raises(r3store.errors.LayerError, match="decoder layer 1"):
        store.get("flame-00", layers=[1])  # dense in this spec


def test_flame_zarr_view_and_size(tmp_path: Path, samples) -> None:
    write_flame(str(tmp_path), samples, chunk_rows=128, object_bytes=4096)
    store = r3store.open_store(tmp_path)
    arrays = {}
    for row in store.samples.to_pylist():
        arr = arrays.get(row["array"])
        if arr is None:
            arr = arrays[row["array"]] = zarr.open_array(str(tmp_path / row["array"]), mode="r")
        assert arr.shape == (32 * 63, 8, 6)
        got = arr[row["row_start"] : row["row_start"] + row["num_rows"]]
        np.testing.assert_array_equal(got, samples[row["sample_id"]])
    (arr,) = arrays.values()
    np.testing.assert_array_equal(arr[:], np.concatenate(list(samples.values())))
    np.testing.assert_array_equal(arr[100:300, 5], np.concatenate(list(samples.values()))[100:300, 5])
    # 6 bits per id, plus 20 bytes per frame and the shard indexes: 16 objects of 128 rows
    objects = [p for p in (tmp_path / store.samples.column("array")[0].as_py() / "c").rglob("*") if p.is_file()]
    assert len(objects) == math.ceil(32 * 63 / 128)
    stored = sum(p.stat().st_size for p in objects)
    ideal = 32 * 63 * 8 * 6 * math.ceil(math.log2(64)) / 8
    assert ideal <= stored <= ideal * 1.1, (stored, ideal)


def test_flame_trace_facts(trace: np.ndarray) -> None:
    """The trace is what NOTICE.md says: ids in [0, 63], no row repeats an expert."""
    assert trace.min() == 0
    assert trace.max() == 63
    ordered = np.sort(trace, axis=-1)
    assert not (ordered[..., 1:] == ordered[..., :-1]).any()
