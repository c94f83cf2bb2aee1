"""A sample id repeated in one batch (``assemble(["a", "a"], ...)``): allowed, as oversampling.

Decision (documented in ``r3store.batch.assemble``, ``RouteStore.assemble`` and
``RouteReader.get_many``): each occurrence is laid out as a sequence of its own holding the
sample's routes. The oracle is the same batch with the repeat replaced by a second sample
committed with identical routes (and tokens, policy versions and missing rows), in every
layout, CP/TP/SP split and pad policy: everything but ``sample_ids`` must be equal.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import r3store
from r3store.batch import assemble

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2, moe_layers=[1, 2, 3])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> r3store.RouteStore:
    """``a`` (37 rows, rows 5-8 missing, two policy versions), ``a-copy`` identical, ``b`` (20 rows);
    small chunks so that the repeat straddles chunk and object boundaries."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("repeats") / "s"

    def routes(rows: int) -> np.ndarray:
        return np.argsort(rng.random((rows, 3, 16)), axis=-1)[..., :2].astype(np.int32)

    a = routes(37)
    a[5:9] = -1
    tokens = rng.integers(0, 1000, 38).tolist()
    with r3store.RouteWriter(path, SPEC, {"chunk_rows": 8, "layers_per_chunk": 2, "object_bytes": 64}) as w:
        for sid in ("a", "a-copy"):
            w.append(sid, a[:20], start=0, final=False, tokens=tokens[:21], allow_missing=True, policy_version=3)
            w.append(sid, a[20:], start=20, num_tokens=38, tokens=tokens, allow_missing=True, policy_version=4)
        w.append("b", routes(20))
    TOKENS["a"] = TOKENS["a-copy"] = tokens
    return r3store.open_store(path, reader={"cache_bytes": 0})


TOKENS: dict[str, list[int]] = {}
"""The token ids of ``a`` and ``a-copy`` (filled by the fixture)."""


def _same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if key == "sample_ids":
            continue
        if isinstance(value, np.ndarray):
            assert got[key].dtype == value.dtype, key
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            assert got[key] == value, key


OPTIONS = [
    {"layout": "thd"},
    {"layout": "bshd"},
    {"layout": "sbhd", "max_seqlen": 48},
    {"layout": "thd", "cp_size": 2, "cp_rank": 1},
    {"layout": "thd", "cp_size": 2, "cp_rank": 0, "cp_mode": "contiguous"},
    {"layout": "thd", "tp_size": 2, "tp_rank": 1, "sequence_parallel": True},
    {"layout": "bshd", "pad_policy": "fill", "fill_value": 0, "dtype": "auto"},
    {"layout": "thd", "packed": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("order", [["a", "a"], ["a", "b", "a"], ["b", "a", "a", "b"]])
def test_a_repeated_id_is_laid_out_like_a_second_sample_with_the_same_routes(
        store: r3store.RouteStore, options: dict[str, Any], order: list[str]) -> None:
    twin = list(order)
    twin[len(order) - 1 - order[::-1].index("a")] = "a-copy"  # the last "a" becomes its twin
    got = assemble(store, order, options, return_policy_version=True)
    want = assemble(store, twin, options, return_policy_version=True)
    assert got["sample_ids"] == order
    _same_batch(got, want)


def test_a_repeated_id_through_the_store_facade_with_tokens_and_get_many(store: r3store.RouteStore) -> None:
    a = store.get("a")
    first, second = store.get_many(["a", "a"])
    np.testing.assert_array_equal(first, a)
    np.testing.assert_array_equal(second, a)
    assert not np.shares_memory(first, second)  # writing one copy never changes the other
    tokens = TOKENS["a"]
    batch = store.assemble(["a", "a"], {"layout": "thd"}, tokens=[tokens, tokens], return_policy_version=True)
    twin = store.assemble(["a", "a-copy"], {"layout": "thd"}, tokens=[tokens, tokens], return_policy_version=True)
    _same_batch(batch, twin)
    assert batch["cu_seqlens"].tolist() == [0, 38, 76]
    assert batch["tokens"].tolist() == tokens + tokens
