"""What crosses Ray and what lands in the store, on a local Ray cluster (2 CPUs).

* read_routes blocks hold the ids in the narrowest dtype (uint8 up to 256 experts,
  uint16 beyond), so a block's routes are at most half (a quarter) of the int32 bytes,
  and the values equal ``get``;
* a commit split over several read tasks is cut at storage object boundaries: no two
  tasks start samples in the same object;
* write_routes bundles a dataset's small blocks into one write task, so 40 samples from
  ``from_items`` (40 blocks) are one commit, not 40.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.testing.faults import distinct_routes
from r3store.testing.ray_cluster import pickle_by_value

ray = pytest.importorskip("ray")
import r3store.ray as r3ray  # noqa: E402 - after the importorskip
from r3store.ray import block_dtype  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
pickle_by_value(__name__)


def write(url: Path, spec: r3store.ModelSpec, samples: int, rows: int, **config: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    routes = {f"s{i:03d}": distinct_routes(rng, rows + i % 5, spec.num_moe_layers, spec.num_experts, spec.top_k)
              for i in range(samples)}
    with r3store.RouteWriter(url, spec, r3store.WriterConfig(chunk_rows=8, **config)) as w:
        for sid, r in routes.items():
            w.append(sid, r)
    return routes


@pytest.mark.parametrize(("experts", "dtype", "most"), [(48, np.uint8, 0.25), (256, np.uint8, 0.25),
                                                         (300, np.uint16, 0.5)])
def test_blocks_hold_the_narrowest_dtype(tmp_path: Path, ray_cluster: str, experts: int, dtype: type,
                                         most: float) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=experts, top_k=4)
    routes = write(tmp_path / "store", spec, samples=6, rows=40)
    assert block_dtype(experts) == np.dtype(dtype)
    ds = r3ray.read_routes(tmp_path / "store").materialize()
    got = {r["sample_id"]: r["routes"] for r in ds.take_all()}
    assert sorted(got) == sorted(routes)
    for sid, r in routes.items():
        assert got[sid].dtype == dtype
        np.testing.assert_array_equal(got[sid], r)  # every id, exactly (no wrap-around)
    int32 = sum(r.nbytes for r in routes.values())
    blocks = [ray.get(ref) for ref in ds.to_arrow_refs()]
    carried = sum(b.column("routes").nbytes for b in blocks)
    assert carried <= most * int32 + 64 * len(routes)  # + the per-row shapes of the ragged tensor column
    assert carried < 0.5 * int32 + 64 * len(routes)


def test_a_commit_is_split_over_tasks_by_storage_objects(tmp_path: Path, ray_cluster: str) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=48, top_k=2)
    routes = write(tmp_path / "store", spec, samples=30, rows=20, object_bytes=400)  # one commit, many objects
    reader = r3store.open_store(tmp_path / "store")
    (array,) = set(reader.samples.column("array").to_pylist())
    geometry = reader.geometry_of(array)
    per_object = geometry.row_chunks_per_object * geometry.chunk_rows
    objects = -(-geometry.rows // per_object)
    assert objects >= 6, "the store must have several storage objects"
    source = r3ray.RouteDatasource(tmp_path / "store")
    for parallelism in (2, 3, 5, 64):
        pieces = source._pieces(parallelism)
        assert 1 < len(pieces) <= min(parallelism, objects)
        starts = source.table.column("row_start").to_numpy()
        owners: dict[int, int] = {}
        for k, piece in enumerate(pieces):
            for obj in {int(starts[i]) // per_object for i in piece.rows}:
                assert owners.setdefault(obj, k) == k, f"object {obj} starts samples of two tasks"
        assert sorted(i for p in pieces for i in p.rows) == list(range(source.table.num_rows))
    got = {r["sample_id"]: r["routes"] for r in r3ray.read_routes(tmp_path / "store", override_num_blocks=4).take_all()}
    assert sorted(got) == sorted(routes)
    for sid, r in routes.items():
        np.testing.assert_array_equal(got[sid], r)


def test_forty_rows_from_items_are_one_commit(tmp_path: Path, ray_cluster: str) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=48, top_k=2)
    rng = np.random.default_rng(1)
    data = [{"sample_id": f"s{i:02d}", "routes": distinct_routes(rng, 5 + i, 3, 48, 2)} for i in range(40)]
    ds = ray.data.from_items(data)
    assert ds.materialize().num_blocks() == 40  # one block per item: the case that made 40 commits
    summary = r3ray.write_routes(ds, tmp_path / "out", spec)
    assert (summary.samples, summary.tasks, len(summary.commits)) == (40, 1, 1)
    out = r3store.open_store(tmp_path / "out")
    assert sorted(out.sample_ids) == [d["sample_id"] for d in data]
    for d in data:
        np.testing.assert_array_equal(out.get(d["sample_id"]), d["routes"])


def test_each_write_task_commits_once_per_writer_buffer(tmp_path: Path, ray_cluster: str) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=48, top_k=2)
    rng = np.random.default_rng(2)
    data = [{"sample_id": f"s{i:02d}", "routes": distinct_routes(rng, 40 + i, 3, 48, 2)} for i in range(40)]
    ds = ray.data.from_items(data).materialize()
    assert ds.num_blocks() == 40
    buffer = ds.size_bytes() // 4  # Ray bundles about a quarter of the input per write task
    summary = r3ray.write_routes(ds, tmp_path / "out", spec, config={"buffer_bytes": buffer})
    assert summary.samples == 40
    assert 1 < summary.tasks < 40
    # a task's rows fit its writer's buffer (2 bytes per id, less than Ray's input bytes):
    # one commit per writer, made when the task ends, whatever the number of blocks
    assert len(summary.commits) == summary.tasks
    assert all(c.endswith("-00000") for c in summary.commits)
    out = r3store.open_store(tmp_path / "out")
    assert sorted(out.sample_ids) == [d["sample_id"] for d in data]
    for d in data:
        np.testing.assert_array_equal(out.get(d["sample_id"]), d["routes"])
