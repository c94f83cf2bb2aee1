"""kernels.route_stats_pieces (validate's per-sample sums): every implementation gives, per piece
of rows, what route_stats gives cell by cell, summed; the histogram is the same."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r3store.codecs import kernels
from r3store.errors import CodecError

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64"]


def _impls() -> list[str]:
    native = kernels.native_module()
    out = ["numpy"]
    if native is not None:
        out.append("native")
        if native.cpu_features()["avx2"]:
            out.append("native-avx2")
    return out


def _summed(routes: np.ndarray, cuts: list[int], nbins: int, mask: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """The cell-by-cell route_stats (numpy), summed per piece by hand."""
    hist = np.zeros((routes.shape[1], nbins), np.int64)
    with kernels.use("numpy"):
        top, rep = kernels.route_stats(routes, hist, mask)
    n, layers = len(cuts) - 1, routes.shape[1]
    ptop, prep, pnz = np.full((n, layers), -1, np.int64), np.zeros((n, layers), bool), np.zeros((n, layers), np.int64)
    for p in range(n):
        for r in range(cuts[p], cuts[p + 1]):
            ptop[p] = np.maximum(ptop[p], top[r])
            prep[p] |= rep[r]
            pnz[p] += top[r] != 0
    return ptop, prep, pnz, hist


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 40), st.integers(1, 5), st.sampled_from([1, 2, 7, 8, 9]), st.sampled_from(DTYPES),
       st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_pieces_are_the_cells_summed(rows: int, layers: int, k: int, dtype: str, strided: bool, masked: bool,
                                     seed: int) -> None:
    rng = np.random.default_rng(seed)
    low = -2 if np.dtype(dtype).kind == "i" else 0
    routes = rng.integers(low, 30, (rows * 2, layers, k)).astype(dtype)
    routes = routes[::2] if strided else np.ascontiguousarray(routes[:rows])
    if rows and rng.random() < 0.5:  # mostly valid rows: distinct ids, as the C fast path sees them
        routes[...] = np.argsort(rng.random((rows, layers, 30)), axis=-1)[..., :k].astype(dtype)
        routes[rng.integers(0, rows)] = 0  # an all-zero row
    inner = sorted(rng.integers(0, rows + 1, int(rng.integers(0, 4))).tolist())
    cuts = [0, *inner, rows]  # repeats allowed: empty pieces
    mask = rng.random((rows, layers)) < 0.6 if masked else None
    want = _summed(routes, cuts, 24, mask)
    for impl in _impls():
        with kernels.use(impl):
            hist = np.zeros((layers, 24), np.int64)
            got = kernels.route_stats_pieces(routes, cuts, hist, mask)
        for g, w, name in zip((*got, hist), want, ("top", "repeated", "nonzero", "hist"), strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{impl} {name}")


@pytest.mark.parametrize("impl", _impls())
def test_tiles_of_a_long_piece_add_up(impl: str) -> None:
    """Pieces longer than the C tile (1,024 rows), k = 8 int32 (the AVX2 path), a repeat and an
    out-of-range id far into the piece, a histogram that counts past one tile."""
    rng = np.random.default_rng(5)
    routes = np.argsort(rng.random((5000, 3, 64), dtype=np.float32), axis=-1)[..., :8].astype(np.int32)
    routes[4321, 2, 5] = routes[4321, 2, 1]  # a repeat in layer 2
    routes[3000, 0, 7] = 70  # out of range (nbins 64) in layer 0
    cuts = [0, 1023, 1024, 4000, 5000]
    want = _summed(routes, cuts, 64, None)
    with kernels.use(impl):
        hist = np.zeros((3, 64), np.int64)
        got = kernels.route_stats_pieces(routes, cuts, hist)
    for g, w in zip((*got, hist), want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert got[1][3].tolist() == [False, False, True]  # row 4321: the last piece
    assert got[0][2, 0] == 70


@pytest.mark.parametrize("cuts", [[], [1, 5], [0, 4], [0, 3, 2, 5], [0, 6]])
def test_cuts_must_rise_from_zero_to_the_rows(cuts: list[int]) -> None:
    routes = np.zeros((5, 2, 2), np.int32)
    for impl in _impls():
        with kernels.use(impl), pytest.raises(CodecError, match="cuts"):
            kernels.route_stats_pieces(routes, cuts)
