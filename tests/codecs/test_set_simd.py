"""r3store.set: the AVX-512 kernels give the bytes and ids of the AVX2 kernels, the portable C and the numpy reference.

The AVX-512 encoder ranks 32 rows at a time (a transpose, a sorting network, table
gathers) and hands a group holding an exception row to the row-at-a-time classifier; the
AVX-512 gather decoder (``setcodec_gather_decode``, off by default) unranks 16 rows at a
time and hands the rest of a run to the scalar one. These tests drive every
(num_experts, top_k) with num_experts <= 1024 and top_k <= 16 through all code paths and
compare frames byte for byte and ids id for id.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from r3store.codecs import SetCodec, kernels
from r3store.codecs._set_numpy import encode_set_frame_numpy

NATIVE = kernels.native_module()


def _avx512_here() -> bool:
    if NATIVE is None or not NATIVE.cpu_features()["avx2"] or not hasattr(NATIVE, "setcodec_avx512"):
        return False
    try:
        NATIVE.setcodec_avx512(NATIVE.setcodec_avx512(True))
    except ValueError:
        return False
    return True


AVX2 = NATIVE is not None and bool(NATIVE.cpu_features()["avx2"])
AVX512 = _avx512_here()
GATHER = AVX512 and hasattr(NATIVE, "setcodec_gather_decode")
PATHS = ["gather"] * GATHER + ["avx512"] * AVX512 + ["avx2"] * AVX2 + ["portable"]


@contextmanager
def path(name: str) -> Iterator[None]:
    """Run the block with the set codec's ``gather`` (AVX-512 with the gather decoder),
    ``avx512``, ``avx2`` or ``portable`` C kernels."""
    assert NATIVE is not None
    with kernels.use("native" if name == "portable" else "native-avx2"):
        prev = NATIVE.setcodec_avx512(False) if hasattr(NATIVE, "setcodec_avx512") else None
        prev_gather = NATIVE.setcodec_gather_decode(False) if hasattr(NATIVE, "setcodec_gather_decode") else None
        try:
            if name in ("avx512", "gather"):
                NATIVE.setcodec_avx512(True)
            if name == "gather":
                NATIVE.setcodec_gather_decode(True)
            yield
        finally:
            if prev is not None:
                NATIVE.setcodec_avx512(prev)
            if prev_gather is not None:
                NATIVE.setcodec_gather_decode(prev_gather)


def _rows(rng: np.random.Generator, order: np.ndarray, top_k: int, bits: int, skew: bool) -> np.ndarray:
    """Rows of ``order`` (random permutations of the experts, one a row) cut to ``top_k``,
    with all-zero rows, repeated ids, ids in [E, 2**bits) and zero runs mixed in; ``skew``
    draws the ids of some rows from a steep distribution instead (many repeats, low ids)."""
    rows = order[:, :top_k].astype(np.int64)
    n, num_experts = order.shape
    kind = rng.random(n, dtype=np.float64)
    rows[kind < 0.06] = 0
    dup = np.flatnonzero((kind >= 0.06) & (kind < 0.09))
    if top_k >= 2:
        rows[dup, 0] = rows[dup, top_k - 1]
    big = np.flatnonzero((kind >= 0.09) & (kind < 0.11))
    if num_experts < 1 << bits:
        rows[big, int(rng.integers(0, top_k))] = rng.integers(num_experts, 1 << bits, big.size)
    if skew:
        steep = np.flatnonzero(kind >= 0.8)
        rows[steep] = np.minimum(rng.geometric(0.2, (steep.size, top_k)) - 1, num_experts - 1)
    if rng.random() < 0.3:
        rows[-int(rng.integers(1, n + 1)) :] = 0
    return rows


def _as_sets(ids: np.ndarray, num_experts: int, top_k: int) -> np.ndarray:
    """What a frame of ``ids`` decodes to: each full row of distinct ids below ``num_experts``
    sorted ascending, every other id as given."""
    flat = ids.astype(np.int64)
    full = flat.size // top_k * top_k
    rows = flat[:full].reshape(-1, top_k)
    ranked = np.sort(rows, axis=1)
    is_set = (ranked[:, 1:] != ranked[:, :-1]).all(axis=1) & (ranked[:, -1] < num_experts)
    return np.concatenate([np.where(is_set[:, None], ranked, rows).reshape(-1), flat[full:]])


def _frames(ids: np.ndarray, codec: SetCodec) -> dict[str, bytes]:
    out = {}
    for name in PATHS:
        with path(name):
            out[name] = codec.encode(ids, tag=99)
    return out


@pytest.mark.skipif(NATIVE is None, reason="the C extension is not built")
@pytest.mark.parametrize("band", range(8))
def test_every_shape_encodes_alike_on_every_path(band: int) -> None:
    """All (E, k), E <= 1024, k <= 16 (E in this band of 128): 96 to 135 rows (groups of 32,
    often refused for their exception rows) plus a tail, as uint16 and int64: the frames of
    every path are equal, and every path decodes them to the rows as sets."""
    rng = np.random.default_rng(band)
    for num_experts in range(band * 128 + 1, band * 128 + 129):
        order = np.argsort(rng.random((96 + int(rng.integers(0, 40)), num_experts)), axis=1)
        for top_k in range(1, min(16, num_experts) + 1):
            codec = SetCodec(num_experts, top_k)
            rows = _rows(rng, order, top_k, codec.bits, skew=False)
            if rng.random() < 0.5:  # groups without exceptions, so that the wide path runs alone
                rows = order[:, :top_k]
            tail = rng.integers(0, num_experts, int(rng.integers(0, top_k)))
            ids = np.concatenate([rows.reshape(-1), tail])
            for dtype in ("uint16", "int64"):
                frames = _frames(ids.astype(dtype), codec)
                first = frames[PATHS[0]]
                assert all(f == first for f in frames.values()), (num_experts, top_k, dtype)
            for name in PATHS:
                with path(name):
                    np.testing.assert_array_equal(codec.decode(first), _as_sets(ids, num_experts, top_k))


SAMPLED = [(64, 6), (128, 8), (256, 8), (384, 8), (1024, 8), (1023, 16), (512, 16), (160, 6), (2, 2), (3, 3),
           (7, 5), (33, 5), (65, 2), (200, 16), (255, 9), (257, 4), (1000, 13), (1024, 1), (17, 16)]


@pytest.mark.skipif(NATIVE is None, reason="the C extension is not built")
@pytest.mark.parametrize(("num_experts", "top_k"), SAMPLED)
@pytest.mark.parametrize("skew", [False, True], ids=["mixed", "skewed"])
def test_paths_give_the_numpy_reference_bytes(num_experts: int, top_k: int, skew: bool) -> None:
    """Frames of a few thousand rows (many groups of 32, skewed ids: most groups refused)
    from every dtype the writers pass are the numpy reference's frames, byte for byte."""
    rng = np.random.default_rng(num_experts * 17 + top_k + skew)
    codec = SetCodec(num_experts, top_k)
    order = np.argsort(rng.random((int(rng.integers(1000, 2100)), num_experts)), axis=1)
    rows = _rows(rng, order, top_k, codec.bits, skew)
    ids = np.concatenate([rows.reshape(-1), rng.integers(0, num_experts, int(rng.integers(0, top_k)))])
    want = encode_set_frame_numpy(ids, codec.params, 5)
    for dtype in ("uint8", "uint16", "int32", "int64"):
        if dtype == "uint8" and codec.bits > 8:
            continue
        arr = ids.astype(dtype)
        for name, frame in _frames(arr, codec).items():
            assert frame == encode_set_frame_numpy(arr, codec.params, 99), (name, dtype)
    assert encode_set_frame_numpy(ids.astype("uint16"), codec.params, 5) == want


@pytest.mark.skipif(NATIVE is None, reason="the C extension is not built")
def test_strided_and_out_of_range_inputs_on_every_path() -> None:
    """Strided views encode as their copies; an id at 2**bits or a negative one is refused
    (CodecError naming the range) on every path, wherever it sits among the groups."""
    from r3store.errors import CodecError

    rng = np.random.default_rng(3)
    codec = SetCodec(256, 8)
    big = np.argsort(rng.random((300, 2, 256)), axis=2)[:, :, :8]
    view = big[:, 1, :]
    for name in PATHS:
        with path(name):
            assert codec.encode(view) == codec.encode(np.ascontiguousarray(view))
            for at in (0, 255, 8 * 130 + 3, view.size - 1):
                for bad, dtype in ((256, "uint16"), (-1, "int32"), (1 << 20, "int64")):
                    ids = view.reshape(-1).astype(dtype)
                    ids[at] = bad
                    with pytest.raises(CodecError, match=r"\[0, 256\)"):
                        codec.encode(ids)


def test_setcodec_avx512_reports_and_refuses() -> None:
    if NATIVE is None or not hasattr(NATIVE, "setcodec_avx512"):
        pytest.skip("no extension with setcodec_avx512")
    if AVX512:
        prev = NATIVE.setcodec_avx512(False)
        try:
            assert NATIVE.setcodec_avx512(True) is False
            assert NATIVE.setcodec_avx512(True) is True
        finally:
            NATIVE.setcodec_avx512(prev)
    else:
        with pytest.raises(ValueError, match="AVX-512"):
            NATIVE.setcodec_avx512(True)


def _edge_rows(rng: np.random.Generator, num_experts: int, top_k: int) -> np.ndarray:
    """40 rows: rank 0 (ids 0..k-1), rank C(E, k) - 1 (the top k ids), the all-zero row (digit
    C(E, k)), an exception row (an id repeated, k >= 2), sets holding id E - 1, then random
    sets; shuffled, so that the edges fall in the gather decoder's groups and its scalar rest."""
    rows = np.argsort(rng.random((40, num_experts)), axis=1)[:, :top_k]
    rows[0] = np.arange(top_k)
    rows[1] = np.arange(num_experts - top_k, num_experts)
    rows[2] = 0
    rows[3, 0] = num_experts - 1
    if top_k >= 2:
        rows[4, 1] = rows[4, 0]
        rows[5] = np.concatenate([np.arange(top_k - 1), [num_experts - 1]])
    return rows[rng.permutation(40)]


@pytest.mark.skipif(NATIVE is None, reason="the C extension is not built")
@pytest.mark.parametrize("band", range(8))
def test_edge_ranks_decode_alike_on_every_path(band: int) -> None:
    """All (E, k), E <= 1024, k <= 16 (E in this band of 128, one k in four): the lowest and
    highest rank, the all-zero digit and exceptions decode to the rows as sets on every path
    (the gather decoder's compare-and-step chains meet the ends of the C(c, i) tables)."""
    rng = np.random.default_rng(100 + band)
    for num_experts in range(band * 128 + 1, band * 128 + 129):
        for top_k in range(1 + num_experts % 4, min(16, num_experts) + 1, 4):
            codec = SetCodec(num_experts, top_k)
            ids = _edge_rows(rng, num_experts, top_k).reshape(-1)
            frame = codec.encode(ids)
            want = _as_sets(ids, num_experts, top_k)
            for name in PATHS:
                with path(name):
                    np.testing.assert_array_equal(codec.decode(frame), want, err_msg=f"{name} {num_experts} {top_k}")


def test_setcodec_gather_decode_reports_and_refuses() -> None:
    if NATIVE is None or not hasattr(NATIVE, "setcodec_gather_decode"):
        pytest.skip("no extension with setcodec_gather_decode")
    if AVX512:
        prev = NATIVE.setcodec_gather_decode(False)
        try:
            assert NATIVE.setcodec_gather_decode(True) is False
            assert NATIVE.setcodec_gather_decode(True) is True
        finally:
            NATIVE.setcodec_gather_decode(prev)
    else:
        with pytest.raises(ValueError, match="AVX-512"):
            NATIVE.setcodec_gather_decode(True)
