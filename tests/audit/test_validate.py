"""r3store.audit: validate (every fault kind), the physical-id test, stats, diff and show.

Every test builds a real store in tmp_path (or memory://) with RouteWriter, injects one
fault the way it arises in the field (quarantine mode for routes a writer would refuse,
byte flips and deleted objects for storage faults) and checks the finding's kind,
sample, decoder layer and rows.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store._format import ArrayGeometry, decode_index
from r3store.audit import (
    KINDS,
    Finding,
    ValidationReport,
    diff,
    format_rows,
    parse_layers,
    parse_rows,
    physical_id_test,
    show,
    stats,
    validate,
    zero_layer_min_rows,
)
from r3store.audit import _validate as validate_module
from r3store.audit._diff import compare_routes
from r3store.audit._findings import RowRuns
from r3store.data import flame_samples, flame_spec
from r3store.errors import LayerError, SampleNotFoundError, SpecMismatchError
from r3store.testing.synthetic import synthetic_routes

# -- helpers ------------------------------------------------------------------------------


def distinct_routes(rng: np.random.Generator, rows: int, layers: int, num_experts: int, top_k: int,
                    low: int = 0) -> np.ndarray:
    """Valid routes: ``top_k`` distinct ids of ``[low, num_experts)`` per (row, layer)."""
    keys = rng.random((rows, layers, num_experts - low))
    return (np.argsort(keys, axis=-1)[..., :top_k] + low).astype(np.int64)


def write(path: Path | str, spec: r3store.ModelSpec, samples: dict[str, np.ndarray], *,
          quarantine: bool = False, num_tokens: dict[str, int] | None = None, **kw: int) -> list[str]:
    """Write samples with one writer; returns the shards committed. One layer per chunk
    unless told otherwise, so chunk coordinates name a layer."""
    kw.setdefault("layers_per_chunk", 1)
    with r3store.RouteWriter(path, spec, {**kw, "on_invalid": "quarantine" if quarantine else "raise"}) as w:
        for sid, routes in samples.items():
            w.append(sid, routes, num_tokens=(num_tokens or {}).get(sid, len(routes) + 1))
    return list(w.commits)


def audit(path: Path | str, **kw: object) -> ValidationReport:
    return validate(r3store.open_store(path, reader={"on_duplicate": "report"}), **kw)  # type: ignore[arg-type]


def of_kind(report: ValidationReport, kind: str) -> list[Finding]:
    return [f for f in report.findings if f.kind == kind]


SPEC = r3store.ModelSpec(num_layers=5, num_experts=64, top_k=2, moe_layers=[1, 2, 3, 4])


@pytest.fixture
def clean_samples() -> dict[str, np.ndarray]:
    return {f"s{i}": synthetic_routes(num_tokens=81, num_layers=4, num_experts=64, top_k=2, seed=i) for i in range(6)}


# -- a clean store ---------------------------------------------------------------------------


def test_clean_store_has_no_findings(tmp_path: Path, clean_samples: dict[str, np.ndarray]) -> None:
    write(tmp_path, SPEC, dict(list(clean_samples.items())[:3]), chunk_rows=16, object_bytes=64)
    write(tmp_path, SPEC, dict(list(clean_samples.items())[3:]), chunk_rows=16, object_bytes=64)
    report = audit(tmp_path)
    assert report.ok
    assert report.findings == ()
    assert report.counts == {}
    assert report.samples_checked == 6
    assert report.arrays_checked == 2
    assert report.rows_checked == 6 * 80
    # 240 rows per array in 16-row chunks: 15 row chunks x 4 layer chunks per array
    assert report.frames_checked == 2 * 15 * 4
    assert [t["layer"] for t in report.layer_tests] == [1, 2, 3, 4]
    assert not any(t["physical"] for t in report.layer_tests)
    assert report.to_dict()["ok"] is True


def test_real_flame_trace_is_clean(tmp_path: Path) -> None:
    """Negative control for every content check on a real trace (64 experts, top-6)."""
    write(tmp_path, flame_spec(), flame_samples())
    report = audit(tmp_path)
    assert report.ok, [str(f) for f in report.findings]
    assert all(t["unused_experts"] == 0 and t["p_value"] == 1.0 for t in report.layer_tests)


# -- content faults --------------------------------------------------------------------------


def test_zero_layer_top1_passes_the_writer_and_is_found(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=4, num_experts=64, top_k=1)
    rng = np.random.default_rng(0)
    good = distinct_routes(rng, 20, 4, 64, 1)
    bad = distinct_routes(rng, 20, 4, 64, 1)
    bad[:, 2] = 0
    short = distinct_routes(rng, 2, 4, 64, 1)
    short[:, 1] = 0  # two rows routed to expert 0 in a top-1 model: legal, and not evidence
    write(tmp_path, spec, {"good": good, "bad": bad, "short": short})
    report = audit(tmp_path)
    (finding,) = report.findings
    assert (finding.kind, finding.severity, finding.sample_id, finding.layer, finding.rows) == (
        "zero_layer", "error", "bad", 2, ((0, 19),))
    assert finding.array is not None
    assert finding.array.startswith("routes/")
    assert "rows 0-19" in str(finding)
    assert zero_layer_min_rows(64, 1) == 4
    assert zero_layer_min_rows(64, 2) == 1
    assert zero_layer_min_rows(8, 1) is None


def test_zero_layer_top2_is_quarantined_and_not_reported_as_repeats(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    routes = distinct_routes(rng, 30, 4, 64, 2)
    routes[:, 0] = 0  # decoder layer 1 never captured
    write(tmp_path, SPEC, {"ok": distinct_routes(rng, 30, 4, 64, 2), "dead": routes}, quarantine=True)
    report = audit(tmp_path)
    assert [(f.kind, f.sample_id, f.layer, f.rows_text) for f in report.findings] == [
        ("zero_layer", "dead", 1, "0-29"),
        ("quarantined", "dead", None, ""),
    ]
    assert "repeated" in of_kind(report, "quarantined")[0].detail
    assert not any(t["physical"] for t in report.layer_tests)  # the zeros are not counted as ids


def test_repeated_ids_name_layer_and_compressed_rows(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    routes = distinct_routes(rng, 40, 4, 64, 2)
    for t in (3, 4, 5, 10):
        routes[t, 1] = [7, 7]
    routes[39, 3, 1] = routes[39, 3, 0]
    write(tmp_path, SPEC, {"a": distinct_routes(rng, 40, 4, 64, 2), "rep": routes}, quarantine=True)
    report = audit(tmp_path)
    found = {(f.sample_id, f.layer): f.rows for f in of_kind(report, "repeated_ids")}
    assert found == {("rep", 2): ((3, 5), (10, 10)), ("rep", 4): ((39, 39),)}
    assert "4 of 40 rows" in of_kind(report, "repeated_ids")[0].detail
    assert report.counts == {"repeated_ids": 2, "quarantined": 1}
    capped = audit(tmp_path, max_findings=1)
    assert capped.truncated
    assert len(capped.findings) == 1
    assert capped.counts == report.counts


def test_out_of_range_ids_of_a_remapped_layout_are_physical(tmp_path: Path) -> None:
    """Physical ids: logical + 16 with 48 experts, stored in 6 bits (up to 63)."""
    spec = r3store.ModelSpec(num_layers=3, num_experts=48, top_k=2)
    rng = np.random.default_rng(3)
    samples = {f"p{i}": distinct_routes(rng, 50, 3, 48, 2) + 16 for i in range(4)}
    write(tmp_path, spec, samples, quarantine=True)
    report = audit(tmp_path)
    oor = of_kind(report, "id_out_of_range")
    assert {(f.sample_id, f.layer) for f in oor} == {(s, layer) for s in samples for layer in range(3)}
    first = next(f for f in oor if (f.sample_id, f.layer) == ("p0", 1))
    above = (samples["p0"][:, 1] >= 48).any(axis=-1)
    assert sum(b - a + 1 for a, b in first.rows) == int(above.sum())
    assert f"max id {int(samples['p0'][:, 1].max())}" in first.detail
    physical = of_kind(report, "physical_ids")
    assert [f.layer for f in physical] == [0, 1, 2]
    assert all(f.sample_id is None for f in physical)
    assert ">= num_experts (48)" in physical[0].detail
    assert "ids 0-15 are never used" in physical[0].detail
    assert report.counts["quarantined"] == 4


def test_shifted_in_range_distribution_is_physical(tmp_path: Path) -> None:
    """All ids valid, but 0..15 never used: the writer accepts it, the audit does not."""
    rng = np.random.default_rng(4)
    shifted = {f"s{i}": distinct_routes(rng, 40, 4, 64, 2, low=16) for i in range(3)}
    write(tmp_path / "shifted", SPEC, shifted)
    report = audit(tmp_path / "shifted")
    assert [(f.kind, f.layer) for f in report.findings] == [("physical_ids", layer) for layer in (1, 2, 3, 4)]
    test = report.layer_tests[0]
    assert test["low_unused_run"] == 16
    assert test["unused_experts"] == 16
    assert test["out_of_range"] == 0
    assert test["p_value"] == pytest.approx(2 / math.comb(64, 16), rel=1e-3)
    # controls: full range, and 16 dead experts scattered over the ids
    write(tmp_path / "full", SPEC, {f"s{i}": distinct_routes(rng, 40, 4, 64, 2) for i in range(3)})
    assert audit(tmp_path / "full").ok
    perm = rng.permutation(64)
    write(tmp_path / "scattered", SPEC, {sid: perm[r] for sid, r in shifted.items()})
    report = audit(tmp_path / "scattered")
    assert report.ok, [str(f) for f in report.findings]
    assert report.layer_tests[0]["unused_experts"] == 16, [str(f) for f in report.findings]


def test_physical_id_test_p_value_against_enumeration() -> None:
    """Exchangeable logical ids: every unused set of a size is equally likely. The p-value of
    the longer unused end run bounds the enumerated chance of a run that long: p/2 <= P <= p."""
    num_experts = 8
    for unused in range(1, num_experts):
        subsets = [set(c) for c in itertools.combinations(range(num_experts), unused)]

        def longest_end_run(gone: set[int]) -> int:
            low = next(i for i in range(num_experts + 1) if i not in gone)
            high = next(i for i in range(num_experts + 1) if num_experts - 1 - i not in gone)
            return max(low, high)

        for gone in subsets:
            counts = np.full(16, 5, np.int64)
            counts[num_experts:] = 0
            counts[sorted(gone)] = 0
            result = physical_id_test(counts, num_experts, alpha=0.0)
            run = longest_end_run(gone)
            chance = np.mean([longest_end_run(other) >= run for other in subsets])
            assert result["unused_experts"] == unused
            assert max(result["low_unused_run"], result["high_unused_run"]) == run
            assert chance - 1e-12 <= result["p_value"] * 1.0005
            assert result["p_value"] <= min(1.0, 2 * chance) * 1.0005


def test_physical_id_test_fraction_and_empty_layers() -> None:
    counts = np.zeros(64, np.int64)
    counts[:48] = 100
    counts[50] = 10  # 0.2% strays >= num_experts: not a remapped layout
    assert not physical_id_test(counts, 48)["physical"]
    counts[48:] = 100
    result = physical_id_test(counts, 48)
    assert result["physical"]
    assert result["fraction_out_of_range"] == pytest.approx(0.25)
    empty = physical_id_test(np.zeros(64, np.int64), 64)
    assert not empty["physical"]
    assert empty["ids"] == 0
    assert empty["p_value"] == 1.0


def test_row_count_off_by_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    routes = distinct_routes(rng, 12, 4, 64, 2)
    write(tmp_path, SPEC, {"fork": routes, "fine": routes}, quarantine=True, num_tokens={"fork": 12})
    report = audit(tmp_path)
    (rc,) = of_kind(report, "row_count")
    assert (rc.sample_id, rc.rows) == ("fork", ((0, 11),))
    assert "12 rows for 12 tokens" in rc.detail
    assert "last token" in rc.detail
    (q,) = of_kind(report, "quarantined")
    assert q.sample_id == "fork"
    assert "num_tokens - 1" in q.detail


def test_duplicates_across_writers(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    (first,) = write(tmp_path, SPEC, {"dup": distinct_routes(rng, 5, 4, 64, 2), "a": distinct_routes(rng, 5, 4, 64, 2)})
    (second,) = write(tmp_path, SPEC, {"dup": distinct_routes(rng, 5, 4, 64, 2)})
    report = audit(tmp_path)
    (finding,) = report.findings
    assert (finding.kind, finding.sample_id) == ("duplicate_sample", "dup")
    assert first in finding.detail
    assert second in finding.detail
    assert report.samples_checked == 2
    assert report.arrays_checked == 2


def test_uncommitted_leftover(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    write(tmp_path, SPEC, {"kept": distinct_routes(rng, 5, 4, 64, 2)})
    (shard,) = write(tmp_path, SPEC, {"lost": distinct_routes(rng, 5, 4, 64, 2)})
    next((tmp_path / "index").rglob(f"{shard}.parquet")).unlink()
    report = audit(tmp_path)
    (finding,) = report.findings
    assert (finding.kind, finding.severity, finding.array) == ("uncommitted", "warning", f"routes/{shard}")
    assert report.samples_checked == 1
    assert audit(tmp_path, limit=5).ok  # a subset audit does not look for leftovers


# -- storage faults --------------------------------------------------------------------------


def _frames(tmp_path: Path, array: str, shard: int = 0) -> tuple[Path, np.ndarray]:
    store = r3store.open_store(tmp_path)
    layout = store.geometry_of(array)
    obj = tmp_path.joinpath(array, *ArrayGeometry.object_key(shard).split("/"))
    raw = obj.read_bytes()
    return obj, decode_index(raw[-layout.index_nbytes :], layout, array, shard)


def test_corrupt_frame_is_a_finding_naming_array_and_chunk(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    samples = {f"s{i}": distinct_routes(rng, 10, 4, 64, 2) for i in range(4)}
    (shard,) = write(tmp_path, SPEC, samples, chunk_rows=8)
    array = f"routes/{shard}"
    obj, index = _frames(tmp_path, array)
    offset, nbytes = (int(v) for v in index[1, 2])  # rows 8-15 (s0 rows 8-9, s1 rows 0-5), decoder layer 3
    data = bytearray(obj.read_bytes())
    data[offset + nbytes - 1] ^= 0x40
    obj.write_bytes(bytes(data))
    report = audit(tmp_path)
    (finding,) = report.findings
    assert (finding.kind, finding.array, finding.chunk, finding.layer, finding.rows) == (
        "checksum", array, (1, 2, 0), 3, ((8, 15),))
    assert "CRC-32C mismatch" in finding.detail
    assert "'s0', 's1'" in finding.detail
    assert finding.sample_id is None
    assert report.rows_checked == 40
    assert report.frames_checked == 5 * 4


def test_corrupt_frame_of_several_layers(tmp_path: Path) -> None:
    rng = np.random.default_rng(17)
    (shard,) = write(tmp_path, SPEC, {"a": distinct_routes(rng, 6, 4, 64, 2)}, layers_per_chunk=2)
    obj, index = _frames(tmp_path, f"routes/{shard}")
    offset, nbytes = (int(v) for v in index[0, 1])  # decoder layers 3 and 4
    data = bytearray(obj.read_bytes())
    data[offset + nbytes - 2] ^= 0x01
    obj.write_bytes(bytes(data))
    (finding,) = audit(tmp_path).findings
    assert (finding.kind, finding.chunk, finding.layer, finding.rows) == ("checksum", (0, 1, 0), None, ((0, 5),))
    assert "decoder layers 3-4" in finding.detail
    assert "'a'" in finding.detail


def test_bad_magic_is_malformed_and_other_chunks_are_still_checked(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    routes = distinct_routes(rng, 16, 4, 64, 2)
    routes[12, 3] = [5, 5]
    (shard,) = write(tmp_path, SPEC, {"x": routes}, chunk_rows=8, quarantine=True)
    obj, index = _frames(tmp_path, f"routes/{shard}")
    offset = int(index[0, 0, 0])
    data = bytearray(obj.read_bytes())
    data[offset : offset + 4] = b"XXXX"
    obj.write_bytes(bytes(data))
    report = audit(tmp_path)
    assert [(f.kind, f.chunk, f.layer, f.rows_text) for f in report.findings if f.kind != "quarantined"] == [
        ("malformed_chunk", (0, 0, 0), 1, "0-7"),
        ("repeated_ids", None, 4, "12"),
    ]
    assert "bad magic" in of_kind(report, "malformed_chunk")[0].detail


def test_corrupt_index_and_missing_object(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    (shard,) = write(tmp_path, SPEC, {f"s{i}": distinct_routes(rng, 8, 4, 64, 2) for i in range(4)},
                     chunk_rows=8, object_bytes=1)  # one storage object per 8 rows
    array = f"routes/{shard}"
    first = tmp_path.joinpath(array, "c", "0", "0", "0")
    data = bytearray(first.read_bytes())
    data[-6] ^= 0xFF  # inside the shard index
    first.write_bytes(bytes(data))
    tmp_path.joinpath(array, "c", "2", "0", "0").unlink()
    report = audit(tmp_path)
    kinds = {f.kind: f for f in report.findings}
    assert set(kinds) == {"checksum", "missing_object"}
    assert "index CRC-32C" in kinds["checksum"].detail
    assert kinds["checksum"].rows == ((0, 7),)
    assert kinds["checksum"].layer is None
    assert "decoder layers 1-4" in kinds["checksum"].detail
    assert kinds["missing_object"].rows == ((16, 23),)
    assert "'s2'" in kinds["missing_object"].detail
    assert report.counts == {"checksum": 1, "missing_object": 1}


def test_a_missing_object_counts_each_row_once_and_decodes_nothing(tmp_path: Path) -> None:
    """New-user finding: with one storage object for the whole array, deleting it reported
    "+N more rows not listed" with N = (layer chunks - 1) x rows (each row counted once per
    layer chunk), and the summary said every row was decoded."""
    rng = np.random.default_rng(11)
    samples = {f"s{i}": distinct_routes(rng, 40, 4, 64, 2) for i in range(40)}
    (shard,) = write(tmp_path, SPEC, samples, chunk_rows=8)  # 4 layer chunks, 200 row chunks
    tmp_path.joinpath(f"routes/{shard}", "c", "0", "0", "0").unlink()
    report = audit(tmp_path)
    (missing,) = of_kind(report, "missing_object")
    assert missing.rows == ((0, 1599),)
    assert "more rows" not in missing.detail
    assert "decoder layers 1-4" in missing.detail
    assert (report.rows_checked, report.rows_decoded, report.frames_checked) == (1600, 0, 0)


def test_array_document_faults(tmp_path: Path) -> None:
    """A zarr.json with fewer rows than the sample table says, and one that is gone."""
    rng = np.random.default_rng(18)
    (short,) = write(tmp_path, SPEC, {"a": distinct_routes(rng, 6, 4, 64, 2), "b": distinct_routes(rng, 6, 4, 64, 2)})
    (gone,) = write(tmp_path, SPEC, {"c": distinct_routes(rng, 6, 4, 64, 2)})
    doc_path = tmp_path / "routes" / short / "zarr.json"
    doc = json.loads(doc_path.read_text())
    doc["shape"][0] = 8
    doc_path.write_text(json.dumps(doc))
    (tmp_path / "routes" / gone / "zarr.json").unlink()
    report = audit(tmp_path)
    assert [(f.kind, f.sample_id, f.array) for f in report.findings] == [
        ("missing_object", None, f"routes/{gone}"),
        ("table_mismatch", "b", f"routes/{short}"),
    ]
    assert "rows [6, 12) of the array, which has 8 rows" in report.findings[1].detail
    assert report.samples_checked == 1  # "a" is still checked


# -- scanning ----------------------------------------------------------------------------------


def test_streaming_blocks_and_threads_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny row blocks (samples straddle blocks) and 4 threads give the same report."""
    rng = np.random.default_rng(11)
    samples = {f"s{i}": distinct_routes(rng, 37, 4, 64, 2) for i in range(8)}
    samples["s3"][30:37, 2] = [9, 9]
    samples["s5"][0:3, 0] = [1, 1]
    write(tmp_path, SPEC, dict(list(samples.items())[:4]), chunk_rows=4, quarantine=True)
    write(tmp_path, SPEC, dict(list(samples.items())[4:]), chunk_rows=4, quarantine=True)
    whole = audit(tmp_path)
    monkeypatch.setattr(validate_module, "BLOCK_IDS", 8 * 4 * 2)  # 8 rows per block
    seen: list[tuple[int, int]] = []
    small = audit(tmp_path, workers=4, progress=lambda done, total: seen.append((done, total)))
    assert small.findings == whole.findings
    assert small.rows_checked == whole.rows_checked
    assert {(f.sample_id, f.layer, f.rows_text) for f in of_kind(small, "repeated_ids")} == {
        ("s3", 3, "30-36"), ("s5", 1, "0-2")}
    assert seen[0] == (0, 8 * 37)
    assert seen[-1] == (8 * 37, 8 * 37)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_remote_backend_uses_threads(memory_url: str) -> None:
    rng = np.random.default_rng(12)
    routes = distinct_routes(rng, 20, 4, 64, 2)
    routes[5, 1] = [3, 3]
    for i in range(3):
        write(memory_url, SPEC, {f"w{i}-a": distinct_routes(rng, 20, 4, 64, 2), f"w{i}-b": routes}, quarantine=True)
    store = r3store.open_store(memory_url, reader={"on_duplicate": "report"})
    report = validate(store)  # memory:// is not local: 8 threads, one per route array
    assert sorted((f.sample_id, f.layer, f.rows_text) for f in of_kind(report, "repeated_ids")) == [
        (f"w{i}-b", 2, "5") for i in range(3)]
    assert report.arrays_checked == 3
    assert report.samples_checked == 6


def test_sample_filter_and_limit(tmp_path: Path) -> None:
    rng = np.random.default_rng(13)
    samples = {f"{p}-{i}": distinct_routes(rng, 6, 4, 64, 2) for p in ("step1", "step2") for i in range(3)}
    samples["step2-1"][0, 0] = [4, 4]
    write(tmp_path, SPEC, samples, quarantine=True, chunk_rows=6)
    assert audit(tmp_path, sample_filter="step1-*").ok
    report = audit(tmp_path, sample_filter="step2-*")
    assert report.samples_checked == 3
    assert report.counts == {"repeated_ids": 1, "quarantined": 1}
    first_two = audit(tmp_path, limit=2)
    assert first_two.samples_checked == 2
    assert first_two.rows_checked == 12
    with pytest.raises(ValueError, match="limit"):
        audit(tmp_path, limit=-1)


def test_findings_api() -> None:
    assert set(KINDS) >= {"checksum", "zero_layer", "repeated_ids", "id_out_of_range", "physical_ids", "row_count",
                          "duplicate_sample", "quarantined", "uncommitted"}
    f = Finding("zero_layer", "error", "s", "routes/x", 3, ((0, 63), (70, 70)), "all zeros")
    assert f.to_dict() == {"kind": "zero_layer", "severity": "error", "sample_id": "s", "array": "routes/x", "layer": 3,
                           "rows": [[0, 63], [70, 70]], "rows_text": "0-63, 70", "chunk": None, "detail": "all zeros"}
    with pytest.raises(AttributeError):
        f.kind = "x"  # type: ignore[misc]
    runs = RowRuns(cap=2)
    runs.add_mask(np.array([1, 1, 0, 1, 0, 1, 1], bool), 10)
    assert runs.inclusive() == ((10, 11), (13, 13))
    assert runs.total == 5
    assert "+2 more rows" in runs.note()
    again = RowRuns(cap=1)  # the same rows once per layer chunk: counted once
    for start, stop in ((0, 8), (0, 8), (0, 8), (8, 16), (8, 16), (20, 24), (20, 24)):
        again.add_range(start, stop)
    assert (again.total, again.inclusive()) == (20, ((0, 15),))
    assert "+4 more rows" in again.note()
    assert format_rows([]) == ""


# -- stats, diff, show -------------------------------------------------------------------------


def test_stats_exact_counts(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=3, num_experts=4, top_k=1, moe_layers=[1, 2])
    a = np.array([[0, 1], [0, 1], [1, 1], [2, 1]]).reshape(4, 2, 1)  # layer 1: 0, 0, 1, 2; layer 2: all 1
    b = np.array([[0, 3], [3, 3]]).reshape(2, 2, 1)  # layer 1: 0, 3; layer 2: 3, 3
    write(tmp_path, spec, {"a": a, "b": b, "q": np.full((3, 2, 1), 3)}, quarantine=True,
          num_tokens={"q": 3})  # q: 3 rows for 3 tokens: quarantined, left out
    s = stats(r3store.open_store(tmp_path))
    assert s["samples"] == 2
    assert s["rows"] == 6
    assert s["tokens"] == 8
    assert s["load"] == [[3, 1, 1, 1], [0, 4, 0, 2]]
    l1, l2 = s["layers"]
    assert (l1["layer"], l1["max_load"], l1["mean_load"], l1["max_over_mean"]) == (1, 3, 1.5, 2.0)
    assert l1["entropy_bits"] == pytest.approx(-(0.5 * math.log2(0.5) + 3 * (1 / 6) * math.log2(1 / 6)), abs=1e-4)
    assert (l2["unused_experts"], l2["unused"], l2["hottest_expert"], l2["max_over_mean"]) == (2, [0, 2], 1, 2.6667)
    assert l2["entropy_bits"] == pytest.approx(-(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3)), abs=1e-4)
    assert s["hottest"][:2] == [{"layer": 2, "expert": 1, "tokens": 4, "share": 0.666667, "load_over_mean": 2.6667},
                                {"layer": 1, "expert": 0, "tokens": 3, "share": 0.5, "load_over_mean": 2.0}]
    assert s["lengths"]["min"] == 3
    assert s["lengths"]["max"] == 5
    assert sum(s["lengths"]["histogram"]["counts"]) == 2
    assert stats(r3store.open_store(tmp_path), sample_filter="b")["load"] == [[1, 0, 0, 1], [0, 0, 0, 2]]


def _flipped_pair(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Store A and store B equal but for one expert changed in known (token, layer) pairs."""
    rng = np.random.default_rng(14)
    spec = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)
    a = {f"s{i}": distinct_routes(rng, 30 + 7 * i, 4, 16, 2) for i in range(4)}
    masks, b = {}, {}
    for i, (sid, routes) in enumerate(a.items()):
        t, layer = np.meshgrid(np.arange(len(routes)), np.arange(4), indexing="ij")
        mask = (t * 3 + layer * 5 + i) % 7 == 0
        changed = routes.copy()
        for r, j in zip(*np.nonzero(mask), strict=True):
            free = [e for e in range(16) if e not in routes[r, j]]
            changed[r, j, r % 2] = free[(r + j) % len(free)]  # one expert of the pair replaced
        masks[sid], b[sid] = mask, changed
    write(tmp_path / "a", spec, {**a, "only-a": distinct_routes(rng, 5, 4, 16, 2)})
    write(tmp_path / "b", spec, {**b, "only-b1": distinct_routes(rng, 5, 4, 16, 2),
                                 "only-b2": distinct_routes(rng, 5, 4, 16, 2)})
    return tmp_path / "a", tmp_path / "b", a, masks


def test_diff_known_flip_rate(tmp_path: Path) -> None:
    path_a, path_b, _a, masks = _flipped_pair(tmp_path)
    d = diff(r3store.open_store(path_a), r3store.open_store(path_b))
    mask = np.concatenate(list(masks.values()))  # (tokens, layers)
    assert (d["samples_compared"], d["only_in_a"], d["only_in_b"]) == (4, 1, 2)
    assert d["only_in_b_examples"] == ["only-b1", "only-b2"]
    assert d["tokens"] == mask.shape[0]
    assert d["decisions"] == mask.size
    assert d["differing_decisions"] == int(mask.sum())
    assert d["decision_flip_rate"] == pytest.approx(mask.mean())
    assert d["token_flip_rate"] == pytest.approx(mask.any(axis=1).mean())
    assert d["mean_differing_layers_per_token"] == pytest.approx(mask.sum(axis=1).mean())
    assert d["set_overlap"] == pytest.approx(1 - mask.mean() / 2)  # one of two experts replaced
    assert [p["flip_rate"] for p in d["per_layer"]] == pytest.approx(list(mask.mean(axis=0)))
    assert d["row_mismatch"] == 0
    assert len(d["worst_samples"]) == 4
    same = diff(r3store.open_store(path_a), r3store.open_store(path_a), limit=2, workers=2)
    assert same["samples_compared"] == 2
    assert same["differing_decisions"] == 0
    assert same["set_overlap"] == 1.0


def test_diff_order_is_ignored_and_specs_must_match(tmp_path: Path) -> None:
    rng = np.random.default_rng(15)
    routes = distinct_routes(rng, 10, 4, 64, 2)
    write(tmp_path / "a", SPEC, {"x": routes})
    write(tmp_path / "b", r3store.ModelSpec(num_layers=5, num_experts=64, top_k=2, moe_layers=[0, 1, 2]),
          {"x": np.concatenate([routes[:, :1], routes[:, :2, ::-1]], axis=1)})  # layers 0, 1, 2 (1, 2 reversed)
    d = diff(r3store.open_store(tmp_path / "a"), r3store.open_store(tmp_path / "b"))
    assert d["layers"] == [1, 2]
    assert d["decision_flip_rate"] == 0.0
    write(tmp_path / "c", r3store.ModelSpec(num_layers=5, num_experts=32, top_k=2, moe_layers=[1, 2, 3, 4]),
          {"x": distinct_routes(rng, 10, 4, 32, 2)})
    with pytest.raises(SpecMismatchError):
        diff(r3store.open_store(tmp_path / "a"), r3store.open_store(tmp_path / "c"))
    differ, overlap = compare_routes(np.array([[[1, 1, 2]]]), np.array([[[1, 2, 3]]]))
    assert differ.tolist() == [[True]]
    assert overlap.tolist() == [[2]]


def test_show_subsets_and_quarantined(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2)
    rng = np.random.default_rng(16)
    routes = distinct_routes(rng, 12, 4, 48, 2)
    routes[3, 2] = [50, 1]
    routes[4, 1] = [6, 6]
    write(tmp_path, spec, {"q": routes}, quarantine=True)
    store = r3store.open_store(tmp_path)
    out = show(store, "q", layers=[2, 1], rows=slice(2, 6))
    assert out["quarantined"]
    assert "num_experts" in out["reason"]
    assert (out["row_start"], out["row_stop"], out["layers"]) == (2, 6, [2, 1])
    assert np.array_equal(np.array(out["routes"]), routes[2:6][:, [2, 1]])
    assert out["out_of_range"] == [[3, 2]]
    assert out["repeated"] == [[4, 1]]
    assert np.array(show(store, "q")["routes"]).shape == (12, 4, 2)
    with pytest.raises(SampleNotFoundError):
        show(store, "nope")
    with pytest.raises(LayerError):
        show(store, "q", layers=[7])
    assert parse_layers("2,3,10-12") == [2, 3, 10, 11, 12]
    assert parse_rows("5:") == slice(5, None)
    for bad in ("2,x", "5-3"):
        with pytest.raises(ValueError, match="layers="):
            parse_layers(bad)
    with pytest.raises(ValueError, match="rows='a:b'"):
        parse_rows("a:b")
