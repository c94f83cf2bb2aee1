"""decode_frames straight into an int32 out (rows byte-aligned): the same ids as the numpy twin."""

from __future__ import annotations

import numpy as np
import pytest

from r3store.codecs import BitpackCodec, kernels


@pytest.mark.parametrize("impl", ["native", "native-avx2"])
@pytest.mark.parametrize("bits", [1, 3, 7, 8, 9, 13, 16])
@pytest.mark.parametrize(("chunk_rows", "lpc", "top_k"), [(4, 2, 8), (1, 1, 8), (7, 3, 8), (5, 2, 4), (3, 1, 16)])
def test_rows_unpacked_in_place_match_the_twin(impl: str, bits: int, chunk_rows: int, lpc: int, top_k: int) -> None:
    native = kernels.native_module()
    if native is None:
        pytest.skip("no C extension")
    if impl == "native-avx2" and not native.cpu_features()["avx2"]:
        pytest.skip("no AVX2")
    rng = np.random.default_rng(bits * 100 + chunk_rows)
    layers, rows = 2 * lpc, 3 * chunk_rows
    routes = rng.integers(0, 1 << bits, (rows, layers, top_k))
    routes[-1, -1, -1] = 0  # the last frame's zero tail is trimmed: the staged path
    codec = BitpackCodec(bits, frame_version=2)
    frames, starts, cols = b"", [], []
    for c in range(3):
        for b in range(2):
            frame = codec.encode(routes[c * chunk_rows : (c + 1) * chunk_rows, b * lpc : (b + 1) * lpc])
            starts.append(len(frames))
            frames += frame
            cols.append((len(frame), c * chunk_rows, b * lpc))
    arrays = np.array(cols, dtype=np.int64).T
    args = (frames, np.array(starts, np.int64), arrays[0], bits)
    outs = []
    for name in (impl, "numpy"):
        with kernels.use(name):
            out = np.full((rows, layers, top_k), -7, np.int32)
            assert kernels.decode_frames(*args, out, arrays[1], arrays[2], chunk_rows=chunk_rows,
                                         layers_per_chunk=lpc) == -1
            outs.append(out)
    np.testing.assert_array_equal(outs[0], routes)
    np.testing.assert_array_equal(outs[1], routes)
