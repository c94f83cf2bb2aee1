"""kernels.route_stats (validate's checks in one pass): C and numpy agree, and both agree with plain Python."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r3store.codecs import kernels
from r3store.errors import CodecError

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _python(routes: np.ndarray, nbins: int, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, layers, k = routes.shape
    top = np.zeros((rows, layers), np.int64)
    rep = np.zeros((rows, layers), bool)
    hist = np.zeros((layers, nbins), np.int64)
    for r in range(rows):
        for layer in range(layers):
            ids = [int(np.int64(v)) if routes.dtype != np.uint64 else int(v.astype(np.int64)) for v in routes[r, layer]]
            top[r, layer] = max(ids) if k else 0
            rep[r, layer] = len(set(ids)) < len(ids)
            if mask is None or mask[r, layer]:
                for v in ids:
                    if 0 <= v < nbins:
                        hist[layer, v] += 1
    return top, rep, hist


def _both(routes: np.ndarray, nbins: int, mask: np.ndarray | None) -> None:
    expected = _python(routes, nbins, mask)
    for impl in ("numpy", "native", "native-avx2"):
        if impl != "numpy" and kernels.native_module() is None:
            continue
        if impl == "native-avx2" and not kernels.native_module().cpu_features()["avx2"]:
            continue
        with kernels.use(impl):
            hist = np.zeros((routes.shape[1], nbins), np.int64)
            top, rep = kernels.route_stats(routes, hist, mask)
            assert top.dtype == np.int64, impl
            assert rep.dtype == np.bool_, impl
            np.testing.assert_array_equal(top, expected[0], err_msg=impl)
            np.testing.assert_array_equal(rep, expected[1], err_msg=impl)
            np.testing.assert_array_equal(hist, expected[2], err_msg=impl)
            np.testing.assert_array_equal(rep, kernels.repeated_ids(routes), err_msg=impl)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 9), st.integers(1, 4), st.sampled_from([0, 1, 2, 8, 31, 32, 33, 40]), st.sampled_from(DTYPES),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_route_stats_agree_on_random_routes(rows: int, layers: int, k: int, dtype: str, strided: bool,
                                            masked: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    low = -3 if np.dtype(dtype).kind == "i" else 0
    routes = rng.integers(low, 40, (rows * 2, layers, k)).astype(dtype)
    routes = routes[::2] if strided else routes[:rows]
    mask = rng.random((rows, layers)) < 0.5 if masked else None
    _both(routes, 32, mask)


@pytest.mark.parametrize("case", ["repeat first and last", "all equal", "distinct top", "negative and huge",
                                  "transposed", "k over 32 repeat at ends"])
def test_route_stats_agree_on_adversarial_routes(case: str) -> None:
    if case == "repeat first and last":
        routes = np.arange(8, dtype=np.int32).reshape(1, 1, 8).repeat(3, axis=0)
        routes[1, 0, 7] = routes[1, 0, 0]
    elif case == "all equal":
        routes = np.full((4, 3, 8), 5, np.int16)
    elif case == "distinct top":
        routes = np.arange(64, dtype=np.uint8).reshape(2, 4, 8)
    elif case == "negative and huge":
        routes = np.array([[[-1, 2**31 - 1, -(2**31), 0]]], np.int32)
    elif case == "transposed":
        routes = np.ascontiguousarray(np.arange(48, dtype=np.int64).reshape(3, 2, 8).transpose(1, 0, 2))[:, ::-1]
    else:
        routes = np.arange(40, dtype=np.int32).reshape(1, 1, 40).repeat(2, axis=0)
        routes[0, 0, 39] = routes[0, 0, 0]
    _both(routes, 16, None)
    _both(routes, 16, np.ones(routes.shape[:2], bool))


def test_route_stats_refuses_what_does_not_fit() -> None:
    routes = np.zeros((2, 3, 4), np.int32)
    with pytest.raises(CodecError, match="3-D integer"):
        kernels.route_stats(routes.astype(float))
    with pytest.raises(CodecError, match="hist"):
        kernels.route_stats(routes, np.zeros((2, 8), np.int64))
    with pytest.raises(CodecError, match="hist"):
        kernels.route_stats(routes, np.zeros((3, 8), np.int32))
    with pytest.raises(CodecError, match="mask"):
        kernels.route_stats(routes, None, np.zeros((2, 4), bool))


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_route_stats_every_pair_of_slots_and_extreme_ids(dtype: str) -> None:
    """The vector path of 32-bit ids, top_k 8: a repeat in each of the 28 slot pairs, extreme ids."""
    rows = []
    for i in range(8):
        for j in range(i + 1, 8):
            row = np.arange(10, 18)
            row[j] = row[i]
            rows.append(row)
    info = np.iinfo(dtype)
    rows += [np.array([info.max, info.min, 0, 1, 2, 3, 4, 5]), np.array([info.min] * 2 + list(range(6))),
             np.arange(8)[::-1]]
    routes = np.array(rows).astype(dtype).reshape(-1, 1, 8)
    routes = np.concatenate([routes, routes], axis=1)  # two layers, contiguous (layer, 8) blocks
    mask = np.zeros(routes.shape[:2], bool)
    mask[::3] = True
    _both(routes, 16, None)
    _both(routes, 16, mask)
    _both(routes[::2], 16, None)  # strided rows: still contiguous (layer, 8) blocks


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_route_stats_histogram_adds_to_the_counts_given(dtype: str) -> None:
    """A Qwen3-shaped block (48 layers, top-8, 128 bins: the AVX2 path's per-call uint32 copy of
    the histogram) adds its counts to a histogram that already holds some, masked or not."""
    rng = np.random.default_rng(7)
    routes = np.argsort(rng.random((300, 48, 128)), axis=2)[:, :, :8].astype(np.int64)
    routes[3, 5, 2], routes[4, 6, 1], routes[5, 7, 0] = 128, 1 << 20, routes[5, 7, 1]
    if dtype == "int32":
        routes[6, 8, 3] = -1
    routes = routes.astype(dtype)
    mask = rng.random((300, 48)) < 0.7
    start = rng.integers(0, 1 << 40, (48, 128))
    for impl in ("numpy", "native", "native-avx2"):
        if impl != "numpy" and (kernels.native_module() is None or (
                impl == "native-avx2" and not kernels.native_module().cpu_features()["avx2"])):
            continue
        for m in (None, mask):
            expected = start + _python(routes, 128, m)[2]
            with kernels.use(impl):
                hist = start.copy()
                kernels.route_stats(routes, hist, m)
                kernels.route_stats(routes[:0], hist, None if m is None else m[:0])
            np.testing.assert_array_equal(hist, expected, err_msg=f"{impl} mask={m is not None}")
