"""RouteWriter: stored size, lifecycle (flush / auto-flush / close), torch input, quarantine."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import (
    DuplicateSampleError,
    ExpertIdError,
    OptionError,
    RouteValidationError,
    SampleNotFoundError,
    WriterClosedError,
)
from r3store.testing.synthetic import uniform_routes


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
    w = r3store.RouteWriter(url, SPEC, writer_id="w1")
    assert w.flush() is None  # nothing buffered
    w.append("a", a)
    w.append("b", b)
    assert len(r3store.open_store(url)) == 0  # buffered, not committed
    shard = w.flush()
    assert isinstance(shard, str) and shard.startswith("w1")
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
    assert len(w.commits) == 2 and w.commits[0] == shard
    store = r3store.open_store(url)
    assert store.sample_ids == ["a", "b", "c"]
    np.testing.assert_array_equal(store.get("c"), c)
    assert store.row("c")["row_start"] == 0 and store.row("b")["row_start"] == 5


def test_buffer_bytes_triggers_automatic_flushes(tmp_path) -> None:
    rng = np.random.default_rng(2)
    data = {f"s{i}": uniform_routes(rng, 10, 3, 48, 2) for i in range(10)}  # 120 bytes buffered each
    with r3store.RouteWriter(tmp_path, SPEC, buffer_bytes=300) as w:
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
    with r3store.RouteWriter(tmp_path, r3store.ModelSpec(num_layers=4, num_experts=48, top_k=2, moe_layers=[0, 2, 3])) as w:
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
    with r3store.RouteWriter(tmp_path, SPEC, chunk_rows=4) as w:
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
    assert store.row("t1")["token_hash"] == hashlib.blake2b(np.array([5, 6], "<i8").tobytes(), digest_size=16).hexdigest()


def test_torch_float_tensor_rejected(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    with r3store.RouteWriter(tmp_path, SPEC) as w, pytest.raises(RouteValidationError, match="dtype must be integer"):
        w.append("f", torch.zeros((2, 3, 2)))


def test_constructor_arguments(tmp_path) -> None:
    with pytest.raises(TypeError, match="ModelSpec"):
        r3store.RouteWriter(tmp_path, {"num_layers": 1})  # type: ignore[arg-type]
    for name in ("buffer_bytes", "chunk_rows", "layers_per_chunk", "object_bytes"):
        with pytest.raises(OptionError, match=name):
            r3store.RouteWriter(tmp_path, SPEC, **{name: 0})
        with pytest.raises(OptionError, match=name):
            r3store.RouteWriter(tmp_path, SPEC, {name: 0})
    with pytest.raises(OptionError, match="on_invalid"):
        r3store.RouteWriter(tmp_path, SPEC, on_invalid="drop")  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="not a writer setting"):
        r3store.RouteWriter(tmp_path, SPEC, {"shard_rows": 5})
    w = r3store.RouteWriter(tmp_path, SPEC, writer_id="mine")
    assert "mine" in repr(w) and w.config.writer_id == "mine" and w.config.layers_per_chunk == 3
    with pytest.raises(RouteValidationError, match="sample_id"):
        w.append("", np.zeros((0, 3, 2)))
    w.close()
    w.close()  # idempotent


def test_writer_config_passed_whole(tmp_path) -> None:
    """A WriterConfig (or its dict form) sets the writer whole; keywords merge into it."""
    config = r3store.WriterConfig(chunk_rows=2, object_bytes=1, writer_id="cfg")
    routes = np.tile(np.array([0, 1]), (5, 3, 1))
    for i, how in enumerate([dict(config=config), dict(config=config.to_dict()),
                             dict(config={"chunk_rows": 2}, object_bytes=1, writer_id="cfg")]):
        with r3store.RouteWriter(tmp_path / str(i), SPEC, **how) as w:
            w.append("a", routes)
        assert w.config == dataclasses.replace(config, layers_per_chunk=3)
        store = r3store.open_store(tmp_path / str(i))
        geometry = store.geometry_of(store.row("a")["array"])
        assert (geometry.chunk_rows, geometry.object_rows, w.commits) == (2, 2, ["cfg-00000"])
    with pytest.raises(OptionError, match="chunk_rows=3: given as a keyword and as 2 in config"):
        r3store.RouteWriter(tmp_path / "x", SPEC, config, chunk_rows=3)
    with pytest.raises(WriterClosedError):
        w.append("late", np.zeros((0, 3, 2), dtype=np.int32))


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_restarted_writer_with_same_id_does_not_overwrite(backend, tmp_path, memory_url) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    rng = np.random.default_rng(6)
    first, second, third = (uniform_routes(rng, n, 3, 48, 2) for n in (5, 2, 7))
    with r3store.RouteWriter(url, SPEC, writer_id="rank-0") as w:
        w.append("a", first)
        w.flush()
        w.append("c", third)
    with r3store.RouteWriter(url, SPEC, writer_id="rank-0") as w:  # e.g. a restarted worker
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

    with r3store.RouteWriter(tmp_path, QSPEC, on_invalid="quarantine") as w:
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
    assert table["good-0"]["quarantined"] is False and table["good-0"]["reason"] is None
    assert "repeated" in table["repeated"]["reason"] and table["repeated"]["step"] == 2
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
