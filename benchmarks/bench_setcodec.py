"""Size and speed of ``r3store.set`` against ``r3store.bitpack``, zstd and the set bound; byte-aligned bitpack.

Run from the repository root (r3store installed, e.g. editable)::

    python benchmarks/bench_setcodec.py           # full sizes, median of 7
    python benchmarks/bench_setcodec.py --quick   # smaller traces, median of 3
    python benchmarks/bench_setcodec.py --json out.json

Everything runs on one thread in one process; each timing is the median of N runs of
CPU time of this thread (``time.thread_time``: on a shared machine, wall time mostly
measures the other processes); every ratio compares two figures of the same run. Nothing
here asserts on timings; the targets of issue 20 are printed next to each figure.

Tables:

1. **Size on uniform random sets** (E, k) in (64, 6), (128, 8), (256, 8), (384, 8):
   bits per id of one large frame and of frames of 512 rows (the writer's default 128 rows
   x 4 layers) and 2048 rows (``chunk_rows=512``), headers included, over the bound
   ``log2 C(E, k) / k``. Target <= 1.02x.
2. **Size on traces**: FLAME (the bundled real trace, 64 x top-6) and a DeepSeek-V3-shape
   trace (58 layers, 256 x top-8, :func:`r3store.testing.synthetic.synthetic_routes` with
   FLAME-like skew: per-layer expert entropy about 0.99 x log2 E, printed): SetCodec frames
   against zstd level 19 on the uint8 ids and on the bit-packed ids, whole trace in one
   buffer (zstd's best case), SetCodec in the writer's frames (headers included). Target
   set <= 0.80x zstd-19.
3. **Speed**: the same trace cut into the writer's frames (128 rows x the default layers
   per chunk: 4 for FLAME, 2 for the 58 layers of DeepSeek-V3), encoded and decoded to int32 by
   SetCodec, BitpackCodec and zstd level 1 (on uint8 ids; decode includes the widen to
   int32). Targets: set decode >= 0.3x bitpack decode, set encode >= 0.3x bitpack encode.
   ``set_encode_before``: the set encode without its AVX-512 kernel (the AVX2 one), same run.
   ``set_decode_gather``: the set decode with the AVX-512 gather decoder
   (``setcodec_gather_decode``, off by default), same frames, same run.
   Also the readers' path: all the frames decoded into one (rows, layers, k) int32 array by
   one ``decode_frames`` call (:class:`r3store.codecs.SupportsBatchDecode`) per codec.
4. **Byte-aligned bitpack**: BitpackCodec decode of one frame to int32 against the widen
   limit (``np.copyto(int32, uint8)``, the same ids) for 6, 7, 8, 9 bits (E 64..512), and
   to uint8 against ``memcpy`` at 8 bits. Targets >= 0.8x. ``before_*``: the same decode
   with the previous kernels (SSE4.2 CRC-32C, AVX2 unpack, plain stores) in the same run,
   where the CPU has the new ones. Then the **CRC-32C** alone at
   64 B, 1 KiB, 4 KiB, 64 KiB and 8 MiB on each code path the CPU has (``table``
   slicing-by-8, ``sse4.2`` three crc32 streams: the default before the folding paths,
   ``pclmul`` 4 x 128-bit folding, ``avx512`` 4 x 512-bit VPCLMULQDQ folding) against
   ``memcpy`` (``np.copyto``) of the same bytes; ns per call (Python call included) and
   ns per byte. Then the readers' path (**byte_aligned_store**): a DeepSeek-V3-shape array
   (58 MoE layers, E=256, top-8: 8 bits) in the writer's frames of 512 rows x the default
   layers per chunk, all decoded by one ``decode_frames`` call (tags checked) to uint8
   against ``memcpy`` of the same ids, and to int16/int32 against the widen. Target
   (uint8) >= 0.8x.
5. **Below the uniform bound?** (issue 20 item 4) Ideal code lengths on FLAME of set models
   fitted on the even sequences, measured on the odd ones (and vice versa): per-layer
   expert frequencies (a Bernoulli product over experts conditioned on k ids), and that
   plus the previous token's set in the same layer (an expert chosen by the previous
   token gets its own inclusion rate). Compared with the uniform bound and zstd-19.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numcodecs import Zstd

import r3store
from r3store._format import position_tag
from r3store.codecs import BitpackCodec, SetCodec, kernels
from r3store.data import load_flame
from r3store.testing.synthetic import synthetic_routes
from r3store.writer._commit import default_layers_per_chunk


def median_time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return sorted(times)[len(times) // 2]


def bound_bits(e: int, k: int) -> float:
    return math.log2(math.comb(e, k)) / k


def uniform_sets(rng: np.random.Generator, rows: int, e: int, k: int) -> np.ndarray:
    return np.argpartition(rng.random((rows, e)), k - 1, axis=1)[:, :k].astype(np.int32)


def frames_of(routes: np.ndarray, chunk_rows: int, lpc: int) -> list[np.ndarray]:
    """The writer's inner chunks of a (rows, layers, k) trace (C-contiguous uint16, zero-padded)."""
    rows, layers, k = routes.shape
    out = []
    for r in range(0, rows, chunk_rows):
        for la in range(0, layers, lpc):
            block = np.zeros((chunk_rows, lpc, k), np.uint16)
            part = routes[r : r + chunk_rows, la : la + lpc]
            block[: part.shape[0], : part.shape[1]] = part
            out.append(block)
    return out


def table_uniform(rng: np.random.Generator, rows: int) -> list[dict[str, Any]]:
    out = []
    for e, k in ((64, 6), (128, 8), (256, 8), (384, 8)):
        sets = uniform_sets(rng, rows, e, k)
        codec = SetCodec(e, k)
        one = codec.encode(sets)
        framed = sum(len(codec.encode(sets[i : i + 512])) for i in range(0, rows, 512))
        framed_2k = sum(len(codec.encode(sets[i : i + 2048])) for i in range(0, rows, 2048))
        ids = rows * k
        bound = bound_bits(e, k)
        out.append({"experts": e, "top_k": k, "bound_bits_per_id": round(bound, 4),
                    "one_frame_bits_per_id": round(len(one) * 8 / ids, 4),
                    "one_frame_vs_bound": round(len(one) * 8 / ids / bound, 4),
                    "frames_512_rows_bits_per_id": round(framed * 8 / ids, 4),
                    "frames_vs_bound": round(framed * 8 / ids / bound, 4),
                    "frames_2048_rows_bits_per_id": round(framed_2k * 8 / ids, 4),
                    "frames_2048_vs_bound": round(framed_2k * 8 / ids / bound, 4),
                    "bitpack_bits_per_id": (e - 1).bit_length()})
    return out


def deepseek_trace(tokens: int) -> np.ndarray:
    return synthetic_routes(num_tokens=tokens + 1, num_layers=58, num_experts=256, top_k=8, seed=7, skew=1.35,
                            layer_correlation=0.2, token_repeat=2.0).astype(np.int32)


def layer_entropy(routes: np.ndarray, e: int) -> float:
    """Mean over layers of the entropy (bits) of the expert-id distribution."""
    out = []
    for layer in range(routes.shape[1]):
        counts = np.bincount(routes[:, layer].reshape(-1), minlength=e).astype(float)
        p = counts[counts > 0] / counts.sum()
        out.append(float(-(p * np.log2(p)).sum()))
    return float(np.mean(out))


def table_traces(traces: dict[str, tuple[np.ndarray, int, int]]) -> list[dict[str, Any]]:
    out = []
    z19 = Zstd(level=19)
    for name, (routes, e, lpc) in traces.items():
        k = routes.shape[2]
        ids = routes.size
        codec = SetCodec(e, k)
        frames = frames_of(routes, 128, lpc)
        set_bytes = sum(len(codec.encode(f)) for f in frames)
        bits = (e - 1).bit_length()
        packed = BitpackCodec(bits).encode(routes)
        u8 = routes.astype(np.uint8) if e <= 256 else routes.astype(np.uint16)
        zu8 = len(z19.encode(u8.tobytes()))
        zpacked = len(z19.encode(packed))
        best = min(zu8, zpacked)
        out.append({"trace": name, "shape": list(routes.shape), "experts": e,
                    "layer_entropy_bits": round(layer_entropy(routes, e), 4), "log2_experts": math.log2(e),
                    "bound_bits_per_id": round(bound_bits(e, k), 4),
                    "set_bits_per_id": round(set_bytes * 8 / ids, 4),
                    "zstd19_uint8_bits_per_id": round(zu8 * 8 / ids, 4),
                    "zstd19_packed_bits_per_id": round(zpacked * 8 / ids, 4),
                    "set_vs_zstd19_best": round(set_bytes / best, 4)})
    return out


def table_speed(traces: dict[str, tuple[np.ndarray, int, int]], reps: int) -> list[dict[str, Any]]:
    return [_speed_row(name, routes, e, lpc, reps) for name, (routes, e, lpc) in traces.items()]


def _speed_row(name: str, routes: np.ndarray, e: int, lpc: int, reps: int) -> dict[str, Any]:
    z1 = Zstd(level=1)
    k = routes.shape[2]
    frames = frames_of(routes, 128, lpc)
    n = sum(f.size for f in frames)
    set_codec, bp = SetCodec(e, k), BitpackCodec((e - 1).bit_length(), 2)
    set_frames = [set_codec.encode(f) for f in frames]
    bp_frames = [bp.encode(f) for f in frames]
    u8_frames = [f.astype(np.uint8).tobytes() for f in frames] if e <= 256 else None
    z_frames = [z1.encode(b) for b in u8_frames] if u8_frames else None
    out32 = np.empty(frames[0].size, np.int32)

    def set_dec() -> None:
        for f in set_frames:
            set_codec.decode(f, out=out32)

    def bp_dec() -> None:
        for f in bp_frames:
            bp.decode(f, out=out32)

    def z_dec() -> None:
        for f in z_frames or ():
            np.copyto(out32, np.frombuffer(z1.decode(f), np.uint8), casting="unsafe")

    # the readers' path: every frame of the trace checked and decoded into its place in one
    # (rows, layers, k) int32 array by one decode_frames call (SupportsBatchDecode)
    rows, layers = routes.shape[0], routes.shape[1]
    grid = [(r, b) for r in range(0, rows, 128) for b in range(0, layers, lpc)]
    out3 = np.empty((-(-rows // 128) * 128, -(-layers // lpc) * lpc, k), np.int32)

    places = np.array(grid, np.int64).T

    def batch(codec: SetCodec | BitpackCodec, blobs: list[bytes]) -> Callable[[], int]:
        blob = b"".join(blobs)
        sizes = np.array([len(b) for b in blobs], np.int64)
        starts = np.cumsum(sizes) - sizes
        return lambda: codec.decode_frames(blob, starts, sizes, out3, places[0], places[1], chunk_rows=128,
                                           layers_per_chunk=lpc)

    t = {"set_encode": median_time(lambda: [set_codec.encode(f) for f in frames], reps),
         "set_decode": median_time(set_dec, reps),
         "bitpack_encode": median_time(lambda: [bp.encode(f) for f in frames], reps),
         "bitpack_decode": median_time(bp_dec, reps),
         "set_decode_frames": median_time(batch(set_codec, set_frames), reps),
         "bitpack_decode_frames": median_time(batch(bp, bp_frames), reps)}
    native = kernels.native_module()
    if native is not None and hasattr(native, "setcodec_avx512") and native.simd() == "avx2":
        # before: the AVX2 row-at-a-time encoder (E <= 256) or the portable one, same run
        try:
            prev = native.setcodec_avx512(False)
        except ValueError:
            prev = None
        else:
            try:
                t["set_encode_before"] = median_time(lambda: [set_codec.encode(f) for f in frames], reps)
            finally:
                native.setcodec_avx512(prev)
    if native is not None and hasattr(native, "setcodec_gather_decode") and native.simd() == "avx2":
        # the AVX-512 gather decoder (off by default), same frames, same run
        try:
            prev_gather = native.setcodec_gather_decode(True)
        except ValueError:
            prev_gather = None
        else:
            try:
                t["set_decode_gather"] = median_time(set_dec, reps)
            finally:
                native.setcodec_gather_decode(prev_gather)
    if u8_frames:
        t["zstd1_encode"] = median_time(lambda: [z1.encode(f.astype(np.uint8)) for f in frames], reps)
        t["zstd1_decode"] = median_time(z_dec, reps)
    row: dict[str, Any] = {"trace": name, "frames": len(frames), "ids": n}
    row.update({f"{key}_ns_per_id": round(v / n * 1e9, 3) for key, v in t.items()})
    row["set_decode_vs_bitpack"] = round(t["bitpack_decode"] / t["set_decode"], 4)
    row["set_encode_vs_bitpack"] = round(t["bitpack_encode"] / t["set_encode"], 4)
    row["set_decode_frames_vs_bitpack"] = round(t["bitpack_decode_frames"] / t["set_decode_frames"], 4)
    if "set_encode_before" in t:
        row["set_encode_before_vs_bitpack"] = round(t["bitpack_encode"] / t["set_encode_before"], 4)
    if "set_decode_gather" in t:
        row["set_decode_gather_vs_bitpack"] = round(t["bitpack_decode"] / t["set_decode_gather"], 4)
    if u8_frames:
        row["set_decode_vs_zstd1"] = round(t["zstd1_decode"] / t["set_decode"], 4)
        row["set_encode_vs_zstd1"] = round(t["zstd1_encode"] / t["set_encode"], 4)
    return row


def table_bytes(rng: np.random.Generator, n: int, reps: int) -> list[dict[str, Any]]:
    return [_bytes_row(rng, bits, n, reps) for bits in (6, 7, 8, 9, 16)]


def _bytes_row(rng: np.random.Generator, bits: int, n: int, reps: int) -> dict[str, Any]:
    ids = rng.integers(0, 1 << bits, n)
    narrow = ids.astype(np.uint8 if bits <= 8 else np.uint16)
    codec = BitpackCodec(bits, 2)
    frame = codec.encode(narrow)
    out32 = np.empty(n, np.int32)
    t_dec = median_time(lambda: codec.decode(frame, out=out32), reps)
    t_widen = median_time(lambda: np.copyto(out32, narrow, casting="unsafe"), reps)
    row: dict[str, Any] = {"bits": bits, "experts": 1 << bits, "decode_int32_ns_per_id": round(t_dec / n * 1e9, 4),
           "widen_ns_per_id": round(t_widen / n * 1e9, 4), "decode_vs_widen": round(t_widen / t_dec, 4)}
    same = np.empty(n, narrow.dtype)  # 8 bits to uint8, 16 to uint16: the decode is a copy
    byte_aligned = bits in (8, 16)
    if byte_aligned:
        t8 = median_time(lambda: codec.decode(frame, out=same), reps)
        tm = median_time(lambda: np.copyto(same, narrow), reps)
        data = np.frombuffer(frame, np.uint8)
        tc = median_time(lambda: kernels.check_frame(data, bits), reps)
        row.update({"decode_copy_ns_per_id": round(t8 / n * 1e9, 4), "memcpy_ns_per_id": round(tm / n * 1e9, 4),
                    "copy_vs_memcpy": round(tm / t8, 4), "crc_check_ns_per_id": round(tc / n * 1e9, 4)})
    native = kernels.native_module()
    if native is not None and hasattr(native, "set_fused") and native.simd() == "avx2":
        # unfused: this release's kernels with the CRC-32C pass first, then the unpack (the
        # previous commit); before: also the kernels of the release before (three crc32
        # streams, AVX2 unpack, plain stores); same run
        for name, crc_path, avx512, stream_min in (("unfused", None, None, None),
                                                   ("before", "sse4.2", False, 1 << 62)):
            saved = (native.set_fused("off"), crc_path and native.set_crc_path(crc_path),
                     avx512 is not None and native.set_avx512(avx512), stream_min and native.set_stream_min(stream_min))
            try:
                t_old = median_time(lambda: codec.decode(frame, out=out32), reps)
                row[f"{name}_decode_vs_widen"] = round(t_widen / t_old, 4)
                if byte_aligned:
                    t8_old = median_time(lambda: codec.decode(frame, out=same), reps)
                    row[f"{name}_copy_vs_memcpy"] = round(tm / t8_old, 4)
            finally:
                native.set_fused(saved[0])
                if crc_path:
                    native.set_crc_path(saved[1])
                if avx512 is not None:
                    native.set_avx512(saved[2])
                if stream_min:
                    native.set_stream_min(saved[3])
    return row


def table_store_frames(rng: np.random.Generator, rows: int, reps: int) -> list[dict[str, Any]]:
    """The readers' path at 8 bits: every frame of a DeepSeek-V3-shape array (58 MoE layers,
    E=256, top-8) in the writer's geometry (512-row chunks, the default layers per chunk)
    checked and decoded into one (rows, 58, 8) array by one ``decode_frames`` call, tags
    checked, against ``np.copyto`` of the same ids (a memcpy for uint8, the widen for int16
    and int32)."""
    spec = r3store.ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=list(range(3, 61)))
    cr, layers, k = 512, spec.num_moe_layers, spec.top_k
    lpc = default_layers_per_chunk(spec, cr, "bitpack")
    ids = rng.integers(0, 256, (rows, layers, k)).astype(np.uint8)
    codec = BitpackCodec(8, 2)
    prefix = "w-00001"
    grid = [(r, b) for r in range(rows // cr) for b in range(layers // lpc)]
    frames = [codec.encode(ids[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc], tag=position_tag(prefix, r, b))
              for r, b in grid]
    blob = b"".join(frames)
    sizes = np.array([len(f) for f in frames], np.int64)
    starts = np.cumsum(sizes) - sizes
    rc, lc = (np.ascontiguousarray(a) for a in np.array(grid, np.int64).T)
    out_rows, out_layers = rc * cr, lc * lpc
    out = []
    for dtype in (np.uint8, np.int16, np.int32):
        dest = np.empty(ids.shape, dtype)

        def dec(dest: np.ndarray = dest) -> int:
            return codec.decode_frames(blob, starts, sizes, dest, out_rows, out_layers, chunk_rows=cr,
                                       layers_per_chunk=lpc, tag_prefix=prefix, row_chunks=rc, layer_chunks=lc)

        assert dec() == -1
        assert np.array_equal(dest, ids)
        t = median_time(dec, reps)
        t_ref = median_time(lambda dest=dest: np.copyto(dest, ids, casting="unsafe"), reps)
        name = "memcpy" if dtype == np.uint8 else "widen"
        row = {"dtype": np.dtype(dtype).name, "shape": list(ids.shape), "frames": len(frames),
               "frame_ids": cr * lpc * k, "decode_frames_ns_per_id": round(t / ids.size * 1e9, 4),
               f"{name}_ns_per_id": round(t_ref / ids.size * 1e9, 4), f"vs_{name}": round(t_ref / t, 4)}
        native = kernels.native_module()
        if native is not None and hasattr(native, "set_stream_min"):
            # the same with non-temporal stores forced (by default only outputs of at least
            # one last-level cache stream: the reader's next pass finds smaller ones cached)
            saved = native.set_stream_min(0)
            try:
                row[f"streamed_vs_{name}"] = round(t_ref / median_time(dec, reps), 4)
            finally:
                native.set_stream_min(saved)
        out.append(row)
    return out


CRC_SIZES = (64, 1 << 10, 1 << 12, 1 << 16, 1 << 23)


def table_crc(rng: np.random.Generator, reps: int, sizes: tuple[int, ...] = CRC_SIZES) -> list[dict[str, Any]]:
    native = kernels.native_module()
    if native is None or not hasattr(native, "set_crc_path"):
        return [{"skipped": "no C extension with set_crc_path"}]
    paths = []
    for path in ("table", "sse4.2", "pclmul", "avx512"):
        try:
            native.set_crc_path(native.set_crc_path(path))
            paths.append(path)
        except ValueError:
            pass
    prev = native.crc_path()
    try:
        return [_crc_row(native, paths, rng.integers(0, 256, size, dtype=np.uint8), reps) for size in sizes]
    finally:
        native.set_crc_path(prev)


def _crc_row(native: Any, paths: list[str], data: np.ndarray, reps: int) -> dict[str, Any]:
    size, dst = data.size, np.empty_like(data)
    calls = max(1, (1 << 22) // size)  # about 4 MiB of bytes per timing

    def per_call(fn: Callable[[], object]) -> float:
        def loop() -> None:
            for _ in range(calls):
                fn()

        return median_time(loop, reps) / calls

    row: dict[str, Any] = {"bytes": size}
    t_copy = per_call(lambda: np.copyto(dst, data))
    for path in paths:
        native.set_crc_path(path)
        t = per_call(lambda: native.crc32c(data))
        row[f"{path}_ns"] = round(t * 1e9, 1)
        row[f"{path}_ns_per_byte"] = round(t / size * 1e9, 4)
    native.set_crc_path("best")
    best = native.crc_path()
    row.update({"memcpy_ns": round(t_copy * 1e9, 1), "memcpy_ns_per_byte": round(t_copy / size * 1e9, 4),
                "best": best, "memcpy_vs_best": round(t_copy * 1e9 / row[f"{best}_ns"], 2)})
    if "sse4.2" in paths:  # the default before the folding paths
        row["best_vs_sse42"] = round(row["sse4.2_ns"] / row[f"{best}_ns"], 2)
    return row


# -- item 4: models below the uniform bound ---------------------------------------------


def _log_k_subset_normaliser(logit: np.ndarray, k: int) -> np.ndarray:
    """log of sum over k-subsets S of prod_{e in S} w_e, w = exp(logit), per row (elementary
    symmetric polynomial e_k by the recurrence; rows are (n, E))."""
    n, e = logit.shape
    shift = logit.max(axis=1, keepdims=True)
    w = np.exp(logit - shift)
    es = np.zeros((n, k + 1))
    es[:, 0] = 1.0
    for j in range(e):
        es[:, 1:] = es[:, 1:] + w[:, j : j + 1] * es[:, :-1]
    return np.log(es[:, k]) + k * shift[:, 0]


def _set_bits(routes: np.ndarray, logit: np.ndarray) -> float:
    """Mean ideal code length (bits per row) of the sets ``routes`` (n, k) under the model
    P(S) = prod_{e in S} w_e / e_k(w) (a Bernoulli product conditioned on k ids)."""
    k = routes.shape[1]
    chosen = np.take_along_axis(logit, routes, axis=1).sum(axis=1)
    return float(np.mean((_log_k_subset_normaliser(logit, k) - chosen) / math.log(2)))


def table_models(flame: np.ndarray, e: int = 64) -> dict[str, Any]:
    seqs = flame.reshape(-1, 64, *flame.shape[1:])  # 32 sequences of 64 tokens
    halves = (seqs[0::2], seqs[1::2])
    k = flame.shape[2]
    results = {"uniform": [], "layer_frequency": [], "layer_frequency_and_previous_token": []}
    for fit, test in (halves, halves[::-1]):
        for layer in range(flame.shape[1]):
            f_rows = fit[:, :, layer].reshape(-1, k)
            t_rows = test[:, :, layer].reshape(-1, k)
            counts = np.bincount(f_rows.reshape(-1), minlength=e) + 0.5
            freq = np.log(counts / counts.sum())
            results["uniform"].append(_set_bits(t_rows, np.zeros((len(t_rows), e))))
            results["layer_frequency"].append(_set_bits(t_rows, np.broadcast_to(freq, (len(t_rows), e))))
            # previous token's set in the same layer (within a sequence): one extra log-odds boost
            prev_fit = np.zeros((fit.shape[0], fit.shape[1], e), bool)
            np.put_along_axis(prev_fit[:, 1:], fit[:, :-1, layer], True, axis=2)
            cur_fit = np.zeros_like(prev_fit)
            np.put_along_axis(cur_fit, fit[:, :, layer], True, axis=2)
            stay = (cur_fit & prev_fit).sum() / max(prev_fit.sum(), 1)
            base = k / e
            boost = math.log(max(stay, 1e-6) / (1 - max(stay, 1e-6))) - math.log(base / (1 - base))
            prev_test = np.zeros((test.shape[0], test.shape[1], e), bool)
            np.put_along_axis(prev_test[:, 1:], test[:, :-1, layer], True, axis=2)
            logit = freq[None, :] + boost * prev_test.reshape(-1, e)
            results["layer_frequency_and_previous_token"].append(_set_bits(t_rows, logit))
    bound = math.log2(math.comb(e, k))
    out: dict[str, Any] = {"uniform_bound_bits_per_id": round(bound / k, 4)}
    for name, values in results.items():
        bits = float(np.mean(values)) / k
        out[f"{name}_bits_per_id"] = round(bits, 4)
        out[f"{name}_vs_bound"] = round(bits * k / bound, 4)
    out["zstd19_packed_bits_per_id"] = round(len(Zstd(level=19).encode(BitpackCodec(6).encode(flame))) * 8
                                             / flame.size, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller traces, median of 3")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else 7
    rng = np.random.default_rng(0)
    flame = load_flame()[0].astype(np.int32)
    deepseek = deepseek_trace(1024 if args.quick else 4096)
    lpc = default_layers_per_chunk(r3store.ModelSpec(num_layers=61, num_experts=256, top_k=8,
                                                    moe_layers=list(range(3, 61))), 128, "set")
    traces = {"flame": (flame, 64, 4), "deepseek-v3-shape": (deepseek, 256, lpc)}
    results: dict[str, Any] = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "kernels": kernels.IMPLEMENTATION},
        "uniform_sets": table_uniform(rng, 20_000 if args.quick else 100_000),
        "trace_sizes": table_traces(traces),
        "speed": table_speed(traces, reps),
        "byte_aligned": table_bytes(rng, 1 << 20 if args.quick else 1 << 23, reps),
        "byte_aligned_store": table_store_frames(rng, 2048 if args.quick else 16384, reps),
        "crc32c": table_crc(rng, reps),
        "below_the_bound": table_models(flame),
    }
    for name, rows in results.items():
        print(f"\n== {name}")
        for row in rows if isinstance(rows, list) else [rows]:
            print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
