"""Hostile stores and hostile arguments: every one ends in a named r3store error (or a usage
error for the CLI), never a crash, a hang, a huge allocation, a file written outside the
store or cache, or silently wrong data."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import r3store
from r3store.audit import parse_layers, parse_rows
from r3store.cli._main import main
from r3store.codecs import BitpackCodec
from r3store.errors import (
    FormatError,
    LayoutOptionError,
    PayloadDecodeError,
    R3StoreError,
    ResumeError,
    StorageError,
)
from r3store.layout import apply_routes, pad_routes, plan_layout
from r3store._format import is_immutable_key
from r3store.storage import ByteRange, CachingBackend, LocalBackend, open_backend
from r3store.testing import forge

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((rows, SPEC.num_moe_layers, SPEC.num_experts)), axis=-1)[..., :SPEC.top_k].astype(np.int32)


def make_store(root: Path | str, n: int = 3, rows: int = 10, seed: int = 0, **kw: Any) -> dict[str, np.ndarray]:
    data = {f"s{i}": routes(rows, seed + i) for i in range(n)}
    with r3store.RouteWriter(str(root), SPEC, **kw) as w:
        for sid, r in data.items():
            w.append(sid, r, metadata={"step": 1})
    return data


def index_file(root: Path) -> Path:
    (path,) = (root / "index").rglob("*.parquet")
    return path


def array_dir(root: Path) -> Path:
    (path,) = (p for p in (root / "routes").iterdir() if p.is_dir())
    return path


def rewrite_table(root: Path, edit: Callable[[pa.Table], pa.Table]) -> Path:
    """Edit the store's sample table as a forger would: the digest recomputed, so the row rules are what refuse it."""
    return forge.rewrite_table(index_file(root), edit)


def set_column(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i).with_nullable(True), pa.array(values, type=table.schema.field(i).type))


def edit_zarr(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = array_dir(root) / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block takes longer than ``seconds``."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    make_store(root)
    return root


# -- 1. forged array / shard columns, keys leaving the root (A6, A7) --------------------------


def test_forged_array_column_cannot_read_another_store(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    make_store(mine)
    make_store(other, seed=100)
    foreign = os.path.relpath(array_dir(other), mine)
    path = rewrite_table(mine, lambda t: set_column(t, "array", [foreign] * t.num_rows))
    with pytest.raises(FormatError, match="column 'array'") as info:
        r3store.open_store(mine)
    assert path.name in str(info.value) and info.value.path.endswith(path.name)


@pytest.mark.parametrize(("column", "value"), [("commit", "someone-else-00000"), ("array", "routes/someone-else-00000")])
def test_sample_table_names_only_its_own_shard(store_dir: Path, column: str, value: str) -> None:
    path = rewrite_table(store_dir, lambda t: set_column(t, column, [value] * t.num_rows))
    with pytest.raises(FormatError, match=f"column '{column}'") as info:
        r3store.open_store(store_dir)
    assert path.name in str(info.value)


def test_sample_table_copied_under_another_name(store_dir: Path) -> None:
    (index_file(store_dir).parent / "copy-00000.parquet").write_bytes(index_file(store_dir).read_bytes())
    with pytest.raises(FormatError, match="copy-00000.parquet.*column 'commit'"):
        r3store.open_store(store_dir)


@pytest.mark.parametrize("name", ["-dash-00000", "sp ace-00000", "x" * 241])
def test_index_file_name_must_be_a_shard_name(store_dir: Path, name: str) -> None:
    (index_file(store_dir).parent / f"{name}.parquet").write_bytes(index_file(store_dir).read_bytes())
    with pytest.raises(FormatError, match="does not match") as info:
        r3store.open_store(store_dir)
    assert name in str(info.value)


@pytest.mark.parametrize("where", ["sub/x-00000", "20261301T00/x-00000", "20261129T07/deeper/x-00000", "x-00000"])
def test_index_file_in_a_subfolder_is_rejected(store_dir: Path, where: str) -> None:
    """Format v2 tables live at index/<bucket>/<commit>.parquet, <bucket> a real UTC hour."""
    path = store_dir / "index" / f"{where}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(index_file(store_dir).read_bytes())
    with pytest.raises(FormatError, match=f"{where}.parquet: a format v2 sample table must be index/<bucket>/"):
        r3store.open_store(store_dir)


ESCAPING_KEYS = ["../x", "routes/../../x", "/abs", "a//b", "./x", "a/./b", "a/", "", "a\0b", "a/.."]


@pytest.mark.parametrize("key", ESCAPING_KEYS)
def test_local_store_refuses_keys_that_leave_the_root(tmp_path: Path, key: str) -> None:
    store = LocalBackend(tmp_path / "root" / "deeper")
    calls = [lambda: store.get(key), lambda: store.set(key, b"x"), lambda: store.exists(key),
             lambda: store.delete(key), lambda: store.info(key), lambda: store.set_if_absent(key, b"x")]
    for call in calls:
        with pytest.raises(StorageError, match="invalid key"):
            call()
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing written, not even the root


def test_caching_store_never_writes_outside_cache_dir(tmp_path: Path, s3_url: str,
                                                      s3_storage_options: dict[str, Any]) -> None:
    """A hostile S3 store holds objects at literal keys with '..' components (legal in S3)."""
    import s3fs

    make_store(s3_url, n=1, storage_options=s3_storage_options)
    fs = s3fs.S3FileSystem(**s3_storage_options)
    fs.invalidate_cache()
    bucket_path = s3_url.removeprefix("s3://")
    (shard,) = [p for p in fs.ls(f"{bucket_path}/routes") if not p.endswith("zarr.json")]
    name = f"escape-{uuid.uuid4().hex[:8]}"
    evil = f"routes/../../../{name}"
    client = _boto3_client(s3_storage_options)
    bucket, prefix = bucket_path.split("/", 1)
    for sub in ("zarr.json", "c/0/0/0"):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{evil}/{sub}", Body=fs.cat_file(f"{shard}/{sub}"))
    (table_key,) = fs.find(f"{bucket_path}/index")
    forged = forge.reseal_table(fs.cat_file(table_key), lambda t: set_column(t, "array", [evil] * t.num_rows))
    fs.pipe_file(table_key, forged)
    cache = tmp_path / "cache"
    # the reader refuses the forged table at open ...
    with pytest.raises(FormatError, match="column 'array'"):
        r3store.open_store(s3_url, storage_options=s3_storage_options, cache_dir=cache)
    # ... and the cache refuses the key itself (defense in depth)
    inner = open_backend(s3_url, s3_storage_options)
    assert bytes(inner.get(f"{evil}/zarr.json"))  # the object is there, at that literal key
    cached = CachingBackend(inner, cache, immutable=is_immutable_key)
    for read in (lambda: cached.get(f"{evil}/c/0/0/0"), lambda: cached.get_many([f"{evil}/zarr.json"]),
                 lambda: cached.get_ranges(f"{evil}/c/0/0/0", [ByteRange(0, 4)])):
        with pytest.raises(StorageError, match="invalid key"):
            read()
    outside = [p for p in tmp_path.rglob("*") if cache not in p.parents and p != cache]
    assert outside == [] and not any(name in str(p) for p in tmp_path.rglob("*"))


def _boto3_client(options: dict[str, Any]) -> Any:
    import boto3

    kwargs = options["client_kwargs"]
    return boto3.client("s3", endpoint_url=kwargs["endpoint_url"], region_name=kwargs["region_name"],
                        aws_access_key_id=options["key"], aws_secret_access_key=options["secret"])


# -- 2. a chunk marked missing inside the array (A10) ------------------------------------------


def test_index_entry_marked_missing_inside_the_rows(store_dir: Path) -> None:
    obj = array_dir(store_dir) / "c" / "0" / "0" / "0"
    blob = obj.read_bytes()
    index = np.frombuffer(blob[-20:-4], "<u8").copy()
    index[:] = 2**64 - 1
    raw = index.tobytes()
    obj.write_bytes(blob[:-20] + raw + struct.pack("<I", google_crc32c.value(raw)))
    store = r3store.open_store(store_dir)
    with pytest.raises(FormatError, match=r"marks chunk \(0, 0, 0\) missing"):
        store.get("s0")


# -- 3. sample-table sanity ---------------------------------------------------------------------


REQUIRED = ["sample_id", "num_tokens", "num_rows", "row_start", "array", "commit", "committed_at", "quarantined"]


@pytest.mark.parametrize("column", REQUIRED)
def test_sample_table_nulls(store_dir: Path, column: str) -> None:
    path = rewrite_table(store_dir, lambda t: set_column(t, column, [None] * t.num_rows))
    with pytest.raises(FormatError, match=f"column '{column}' must not be null") as info:
        r3store.open_store(store_dir)
    assert path.name in str(info.value)


@pytest.mark.parametrize(("column", "values", "words"), [
    ("num_rows", [-3, 10, 10], "column 'num_rows' must lie in"),
    ("row_start", [-5, 10, 20], "column 'row_start' must lie in"),
    ("num_tokens", [0, 11, 11], "column 'num_tokens' must lie in"),
    ("num_tokens", [2**45, 11, 11], "column 'num_tokens' must lie in"),  # assemble allocated 1 PiB
    ("num_tokens", [5, 11, 11], "column 'num_rows' must be num_tokens - 1"),
    ("row_start", [0, 0, 20], "share rows"),
    ("row_start", [0, 5, 20], "share rows"),
])
def test_sample_table_values(store_dir: Path, column: str, values: list[int], words: str) -> None:
    path = rewrite_table(store_dir, lambda t: set_column(t, column, values))
    with pytest.raises(FormatError, match=words) as info:
        r3store.open_store(store_dir)
    assert path.name in str(info.value)


def test_quarantined_row_count_may_differ(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC, on_invalid="quarantine") as w:
        w.append("ok", routes(4, 1))
        w.append("off", routes(4, 2), num_tokens=4)  # rows == num_tokens: quarantined, still stored
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["ok"] and store.get("off", include_quarantined=True).shape == (4, 4, 2)


@pytest.mark.parametrize(("rows", "finding"), [(10**15, "malformed_chunk"), (10**9, "malformed_chunk"),
                                               (31, "malformed_chunk"), (29, "table_mismatch")])
def test_zarr_rows_must_match_the_sample_table(store_dir: Path, rows: int, finding: str) -> None:
    """The table ends at row 30; zarr.json claiming 10**15 rows made validate scan them all."""
    edit_zarr(store_dir, lambda d: d["shape"].__setitem__(0, rows))
    store = r3store.open_store(store_dir)
    with deadline(30), pytest.raises(FormatError, match="zarr.json"):
        store.get("s0")
    with deadline(30):
        report = r3store.audit.validate(store)
    assert [f.kind for f in report.findings] == [finding]


# -- 4. bounds on zarr.json ------------------------------------------------------------------------


def _both_chunk_rows(value: int) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["chunk_grid"]["configuration"]["chunk_shape"][0] = value
        d["codecs"][0]["configuration"]["chunk_shape"][0] = value
    return edit


@pytest.mark.parametrize(("edit", "words"), [
    (_both_chunk_rows(2**31), "ids per inner chunk"),  # was a 64 GiB MemoryError
    (lambda d: d["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(0, 30 * 2**21), "inner chunks per storage"),
    (lambda d: d["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(0, 45), "bad geometry"),
    (lambda d: d["codecs"][0]["configuration"]["chunk_shape"].__setitem__(1, 400), "layers_per_chunk"),
    (lambda d: d["codecs"][0]["configuration"]["chunk_shape"].__setitem__(2, 99), "do not tile"),
    (lambda d: d["shape"].__setitem__(0, 2**40), "rows"),
    (lambda d: d["shape"].__setitem__(0, 30.0), "expected 3 integers"),
    (lambda d: d["shape"].__setitem__(1, True), "expected 3 integers"),
    (lambda d: d["codecs"][0]["configuration"]["codecs"][0]["configuration"].update(bits=99), "disagrees"),
])
def test_zarr_json_bounds(store_dir: Path, edit: Callable[[dict[str, Any]], None], words: str) -> None:
    edit_zarr(store_dir, edit)
    store = r3store.open_store(store_dir)
    with pytest.raises(FormatError, match=words) as info:
        store.get("s0")
    assert "zarr.json" in str(info.value)


# -- 5. Parquet decompression bombs ----------------------------------------------------------------


def _write_with(path: Path, table: pa.Table, **kw: Any) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", **kw)
    path.write_bytes(buf.getvalue())


def test_parquet_bomb_is_refused_before_decompressing(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("r3store._format._table.MAX_TABLE_BYTES", 1 << 20)
    path = index_file(store_dir)
    table = pq.read_table(path)
    _write_with(path, table.append_column("note", pa.array(["a" * (4 << 20)] * table.num_rows)))
    assert path.stat().st_size < 10_000
    with pytest.raises(FormatError, match="decodes to .* over the cap") as info:
        r3store.open_store(store_dir)
    assert path.name in str(info.value)


def test_dictionary_bomb_is_measured_before_decoding(store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One long dictionary value repeated by run-length encoding: tiny pages, huge strings."""
    monkeypatch.setattr("r3store._format._table.MAX_TABLE_BYTES", 1 << 20)
    path = index_file(store_dir)
    table = pq.read_table(path)
    note = pa.DictionaryArray.from_arrays(pa.array(np.zeros(table.num_rows, np.int32)), pa.array(["a" * (1 << 19)]))
    _write_with(path, table.append_column("note", note), store_schema=False)
    with pytest.raises(FormatError, match="strings decode to"):
        r3store.open_store(store_dir)


@pytest.mark.parametrize("shape", ["columns", "cells", "nested"])
def test_sample_table_shape_caps(store_dir: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    path = index_file(store_dir)
    table = pq.read_table(path)
    if shape == "columns":
        for i in range(1000):
            table = table.append_column(f"m{i}", pa.array([i] * table.num_rows))
    elif shape == "cells":
        monkeypatch.setattr("r3store._format._table.MAX_TABLE_CELLS", 20)
    else:
        table = table.append_column("nested", pa.array([[1, 2]] * table.num_rows))
    _write_with(path, table)
    with pytest.raises(FormatError, match="columns|cells|scalars"):
        r3store.open_store(store_dir)


# -- 6. special files, deep JSON --------------------------------------------------------------------


@pytest.mark.parametrize("target", ["manifest", "zarr", "index"])
def test_symlink_to_dev_zero(store_dir: Path, target: str) -> None:
    path = {"manifest": store_dir / "r3store.json", "zarr": array_dir(store_dir) / "zarr.json",
            "index": index_file(store_dir)}[target]
    path.unlink()
    path.symlink_to("/dev/zero")
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(store_dir).get("s0")


def test_fifo_in_index_does_not_hang(store_dir: Path) -> None:
    os.mkfifo(index_file(store_dir).parent / "zz-00000.parquet")
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(store_dir)


def test_fifo_route_object_does_not_hang(store_dir: Path) -> None:
    obj = array_dir(store_dir) / "c" / "0" / "0" / "0"
    obj.unlink()
    os.mkfifo(obj)
    with deadline(20), pytest.raises(StorageError, match="not a regular file"):
        r3store.open_store(store_dir).get("s0")


@pytest.mark.parametrize("target", ["manifest", "zarr"])
def test_deeply_nested_json(store_dir: Path, target: str) -> None:
    path = store_dir / "r3store.json" if target == "manifest" else array_dir(store_dir) / "zarr.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FormatError, match="nested too deeply"):
        r3store.open_store(store_dir).get("s0")


# -- 7. decode_vllm headers ---------------------------------------------------------------------------


def _npy(header: str, body: bytes) -> bytes:
    header = header + " " * (63 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + body


@pytest.mark.parametrize("shape", ["(1000000000000, 4, 2)", "(3, 4, 2)"])
def test_decode_vllm_header_claims_more_than_present(shape: str) -> None:
    blob = _npy(f"{{'descr': '<i4', 'fortran_order': False, 'shape': {shape}, }}", b"\x00" * 16)
    with pytest.raises(PayloadDecodeError, match="only 16 bytes follow"):
        r3store.decode_vllm("x", base64.b64encode(blob))


def test_decode_vllm_still_reads_npy() -> None:
    buf = io.BytesIO()
    np.save(buf, np.arange(24, dtype=np.uint16).reshape(3, 4, 2))
    assert r3store.decode_vllm("x", base64.b64encode(buf.getvalue())).tolist() == np.arange(24).reshape(3, 4, 2).tolist()


# -- 8. layout extremes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"tp_size": 2**33, "tp_rank": 0, "sequence_parallel": True}, "tp_size"),
    ({"tp_size": 2**31, "pad_multiple": 2**31}, "tp_size * pad_multiple"),
    ({"pad_multiple": 2**40}, "pad_multiple"),
    ({"layout": "bshd", "max_seqlen": 2**40}, "max_seqlen"),
    ({"layout": "bshd", "max_seqlen": 2**41}, "max_seqlen"),
])
def test_plan_layout_refuses_huge_padding_before_allocating(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(LayoutOptionError) as info:
        plan_layout([3], **kwargs)
    assert info.value.option == option


@pytest.mark.parametrize("num_tokens", [np.array([2**63 + 5], np.uint64), [2**40 + 1], [2**40, 2**40]])
def test_plan_layout_refuses_huge_token_counts(num_tokens: Any) -> None:
    with pytest.raises(LayoutOptionError, match="num_tokens"):
        plan_layout(num_tokens)


def test_plan_layout_huge_cp_size_is_small() -> None:
    assert plan_layout([3], cp_size=2**31, cp_rank=0).index.shape == (2,)


def test_spread_pad_rows_need_top_k_distinct_experts() -> None:
    with pytest.raises(LayoutOptionError, match="top_k=3"):
        apply_routes(plan_layout([2]), np.zeros((1, 1, 3), np.int32), num_experts=2)
    with pytest.raises(LayoutOptionError, match="top_k=3"):
        pad_routes(1, 1, 3, 2)
    out, _ = apply_routes(plan_layout([2]), np.zeros((1, 1, 3), np.int32), num_experts=2, pad_policy="fill")
    assert out[1].tolist() == [[-1, -1, -1]]


# -- 9, 10. CLI usage errors -----------------------------------------------------------------------------


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(("args", "words"), [
    (["--layers", "0-2000000000"], "more than 100,000 layers"),
    (["--layers", "1,1"], "layer 1 is listed twice"),
    (["--rows", "-1"], "no negative numbers"),
    (["--rows", "-3:-1"], "no negative numbers"),
    (["--rows", "5:2"], "end must be greater"),
    (["--rows", "99999999999999999999999:"], "select none of the sample's 10 rows"),
    (["--rows", "10"], "select none"),
])
def test_show_usage_errors(store_dir: Path, args: list[str], words: str) -> None:
    result = _cli("show", str(store_dir), "s0", *args)
    assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_show_rows_still_work(store_dir: Path) -> None:
    result = _cli("show", str(store_dir), "s0", "--rows", "9:", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["row_start"] == 9


def test_parse_layers_and_rows() -> None:
    assert parse_layers("3,0-1") == [3, 0, 1]
    assert parse_rows(":4") == slice(None, 4)
    for text in ("2,1-3", "0-100000"):
        with pytest.raises(ValueError):
            parse_layers(text)


def test_stats_plot_into_missing_folder(store_dir: Path) -> None:
    result = _cli("stats", str(store_dir), "--plot", "/nonexistent/dir/x.png")
    assert result.exit_code == 2 and "does not exist" in result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, FileNotFoundError)


def test_plot_write_failure_is_a_usage_error(tmp_path: Path) -> None:
    import click

    from r3store.cli._scan import save_plot

    def draw(result: dict[str, Any], path: str, size: tuple[int, int]) -> None:
        raise PermissionError(13, "Permission denied", path)

    with pytest.raises(click.BadParameter, match="cannot write .*Permission denied"):
        save_plot(draw, {}, str(tmp_path / "x.png"), (100, 100))


@pytest.mark.parametrize("option", ['config_kwargs="notadict"', "client_kwargs=3", "s3_additional_kwargs=[1]"])
def test_storage_option_that_must_be_a_mapping(option: str) -> None:
    result = _cli("inspect", "s3://bucket/x", "-o", option)
    assert result.exit_code == 2 and "must be a mapping" in " ".join(result.output.split()), result.output
    assert len(result.output.strip().splitlines()) <= 3  # one message (rich wraps long lines)


def test_storage_options_checked_in_open_backend() -> None:
    with pytest.raises(StorageError, match="config_kwargs must be a mapping"):
        open_backend("memory://x", {"config_kwargs": "notadict"})
    with pytest.raises(StorageError, match="must be a mapping"):
        open_backend("memory://x", ["not", "a", "mapping"])  # type: ignore[arg-type]


# -- 11. reader and dataset API misuse -----------------------------------------------------------------


def test_reader_api_misuse(store_dir: Path) -> None:
    store = r3store.open_store(store_dir)
    with pytest.raises(TypeError, match=r"use slice\(0, 1\)"):
        store.get("s0", rows=(0, 1))  # type: ignore[arg-type]
    assert [1] not in store and None not in store and "s0" in store
    with pytest.raises(ValueError, match="return_tensors"):
        store.assemble(["s0"], return_tensors="tf")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="not a committed route array"):
        store.read_rows("routes/elsewhere", 0, 1, [0])


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"pad_policy": "zeros"}, LayoutOptionError),
    ({"pad_policy": "fill", "fill_value": "x"}, LayoutOptionError),
    ({"pad_policy": "fill", "fill_value": 2**40}, LayoutOptionError),
    ({"shuffle": True, "seed": -1}, ValueError),
    ({"seed": 1.5}, ValueError),
])
def test_route_dataset_checks_arguments_at_construction(store_dir: Path, kwargs: dict[str, Any], exc: type) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    with pytest.raises(exc):
        RouteDataset(store_dir, max_tokens_per_batch=64, **kwargs)


@pytest.mark.parametrize(("key", "value"), [("yielded", -2), ("yielded", "3"), ("yielded", True), ("epoch", -1)])
def test_load_state_dict_checks_progress(store_dir: Path, key: str, value: Any) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    ds = RouteDataset(store_dir, max_tokens_per_batch=16)
    state = {**ds.state_dict(), key: value}
    with pytest.raises(ResumeError, match=key):
        ds.load_state_dict(state)


def test_load_state_dict_from_another_store_of_the_same_size(store_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from r3store.dataset import RouteDataset

    other = tmp_path / "other"
    with r3store.RouteWriter(other, SPEC) as w:
        for i in range(3):
            w.append(f"other{i}", routes(10, i))
    ds = RouteDataset(store_dir, max_tokens_per_batch=16)
    next(iter(ds))
    state = json.loads(json.dumps(ds.state_dict()))
    with pytest.raises(ResumeError, match="samples"):
        RouteDataset(other, max_tokens_per_batch=16).load_state_dict(state)
    resumed = RouteDataset(store_dir, max_tokens_per_batch=16)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == len(resumed) - 1


# -- 12. bitpack frames -----------------------------------------------------------------------------------


def _recrc(frame: bytearray) -> bytes:
    struct.pack_into("<I", frame, 16, google_crc32c.extend(google_crc32c.value(bytes(frame[:16])), bytes(frame[20:])))
    return bytes(frame)


def test_bitpack_reserved_bytes_must_be_zero() -> None:
    frame = bytearray(BitpackCodec(3).encode(np.array([1, 2])))
    struct.pack_into("<H", frame, 6, 0xBEEF)
    with pytest.raises(FormatError, match="reserved"):
        BitpackCodec(3).decode(_recrc(frame))


def test_bitpack_unused_high_bits_must_be_zero() -> None:
    frame = bytearray(BitpackCodec(3).encode(np.array([1])))
    frame[20] |= 0xF8
    with pytest.raises(FormatError, match="unused high bits"):
        BitpackCodec(3).decode(_recrc(frame))
    assert BitpackCodec(3).decode(BitpackCodec(3).encode(np.array([7, 7, 7]))).tolist() == [7, 7, 7]


# -- every hostile store above: a named error, also through the CLI -------------------------------------


def test_cli_over_a_forged_store_is_one_line(store_dir: Path) -> None:
    rewrite_table(store_dir, lambda t: set_column(t, "num_tokens", [2**45] * t.num_rows))
    for command in (["inspect"], ["validate"], ["stats"], ["show", "--", "s0"]):
        args = [command[0], str(store_dir), *command[1:]]
        result = _cli(*args)
        assert result.exit_code == 2 and "FormatError" in result.output, (command, result.output)
        assert not isinstance(result.exception, R3StoreError)  # handled, not raised
