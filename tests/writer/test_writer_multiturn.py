"""Multi-turn samples: append(start=..., final=False) continuations, SGLang start_len, close."""

from __future__ import annotations

import uuid
import warnings

import fsspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import r3store
from r3store.errors import (
    ContinuationError,
    DiscardedSampleWarning,
    DuplicateSampleError,
    IncompleteSampleError,
    RowCountError,
    WriterClosedError,
)

SPEC = r3store.ModelSpec(num_layers=5, num_experts=32, top_k=4, moe_layers=[1, 3, 4])


def random_routes(rng: np.random.Generator, rows: int, layers: int = 3, num_experts: int = 32,
                  top_k: int = 4) -> np.ndarray:
    """Valid routes: per (row, layer) a random permutation prefix of the experts."""
    keys = rng.random((rows, layers, num_experts))
    return np.argsort(keys, axis=-1)[..., :top_k].astype(np.int32)


def full_layers(moe: np.ndarray) -> np.ndarray:
    out = np.zeros((moe.shape[0], SPEC.num_layers, SPEC.top_k), dtype=np.int32)
    out[:, list(SPEC.moe_layers)] = moe
    return out


@pytest.mark.parametrize("backend", ["local", "memory"])
def test_turns_concatenate(backend, tmp_path, memory_url) -> None:
    url = str(tmp_path) if backend == "local" else memory_url
    rng = np.random.default_rng(0)
    t1, t2, t3 = random_routes(rng, 9), random_routes(rng, 0), random_routes(rng, 13)
    with r3store.RouteWriter(url, SPEC, chunk_rows=4) as w:
        w.append("conv", t1, start=0, final=False)
        w.append("conv", t2, start=9, final=False)
        w.append("conv", full_layers(t3), start=9, final=True, num_tokens=23, metadata={"turns": 3})
    store = r3store.open_store(url)
    assert store.sample_ids == ["conv"]
    np.testing.assert_array_equal(store.get("conv"), np.concatenate([t1, t2, t3]))
    assert store.num_tokens("conv") == 23
    assert store.row("conv")["turns"] == 3


def test_final_row_count_checks_the_whole_sample(tmp_path) -> None:
    rng = np.random.default_rng(1)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", random_routes(rng, 4), final=False)
        with pytest.raises(RowCountError, match=r"sample 'a'.*has 7 rows, expected num_tokens - 1 = 8"):
            w.append("a", random_routes(rng, 3), start=4, num_tokens=9)
        # the failed final call left the open sample as it was: retry with the right count
        last = random_routes(rng, 3)
        w.append("a", last, start=4, num_tokens=8, tokens=list(range(8)))
    assert r3store.open_store(tmp_path).get("a")[4:].tolist() == last.tolist()


@pytest.mark.parametrize(
    ("first_rows", "start", "rows", "kind"),
    [(5, 7, 3, "gap"), (5, 3, 4, "overlap"), (5, 0, 2, "overlap"), (0, 1, 2, "gap")],
)
def test_gap_or_overlap_names_both_ranges(tmp_path, first_rows, start, rows, kind) -> None:
    rng = np.random.default_rng(2)
    first = random_routes(rng, first_rows)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("good", random_routes(rng, 2))
        w.append("mt", first, final=False)
        with pytest.raises(ContinuationError) as info:
            w.append("mt", random_routes(rng, rows), start=start, final=True)
        msg = str(info.value)
        assert "'mt'" in msg
        assert kind in msg
        assert f"[0, {first_rows})" in msg, msg
        assert f"[{start}, {start + rows})" in msg, msg
        assert info.value.have == (0, first_rows)
        assert info.value.got == (start, start + rows)
        # the open sample is untouched; the right continuation still works
        w.append("mt", random_routes(rng, 1), start=first_rows, final=True)
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["good", "mt"]
    np.testing.assert_array_equal(store.get("mt")[:first_rows], first)


def test_continuation_of_unknown_sample_must_start_at_zero(tmp_path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(ContinuationError, match=r"'new'.*\[4, 6\).*\[0, 0\)"):
            w.append("new", random_routes(np.random.default_rng(3), 2), start=4)
        for bad in (-1, 1.5, True, "0"):
            with pytest.raises(r3store.errors.RouteValidationError, match="start"):
                w.append("new", random_routes(np.random.default_rng(3), 2), start=bad)  # type: ignore[arg-type]
    assert len(r3store.open_store(tmp_path)) == 0


def test_reusing_open_id_is_not_a_duplicate_but_reusing_a_final_one_is(tmp_path) -> None:
    rng = np.random.default_rng(4)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("x", random_routes(rng, 3), final=False)
        w.append("x", random_routes(rng, 3), start=3, final=False)  # same id, open: fine
        w.append("x", random_routes(rng, 3), start=6)
        with pytest.raises(DuplicateSampleError, match="'x'"):
            w.append("x", random_routes(rng, 3), start=9)
        with pytest.raises(DuplicateSampleError, match="'x'"):
            w.append("x", random_routes(rng, 3))
    assert r3store.open_store(tmp_path).num_tokens("x") == 10


def test_open_samples_survive_flush(tmp_path) -> None:
    rng = np.random.default_rng(5)
    t1, t2, other = random_routes(rng, 6), random_routes(rng, 4), random_routes(rng, 3)
    w = r3store.RouteWriter(tmp_path, SPEC, chunk_rows=4)
    w.append("mt", t1, final=False)
    assert w.flush() is None  # nothing completed yet
    w.append("other", other)
    shard = w.flush()
    assert shard is not None
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["other"]
    assert "mt" not in store.samples.column("sample_id").to_pylist()
    w.append("mt", t2, start=6, final=True)
    w.close()
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["other", "mt"]
    np.testing.assert_array_equal(store.get("mt"), np.concatenate([t1, t2]))
    np.testing.assert_array_equal(store.get("other"), other)


def test_auto_flush_keeps_open_samples(tmp_path) -> None:
    rng = np.random.default_rng(6)
    parts = [random_routes(rng, 5) for _ in range(4)]
    done = {f"d{i}": random_routes(rng, 5) for i in range(4)}
    with r3store.RouteWriter(tmp_path, SPEC, buffer_bytes=100) as w:
        for i, part in enumerate(parts):
            w.append("mt", part, start=5 * i, final=i == 3)
            w.append(f"d{i}", done[f"d{i}"])
    assert len(w.commits) >= 3
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("mt"), np.concatenate(parts))
    for sid, r in done.items():
        np.testing.assert_array_equal(store.get(sid), r)


def test_close_with_open_sample_raises_and_stores_none_of_it(tmp_path) -> None:
    rng = np.random.default_rng(7)
    done = random_routes(rng, 4)
    w = r3store.RouteWriter(tmp_path, SPEC)
    w.append("open-1", random_routes(rng, 3), final=False)
    w.append("done", done)
    w.append("open-2", random_routes(rng, 3), final=False)
    w.append("open-2", random_routes(rng, 3), start=3, final=False)
    with pytest.raises(IncompleteSampleError) as info:
        w.close()
    assert info.value.sample_ids == ("open-1", "open-2")
    assert "open-1" in str(info.value)
    assert "open-2" in str(info.value)
    assert "final=True" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(WriterClosedError):
        w.append("open-1", random_routes(rng, 1), start=3)
    w.close()  # already closed: no second error
    store = r3store.open_store(tmp_path)
    assert store.samples.column("sample_id").to_pylist() == ["done"]
    np.testing.assert_array_equal(store.get("done"), done)


def test_context_exit_without_error_raises_incomplete(tmp_path) -> None:
    rng = np.random.default_rng(8)
    with pytest.raises(IncompleteSampleError, match="open"), r3store.RouteWriter(tmp_path, SPEC) as w:  # noqa: PT012
        w.append("ok", random_routes(rng, 2))
        w.append("open", random_routes(rng, 2), final=False)
    assert r3store.open_store(tmp_path).sample_ids == ["ok"]


def test_context_exit_on_error_warns_and_commits_completed(tmp_path) -> None:
    rng = np.random.default_rng(9)
    ok = random_routes(rng, 2)
    with pytest.warns(DiscardedSampleWarning, match="open"), pytest.raises(KeyError, match="boom"), \
            r3store.RouteWriter(tmp_path, SPEC) as w:  # noqa: PT012, PT031
        w.append("ok", ok)
        w.append("open", random_routes(rng, 2), final=False)
        raise KeyError("boom")
    store = r3store.open_store(tmp_path)
    assert store.sample_ids == ["ok"]
    with pytest.raises(WriterClosedError):
        w.flush()


def test_context_exit_commits_even_when_warnings_are_errors(tmp_path) -> None:
    rng = np.random.default_rng(9)
    ok = random_routes(rng, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DiscardedSampleWarning, match="'open'"), \
                r3store.RouteWriter(tmp_path, SPEC) as w:  # noqa: PT012
            w.append("ok", ok)
            w.append("open", random_routes(rng, 2), final=False)
            raise KeyError("boom")
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("ok"), ok)


def test_sglang_start_len(tmp_path) -> None:
    """SGLang with ``routed_experts_start_len = s`` returns only rows [s, seqlen - 1)."""
    rng = np.random.default_rng(10)
    turn1_tokens, turn2_tokens = 12, 30  # whole sequence after each turn
    whole = random_routes(rng, turn2_tokens - 1)
    payload1 = {"routed_experts": r3store.encode_sglang(full_layers(whole[: turn1_tokens - 1])), "e2e_latency": 0.1}
    s = turn1_tokens - 1  # routed_experts_start_len of the second request
    payload2 = {"meta_info": {"routed_experts": r3store.encode_sglang(full_layers(whole[s:]))}}
    with r3store.RouteWriter(tmp_path, SPEC, chunk_rows=5) as w:
        w.append_sglang("chat", payload1, final=False)
        with pytest.raises(ContinuationError, match=r"\[0, 11\)"):
            w.append_sglang("chat", payload2, start=s + 1, num_tokens=turn2_tokens)
        w.append_sglang("chat", payload2, start=s, final=True, num_tokens=turn2_tokens)
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("chat"), whole)
    assert store.num_tokens("chat") == turn2_tokens


def test_metadata_given_on_an_earlier_turn_is_kept(tmp_path) -> None:
    rng = np.random.default_rng(11)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("mt", random_routes(rng, 2), final=False, metadata={"prompt_id": "p7"})
        w.append("mt", random_routes(rng, 2), start=2, metadata={"reward": 0.5})
    row = r3store.open_store(tmp_path).row("mt")
    assert row["prompt_id"] == "p7"
    assert row["reward"] == 0.5


@st.composite
def interleavings(draw: st.DrawFn) -> tuple[list[list[int]], list[tuple[str, int]], int, int]:
    """Turn lengths per sample, and a schedule of ("turn", sample) / ("flush", -1) steps
    that keeps each sample's turns in order while interleaving samples."""
    turns = draw(st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=4), min_size=1, max_size=5))
    pending = [len(t) for t in turns]
    schedule: list[tuple[str, int]] = []
    while any(pending):
        if draw(st.integers(0, 4)) == 0:
            schedule.append(("flush", -1))
        live = [i for i, n in enumerate(pending) if n]
        i = draw(st.sampled_from(live))
        pending[i] -= 1
        schedule.append(("turn", i))
    return turns, schedule, draw(st.integers(1, 2000)), draw(st.integers(1, 16))


@settings(max_examples=30, deadline=None)
@given(case=interleavings(), seed=st.integers(0, 2**32 - 1))
def test_interleaved_turns_and_flushes(case, seed) -> None:
    turns, schedule, buffer_bytes, chunk_rows = case
    rng = np.random.default_rng(seed)
    url = f"memory://r3store-test-{uuid.uuid4().hex}"
    parts = [[random_routes(rng, n) for n in t] for t in turns]
    done = [0] * len(turns)
    finals: list[str] = []
    with r3store.RouteWriter(url, SPEC, buffer_bytes=buffer_bytes, chunk_rows=chunk_rows) as w:
        for kind, i in schedule:
            if kind == "flush":
                w.flush()
                continue
            sid, k = f"s{i}", done[i]
            start = sum(len(p) for p in parts[i][:k])
            final = k == len(parts[i]) - 1
            routes = full_layers(parts[i][k]) if (i + k) % 2 else parts[i][k]
            w.append(sid, routes, start=start, final=final, num_tokens=start + len(routes) + 1 if final else None)
            done[i] += 1
            if final:
                finals.append(sid)
    try:
        store = r3store.open_store(url)
        assert store.sample_ids == finals
        for i, p in enumerate(parts):
            np.testing.assert_array_equal(store.get(f"s{i}"), np.concatenate(p))
            assert store.num_tokens(f"s{i}") == sum(len(x) for x in p) + 1
    finally:
        fsspec.filesystem("memory").rm(url.removeprefix("memory://"), recursive=True)

