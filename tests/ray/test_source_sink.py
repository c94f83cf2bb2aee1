"""r3store.ray's Ray Data source and sink, on a local Ray cluster (2 CPUs), local and loopback-S3 stores.

* read_routes: every row bit-identical to ``store.get`` (same layers), duplicates and
  quarantine exactly as ``open_store``, filter / layers / columns, any number of tasks,
  a layer subset reads only its chunks;
* write_routes: arrays, SGLang payloads from Parquet and a folder of ``.npy`` files;
  bad samples raised (naming them) or quarantined; a write task killed by ``os._exit``
  mid-commit (before its sample table) or just after a commit is retried by Ray and
  leaves every sample exactly once.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import r3store
from r3store.audit import validate
from r3store.errors import ChecksumError, DuplicateSampleError, LayerError, OptionError
from r3store.reader import open_reader
from r3store.storage import LocalBackend
from r3store.testing.faults import FAULTY_SPEC, FaultyStore, distinct_routes, write_faulty_store
from r3store.testing.ray_cluster import pickle_by_value

ray = pytest.importorskip("ray")
import r3store.ray as r3ray  # noqa: E402 - after the importorskip

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]
pickle_by_value(__name__)

SPEC = FAULTY_SPEC


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    """Duplicates, quarantined samples, a leftover; every committed route readable."""
    return write_faulty_store(tmp_path_factory.mktemp("ray-read") / "store", corrupt=False)


def by_id(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {r["sample_id"]: r for r in rows}
    assert len(out) == len(rows), "a sample came back twice"
    return out


# -- reading ---------------------------------------------------------------------------------------


def test_read_routes_equals_open_store(ray_cluster: str, store: FaultyStore) -> None:
    reference = r3store.open_store(store.url, on_duplicate="first")
    rows = by_id(r3ray.read_routes(store.url, on_duplicate="first").take_all())
    assert sorted(rows) == sorted(reference.sample_ids)  # quarantined ones hidden, "dup" once
    assert "dup" in rows
    assert not store.quarantined & set(rows)
    for sid, row in rows.items():
        routes = row["routes"]
        assert routes.dtype == np.int32
        np.testing.assert_array_equal(routes, reference.get(sid))
        np.testing.assert_array_equal(routes, store.routes[sid])  # the writer's input, bit for bit
        assert row["num_tokens"] == reference.num_tokens(sid)
        assert (row["writer"], row["step"]) == (reference.row(sid)["writer"], reference.row(sid)["step"])
    assert set(next(iter(rows.values()))) == {"sample_id", "routes", "num_tokens", "writer", "step"}
    with pytest.raises(DuplicateSampleError, match="dup"):  # on the driver, before any task runs
        r3ray.read_routes(store.url)


def test_read_routes_quarantined_layers_filter_columns(ray_cluster: str, store: FaultyStore) -> None:
    reference = r3store.open_store(store.url, on_duplicate="first")
    rows = by_id(r3ray.read_routes(store.url, on_duplicate="first", include_quarantined=True, layers=[4, 2],
                                   columns=["quarantined", "reason", "writer_id"]).take_all())
    assert store.quarantined <= set(rows)
    for sid, row in rows.items():
        np.testing.assert_array_equal(row["routes"], reference.get(sid, [4, 2], include_quarantined=True))
        assert row["quarantined"] == (sid in store.quarantined)
        assert row["writer_id"] == reference.row(sid, include_quarantined=True)["writer_id"]
    assert "step" not in next(iter(rows.values()))
    selected = r3ray.read_routes(store.url, on_duplicate="first",
                                 filter=(pc.field("step") == 1) & pc.starts_with(pc.field("sample_id"), "w1"))
    expected = [s for s in reference.sample_ids if s.startswith("w1") and reference.row(s)["step"] == 1]
    assert expected
    assert sorted(r["sample_id"] for r in selected.take_all()) == sorted(expected)
    with pytest.raises(OptionError, match="filter"):
        r3ray.read_routes(store.url, on_duplicate="first", filter=pc.field("reward") > 0)
    with pytest.raises(LayerError):
        r3ray.read_routes(store.url, on_duplicate="first", layers=[0])  # a dense layer
    with pytest.raises(OptionError, match="columns"):
        r3ray.read_routes(store.url, on_duplicate="first", columns=["nope"])


@pytest.mark.parametrize("blocks", [1, 3, 40])
def test_any_number_of_read_tasks_gives_the_same_rows(ray_cluster: str, store: FaultyStore, blocks: int) -> None:
    source = r3ray.RouteDatasource(store.url, on_duplicate="first")
    tasks = source.get_read_tasks(blocks)
    assert len(tasks) == min(blocks, source.table.num_rows)
    assert sum(t.metadata.num_rows for t in tasks) == source.table.num_rows
    ids = [r["sample_id"] for r in r3ray.read_routes(store.url, on_duplicate="first",
                                                       override_num_blocks=blocks).take_all()]
    assert sorted(ids) == sorted(r3store.open_store(store.url, on_duplicate="first").sample_ids)


def test_a_task_reads_only_its_commits_and_layers(tmp_path: Path, ray_cluster: str) -> None:
    """A corrupted chunk of decoder layer 1 is never decoded by a read of layers 2-4; a read
    of every layer fails on it, naming the array and chunk."""
    faulty = write_faulty_store(tmp_path / "store")
    subset = by_id(r3ray.read_routes(faulty.url, on_duplicate="first", layers=[2, 3, 4]).take_all())
    assert faulty.corrupt in subset
    np.testing.assert_array_equal(subset[faulty.corrupt]["routes"], faulty.routes[faulty.corrupt][:, 1:])
    with pytest.raises(ChecksumError, match=r"chunk \(0, 0, 0\): CRC-32C mismatch"):
        r3ray.read_routes(faulty.url, on_duplicate="first").take_all()


# -- writing ---------------------------------------------------------------------------------------


def items(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        rows = 3 + 2 * i
        out.append({"sample_id": f"s{i:03d}", "routes": distinct_routes(rng, rows, 4, 48, 2),
                    "tokens": rng.integers(0, 50_000, rows + 1), "step": i % 3, "reward": float(i) / 2})
    return out


def check_store(url: str, expected: list[dict[str, Any]], **options: Any) -> r3store.RouteStore:
    out = r3store.open_store(url, **options)  # on_duplicate="raise": no sample committed twice
    assert sorted(out.sample_ids) == sorted(e["sample_id"] for e in expected)
    for e in expected:
        np.testing.assert_array_equal(out.get(e["sample_id"]), e["routes"])
    return out


def test_write_routes_round_trip(tmp_path: Path, ray_cluster: str) -> None:
    data = items(12)
    ds = ray.data.from_items(data).repartition(3)
    summary = r3ray.write_routes(ds, tmp_path / "out", SPEC, write_id="convert-1")
    assert (summary.samples, summary.resumed, summary.quarantined, summary.tasks) == (12, 0, 0, 3)
    assert all(c.startswith("convert-1-0000") for c in summary.commits)
    out = check_store(str(tmp_path / "out"), data)
    assert sorted(out.commits) == list(summary.commits)
    for e in data:
        assert (out.row(e["sample_id"])["step"], out.row(e["sample_id"])["reward"]) == (e["step"], e["reward"])
    batch = out.assemble([e["sample_id"] for e in data[:2]], tokens=[e["tokens"] for e in data[:2]])  # token hashes
    assert batch["tokens"].shape == (sum(len(e["tokens"]) for e in data[:2]),)
    copy = r3ray.read_routes(tmp_path / "out").drop_columns(["num_tokens"])  # read -> write: a copy
    copied = r3ray.write_routes(copy, tmp_path / "copy", SPEC)
    assert copied.samples == 12
    check_store(str(tmp_path / "copy"), data)
    assert validate(r3store.open_reader(tmp_path / "copy")).ok


def test_convert_sglang_parquet_and_npy_folder(tmp_path: Path, ray_cluster: str) -> None:
    """The two conversions of the README, as written there."""
    data = items(6, seed=1)
    table = pa.table({"sample_id": [e["sample_id"] for e in data],
                      "routed_experts": [r3store.encode_sglang(np.concatenate(
                          [np.zeros((len(e["routes"]), 1, 2), np.int32), e["routes"]], axis=1)) for e in data],
                      "num_tokens": [len(e["routes"]) + 1 for e in data],
                      "step": [e["step"] for e in data]})
    pq.write_table(table, tmp_path / "sglang.parquet")
    ds = ray.data.read_parquet(str(tmp_path / "sglang.parquet"))
    r3ray.write_routes(ds, tmp_path / "from-sglang", SPEC, payload="sglang", routes_column="routed_experts")
    assert check_store(str(tmp_path / "from-sglang"), data).row("s002")["step"] == data[2]["step"]

    folder = tmp_path / "npy"
    folder.mkdir()
    for e in data:
        np.save(folder / f"{e['sample_id']}.npy", e["routes"].astype(np.int16))
    ds = ray.data.read_binary_files(str(folder), include_paths=True).map(lambda r: {
        "sample_id": Path(r["path"]).stem, "routes": np.load(io.BytesIO(r["bytes"]), allow_pickle=False)})
    summary = r3ray.write_routes(ds, tmp_path / "from-npy", SPEC)
    assert summary.samples == 6
    check_store(str(tmp_path / "from-npy"), data)


def test_bad_samples_are_named_or_quarantined(tmp_path: Path, ray_cluster: str) -> None:
    data = items(4, seed=2)
    data[2]["routes"] = data[2]["routes"].copy()
    data[2]["routes"][1, 3] = [5, 5]
    with pytest.raises(Exception, match=r"s002.*expert id repeated within row 1, decoder layer 4"):
        r3ray.write_routes(ray.data.from_items(data).repartition(1), tmp_path / "raise", SPEC)
    summary = r3ray.write_routes(ray.data.from_items(data), tmp_path / "keep", SPEC, on_invalid="quarantine")
    assert (summary.samples, summary.quarantined) == (4, 1)
    out = r3store.open_store(tmp_path / "keep")
    assert "s002" not in out.sample_ids
    assert "repeated" in out.row("s002", include_quarantined=True)["reason"]


def test_sink_options_are_checked(tmp_path: Path, ray_cluster: str) -> None:
    ds = ray.data.from_items(items(2))
    with pytest.raises(OptionError, match="lack"):
        r3ray.write_routes(ds.rename_columns({"routes": "ids"}), tmp_path / "a", SPEC)
    with pytest.raises(OptionError, match="writer_id"):
        r3ray.write_routes(ds, tmp_path / "a", SPEC, config={"writer_id": "x"})
    with pytest.raises(OptionError, match="payload"):
        r3ray.write_routes(ds, tmp_path / "a", SPEC, payload="vllm")  # type: ignore[arg-type]
    r3ray.write_routes(ds, tmp_path / "b", SPEC, write_id="once")
    with pytest.raises(OptionError, match="was used before"):
        r3ray.write_routes(ds, tmp_path / "b", SPEC, write_id="once")
    sink = r3ray.RouteDatasink(tmp_path / "c", SPEC)
    ds.write_datasink(sink)
    assert sink.summary is not None
    assert sink.summary.samples == 2
    with pytest.raises(OptionError, match="make a new one"):
        ds.write_datasink(sink)
    with pytest.raises(r3store.errors.SpecMismatchError):
        r3ray.write_routes(ds, tmp_path / "b", r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2))


class CrashingBackend(LocalBackend):
    """A local store whose process dies (``os._exit``) the first time any task of the write
    commits a sample table: just before writing it (``when="before"``: route objects
    written, the commit not visible) or just after (``"after"``: the commit is whole)."""

    def __init__(self, root: str, marker: str, when: str) -> None:
        super().__init__(root)
        self.marker = marker
        self.when = when

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "marker": self.marker, "when": self.when}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["root"]), str(state["marker"]), str(state["when"]))  # type: ignore[misc]

    def _first(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def set_if_absent(self, key: str, data: bytes) -> bool:
        crash = key.startswith("index/") and self._first()
        if crash and self.when == "before":
            os._exit(1)
        done = bool(super().set_if_absent(key, data))
        if crash and self.when == "after":
            os._exit(1)
        return done


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_write_task_killed_mid_commit_is_retried_without_duplicate_or_loss(
        tmp_path: Path, ray_cluster: str, when: str) -> None:
    data = items(8, seed=3)
    marker = tmp_path / "crashed"
    backend = CrashingBackend(str(tmp_path / "store"), str(marker), when)
    ds = ray.data.from_items(data).repartition(2)  # 2 tasks of 4 samples; one commit per sample
    summary = r3ray.write_routes(ds, backend, SPEC, config={"buffer_bytes": 1})
    assert marker.exists()  # a worker did die
    check_store(str(tmp_path / "store"), data)  # every sample once (on_duplicate="raise"), bit-identical
    assert summary.samples + summary.resumed == 8
    report = validate(open_reader(tmp_path / "store"))
    if when == "after":  # the dead attempt's first commit was whole: the retry skipped its sample
        assert summary.resumed == 1
        assert report.ok
    else:  # its half commit stays invisible, a leftover for r3store gc
        assert summary.resumed == 0
        assert report.counts == {"uncommitted": 1}


@pytest.mark.s3
def test_read_and_write_on_loopback_s3(ray_cluster: str, s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    url = f"s3://{s3_bucket}/{uuid.uuid4().hex}/store"
    data = items(6, seed=4)
    summary = r3ray.write_routes(ray.data.from_items(data).repartition(2), url, SPEC,
                                 storage_options=s3_storage_options)
    assert summary.samples == 6
    check_store(url, data, storage_options=s3_storage_options)
    rows = by_id(r3ray.read_routes(url, storage_options=s3_storage_options, layers=[3]).take_all())
    for e in data:
        np.testing.assert_array_equal(rows[e["sample_id"]]["routes"], e["routes"][:, 2:3])
