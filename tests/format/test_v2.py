"""Format v2 end to end: the bytes (manifest, frames, sample tables, keys), missing rows (issue 13
item 15), the row cap (item 17), policy versions per span (issue 11 item 5), the commit protocol
(buckets, retries) and format v1 compatibility (readers read it, writers refuse it)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import r3store
from r3store._format import (
    bucket_of,
    format_ranges,
    format_spans,
    load_schema,
    parse_ranges,
    parse_spans,
    table_digest,
)
from r3store.audit import show, stats, validate
from r3store.cli._main import main
from r3store.errors import (
    ExpertIdError,
    FormatError,
    FormatVersionError,
    OptionError,
    RouteValidationError,
    RowCountError,
    SampleTooLargeError,
    StorageError,
)
from r3store.storage import LocalBackend
from r3store.testing import forge

SPEC = r3store.ModelSpec(num_layers=5, num_experts=16, top_k=2, moe_layers=[1, 2, 4])
GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "stores"


def routes(rows: int, seed: int, layers: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((rows, layers, SPEC.num_experts)), axis=-1)[..., : SPEC.top_k].astype(np.int32)


def with_missing(arr: np.ndarray, *rows: slice) -> np.ndarray:
    out = arr.copy()
    for r in rows:
        out[r] = -1
    return out


# -- the bytes -------------------------------------------------------------------------------------------


def test_a_new_store_is_format_v2(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC, writer_id="w") as w:
        w.append("a", routes(6, 0))
    doc = json.loads((tmp_path / "r3store.json").read_text())
    assert (doc["version"], doc["limits"]) == (2, {"max_sample_rows": 2**22})
    assert doc["checksum"].startswith("crc32c:")
    assert len(doc["checksum"]) == 15
    jsonschema.validate(doc, load_schema("manifest"))
    (table,) = (tmp_path / "index").rglob("*.parquet")
    assert table.parent.name == bucket_of(dt.datetime.now(dt.UTC)) or len(table.parent.name) == 11
    meta = pq.read_metadata(table).metadata
    assert meta[b"r3store.version"] == b"2"
    assert meta[b"r3store.digest"].startswith(b"blake2b128:")
    zarr_json = json.loads((tmp_path / "routes" / "w-00000" / "zarr.json").read_text())
    assert zarr_json["attributes"]["r3store"] == {"commit": "w-00000", "writer_id": "w", "spec": SPEC.to_dict(),
                                                  "format_version": 2}
    blob = (tmp_path / "routes" / "w-00000" / "c" / "0" / "0" / "0").read_bytes()
    assert blob[:5] == b"R3BP\x02"  # version-2 frames
    store = r3store.open_store(tmp_path)
    assert store.format_version == 2
    for row in store.samples.to_pylist():
        jsonschema.validate({**row, "committed_at": row["committed_at"].isoformat()}, load_schema("sample_table"))


def test_digest_matches_its_plain_python_twin() -> None:
    """The vectorised digest == the definition in FORMAT.md written out row by row."""

    def reference(table: pa.Table, version: str, spec: str) -> str:
        h = hashlib.blake2b(digest_size=16)

        def text(value: str) -> bytes:
            raw = value.encode()
            return struct.pack("<I", len(raw)) + raw

        for field, column in zip(table.schema, table.columns, strict=True):
            kind = str(field.type)
            values = column.to_pylist()
            h.update(text(field.name) + text(kind) + struct.pack("<Q", len(values)))
            h.update(bytes(0 if v is None else 1 for v in values))
            for v in values:
                if kind == "int64":
                    h.update(struct.pack("<q", 0 if v is None else v))
                elif kind.startswith("timestamp"):
                    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
                    us = 0 if v is None else (v - epoch) // dt.timedelta(microseconds=1)
                    h.update(struct.pack("<q", us))
                elif kind == "double":
                    h.update(struct.pack("<d", 0.0 if v is None else v))
                elif kind == "bool":
                    h.update(bytes([1 if v else 0]))
                elif kind == "string":
                    h.update(text(v or ""))
        h.update(text(version) + text(spec))
        return f"blake2b128:{h.hexdigest()}"

    when = dt.datetime(2026, 11, 29, 7, tzinfo=dt.UTC)
    table = pa.table({
        "i": pa.array([1, None, -(2**63)], pa.int64()), "s": pa.array(["x", None, "héllo"]),
        "b": pa.array([True, None, False]), "d": pa.array([1.5, None, -0.0]),
        "t": pa.array([when, None, when], pa.timestamp("us", tz="UTC")), "n": pa.nulls(3),
    })
    assert table_digest(table, "2", '{"a":1}') == reference(table, "2", '{"a":1}')
    sliced = pa.concat_tables([table.slice(1, 2), table.slice(0, 1)])  # chunked, with offsets
    assert table_digest(sliced, "2", "{}") == reference(sliced, "2", "{}")
    with pytest.raises(FormatError, match="type int32"):
        table_digest(pa.table({"x": pa.array([1], pa.int32())}), "2", "{}")


@pytest.mark.parametrize(("text", "rows", "ok"), [
    ("0:3,5:7", 10, True), ("0:10", 10, True), ("3:4", 4, True),
    ("0:3,3:5", 10, False), ("5:7,0:3", 10, False), ("2:2", 10, False), ("0:11", 10, False),
    ("01:3", 10, False), ("0:3,", 10, False), ("", 10, False), ("-1:3", 10, False),
])
def test_missing_rows_text(text: str, rows: int, ok: bool) -> None:
    if ok:
        assert format_ranges(parse_ranges(text, rows)) == text
    else:
        with pytest.raises(ValueError):  # noqa: PT011 - the reader turns it into a FormatError naming the table
            parse_ranges(text, rows)


@pytest.mark.parametrize(("text", "rows", "ok"), [
    ("0:10=3", 10, True), ("0:4=1;4:10=2", 10, True), ("", 0, True),
    ("0:4=1;5:10=2", 10, False), ("0:4=1;4:9=2", 10, False), ("1:10=1", 10, False), ("0:0=1", 0, False),
    ("0:10=99999999999999999999", 10, False), ("0:10", 10, False),
])
def test_policy_spans_text(text: str, rows: int, ok: bool) -> None:
    if ok:
        assert format_spans(parse_spans(text, rows)) == text
    else:
        with pytest.raises(ValueError):  # noqa: PT011
            parse_spans(text, rows)


# -- item 15: missing rows, end to end -------------------------------------------------------------------


@pytest.fixture
def missing_store(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    full = np.zeros((12, SPEC.num_layers, SPEC.top_k), np.int32)
    full[:, list(SPEC.moe_layers)] = routes(12, 1)
    full[0:3] = -1  # a prefix-cache hit: every decoder layer -1 (SGLang layout)
    data = {
        "ok": routes(9, 0),
        "gap": with_missing(routes(10, 2), slice(2, 4), slice(7, 8)),
        "prefix": full,
        "multi": with_missing(routes(8, 3), slice(5, 8)),
    }
    with r3store.RouteWriter(tmp_path, SPEC, chunk_rows=4) as w:
        w.append("ok", data["ok"])
        w.append("gap", data["gap"], allow_missing=True)
        w.append_sglang("prefix", r3store.encode_sglang(full), num_tokens=13, allow_missing=True)
        w.append("multi", data["multi"][:5], final=False, allow_missing=True)
        w.append("multi", data["multi"][5:], start=5, allow_missing=True)
    data["prefix"] = full[:, list(SPEC.moe_layers)]
    return tmp_path, data


def test_missing_rows_are_stored_and_read_back_as_minus_one(missing_store: Any) -> None:
    root, data = missing_store
    store = r3store.open_store(root)
    assert store.missing_rows("gap") == [(2, 4), (7, 8)]
    assert store.missing_rows("prefix") == [(0, 3)]
    assert store.missing_rows("multi") == [(5, 8)]
    assert store.missing_rows("ok") == []
    for sid, expected in data.items():
        np.testing.assert_array_equal(store.get(sid), expected)
    np.testing.assert_array_equal(store.get("gap", layers=[4], rows=slice(3, 8)), data["gap"][3:8, [2]])
    row = store.row("gap")
    assert row["missing_rows"] == "2:4,7:8"
    assert row["num_rows"] == 10


def test_missing_rows_are_masked_in_batches(missing_store: Any) -> None:
    """replay_mask False there, and the route values are pad rows (never -1 from the store)."""
    root, data = missing_store
    store = r3store.open_store(root)
    ids = ["gap", "ok", "prefix"]
    batch = store.assemble(ids)
    mask, got = batch["replay_mask"], batch["routes"]
    start = 0
    for sid in ids:
        n = len(data[sid])
        missing = (data[sid] == -1).all(axis=(1, 2))
        np.testing.assert_array_equal(mask[start : start + n], ~missing)
        np.testing.assert_array_equal(got[start : start + n][~missing], data[sid][~missing])
        assert not mask[start + n]  # the last token's pad row
        start += n + 1
    assert got.min() >= 0  # pad rows hold in-range ids (spread)
    assert (got[~mask] < SPEC.num_experts).all()
    filled = store.assemble(ids, pad_policy="fill", fill_value=-7, cp_size=2, cp_rank=1)
    assert (filled["routes"][~filled["replay_mask"]] == -7).all()
    assert filled["replay_mask"].sum() == sum(int((~(data[s] == -1).all(axis=(1, 2))).sum()) for s in ids) - \
        store.assemble(ids, pad_policy="fill", cp_size=2, cp_rank=0)["replay_mask"].sum()


def test_missing_rows_are_masked_in_the_dataset(missing_store: Any) -> None:
    pytest.importorskip("torch")
    root, data = missing_store
    ds = r3store.RouteDataset(root, max_tokens_per_batch=10_000)
    (batch,) = list(ds)
    expected = np.concatenate([np.r_[~(data[s] == -1).all(axis=(1, 2)), False] for s in batch["sample_ids"]])
    np.testing.assert_array_equal(batch["replay_mask"].numpy(), expected)


def test_missing_rows_in_validate_stats_show_and_diff(missing_store: Any, tmp_path: Path) -> None:
    root, data = missing_store
    store = r3store.open_store(root, on_duplicate="report")
    report = validate(store)
    assert report.counts == {"missing_rows": 3}  # stored zeros are not taken for repeated ids or zero layers
    gap = next(f for f in report.findings if f.sample_id == "gap")
    assert gap.severity == "warning"
    assert gap.rows == ((2, 3), (7, 7))
    assert "3 of 10 rows" in gap.detail
    jsonschema.validate(report.to_dict(), load_schema("cli-validate"))
    result = stats(store)
    assert (result["missing_rows"], result["samples_with_missing_rows"]) == (9, 3)
    assert result["rows"] == sum(len(v) for v in data.values()) - 9
    assert sum(result["load"][0]) == result["rows"] * SPEC.top_k  # missing rows counted nowhere
    jsonschema.validate(result, load_schema("cli-stats"))
    shown = show(store, "gap", rows=slice(1, 5))
    assert shown["missing_rows"] == [[2, 4], [7, 8]]
    assert shown["repeated"] == []
    assert shown["routes"][1] == [[-1, -1]] * 3
    jsonschema.validate(shown, load_schema("cli-show"))
    other = tmp_path / "other"
    with r3store.RouteWriter(other, SPEC) as w:
        for sid, arr in data.items():
            w.append(sid, np.where(arr < 0, -1, arr), allow_missing=True)
    diff = r3store.audit.diff(store, r3store.open_store(other))
    assert diff["differing_decisions"] == 0
    assert diff["tokens"] == sum(len(v) for v in data.values()) - 9


def test_minus_one_rows_need_allow_missing(tmp_path: Path) -> None:
    arr = with_missing(routes(6, 1), slice(2, 3))
    with r3store.RouteWriter(tmp_path, SPEC) as w, pytest.raises(ExpertIdError, match="allow_missing=True"):
        w.append("s", arr)


def test_partly_missing_rows_are_still_errors(tmp_path: Path) -> None:
    arr = routes(6, 1)
    arr[2, 0] = -1  # one layer only: a fault, not a row the engine skipped
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(ExpertIdError, match="row 2, decoder layer 1 is negative"):
            w.append("s", arr, allow_missing=True)
        full = np.zeros((3, SPEC.num_layers, SPEC.top_k), np.int32)
        full[:, list(SPEC.moe_layers)] = routes(3, 2)
        full[1] = -1
        full[1, 3] = 5  # a dense layer of a missing row holds an id
        with pytest.raises(ExpertIdError, match=r"row 1 is missing .* dense decoder layer 3"):
            w.append("t", full, allow_missing=True)


# -- item 17: a cap on rows per sample -----------------------------------------------------------------------


def test_writer_refuses_samples_over_the_store_cap(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC, max_sample_rows=10) as w:
        w.append("fits", routes(10, 0))
        with pytest.raises(RowCountError, match="11 rows, more than the store's cap of 10"):
            w.append("long", routes(11, 1))
        w.append("turns", routes(6, 2), final=False)
        with pytest.raises(RowCountError, match="12 rows"):
            w.append("turns", routes(6, 3), start=6)
        w.append("turns", routes(4, 3), start=6)
    assert json.loads((tmp_path / "r3store.json").read_text())["limits"] == {"max_sample_rows": 10}
    assert sorted(r3store.open_store(tmp_path).sample_ids) == ["fits", "turns"]
    with pytest.raises(OptionError, match="caps samples at 10 rows"):
        r3store.RouteWriter(tmp_path, SPEC, max_sample_rows=20)
    r3store.RouteWriter(tmp_path, SPEC).close()  # the store's cap is adopted


def test_quarantined_sample_over_the_cap_keeps_no_routes(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC, max_sample_rows=5, on_invalid="quarantine") as w:
        w.append("long", routes(7, 0))
    store = r3store.open_store(tmp_path)
    assert store.row("long", include_quarantined=True)["num_rows"] == 0


def _forge_long_sample(root: Path, rows: int) -> None:
    """A consistent-looking store whose one sample claims ``rows`` rows (table and zarr.json)."""
    with r3store.RouteWriter(root, SPEC) as w:
        w.append("big", routes(4, 0))
    forge.rewrite_table(next((root / "index").rglob("*.parquet")), lambda t: t.set_column(
        2, "num_rows", pa.array([rows], pa.int64())).set_column(1, "num_tokens", pa.array([rows + 1], pa.int64())))
    (doc_path,) = (root / "routes").glob("*/zarr.json")
    doc = json.loads(doc_path.read_text())
    doc["shape"][0] = rows
    doc_path.write_text(json.dumps(doc))


def test_reader_refuses_a_sample_over_the_cap_before_allocating(tmp_path: Path) -> None:
    """Item 17: a few-KB forged store declared 2**39 rows; get() asked numpy for terabytes."""
    _forge_long_sample(tmp_path, 2**39)
    with pytest.raises(SampleTooLargeError) as info:
        r3store.open_store(tmp_path)
    assert (info.value.sample_id, info.value.rows, info.value.cap) == ("big", 2**39, 2**22)
    assert "max_sample_rows" in str(info.value)
    with pytest.raises(SampleTooLargeError):
        r3store.open_store(tmp_path, max_sample_rows=1000)
    # a caller may accept more: the storage objects are then checked before anything is allocated
    store = r3store.open_store(tmp_path, max_sample_rows=2**40)
    with pytest.raises(FileNotFoundError):
        store.get("big")
    with pytest.raises(OptionError):
        r3store.open_store(tmp_path, max_sample_rows=0)


# -- issue 11 item 5: policy versions per span --------------------------------------------------------------


@pytest.fixture
def policy_store(tmp_path: Path) -> Path:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("chat", routes(4, 0), final=False, policy_version=7)
        w.append("chat", routes(3, 1), start=4, final=False, policy_version=7)
        w.append("chat", routes(5, 2), start=7, policy_version=9)
        w.append("one", routes(6, 3), policy_version=9)
        w.append("none", routes(3, 4))
        sg = np.zeros((2, SPEC.num_layers, SPEC.top_k), np.int32)
        sg[:, list(SPEC.moe_layers)] = routes(2, 5)
        w.append_sglang("sg", r3store.encode_sglang(sg), num_tokens=3, policy_version=0)
    return tmp_path


def test_policy_spans_round_trip(policy_store: Path) -> None:
    store = r3store.open_store(policy_store)
    assert store.policy_spans("chat") == [(0, 7, 7), (7, 12, 9)]
    assert store.policy_spans("one") == [(0, 6, 9)]
    assert store.policy_spans("sg") == [(0, 2, 0)]
    assert store.policy_spans("none") == []
    rows = {r["sample_id"]: r for r in store.samples.to_pylist()}
    assert (rows["chat"]["policy_spans"], rows["chat"]["policy_version"]) == ("0:7=7;7:12=9", 9)
    assert (rows["none"]["policy_spans"], rows["none"]["policy_version"]) == (None, None)
    import pyarrow.compute as pc
    assert store.samples.filter(pc.field("policy_version") == 9).column("sample_id").to_pylist() == ["chat", "one"]


@pytest.mark.parametrize("options", [{}, {"cp_size": 2, "cp_rank": 1}, {"layout": "bshd"},
                                     {"tp_size": 4, "sequence_parallel": True, "tp_rank": 2}])
def test_assemble_returns_policy_versions_laid_out_like_the_routes(policy_store: Path,
                                                                   options: dict[str, Any]) -> None:
    store = r3store.open_store(policy_store)
    ids = ["none", "chat", "one"]
    batch = store.assemble(ids, return_policy_version=True, **options)
    plain = store.assemble(ids, **options)
    assert "policy_version" not in plain
    versions = batch["policy_version"]
    assert versions.dtype == np.int64
    assert versions.shape == batch["replay_mask"].shape
    np.testing.assert_array_equal(batch["routes"], plain["routes"])
    per_row = np.concatenate([np.r_[np.full(3, -1), -1], np.r_[np.full(7, 7), np.full(5, 9), -1],
                              np.r_[np.full(6, 9), -1]])
    # one plan for every per-token array: lay the expected versions out as "tokens" and compare
    laid = store.assemble(ids, tokens=[per_row[:4], per_row[4:17], per_row[17:]], **options)["tokens"]
    pad = ~batch["replay_mask"]
    np.testing.assert_array_equal(versions[~pad], laid[~pad])
    assert (versions[pad] == -1).all()


def test_dataset_can_return_policy_versions(policy_store: Path) -> None:
    pytest.importorskip("torch")
    ds = r3store.RouteDataset(policy_store, max_tokens_per_batch=1000, return_policy_version=True)
    (batch,) = list(ds)
    assert batch["policy_version"].shape == batch["replay_mask"].shape
    assert set(batch["policy_version"].tolist()) == {-1, 0, 7, 9}


def test_show_and_stats_report_mixed_versions(policy_store: Path) -> None:
    store = r3store.open_store(policy_store)
    shown = show(store, "chat")
    assert shown["policy_spans"] == [[0, 7, 7], [7, 12, 9]]
    assert shown["mixed_policy"]
    assert not show(store, "one")["mixed_policy"]
    assert show(store, "none")["policy_spans"] == []
    result = stats(store)
    assert result["policy"] == {"samples_with_version": 3, "mixed_version_samples": 1, "min_version": 0,
                                "max_version": 9}
    cli = CliRunner().invoke(main, ["show", str(policy_store), "chat"])
    assert cli.exit_code == 0
    assert "mixed policy versions 7 (rows 0-6), 9 (rows 7-11)" in " ".join(cli.output.split())
    cli = CliRunner().invoke(main, ["stats", str(policy_store)])
    assert cli.exit_code == 0
    assert "on 3 samples; 1 sample mixes versions" in " ".join(cli.output.split())


def test_policy_versions_are_all_or_nothing_per_sample(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", routes(3, 0), final=False, policy_version=1)
        with pytest.raises(RouteValidationError, match="not given for this part but for earlier ones"):
            w.append("a", routes(3, 1), start=3)
        w.append("a", routes(3, 1), start=3, policy_version=2)
        w.append("b", routes(3, 0), final=False)
        with pytest.raises(RouteValidationError, match="given for this part but not for earlier ones"):
            w.append("b", routes(3, 1), start=3, policy_version=1)
        for bad in (-1, 2**63, 1.0, True, "3"):
            with pytest.raises(RouteValidationError, match="policy_version"):
                w.append("c", routes(3, 0), policy_version=bad)  # type: ignore[arg-type]
        w.append("b", routes(3, 1), start=3)
        with pytest.raises(RouteValidationError, match="metadata\\['policy_version'\\]"):
            w.append("d", routes(3, 0), metadata={"policy_version": 3})
    assert r3store.open_store(tmp_path).policy_spans("a") == [(0, 3, 1), (3, 6, 2)]


# -- the commit protocol ----------------------------------------------------------------------------------------


class _Clock:
    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now


class _FailTables(LocalBackend):
    """Sample-table writes fail ``times`` times."""

    def __init__(self, root: Path, times: int) -> None:
        super().__init__(root)
        self.times = times

    def set_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith("index/") and self.times > 0:
            self.times -= 1
            raise StorageError(self.path_of(key), "injected failure")
        return super().set_if_absent(key, data)


@pytest.mark.parametrize(("later", "bucket"), [(dt.timedelta(minutes=9), "20261129T07"),
                                              (dt.timedelta(minutes=11), "20261129T08")])
def test_table_bucket_is_the_hour_of_the_first_attempt(tmp_path: Path, later: dt.timedelta, bucket: str) -> None:
    """A retry within 10 minutes reuses the bucket; a later one writes under the current hour."""
    from r3store.writer._commit import Committer

    clock = _Clock(dt.datetime(2026, 11, 29, 7, 55, tzinfo=dt.UTC))
    backend = _FailTables(tmp_path, times=1)
    writer = r3store.RouteWriter(backend, SPEC, writer_id="w")
    committer: Committer = writer._committer
    committer.clock = clock
    writer.append("a", routes(3, 0))
    with pytest.raises(StorageError):
        writer.flush()
    clock.now += later
    writer.flush()
    writer.close()
    (table,) = (tmp_path / "index").rglob("*.parquet")
    assert table.relative_to(tmp_path).as_posix() == f"index/{bucket}/w-00000.parquet"
    assert r3store.open_store(tmp_path).sample_ids == ["a"]


def test_a_retry_rewrites_zarr_json_and_refuses_another(tmp_path: Path) -> None:
    backend = _FailTables(tmp_path, times=2)
    writer = r3store.RouteWriter(backend, SPEC, writer_id="w")
    writer.append("a", routes(3, 0))
    with pytest.raises(StorageError):
        writer.flush()
    doc = tmp_path / "routes" / "w-00000" / "zarr.json"
    doc.unlink()
    with pytest.raises(StorageError):
        writer.flush()
    assert doc.is_file()  # written again by the retry
    doc.write_text(doc.read_text().replace('"writer_id": "w"', '"writer_id": "x"'))
    with pytest.raises(StorageError, match="another array document"):
        writer.flush()
    assert not list((tmp_path / "index").rglob("*.parquet"))


def test_a_second_table_of_one_commit_in_another_bucket(tmp_path: Path) -> None:
    """A late retry may land a second copy of a table in a later bucket: the same bytes count once."""
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", routes(3, 0))
    (table,) = (tmp_path / "index").rglob("*.parquet")
    copy = tmp_path / "index" / "20991231T23" / table.name
    copy.parent.mkdir()
    copy.write_bytes(table.read_bytes())
    assert r3store.open_store(tmp_path).sample_ids == ["a"]
    copy.write_bytes(forge.reseal_table(table.read_bytes(), lambda t: t.set_column(
        t.schema.get_field_index("reason"), "reason", pa.array(["forged"], pa.string()))))
    with pytest.raises(FormatError, match=r"second sample table of commit .* differs"):
        r3store.open_store(tmp_path)


# -- format v1 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["v1-tiny", "v1-flame", "v1-odd"])
def test_writers_refuse_format_v1_stores(tmp_path: Path, store: str) -> None:
    import shutil

    shutil.copytree(GOLDEN / store, tmp_path / store)
    before = sorted(p.read_bytes() for p in (tmp_path / store).rglob("*") if p.is_file())
    spec = r3store.open_store(tmp_path / store).spec
    with pytest.raises(FormatVersionError, match="format version 1; this release reads it but writes only format "
                                                 "version 2 stores"):
        r3store.RouteWriter(tmp_path / store, spec)
    assert sorted(p.read_bytes() for p in (tmp_path / store).rglob("*") if p.is_file()) == before


def test_v1_tables_are_exposed_with_the_v2_columns() -> None:
    store = r3store.open_store(GOLDEN / "v1-flame")
    assert store.format_version == 1
    names = store.samples.column_names
    assert names[:14] == ["sample_id", "num_tokens", "num_rows", "row_start", "array", "commit", "writer_id",
                          "token_hash", "committed_at", "quarantined", "reason", "missing_rows", "policy_spans",
                          "policy_version"]
    assert "shard" not in names
    assert "step" in names
    assert store.samples.column("missing_rows").null_count == len(store.samples)
    assert store.policy_spans("flame-00") == []
    assert store.missing_rows("flame-00") == []
    assert set(store.samples.column("commit").to_pylist()) == {"golden-a-00000", "golden-b-00000"}


def test_v1_metadata_column_named_like_a_v2_column(tmp_path: Path) -> None:
    """A v1 user column `policy_version` (int) becomes the v2 column; any other clash is renamed v1.<name>."""
    import shutil

    root = tmp_path / "s"
    shutil.copytree(GOLDEN / "v1-tiny", root)
    (table_path,) = (root / "index").glob("*.parquet")
    table = pq.read_table(table_path)
    n = table.num_rows
    table = table.append_column("policy_version", pa.array(range(n), pa.int64()))
    table = table.append_column("missing_rows", pa.array(["x"] * n))
    pq.write_table(table, table_path)
    store = r3store.open_store(root)
    assert store.samples.column("policy_version").to_pylist() == list(range(n))
    assert store.samples.column("v1.missing_rows").to_pylist() == ["x"] * n
    assert store.samples.column("missing_rows").null_count == n


# -- the catalogue can start from rows loaded elsewhere (checkpoints build on it) ------------------------------


def test_reader_takes_preloaded_rows_and_reads_only_the_other_tables(tmp_path: Path) -> None:
    from r3store._format import MANIFEST_KEY, loads_document, parse_manifest
    from r3store.reader import Preloaded, RouteReader

    for i in range(3):
        with r3store.RouteWriter(tmp_path, SPEC, writer_id=f"w{i}") as w:
            w.append(f"s{i}", routes(4 + i, i), metadata={"step": i})
    full = r3store.open_store(tmp_path)
    covered = frozenset(["w0-00000", "w1-00000"])
    rows = full.samples.filter(pa.compute.is_in(full.samples.column("commit"), pa.array(sorted(covered))))
    for table in (tmp_path / "index").rglob("w[01]-*.parquet"):
        table.unlink()  # the preloaded commits' tables are not read again
    backend = LocalBackend(tmp_path)
    path = backend.path_of(MANIFEST_KEY)
    manifest = parse_manifest(loads_document(backend.get(MANIFEST_KEY), path), path)
    reader = RouteReader(backend, manifest, preloaded=Preloaded(rows, covered))
    assert reader.sample_ids == ["s0", "s1", "s2"]
    assert reader.commits == ["w0-00000", "w1-00000", "w2-00000"]
    for i in range(3):
        np.testing.assert_array_equal(reader.get(f"s{i}"), routes(4 + i, i))
    assert reader.samples.column("step").to_pylist() == [0, 1, 2]


@pytest.mark.parametrize(("column", "value", "words"), [
    ("missing_rows", "3:2", "not sorted, merged and non-empty"),
    ("missing_rows", "0:99", "reach past the sample's 6 rows"),
    ("missing_rows", "", "is not 'a:b,c:d' ranges"),
    ("policy_spans", "0:3=1", "cover 3 rows, the sample has 6"),
    ("policy_spans", "0:6=1;6:6=2", "do not cover the rows in order"),
    ("policy_version", 5, "must be null exactly when policy_spans is"),
])
def test_forged_v2_columns_are_refused(tmp_path: Path, column: str, value: object, words: str) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", routes(6, 0), policy_version=1 if column == "policy_spans" else None)
    (path,) = (tmp_path / "index").rglob("*.parquet")

    def edit(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(column)
        return t.set_column(i, t.schema.field(i), pa.array([value], t.schema.field(i).type))

    forge.rewrite_table(path, edit)
    with pytest.raises(FormatError, match=f"row 0 \\(sample 'a'\\): .*{words}") as info:
        r3store.open_store(tmp_path)
    assert path.name in str(info.value)


def test_digest_of_string_chunks_follows_the_documented_bytes() -> None:
    """Sliced chunks, all-null chunks and null slots that still hold bytes hash as FORMAT.md says:
    per row u32 length + UTF-8 (a null row: length 0 and no bytes)."""
    validity = pa.array([True, False, True]).buffers()[1]
    holey = pa.Array.from_buffers(pa.string(), 3, [validity, pa.py_buffer(np.array([0, 2, 5, 6], np.int32).tobytes()),
                                                   pa.py_buffer(b"abXYZc")])  # the null row holds "XYZ"
    column = pa.chunked_array([holey, holey.slice(1), pa.array([None, None], pa.string()), pa.array(["é", ""])])
    rows = ["ab", None, "c", None, "c", None, None, "é", ""]

    def text(value: bytes) -> bytes:
        return struct.pack("<I", len(value)) + value

    h = hashlib.blake2b(digest_size=16)
    h.update(text(b"s") + text(b"string") + struct.pack("<Q", len(rows)))
    h.update(bytes(int(r is not None) for r in rows))
    h.update(b"".join(text(b"" if r is None else r.encode()) for r in rows))
    h.update(text(b"2") + text(b"{}"))
    assert table_digest(pa.table({"s": column}), "2", "{}") == f"blake2b128:{h.hexdigest()}"
