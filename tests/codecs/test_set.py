"""r3store.set: the CodecTests kit, rows as sets, native == numpy, forged payloads, golden frames, size bound."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pytest

import r3store
from r3store._format import position_tag
from r3store.codecs import Codec, SetCodec, SupportsBatchDecode, get_codec, kernels
from r3store.codecs._set_numpy import block_rows, encode_set_frame_numpy, set_params
from r3store.errors import ChecksumError, CodecError, FormatError
from r3store.testing import CodecTests
from r3store.testing.codec import check_golden, ensure_golden

FIXTURES = Path(__file__).parents[1] / "fixtures" / "codecs"
SHAPES = [(64, 6), (128, 8), (256, 8), (384, 8), (1024, 16), (1024, 8), (8, 2), (16, 16), (64, 1), (1, 1), (3, 2)]
"""(num_experts, top_k): the benchmark shapes, blocks above 64 bits (1024 x 16, 1024 x 8),
several rows per block (8 x 2), a single set (16 x 16), k = 1 and the smallest codec."""
NATIVE = kernels.native_module() is not None


def as_sets(ids: np.ndarray, num_experts: int, top_k: int) -> np.ndarray:
    """What r3store.set decodes, stated independently: each full row of ``top_k`` distinct
    ids below ``num_experts`` sorted ascending, every other id as given."""
    flat = np.asarray(ids, dtype=np.int64).reshape(-1).copy()
    full = flat.size // top_k * top_k
    for start in range(0, full, top_k):
        row = flat[start : start + top_k].tolist()
        if len(set(row)) == top_k and max(row) < num_experts:
            flat[start : start + top_k] = sorted(row)
    return flat


def random_sets(rng: np.random.Generator, rows: int, num_experts: int, top_k: int) -> np.ndarray:
    """``rows`` uniformly random k-subsets, each in random order, shape (rows, top_k)."""
    keys = rng.random((rows, num_experts))
    return np.argpartition(keys, top_k - 1, axis=1)[:, :top_k] if top_k < num_experts else \
        np.argsort(keys, axis=1)


class TestSetCodec(CodecTests):
    @pytest.fixture(params=SHAPES, ids=lambda p: f"E{p[0]}-k{p[1]}")
    def codec(self, request: pytest.FixtureRequest) -> SetCodec:
        return SetCodec(*request.param)

    def id_bound(self, codec: Codec) -> int:
        assert isinstance(codec, SetCodec)
        return 1 << codec.bits

    def decoded(self, codec: Codec, ids: np.ndarray) -> np.ndarray:
        assert isinstance(codec, SetCodec)
        return as_sets(ids, codec.num_experts, codec.top_k)


# -- rows are sets ----------------------------------------------------------------------


@pytest.mark.parametrize(("num_experts", "top_k"), SHAPES)
def test_rows_decode_ascending_whatever_their_order(num_experts: int, top_k: int) -> None:
    rng = np.random.default_rng(num_experts * 17 + top_k)
    rows = random_sets(rng, 300, num_experts, top_k)
    codec = SetCodec(num_experts, top_k)
    frame = codec.encode(rows)
    got = codec.decode(frame).reshape(rows.shape)
    np.testing.assert_array_equal(got, np.sort(rows, axis=1))
    shuffled = rng.permuted(rows, axis=1)
    assert codec.encode(shuffled) == frame  # the order of a row's ids is not stored


def test_zero_rows_exceptions_and_tail_decode_exactly() -> None:
    codec = SetCodec(64, 4)
    rows = np.array([[9, 3, 63, 0], [0, 0, 0, 0], [5, 5, 1, 2], [1, 2, 3, 4], [0, 0, 0, 0]])
    ids = np.concatenate([rows.reshape(-1), [7, 0, 63]])  # 3 ids after the last full row
    got = codec.decode(codec.encode(ids))
    np.testing.assert_array_equal(got, [0, 3, 9, 63, 0, 0, 0, 0, 5, 5, 1, 2, 1, 2, 3, 4, 0, 0, 0, 0, 7, 0, 63])


def test_ids_of_the_packed_width_beyond_num_experts_are_exceptions() -> None:
    """A quarantined sample may hold ids in [E, 2**bits): stored exactly, as bitpack stores them."""
    codec = SetCodec(100, 2)
    ids = np.array([[101, 3], [127, 0], [3, 99]])
    np.testing.assert_array_equal(codec.decode(codec.encode(ids)), [101, 3, 127, 0, 3, 99])
    with pytest.raises(CodecError, match=r"\[0, 128\)"):
        codec.encode([128, 0])


def test_trailing_zero_rows_are_not_stored() -> None:
    codec = SetCodec(256, 8)
    rows = random_sets(np.random.default_rng(1), 10, 256, 8)
    padded = np.zeros((1000, 8), dtype=np.int64)
    padded[:10] = rows
    frame = codec.encode(padded)
    assert len(frame) == len(codec.encode(rows))
    assert codec.frame_size(frame) == 8000
    np.testing.assert_array_equal(codec.decode(frame)[:80], np.sort(rows, axis=1).reshape(-1))
    assert not codec.decode(frame)[80:].any()


@pytest.mark.parametrize(("num_experts", "top_k"), [(64, 6), (128, 8), (256, 8), (384, 8)])
def test_uniform_sets_cost_within_2_percent_of_the_bound(num_experts: int, top_k: int) -> None:
    """log2 C(E, k) bits per row is the least any coder can spend on uniformly random sets."""
    rows = random_sets(np.random.default_rng(2), 20_000, num_experts, top_k)
    frame = SetCodec(num_experts, top_k).encode(rows)
    bound = math.log2(math.comb(num_experts, top_k)) * len(rows) / 8
    assert len(frame) <= 1.02 * bound
    assert len(frame) < 0.8 * len(rows) * top_k * max(1, (num_experts - 1).bit_length()) / 8


@pytest.mark.parametrize(
    ("radix", "rows"),
    [(math.comb(256, 8) + 1, 1), (math.comb(64, 6) + 1, 2), (math.comb(128, 8) + 1, 1), (math.comb(1024, 16) + 1, 1),
     (29, 8), (2, 1), (64, 1)],
)
def test_block_rows_rule(radix: int, rows: int) -> None:
    assert block_rows(radix) == rows
    m = block_rows(radix)
    assert (radix**m - 1).bit_length() <= 120


# -- native == numpy --------------------------------------------------------------------


def _mixed_ids(rng: np.random.Generator, num_experts: int, top_k: int) -> np.ndarray:
    bits = max(1, (num_experts - 1).bit_length())
    rows = random_sets(rng, int(rng.integers(0, 400)), num_experts, top_k).astype(np.int64)
    if len(rows):
        rows[rng.random(len(rows)) < 0.1] = 0
        odd = rng.random(len(rows)) < 0.05
        rows[odd] = rng.integers(0, 1 << bits, (int(odd.sum()), top_k))
    tail = rng.integers(0, 1 << bits, int(rng.integers(0, top_k)))
    flat = np.concatenate([rows.reshape(-1), tail])
    if rng.random() < 0.3:
        flat[-(flat.size // 3) :] = 0
    return flat


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built")
@pytest.mark.parametrize(("num_experts", "top_k"), [*SHAPES, (1000, 13), (160, 6), (512, 9), (2, 2)])
def test_native_equals_numpy_on_random_inputs(num_experts: int, top_k: int) -> None:
    rng = np.random.default_rng(num_experts * 31 + top_k)
    codec = SetCodec(num_experts, top_k)
    for dtype in ("int64", "uint16", "int32"):
        ids = _mixed_ids(rng, num_experts, top_k).astype(dtype)
        native = codec.encode(ids)
        assert native == encode_set_frame_numpy(ids, codec.params)
        with kernels.use("numpy"):
            assert codec.encode(ids) == native
            reference = codec.decode(native)
        np.testing.assert_array_equal(codec.decode(native), reference)
        np.testing.assert_array_equal(reference, as_sets(ids, num_experts, top_k))
        for out_dtype in ("uint8", "int16", "int64"):
            if (1 << codec.bits) - 1 <= np.iinfo(out_dtype).max:
                out = np.empty(ids.size, dtype=out_dtype)
                np.testing.assert_array_equal(codec.decode(native, out=out), reference)


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built")
def test_native_decodes_into_strided_out() -> None:
    codec = SetCodec(256, 8)
    rows = random_sets(np.random.default_rng(3), 50, 256, 8)
    out = np.zeros((50, 16), dtype=np.int32)[:, ::2]
    codec.decode(codec.encode(rows), out=out)
    np.testing.assert_array_equal(out, np.sort(rows, axis=1))


# -- forged frames (a valid CRC over bad contents) ----------------------------------------


def _forge(frame: bytes, at: int, value: bytes) -> bytes:
    """``frame`` with ``value`` written at byte ``at`` and its CRC-32C recomputed."""
    data = bytearray(frame)
    data[at : at + len(value)] = value
    data[28:32] = struct.pack("<I", google_crc32c.extend(google_crc32c.value(bytes(data[:28])), bytes(data[32:])))
    return bytes(data)


def _ones(frame: bytes, at: int, nbits: int) -> bytes:
    """``frame`` with stream bits ``[0, nbits)`` from byte ``at`` set, CRC-32C recomputed."""
    data = bytearray(frame)
    for bit in range(nbits):
        data[at + bit // 8] |= 1 << (bit % 8)
    return _forge(bytes(data), 0, b"")


@pytest.mark.parametrize("implementation", ["native", "numpy"])
@pytest.mark.parametrize(
    ("case", "match"),
    [("block", "out of range"), ("padding", "padding bits are set"), ("exceptions", "strictly increasing"),
     ("raw", "verbatim"), ("reserved", "reserved"), ("counts", "counts disagree"), ("version", "version 2"),
     ("blocks", "blocks of 8 rows")],
)
def test_forged_frames_are_refused_and_leave_out_untouched(implementation: str, case: str, match: str) -> None:
    if implementation == "native" and not NATIVE:
        pytest.skip("the C extension is not built")
    codec = SetCodec(100, 2)  # R = C(100, 2) + 1 = 4951: 3 digits per 37-bit block
    assert (codec.params.block_rows, codec.params.block_bits) == (3, 37)
    flat = np.array([1, 2, 3, 4, 5, 5, 7, 8, 0, 0, 99, 98, 10, 11, 12, 13, 14, 15, 16, 17, 6])
    frame = codec.encode(flat)  # 10 rows, one exception ([5, 5]): 9 digits, 111 bits in 14 bytes
    assert struct.unpack_from("<III", frame, 8) == (21, 10, 1)
    assert len(frame) == 32 + 14 + 4 + 3  # digits, one exception index, 3 verbatim ids of 7 bits
    bad = {
        "block": _ones(frame, 32, 37),
        "padding": _forge(frame, 45, bytes([frame[45] | 0x80])),
        "exceptions": _forge(frame, 46, struct.pack("<I", 10)),  # not below n_rows
        "raw": _forge(frame, len(frame) - 1, bytes([frame[-1] | 0x80])),
        "reserved": _forge(frame, 22, b"\x01\x00"),
        "counts": _forge(frame, 16, struct.pack("<I", 11)),
        "version": _forge(frame, 4, b"\x02"),
        "blocks": _forge(frame, 20, b"\x08"),
    }[case]
    out = np.full(flat.size, 7, dtype=np.int32)
    with kernels.use(implementation), pytest.raises(FormatError, match=match):
        codec.decode(bad, out=out)
    assert (out == 7).all()


def test_frame_of_another_codec_shape_is_refused() -> None:
    frame = SetCodec(256, 8).encode(np.arange(64) % 256)
    with pytest.raises(FormatError, match="num_experts=256"):
        SetCodec(128, 8).decode(frame)


def test_bound_frame_moved_is_a_checksum_error() -> None:
    codec = SetCodec(64, 6)
    frame = codec.encode(np.arange(60) % 64, tag=0x1234)
    with pytest.raises(ChecksumError, match="0x00001234"):
        codec.decode(frame, tag=0x1235)


@pytest.mark.parametrize("bad", [{"num_experts": 0}, {"num_experts": 1025}, {"top_k": 17}, {"top_k": 0},
                                 {"num_experts": 4, "top_k": 5}, {"num_experts": "64"}, {"top_k": 2.0}])
def test_bad_parameters_raise_codec_error(bad: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"num_experts": 64, "top_k": 4, **bad}
    with pytest.raises(CodecError):
        SetCodec(**kwargs)  # type: ignore[arg-type]


def test_registry_builds_it() -> None:
    codec = get_codec({"id": "r3store.set", "num_experts": 384, "top_k": 8})
    assert codec == SetCodec(384, 8)
    assert set_params(384, 8).block_rows == 1


# -- golden frames ----------------------------------------------------------------------


def _golden(num_experts: int, top_k: int, rows: int, seed: int, mixed: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = np.sort(random_sets(rng, rows, num_experts, top_k), axis=1).astype(np.int64)
    if mixed:  # a zero row, an exception row and a tail of two ids
        ids[1] = 0
        ids[2, :2] = ids[2, 0]
        ids = np.concatenate([ids.reshape(-1), [num_experts - 1, 0]])
    return as_sets(ids, num_experts, top_k)  # as decoded: the committed ids are canonical


GOLDEN = {
    "set-v3-e64-k6-routes": (64, 6, _golden(64, 6, 12, 1, False).reshape(3, 4, 6), 0),
    "set-v3-e256-k8-mixed": (256, 8, _golden(256, 8, 9, 2, True), 0x9E3779B9),
    "set-v3-e384-k8-routes": (384, 8, _golden(384, 8, 8, 3, False), 0),
    "set-v3-e1024-k16-mixed": (1024, 16, _golden(1024, 16, 5, 4, True), 0x02472BB0),
    "set-v3-e8-k2-mixed": (8, 2, _golden(8, 2, 20, 5, True), 0),
    "set-v3-e128-k8-empty": (128, 8, np.zeros(0, dtype=np.int64), 0),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_frames(name: str) -> None:
    num_experts, top_k, ids, tag = GOLDEN[name]
    ensure_golden(FIXTURES, name, SetCodec(num_experts, top_k), ids, tag=tag)
    check_golden(FIXTURES, name)
    with kernels.use("numpy"):
        check_golden(FIXTURES, name)


# -- batch decode (SupportsBatchDecode) ---------------------------------------------------


def _set_frames(codec: SetCodec, rng: np.random.Generator, cr: int, lpc: int, layers: int,
                places: list[tuple[int, int]]) -> tuple[bytes, dict[str, np.ndarray], np.ndarray]:
    """Bound frames of random set rows (some zero, some exceptions) at ``places`` (row chunk,
    layer chunk), back to back; the arguments of decode_frames and the expected out."""
    k = codec.top_k
    blob, cols = b"", {c: [] for c in ("starts", "lengths", "rows", "layers", "row_chunks", "layer_chunks")}
    want = np.zeros(((max(r for r, _ in places) + 1) * cr, layers, k), np.int64)
    for f, (r, b) in enumerate(places):
        ids = random_sets(rng, cr * lpc, codec.num_experts, k).astype(np.int64)
        ids[rng.random(len(ids)) < 0.1] = 0
        ids[f % len(ids)] = [1] * k  # an exception row (an id repeated)
        if f % 2:
            ids[len(ids) // 2 :] = 0  # trailing zero rows, not stored
        frame = codec.encode(ids, tag=position_tag("w-1", r, b))
        for c, v in zip(cols, (len(blob), len(frame), r * cr, b * lpc, r, b), strict=True):
            cols[c].append(v)
        blob += frame
        want[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc] = as_sets(ids, codec.num_experts, k).reshape(cr, lpc, k)
    return blob, {c: np.array(v, np.int64) for c, v in cols.items()}, want


@pytest.mark.parametrize("implementation", ["native", "numpy"])
@pytest.mark.parametrize(("num_experts", "top_k", "cr", "lpc", "layers"),
                         [(64, 6, 16, 4, 8), (256, 8, 8, 2, 2), (1024, 16, 3, 1, 2), (8, 2, 5, 3, 3)])
def test_decode_frames_lands_each_frame_where_decode_would(implementation: str, num_experts: int, top_k: int,
                                                           cr: int, lpc: int, layers: int) -> None:
    """Straight into an int32 out whose layers are one chunk, through a stage otherwise;
    every output dtype holding the ids; places outside the frames untouched."""
    if implementation == "native" and not NATIVE:
        pytest.skip("the C extension is not built")
    codec = SetCodec(num_experts, top_k)
    places = [(r, b) for r in (2, 0, 3) for b in range(layers // lpc)]
    blob, cols, want = _set_frames(codec, np.random.default_rng(num_experts + lpc), cr, lpc, layers, places)
    touched = np.zeros(want.shape[:2], bool)
    for r, b in places:
        touched[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc] = True
    for dtype in ("int32", "uint16", "int16", "uint8", "uint32"):
        if np.iinfo(dtype).max < (1 << codec.bits) - 1:
            continue
        out = np.full(want.shape, 77, dtype)
        with kernels.use(implementation):
            got = codec.decode_frames(blob, out=out, chunk_rows=cr, layers_per_chunk=lpc, tag_prefix="w-1", **cols)
        assert got == -1
        np.testing.assert_array_equal(out[touched], want[touched])
        assert (out[~touched] == 77).all()


@pytest.mark.parametrize("implementation", ["native", "numpy"])
@pytest.mark.parametrize("fault", ["payload", "tag", "size", "shape"])
def test_decode_frames_stops_at_a_forged_frame(implementation: str, fault: str) -> None:
    """A frame with a valid CRC but a bad payload, another position's tag, another chunk size
    or another codec shape stops the batch at its index, out past it untouched."""
    if implementation == "native" and not NATIVE:
        pytest.skip("the C extension is not built")
    codec = SetCodec(100, 2)
    places = [(0, 0), (1, 0), (2, 0)]
    blob, cols, want = _set_frames(codec, np.random.default_rng(5), 4, 3, 3, places)
    start, size = int(cols["starts"][1]), int(cols["lengths"][1])
    frame = blob[start : start + size]
    if fault == "payload":
        bad = _ones(frame, 32, 37)  # the first block out of range
    elif fault == "tag":
        bad = codec.encode(want[4:8], tag=position_tag("w-1", 2, 0))
    elif fault == "size":
        bad = codec.encode(want[4:7], tag=position_tag("w-1", 1, 0))
    else:
        bad = SetCodec(100, 3).encode(want[4:8].reshape(-1), tag=position_tag("w-1", 1, 0))
    blob = blob[:start] + bad + b"\0" * max(0, size - len(bad))
    cols["lengths"][1] = len(bad)
    cols["starts"][2] = len(blob)
    blob += b"\0" * 8
    out = np.full(want.shape, 77, np.int32)
    with kernels.use(implementation):
        got = codec.decode_frames(blob, out=out, chunk_rows=4, layers_per_chunk=3, tag_prefix="w-1", **cols)
    assert got == 1
    np.testing.assert_array_equal(out[:4], want[:4])
    assert (out[4:] == 77).all()


@pytest.mark.parametrize("implementation", ["native", "numpy"])
@pytest.mark.parametrize(("num_experts", "top_k", "cr", "lpc", "layers"),
                         [(64, 6, 16, 4, 8), (256, 8, 24, 2, 2), (1024, 16, 3, 1, 2), (8, 2, 9, 3, 3), (5, 3, 7, 2, 2)])
def test_decode_frames_row_ranges_write_those_rows_of_the_chunk(implementation: str, num_experts: int, top_k: int,
                                                                cr: int, lpc: int, layers: int) -> None:
    """``row_first``/``row_count`` write rows ``[row_first, row_first + row_count)`` of each
    chunk to ``out[rows : rows + row_count]``, as the whole decode sliced: ranges starting
    inside a block of digits (8 x 2, 5 x 3: several rows per block), after exception rows,
    in the trailing zero rows, empty ones; every output dtype, places around them untouched."""
    if implementation == "native" and not NATIVE:
        pytest.skip("the C extension is not built")
    codec = SetCodec(num_experts, top_k)
    rng = np.random.default_rng(num_experts * 3 + cr)
    places = [(r, b) for r in (2, 0, 3) for b in range(layers // lpc)]
    blob, cols, want = _set_frames(codec, rng, cr, lpc, layers, places)
    n = len(places)
    for trial in range(6):
        first = rng.integers(0, cr, n)
        count = np.array([int(rng.integers(0, cr - f + 1)) for f in first], np.int64)
        if trial == 0:
            first[:], count[:] = 0, cr  # every row: the whole decode
        out_rows = cols["row_chunks"] * (cr + 1) + 1  # each range lands one row into its own band
        for dtype in ("int32", "uint16", "int16", "uint8", "uint32"):
            if np.iinfo(dtype).max < (1 << codec.bits) - 1:
                continue
            out = np.full((4 * (cr + 1), layers, top_k), 77, dtype)
            expect = out.copy()
            for f in range(n):
                r, b = int(cols["row_chunks"][f]), int(cols["layer_chunks"][f])
                src = want[r * cr + first[f] : r * cr + first[f] + count[f], b * lpc : (b + 1) * lpc]
                expect[out_rows[f] : out_rows[f] + count[f], b * lpc : (b + 1) * lpc] = src
            args = dict(cols, rows=out_rows)
            with kernels.use(implementation):
                got = codec.decode_frames(blob, out=out, chunk_rows=cr, layers_per_chunk=lpc, tag_prefix="w-1",
                                          row_first=first, row_count=count, **args)
            assert got == -1
            np.testing.assert_array_equal(out, expect, err_msg=f"{dtype} {first} {count}")


def test_decode_frames_row_ranges_outside_the_chunk_or_out_stop_the_batch() -> None:
    """A range past the chunk's rows, a negative one, or one whose rows overrun ``out`` stops
    the batch at that frame; only one of row_first/row_count is a CodecError."""
    codec = SetCodec(64, 6)
    blob, cols, want = _set_frames(codec, np.random.default_rng(9), 4, 2, 2, [(0, 0), (1, 0)])
    for first, count, row in ((3, 2, 0), (-1, 1, 0), (0, -1, 0), (0, 4, 7)):
        out = np.full((8, 2, 6), 77, np.int32)
        args = dict(cols, rows=np.array([0, row]))
        got = codec.decode_frames(blob, out=out, chunk_rows=4, layers_per_chunk=2, row_first=np.array([0, first]),
                                  row_count=np.array([4, count]), **args)
        assert got == 1
        np.testing.assert_array_equal(out[:4], want[:4])
        assert (out[4:] == 77).all()
    with pytest.raises(CodecError, match="together"):
        codec.decode_frames(blob, out=np.zeros((8, 2, 6), np.int32), chunk_rows=4, layers_per_chunk=2,
                            row_first=np.zeros(2, np.int64), **cols)


def test_decode_frames_refuses_bad_arguments() -> None:
    codec = SetCodec(64, 6)
    zeros = np.zeros(1, np.int64)
    args = {"starts": zeros, "lengths": zeros, "rows": zeros, "layers": zeros}
    with pytest.raises(CodecError, match="C-contiguous 3-D"):
        codec.decode_frames(b"", out=np.zeros((4, 2), np.int32), chunk_rows=1, layers_per_chunk=1, **args)
    with pytest.raises(CodecError, match="chunk_rows"):
        codec.decode_frames(b"", out=np.zeros((4, 2, 6), np.int32), chunk_rows=1, layers_per_chunk=3, **args)
    with pytest.raises(CodecError, match="C-contiguous 3-D"):
        codec.decode_frames(b"", out=np.zeros((4, 2, 6), np.int32), chunk_rows=1, layers_per_chunk=1,
                            tag_prefix="w-1", **args)


AVX2 = NATIVE and bool(kernels.native_module().cpu_features()["avx2"])  # type: ignore[union-attr]


@pytest.mark.skipif(not AVX2, reason="no AVX2 kernels here")
@pytest.mark.parametrize(("num_experts", "top_k"), [(64, 6), (64, 1), (33, 5), (128, 8), (256, 8), (200, 16),
                                                    (65, 2), (1, 1), (3, 2)])
def test_avx2_kernels_equal_the_portable_c(num_experts: int, top_k: int) -> None:
    """The AVX2/BMI2 bitmap classifier (E <= 256) and the portable C give the same frames and ids,
    on sets, zero rows, repeated ids, ids in [E, 2**bits) and tails."""
    rng = np.random.default_rng(num_experts * 7 + top_k)
    codec = SetCodec(num_experts, top_k)
    for dtype in ("int64", "uint16", "uint8"):
        ids = _mixed_ids(rng, num_experts, top_k)
        if dtype == "uint8" and ids.size and ids.max() > 255:
            continue
        ids = ids.astype(dtype)
        with kernels.use("native-avx2"):
            fast = codec.encode(ids)
            fast_ids = codec.decode(fast)
        with kernels.use("native"):
            assert codec.encode(ids) == fast
            np.testing.assert_array_equal(codec.decode(fast), fast_ids)
        np.testing.assert_array_equal(fast_ids, as_sets(ids, num_experts, top_k))


def test_readers_batch_decode_set_stores(tmp_path: Path) -> None:
    """SetCodec has the batch ability, so readers decode a set store's fetched ranges in one
    call per range: get, get_runs-style slices and the whole store read back as sorted rows."""
    assert isinstance(SetCodec(64, 6), SupportsBatchDecode)
    spec = r3store.ModelSpec(num_layers=6, num_experts=64, top_k=6)
    rng = np.random.default_rng(9)
    samples = {f"s{i}": random_sets(rng, n * 6, 64, 6).reshape(n, 6, 6) for i, n in enumerate((300, 1, 129))}
    with r3store.RouteWriter(tmp_path, spec, {"codec": "set", "chunk_rows": 16, "writer_id": "w"}) as writer:
        for sid, routes in samples.items():
            writer.append(sid, routes)
    store = r3store.open_store(tmp_path)
    for sid, routes in samples.items():
        np.testing.assert_array_equal(store.get(sid), np.sort(routes, axis=-1))


@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_rank_local_runs_of_a_set_store_decode_partial_chunks_by_row_range(tmp_path: Path, dtype: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """``get_runs`` (a CP rank's pieces) of a set store: the runs' partial first and last
    chunks go to ``decode_frames`` with row ranges (SetCodec's signature has them) and land
    as the rows sorted, next to whole chunks, in int32 and uint8."""
    import functools

    spec = r3store.ModelSpec(num_layers=4, num_experts=64, top_k=6)
    rng = np.random.default_rng(11)
    samples = {f"s{i}": random_sets(rng, n * 4, 64, 6).reshape(n, 4, 6) for i, n in enumerate((100, 37))}
    with r3store.RouteWriter(tmp_path, spec, {"codec": "set", "chunk_rows": 16, "writer_id": "w"}) as writer:
        for sid, routes in samples.items():
            writer.append(sid, routes)
    seen: list[object] = []
    real = SetCodec.decode_frames

    @functools.wraps(real)
    def spy(self: SetCodec, *args: object, **kwargs: object) -> int:
        seen.append(kwargs.get("row_first"))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SetCodec, "decode_frames", spy)
    reader = r3store.open_store(tmp_path)
    runs = [("s0", 5, 27), ("s1", 3, 36), ("s0", 70, 99), ("s1", 17, 18)]
    out = np.full((sum(b - a for _, a, b in runs), 4, 6), 99, dtype)
    reader.get_runs(runs, out=out)
    want = np.concatenate([np.sort(samples[s], axis=-1)[a:b] for s, a, b in runs])
    np.testing.assert_array_equal(out, want)
    assert any(r is not None and len(r) for r in seen)  # type: ignore[arg-type]
