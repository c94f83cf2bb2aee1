"""Stores are plain zarr v3: ``zarr.open_array`` reads the route arrays with nothing but
zarr + the ``r3store.bitpack`` codec found through the ``zarr.codecs`` entry point (the
reading process never imports r3store itself)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

import r3store

SPEC = r3store.ModelSpec(num_layers=10, num_experts=100, top_k=5, moe_layers=[1, 2, 3, 5, 6, 7, 8, 9])  # 7 bits


def random_routes(rng: np.random.Generator, rows: int, layers: int = 8, num_experts: int = 100,
                  top_k: int = 5) -> np.ndarray:
    """Valid routes: per (row, layer) a random permutation prefix of the experts."""
    return np.argsort(rng.random((rows, layers, num_experts)), axis=-1)[..., :top_k].astype(np.int32)


def build_store(url: str) -> dict[str, np.ndarray]:
    """Several arrays (two writers, auto flushes), several zarr shards each, short last
    chunks, a padded last layer chunk (8 layers in chunks of 3), 0-row samples, and an
    array holding 0 rows."""
    rng = np.random.default_rng(42)
    data: dict[str, np.ndarray] = {}
    with r3store.RouteWriter(url, SPEC,
        config={"chunk_rows": 7, "layers_per_chunk": 3, "object_bytes": 200, "writer_id": "wa"}) as w:
        for i, n in enumerate([30, 1, 64, 9, 200, 2, 33]):
            data[f"a{i}"] = random_routes(rng, n)
            w.append(f"a{i}", data[f"a{i}"])
        w.flush()
        data["zero"] = random_routes(rng, 0)
        w.append("zero", data["zero"], num_tokens=1)  # an array with 0 rows (a 1-token sample says so)
        w.flush()
        for i, n in enumerate([5, 0, 77]):
            data[f"b{i}"] = random_routes(rng, n)
            w.append(f"b{i}", data[f"b{i}"], num_tokens=n + 1)  # b1: 0 rows, a 1-token sample
    with r3store.RouteWriter(url, SPEC,
        config={"chunk_rows": 64, "layers_per_chunk": 8, "buffer_bytes": 3000, "writer_id": "wb"}) as w:
        for i, n in enumerate([100, 13, 51, 2, 90]):
            data[f"c{i}"] = random_routes(rng, n)
            w.append(f"c{i}", data[f"c{i}"])
    return data


READER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    assert "r3store" not in sys.modules, "r3store imported before reading"
    import numpy as np
    import pyarrow.parquet as pq
    import zarr

    root = Path(sys.argv[1])
    expected = np.load(sys.argv[2])
    assert "r3store" not in sys.modules, "importing zarr imported r3store"

    rows = [row for p in sorted((root / "index").rglob("*.parquet")) for row in pq.read_table(p).to_pylist()]
    seen = {}
    for row in rows:
        if row["array"] not in seen:
            if not seen:
                assert "r3store" not in sys.modules, "r3store imported before opening"
            seen[row["array"]] = zarr.open_array(str(root / row["array"]), mode="r")
        arr = seen[row["array"]]
        got = arr[row["row_start"] : row["row_start"] + row["num_rows"]]
        want = expected[row["sample_id"]]
        assert got.dtype == np.int32, got.dtype
        assert got.shape == want.shape, (row["sample_id"], got.shape, want.shape)
        assert np.array_equal(got, want), row["sample_id"]

    group = zarr.open_group(str(root), mode="r")
    assert group.attrs["r3store"] == {"manifest": "r3store.json"}
    routes = group["routes"]
    assert isinstance(routes, zarr.Group)
    arrays = sorted(routes.array_keys())
    assert sorted(a.split("/", 1)[1] for a in seen) == arrays, (sorted(seen), arrays)
    for row in rows:
        sl = slice(row["row_start"], row["row_start"] + row["num_rows"])
        assert np.array_equal(group[row["array"]][sl, 2:5], expected[row["sample_id"]][:, 2:5]), row["sample_id"]
    checked = len(rows)
    # the entry point, not an import by us, brought the codec in
    assert "r3store.codecs._zarr" in sys.modules
    print(json.dumps({"checked": checked, "arrays": len(arrays)}))
    """
)


def test_zarr_reads_without_importing_r3store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    data = build_store(str(root))
    np.savez(tmp_path / "expected.npz", **data)
    script = tmp_path / "reader.py"
    script.write_text(READER)
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(script), str(root), str(tmp_path / "expected.npz")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    store = r3store.open_store(root)
    assert result["checked"] == len(data) == len(store)
    assert result["arrays"] == len({r["array"] for r in store.samples.to_pylist()}) >= 4


def test_zarr_codec_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="zarr.codecs") if ep.name == "r3store.bitpack"]
    assert ep.value == "r3store.codecs._zarr:ZarrBitpackCodec"
    assert ep.load().__name__ == "ZarrBitpackCodec"


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_zarr_in_process(backend: str, tmp_path: Path, memory_url: str) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    data = build_store(url)
    store = r3store.open_store(url)
    for row in store.samples.to_pylist():
        arr = zarr.open_array(f"{url}/{row['array']}", mode="r")
        assert arr.metadata.dimension_names == ("row", "moe_layer", "top_k")
        assert arr.attrs["r3store"]["spec"] == SPEC.to_dict()
        sl = slice(row["row_start"], row["row_start"] + row["num_rows"])
        np.testing.assert_array_equal(arr[sl], data[row["sample_id"]])
        np.testing.assert_array_equal(arr[sl, [7, 0]], store.get(row["sample_id"], layers=[9, 1]))


def test_zarr_json_documents_are_valid_zarr_v3(tmp_path: Path) -> None:
    build_store(str(tmp_path))
    root = json.loads((tmp_path / "zarr.json").read_text())
    assert root == {"zarr_format": 3, "node_type": "group", "attributes": {"r3store": {"manifest": "r3store.json"}}}
    routes = json.loads((tmp_path / "routes" / "zarr.json").read_text())
    assert routes["node_type"] == "group"
    assert routes["zarr_format"] == 3
    for meta in (tmp_path / "routes").glob("*/zarr.json"):
        doc = json.loads(meta.read_text())
        assert doc["node_type"] == "array"
        assert doc["data_type"] == "int32"
        (sharding,) = doc["codecs"]
        assert sharding["name"] == "sharding_indexed"
        assert sharding["configuration"]["codecs"] == [{"name": "r3store.bitpack",
                                                        "configuration": {"bits": 7, "frame_version": 2}}]
        assert doc["attributes"]["r3store"]["format_version"] == 3
        assert doc["attributes"]["r3store"]["commit"] == meta.parent.name
        outer = doc["chunk_grid"]["configuration"]["chunk_shape"]
        inner = sharding["configuration"]["chunk_shape"]
        assert all(o % i == 0 for o, i in zip(outer, inner, strict=True)), (outer, inner)


@pytest.mark.parametrize(("cls", "name", "config"), [
    ("ZarrBitpackCodec", "r3store.bitpack", {"bits": 7, "frame_version": 2}),
    ("ZarrSetCodec", "r3store.set", {"num_experts": 100, "top_k": 8}),
])
def test_zarr_adapters_share_their_glue(cls: str, name: str, config: dict[str, int]) -> None:
    """Both adapters: from_dict/to_dict round trip through the r3store codec's checks, integer
    data types only, data-dependent frame sizes, a zarr array written and read back."""
    from zarr.core.dtype import Float32, Int32

    from r3store.codecs import _zarr

    adapter = getattr(_zarr, cls)
    codec = adapter.from_dict({"name": name, "configuration": config})
    assert codec.to_dict() == {"name": name, "configuration": config}
    assert adapter.from_dict(codec.to_dict()) == codec
    with pytest.raises(ValueError, match=name):
        adapter.from_dict({"name": "other", "configuration": config})
    first = next(iter(config))
    with pytest.raises(ValueError, match=first):  # the r3store codec refuses the value
        adapter.from_dict({"name": name, "configuration": {**config, first: 0}})
    codec.validate(shape=(4, 8), dtype=Int32(), chunk_grid=None)
    with pytest.raises(TypeError, match=f"{name} needs an integer data type"):
        codec.validate(shape=(4, 8), dtype=Float32(), chunk_grid=None)
    with pytest.raises(NotImplementedError, match=f"{name} frames have a data-dependent size"):
        codec.compute_encoded_size(64, None)
    ids = np.argsort(np.random.default_rng(0).random((16, 100)), axis=-1)[:, :8].astype(np.int32)
    ids.sort(axis=-1)
    array = zarr.create_array(zarr.storage.MemoryStore(), shape=ids.shape, chunks=(4, 8), dtype="int32",
                              serializer=codec, compressors=None, fill_value=0)
    array[:] = ids
    np.testing.assert_array_equal(array[:], ids)
