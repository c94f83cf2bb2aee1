"""Readers of some commits only (``open_reader(url, commits=...)``) and ``filter_samples``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import r3store
from r3store.errors import ObjectNotFoundError, OptionError, SampleNotFoundError
from r3store.reader import filter_samples, open_reader

SPEC = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])


def routes(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2]


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Three writers; ``dup`` is committed by the first and the third."""
    rng = np.random.default_rng(0)
    written: dict[str, np.ndarray] = {}
    for w_i in range(3):
        with r3store.RouteWriter(tmp_path, SPEC, writer_id=f"w{w_i}") as w:
            for j in range(2):
                sid = f"w{w_i}-s{j}"
                written[sid] = routes(rng, 5 + j)
                w.append(sid, written[sid], metadata={"writer": w_i})
            if w_i in (0, 2):
                written[f"dup@{w_i}"] = routes(rng, 4)
                w.append("dup", written[f"dup@{w_i}"], metadata={"writer": w_i})
    (tmp_path / "routes" / "w9-00000").mkdir()  # a leftover: must stay one for a partial reader
    (tmp_path / "routes" / "w9-00000" / "zarr.json").write_bytes(b"{}")
    return tmp_path, written


def test_a_reader_of_some_commits_sees_only_them(store: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, written = store
    full = open_reader(path, on_duplicate="report")
    assert full.commits == ["w0-00000", "w1-00000", "w2-00000"]
    assert not full.is_partial
    part = open_reader(path, commits=("w2-00000", "w1-00000", "w1-00000"))
    assert part.is_partial
    assert part.commits == ["w1-00000", "w2-00000"]
    assert sorted(part.sample_ids) == ["dup", "w1-s0", "w1-s1", "w2-s0", "w2-s1"]
    assert part.duplicates == {}  # the other copy of "dup" is in a commit not read
    np.testing.assert_array_equal(part.get("dup"), written["dup@2"])
    np.testing.assert_array_equal(part.get("w1-s1", [2]), written["w1-s1"][:, 1:])
    with pytest.raises(SampleNotFoundError):
        part.get("w0-s0")
    assert part.storage_usage() == full.storage_usage()
    assert list(part.storage_usage().uncommitted) == ["w9-00000"]


def test_duplicates_inside_the_subset_follow_the_store_rule(store: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, written = store
    part = open_reader(path, commits=["w0-00000", "w2-00000"], on_duplicate="first")
    assert part.duplicates == {"dup": ["w0-00000", "w2-00000"]}
    np.testing.assert_array_equal(part.get("dup"), written["dup@0"])
    with pytest.raises(r3store.errors.DuplicateSampleError, match="dup"):
        open_reader(path, commits=["w0-00000", "w2-00000"])


@pytest.mark.parametrize("commits", [["../w0-00000"], ["w0-00000/x"], "w0-00000", [3], [".hidden"]])
def test_bad_commit_names_are_refused(store: tuple[Path, dict[str, np.ndarray]], commits: object) -> None:
    with pytest.raises(OptionError, match="commits"):
        open_reader(store[0], commits=commits)  # type: ignore[arg-type]


def test_a_commit_without_sample_table_is_not_found(store: tuple[Path, dict[str, np.ndarray]]) -> None:
    with pytest.raises(ObjectNotFoundError, match="w9-00000"):
        open_reader(store[0], commits=["w9-00000"])
    assert len(open_reader(store[0], commits=[])) == 0


def test_filter_samples_selects_rows_and_names_faults(store: tuple[Path, dict[str, np.ndarray]]) -> None:
    samples = open_reader(store[0], on_duplicate="first").samples
    kept = filter_samples(samples, (pc.field("writer") == 1) | pc.field("sample_id").isin(["dup"]))
    assert sorted(kept.column("sample_id").to_pylist()) == ["dup", "w1-s0", "w1-s1"]
    assert kept.schema == samples.schema
    assert filter_samples(samples, None) is samples
    with_null = pa.table({"sample_id": ["a", "b"], "x": [1, None]})
    assert filter_samples(with_null, pc.field("x") > 0).column("sample_id").to_pylist() == ["a"]
    with pytest.raises(OptionError, match=r"columns sample_id, .*No match for FieldRef.Name\(nope\)"):
        filter_samples(samples, pc.field("nope") == 1)
    with pytest.raises(OptionError, match="must evaluate to bool"):
        filter_samples(samples, pc.field("num_tokens") + 1)
    with pytest.raises(OptionError, match=r"must be a pyarrow\.compute\.Expression"):
        filter_samples(samples, "writer == 1")  # type: ignore[arg-type]
