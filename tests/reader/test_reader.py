"""Round trips through RouteWriter -> RouteStore, and the reader's selection API.

Properties are checked against plain numpy slicing of the arrays handed to the writer,
over random geometries (2..1024 experts, 1..100 decoder layers, optional dense layers),
random sample lengths and small chunk / shard sizes so chunk and shard edges are hit.
"""

from __future__ import annotations

import hashlib
import pickle
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import r3store
from r3store.errors import (
    DuplicateSampleError,
    FormatError,
    LayerError,
    MetadataTypeWarning,
    RangeError,
    SampleNotFoundError,
)
from r3store.testing.synthetic import uniform_routes
from tests.routes import SPEC_4X16

# -- local generators (numpy only) ----------------------------------------------------


def with_dense(spec: r3store.ModelSpec, moe: np.ndarray) -> np.ndarray:
    """The all-decoder-layer (SGLang) form of MoE-only routes: dense layers are zeros."""
    full = np.zeros((moe.shape[0], spec.num_layers, spec.top_k), dtype=moe.dtype)
    full[:, list(spec.moe_layers)] = moe
    return full


def expected_hash(tokens: np.ndarray) -> str:
    return hashlib.blake2b(np.asarray(tokens).astype("<i8").tobytes(), digest_size=16).hexdigest()


def fresh_memory_url() -> str:
    return f"memory://r3store-test-{uuid.uuid4().hex}"


def drop_memory(url: str) -> None:
    import fsspec

    fs = fsspec.filesystem("memory")
    path = url.removeprefix("memory://")
    if fs.exists(path):
        fs.rm(path, recursive=True)


# -- round-trip property --------------------------------------------------------------

META_KINDS = {
    "step": st.integers(-(2**40), 2**40),
    "reward": st.floats(-1e6, 1e6, allow_nan=False),
    "prompt": st.text(max_size=8),
    "ok": st.booleans(),
}


@st.composite
def round_trip_cases(draw: st.DrawFn) -> dict:
    num_experts = draw(st.one_of(st.integers(2, 16), st.integers(17, 1024), st.sampled_from([64, 128, 256, 512, 1024])))
    top_k = draw(st.integers(1, min(16, num_experts)))
    num_layers = draw(st.integers(1, 100))
    moe_layers = None
    if num_layers > 1 and draw(st.booleans()):
        moe_layers = sorted(draw(st.sets(st.integers(0, num_layers - 1), min_size=1, max_size=num_layers)))
    spec = r3store.ModelSpec(num_layers=num_layers, num_experts=num_experts, top_k=top_k, moe_layers=moe_layers)
    n_samples = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 300), min_size=n_samples, max_size=n_samples))
    chunk_rows = draw(st.integers(1, 64))
    layers_per_chunk = draw(st.integers(1, 4))
    # keep the number of inner chunks (Python work per chunk) bounded
    layer_chunks = -(-spec.num_moe_layers // layers_per_chunk)
    total_rows = sum(lengths) - len(lengths)
    chunk_rows = max(chunk_rows, -(-total_rows * layer_chunks // 4000))
    return {
        "spec": spec,
        "lengths": lengths,
        "chunk_rows": chunk_rows,
        "layers_per_chunk": layers_per_chunk,
        "object_bytes": draw(st.sampled_from([1, 97, 1000, 32 << 20])),
        "full_layers": draw(st.lists(st.booleans(), min_size=n_samples, max_size=n_samples)),
        "with_tokens": draw(st.lists(st.booleans(), min_size=n_samples, max_size=n_samples)),
        "metadata": draw(st.lists(st.fixed_dictionaries({}, optional=META_KINDS), min_size=n_samples,
                                  max_size=n_samples)),
        "memory": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "slices": draw(st.lists(st.tuples(st.integers(-320, 320) | st.none(), st.integers(-320, 320) | st.none()),
                                min_size=1, max_size=3)),
        "layer_pick": draw(st.randoms(use_true_random=False)),
    }


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=round_trip_cases())
def test_round_trip_property(case: dict) -> None:
    spec: r3store.ModelSpec = case["spec"]
    rng = np.random.default_rng(case["seed"])
    ids = [f"s{i}-{uuid.uuid4().hex[:6]}" for i in range(len(case["lengths"]))]
    data = {sid: uniform_routes(rng, n - 1, spec.num_moe_layers, spec.num_experts, spec.top_k)
            for sid, n in zip(ids, case["lengths"], strict=True)}
    tokens = {sid: rng.integers(0, 150_000, size=n) for sid, n in zip(ids, case["lengths"], strict=True)}

    tmp = None
    if case["memory"]:
        url = fresh_memory_url()
    else:
        tmp = tempfile.TemporaryDirectory()
        url = tmp.name
    try:
        config = {k: case[k] for k in ("chunk_rows", "layers_per_chunk", "object_bytes")}
        with r3store.RouteWriter(url, spec, config) as w:
            for i, sid in enumerate(ids):
                routes = with_dense(spec, data[sid]) if case["full_layers"][i] else data[sid]
                kwargs = {"tokens": tokens[sid]} if case["with_tokens"][i] else {"num_tokens": case["lengths"][i]}
                w.append(sid, routes, metadata=case["metadata"][i], **kwargs)
        store = r3store.open_store(url, reader={"cache_bytes": int(rng.integers(1, 1 << 20))})

        assert len(store) == len(ids)
        assert store.sample_ids == ids
        assert list(store) == ids
        assert store.spec == spec
        table = store.samples.to_pydict()
        assert table["sample_id"] == ids
        assert table["num_tokens"] == case["lengths"]
        assert table["num_rows"] == [n - 1 for n in case["lengths"]]
        assert table["quarantined"] == [False] * len(ids)
        assert table["reason"] == [None] * len(ids)
        assert table["token_hash"] == [expected_hash(tokens[s]) if case["with_tokens"][i] else None
                                       for i, s in enumerate(ids)]
        keys = set().union(*case["metadata"])
        for key in keys:
            got = table[key]
            want = [m.get(key) for m in case["metadata"]]
            assert got == want, key

        for sid, n in zip(ids, case["lengths"], strict=True):
            want = data[sid]
            got = store.get(sid)
            assert got.dtype == np.int32
            assert got.shape == (n - 1, spec.num_moe_layers, spec.top_k)
            np.testing.assert_array_equal(got, want)
            assert store.num_tokens(sid) == n
            assert sid in store
            # a random subset of MoE layers, in a random order
            pick = list(spec.moe_layers)
            case["layer_pick"].shuffle(pick)
            pick = pick[: case["layer_pick"].randint(0, len(pick))]
            positions = [spec.moe_layers.index(x) for x in pick]
            np.testing.assert_array_equal(store.get(sid, layers=pick), want[:, positions])
            for a, b in case["slices"]:
                sl = slice(a, b)
                start = 0 if a is None else a + (n - 1) * (a < 0)
                stop = n - 1 if b is None else b + (n - 1) * (b < 0)
                if not 0 <= start <= stop <= n - 1:  # past the sample: refused, never clipped as numpy clips
                    with pytest.raises(RangeError):
                        store.get(sid, rows=sl)
                    continue
                np.testing.assert_array_equal(store.get(sid, rows=sl), want[sl])
                np.testing.assert_array_equal(store.get(sid, pick, rows=sl), want[sl][:, positions])
        store.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
        else:
            drop_memory(url)


# -- reader API ------------------------------------------------------------------------

SPEC = r3store.ModelSpec(num_layers=6, num_experts=40, top_k=3, moe_layers=[1, 2, 4, 5])


@pytest.fixture
def small_store(tmp_path):
    rng = np.random.default_rng(7)
    data = {f"s{i}": uniform_routes(rng, n, SPEC.num_moe_layers, SPEC.num_experts, SPEC.top_k)
            for i, n in enumerate([5, 0, 17, 9, 33])}
    with r3store.RouteWriter(tmp_path, SPEC, config={"chunk_rows": 4, "layers_per_chunk": 3, "object_bytes": 30}) as w:
        for sid, r in data.items():
            w.append(sid, r, num_tokens=len(r) + 1, metadata={"step": int(sid[1:])})  # 0 rows: say 1 token
    return tmp_path, data


def test_layer_selection_order_and_errors(small_store) -> None:
    path, data = small_store
    store = r3store.open_store(path)
    want = data["s2"]
    np.testing.assert_array_equal(store.get("s2", [5, 1]), want[:, [3, 0]])
    np.testing.assert_array_equal(store.get("s2", range(4, 6)), want[:, [2, 3]])
    np.testing.assert_array_equal(store.get("s2", np.array([2])), want[:, [1]])
    assert store.get("s2", []).shape == (17, 0, 3)
    for bad in (0, 3, 6, -1, 99):  # dense, out of range, negative
        with pytest.raises(LayerError, match=f"decoder layer {bad} is not a stored MoE layer") as info:
            store.get("s2", [1, bad])
        assert isinstance(info.value, IndexError)
        assert info.value.layer == bad
    with pytest.raises(LayerError, match="decoder layer 4"):
        store.get("s2", [4, 4])  # requested twice


def test_row_selection(small_store) -> None:
    path, data = small_store
    store = r3store.open_store(path)
    want = data["s4"]
    for sl in (slice(3, 11), slice(-5, None), slice(None, 4), slice(0, 0)):
        np.testing.assert_array_equal(store.get("s4", rows=sl), want[sl])
    for sl in (slice(30, 100), slice(10, 2)):  # past the sample, reversed: refused, never clipped
        with pytest.raises(RangeError, match="sample 's4' has"):
            store.get("s4", rows=sl)
    with pytest.raises(ValueError, match="step 1"):
        store.get("s4", rows=slice(0, 10, 2))
    assert store.get("s1").shape == (0, 4, 3)
    with pytest.raises(RangeError, match="sample 's1' has no rows"):
        store.get("s1", rows=slice(0, 5))


def test_lookup_api(small_store) -> None:
    path, data = small_store
    store = r3store.open_store(str(path))
    assert store.sample_ids == list(data)
    got = store.get_many(["s3", "s0"], layers=[2])
    np.testing.assert_array_equal(got[0], data["s3"][:, [1]])
    np.testing.assert_array_equal(got[1], data["s0"][:, [1]])
    assert store.num_tokens("s1") == 1
    row = store.row("s2")
    assert row["sample_id"] == "s2"
    assert row["num_rows"] == 17
    assert row["num_tokens"] == 18
    assert row["step"] == 2
    assert "nope" not in store
    assert 5 not in store
    with pytest.raises(SampleNotFoundError) as info:
        store.get("nope")
    assert isinstance(info.value, KeyError)
    assert "'nope'" in str(info.value)
    assert str(path) in str(info.value)
    with pytest.raises(KeyError):
        store.num_tokens("nope")
    assert len(store.commits) == 1
    assert repr(store).startswith("RouteStore(")


def test_tiny_cache_and_pickle(small_store) -> None:
    path, data = small_store
    store = r3store.open_store(path, reader={"cache_bytes": 1})
    for _ in range(2):
        for sid, want in data.items():
            np.testing.assert_array_equal(store.get(sid), want)
    clone = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(clone.get("s4", [5]), data["s4"][:, [3]])
    store.clear_cache()
    np.testing.assert_array_equal(store.get("s2"), data["s2"])
    store.close()
    np.testing.assert_array_equal(store.get("s2"), data["s2"])  # reopens on demand


def test_memory_url_round_trip(memory_url) -> None:
    rng = np.random.default_rng(3)
    spec = r3store.ModelSpec(num_layers=3, num_experts=1024, top_k=16)
    want = uniform_routes(rng, 70, 3, 1024, 16)
    with r3store.RouteWriter(memory_url, spec, config={"chunk_rows": 8}) as w:
        w.append("m", want)
    with r3store.open_store(memory_url) as store:
        np.testing.assert_array_equal(store.get("m"), want)
        np.testing.assert_array_equal(store.get("m", [2, 0], rows=slice(7, 9)), want[7:9][:, [2, 0]])


def test_empty_store(tmp_path) -> None:
    r3store.RouteWriter(tmp_path, SPEC).close()
    store = r3store.open_store(tmp_path)
    assert len(store) == 0
    assert store.sample_ids == []
    assert store.commits == []
    assert store.duplicates == {}
    assert store.samples.num_rows == 0


# -- duplicates across writers ------------------------------------------------------------


def _two_writers_commit_same_id(url: str) -> tuple[dict[str, np.ndarray], str, str]:
    rng = np.random.default_rng(11)
    first = uniform_routes(rng, 6, 4, 40, 3)
    second = uniform_routes(rng, 9, 4, 40, 3)
    other = uniform_routes(rng, 4, 4, 40, 3)
    # the later writer sorts first by name, so "earliest" must follow commit time, not names
    wb = r3store.RouteWriter(url, SPEC, config={"writer_id": "zz-writer"})
    wa = r3store.RouteWriter(url, SPEC, config={"writer_id": "aa-writer"})
    wb.append("x", first)
    wb.append("only-b", other)
    shard_b = wb.flush()
    time.sleep(0.01)
    wa.append("x", second)
    shard_a = wa.flush()
    wa.close()
    wb.close()
    return {"x": first, "only-b": other}, shard_b, shard_a


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_duplicate_across_writers(backend, tmp_path, memory_url) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    data, shard_b, shard_a = _two_writers_commit_same_id(url)
    with pytest.raises(DuplicateSampleError) as info:
        r3store.open_store(url)
    msg = str(info.value)
    assert "'x'" in msg
    assert shard_a in msg
    assert shard_b in msg
    assert info.value.sample_id == "x"
    assert info.value.commits == (shard_b, shard_a)

    first = r3store.open_store(url, reader={"on_duplicate": "first"})
    assert first.sample_ids == ["x", "only-b"]
    np.testing.assert_array_equal(first.get("x"), data["x"])
    assert first.row("x")["commit"] == shard_b
    assert first.duplicates == {"x": [shard_b, shard_a]}
    assert first.samples.num_rows == 2

    report = r3store.open_store(url, reader={"on_duplicate": "report"})
    assert report.duplicates == {"x": [shard_b, shard_a]}
    assert len(report) == 2
    np.testing.assert_array_equal(report.get("x"), data["x"])

    with pytest.raises(ValueError, match="on_duplicate"):
        r3store.open_store(url, reader={"on_duplicate": "last"})  # type: ignore[arg-type]


def test_metadata_types_differing_between_writers(tmp_path) -> None:
    """Each writer keeps one type per key; two writers may disagree. The store still opens."""
    rng = np.random.default_rng(12)
    routes = uniform_routes(rng, 3, 4, 40, 3)
    for wid, meta in (("w1", {"label": 1, "score": 1, "flag": True}), ("w2", {"label": "one", "score": 0.5}),
                      ("w3", {"label": None, "flag": 2})):
        with r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": wid}) as w:
            w.append(wid, routes, metadata=meta)
        time.sleep(0.002)
    with pytest.warns(MetadataTypeWarning, match=r"'flag': bool vs int64; 'label': int64 vs string") as seen:
        store = r3store.open_store(tmp_path)  # said once, naming the fields (new-user finding: silent)
    assert len(seen) == 1
    assert seen[0].message.fields == {"flag": ["bool", "int64"], "label": ["int64", "string"]}  # type: ignore[union-attr]
    assert store.sample_ids == ["w1", "w2", "w3"]
    cols = store.samples.to_pydict()
    assert cols["score"] == [1.0, 0.5, None]  # int and float merge to float
    assert cols["label"] == ["1", "one", None]  # int vs str: read as strings
    assert cols["flag"] == ["true", None, "2"]
    np.testing.assert_array_equal(store.get("w3"), routes)


# -- the read core, the facade and batches ----------------------------------------------------

LAYOUT_SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2, moe_layers=[1, 2, 3])


def _layout_store(root) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    source = {f"s{i}": uniform_routes(rng, n - 1, 3, 16, 2) for i, n in enumerate([9, 4, 13])}
    with r3store.RouteWriter(root, LAYOUT_SPEC, config={"chunk_rows": 4}) as w:
        for sid, routes in source.items():
            w.append(sid, routes)
    return source


def test_open_reader_is_the_read_core(tmp_path) -> None:
    source = _layout_store(tmp_path)
    reader = r3store.RouteReader.open(tmp_path)
    assert type(reader) is r3store.RouteReader
    assert not hasattr(reader, "assemble")
    assert reader.sample_ids == list(source)
    assert reader.is_local
    assert len(reader.commits) == 1
    for sid, routes in source.items():
        np.testing.assert_array_equal(reader.get(sid, [3, 1]), routes[:, [2, 0]])
    usage = reader.storage_usage()
    assert usage.route_bytes > 0
    assert usage.index_bytes > 0
    assert usage.uncommitted == {}
    assert isinstance(r3store.open_store(tmp_path), r3store.RouteReader)


def test_fork_has_its_own_cache_and_shares_the_catalogue(tmp_path) -> None:
    source = _layout_store(tmp_path)
    reader = r3store.open_store(tmp_path)
    reader.get("s0", rows=slice(0, 6))  # its second chunk partly: cached (whole chunks decode in place)
    fork = reader.fork(cache_bytes=1 << 10)
    assert fork.cache_bytes == 1 << 10
    assert reader.cache_bytes == 64 << 20
    assert fork.samples is reader.samples
    assert fork.backend is not reader.backend
    assert fork._chunks._chunks == {}
    assert reader._chunks._chunks
    np.testing.assert_array_equal(fork.get("s2"), source["s2"])
    assert not any(key[0] == reader.row("s2")["array"] and key[1] == 2 for key in reader._chunks._chunks)
    reader.cache_bytes = 1 << 20
    assert reader.cache_bytes == 1 << 20
    assert fork.cache_bytes == 1 << 10
    with pytest.raises(r3store.errors.OptionError, match="cache_bytes"):
        reader.cache_bytes = -1


def test_assemble_returns_numpy_and_takes_options_whole(tmp_path) -> None:
    from r3store.batch import BATCH_KEYS, assemble
    from r3store.layout import LayoutOptions

    _layout_store(tmp_path)
    store = r3store.open_store(tmp_path)
    options = LayoutOptions(cp_size=2, cp_rank=1, tp_size=2)
    by_keywords = store.assemble(["s0", "s2"], {"cp_size": 2, "cp_rank": 1, "tp_size": 2}, layers=[2])
    assert set(BATCH_KEYS) == set(by_keywords)
    assert isinstance(by_keywords["routes"], np.ndarray)
    for same in (store.assemble(["s0", "s2"], options, layers=[2]),
                 store.assemble(["s0", "s2"], options=options.to_dict(), layers=[2]),
                 store.assemble(["s0", "s2"], {"cp_size": 2, "cp_rank": 1, "tp_size": 2}, layers=[2]),
                 assemble(r3store.open_store(tmp_path), ["s0", "s2"], options, layers=[2])):
        for key in BATCH_KEYS:
            np.testing.assert_array_equal(np.asarray(same[key]), np.asarray(by_keywords[key]), err_msg=key)
    with pytest.warns(r3store.errors.R3StoreDeprecationWarning, match="cp_rank"), \
            pytest.raises(r3store.errors.LayoutOptionError, match="cp_rank=0: given as a keyword and as 1"):
        store.assemble(["s0"], options, cp_rank=0)
    with pytest.raises(r3store.errors.OptionError, match="return_tensors"):
        store.assemble(["s0"], return_tensors="tf")  # type: ignore[arg-type]


def test_reader_api_misuse(small_store_dir: Path) -> None:
    store = r3store.open_store(small_store_dir)
    with pytest.raises(TypeError, match=r"use slice\(0, 1\)"):
        store.get("s0", rows=(0, 1))  # type: ignore[arg-type]
    assert [1] not in store
    assert None not in store
    assert "s0" in store
    with pytest.raises(ValueError, match="return_tensors"):
        store.assemble(["s0"], return_tensors="tf")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match="not a committed route array"):
        store.read_rows("routes/elsewhere", 0, 1, [0])


@pytest.fixture
def store(tmp_path: Path) -> r3store.RouteStore:
    with r3store.RouteWriter(tmp_path, SPEC_4X16) as w:
        w.append("s00", np.tile(np.array([0, 1]), (5, 4, 1)))
    return r3store.open_store(tmp_path)


def test_scalar_arguments_are_rejected_with_a_hint(store: r3store.RouteStore) -> None:
    with pytest.raises(TypeError, match="slice"):
        store.get("s00", rows=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use \[3\]"):
        store.get("s00", layers=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use \['s00'\]"):
        store.assemble("s00")  # type: ignore[arg-type]
