"""The reader's caches: one byte-bounded LRU (cachetools) for decoded chunks and object indexes."""

from __future__ import annotations

import pickle

import numpy as np

from r3store.reader._chunks import ByteLRU


def test_bounded_by_bytes_least_recently_used_out_first() -> None:
    cache: ByteLRU[str] = ByteLRU(100)
    cache["a"], cache["b"] = np.zeros(40, np.uint8), np.zeros(40, np.uint8)
    assert cache.get("a") is not None  # a is now the most recent
    cache["c"] = np.zeros(40, np.uint8)
    assert set(cache) == {"a", "c"}
    assert cache.currsize == 80


def test_an_array_larger_than_the_budget_is_not_kept() -> None:
    cache: ByteLRU[str] = ByteLRU(10)
    cache["small"] = np.zeros(10, np.uint8)
    cache["big"] = np.zeros(11, np.uint8)
    assert set(cache) == {"small"}
    cache["small"] = np.zeros(11, np.uint8)  # an entry replaced by one too large goes
    assert not cache
    assert ByteLRU(0).maxsize == 0


def test_resized_keeps_what_fits_and_pickles() -> None:
    cache: ByteLRU[int] = ByteLRU(1000)
    for i in range(5):
        cache[i] = np.full(100, i, np.int32)[:25]  # nbytes 100
    small = cache.resized(250)
    assert small.maxsize == 250
    assert small.currsize == 200
    assert len(small) == 2
    back = pickle.loads(pickle.dumps(small))
    assert back.maxsize == 250
    assert sorted(back) == sorted(small)
