"""The extension's CRC-32C on each of its code paths (slicing-by-8 table, three SSE4.2 crc32 streams,
PCLMULQDQ and VPCLMULQDQ/AVX-512 folding) is google_crc32c's and the table's."""

from __future__ import annotations

from types import ModuleType

import google_crc32c
import numpy as np
import pytest

from r3store.codecs import kernels


@pytest.mark.parametrize("simd", ["scalar", "avx2"])
def test_crc32c_of_every_length_across_the_stream_blocks(simd: str) -> None:
    native = kernels.native_module()
    if native is None:
        pytest.skip(f"no C extension: {kernels.NATIVE_UNAVAILABLE}")
    if simd == "avx2" and not native.cpu_features()["sse4.2"]:
        pytest.skip("no SSE4.2")
    data = np.random.default_rng(3).integers(0, 256, 6000, dtype=np.uint8).tobytes()
    prev = native.set_simd(simd) if simd == "scalar" or native.cpu_features()["avx2"] else None
    try:
        for n in [*range(40), *range(760, 780), 1535, 1536, 1537, 2303, 2304, 2305, 6000 - 5]:
            for offset in (0, 5):
                chunk = data[offset : offset + n]
                assert native.crc32c(chunk) == google_crc32c.value(chunk), (n, offset)
                assert native.crc32c(chunk, 0xDEADBEEF) == google_crc32c.extend(0xDEADBEEF, chunk), (n, offset)
    finally:
        if prev is not None:
            native.set_simd(prev)


# -- each CRC-32C code path (table, SSE4.2 streams, PCLMULQDQ and VPCLMULQDQ folding) ------

CRC_PATHS = ("table", "sse4.2", "pclmul", "avx512")


def _path_or_skip(path: str) -> ModuleType:
    native = kernels.native_module()
    if native is None:
        pytest.skip(f"no C extension: {kernels.NATIVE_UNAVAILABLE}")
    if not hasattr(native, "set_crc_path"):
        pytest.skip("the extension predates set_crc_path (rebuild it)")
    try:
        native.set_crc_path(native.set_crc_path(path))  # probe: ValueError when the CPU lacks it
    except ValueError as exc:
        pytest.skip(str(exc))
    return native


@pytest.mark.parametrize("path", CRC_PATHS)
def test_crc32c_check_value_on_every_path(path: str) -> None:
    native = _path_or_skip(path)
    prev = native.set_crc_path(path)
    try:
        assert native.crc_path() == path
        assert native.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720 B.4's polynomial)
        assert native.crc32c(b"") == 0
        assert native.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4: 32 bytes of zeros
        assert native.crc32c(bytes(range(32))) == 0x46DD794E  # RFC 3720 B.4: 32 ascending bytes
    finally:
        native.set_crc_path(prev)


@pytest.mark.parametrize("path", CRC_PATHS)
def test_crc32c_path_equals_the_table_on_all_lengths_and_alignments(path: str) -> None:
    """Every length to 1,100 (across the 128- and 256-byte folding minimums, the 64- and
    256-byte fold steps and the 16-byte lane tail) at several alignments, lengths around
    the 8 KiB start of the folding-plus-crc32-streams code and its 376-byte step, random
    lengths to 100K at random alignments, and 4K, 64K, 100K at each of the 64 alignments,
    each extending a random register: equal to the slicing-by-8 table and to google_crc32c."""
    native = _path_or_skip(path)
    rng = np.random.default_rng(20)
    data = rng.integers(0, 256, 100_064 + 64, dtype=np.uint8).tobytes()
    cases = [(n, off) for n in range(1100) for off in (0, 1, 7, 8, 15, 33, 63)]
    cases += [(n, int(off)) for n, off in zip(range(1100, 1200), rng.integers(0, 64, 100), strict=True)]
    lengths, offsets = rng.integers(0, 100_001, 300), rng.integers(0, 64, 300)
    cases += [(int(n), int(off)) for n, off in zip(lengths, offsets, strict=True)]
    cases += [(n, off) for n in (8191, 8192, 8193, 8192 + 375, 8192 + 376, 16384 + 7, 2 * 376 * 22) for off in (0, 13)]
    cases += [(n, off) for n in (4096, 65536, 100_000) for off in range(64)]
    seeds = rng.integers(0, 1 << 32, len(cases), dtype=np.uint64)
    prev = native.set_crc_path(path)
    try:
        got = [native.crc32c(data[off : off + n], int(s)) for (n, off), s in zip(cases, seeds, strict=True)]
    finally:
        native.set_crc_path(prev)
    native.set_crc_path("table")
    try:
        want = [native.crc32c(data[off : off + n], int(s)) for (n, off), s in zip(cases, seeds, strict=True)]
    finally:
        native.set_crc_path(prev)
    bad = [(case, hex(g), hex(w)) for case, g, w in zip(cases, got, want, strict=True) if g != w]
    assert not bad, bad[:5]
    for (n, off), s, g in zip(cases[::97], seeds[::97], got[::97], strict=True):
        assert g == google_crc32c.extend(int(s), data[off : off + n]), (n, off)


def test_crc32c_path_choice_and_errors() -> None:
    native = _path_or_skip("table")
    prev = native.crc_path()
    try:
        with pytest.raises(ValueError, match="CRC-32C path must be"):
            native.set_crc_path("fast")
        native.set_crc_path("best")
        assert native.crc_path() in CRC_PATHS
        assert native.crc_path() != "pclmul"  # never chosen by itself (slower than three crc32 streams here)
        cpu = native.cpu_features()
        if cpu["vpclmulqdq"] and cpu["avx512f"] and cpu["avx512bw"] and cpu["pclmulqdq"] and cpu["sse4.2"]:
            assert native.crc_path() == "avx512"
        if native.simd() == "avx2":
            native.set_simd("scalar")  # the portable code, the table CRC included
            assert native.crc_path() == "table"
            native.set_simd("avx2")
            assert native.crc_path() != "table"
    finally:
        native.set_crc_path(prev)


@pytest.mark.parametrize("path", CRC_PATHS)
def test_frame_crc_checked_on_every_path(path: str) -> None:
    """A BitpackCodec frame of 8-bit ids decodes on each path, and one flipped payload bit
    anywhere in it (head, middle, within the last lane, the last byte) is a ChecksumError."""
    from r3store.codecs import BitpackCodec
    from r3store.errors import ChecksumError

    native = _path_or_skip(path)
    ids = np.random.default_rng(4).integers(1, 256, 5000).astype(np.uint8)
    codec = BitpackCodec(8, 2)
    frame = bytearray(codec.encode(ids))
    prev = native.set_crc_path(path)
    try:
        assert np.array_equal(codec.decode(bytes(frame)), ids)
        for at in (24, 25, 2600, len(frame) - 9, len(frame) - 1):
            bad = bytearray(frame)
            bad[at] ^= 0x10
            with pytest.raises(ChecksumError):
                codec.decode(bytes(bad))
    finally:
        native.set_crc_path(prev)


def test_describe_names_the_crc_path_in_use() -> None:
    native = kernels.native_module()
    info = kernels.describe()
    if native is None or not hasattr(native, "crc_path"):
        assert info["crc32c"] == "google_crc32c"
        return
    assert info["crc32c"] == native.crc_path()
    with kernels.use("numpy"):
        assert kernels.describe()["crc32c"] == "google_crc32c"
    if native.simd() == "avx2":
        with kernels.use("native"):
            assert kernels.describe()["crc32c"] == "table"
