"""The reader's output pool (``ReaderOptions.output_pool_bytes``): an output's memory is built
again only once nothing refers to it, every later output holds its own routes, and the pool
never keeps more than its budget."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import r3store
from r3store.errors import OptionError
from r3store.layout import LayoutOptions
from r3store.reader import BufferPool, ReaderOptions
from r3store.reader._pool import GRAIN, MIN_POOLED

SPEC = r3store.ModelSpec(num_layers=16, num_experts=64, top_k=8)
ROWS = 8192  # 8192 x 16 x 8 int32: 4 MiB, the smallest pooled output


def _routes(seed: int, rows: int = ROWS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((rows, 16, 64), dtype=np.float32), axis=-1)[..., :8].astype(np.int32)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("pool") / "store"
    samples = {f"s{i}": _routes(i) for i in range(4)}
    samples["short"] = _routes(9, ROWS - 300)
    with r3store.RouteWriter(root, SPEC, config={"writer_id": "w"}) as w:
        for sid, r in samples.items():
            w.append(sid, r)
    return root, samples


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


# -- BufferPool alone ---------------------------------------------------------------------------


def test_a_released_block_builds_the_next_output_and_a_held_one_never_does() -> None:
    pool = BufferPool(64 << 20)
    a = pool.empty((1 << 20,), np.int32)
    first = _address(a)
    b = pool.empty((1 << 20,), np.int32)  # a is held: new memory
    assert not np.shares_memory(a, b)
    del a
    c = pool.empty((1 << 20,), np.int32)  # a's block, released
    assert _address(c) == first
    assert pool.reused == 1
    assert not np.shares_memory(b, c)


def _share(a: np.ndarray, holder: str) -> object:
    return {"view": lambda: a.view(np.uint8), "slice": lambda: a[10:20], "memoryview": lambda: memoryview(a),
            "tensor": lambda: torch.from_numpy(a), "frombuffer": lambda: np.frombuffer(a, np.int32),
            "base_only": lambda: a.base}[holder]()


@pytest.mark.parametrize("holder", ["view", "slice", "memoryview", "tensor", "frombuffer", "base_only"])
def test_anything_sharing_the_memory_keeps_the_block_busy(holder: str) -> None:
    pool = BufferPool(64 << 20)
    a = pool.empty((1 << 20,), np.int32)
    a[:] = 7
    kept = _share(a, holder)
    block = kept if holder == "base_only" else None
    del a
    for _ in range(3):
        b = pool.empty((1 << 20,), np.int32)
        b[:] = 1
        del b  # released: its block comes back the next time, a's never
    assert pool.reused == 2
    if holder == "tensor":
        values = kept.numpy()  # type: ignore[attr-defined]
    elif holder == "base_only":
        values = np.asarray(block).view(np.int32)
    else:
        values = np.asarray(kept).view(np.int32)
    assert (values == 7).all()


def test_the_pool_never_holds_more_than_its_budget_and_drops_free_blocks_oldest_first() -> None:
    pool = BufferPool(3 * (4 << 20))
    held = [pool.empty((1 << 20,), np.int32) for _ in range(5)]  # 4 MiB each: three kept, two plain
    assert pool.nbytes == 3 * (4 << 20)
    assert sum(a.base is not None and a.base.nbytes == 4 << 20 for a in held) >= 3
    del held
    big = pool.empty((2 << 20,), np.int32)  # 8 MiB: two free 4 MiB blocks dropped to make room
    assert pool.nbytes <= pool.max_bytes
    assert pool.nbytes == (4 << 20) + (8 << 20)
    assert big.nbytes == 8 << 20


def test_small_and_oversized_outputs_are_plain_arrays() -> None:
    pool = BufferPool(8 << 20)
    small = pool.empty((MIN_POOLED // 4 - 1,), np.int32)
    huge = pool.empty((3 << 20,), np.int32)  # 12 MiB > the budget
    assert small.base is None
    assert huge.base is None
    assert pool.nbytes == 0


def test_a_block_fits_from_the_size_asked_to_twice_it() -> None:
    pool = BufferPool(256 << 20)
    a = pool.empty((40 << 20,), np.uint8)
    del a
    far = pool.empty((10 << 20,), np.uint8)  # 40 MiB block > 2 x 10 MiB + a grain: not used
    assert pool.reused == 0
    del far
    near = pool.empty((30 << 20,), np.uint8)
    assert pool.reused == 1
    assert near.base is not None
    assert near.base.nbytes == 40 << 20
    assert GRAIN == 2 << 20


def test_a_zero_budget_keeps_nothing() -> None:
    pool = BufferPool(0)
    a = pool.empty((4 << 20,), np.int32)
    assert a.base is None
    assert pool.nbytes == 0


def test_pickles_empty_with_its_budget() -> None:
    pool = BufferPool(64 << 20)
    a = pool.empty((1 << 20,), np.int32)
    copy = pickle.loads(pickle.dumps(pool))
    assert copy.max_bytes == 64 << 20
    assert copy.nbytes == 0
    assert pool.nbytes == a.base.nbytes


def test_threads_never_get_memory_another_output_holds() -> None:
    pool = BufferPool(256 << 20)
    outputs: list[np.ndarray] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        for i in range(20):
            a = pool.empty((1 << 20,), np.int32)
            a[:] = seed * 100 + i
            if i % 4 == 0:
                with lock:
                    outputs.append(a)
            assert (a == seed * 100 + i).all()

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(outputs) == 20
    values = {int(a[0]) for a in outputs}
    assert len(values) == 20  # each kept output still holds what its thread wrote
    assert all((a == a[0]).all() for a in outputs)


# -- through the reader -------------------------------------------------------------------------


def test_get_reuses_released_memory_and_returns_each_samples_routes(stored: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, samples = stored
    store = r3store.open_store(root, reader={"cache_bytes": 0})
    a = store.get("s0")
    address = _address(a)
    assert (a == samples["s0"]).all()
    del a
    for sid in ("s1", "s2", "short"):
        got = store.get(sid)
        np.testing.assert_array_equal(got, samples[sid])
        del got
    assert store.buffer_pool.reused == 2  # s1 and s2; "short" is under 4 MiB: a plain array
    again = store.get("s3")
    np.testing.assert_array_equal(again, samples["s3"])
    assert store.buffer_pool.nbytes <= store.options.output_pool_bytes
    assert address in {_address(again), *(_address(b) for b in store.buffer_pool._arrays)}


def test_held_outputs_keep_their_routes_while_later_reads_run(stored: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, samples = stored
    store = r3store.open_store(root, reader={"cache_bytes": 0})
    held = {sid: store.get(sid) for sid in samples}
    tensors = [torch.from_numpy(store.get("s0")) for _ in range(3)]
    for _ in range(2):
        for sid in samples:
            store.get(sid)
    for sid, r in samples.items():
        np.testing.assert_array_equal(held[sid], r)
    for t in tensors:
        np.testing.assert_array_equal(t.numpy(), samples["s0"])


def test_assemble_reuses_released_memory_with_the_same_batch(stored: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = stored
    plain = r3store.open_store(root, reader={"output_pool_bytes": 0})
    pooled = r3store.open_store(root)
    for layout in ("thd", "bshd", "sbhd"):
        opts = LayoutOptions(layout=layout, cp_size=2, cp_rank=1, fill_value=-1)
        want = plain.assemble(["s0", "short", "s1"], opts)["routes"]
        for _ in range(3):
            got = pooled.assemble(["s0", "short", "s1"], opts)["routes"]
            np.testing.assert_array_equal(got, want)
            del got
    assert pooled.buffer_pool.reused > 0
    assert plain.buffer_pool.reused == 0
    assert plain.buffer_pool.nbytes == 0


def test_output_pool_bytes_is_validated_and_shared_by_forks(stored: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = stored
    with pytest.raises(OptionError, match="output_pool_bytes"):
        ReaderOptions(output_pool_bytes=-1)
    with pytest.raises(OptionError, match="output_pool_bytes"):
        ReaderOptions.from_dict({"output_pool_bytes": "big"})
    store = r3store.open_store(root, reader={"output_pool_bytes": 32 << 20})
    assert store.buffer_pool.max_bytes == 32 << 20
    assert store.fork().buffer_pool is store.buffer_pool
    copy = pickle.loads(pickle.dumps(store))
    assert copy.buffer_pool is not store.buffer_pool
    assert copy.buffer_pool.max_bytes == 32 << 20
    store.get("s0")
    store.clear_cache()  # decoded chunks only
    assert store.buffer_pool.nbytes == 4 << 20
    store.close()
    assert store.buffer_pool.nbytes == 0
