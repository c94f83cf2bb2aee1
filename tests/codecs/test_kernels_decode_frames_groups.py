"""``kernels.decode_frames`` decoding a row chunk's frames together (issue 21 item 7): the
frames that continue one another's output rows to the right (the layer chunks of a row
chunk, as a storage object holds them) are all checked, then unpacked a block of rows at a
time across the group, so the output fills row after row. Oracle: the numpy reference, one
frame at a time. A frame failing inside a group leaves it and every later frame unwritten,
the frames before it decoded, as before grouping."""

from __future__ import annotations

import numpy as np
import pytest

from r3store._format import position_tag
from r3store.codecs import BitpackCodec, kernels

IMPLS = ["numpy", *(["native"] if kernels.native_module() is not None else [])]
CR, LPC, TOP_K = 40, 2, 8  # 40 rows: more than one block of rows, and a partial one


def _object(bits: int, row_chunks: int, layers: int, trimmed: set[int], seed: int = 0) -> tuple[
        bytes, dict[str, np.ndarray], np.ndarray]:
    """Frames in (row chunk, layer chunk) order, back to back; ``trimmed``: frames whose last
    ids are 0 (n_encoded < n_total: decoded alone, outside any group)."""
    rng = np.random.default_rng(seed)
    codec = BitpackCodec(bits=bits, frame_version=2)
    blob, cols = b"", {k: [] for k in ("starts", "lengths", "rows", "layers", "rc", "lc")}
    want = np.zeros((row_chunks * CR, layers, TOP_K), np.int64)
    for f, (r, b) in enumerate((r, b) for r in range(row_chunks) for b in range(layers // LPC)):
        ids = rng.integers(0, 1 << bits, (CR, LPC, TOP_K))
        if f in trimmed:
            ids.reshape(-1)[-5:] = 0
        frame = codec.encode(ids.astype(np.int32), tag=position_tag("c-1", r, b))
        for k, v in zip(cols, (len(blob), len(frame), r * CR, b * LPC, r, b), strict=True):
            cols[k].append(v)
        blob += frame
        want[r * CR : (r + 1) * CR, b * LPC : (b + 1) * LPC] = ids
    return blob, {k: np.array(v, np.int64) for k, v in cols.items()}, want


def _decode(impl: str, blob: bytes, c: dict[str, np.ndarray], bits: int, out: np.ndarray, **ranges: np.ndarray) -> int:
    with kernels.use(impl):
        return kernels.decode_frames(blob, c["starts"], c["lengths"], bits, out, c["rows"], c["layers"],
                                     chunk_rows=CR, layers_per_chunk=LPC, tag_prefix="c-1", row_chunks=c["rc"],
                                     layer_chunks=c["lc"], **ranges)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bits", [1, 5, 7, 8, 12, 16])
@pytest.mark.parametrize("trimmed", [set(), {0}, {4}, {2, 3, 9}])
def test_grouped_frames_decode_as_one_by_one(impl: str, bits: int, trimmed: set[int]) -> None:
    blob, cols, want = _object(bits, 3, 10, trimmed, seed=bits)
    out = np.full(want.shape, -7, np.int32)
    assert _decode(impl, blob, cols, bits, out) == -1
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("impl", IMPLS)
def test_grouped_row_ranges_decode_in_place(impl: str) -> None:
    """A run's partial chunks (rows [r0, r0 + n) of each frame of a row chunk) to an output row."""
    blob, cols, want = _object(7, 2, 6, set())
    first = np.array([3] * 3 + [0] * 3, np.int64)
    count = np.array([37] * 3 + [21] * 3, np.int64)
    c = {**cols, "rows": np.array([0] * 3 + [37] * 3, np.int64)}
    out = np.full((58, 6, TOP_K), -7, np.int32)
    assert _decode(impl, blob, c, 7, out, row_first=first, row_count=count) == -1
    np.testing.assert_array_equal(out, want[3 : 3 + 58])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [0, 1, 4, 5, 7])
def test_a_bad_frame_in_a_group_stops_there(impl: str, bad: int) -> None:
    blob, cols, want = _object(7, 2, 10, set())
    broken = bytearray(blob)
    broken[int(cols["starts"][bad] + cols["lengths"][bad]) - 3] ^= 0x10  # a payload bit
    out = np.full(want.shape, -7, np.int32)
    assert _decode(impl, bytes(broken), cols, 7, out) == bad
    written = np.zeros(want.shape[:2], bool)
    for f in range(bad):
        r, b = int(cols["rc"][f]), int(cols["lc"][f])
        written[r * CR : (r + 1) * CR, b * LPC : (b + 1) * LPC] = True
    np.testing.assert_array_equal(out[written], want[written])
    assert (out[~written] == -7).all()
