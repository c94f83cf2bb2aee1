"""The extension's CRC-32C (three interleaved hardware streams joined by a zero-shift table) is google_crc32c's."""

from __future__ import annotations

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
