"""``encode_frames`` over whole row blocks (``chunk_rows``) with position tags computed in C
(``prefix_crc``), and ``pack`` of row-strided arrays (a frame's layer chunk of a row block):
byte for byte what the frame-by-frame encode and the contiguous pack give."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

from r3store._format import position_tag
from r3store.codecs import BitpackCodec, kernels

native = kernels.native_module()
pytestmark = pytest.mark.skipif(native is None, reason="the C kernels are not built")


@pytest.mark.parametrize(("bits", "dtype"), [(7, np.uint16), (3, np.uint8), (12, np.int32), (16, np.uint16)])
@pytest.mark.parametrize("first_row_chunk", [0, 9, 123456])
def test_row_blocks_in_one_call_equal_frame_by_frame_encode(bits: int, dtype: type, first_row_chunk: int) -> None:
    rng = np.random.default_rng(bits)
    cr, lpc, layers, top_k, blocks = 8, 2, 6, 3, 4
    span = rng.integers(0, 1 << bits, (blocks * cr, layers, top_k)).astype(dtype)
    span[-3:] = 0  # a trimmed tail in the last row block's frames
    codec = BitpackCodec(bits, frame_version=2)
    ncol = layers // lpc
    out = np.empty(blocks * ncol * codec.frame_bound(cr * lpc * top_k), np.uint8)
    sizes = np.zeros(blocks * ncol, np.int64)
    prefix = google_crc32c.value(b"store/w-00003/")
    n = codec.encode_rows_into(span, cr, lpc, out, sizes, prefix_crc=prefix, first_row_chunk=first_row_chunk)
    want = [codec.encode(span[a * cr : (a + 1) * cr, b * lpc : (b + 1) * lpc],
                         tag=position_tag("store/w-00003", first_row_chunk + a, b))
            for a in range(blocks) for b in range(ncol)]
    assert n == sum(len(f) for f in want)
    assert sizes.tolist() == [len(f) for f in want]
    assert out[:n].tobytes() == b"".join(want)


def test_unbound_row_blocks_carry_the_given_tags() -> None:
    span = np.arange(4 * 5 * 2, dtype=np.uint16).reshape(4, 5, 2) % 32
    codec = BitpackCodec(5)
    out, sizes = np.empty(64 * 10, np.uint8), np.zeros(10, np.int64)
    n = codec.encode_rows_into(span, 2, 1, out, sizes)
    want = [codec.encode(span[a * 2 : a * 2 + 2, b : b + 1]) for a in range(2) for b in range(5)]
    assert out[:n].tobytes() == b"".join(want)


def test_an_id_out_of_range_is_reported_not_packed() -> None:
    span = np.zeros((4, 2, 2), np.uint16)
    span[3, 1, 0] = 32
    codec = BitpackCodec(5, frame_version=2)
    out, sizes = np.empty(256, np.uint8), np.zeros(4, np.int64)
    assert codec.encode_rows_into(span, 2, 1, out, sizes, prefix_crc=1) == -1


@pytest.mark.parametrize("case", ["rows not whole blocks", "sizes too short", "prefix on version 1", "out too small",
                                  "prefix not u32"])
def test_bad_arguments_raise(case: str) -> None:
    assert native is not None
    span, bits, version, prefix = np.zeros((6, 2, 2), np.uint16), 5, 2, 7
    out, sizes, cr = np.empty(1024, np.uint8), np.zeros(6, np.int64), 2
    if case == "rows not whole blocks":
        cr = 4
    elif case == "sizes too short":
        sizes = np.zeros(5, np.int64)
    elif case == "prefix on version 1":
        version = 1
    elif case == "out too small":
        out = np.empty(10, np.uint8)
    else:
        prefix = 1 << 32
    with pytest.raises(ValueError, match="encode_frames"):
        native.encode_frames(span, bits, version, 1, None, out, sizes, cr, prefix, 0)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize(("rows", "cols", "k"), [(128, 4, 8), (37, 3, 3), (9, 1, 5), (600, 2, 8)])
def test_pack_of_row_strided_ids_equals_the_contiguous_pack(dtype: type, rows: int, cols: int, k: int) -> None:
    assert native is not None
    rng = np.random.default_rng(rows)
    full = rng.integers(0, 1 << 7, (rows, 3 * cols, k)).astype(dtype)
    full[-2:] = 0  # trailing zeros: n_used stops before them
    view = full[:, cols : 2 * cols]  # rows contiguous in themselves, strided between
    assert not view.flags.c_contiguous
    got, want = np.zeros(view.size, np.uint8), np.zeros(view.size, np.uint8)
    assert native.pack(view, 7, got) == native.pack(np.ascontiguousarray(view), 7, want)
    assert got.tobytes() == want.tobytes()
    view[0, 0, 0] = 200  # beyond 7 bits: the OR says so
    assert native.pack(view, 7, got)[0] >> 7
