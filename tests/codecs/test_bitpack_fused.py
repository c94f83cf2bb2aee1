"""``BitpackCodec.decode`` with the payload decoded while its CRC-32C is computed (issue 20:
uint8 at 8 bits at memory speed): every fused path (the extension's ``set_fused``: the
AVX-512 copy/widen on the CRC folding's loads, CRC-then-unpack blocks, and the check-first
decode before fusion), with plain and non-temporal stores, gives the numpy reference's ids
on frames of every size to 4 KiB and random larger ones, at every alignment; and fails
alike: header and size faults leave ``out`` untouched, a CRC-32C or position-tag fault
leaves every element the missing marker (all bits set), with the same error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from r3store._format import position_tag
from r3store.codecs import BitpackCodec, kernels
from r3store.errors import ChecksumError, FormatError

NATIVE = kernels.native_module()
pytestmark = pytest.mark.skipif(NATIVE is None or not hasattr(NATIVE, "set_fused"), reason="no compiled kernels")


def _modes() -> list[str]:
    if NATIVE is None:
        return []
    cpu = NATIVE.cpu_features()
    fast = cpu.get("avx512bw") and cpu.get("vpclmulqdq")
    return [*(["avx512"] if fast else []), "blocks", "off"]


@contextmanager
def _mode(mode: str, stream: bool) -> Iterator[None]:
    assert NATIVE is not None
    prev = NATIVE.set_fused(mode)
    prev_min = NATIVE.set_stream_min(0 if stream else 1 << 62)
    try:
        yield
    finally:
        NATIVE.set_fused(prev)
        NATIVE.set_stream_min(prev_min)


def _dtypes(bits: int) -> list[np.dtype]:
    names = ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int64")
    return [np.dtype(d) for d in names if np.iinfo(d).max >= (1 << bits) - 1]


def _shifted(frame: bytes, shift: int) -> memoryview:
    """The frame's bytes starting ``shift`` bytes past an aligned buffer's start."""
    return memoryview(bytearray(shift) + frame)[shift:]


def _out(n: int, dtype: np.dtype, offset: int) -> np.ndarray:
    """n elements starting ``offset`` elements into a fresh array (every alignment of out)."""
    return np.full(n + offset, 5, dtype)[offset:]


def test_the_modes_switch_and_report() -> None:
    assert NATIVE is not None
    prev = NATIVE.set_fused("off")
    try:
        assert NATIVE.set_fused("blocks") == "off"
        assert NATIVE.set_fused("best") == "blocks"
        with pytest.raises(ValueError, match="mode must be"):
            NATIVE.set_fused("fast")
    finally:
        NATIVE.set_fused(prev)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [8, 16])
def test_byte_aligned_frames_of_every_size_to_4_kib(mode: str, stream: bool, bits: int) -> None:
    rng = np.random.default_rng(bits)
    codec = BitpackCodec(bits, 2)
    dtypes = _dtypes(bits)
    with _mode(mode, stream):
        for n in range(4096 * 8 // bits + 1):
            ids = rng.integers(0, 1 << bits, n)
            frame = codec.encode(ids, tag=n + 1)
            dtype = dtypes[n % len(dtypes)]
            out = _out(n, dtype, n % 17)
            codec.decode(_shifted(frame, n % 64), out=out, tag=n + 1)
            np.testing.assert_array_equal(out, ids.astype(dtype), err_msg=f"{n} ids into {dtype}")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [1, 5, 7, 8, 9, 13, 16])
def test_random_frames_at_every_alignment_equal_the_reference(mode: str, stream: bool, bits: int) -> None:
    rng = np.random.default_rng(100 + bits)
    codec = BitpackCodec(bits, 1)
    sizes = [int(s) for s in rng.integers(0, 70_000, 6)] + [300_001 * 8 // bits]  # the last: > 256 KiB
    for i, n in enumerate(sizes):
        ids = rng.integers(0, 1 << bits, n)
        if i % 3 == 1 and n:
            ids[-(n // 5) :] = 0  # a trimmed zero tail
        frame = codec.encode(ids)
        with kernels.use("numpy"):
            want = codec.decode(frame)
        for dtype in _dtypes(bits):
            for shift in (0, 3):
                out = _out(n, dtype, (i + shift) % 5)
                with _mode(mode, stream):
                    assert codec.decode(_shifted(frame, shift + i), out=out) is out
                np.testing.assert_array_equal(out, want.astype(dtype), err_msg=f"{n} ids into {dtype}")
        with _mode(mode, stream):
            np.testing.assert_array_equal(codec.decode(frame), want)  # allocated int32


def _marker(dtype: np.dtype) -> np.ndarray:
    return np.array(-1).astype(dtype)


def _failure(codec: BitpackCodec, frame: bytes, out: np.ndarray, tag: int | None) -> tuple[type, str]:
    with pytest.raises(FormatError) as err:
        codec.decode(frame, out=out, tag=tag)
    return err.type, str(err.value)


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [7, 8, 16])
def test_a_payload_or_tag_fault_leaves_all_marker_and_a_header_fault_nothing(mode: str, bits: int) -> None:
    """Every byte of a frame flipped (payload and CRC: all marker; header fields: untouched
    or all marker as the CRC or the size check finds it first), truncations and a wrong out
    size (untouched), a wrong tag (all marker): the same error and the same ``out`` on every
path as with the unfused read order (``"off"``)."""
    codec = BitpackCodec(bits, 2)
    rng = np.random.default_rng(bits)
    n = 700  # more than one 256-byte step of the AVX-512 path at 8 bits
    ids = rng.integers(0, 1 << bits, n)
    frame = codec.encode(ids, tag=0xABCD)
    cases: list[tuple[bytes, int | None, str]] = []
    for pos in range(len(frame)):
        for mask in (0x01, 0x80):
            flipped = bytearray(frame)
            flipped[pos] ^= mask
            # header bytes (magic, version, bits, reserved, sizes) are checked first; the
            # tag (16..20), the CRC field (20..24) and the payload only by the CRC-32C (but
            # the padding bits of the last byte, checked first too)
            padding = pos == len(frame) - 1 and n * bits % 8
            kind = "marker" if pos >= 16 and not padding else "either"
            cases.append((bytes(flipped), 0xABCD, kind))
    cases += [(frame[:size], 0xABCD, "untouched") for size in range(0, len(frame), 37)]
    cases += [(frame + b"\x00", 0xABCD, "untouched"), (frame, 0xABCE, "marker"), (frame, 0, "marker")]
    for dtype in (np.dtype("uint8"), np.dtype("int16"), np.dtype("int32")):
        if np.iinfo(dtype).max < (1 << bits) - 1:
            continue
        for bad, tag, kind in cases:
            outs: dict[str, np.ndarray] = {}
            errors: dict[str, tuple[type, str]] = {}
            for m in ("off", mode):
                with _mode(m, False):
                    outs[m] = np.full(n, 7, dtype)
                    errors[m] = _failure(codec, bad, outs[m], tag)
            assert errors[mode] == errors["off"]
            np.testing.assert_array_equal(outs[mode], outs["off"])  # fails alike
            got = outs[mode]
            untouched, marker = bool((got == 7).all()), bool((got == _marker(dtype)).all())
            assert {"marker": marker, "untouched": untouched, "either": marker or untouched}[kind], (kind, got[:4])
            if kind == "marker":
                assert errors[mode][0] is ChecksumError
        for size in (n - 1, n + 1):
            out = np.full(size, 7, dtype)
            with _mode(mode, False), pytest.raises(FormatError, match="out holds"):
                codec.decode(frame, out=out)
            assert (out == 7).all()


@pytest.mark.parametrize("mode", _modes())
def test_a_fault_in_a_large_frame_leaves_all_marker(mode: str) -> None:
    """Streamed outputs and frames decoded in many blocks too."""
    rng = np.random.default_rng(9)
    for bits, n in ((8, 1 << 20), (7, 400_000), (16, 300_000)):
        codec = BitpackCodec(bits, 1)
        frame = bytearray(codec.encode(rng.integers(0, 1 << bits, n)))
        frame[len(frame) // 2] ^= 0x40
        for stream in (False, True):
            out = np.zeros(n, np.int32)
            with _mode(mode, stream), pytest.raises(ChecksumError, match="CRC-32C mismatch"):
                codec.decode(bytes(frame), out=out)
            assert (out == -1).all()


@pytest.mark.parametrize("mode", _modes())
def test_every_mode_under_the_portable_kernels(mode: str) -> None:
    """set_simd("scalar") (the table CRC, no AVX2): the AVX-512 mode falls back to blocks."""
    assert NATIVE is not None
    rng = np.random.default_rng(4)
    prev = NATIVE.set_simd("scalar")
    try:
        for bits in (6, 8, 16):
            codec = BitpackCodec(bits, 2)
            for n in (0, 9, 300, 20_000):
                ids = rng.integers(0, 1 << bits, n)
                frame = codec.encode(ids, tag=3)
                out = np.empty(n, np.uint16)
                with _mode(mode, True):
                    codec.decode(frame, out=out, tag=3)
                    np.testing.assert_array_equal(out, ids)
                    if n:
                        bad = bytearray(frame)
                        bad[-1] ^= 0x01
                        with pytest.raises(ChecksumError):
                            codec.decode(bytes(bad), out=out, tag=3)
                        assert (out == 0xFFFF).all()
    finally:
        NATIVE.set_simd(prev)


def _run_of_frames(bits: int, row_chunks: int, cr: int, layers: int, top_k: int, rng: np.random.Generator) -> tuple[
        bytes, dict[str, np.ndarray], np.ndarray]:
    """Frames of whole rows (layers_per_chunk == layers: each chunk's place is one run of out),
    the third trimmed (a zero tail)."""
    codec = BitpackCodec(bits, 2)
    want = rng.integers(0, 1 << bits, (row_chunks * cr, layers, top_k))
    want[3 * cr - 2 :] = 0
    frames = [codec.encode(want[r * cr : (r + 1) * cr], tag=position_tag("c-2", r, 0)) for r in range(row_chunks)]
    sizes = np.array([len(f) for f in frames], np.int64)
    rows = np.arange(row_chunks, dtype=np.int64)
    cols = {"starts": np.cumsum(sizes) - sizes, "lengths": sizes, "rows": rows * cr, "layers": rows * 0,
            "row_chunks": rows, "layer_chunks": rows * 0}
    return b"".join(frames), cols, want


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [7, 8, 16])
def test_decode_frames_fuses_chunks_that_are_runs_of_out(mode: str, bits: int) -> None:
    """decode_frames with layers_per_chunk covering every layer: the numpy reference's ids on
    every path; a CRC or tag fault leaves that frame's place all marker, the frames before it
    decoded and the later ones untouched; a header fault leaves its place untouched."""
    rng = np.random.default_rng(bits)
    cr, layers, top_k = 33, 3, 8
    blob, cols, want = _run_of_frames(bits, 5, cr, layers, top_k, rng)
    codec = BitpackCodec(bits, 2)

    def run(data: bytes, out: np.ndarray, prefix: str = "c-2") -> int:
        return codec.decode_frames(data, cols["starts"], cols["lengths"], out, cols["rows"], cols["layers"],
                                   chunk_rows=cr, layers_per_chunk=layers, tag_prefix=prefix,
                                   row_chunks=cols["row_chunks"], layer_chunks=cols["layer_chunks"])

    for dtype in [d for d in _dtypes(bits) if d.itemsize <= 4]:
        for stream in (False, True):
            out = np.full(want.shape, 5, dtype)
            with _mode(mode, stream):
                assert run(blob, out) == -1
            np.testing.assert_array_equal(out, want.astype(dtype))
        start = int(cols["starts"][2])
        for pos, kind in ((start + 30, "marker"), (start + 21, "marker"), (start + 9, "untouched")):
            bad = bytearray(blob)
            bad[pos] ^= 0x02  # payload, CRC field; n_total (a size: checked first)
            out = np.full(want.shape, 5, dtype)
            with _mode(mode, True):
                assert run(bytes(bad), out) == 2
            np.testing.assert_array_equal(out[: 2 * cr], want[: 2 * cr].astype(dtype))
            fill = _marker(dtype) if kind == "marker" else 5
            assert (out[2 * cr : 3 * cr] == fill).all(), kind
            assert (out[3 * cr :] == 5).all()
            with kernels.use("numpy"):  # the numpy twin leaves the same out
                twin = np.full(want.shape, 5, dtype)
                assert run(bytes(bad), twin) == 2
            np.testing.assert_array_equal(twin, out)
        out = np.full(want.shape, 5, dtype)
        with _mode(mode, False):
            assert run(blob, out, prefix="c-3") == 0  # bound to another commit
        assert (out[:cr] == _marker(dtype)).all()
        assert (out[cr:] == 5).all()


@pytest.mark.parametrize("layout", ["strided", "int64", "big-endian"])
def test_outputs_the_fused_decode_does_not_write_are_checked_first(layout: str) -> None:
    """Strided, 8-byte and byte-swapped outputs: decoded after the whole frame is checked,
    and untouched when a check fails."""
    codec = BitpackCodec(8, 2)
    ids = np.random.default_rng(5).integers(0, 256, 600)
    frame = codec.encode(ids, tag=4)
    bad = bytearray(frame)
    bad[-3] ^= 0x08

    def fresh() -> np.ndarray:
        if layout == "strided":
            return np.full(1200, 7, np.int32)[::2]
        return np.full(600, 7, np.int64 if layout == "int64" else np.dtype(">i4"))

    out = fresh()
    assert codec.decode(frame, out=out, tag=4) is out
    np.testing.assert_array_equal(out, ids)
    out = fresh()
    with pytest.raises(ChecksumError):
        codec.decode(bytes(bad), out=out, tag=4)
    assert (out == 7).all()
