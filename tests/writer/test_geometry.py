"""Default chunk geometry: many-layer specs get inner chunks sized by bytes, and they read back whole."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.writer._commit import default_layers_per_chunk


def spec_of(moe: int, experts: int, top_k: int = 8, dense: int = 3) -> r3store.ModelSpec:
    return r3store.ModelSpec(num_layers=moe + dense, num_experts=experts, top_k=top_k,
                             moe_layers=list(range(dense, moe + dense)))


@pytest.mark.parametrize(
    ("moe", "experts", "codec", "want"),
    [(58, 256, "bitpack", 2), (61, 256, "bitpack", 2), (59, 256, "bitpack", 4), (92, 160, "bitpack", 4),
     (58, 256, "set", 2), (61, 384, "set", 2), (48, 128, "bitpack", 4), (8, 64, "bitpack", 4), (6, 64, "bitpack", 3),
     (31, 64, "bitpack", 1)],
)
def test_default_layers_per_chunk(moe: int, experts: int, codec: str, want: int) -> None:
    spec = spec_of(moe, experts)
    got = default_layers_per_chunk(spec, 128, codec)
    assert got == want
    if moe >= 32:  # never more stored overhead (padding + a 40-byte header per 1 KiB frame) than the divisor rule
        old = max(d for d in range(1, 5) if moe % d == 0)

        def overhead(d: int) -> float:
            return (-moe) % d / moe + 40 / (128 * d * 8 * spec.bits_per_id / 8)

        assert overhead(got) <= overhead(old)


@pytest.mark.parametrize("codec", ["bitpack", "set"])
def test_padded_layer_chunks_read_back(tmp_path: Path, codec: str) -> None:
    """61 MoE layers in chunks of 3 (63: the last chunk holds 2 padded layers)."""
    spec = spec_of(61, 256)
    rng = np.random.default_rng(0)
    routes = np.argsort(rng.random((70, 61, 256)), axis=-1)[..., :8].astype(np.int32)
    with r3store.RouteWriter(tmp_path, spec, {"codec": codec, "writer_id": "w", "chunk_rows": 16,
                                                "layers_per_chunk": 3}) as w:
        w.append("a", routes)
    doc = json.loads((tmp_path / "routes" / "w-00000" / "zarr.json").read_text())
    assert doc["codecs"][0]["configuration"]["chunk_shape"] == [16, 3, 8]
    store = r3store.open_store(tmp_path)
    want = routes if codec == "bitpack" else np.sort(routes, axis=-1)
    np.testing.assert_array_equal(store.get("a"), want)
    layers = [60, 3, 59, 33]
    np.testing.assert_array_equal(store.get("a", layers=layers, rows=slice(5, 50)),
                                  want[5:50][:, [spec.moe_layers.index(x) for x in layers]])
