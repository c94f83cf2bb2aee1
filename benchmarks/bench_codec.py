"""Size and speed of r3store's expert-id storage against the status quo and Blosc.

Run from the repository root (r3store installed, e.g. editable)::

    python benchmarks/bench_codec.py            # 32K-token synthetic trace, best of 5
    python benchmarks/bench_codec.py --quick    # 16K tokens, best of 2 (well under 30 s)
    python benchmarks/bench_codec.py --profile  # plus BitpackCodec stage timings

Two traces:

* ``flame``: the real FLAME-MoE-290M trace shipped in ``r3store/data/flame-moe-290m``
  (2048 tokens x 8 layers x top-6 of 64 experts, 6 bits per id);
* ``qwen3``: a synthetic Qwen3-30B-A3B-shaped trace (48 layers x top-8 of 128 experts,
  7 bits per id) from :func:`r3store.testing.synthetic.synthetic_routes`, with realistic
  load skew, adjacent-layer correlation and token repetition (as published for Mixtral, OLMoE,
  DeepSeek-V3 and FLAME-MoE);
* ``qwen3-next``: the same generator in the Qwen3-Next-80B-A3B shape (48 layers x top-10
  of 512 experts, 9 bits per id).

Methods, all starting from and ending with an int32 ``(rows, layers, top_k)`` array:

* ``r3store bitpack frames``: :class:`r3store.codecs.BitpackCodec` alone over writer-style
  frames of the writer's default geometry (128 rows x ``layers_per_chunk`` layers x top_k,
  from a uint16 buffer); decode places every frame back into an int32 array (in memory);
* ``r3store writer->get``: ``RouteWriter(tmp).append(); close()`` with the writer's default
  chunking, then ``open_store(tmp).get()`` (on disk; size = bytes of the route objects
  under ``routes/``);
* ``npy int32``: ``np.save``/``np.load`` to a ``BytesIO`` (memory) and to a file (disk),
  the status quo (Miles pickles int32 arrays);
* ``blosc zstd5 bitshuffle``: numcodecs ``Blosc(cname="zstd", clevel=5,
  shuffle=Blosc.BITSHUFFLE)`` on the ids cast to uint8 (experts <= 256) and to uint16
  (memory; the casts are timed).

Two more tables per trace compare the codec alone with Blosc, both single-threaded
(``numcodecs.blosc.set_nthreads(1)``), on the same ids cut into frames: first the writer's
default geometry (``chunk_rows = 128`` x ``layers_per_chunk`` = the largest divisor of the
MoE layer count up to 4, x top_k: what stores hold today, FORMAT.md section 4.1), then the
former 4096 rows x 1 layer x top_k; each frame a contiguous array of the narrowest dtype Blosc can
take (uint8 up to 256 experts, else uint16): encode to bytes, decode into a preallocated
array of that dtype (and into int32, what trainers take today). Timings there are medians.
Each also times one call on a 1-row, 1-layer frame (top_k ids): the fixed cost of a frame,
and its share of the whole trace's time (per-frame overhead).

Timings are best-of-N wall clock (``time.perf_counter``) of one full encode or decode of
the whole trace; throughput is ids per second. Ratios compare with the int32 ``.npy`` row
of the same medium (memory with BytesIO, disk with the file) measured in the same run.
Every method's decode is checked to equal the input. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
from numcodecs import Blosc
from rich.console import Console
from rich.table import Table

import r3store
from r3store.codecs import BitpackCodec, kernels, pack_bits, unpack_bits
from r3store.testing.synthetic import qwen3_30b_a3b_spec, routing_stats, synthetic_routes
from r3store.writer import WriterConfig

FLAME = "flame-moe-290m/flame_moe_290m_prefill_2048tok_8layers_top6.npz"
FRAME_ROWS = WriterConfig().chunk_rows  # the writer's default chunk_rows (128; FORMAT.md section 4.1)
OLD_FRAME_ROWS = 4096  # the former default (r3store 0.2), kept as a second row: 4096 rows x 1 layer per frame
QWEN3_NEXT = r3store.ModelSpec(num_layers=48, num_experts=512, top_k=10)  # Qwen3-Next-80B-A3B


@dataclass
class Trace:
    name: str
    routes: np.ndarray  # int32 (rows, layers, top_k)
    spec: r3store.ModelSpec
    note: str


@dataclass
class Result:
    trace: str
    method: str
    medium: str  # "memory" or "disk": which npy row the ratios use
    nbytes: int
    encode_s: float
    decode_s: float
    note: str = ""


def best_of(repeats: int, fn: Callable[[], Any], setup: Callable[[], Any] | None = None) -> tuple[float, Any]:
    """Best wall time of ``fn()`` over ``repeats`` runs (``setup()`` runs untimed before each)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        if setup is not None:
            setup()
        gc.collect()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


# -- traces ------------------------------------------------------------------------


def load_traces(tokens: int) -> list[Trace]:
    with files("r3store.data").joinpath(FLAME).open("rb") as f:
        flame = np.load(f)["expert_ids"].astype(np.int32)
    _, layers, top_k = flame.shape
    traces = [Trace("flame", flame, r3store.ModelSpec(num_layers=layers, num_experts=64, top_k=top_k),
                    "real FLAME-MoE-290M prefill, 64 experts")]
    spec = qwen3_30b_a3b_spec()
    t0 = time.perf_counter()
    qwen = synthetic_routes(num_tokens=tokens, num_layers=spec.num_moe_layers, num_experts=spec.num_experts,
                            top_k=spec.top_k, seed=0)
    gen_s = time.perf_counter() - t0
    traces.append(Trace("qwen3", qwen, spec, f"synthetic Qwen3-30B-A3B, 128 experts (generated in {gen_s:.2f} s)"))
    t0 = time.perf_counter()
    nxt = synthetic_routes(num_tokens=tokens, num_layers=QWEN3_NEXT.num_moe_layers,
                           num_experts=QWEN3_NEXT.num_experts, top_k=QWEN3_NEXT.top_k, seed=1)
    gen_s = time.perf_counter() - t0
    traces.append(Trace("qwen3-next", nxt, QWEN3_NEXT,
                        f"synthetic Qwen3-Next-80B-A3B, 512 experts, top-10 (generated in {gen_s:.2f} s)"))
    return traces


# -- methods -----------------------------------------------------------------------


def frame_layers(spec: r3store.ModelSpec) -> int:
    """The writer's default ``layers_per_chunk``: the largest divisor of ``n_moe`` up to 4 (FORMAT.md section 4)."""
    return max(d for d in range(1, 5) if spec.num_moe_layers % d == 0)


def frames_of(routes: np.ndarray, frame_rows: int, nlayers: int) -> list[tuple[slice, slice]]:
    """(rows, layers) slices of the frames a writer with this geometry cuts ``routes`` into."""
    rows, layers, _ = routes.shape
    return [(slice(r, min(rows, r + frame_rows)), slice(layer, min(layers, layer + nlayers)))
            for r in range(0, rows, frame_rows) for layer in range(0, layers, nlayers)]


def bench_bitpack_frames(trace: Trace, repeats: int) -> Result:
    routes, spec = trace.routes, trace.spec
    codec = BitpackCodec(spec.bits_per_id)
    nlayers = frame_layers(spec)
    cuts = frames_of(routes, FRAME_ROWS, nlayers)

    def encode() -> list[bytes]:
        buffer = routes.astype(np.uint16)  # the writer's uint16 buffer
        return [codec.encode(buffer[r, layer]) for r, layer in cuts]

    def decode(frames: list[bytes]) -> np.ndarray:
        out = np.empty(routes.shape, dtype=np.int32)
        for (r, layer), frame in zip(cuts, frames, strict=True):
            block = out[r, layer]
            out[r, layer] = codec.decode(frame).reshape(block.shape)
        return out

    enc_s, frames = best_of(repeats, encode)
    dec_s, back = best_of(repeats, lambda: decode(frames))
    check(trace, "bitpack frames", back)
    return Result(trace.name, f"r3store bitpack frames ({FRAME_ROWS} x {nlayers} x {spec.top_k})", "memory",
                  sum(map(len, frames)), enc_s, dec_s)


def bench_writer(trace: Trace, repeats: int, tmp: Path) -> Result:
    routes, spec = trace.routes, trace.spec
    where = tmp / "store"

    def fresh() -> None:
        shutil.rmtree(where, ignore_errors=True)

    def encode() -> None:
        with r3store.RouteWriter(where, spec) as writer:
            writer.append("s0", routes, num_tokens=len(routes) + 1)

    def decode() -> np.ndarray:
        with r3store.open_store(where) as store:
            return store.get("s0")

    enc_s, _ = best_of(repeats, encode, setup=fresh)
    dec_s, back = best_of(repeats, decode)
    check(trace, "writer->get", back)
    sizes = {p: p.stat().st_size for p in where.rglob("*") if p.is_file()}
    route_bytes = sum(n for p, n in sizes.items() if p.is_relative_to(where / "routes") and p.name != "zarr.json")
    chunks = "?"
    for meta in (where / "routes").glob("*/zarr.json"):
        doc = json.loads(meta.read_text())
        chunks = " x ".join(map(str, doc["codecs"][0]["configuration"]["chunk_shape"]))
    note = (f"r3store writer->get (RouteWriter defaults; inner chunks {chunks}): {route_bytes:,} bytes of "
            f"route objects; the whole store (manifest, zarr.json, Parquet sample table) is "
            f"{sum(sizes.values()):,} bytes")
    return Result(trace.name, "r3store writer->get", "disk", route_bytes, enc_s, dec_s, note)


def bench_npy_memory(trace: Trace, repeats: int) -> Result:
    routes = trace.routes

    def encode() -> bytes:
        buf = io.BytesIO()
        np.save(buf, routes)
        return buf.getvalue()

    enc_s, blob = best_of(repeats, encode)
    dec_s, back = best_of(repeats, lambda: np.load(io.BytesIO(blob)))
    check(trace, "npy BytesIO", back)
    return Result(trace.name, "npy int32 (BytesIO)", "memory", len(blob), enc_s, dec_s)


def bench_npy_file(trace: Trace, repeats: int, tmp: Path) -> Result:
    routes = trace.routes
    path = tmp / "routes.npy"
    enc_s, _ = best_of(repeats, lambda: np.save(path, routes), setup=lambda: path.unlink(missing_ok=True))
    dec_s, back = best_of(repeats, lambda: np.load(path))
    check(trace, "npy file", back)
    return Result(trace.name, "npy int32 (file)", "disk", path.stat().st_size, enc_s, dec_s)


def bench_blosc(trace: Trace, repeats: int, dtype: type[np.integer]) -> Result:
    routes = trace.routes
    codec = Blosc(cname="zstd", clevel=5, shuffle=Blosc.BITSHUFFLE)

    enc_s, blob = best_of(repeats, lambda: codec.encode(routes.astype(dtype)))
    dec_s, back = best_of(
        repeats, lambda: np.frombuffer(codec.decode(blob), dtype=dtype).reshape(routes.shape).astype(np.int32))
    check(trace, f"blosc {np.dtype(dtype).name}", back)
    return Result(trace.name, f"blosc zstd5 bitshuffle {np.dtype(dtype).name}", "memory", len(blob), enc_s, dec_s)


def check(trace: Trace, method: str, back: np.ndarray) -> None:
    if back.dtype != np.int32 or not np.array_equal(back, trace.routes):
        raise SystemExit(f"{trace.name}/{method}: round trip changed the ids")


# -- the codec against Blosc, single-threaded ------------------------------------------


def median_loop(repeats: int, fn: Callable[[], Any], min_s: float = 0.02) -> float:
    """Median over ``repeats`` of the time of one ``fn()``, each repeat looping for >= ``min_s``."""
    loops = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - t0 >= min_s:
            break
        loops *= 2
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        times.append((time.perf_counter() - t0) / loops)
    return float(np.median(times))


@dataclass
class CodecRow:
    method: str
    nbytes: int
    encode_s: float
    decode_s: float  # into the narrow dtype
    decode_int32_s: float
    frame_encode_s: float  # one call on a 1-row, 1-layer frame: the fixed cost of a frame
    frame_decode_s: float


def codec_vs_blosc(trace: Trace, repeats: int, frame_rows: int, nlayers: int) -> tuple[Table, list[CodecRow]]:
    """The codec alone vs Blosc (LZ4 and Zstd, bitshuffle, 1 thread) on frames of ``frame_rows x nlayers``."""
    routes, spec = trace.routes, trace.spec
    narrow = np.uint8 if spec.num_experts <= 256 else np.uint16
    chunks = [np.ascontiguousarray(routes[r, layer], dtype=narrow)
              for r, layer in frames_of(routes, frame_rows, nlayers)]
    tiny = np.ascontiguousarray(routes[:1, :1], dtype=narrow)  # top_k ids: what a frame costs beyond its ids
    tiny_out = np.empty_like(tiny)
    ids = sum(c.size for c in chunks)
    outs = [np.empty_like(c) for c in chunks]
    outs32 = [np.empty(c.shape, dtype=np.int32) for c in chunks]
    results: list[CodecRow] = []

    def measure(method: str, encode: Callable[[np.ndarray], bytes],
                decode_into: Callable[[bytes, np.ndarray], Any]) -> None:
        blobs = [encode(c) for c in chunks]
        for blob, out, out32, chunk in zip(blobs, outs, outs32, chunks, strict=True):
            decode_into(blob, out)
            decode_into(blob, out32)
            if not (np.array_equal(out, chunk) and np.array_equal(out32, chunk)):
                raise SystemExit(f"{trace.name}/{method}: round trip changed the ids")
        enc = median_loop(repeats, lambda: [encode(c) for c in chunks])
        dec = median_loop(repeats, lambda: [decode_into(b, o) for b, o in zip(blobs, outs, strict=True)])
        dec32 = median_loop(repeats, lambda: [decode_into(b, o) for b, o in zip(blobs, outs32, strict=True)])
        tiny_blob = encode(tiny)
        tiny_enc = median_loop(repeats, lambda: encode(tiny))
        tiny_dec = median_loop(repeats, lambda: decode_into(tiny_blob, tiny_out))
        results.append(CodecRow(method, sum(map(len, blobs)), enc, dec, dec32, tiny_enc, tiny_dec))

    codec = BitpackCodec(spec.bits_per_id)
    impls = [kernels.IMPLEMENTATION] if kernels.IMPLEMENTATION != "numpy" else []
    for impl in [*impls, "numpy"]:
        with kernels.use(impl):
            measure(f"r3store.bitpack ({impl})", codec.encode, lambda b, o: codec.decode(b, out=o))
    for cname in ("lz4", "zstd"):
        blosc = Blosc(cname=cname, clevel=5, shuffle=Blosc.BITSHUFFLE)

        def blosc_into(blob: bytes, out: np.ndarray, blosc: Blosc = blosc) -> None:
            if out.dtype == narrow:
                blosc.decode(blob, out=out)
            else:  # Blosc restores the bytes it was given: widening is a second pass
                np.copyto(out, np.frombuffer(blosc.decode(blob), dtype=narrow).reshape(out.shape))

        measure(f"blosc {cname} clevel=5 bitshuffle", blosc.encode, blosc_into)

    base = next(r for r in results if r.method.startswith("blosc lz4"))
    shape = " x ".join(map(str, chunks[0].shape))
    table = Table(title=f"{trace.name}: codec vs Blosc, 1 thread, {len(chunks):,} frames of {shape} = "
                        f"{chunks[0].size:,} {np.dtype(narrow).name} ids ({ids:,} ids; median of {repeats}; "
                        f"ratios vs blosc lz4)",
                  caption=f"fixed cost: one call on a {tiny.size}-id frame (per-frame overhead); "
                          f"% = that cost x {len(chunks):,} frames / the whole trace's time")
    for col in ("method", "bytes", "bits/id", "size vs lz4", "encode Mids/s", "decode Mids/s",
                "decode->int32 Mids/s", "encode vs lz4", "decode vs lz4", "fixed enc/dec us/frame (%)"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in results:
        n = len(chunks)
        fixed = (f"{r.frame_encode_s * 1e6:.2f} ({n * r.frame_encode_s / r.encode_s:.0%}) / "
                 f"{r.frame_decode_s * 1e6:.2f} ({n * r.frame_decode_s / r.decode_s:.0%})")
        table.add_row(r.method, f"{r.nbytes:,}", f"{8 * r.nbytes / ids:.3f}", f"{r.nbytes / base.nbytes:.1%}",
                      f"{ids / r.encode_s / 1e6:,.0f}", f"{ids / r.decode_s / 1e6:,.0f}",
                      f"{ids / r.decode_int32_s / 1e6:,.0f}", f"{base.encode_s / r.encode_s:.2f}x",
                      f"{base.decode_s / r.decode_s:.2f}x", fixed)
    return table, results


# -- stage profile -----------------------------------------------------------------


def profile_table(traces: list[Trace], repeats: int) -> Table:
    """Where BitpackCodec spends its time, stage by stage (public helpers re-run alone)."""
    qwen = next(t for t in traces if t.name == "qwen3")
    bits = qwen.spec.bits_per_id
    small = qwen.routes[:FRAME_ROWS].astype(np.uint16)
    block = qwen.routes[:OLD_FRAME_ROWS].astype(np.uint16)
    big = np.ascontiguousarray(qwen.routes.reshape(-1)[:6_000_000].astype(np.uint16))
    cases = [(f"{small[:, :4].size:,}-id frame ({FRAME_ROWS} x 4 x 8, default)", small[:, 4:8]),
             (f"{block[:, :1].size:,}-id frame ({OLD_FRAME_ROWS} x 1 x 8)", block[:, 5:6]),
             (f"{block[:, :4].size:,}-id frame ({OLD_FRAME_ROWS} x 4 x 8)", block[:, 4:8]),
             (f"{big.size:,}-id array", big)]
    table = Table(title=f"BitpackCodec stages, {bits} bits/id (best of {max(repeats, 5)}; ms per call and Mids/s)")
    table.add_column("stage")
    for name, _ in cases:
        table.add_column(name, justify="right")
    codec = BitpackCodec(bits)
    rows: dict[str, list[str]] = {}
    for _, ids in cases:
        n = ids.size
        loops = max(1, 2_000_000 // n)  # small frames: time a loop, as the writer runs them back to back
        for stage, fn in codec_stages(codec, ids, bits):
            t, _ = best_of(max(repeats, 5), lambda fn=fn, k=loops: [fn() for _ in range(k)])
            t /= loops
            rows.setdefault(stage, []).append(f"{t * 1e3:.3f} ms  {n / t / 1e6:,.0f}")
    for stage, cells in rows.items():
        table.add_row(stage, *cells)
    return table


def codec_stages(codec: BitpackCodec, ids: np.ndarray, bits: int) -> list[tuple[str, Callable[[], Any]]]:
    """(stage, call) pairs timing BitpackCodec's steps on ``ids``."""
    import google_crc32c

    flat = ids.reshape(-1)
    n = flat.size
    payload = pack_bits(flat, bits)
    raw = payload.tobytes()
    frame = codec.encode(ids)
    data = np.frombuffer(frame, dtype=np.uint8)
    unpacked = unpack_bits(data[20:], n, bits)
    return [
            ("encode: flatten (reshape(-1))", lambda: np.asarray(ids).reshape(-1)),
            ("encode: range check (min, max)", lambda: (int(flat.min()), int(flat.max()))),
            ("encode: trim (last non-zero id)", lambda: int((flat != 0)[::-1].argmax())),
            ("encode: pack_bits", lambda: pack_bits(flat, bits)),
            ("encode: payload.tobytes()", lambda: payload.tobytes()),
            ("encode: CRC-32C", lambda: google_crc32c.value(raw)),
            ("encode: TOTAL codec.encode", lambda: codec.encode(ids)),
            ("decode: CRC-32C", lambda: google_crc32c.value(raw)),
            ("decode: unpack_bits", lambda: unpack_bits(data[20:], n, bits)),
            ("decode: zeros + copy into out", lambda: np.zeros(n, np.int32).__setitem__(slice(None), unpacked)),
        ("decode: TOTAL codec.decode", lambda: codec.decode(frame)),
    ]


# -- report ------------------------------------------------------------------------


def environment(args: argparse.Namespace) -> Table:
    table = Table(title="environment", show_header=False)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    blosc_threads = numcodecs.blosc.get_nthreads() if hasattr(numcodecs.blosc, "get_nthreads") else "?"
    for key, value in [
        ("python", sys.version.split()[0]),
        ("numpy", np.__version__),
        ("numcodecs", f"{numcodecs.__version__} (blosc threads: {blosc_threads})"),
        ("r3store", r3store.__version__),
        ("cpu", f"{cpu}, os.cpu_count()={os.cpu_count()}, usable={usable}"),
        ("platform", platform.platform()),
        ("temp dir", tempfile.gettempdir()),
        ("repeats", f"best of {args.repeats} (codec vs Blosc: median of {args.repeats})"),
        ("r3store kernels", kernels.IMPLEMENTATION),
    ]:
        table.add_row(key, str(value))
    return table


def traces_table(traces: list[Trace]) -> Table:
    table = Table(title="traces")
    for col in ("trace", "shape (rows, layers, top_k)", "ids", "bits/id", "max/mean load", "1st-choice repeat / chance",
                "adjacent-layer MI (bits)", "source"):
        table.add_column(col)
    for t in traces:
        stats = routing_stats(t.routes, t.spec.num_experts)
        mi = stats.adjacent_mi_bits
        table.add_row(
            t.name, str(t.routes.shape), f"{t.routes.size:,}", str(t.spec.bits_per_id),
            f"{stats.max_mean_load.min():.2f}-{stats.max_mean_load.max():.2f}",
            f"{np.nanmin(stats.repeat_ratio):.2f}-{np.nanmax(stats.repeat_ratio):.2f}",
            f"{mi.min():.2f}-{mi.max():.2f}" if mi.size else "-", t.note,
        )
    return table


def results_table(trace: Trace, results: list[Result]) -> Table:
    ids = trace.routes.size
    base = {r.medium: r for r in results if r.method.startswith("npy")}
    table = Table(title=f"{trace.name}: {ids:,} ids, {trace.spec.num_experts} experts "
                        f"(ratios vs the int32 .npy row of the same medium)",
                  caption="\n".join(r.note for r in results if r.note) or None)
    for col, justify in [("method", "left"), ("medium", "left"), ("bytes", "right"), ("bits/id", "right"),
                         ("size vs npy", "right"), ("encode Mids/s", "right"), ("decode Mids/s", "right"),
                         ("encode vs npy", "right"), ("decode vs npy", "right")]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in results:
        b = base[r.medium]
        table.add_row(
            r.method, r.medium, f"{r.nbytes:,}", f"{8 * r.nbytes / ids:.3f}", f"{r.nbytes / b.nbytes:.1%}",
            f"{ids / r.encode_s / 1e6:,.1f}", f"{ids / r.decode_s / 1e6:,.1f}",
            f"{b.encode_s / r.encode_s:.2f}x", f"{b.decode_s / r.decode_s:.2f}x",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="16K-token synthetic trace, best of 2")
    parser.add_argument("--tokens", type=int, help="tokens of the synthetic trace (default 32768; 16384 with --quick)")
    parser.add_argument("--repeats", type=int, help="best of N (default 5; 2 with --quick)")
    parser.add_argument("--profile", action="store_true",
                        help="also time BitpackCodec stage by stage on a writer frame and a 6M-id array")
    args = parser.parse_args(argv)
    args.tokens = args.tokens or (16384 if args.quick else 32768)
    args.repeats = args.repeats or (2 if args.quick else 5)
    if args.tokens < 2 or args.repeats < 1:
        parser.error("--tokens must be >= 2 and --repeats >= 1")

    numcodecs.blosc.set_nthreads(1)  # single-threaded, like r3store's codec
    console = Console(width=max(Console().width, 150))
    console.print(environment(args))
    started = time.perf_counter()
    traces = load_traces(args.tokens)
    console.print(traces_table(traces))
    with tempfile.TemporaryDirectory(prefix="r3store-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for trace in traces:
            results = [bench_npy_memory(trace, args.repeats), bench_npy_file(trace, args.repeats, tmp)]
            results.append(bench_bitpack_frames(trace, args.repeats))
            results.append(bench_writer(trace, args.repeats, tmp))
            if trace.spec.num_experts <= 256:
                results.append(bench_blosc(trace, args.repeats, np.uint8))
            results.append(bench_blosc(trace, args.repeats, np.uint16))
            console.print(results_table(trace, results))
        verdicts = []
        for trace in traces:
            geometries = [(FRAME_ROWS, frame_layers(trace.spec), "default"), (OLD_FRAME_ROWS, 1, "former")]
            for frame_rows, nlayers, which in geometries:
                table, rows = codec_vs_blosc(trace, args.repeats, frame_rows, nlayers)
                console.print(table)
                lz4, ours = rows[-2], rows[0]
                verdicts.append(
                    f"{trace.name}, {which} frames {frame_rows} x {nlayers} x {trace.spec.top_k}: {ours.method} encode "
                    f"{lz4.encode_s / ours.encode_s:.2f}x, decode {lz4.decode_s / ours.decode_s:.2f}x blosc lz4 at "
                    f"{ours.nbytes / lz4.nbytes:.1%} of its size")
        console.print("target: encode and decode >= 1.0x blosc lz4 (1 thread) at the same or smaller size")
        for line in verdicts:
            console.print("  " + line)
    if args.profile:
        console.print(profile_table(traces, args.repeats))
    console.print(f"all round trips exact; total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
