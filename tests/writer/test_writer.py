"""RouteWriter: stored size, lifecycle (flush / auto-flush / close), torch input, quarantine."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import r3store
import r3store.audit
from r3store.errors import (
    DuplicateSampleError,
    ExpertIdError,
    OptionError,
    PayloadDecodeError,
    RouteShapeError,
    RouteValidationError,
    RowCountError,
    SampleNotFoundError,
    WriterClosedError,
)
from r3store.testing.synthetic import uniform_routes
from tests.routes import GOOD, LATER, OK5, SPEC6, SPEC_5X40
from tests.routes import check_store_after as _check_store_after
from tests.routes import seeded_routes as _routes


def route_object_bytes(root: Path) -> tuple[int, int]:
    """(total bytes, count) of the zarr shard objects ``routes/<array>/c/...`` under a store."""
    total = count = 0
    for dirpath, _, files in os.walk(root / "routes"):
        parts = Path(dirpath).relative_to(root / "routes").parts
        if len(parts) >= 2 and parts[1] == "c":
            for name in files:
                total += (Path(dirpath) / name).stat().st_size
                count += 1
    return total, count


# -- stored size -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_layers", "num_experts", "top_k", "moe_layers", "lengths"),
    [
        (8, 64, 6, None, [2048] * 8 + [1, 300]),  # FLAME-MoE-like; 16,683 rows
        (48, 128, 8, None, [4097, 8192, 4000, 17]),  # Qwen3-30B-A3B; 16,302 rows
        (61, 256, 8, range(3, 61), [6000, 10001, 2]),  # DeepSeek-V3 (3 dense layers)
    ],
)
def test_stored_size_is_log2_bits_per_id(tmp_path, num_layers, num_experts, top_k, moe_layers, lengths) -> None:
    spec = r3store.ModelSpec(num_layers=num_layers, num_experts=num_experts, top_k=top_k, moe_layers=moe_layers)
    rng = np.random.default_rng(num_experts)
    ids = 0
    with r3store.RouteWriter(tmp_path, spec) as w:
        for i, n in enumerate(lengths):
            routes = uniform_routes(rng, n - 1, spec.num_moe_layers, num_experts, top_k)
            ids += routes.size
            w.append(f"s{i}", routes, num_tokens=n)  # a 1-token sample (0 rows) says so
    assert sum(lengths) - len(lengths) >= 16_000
    ideal = ids * math.ceil(math.log2(num_experts)) / 8
    stored, objects = route_object_bytes(tmp_path)
    assert objects >= 1
    assert abs(stored / ideal - 1) <= 0.02, (stored, ideal)
    # and it reads back
    store = r3store.open_store(tmp_path)
    assert len(store) == len(lengths)
    assert store.get("s1", rows=slice(-3, None)).shape == (3, spec.num_moe_layers, top_k)


# -- lifecycle -------------------------------------------------------------------------

SPEC = r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2, moe_layers=[0, 2, 3])


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_flush_commits_and_makes_visible(backend, tmp_path, memory_url) -> None:
    url = str(tmp_path / "store") if backend == "local" else memory_url
    rng = np.random.default_rng(1)
    a, b, c = (uniform_routes(rng, n, 3, 48, 2) for n in (5, 7, 2))
    w = r3store.RouteWriter(url, SPEC, config={"writer_id": "w1"})
    assert w.flush() is None  # nothing buffered
    w.append("a", a)
    w.append("b", b)
    assert len(r3store.open_store(url)) == 0  # buffered, not committed
    shard = w.flush()
    assert isinstance(shard, str)
    assert shard.startswith("w1")
    assert w.commits == [shard]
    assert w.flush() is None
    store = r3store.open_store(url)
    assert store.sample_ids == ["a", "b"]
    assert store.commits == [shard]
    assert set(store.samples.column("commit").to_pylist()) == {shard}
    assert set(store.samples.column("writer_id").to_pylist()) == {"w1"}
    np.testing.assert_array_equal(store.get("b"), b)
    w.append("c", c)
    assert r3store.open_store(url).sample_ids == ["a", "b"]  # "c" only after the next commit
    w.close()
    assert len(w.commits) == 2
    assert w.commits[0] == shard
    store = r3store.open_store(url)
    assert store.sample_ids == ["a", "b", "c"]
    np.testing.assert_array_equal(store.get("c"), c)
    assert store.row("c")["row_start"] == 0
    assert store.row("b")["row_start"] == 5


def test_buffer_bytes_triggers_automatic_flushes(tmp_path) -> None:
    rng = np.random.default_rng(2)
    data = {f"s{i}": uniform_routes(rng, 10, 3, 48, 2) for i in range(10)}  # 120 bytes buffered each
    with r3store.RouteWriter(tmp_path, SPEC, config={"buffer_bytes": 300}) as w:
        for i, (sid, r) in enumerate(data.items()):
            w.append(sid, r)
            if i == 1:
                assert w.commits == []
            if i == 2:
                assert len(w.commits) == 1  # 360 bytes >= 300
                assert r3store.open_store(tmp_path).sample_ids == ["s0", "s1", "s2"]
    assert len(w.commits) == 4
    store = r3store.open_store(tmp_path)
    assert store.commits == sorted(w.commits)
    assert store.sample_ids == list(data)
    for sid, r in data.items():
        np.testing.assert_array_equal(store.get(sid), r)


def test_second_writer_same_spec_adds_to_store(tmp_path) -> None:
    rng = np.random.default_rng(3)
    one, two = uniform_routes(rng, 3, 3, 48, 2), uniform_routes(rng, 4, 3, 48, 2)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("one", one)
    spec = r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2, moe_layers=[0, 2, 3])
    with r3store.RouteWriter(tmp_path, spec) as w:
        full = np.zeros((4, 4, 2), dtype=np.int32)
        full[:, [0, 2, 3]] = two
        w.append("two", full)
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["one", "two"]
    np.testing.assert_array_equal(store.get("two"), two)


def test_torch_tensors_accepted(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    data = {f"t{i}": uniform_routes(rng, n, 3, 48, 2) for i, n in enumerate((6, 1, 9, 4))}
    full = np.zeros((9, 4, 2), dtype=np.int64)
    full[:, [0, 2, 3]] = data["t2"]
    with r3store.RouteWriter(tmp_path, SPEC, config={"chunk_rows": 4}) as w:
        w.append("t0", torch.tensor(data["t0"]))  # int64
        w.append("t1", torch.tensor(data["t1"], dtype=torch.int16), tokens=torch.tensor([5, 6]))
        w.append("t2", torch.from_numpy(full).to(torch.int32))  # all decoder layers
        t3 = torch.tensor(np.ascontiguousarray(data["t3"].transpose(1, 0, 2)), dtype=torch.uint8).permute(1, 0, 2)
        assert not t3.is_contiguous()
        w.append("t3", t3)
        w.append_sglang("t4", torch.tensor(full.reshape(-1), dtype=torch.int32), num_tokens=10)
    store = r3store.open_store(tmp_path)
    for sid, r in data.items():
        np.testing.assert_array_equal(store.get(sid), r)
    np.testing.assert_array_equal(store.get("t4"), data["t2"])
    expected = hashlib.blake2b(np.array([5, 6], "<i8").tobytes(), digest_size=16).hexdigest()
    assert store.row("t1")["token_hash"] == expected


def test_torch_float_tensor_rejected(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    with r3store.RouteWriter(tmp_path, SPEC) as w, pytest.raises(RouteValidationError, match="dtype must be integer"):
        w.append("f", torch.zeros((2, 3, 2)))


def test_constructor_arguments(tmp_path) -> None:
    with pytest.raises(TypeError, match="ModelSpec"):
        r3store.RouteWriter(tmp_path, {"num_layers": 1})  # type: ignore[arg-type]
    for name in ("buffer_bytes", "chunk_rows", "layers_per_chunk", "object_bytes"):
        with pytest.raises(OptionError, match=name):
            r3store.RouteWriter(tmp_path, SPEC, {name: 0})
    with pytest.raises(OptionError, match="on_invalid"):
        r3store.RouteWriter(tmp_path, SPEC, config={"on_invalid": "drop"})  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="not a writer setting"):
        r3store.RouteWriter(tmp_path, SPEC, {"shard_rows": 5})
    w = r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": "mine"})
    assert "mine" in repr(w)
    assert w.config.writer_id == "mine"
    assert w.config.layers_per_chunk == 3
    with pytest.raises(RouteValidationError, match="sample_id"):
        w.append("", np.zeros((0, 3, 2)))
    w.close()
    w.close()  # idempotent


def test_writer_config_passed_whole(tmp_path) -> None:
    """A WriterConfig (or its dict form) sets the writer whole; (deprecated) keywords merge into it."""
    config = r3store.WriterConfig(chunk_rows=2, object_bytes=1, writer_id="cfg")
    routes = np.tile(np.array([0, 1]), (5, 3, 1))
    for i, how in enumerate([{"config": config}, {"config": config.to_dict()},
                             {"config": {"chunk_rows": 2}, "object_bytes": 1, "writer_id": "cfg"}]):
        with warnings.catch_warnings():  # the third form: loose keywords, deprecated (tests/test_deprecated.py)
            warnings.simplefilter("ignore", r3store.errors.R3StoreDeprecationWarning)
            w = r3store.RouteWriter(tmp_path / str(i), SPEC, **how)
        with w:
            w.append("a", routes)
        assert w.config == dataclasses.replace(config, layers_per_chunk=3)
        store = r3store.open_store(tmp_path / str(i))
        geometry = store.geometry_of(store.row("a")["array"])
        assert (geometry.chunk_rows, geometry.object_rows, w.commits) == (2, 2, ["cfg-00000"])
    with pytest.warns(r3store.errors.R3StoreDeprecationWarning, match="chunk_rows"), \
            pytest.raises(OptionError, match="chunk_rows=3: given as a keyword and as 2 in config"):
        r3store.RouteWriter(tmp_path / "x", SPEC, config, chunk_rows=3)
    with pytest.raises(WriterClosedError):
        w.append("late", np.zeros((0, 3, 2), dtype=np.int32))


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_restarted_writer_with_same_id_does_not_overwrite(backend, tmp_path, memory_url) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    rng = np.random.default_rng(6)
    first, second, third = (uniform_routes(rng, n, 3, 48, 2) for n in (5, 2, 7))
    with r3store.RouteWriter(url, SPEC, config={"writer_id": "rank-0"}) as w:
        w.append("a", first)
        w.flush()
        w.append("c", third)
    with r3store.RouteWriter(url, SPEC, config={"writer_id": "rank-0"}) as w:  # e.g. a restarted worker
        w.append("b", second)
    store = r3store.open_store(url)
    assert sorted(store.sample_ids) == ["a", "b", "c"]
    assert len(store.commits) == 3
    np.testing.assert_array_equal(store.get("a"), first)
    np.testing.assert_array_equal(store.get("b"), second)
    np.testing.assert_array_equal(store.get("c"), third)


def test_default_writer_ids_are_unique(tmp_path) -> None:
    ids = {r3store.RouteWriter(tmp_path, SPEC).writer_id for _ in range(20)}
    assert len(ids) == 20


# -- quarantine ------------------------------------------------------------------------

QSPEC = r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2, moe_layers=[1, 2, 3])  # 6 bits per id


def test_quarantine_keeps_bad_samples_flagged(tmp_path) -> None:
    rng = np.random.default_rng(5)
    good = uniform_routes(rng, 6, 3, 48, 2)
    repeated = good.copy()
    repeated[2, 1] = [7, 7]
    physical = good.copy()
    physical[4, 0, 1] = 50  # >= num_experts, < 2**6: storable as given
    too_big = good.copy()
    too_big[0, 0, 0] = 64  # >= 2**bits: cannot be bit-packed, routes dropped
    full = np.zeros((6, 4, 2), dtype=np.int32)
    full[:, 1:] = good

    with r3store.RouteWriter(tmp_path, QSPEC, config={"on_invalid": "quarantine"}) as w:
        w.append("good-0", good, metadata={"step": 1})
        w.append("repeated", repeated, metadata={"step": 2})
        w.append("physical", physical)
        w.append("too-big", too_big)
        w.append("off-by-one", good, num_tokens=6)  # 6 rows for 6 tokens
        w.append_sglang("not-base64", "this is not base64!", num_tokens=7)
        w.append_sglang("bad-size", r3store.encode_sglang(full.reshape(-1)[:-1]), num_tokens=7)
        w.append("good-1", good)
        with pytest.raises(DuplicateSampleError):
            w.append("repeated", good)  # a quarantined id is taken
    bad = ["repeated", "physical", "too-big", "off-by-one", "not-base64", "bad-size"]

    store = r3store.open_store(tmp_path)
    assert len(store) == 2
    assert store.sample_ids == ["good-0", "good-1"]
    table = {r["sample_id"]: r for r in store.samples.to_pylist()}
    assert list(table) == ["good-0", *bad, "good-1"]
    for sid in bad:
        assert table[sid]["quarantined"] is True
        assert table[sid]["reason"]
        assert sid not in store
        with pytest.raises(SampleNotFoundError, match=sid):
            store.get(sid)
        with pytest.raises(SampleNotFoundError):
            store.num_tokens(sid)
        assert store.row(sid, include_quarantined=True)["quarantined"] is True
    assert table["good-0"]["quarantined"] is False
    assert table["good-0"]["reason"] is None
    assert "repeated" in table["repeated"]["reason"]
    assert table["repeated"]["step"] == 2
    assert ">= num_experts" in table["physical"]["reason"]
    assert "not storable" in table["too-big"]["reason"]
    assert "expected num_tokens - 1" in table["off-by-one"]["reason"]
    assert "base64" in table["not-base64"]["reason"]
    assert "divide" in table["bad-size"]["reason"]

    np.testing.assert_array_equal(store.get("repeated", include_quarantined=True), repeated)
    np.testing.assert_array_equal(store.get("physical", include_quarantined=True), physical)
    np.testing.assert_array_equal(store.get("physical", [3], include_quarantined=True), physical[:, [2]])
    with pytest.raises(SampleNotFoundError, match="could not be stored"):  # its routes were not kept
        store.get("too-big", include_quarantined=True)
    np.testing.assert_array_equal(store.get("off-by-one", include_quarantined=True), good)
    assert store.num_tokens("off-by-one", include_quarantined=True) == 6
    assert table["off-by-one"]["num_rows"] == 6
    with pytest.raises(SampleNotFoundError, match="could not be stored"):
        store.get("not-base64", include_quarantined=True)
    assert store.num_tokens("not-base64", include_quarantined=True) == 7
    for sid in ("good-0", "good-1"):
        np.testing.assert_array_equal(store.get(sid), good)


def test_quarantine_is_opt_in(tmp_path) -> None:
    bad = np.array([[[7, 7], [1, 2], [3, 4]]])
    with r3store.RouteWriter(tmp_path, QSPEC) as w, pytest.raises(ExpertIdError, match="repeated"):
        w.append("repeated", bad)
    assert r3store.open_store(tmp_path).samples.num_rows == 0


@pytest.mark.parametrize("top_k", [1, 2, 6, 16, 17, 40])
def test_repeated_ids_matches_a_plain_reference(top_k: int) -> None:
    """The one "row repeats an id" check (writer, validate, show): both paths vs set()."""
    from r3store._validate import first_repeat, repeated_ids

    rng = np.random.default_rng(top_k)
    routes = rng.integers(0, top_k + 3, size=(50, 3, top_k))
    want = np.array([[len(set(row.tolist())) < top_k for row in layer] for layer in routes])
    np.testing.assert_array_equal(repeated_ids(routes), want)
    hits = np.argwhere(want)
    assert first_repeat(routes) == (tuple(int(v) for v in hits[0]) if hits.size else None)


def full_layers(moe: np.ndarray) -> np.ndarray:
    out = np.zeros((moe.shape[0], SPEC_5X40.num_layers, SPEC_5X40.top_k), dtype=np.int32)
    out[:, list(SPEC_5X40.moe_layers)] = moe
    return out


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
    ("repeated-full-layers",
     lambda w: w.append("bad", full_layers(_with(OK5, (1, 2, 1), int(OK5[1, 2, 0]))), metadata=M),
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
    ("sglang-dense-nonzero",
     lambda w: w.append_sglang("bad", {"routed_experts": r3store.encode_sglang(_dense_nonzero())}, metadata=M),
     ExpertIdError, ["dense decoder layer 3"]),
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
    w = r3store.RouteWriter(url, SPEC_5X40, config={"chunk_rows": 4})
    for i, (sid, routes) in enumerate(GOOD.items()):
        w.append(sid, routes, metadata={"step": i})
    assert w.flush() is not None
    return url, w


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
        assert f"'{sid}'" in str(info.value)
        assert "more than once" in str(info.value)
        assert info.value.sample_id == sid
        with pytest.raises(DuplicateSampleError, match=f"'{sid}'"):
            w.append_sglang(sid, r3store.encode_sglang(full_layers(OK5)))
    w.close()
    _check_store_after(url)


@pytest.mark.parametrize("seeded", ["local", "memory"], indirect=True)
def test_writer_used_after_close(seeded) -> None:
    url, w = seeded
    w.close()
    for call in (lambda: w.append("late", OK5),
                 lambda: w.append_sglang("late", r3store.encode_sglang(full_layers(OK5))),
                 w.flush):
        with pytest.raises(WriterClosedError, match="closed"):
            call()
    w.close()
    _check_store_after(url, later=False)


def test_rows_of_minus_one_are_stored_as_missing(tmp_path: Path) -> None:
    """Item 15: NeMo-RL's all -1 rows (prefix-cache hits) were rejected; now they are missing rows:
    -1 from ``get``, ``replay_mask`` False in batches, reported by ``validate`` (more in format/test_v2.py)."""
    arr = _routes(6, 0)
    arr[1:3] = -1
    with r3store.RouteWriter(tmp_path, SPEC6) as w:
        w.append("s", arr, allow_missing=True)
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s"), arr)
    assert store.assemble(["s"])["replay_mask"].tolist() == [True, False, False, True, True, True, False]
    assert r3store.audit.validate(store).counts == {"missing_rows": 1}
