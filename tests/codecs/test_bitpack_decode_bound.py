"""Issue 22 item 4: public decoding of ``r3store.bitpack`` is bounded by its input.

``BitpackCodec.decode`` turned a 24-byte frame into a 256 MiB allocation (a header
declaring 2**26 - 1 ids, all of them zeros past an empty payload), and so did the zarr
entry point for a chunk shape that large. Now a frame may declare at most
``MAX_ZERO_TAIL_IDS`` zeros past its payload when decode allocates, so memory is at most
32 bytes per frame byte plus 1 MiB; larger zero tails decode only into a caller's ``out``.
"""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest

from r3store.codecs import BitpackCodec
from r3store.codecs._bitpack import MAX_ZERO_TAIL_IDS
from r3store.errors import FormatError


def _zero_frame(n_total: int, bits: int = 7) -> bytes:
    """A valid version-2 frame of ``n_total`` ids, all zero: 24 bytes (header only)."""
    head = struct.pack("<4sBBHIII", b"R3BP", 2, bits, 0, n_total, 0, 0)
    return head + struct.pack("<I", google_crc32c.value(head))


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()``'s result (or the exception it raised) and the peak bytes it allocated (numpy included)."""
    tracemalloc.start()
    try:
        try:
            result: Any = fn()
        except FormatError as exc:  # the caller checks it was raised
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_24_byte_frame_cannot_ask_for_256_mib() -> None:
    frame = _zero_frame((1 << 26) - 1)
    assert len(frame) == 24
    got, peak = _peak(lambda: BitpackCodec(7, frame_version=2).decode(frame))
    assert isinstance(got, FormatError), got
    assert "zeros past its payload" in str(got)
    assert peak < 1 << 20


def test_zero_tails_within_the_bound_still_decode() -> None:
    codec = BitpackCodec(7, frame_version=2)
    ids = np.zeros(MAX_ZERO_TAIL_IDS + 5, dtype=np.int32)
    ids[:5] = [1, 2, 3, 4, 5]
    frame = codec.encode(ids)
    assert len(frame) < 40
    np.testing.assert_array_equal(codec.decode(frame), ids)
    np.testing.assert_array_equal(codec.decode(_zero_frame(MAX_ZERO_TAIL_IDS)), np.zeros(MAX_ZERO_TAIL_IDS))


def test_a_larger_zero_tail_decodes_into_the_callers_out() -> None:
    out = np.ones(MAX_ZERO_TAIL_IDS * 2, dtype=np.int32)
    BitpackCodec(7, frame_version=2).decode(_zero_frame(out.size), out=out)
    assert not out.any()


def test_the_zarr_entry_point_is_bounded_too(tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr")
    from r3store.codecs._zarr import ZarrBitpackCodec

    n = (1 << 26) - 1
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(n,), chunks=(n,), dtype="int32", fill_value=0,
                            serializer=ZarrBitpackCodec(bits=7, frame_version=2), compressors=None)
    (tmp_path / "a.zarr" / "c").mkdir()
    (tmp_path / "a.zarr" / "c" / "0").write_bytes(_zero_frame(n))  # 24 bytes declaring 2**26 - 1 ids
    got, peak = _peak(lambda: arr[:1])
    assert isinstance(got, FormatError), got
    assert peak < 16 << 20


def test_the_zarr_entry_point_refuses_a_frame_of_another_chunk_size(tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr")
    from r3store.codecs._zarr import ZarrBitpackCodec

    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=(100,), chunks=(100,), dtype="int32", fill_value=0,
                            serializer=ZarrBitpackCodec(bits=7, frame_version=2), compressors=None)
    arr[:] = np.arange(100) % 128
    np.testing.assert_array_equal(arr[:], np.arange(100) % 128)
    (tmp_path / "a.zarr" / "c" / "0").write_bytes(_zero_frame(99))
    with pytest.raises(FormatError, match="out holds 100 ids, the frame 99"):
        arr[:]
