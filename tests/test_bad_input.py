"""Bad input and damaged stores: clear errors that name the sample and the fault, and
nothing committed before the fault is lost (the store reopens with earlier samples intact,
and a failed append leaves nothing behind in later commits)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.testing import forge
from r3store.errors import (
    ChecksumError,
    DuplicateSampleError,
    ExpertIdError,
    FormatError,
    FormatVersionError,
    NotAStoreError,
    PayloadDecodeError,
    R3StoreError,
    RouteShapeError,
    RouteValidationError,
    RowCountError,
    SpecMismatchError,
    WriterClosedError,
)

# 5 decoder layers, dense layers 0 and 3; 40 experts -> 6 bits per id
SPEC = r3store.ModelSpec(num_layers=5, num_experts=40, top_k=3, moe_layers=[1, 2, 4])
BASE_COLUMNS = {"sample_id", "num_tokens", "num_rows", "row_start", "array", "commit", "writer_id", "token_hash",
                "committed_at", "quarantined", "reason", "missing_rows", "policy_spans", "policy_version"}


def random_routes(rng: np.random.Generator, rows: int, layers: int = 3, num_experts: int = 40, top_k: int = 3) -> np.ndarray:
    """Valid routes: per (row, layer) a random permutation prefix of the experts."""
    return np.argsort(rng.random((rows, layers, num_experts)), axis=-1)[..., :top_k].astype(np.int32)


def full_layers(moe: np.ndarray) -> np.ndarray:
    out = np.zeros((moe.shape[0], SPEC.num_layers, SPEC.top_k), dtype=np.int32)
    out[:, list(SPEC.moe_layers)] = moe
    return out


RNG = np.random.default_rng(1234)
GOOD = {f"g{i}": random_routes(RNG, n) for i, n in enumerate([5, 11, 1])}
LATER = random_routes(RNG, 4)
OK5 = random_routes(RNG, 5)  # valid routes the bad cases start from


def _with(arr: np.ndarray, index: tuple, value: int) -> np.ndarray:
    out = arr.copy()
    out[index] = value
    return out


def _dense_nonzero() -> np.ndarray:
    full = full_layers(OK5)
    full[2, 3] = [1, 2, 3]  # decoder layer 3 is dense
    return full


# (case id, call on the writer, exception class, words the message must hold)
Case = tuple[str, Callable[[r3store.RouteWriter], None], type[Exception], list[str]]
M = {"bad_only": "x"}  # metadata of the failing sample: must not leak into later commits
CASES: list[Case] = [
    ("rank-2", lambda w: w.append("bad", OK5[:, 0], metadata=M), RouteShapeError, ["3 dims", "(5, 3)"]),
    ("rank-4", lambda w: w.append("bad", OK5[None], metadata=M), RouteShapeError, ["3 dims", "(1, 5, 3, 3)"]),
    ("rank-0", lambda w: w.append("bad", np.int32(3), metadata=M), RouteShapeError, ["3 dims"]),
    ("layers", lambda w: w.append("bad", np.concatenate([OK5, OK5[:, :1]], axis=1), metadata=M), RouteShapeError,
     ["layer dim is 4", "num_layers=5", "3 (MoE layers only)"]),
    ("top-k", lambda w: w.append("bad", OK5[..., :2], metadata=M), RouteShapeError, ["top_k", "2", "spec.top_k is 3"]),
    ("negative", lambda w: w.append("bad", _with(OK5, (3, 1, 2), -1), metadata=M), ExpertIdError,
     ["-1", "row 3", "decoder layer 2", "negative"]),
    ("too-large", lambda w: w.append("bad", _with(OK5, (4, 2, 0), 40), metadata=M), ExpertIdError,
     ["40", "row 4", "decoder layer 4", ">= num_experts (40)"]),
    ("way-too-large", lambda w: w.append("bad", _with(OK5, (0, 0, 0), 70000), metadata=M), ExpertIdError,
     ["70000", ">= num_experts"]),
    ("repeated", lambda w: w.append("bad", _with(OK5, (2, 0), 7), metadata=M), ExpertIdError,
     ["repeated", "row 2", "decoder layer 1", "[7, 7, 7]"]),
    ("repeated-full-layers", lambda w: w.append("bad", full_layers(_with(OK5, (1, 2, 1), int(OK5[1, 2, 0]))), metadata=M),
     ExpertIdError, ["repeated", "row 1", "decoder layer 4"]),
    ("float", lambda w: w.append("bad", OK5.astype(np.float64), metadata=M), RouteShapeError, ["dtype", "float64"]),
    ("float32", lambda w: w.append("bad", OK5.astype(np.float32), metadata=M), RouteShapeError, ["dtype", "float32"]),
    ("bool", lambda w: w.append("bad", OK5 > 3, metadata=M), RouteShapeError, ["dtype", "bool"]),
    ("object", lambda w: w.append("bad", OK5.astype(object), metadata=M), RouteShapeError, ["dtype", "object"]),
    ("rows-short", lambda w: w.append("bad", OK5, num_tokens=8, metadata=M), RowCountError,
     ["has 5 rows", "num_tokens - 1 = 7"]),
    ("rows-equal-num-tokens", lambda w: w.append("bad", OK5, num_tokens=5, metadata=M), RowCountError,
     ["has 5 rows", "num_tokens - 1 = 4", "last token"]),
    ("rows-vs-tokens", lambda w: w.append("bad", OK5, tokens=list(range(5)), metadata=M), RowCountError,
     ["has 5 rows", "num_tokens - 1 = 4", "last token"]),
    ("tokens-vs-num-tokens", lambda w: w.append("bad", OK5, tokens=list(range(6)), num_tokens=7, metadata=M),
     RowCountError, ["len(tokens) = 6", "num_tokens = 7"]),
    ("num-tokens-zero", lambda w: w.append("bad", OK5[:0], num_tokens=0, metadata=M), RowCountError,
     ["num_tokens", ">= 1"]),
    ("num-tokens-float", lambda w: w.append("bad", OK5, num_tokens=6.0, metadata=M), RowCountError,  # type: ignore[arg-type]
     ["num_tokens", "6.0"]),
    ("tokens-2d", lambda w: w.append("bad", OK5, tokens=np.zeros((2, 3), np.int64), metadata=M), RouteValidationError,
     ["tokens", "1-D"]),
    ("dense-nonzero", lambda w: w.append("bad", _dense_nonzero(), metadata=M), ExpertIdError,
     ["dense decoder layer 3", "row 2", "[1, 2, 3]"]),
    ("sglang-not-base64", lambda w: w.append_sglang("bad", "not base64 at all!", metadata=M), PayloadDecodeError,
     ["routed_experts", "base64"]),
    ("sglang-not-divisible", lambda w: w.append_sglang("bad", r3store.encode_sglang(full_layers(OK5).reshape(-1)[:-3]),
                                                       metadata=M),
     PayloadDecodeError, ["72 ids", "do not divide", "num_layers=5", "top_k=3"]),
    ("sglang-not-int32", lambda w: w.append_sglang("bad", base64.b64encode(b"\x01\x00\x00\x00\x02\x00"), metadata=M),
     PayloadDecodeError, ["6 bytes", "whole number of int32"]),
    ("sglang-no-key", lambda w: w.append_sglang("bad", {"meta_info": {"e2e_latency": 1.0}}, metadata=M),
     PayloadDecodeError, ["no 'routed_experts'", "meta_info"]),
    ("sglang-moe-only", lambda w: w.append_sglang("bad", r3store.encode_sglang(OK5[:4]), metadata=M),
     PayloadDecodeError, ["36 ids", "do not divide"]),
    # MoE-only ids that happen to divide into all decoder layers: caught by the dense-layer check
    ("sglang-moe-only-divisible", lambda w: w.append_sglang("bad", r3store.encode_sglang(OK5), metadata=M),
     ExpertIdError, ["dense decoder layer 0", "moe_layers may be wrong"]),
    ("sglang-dense-nonzero", lambda w: w.append_sglang("bad", {"routed_experts": r3store.encode_sglang(_dense_nonzero())},
                                                       metadata=M), ExpertIdError, ["dense decoder layer 3"]),
    ("meta-reserved", lambda w: w.append("bad", OK5, metadata={"num_tokens": 6}), RouteValidationError,
     ["metadata['num_tokens']", "key must"]),
    ("meta-reserved-quarantined", lambda w: w.append("bad", OK5, metadata={"quarantined": False}), RouteValidationError,
     ["metadata['quarantined']"]),
    ("meta-key-not-str", lambda w: w.append("bad", OK5, metadata={3: 1}), RouteValidationError,  # type: ignore[dict-item]
     ["metadata[3]", "non-empty str"]),
    ("meta-non-scalar", lambda w: w.append("bad", OK5, metadata={"tags": ["a", "b"]}), RouteValidationError,
     ["metadata['tags']", "JSON scalar", "['a', 'b']"]),
    ("meta-nan", lambda w: w.append("bad", OK5, metadata={"reward": float("nan")}), RouteValidationError,
     ["metadata['reward']", "finite"]),
    # values Parquet cannot hold must fail here, not at commit (where they would sink the whole buffer)
    ("meta-int-overflow", lambda w: w.append("bad", OK5, metadata={"big": 2**64}), RouteValidationError,
     ["metadata['big']", "int64"]),
    ("meta-surrogate", lambda w: w.append("bad", OK5, metadata={"text": "a\ud800"}), RouteValidationError,
     ["metadata['text']", "UTF-8"]),
    ("meta-not-mapping", lambda w: w.append("bad", OK5, metadata=[("step", 1)]), RouteValidationError,  # type: ignore[arg-type]
     ["metadata", "mapping"]),
    ("meta-type-changes", lambda w: w.append("bad", OK5, metadata={"step": "three"}), RouteValidationError,
     ["metadata['step']", "str here but int in earlier samples"]),
]


@pytest.fixture
def seeded(tmp_path: Path, memory_url: str, request: pytest.FixtureRequest):
    """A writer that has committed GOOD (with int metadata ``step``), still open."""
    url = str(tmp_path / "store") if request.param == "local" else memory_url
    w = r3store.RouteWriter(url, SPEC, chunk_rows=4)
    for i, (sid, routes) in enumerate(GOOD.items()):
        w.append(sid, routes, metadata={"step": i})
    assert w.flush() is not None
    return url, w


def _check_store_after(url: str, later: bool = True) -> r3store.RouteStore:
    store = r3store.open_store(url)
    want = [*GOOD, "later"] if later else list(GOOD)
    assert store.sample_ids == want
    assert store.samples.column("sample_id").to_pylist() == want  # nothing quarantined or half-written
    for sid, routes in GOOD.items():
        np.testing.assert_array_equal(store.get(sid), routes)
    if later:
        np.testing.assert_array_equal(store.get("later"), LATER)
    assert set(store.samples.column_names) <= BASE_COLUMNS | {"step", "bad_only"}
    return store


@pytest.mark.parametrize("seeded", ["local", "memory"], indirect=True)
@pytest.mark.parametrize(("name", "call", "exc_type", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_append(seeded, name, call, exc_type, words) -> None:
    url, w = seeded
    with pytest.raises(exc_type) as info:
        call(w)
    exc = info.value
    msg = str(exc)
    assert "'bad'" in msg, msg
    assert exc.sample_id == "bad"
    for word in words:
        assert word in msg, (word, msg)
    # the failed call left nothing behind: a later commit holds only the later sample,
    # with metadata whose types are decided by committed samples only
    w.append("later", LATER, metadata={"step": 10, "bad_only": 3})
    w.close()
    store = _check_store_after(url)
    assert store.row("later")["bad_only"] == 3
    assert store.samples.column("bad_only").to_pylist() == [None, None, None, 3]


@pytest.mark.parametrize("seeded", ["local", "memory"], indirect=True)
def test_duplicate_id_same_writer(seeded) -> None:
    url, w = seeded
    w.append("later", LATER)
    for sid in ("g1", "later"):  # committed in an earlier shard / still buffered
        with pytest.raises(DuplicateSampleError) as info:
            w.append(sid, OK5)
        assert f"'{sid}'" in str(info.value) and "more than once" in str(info.value)
        assert info.value.sample_id == sid
        with pytest.raises(DuplicateSampleError, match=f"'{sid}'"):
            w.append_sglang(sid, r3store.encode_sglang(full_layers(OK5)))
    w.close()
    _check_store_after(url)


@pytest.mark.parametrize("seeded", ["local", "memory"], indirect=True)
def test_writer_used_after_close(seeded) -> None:
    url, w = seeded
    w.close()
    for call in (lambda: w.append("late", OK5), lambda: w.append_sglang("late", r3store.encode_sglang(full_layers(OK5))),
                 w.flush):
        with pytest.raises(WriterClosedError, match="closed"):
            call()
    w.close()
    _check_store_after(url, later=False)


# -- opening things that are not stores ------------------------------------------------


def test_open_folder_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError) as info:
        r3store.open_store(tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path) in str(info.value) and "r3store.json" in str(info.value)
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError, match="r3store.json"):
        r3store.open_store(missing)
    assert not missing.exists()
    with pytest.raises(NotAStoreError):
        r3store.open_store("memory://r3store-test-nothing-here")


def test_writer_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a,b\n")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(NotAStoreError) as info:
        r3store.RouteWriter(tmp_path, SPEC)
    assert "data.csv" in str(info.value) and "other files" in str(info.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_second_writer_with_other_spec(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        for sid, routes in GOOD.items():
            w.append(sid, routes, metadata={"step": 0})
    before = _snapshot(tmp_path)
    other = r3store.ModelSpec(num_layers=5, num_experts=64, top_k=3, moe_layers=[1, 2, 4])
    with pytest.raises(SpecMismatchError) as info:
        r3store.RouteWriter(tmp_path, other)
    msg = str(info.value)
    assert str(tmp_path) in msg and "num_experts 40 there vs 64" in msg
    assert info.value.expected == SPEC.to_dict() and info.value.got == other.to_dict()
    assert info.value.fields == ("num_experts",)
    with pytest.raises(SpecMismatchError):
        r3store.RouteWriter(tmp_path, r3store.ModelSpec(num_layers=5, num_experts=40, top_k=3))  # moe_layers differ
    assert _snapshot(tmp_path) == before
    _check_store_after(str(tmp_path), later=False)


@pytest.mark.parametrize("resealed", [True, False])
def test_manifest_changed_under_a_writer(tmp_path: Path, resealed: bool) -> None:
    """Another spec (checksum recomputed) or a damaged manifest: the writer commits nothing."""
    w = r3store.RouteWriter(tmp_path, SPEC)
    w.append("g0", GOOD["g0"])
    if resealed:
        forge.reseal_manifest(tmp_path / "r3store.json", lambda d: d["spec"].update(num_experts=64))
    else:
        doc = json.loads((tmp_path / "r3store.json").read_text())
        doc["spec"]["num_experts"] = 64
        (tmp_path / "r3store.json").write_text(json.dumps(doc))
    with pytest.raises(SpecMismatchError if resealed else ChecksumError):
        w.flush()
    assert not (tmp_path / "index").exists() or not list((tmp_path / "index").rglob("*.parquet"))


# -- damaged stores ----------------------------------------------------------------------


@pytest.fixture
def committed(tmp_path: Path):
    """A local store: GOOD + one more sample in one shard, 4-row chunks, one layer per chunk."""
    big = random_routes(np.random.default_rng(5), 20)
    with r3store.RouteWriter(tmp_path, SPEC, chunk_rows=4, layers_per_chunk=1) as w:
        for sid, routes in GOOD.items():
            w.append(sid, routes)
        w.append("big", big)
    store = r3store.open_store(tmp_path)
    array = store.row("big")["array"]
    shard_file = tmp_path / array / "c" / "0" / "0" / "0"
    assert shard_file.is_file()
    return tmp_path, array, shard_file, big


def _index(shard_file: Path, row_chunks: int, layer_chunks: int) -> np.ndarray:
    raw = shard_file.read_bytes()
    n = row_chunks * layer_chunks * 16
    return np.frombuffer(raw[-4 - n : -4], dtype="<u8").reshape(row_chunks, layer_chunks, 2)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_corrupt_chunk_frame(committed) -> None:
    root, array, shard_file, big = committed
    # rows: g0 [0, 5), g1 [5, 16), g2 [16, 17), big [17, 37): 10 row chunks x 3 layer chunks
    index = _index(shard_file, 10, 3)
    offset, nbytes = (int(v) for v in index[1, 2])  # rows [4, 8), decoder layer 4
    assert nbytes > 24
    _flip(shard_file, offset + 22)  # inside the payload of that frame
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError) as info:
        store.get("g1")
    exc = info.value
    assert exc.array == array and exc.chunk == (1, 2, 0)
    assert array in str(exc) and "(1, 2, 0)" in str(exc) and "CRC-32C" in str(exc)
    assert isinstance(exc, FormatError)
    # the damage is local: other chunks read fine
    np.testing.assert_array_equal(store.get("g1", layers=[1, 2]), GOOD["g1"][:, :2])
    np.testing.assert_array_equal(store.get("g1", rows=slice(3, 11)), GOOD["g1"][3:11])
    np.testing.assert_array_equal(store.get("big"), big)
    np.testing.assert_array_equal(store.get("g2"), GOOD["g2"])
    with pytest.raises(ChecksumError):
        store.get("g0", layers=[4])


def test_corrupt_frame_header(committed) -> None:
    root, array, shard_file, _ = committed
    offset, _ = (int(v) for v in _index(shard_file, 10, 3)[3, 0])
    _flip(shard_file, offset + 13)  # the n_encoded field of the header
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g1")
    assert array in str(info.value) and "(3, 0, 0)" in str(info.value)


def test_corrupt_shard_index(committed) -> None:
    root, array, shard_file, _ = committed
    size = shard_file.stat().st_size
    _flip(shard_file, size - 4 - 16 * 7 + 3)  # inside the (offset, nbytes) table
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError) as info:
        store.get("g2")
    assert array in str(info.value) and "index" in str(info.value) and "CRC-32C" in str(info.value)


def test_truncated_shard_object(committed) -> None:
    root, array, shard_file, _ = committed
    shard_file.write_bytes(shard_file.read_bytes()[:-40])
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g0")
    assert array in str(info.value)


def test_missing_shard_object(committed) -> None:
    root, array, shard_file, _ = committed
    shard_file.unlink()
    with pytest.raises(FileNotFoundError) as info:
        r3store.open_store(root).get("g0")
    assert isinstance(info.value, R3StoreError)
    assert array in str(info.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "plain-parquet"])
def test_bad_sample_table(committed, damage) -> None:
    root, array, _, _ = committed
    (table,) = (root / "index").rglob("*.parquet")
    raw = table.read_bytes()
    if damage == "garbage":
        table.write_bytes(b"this is not parquet" * 10)
    elif damage == "truncated":
        table.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        table.write_bytes(b"")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"sample_id": ["x"]}), table)
    with pytest.raises(FormatError) as info:
        r3store.open_store(root)
    assert table.name in str(info.value)
    if damage == "plain-parquet":
        assert isinstance(info.value, FormatVersionError)


def test_sample_table_missing_column(committed) -> None:
    import pyarrow.parquet as pq

    root, _, _, _ = committed
    (path,) = (root / "index").rglob("*.parquet")
    forge.rewrite_table(path, lambda t: t.drop_columns(["row_start"]))
    with pytest.raises(FormatError, match="column 'row_start' should be int64, found None"):
        r3store.open_store(root)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["reason"]), path)  # metadata kept, digest stale
    with pytest.raises(ChecksumError, match="digest"):
        r3store.open_store(root)


@pytest.mark.parametrize(
    ("edit", "exc_type", "words"),
    [
        (lambda d: d.update(version=4), FormatVersionError, ["version 4", "not readable"]),
        (lambda d: d.update(format="zarr"), FormatVersionError, ["'zarr'"]),
        (lambda d: d["spec"].pop("top_k"), FormatError, ["top_k"]),
        (lambda d: d["spec"].update(num_experts=0), FormatError, ["num_experts"]),
    ],
)
def test_bad_manifest(committed, edit, exc_type, words) -> None:
    root, _, _, _ = committed
    forge.reseal_manifest(root / "r3store.json", edit)
    with pytest.raises(exc_type) as info:
        r3store.open_store(root)
    assert "r3store.json" in str(info.value)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(exc_type):
        r3store.RouteWriter(root, SPEC)


def test_manifest_not_json(committed) -> None:
    root, _, _, _ = committed
    (root / "r3store.json").write_bytes(b"\x00{nope")
    with pytest.raises(FormatError, match="not valid JSON"):
        r3store.open_store(root)


def test_route_array_metadata_disagrees(committed) -> None:
    root, array, _, _ = committed
    meta = root / array / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][0]["configuration"]["codecs"][0]["configuration"]["bits"] = 7
    meta.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g0")
    assert "zarr.json" in str(info.value)
    assert os.path.basename(array) in str(info.value)
