"""Differential and round-trip fuzzing of the byte-facing kernels, the reader's partial decode
and the writer (random inputs from a seeded generator, no mutation engine).

Each target draws cases from ``numpy.random.default_rng(seed)`` until ``cases`` ran or
``seconds`` passed, and returns a report ``{"target", "seed", "cases", "checks", "failures"}``
(``failures``: up to 20 descriptions, each with what to replay: the seed and case number).

crc
    ``crc32c`` on every CRC-32C code path the CPU has (``set_crc_path``: ``table``,
    ``sse4.2``, ``pclmul``, ``avx512``) against ``google_crc32c``: random contents, start
    offsets 0..63 (unaligned), seeds (``value``), lengths drawn around every internal
    threshold (128 and 256 B folding starts, 8 KiB three-stream join, its 376-byte step,
    multiples of 64/192/768) and at random up to 200 KiB. Then a bitpack frame of 1 B to
    64 KiB with one bit flipped in its CRC-covered bytes must be refused on every path
    (``ChecksumError`` for a flip in the payload or CRC field, an r3store ``FormatError`` for
    one in the header).
unpack
    ``unpack`` (``native.unpack`` at a random byte offset, and ``kernels.unpack_into``) with
    widths 1..16, 0..3000 ids, outputs of 1, 2, 4 and 8 bytes (contiguous or strided; ids
    wider than the dtype wrap as numpy casts them), with
    the AVX-512 VBMI step on and off and with the portable C, against the numpy twin.
frames
    ``decode_frames`` with random ``row_first``/``row_count`` (and without) against the numpy
    twin and the expected ids; then one byte of one frame changed (header, CRC, payload,
    including bytes of rows the call does not return): the call must report that frame (or
    an earlier one), never -1, on both implementations.
frame_args
    ``decode_frames`` with frame places, lengths, output rows/layers and row ranges pushed
    past every bound (negative, off by one, 2**62, the int64 extremes): compiled and numpy
    agree on the result and every byte of ``out``, and nothing is written outside ``out``.
overread
    The kernels' inputs placed so that they end just before (or start just after) a page that
    may not be read: ``unpack`` in every mode, ``crc32c`` on every path, ``check_frame`` and
    ``decode_frames``; a load outside the input kills the process (SIGSEGV).
reads
    A random local store (experts 2..65536, codec ``bitpack`` or, a quarter of the time where
    it applies, ``set`` (ids read back sorted), chunk geometry, appends of many sizes, missing
    rows), read by ``get`` with random row slices and layer lists (into ``out`` arrays of random
    dtypes inside a larger buffer: those that cannot hold every id or -1 must be refused with an
    OptionError, nothing written, the others filled without a byte outside), and ``get_runs``
    into narrow dtypes; every result written over by the caller before the next read (get's
    edge-chunk cache must not alias it); then one byte of a storage object changed: every read
    must raise an r3store error or return the written routes, and a read of every sample must
    raise (corrupt bytes are never accepted), on a CRC-32C path drawn at random.
writer
    Valid appends (experts 2..65536: 1 to 16 bits per id) given as strided, negative-stride,
    Fortran-order, big-endian and narrow integer arrays, in one to three turns
    (``start``/``final``), to a local or an fsspec ``memory://`` store (the writer hands
    backends views of its reused buffer), read back equal; bad appends (ids out of range,
    repeats, floats, NaN, timedelta64, wrong shape, ``top_k`` or layer count, bool, object
    arrays) raise an r3store error and leave the store as it was.

writer_faults
    One write of a commit (a storage object torn half-way, its array document, its sample
    table) fails with a StorageError; the call that raised it is repeated: every sample
    appended reads back exactly, none lost, none twice.
ray_blocks
    ``r3store.ray.read_routes`` of random stores (0-row samples, layer subsets, 1 to 5 blocks):
    every sample as written; a consumer writing into the arrays of its batches (numpy, zero-copy
    ``map_batches``, ``take_all`` rows) changes no other sample and no later read.

set_frames
    ``SetCodec.decode_frames`` (the C ``set_decode_frames`` and the frame-by-frame twin) of runs
    of set frames with exception rows, zero rows and zero tails, against the expected sets;
    a changed byte, the codec of another table, arguments past their bounds (see
    :func:`set_frames`).
layout
    ``plan_layout`` over every rank of random micro-batches and options, frameworks
    included: every token on exactly one rank once, ``route_index`` and ``cu_seqlens``
    consistent; hostile option values are ``LayoutOptionError`` (see :func:`layout`).
assemble
    ``assemble`` of random stores (bitpack or set codec) over every rank: every laid-out route
    row holds the sample's ids of the layers asked for, ``replay_mask`` True exactly there.

``python -m tests.fuzz.differential --target crc --seconds 120 --seed 3`` runs one (all
without ``--target``) and prints one JSON line per target; exit status 1 on any failure.
"""

# ruff: noqa: B023 - the message callables are called inside _Run.check, before the loop moves on

from __future__ import annotations

import argparse
import ctypes
import errno
import itertools
import json
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import fsspec
import google_crc32c
import numpy as np

import r3store
from r3store._format import position_tag
from r3store.codecs import BitpackCodec, SetCodec, kernels
from r3store.codecs._set_numpy import encode_set_frame_numpy
from r3store.errors import (
    ChecksumError,
    CodecError,
    DuplicateSampleError,
    FormatError,
    OptionError,
    R3StoreError,
    StorageError,
)
from r3store.storage import LocalBackend

__all__ = ["TARGETS", "assemble", "assemble_paths", "crc", "direct_writes", "frame_args", "frames", "grouped",
           "guarded", "layout", "overread", "ranges", "ray_blocks", "reads", "run", "set_encode", "set_frames",
           "unpack", "writer", "writer_faults"]

Report = dict[str, Any]
MAX_FAILURES = 20


class _Run:
    """Case loop with a budget and the failure list of one target."""

    def __init__(self, target: str, seed: int, cases: int | None, seconds: float | None) -> None:
        self.target, self.seed, self.cases, self.seconds = target, seed, cases, seconds
        self.rng = np.random.default_rng(seed)
        self.done = 0
        self.checks = 0
        self.failures: list[str] = []
        self.counts: dict[str, int] = {}  # what a target counts besides cases and checks
        self.started = time.monotonic()

    def __iter__(self) -> Iterator[int]:
        while (self.cases is None or self.done < self.cases) and (
                self.seconds is None or time.monotonic() - self.started < self.seconds):
            yield self.done
            self.done += 1

    def check(self, ok: bool, what: Callable[[], str]) -> None:
        self.checks += 1
        if not ok and len(self.failures) < MAX_FAILURES:
            self.failures.append(f"case {self.done} (seed {self.seed}): {what()}")

    def report(self) -> Report:
        return {"target": self.target, "seed": self.seed, "cases": self.done, "checks": self.checks,
                "seconds": round(time.monotonic() - self.started, 1), **self.counts, "failures": self.failures}


def _native() -> Any:
    native = kernels.native_module()
    if native is None:
        raise RuntimeError("the C extension is not built (python setup.py build_ext --inplace)")
    return native


def crc_paths() -> list[str]:
    """The CRC-32C paths this CPU runs."""
    native = _native()
    saved, paths = native.crc_path(), []
    for path in ("table", "sse4.2", "pclmul", "avx512"):
        try:
            native.set_crc_path(path)
        except ValueError:
            continue
        paths.append(path)
    native.set_crc_path(saved)
    return paths


@contextmanager
def crc_path(path: str) -> Iterator[None]:
    native = _native()
    saved = native.set_crc_path(path)
    try:
        yield
    finally:
        native.set_crc_path(saved)


_THRESHOLDS = (64, 128, 192, 256, 376, 512, 768, 1024, 4096, 8192, 8192 + 376, 16384, 65536)


def _crc_length(rng: np.random.Generator) -> int:
    kind = rng.integers(0, 4)
    if kind == 0:
        return int(rng.choice(_THRESHOLDS) + rng.integers(-48, 49)) if rng.random() < 0.7 else \
            int(rng.choice(_THRESHOLDS))
    if kind == 1:  # multiples of the folding widths and the three-stream step, +-1
        unit = int(rng.choice([8, 16, 64, 192, 256, 376, 768]))
        return max(0, unit * int(rng.integers(1, 200)) + int(rng.integers(-1, 2)))
    if kind == 2:
        return int(rng.integers(0, 600))
    return int(rng.integers(0, 200 << 10))


def crc(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    run = _Run("crc", seed, cases, seconds)
    rng = run.rng
    paths = crc_paths()
    native = _native()
    pool = rng.integers(0, 256, (200 << 10) + 64, dtype=np.uint8)
    for case in run:
        n, off = _crc_length(rng), int(rng.integers(0, 64))
        if case % 4 == 0:
            data = rng.integers(0, 256, n + off, dtype=np.uint8)[off:]
        elif case % 4 == 1:  # runs of one value (zeros, ones) and sparse bits
            data = np.full(n, rng.choice([0, 255, int(rng.integers(0, 256))]), np.uint8)
            data[rng.integers(0, max(n, 1), min(n, 3))] ^= 1 << int(rng.integers(0, 8)) if n else 0
        else:
            data = pool[off : off + n]
        value = int(rng.integers(0, 1 << 32)) if rng.random() < 0.5 else 0
        raw = data.tobytes()
        want = int(google_crc32c.extend(value, raw)) if value else int(google_crc32c.value(raw))
        for path in paths:
            with crc_path(path):
                got = int(native.crc32c(data, value)) if value else int(native.crc32c(data))
            run.check(got == want, lambda p=path, g=got: f"{p}: crc32c of {n} bytes at offset {off}, value "
                                                          f"{value:#x}: {g:#x}, google_crc32c {want:#x}")
        if case % 3 == 0:
            _flipped_frame(run, paths)
    return run.report()


def _flipped_frame(run: _Run, paths: list[str]) -> None:
    rng = run.rng
    bits = int(rng.integers(1, 17))
    size = int(rng.choice([1, 7, 63, 128, 255, 256, 1000, 8192, 8200, 20000, 65536]))
    n = max(1, size * 8 // bits)
    ids = rng.integers(0, 1 << bits, n)
    ids[-1] = max(int(ids[-1]), 1)  # no trimmed tail: every payload byte is CRC-covered
    version = int(rng.integers(1, 3))
    codec = BitpackCodec(bits=bits, frame_version=version)
    frame = bytearray(codec.encode(ids, tag=int(rng.integers(1, 1 << 32)) if version == 2 else 0))
    header = 20 if version == 1 else 24
    where = int(rng.integers(0, len(frame)))
    frame[where] ^= 1 << int(rng.integers(0, 8))
    for path in paths:
        with crc_path(path):
            try:
                codec.decode(bytes(frame))
                outcome = "accepted"
            except ChecksumError:
                outcome = "checksum"
            except FormatError:
                outcome = "format"
            except R3StoreError as exc:
                outcome = type(exc).__name__
        ok = outcome == "checksum" if where >= header - 4 else outcome in ("checksum", "format")
        run.check(ok, lambda p=path, o=outcome: f"{p}: frame v{version} of {len(frame)} bytes ({bits} bits) with "
                                                f"byte {where} flipped: {o}")


# -- unpack ------------------------------------------------------------------------------


@contextmanager
def _unpack_mode(mode: str) -> Iterator[None]:
    """``numpy``, ``scalar`` (portable C), ``avx2`` (AVX-512 off) or ``avx512``."""
    native = _native()
    if mode == "numpy":
        with kernels.use("numpy"):
            yield
        return
    with kernels.use("native" if mode == "scalar" else "native-avx2"):
        saved = native.set_avx512(mode == "avx512")
        try:
            yield
        finally:
            native.set_avx512(saved)


def _simd_paths(first: list[str], avx512_switch: str) -> list[str]:
    """``first``, then "avx2" and "avx512" where this CPU runs them (the AVX-512 switch, a
    native function such as ``set_avx512``, refuses with ValueError where it does not)."""
    native = _native()
    paths = list(first)
    if native.cpu_features().get("avx2"):
        paths.append("avx2")
        switch = getattr(native, avx512_switch)
        try:
            switch(switch(True))
            paths.append("avx512")
        except ValueError:
            pass
    return paths


def unpack_modes() -> list[str]:
    return _simd_paths(["numpy", "scalar"], "set_avx512")


def unpack(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    run = _Run("unpack", seed, cases, seconds)
    rng = run.rng
    native = _native()
    modes = unpack_modes()
    dtypes = [np.uint8, np.uint16, np.int16, np.int32, np.int8, np.uint32, np.int64]
    for _ in run:
        bits = int(rng.integers(1, 17))
        n = int(rng.choice([int(rng.integers(0, 70)), int(rng.integers(0, 3000))]))
        offset = int(rng.integers(0, 40))
        slack = int(rng.integers(0, 3))
        ids = rng.integers(0, 1 << bits, n)
        packed = kernels.pack_bits(ids, bits) if n else np.zeros(0, np.uint8)
        buf = np.concatenate([rng.integers(0, 256, offset, dtype=np.uint8), packed,
                              rng.integers(0, 256, slack, dtype=np.uint8)])
        dtype = np.dtype(dtypes[int(rng.integers(0, len(dtypes)))])
        room = n + int(rng.integers(0, 5))
        stride = int(rng.integers(1, 3))
        want = (ids.astype(dtype) if n else np.zeros(0, dtype))
        results = {}
        for mode in modes:
            base = np.full(room * stride, 0x5A, dtype)
            out = base[::stride]
            with _unpack_mode(mode):
                if mode == "numpy":
                    kernels.unpack_into(buf[offset:], n, bits, out)
                else:
                    native.unpack(buf, offset, n, bits, out)
            results[mode] = out.copy()
            run.check(np.array_equal(out[:n], want) and not out[n:].any()
                      and (stride == 1 or (base[1::stride] == dtype.type(0x5A)).all()),
                      lambda m=mode: f"{m}: unpack of {n} ids of {bits} bits at offset {offset} into {dtype} "
                                     f"(stride {stride}) differs from the ids")
        # whole-API path with the kernel's own output allocation
        if np.iinfo(dtype).max >= (1 << bits) - 1 and dtype in kernels.OUT_DTYPES:
            for mode in modes[1:]:
                with _unpack_mode(mode):
                    got = kernels.unpack_bits(buf[offset:].tobytes(), n, bits, dtype=dtype)
                run.check(np.array_equal(got, want), lambda m=mode: f"{m}: unpack_bits of {n} ids, {bits} bits")
    return run.report()


# -- decode_frames -----------------------------------------------------------------------


def _decode(blob: np.ndarray, c: dict[str, np.ndarray], bits: int, out: np.ndarray, cr: int, lpc: int,
            ranges: tuple[np.ndarray, np.ndarray] | None) -> int:
    return kernels.decode_frames(blob, c["starts"], c["lengths"], bits, out, c["rows"], c["layers"], chunk_rows=cr,
                                 layers_per_chunk=lpc, tag_prefix="w-00007", row_chunks=c["rc"],
                                 layer_chunks=c["lc"], row_first=None if ranges is None else ranges[0],
                                 row_count=None if ranges is None else ranges[1])


def frames(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    run = _Run("frames", seed, cases, seconds)
    rng = run.rng
    impls = ["numpy", "native"]
    for _ in run:
        bits = int(rng.integers(1, 17))
        cr, lpc, top_k = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        nrc, nlc = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        codec = BitpackCodec(bits=bits, frame_version=2)
        chunks = [(r, b) for r in range(nrc) for b in range(nlc)]
        rng.shuffle(chunks)
        chunks = chunks[: int(rng.integers(1, len(chunks) + 1))]
        pieces, cols = [], {k: [] for k in ("starts", "lengths", "rows", "layers", "rc", "lc", "first", "count")}
        gap = int(rng.integers(0, 9))
        pos, out_row = gap, 0
        want = []
        for r, b in chunks:
            ids = rng.integers(0, 1 << bits, (cr, lpc, top_k))
            if rng.random() < 0.3:  # a trimmed zero tail
                ids.reshape(-1)[-int(rng.integers(1, ids.size + 1)):] = 0
            frame = codec.encode(ids, tag=position_tag("w-00007", r, b))
            first = int(rng.integers(0, cr))
            count = int(rng.integers(1, cr - first + 1))
            for k, v in zip(cols, (pos, len(frame), out_row, b * lpc, r, b, first, count), strict=True):
                cols[k].append(v)
            want.append((out_row, b * lpc, ids[first : first + count]))
            pieces.append(np.frombuffer(frame, np.uint8))
            pieces.append(rng.integers(0, 256, gap, dtype=np.uint8))
            pos += len(frame) + gap
            out_row += count
        blob = np.concatenate([rng.integers(0, 256, cols["starts"][0], dtype=np.uint8), *pieces])
        c = {k: np.array(v, np.int64) for k, v in cols.items()}
        ranges = (c["first"], c["count"])
        dtype = np.dtype([np.uint8, np.uint16, np.int16, np.int32, np.int8, np.uint32][int(rng.integers(0, 6))])
        if np.iinfo(dtype).max < (1 << bits) - 1 and rng.random() < 0.7:
            dtype = np.dtype(np.int32)  # else ids wider than out wrap, as numpy casts them
        layers = nlc * lpc
        expect = np.full((out_row + 2, layers, top_k), 77, dtype)
        for row, layer, ids in want:
            expect[row : row + len(ids), layer : layer + lpc] = ids
        for impl in impls:
            with kernels.use(impl):
                out = np.full_like(expect, 77)
                rc = _decode(blob, c, bits, out, cr, lpc, ranges)
            run.check(rc == -1 and np.array_equal(out, expect),
                      lambda i=impl, r=rc: f"{i}: {len(chunks)} frames ({bits} bits, chunk {cr}x{lpc}x{top_k}) "
                                           f"with row ranges: rc {r}, out differs {not np.array_equal(out, expect)}")
        # one changed byte anywhere in one frame (rows not returned included)
        f = int(rng.integers(0, len(chunks)))
        where = int(c["starts"][f] + rng.integers(0, c["lengths"][f]))
        bad = blob.copy()
        bad[where] ^= np.uint8(int(rng.integers(1, 256)))
        for impl in impls:
            with kernels.use(impl):
                out = np.full_like(expect, 77)
                rc = _decode(bad, c, bits, out, cr, lpc, ranges)
            run.check(0 <= rc <= f, lambda i=impl, r=rc: f"{i}: byte {where - c['starts'][f]} of frame {f} "
                                                         f"({c['lengths'][f]} bytes, rows {c['first'][f]}+"
                                                         f"{c['count'][f]} of {cr} returned) changed: rc {r}")
            if 0 <= rc <= f:  # the named frame's fault is an r3store error
                frame = bad[c["starts"][rc] : c["starts"][rc] + c["lengths"][rc]]
                try:
                    codec.decode(frame, tag=position_tag("w-00007", int(c["rc"][rc]), int(c["lc"][rc])))
                    named = "decoded"
                except (ChecksumError, FormatError):
                    named = "refused"
                run.check(named == "refused", lambda i=impl: f"{i}: frame {rc} reported by decode_frames decodes")
    return run.report()



def grouped(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``decode_frames`` of frames whose chunk rows are byte-aligned (``layers_per_chunk * top_k`` a
    multiple of 8, no trimmed tail: the grouped path that writes frames side by side row by row),
    laid out in groups (the same output rows, consecutive layer chunks; 8 and 16 bits mostly), with
    the same ``row_first``/``row_count`` per group or not, into uint8/int16/uint16/int32; with
    non-temporal stores from 0 bytes and by default, AVX-512 on and off. Then one frame in the middle
    of a group changed: the frames before it are decoded, nothing of it or after it is written."""
    run = _Run("grouped", seed, cases, seconds)
    rng = run.rng
    native = _native()
    modes = [m for m in unpack_modes() if m != "numpy"]
    for _ in run:
        bits = int(rng.choice([8, 16, 8, 16, int(rng.integers(1, 17))]))
        top_k = int(rng.choice([1, 2, 4, 8]))
        lpc = int(rng.choice([d for d in (1, 2, 4, 8) if d * top_k % 8 == 0] or [8]))
        cr = int(rng.integers(1, 40))
        nrc, nlc = int(rng.integers(1, 4)), int(rng.integers(1, 9))
        if rng.random() < 0.05:  # past a group's 64 frames or 256 KiB of payload
            nrc, nlc, cr = 1, int(rng.integers(60, 140)), int(rng.integers(30, 40))
        codec = BitpackCodec(bits=bits, frame_version=2)
        cols: dict[str, list[int]] = {k: [] for k in ("starts", "lengths", "rows", "layers", "rc", "lc", "first",
                                                       "count")}
        pieces, want, pos, out_row = [], [], 0, 0
        same = rng.random() < 0.7
        for r in range(nrc):
            first = int(rng.integers(0, cr))
            count = int(rng.integers(1, cr - first + 1))
            for b in range(nlc):
                if not same:
                    first = int(rng.integers(0, cr))
                    count = int(rng.integers(1, cr - first + 1))
                ids = rng.integers(0, 1 << bits, (cr, lpc, top_k))
                if rng.random() < 0.1:
                    ids.reshape(-1)[-int(rng.integers(1, ids.size + 1)):] = 0  # a trimmed tail: not grouped
                frame = codec.encode(ids, tag=position_tag("w-00007", r, b))
                gap = int(rng.choice([0, 0, 1, 7]))
                for k, v in zip(cols, (pos, len(frame), out_row, b * lpc, r, b, first, count), strict=True):
                    cols[k].append(v)
                want.append((out_row, b * lpc, ids[first : first + count]))
                pieces += [np.frombuffer(frame, np.uint8), rng.integers(0, 256, gap, dtype=np.uint8)]
                pos += len(frame) + gap
            out_row += max(cols["count"][-nlc:]) if not same else count
        blob = np.concatenate(pieces)
        c = {k: np.array(v, np.int64) for k, v in cols.items()}
        ranges = (c["first"], c["count"])
        choices = [np.int32, np.uint16, np.int16] + ([np.uint8] if bits <= 8 else [])
        dtype = np.dtype(choices[int(rng.integers(0, len(choices)))])
        layers = nlc * lpc + int(rng.integers(0, 3))
        expect = np.full((out_row + 1, layers, top_k), 77, dtype)
        cut = int(rng.integers(1, len(want))) if len(want) > 1 else 0
        cut_expect = expect.copy()
        for f, (row, layer, ids) in enumerate(want):
            expect[row : row + len(ids), layer : layer + lpc] = ids
            if f < cut:
                cut_expect[row : row + len(ids), layer : layer + lpc] = ids
        bad = blob.copy()
        bad[c["starts"][cut] + int(rng.integers(0, c["lengths"][cut]))] ^= np.uint8(int(rng.integers(1, 256)))
        geometry = (f"{len(want)} frames of {bits} bits, chunk {cr}x{lpc}x{top_k}, {nrc}x{nlc} chunks, "
                    f"same ranges {same}, out {dtype} with {layers} layers")
        for mode in modes:
            for stream in (0, -1):
                saved_stream = native.set_stream_min(stream)
                try:
                    with _unpack_mode(mode):
                        out = np.full_like(expect, 77)
                        rc = _decode(blob, c, bits, out, cr, lpc, ranges)
                        run.check(rc == -1 and np.array_equal(out, expect),
                                  lambda m=mode, s=stream, r=rc: f"{m}, stream_min {s}: {geometry}: rc {r}, out "
                                                                 f"differs {not np.array_equal(out, expect)}")
                        out = np.full_like(expect, 77)
                        rc = _decode(bad, c, bits, out, cr, lpc, ranges)
                        run.check(rc == cut and np.array_equal(out, cut_expect),
                                  lambda m=mode, s=stream, r=rc: f"{m}, stream_min {s}: {geometry}, frame {cut} "
                                                                 f"changed: rc {r}, out differs "
                                                                 f"{not np.array_equal(out, cut_expect)}")
                finally:
                    native.set_stream_min(saved_stream)
    return run.report()


@contextmanager
def _set_path(name: str) -> Iterator[None]:
    """The set codec's ``avx512``, ``avx2`` or ``portable`` C kernels for the block."""
    native = _native()
    with kernels.use("native" if name == "portable" else "native-avx2"):
        prev = native.setcodec_avx512(False)
        try:
            if name == "avx512":
                native.setcodec_avx512(True)
            yield
        finally:
            native.setcodec_avx512(prev)


def set_paths() -> list[str]:
    return _simd_paths(["portable"], "setcodec_avx512")


def set_encode(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``SetCodec.encode`` on every C path (AVX-512, AVX2, portable) against the numpy reference:
    experts at and around every power of two (1..1,024; past it refused), top-k 1..16, 0..200 rows (around the
    encoder's groups of 32 rows and its blocks), adversarial rows (an id repeated, all equal, ids
    of E-1 and E..2**bits-1, unsorted, all zero), a partial last row, int64/int32/int16/uint16/
    uint8 inputs, contiguous or strided, and ids outside [0, 2**bits) (negative, 2**bits):
    byte-identical frames, or a CodecError on every path."""
    run = _Run("set_encode", seed, cases, seconds)
    rng = run.rng
    paths = set_paths()
    for _ in run:
        b = int(rng.integers(0, 11)) if rng.random() < 0.97 else int(rng.integers(11, 17))  # the codec stops at 1,024
        experts = int(np.clip((1 << b) + int(rng.choice([-1, 0, 0, 1])), 1, 65536))
        if rng.random() < 0.3:
            experts = int(rng.integers(1, 1025))
        top_k = int(rng.choice([1, 2, 4, 6, 8, 16, int(rng.integers(1, 17))]))
        top_k = min(top_k, max(1, experts)) if rng.random() < 0.8 else top_k
        try:
            codec = SetCodec(num_experts=experts, top_k=top_k)
        except (CodecError, OptionError):
            run.counts["codec refused"] = run.counts.get("codec refused", 0) + 1
            continue
        bits = codec.bits
        n = int(rng.choice([0, 1, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, int(rng.integers(0, 200))]))
        rows = np.stack([rng.permutation(max(experts, top_k))[:top_k] for _ in range(n)]) if n else \
            np.zeros((0, top_k), np.int64)
        rows = rows.astype(np.int64) % max(experts, 1)
        for r in range(n):
            kind = rng.random()
            if kind < 0.05:
                rows[r] = rows[r, 0]  # all equal
            elif kind < 0.1 and top_k > 1:
                rows[r, int(rng.integers(1, top_k))] = rows[r, 0]  # a repeat
            elif kind < 0.15:
                rows[r] = 0
            elif kind < 0.2:
                rows[r, int(rng.integers(0, top_k))] = int(rng.integers(experts, 1 << bits)) if experts < 1 << bits \
                    else experts - 1  # past num_experts, inside the bits
            elif kind < 0.25:
                rows[r] = np.sort(rows[r])
            elif kind < 0.3:
                rows[r, int(rng.integers(0, top_k))] = experts - 1
        flat = rows.reshape(-1)
        if flat.size and rng.random() < 0.15:  # a partial last row
            flat = flat[: flat.size - int(rng.integers(1, min(top_k, flat.size) + 1))]
        bad = flat.size and rng.random() < 0.08
        if bad:
            flat = flat.copy()
            flat[int(rng.integers(0, flat.size))] = int(rng.choice([-1, 1 << bits, (1 << bits) + 5, -(1 << 40)]))
        choices = [np.int64, np.int32] + [d for d in (np.int16, np.uint16, np.uint8)
                                          if not bad and (flat.size == 0 or int(flat.max()) <= np.iinfo(d).max)]
        dtype = np.dtype(choices[int(rng.integers(0, len(choices)))])
        arr = flat.astype(dtype)
        strided = rng.random() < 0.3
        if strided:
            room = np.zeros(arr.size * 3, dtype)
            room[::3] = arr
            arr = room[::3]
        tag = int(rng.choice([0, 1, (1 << 32) - 1, int(rng.integers(0, 1 << 32))]))
        want = encode_set_frame_numpy(arr.astype(np.int64), codec.params, tag)  # as the encoder sees them
        what = f"E={experts} k={top_k} ({bits} bits), {flat.size} ids as {dtype}{' strided' * strided}"
        for name in paths:
            with _set_path(name):
                try:
                    got: bytes | None = codec.encode(arr, tag=tag)
                except CodecError:
                    got = None
            run.check(got == want, lambda nm=name, g=got: f"{nm}: {what}: "
                                                          f"{'refused' if g is None else 'frame'}, the numpy "
                                                          f"reference {'refuses' if want is None else 'differs'}")
        if want is not None and not bad:
            back = codec.decode(want)
            run.check(back.reshape(-1).size == flat.size, lambda: f"{what}: decode gives {back.size} ids")
    return run.report()


@contextmanager
def _direct_fault(fault: str, short: int) -> Iterator[None]:
    """A file system that refuses ``O_DIRECT`` where this one takes it (the kernel's answers, injected
    into ``os.pwrite``/``fcntl.fcntl`` for the block): EINVAL at the first direct write (an
    alignment the device refuses), a short write of ``short`` bytes, or ``F_SETFL`` refused."""
    import fcntl

    real_pwrite, real_fcntl = os.pwrite, fcntl.fcntl
    calls = [0]

    def pwrite(fd: int, data: Any, offset: int) -> int:
        calls[0] += 1
        if fault == "EINVAL at the first pwrite" and calls[0] == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        if fault == "short pwrite" and calls[0] == 1:
            return real_pwrite(fd, memoryview(data)[:short], offset)
        return real_pwrite(fd, data, offset)

    def fcntl_(fd: int, cmd: int, arg: int = 0) -> Any:
        if fault == "fcntl refuses O_DIRECT" and cmd == fcntl.F_SETFL and arg & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    os.pwrite, fcntl.fcntl = pwrite, fcntl_  # type: ignore[assignment]
    try:
        yield
    finally:
        os.pwrite, fcntl.fcntl = real_pwrite, real_fcntl  # type: ignore[assignment]


def direct_writes(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``LocalBackend.set`` and ``set_if_absent`` of objects of every size around 1 MiB and around
    4 KiB page multiples (-1, 0, +1, +511 bytes), from page-aligned buffers (the ``O_DIRECT`` path)
    and from unaligned ones, with ``direct_write_bytes`` at its default, 4 KiB or None, into a
    folder on the disk and one on tmpfs (``/dev/shm``, which refuses ``O_DIRECT`` before Linux
    6.6), and with a refusal injected (:func:`_direct_fault`): every object reads back equal,
    whole and by ranges, and no write fails."""
    from r3store.storage import ByteRange, _local

    run = _Run("direct_writes", seed, cases, seconds)
    rng = run.rng
    roots = [Path(tempfile.mkdtemp(prefix="r3-direct-"))]
    if Path("/dev/shm").is_dir():
        roots.append(Path(tempfile.mkdtemp(prefix="r3-direct-", dir="/dev/shm")))
    real = _local._write_direct
    direct = [0]

    def counted(fd: int, view: memoryview) -> int:
        done = real(fd, view)
        direct[0] += bool(done)
        return done

    _local._write_direct = counted
    page = _local.DIRECT_ALIGN
    try:
        for i in run:
            base = int(rng.choice([1 << 20, page * int(rng.integers(1, 600)), int(rng.integers(1, 3 << 20))]))
            size = max(0, base + int(rng.choice([-1, 0, 0, 1, 511, -page + 1])))
            pool = np.empty(size + 2 * page, np.uint8)
            off = (-pool.ctypes.data) % page + (int(rng.integers(1, 64)) if rng.random() < 0.25 else 0)
            buf = pool[off : off + size]
            buf[:] = rng.integers(0, 256, size, dtype=np.uint8)
            root = roots[int(rng.integers(0, len(roots)))]
            backend = LocalBackend(root)
            backend.direct_write_bytes = [_local.DIRECT_WRITE_BYTES, page, None][int(rng.integers(0, 3))]
            key = f"c/{i}/{size}"
            data: bytes | memoryview = memoryview(buf) if rng.random() < 0.7 else buf.tobytes()
            fault = ["none", "none", "EINVAL at the first pwrite", "short pwrite", "fcntl refuses O_DIRECT"][
                int(rng.integers(0, 5))]
            with _direct_fault(fault, int(rng.integers(1, 1 << 16))):
                if rng.random() < 0.5:
                    backend.set(key, data)
                else:
                    run.check(backend.set_if_absent(key, data),
                              lambda k=key: f"set_if_absent({k!r}) refused a new key")
            got = backend.get(key)
            what = (f"{size} bytes, buffer at page offset {off % page}, {fault}, direct_write_bytes "
                    f"{backend.direct_write_bytes}, {'tmpfs' if str(root).startswith('/dev/shm') else 'disk'}")
            run.check(len(got) == size and got == buf.tobytes(), lambda w=what: f"{w}: read back differs")
            if size:
                a = int(rng.integers(0, size))
                b = int(rng.integers(a, size + 1))
                run.check(bytes(backend.get(key, ByteRange(a, b))) == buf[a:b].tobytes(),
                          lambda w=what, a=a, b=b: f"{w}: bytes {a}..{b} differ")
            backend.delete(key)
            backend.close()
    finally:
        _local._write_direct = real
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    run.counts["written with O_DIRECT"] = direct[0]
    return run.report()


def _reference_rows(rows: Any, n: int) -> tuple[int, int] | None:
    """``rows=`` as ``r3store.reader._ranges`` states the rules (written from its text): (start, stop),
    or None where it must be refused."""
    if rows is None:
        return 0, n
    if not isinstance(rows, slice) or rows.step not in (None, 1):
        return None
    ends = []
    for value, default in ((rows.start, 0), (rows.stop, n)):
        if value is None:
            ends.append(default)
            continue
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            return None
        v = int(value) + (n if int(value) < 0 else 0)
        if not 0 <= v <= n:
            return None
        ends.append(v)
    return (ends[0], ends[1]) if ends[0] <= ends[1] else None


def ranges(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``get``/``get_many`` with row ranges (negative, past either end, reversed, steps, bools,
    floats, numpy ints, 2**63) and layer lists (non-MoE, past the model, negative, repeated, empty,
    numpy ints), ``read_rows`` with start/stop past the array, and settings objects given a
    misspelt field (keyword, dict form, ``open_store(reader=...)``): a range within the sample is
    read exactly (the rows and layers of the whole sample), any other is a ``RangeError`` /
    ``LayerError`` / ``OptionError``, never clipped; a misspelt field is an ``UnknownOptionError``."""
    import dataclasses

    from r3store.errors import LayerError, RangeError, UnknownOptionError

    run = _Run("ranges", seed, cases, seconds)
    rng = run.rng
    root = Path(tempfile.mkdtemp(prefix="r3-ranges-"))
    try:
        spec = r3store.ModelSpec(num_layers=5, num_experts=32, top_k=2, moe_layers=(1, 2, 4))
        full: dict[str, np.ndarray] = {}
        with r3store.RouteWriter(root, spec, {"chunk_rows": 4}) as w:
            for i, n in enumerate((1, 2, 5, 9, 17)):
                routes = np.stack([np.stack([rng.permutation(32)[:2] for _ in range(3)]) for _ in range(n)])
                w.append(f"s{i}", routes.astype(np.int32))
                full[f"s{i}"] = routes.astype(np.int32)
        store = r3store.open_store(root)
        moe = list(spec.moe_layers)
        values: list[Any] = [None, 0, 1, -1, 2, 3, 5, 8, 9, 16, 17, 18, -9, -10, -17, -18, 1 << 63, -(1 << 63),
                             True, False, 1.0, "1", np.int64(2), np.int32(-1), np.uint8(3)]
        for _ in run:
            sid = f"s{int(rng.integers(0, 5))}"
            n = len(full[sid])
            kind = rng.random()
            rows: Any = None
            if kind < 0.85:
                rows = slice(values[int(rng.integers(0, len(values)))], values[int(rng.integers(0, len(values)))],
                             [None, None, None, 1, 2, 0, -1][int(rng.integers(0, 7))])
            elif kind < 0.92:
                rows = [(0, 1), range(1), 1, [0]][int(rng.integers(0, 4))]
            layers: Any = None
            if rng.random() < 0.6:
                pick = [moe[int(rng.integers(0, 3))] for _ in range(int(rng.integers(0, 4)))]
                if rng.random() < 0.3:
                    pick.append([0, 3, 5, -1, -2, 1 << 40, True, np.int64(2), 2.0][int(rng.integers(0, 9))])
                layers = pick if rng.random() < 0.8 else tuple(pick)
            want_rows = _reference_rows(rows, n)
            valid_layers = layers is None or all(
                not isinstance(x, bool) and isinstance(x, int | np.integer) and int(x) in moe for x in layers)
            doubtful = layers is not None and (len(layers) == 0 or len(set(map(int, layers))) < len(layers)
                                               if valid_layers else False)
            what = f"get({sid!r} of {n} rows, rows={rows!r}, layers={layers!r})"
            wrong_type = (rows is not None and not isinstance(rows, slice)) or (layers is not None and any(
                isinstance(x, bool) or not isinstance(x, int | np.integer) for x in layers))
            try:
                got = store.get(sid, layers, rows=rows)
            except TypeError as exc:  # a value of the wrong type (documented by sample_layers; a builtin error)
                run.check(wrong_type, lambda w=what, e=exc: f"{w}: TypeError ({e}) for values of the right types")
                continue
            except (RangeError, LayerError, OptionError) as exc:
                run.check(want_rows is None or not valid_layers or doubtful,
                          lambda w=what, e=exc: f"{w}: refused ({type(e).__name__}: {e}), the rules accept it")
                continue
            except Exception as exc:  # noqa: BLE001  # the oracle
                run.check(False, lambda w=what, e=exc: f"{w}: {type(e).__name__} outside r3store.errors: {e}")
                continue
            if want_rows is None or not valid_layers:
                run.check(False, lambda w=what, g=got: f"{w}: accepted ({g.shape}), the rules refuse it")
                continue
            idx = [moe.index(int(x)) for x in layers] if layers is not None else list(range(3))
            expect = full[sid][want_rows[0] : want_rows[1]][:, idx]
            run.check(got.shape == expect.shape and np.array_equal(got, expect),
                      lambda w=what, g=got: f"{w}: {g.shape} differs from the rows written {expect.shape}")
            if rng.random() < 0.2 and layers is not None and not doubtful:
                many = store.get_many([sid, sid], layers)
                run.check(all(np.array_equal(m, full[sid][:, idx]) for m in many),
                          lambda w=what: f"get_many of {w} differs")
        # read_rows past the array and with odd ints
        row = store.row("s4")
        for _ in range(200):
            a, b = (values[int(rng.integers(0, len(values)))] for _ in range(2))
            try:
                got = store.read_rows(row["array"], a, b, [0, 1, 2])
            except (OptionError, FormatError, RangeError):
                continue
            except Exception as exc:  # noqa: BLE001  # the oracle
                run.check(False, lambda e=exc, a=a, b=b: f"read_rows({a!r}, {b!r}): {type(e).__name__}: {e}")
                continue
            run.check(isinstance(a, int | np.integer) and not isinstance(a, bool | np.bool_) and 0 <= int(a) <= int(b),
                      lambda a=a, b=b: f"read_rows({a!r}, {b!r}) accepted")
        # misspelt settings fields
        for cls in (r3store.ReaderOptions, r3store.LayoutOptions, r3store.WriterConfig):
            for field in dataclasses.fields(cls):  # type: ignore[arg-type]
                name = field.name
                for typo in {name[:-1], name + "s", name.upper(), name.replace("_", ""), name.replace("_", "-"),
                             name[1:], "_" + name} - {f.name for f in dataclasses.fields(cls)} - {""}:  # type: ignore[arg-type]
                    for form in ("keyword", "dict"):
                        try:
                            cls(**{typo: 1}) if form == "keyword" else cls.from_dict({typo: 1})  # type: ignore[attr-defined]
                        except UnknownOptionError:
                            run.counts["misspelt fields refused"] = run.counts.get("misspelt fields refused", 0) + 1
                            continue
                        except Exception as exc:  # noqa: BLE001  # the oracle
                            run.check(False, lambda c=cls, t=typo, f=form, e=exc: f"{c.__name__} {f} {t!r}: "
                                                                                  f"{type(e).__name__}: {e}")
                            continue
                        run.check(False, lambda c=cls, t=typo, f=form: f"{c.__name__} {f} {t!r} accepted")
            try:
                r3store.open_store(root, reader={"use_checkpoints": False})
            except UnknownOptionError:
                pass
            except Exception as exc:  # noqa: BLE001  # the oracle
                run.check(False, lambda e=exc: f"open_store(reader={{'use_checkpoints': ...}}): {type(e).__name__}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return run.report()

def _perturb(rng: np.random.Generator, values: list[int], lo: int, hi: int) -> np.ndarray:
    arr = np.array(values, np.int64)
    if rng.random() < 0.3:
        i = int(rng.integers(0, len(arr)))
        arr[i] = int(rng.choice([lo, hi, -1, -(1 << 62), 1 << 62, (1 << 63) - 1, -(1 << 63), arr[i] + 1, arr[i] - 1]))
    return arr


def frame_args(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``decode_frames`` with frame places, sizes and row ranges pushed past every bound
    (negative, one off, 2**62, the int64 extremes; an ``out`` of 0 rows or too few layers):
    the compiled kernel must agree with the numpy twin on the result (a CodecError, or the
    first frame out of bounds) and on every byte of ``out``, and never write outside it."""
    run = _Run("frame_args", seed, cases, seconds)
    rng = run.rng
    for _ in run:
        bits = int(rng.integers(1, 17))
        cr, lpc, top_k = int(rng.integers(1, 9)), int(rng.integers(1, 3)), int(rng.integers(1, 4))
        codec = BitpackCodec(bits=bits, frame_version=2)
        nf = int(rng.integers(1, 4))
        blob, starts, lengths = b"", [], []
        for f in range(nf):
            frame = codec.encode(rng.integers(0, 1 << bits, (cr, lpc, top_k)), tag=position_tag("w", f, 0))
            starts.append(len(blob))
            lengths.append(len(frame))
            blob += frame
        layers_out, rows_out = int(rng.integers(lpc, 2 * lpc + 2)), int(rng.integers(0, cr * nf + 4))
        args = {"starts": _perturb(rng, starts, 0, len(blob)), "lengths": _perturb(rng, lengths, 0, len(blob)),
                "rows": _perturb(rng, rng.integers(0, max(rows_out, 1), nf).tolist(), 0, rows_out),
                "layers": _perturb(rng, rng.integers(0, layers_out, nf).tolist(), 0, layers_out)}
        ranges = (_perturb(rng, rng.integers(0, cr, nf).tolist(), 0, cr),
                  _perturb(rng, rng.integers(1, cr + 1, nf).tolist(), 0, cr)) if rng.random() < 0.7 else None
        dtype = np.dtype([np.uint8, np.uint16, np.int32, np.int16][int(rng.integers(0, 4))])
        results = {}
        for impl in ("numpy", "native"):
            room = np.full((rows_out + 2) * layers_out * top_k, 7, dtype)
            out = room[layers_out * top_k : -layers_out * top_k].reshape(rows_out, layers_out, top_k)
            with kernels.use(impl):
                try:
                    rc: object = kernels.decode_frames(
                        blob, args["starts"], args["lengths"], bits, out, args["rows"], args["layers"],
                        chunk_rows=cr, layers_per_chunk=lpc, tag_prefix="w", row_chunks=np.arange(nf),
                        layer_chunks=np.zeros(nf, np.int64), row_first=None if ranges is None else ranges[0],
                        row_count=None if ranges is None else ranges[1])
                except CodecError:
                    rc = "CodecError"
                except Exception as exc:  # noqa: BLE001 - the oracle
                    rc = f"{type(exc).__name__}: {exc}"
            results[impl] = (rc, room)
            edge = layers_out * top_k
            run.check((room[:edge] == 7).all() and (room[-edge:] == 7).all(),
                      lambda i=impl: f"{i}: decode_frames wrote outside out ({args}, ranges {ranges})")
        (rc_a, out_a), (rc_b, out_b) = results["numpy"], results["native"]
        run.check(rc_a == rc_b and np.array_equal(out_a, out_b),
                  lambda: f"numpy {rc_a} vs native {rc_b}, out equal {np.array_equal(out_a, out_b)}: {args}, "
                          f"ranges {ranges}, out {(rows_out, layers_out, top_k)} {dtype}, chunk {cr}x{lpc}")
    return run.report()


def fused_modes() -> list[str]:
    """The ``set_fused`` modes this CPU runs (``avx512`` needs AVX-512 BW and VPCLMULQDQ)."""
    native = kernels.native_module()
    if native is None or not hasattr(native, "set_fused"):
        return []
    cpu = native.cpu_features()
    return [*(["avx512"] if cpu.get("avx512bw") and cpu.get("vpclmulqdq") else []), "blocks", "off"]


@contextmanager
def _fused(mode: str, stream: bool) -> Iterator[None]:
    native = _native()
    prev, prev_min = native.set_fused(mode), native.set_stream_min(0 if stream else 1 << 62)
    try:
        yield
    finally:
        native.set_fused(prev)
        native.set_stream_min(prev_min)


def fused(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """One version-2 frame (8 or 16 bits most often, else 1..16; 0 to 70,000 ids) decoded into
    ``out`` (uint8, int8, uint16, int16, int32, uint32, int64; contiguous or strided; at any
    element offset), intact or damaged (a byte changed anywhere, cut, extended, a wrong tag),
    with the numpy twin and with the compiled kernels in every ``set_fused`` mode, plain and
    non-temporal stores: every path raises the same error class, every compiled mode leaves
    the same ``out`` bytes; an intact frame gives its ids; a failed frame leaves ``out`` all
    missing marker (-1 cast to its dtype) or untouched (the codec contract: the numpy twin and
    the unfused widths check first, the fused copies mark), never unchecked ids; nothing is
    written outside ``out`` or between its strided elements."""
    run = _Run("fused", seed, cases, seconds)
    rng = run.rng
    paths = [("numpy", "off", False)] + [("native", m, st) for m in fused_modes() for st in (False, True)]
    names = ("uint8", "int8", "uint16", "int16", "int32", "uint32", "int64")
    for _ in run:
        bits = int(rng.choice([8, 8, 16, 16, int(rng.integers(1, 17))]))
        n = int(rng.choice([int(rng.integers(0, 300)), int(rng.integers(0, 5000)), int(rng.integers(0, 70000))]))
        codec = BitpackCodec(bits=bits, frame_version=2)
        ids = rng.integers(0, 1 << bits, n)
        tag = int(rng.integers(0, 1 << 32))
        frame = codec.encode(ids, tag=tag)
        fault = str(rng.choice(["none", "byte", "byte", "payload", "cut", "extend", "tag"]))
        bad, use_tag = bytearray(frame), tag
        if fault == "byte":
            bad[int(rng.integers(len(bad)))] ^= int(rng.integers(1, 256))
        elif fault == "payload" and len(bad) > 24:
            bad[int(rng.integers(24, len(bad)))] ^= 1 << int(rng.integers(8))
        elif fault == "cut":
            bad = bad[: int(rng.integers(len(bad)))]
        elif fault == "extend":
            bad += bytes(int(rng.integers(1, 9)))
        elif fault == "tag":
            use_tag = tag ^ (1 << int(rng.integers(32)))
        fits = [d for d in names if np.iinfo(d).max >= (1 << bits) - 1]
        dtype = np.dtype(str(rng.choice(fits)))
        stride, offset = int(rng.choice([1, 1, 1, 2, 3])), int(rng.integers(0, 9))
        outcomes: dict[str, tuple[str, bytes]] = {}
        for impl, mode, stream in paths:
            room = np.full(offset + n * stride + 3, 7, dtype)
            out = room[offset : offset + n * stride : stride]
            with kernels.use(impl), (_fused(mode, stream) if impl == "native" else nullcontext()):
                try:
                    codec.decode(bytes(bad), out=out, tag=use_tag)
                    said = "ok"
                except ChecksumError:
                    said = "ChecksumError"
                except FormatError:
                    said = "FormatError"
                except Exception as exc:  # noqa: BLE001 - the oracle
                    said = f"{type(exc).__name__} outside r3store.errors: {exc}"
            label = f"{impl}/{mode}/{'stream' if stream else 'plain'}"
            outcomes[label] = (said, room.tobytes())
            room_ok = (room[:offset] == 7).all() and (room[offset + n * stride :] == 7).all() and (
                stride == 1 or (np.delete(room[offset : offset + n * stride], np.s_[::stride]) == 7).all())
            marker, untouched = bool((out == np.array(-1).astype(dtype)).all()), bool((out == 7).all())
            ok = {"ok": bool(np.array_equal(out, ids.astype(dtype))), "ChecksumError": marker or untouched,
                  "FormatError": marker or untouched}.get(said, False)
            run.check(bool(room_ok) and ok and (said != "ok" or fault == "none" or bytes(bad) == frame),
                      lambda lb=label, sd=said, ro=room_ok: f"{lb}: {fault} fault, {bits} bits, {n} ids into "
                                                            f"{dtype} stride {stride}: {sd}, outside out "
                                                            f"{'intact' if ro else 'written'}")
        first = outcomes[next(k for k in outcomes if k.startswith("native/"))] if len(paths) > 1 else None
        run.check(all(v[0] == first[0] and (k.startswith("numpy/") or v == first) for k, v in outcomes.items())
                  if first else True,
                  lambda: f"paths disagree: {fault} fault, {bits} bits, {n} ids into {dtype} stride {stride}: "
                          + ", ".join(f"{k} {v[0]}" for k, v in outcomes.items()))
        run.counts[fault] = run.counts.get(fault, 0) + 1
        if rng.random() < 0.3:
            _fused_runs(run, rng, paths)
    return run.report()


def _fused_runs(run: _Run, rng: np.random.Generator, paths: list[tuple[str, str, bool]]) -> None:
    """``decode_frames`` of 1..4 frames whose chunks cover every layer (each place one run of
    ``out``: the fused copy), one byte of one frame changed: every path returns the same first
    bad frame and leaves the same ``out`` bytes (the numpy twin included); the frames before it
    hold their ids, its place all marker or untouched, the places after it untouched."""
    bits = int(rng.choice([8, 16, int(rng.integers(1, 17))]))
    cr, lpc, top_k = int(rng.integers(1, 300)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
    nf = int(rng.integers(1, 5))
    codec = BitpackCodec(bits=bits, frame_version=2)
    blob, starts, lengths, chunks = b"", [], [], []
    for f in range(nf):
        ids = rng.integers(0, 1 << bits, (cr, lpc, top_k))
        frame = codec.encode(ids, tag=position_tag("w-00007", f, 0))
        starts.append(len(blob))
        lengths.append(len(frame))
        blob += frame
        chunks.append(ids)
    bad = np.frombuffer(blob, np.uint8).copy()
    f = int(rng.integers(nf))
    bad[starts[f] + int(rng.integers(lengths[f]))] ^= np.uint8(int(rng.integers(1, 256)))
    fits = [d for d in ("uint8", "int8", "uint16", "int16", "int32", "uint32") if np.iinfo(d).max >= (1 << bits) - 1]
    dtype = np.dtype(str(rng.choice(fits)))
    got: dict[str, tuple[object, bytes]] = {}
    for impl, mode, stream in paths:
        out = np.full((nf * cr, lpc, top_k), 77, dtype)
        with kernels.use(impl), (_fused(mode, stream) if impl == "native" else nullcontext()):
            try:
                rc: object = kernels.decode_frames(
                    bad, np.array(starts, np.int64), np.array(lengths, np.int64), bits, out,
                    np.arange(nf, dtype=np.int64) * cr, np.zeros(nf, np.int64), chunk_rows=cr,
                    layers_per_chunk=lpc, tag_prefix="w-00007", row_chunks=np.arange(nf, dtype=np.int64),
                    layer_chunks=np.zeros(nf, np.int64))
            except Exception as exc:  # noqa: BLE001 - the oracle
                rc = f"{type(exc).__name__}: {exc}"
        label = f"{impl}/{mode}/{'stream' if stream else 'plain'}"
        got[label] = (rc, out.tobytes())
        ok = isinstance(rc, int) and 0 <= rc <= f
        if ok:
            assert isinstance(rc, int)
            place = out[rc * cr : (rc + 1) * cr]
            ok = all(np.array_equal(out[g * cr : (g + 1) * cr], chunks[g].astype(dtype)) for g in range(rc)) \
                and bool((place == 77).all() or (place == np.array(-1).astype(dtype)).all()) \
                and bool((out[(rc + 1) * cr :] == 77).all())
        run.check(ok, lambda lb=label, r=rc: f"decode_frames {lb}: byte of frame {f} of {nf} changed ({bits} bits, "
                                             f"chunk {cr}x{lpc}x{top_k}, {dtype}): rc {r} or out wrong")
    first = next(iter(got.values()))
    run.check(all(v == first for v in got.values()),
              lambda: f"decode_frames paths disagree ({bits} bits, chunk {cr}x{lpc}x{top_k}, {dtype}, frame {f} "
                      f"of {nf} changed): " + ", ".join(f"{k} rc {v[0]}" for k, v in got.items()))
    run.counts["frames"] = run.counts.get("frames", 0) + 1


SET_EXPERTS = (1, 2, 3, 7, 8, 9, 16, 31, 32, 33, 64, 100, 128, 160, 255, 256, 257, 384, 511, 512, 1000, 1023, 1024)


def _set_ids(rng: np.random.Generator, shape: tuple[int, int, int], experts: int) -> np.ndarray:
    """Chunk ids for the set codec: mostly sets of distinct ids, some all-zero rows, some
    exception rows (an id repeated, or one in ``[experts, 2**bits)``), sometimes a zero tail."""
    cr, lpc, k = shape
    bits = max(1, (experts - 1).bit_length())
    ids = np.stack([rng.permutation(experts)[:k] for _ in range(cr * lpc)]).reshape(shape).astype(np.int64)
    rows = ids.reshape(-1, k)
    for r in range(len(rows)):
        u = rng.random()
        if u < 0.08:
            rows[r] = 0
        elif u < 0.14 and k > 1:
            rows[r, int(rng.integers(1, k))] = rows[r, 0]  # an id repeated
        elif u < 0.18 and (1 << bits) > experts:
            rows[r, int(rng.integers(0, k))] = int(rng.integers(experts, 1 << bits))  # past num_experts
    if rng.random() < 0.2:
        ids.reshape(-1)[-int(rng.integers(1, ids.size + 1)):] = 0
    return ids


def _set_expected(ids: np.ndarray, experts: int) -> np.ndarray:
    """What the set codec decodes ``ids`` to: each row of distinct ids below ``experts`` sorted."""
    k = ids.shape[-1]
    rows = ids.reshape(-1, k).copy()
    for r in range(len(rows)):
        row = rows[r]
        if len(set(row.tolist())) == k and int(row.max()) < experts:
            rows[r] = np.sort(row)
    return rows.reshape(ids.shape)


def set_frames(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``SetCodec.decode_frames`` (the C ``set_decode_frames``, and the frame-by-frame twin) of
    runs of set frames (exception rows, zero rows, zero tails, gaps between frames): both equal
    the expected sets; one changed byte of one frame is reported at that frame or before on
    both, and :meth:`SetCodec.decode` of the reported frame raises; frames decoded with the
    codec of another table (experts or top-k) are refused at frame 0; places, lengths and
    output rows/layers pushed past their bounds give the same result and ``out`` bytes on
    both, nothing written outside ``out``."""
    from r3store.codecs import SetCodec

    run = _Run("set_frames", seed, cases, seconds)
    rng = run.rng
    impls = ["numpy", "native"]
    for _ in run:
        experts = int(rng.choice(SET_EXPERTS)) if rng.random() < 0.7 else int(rng.integers(1, 1025))
        k = int(rng.integers(1, min(16, experts) + 1))
        cr, lpc = int(rng.integers(1, 40)), int(rng.integers(1, 4))
        nrc, nlc = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        codec = SetCodec(experts, k)
        chunks = [(r, b) for r in range(nrc) for b in range(nlc)]
        rng.shuffle(chunks)
        chunks = chunks[: int(rng.integers(1, len(chunks) + 1))]
        gap = int(rng.integers(0, 9))
        cols: dict[str, list[int]] = {c: [] for c in ("starts", "lengths", "rows", "layers", "rc", "lc")}
        pieces, want, pos = [], [], gap
        for i, (r, b) in enumerate(chunks):
            ids = _set_ids(rng, (cr, lpc, k), experts)
            frame = codec.encode(ids, tag=position_tag("s-00003", r, b))
            for c, v in zip(cols, (pos, len(frame), i * cr, b * lpc, r, b), strict=True):
                cols[c].append(v)
            want.append((i * cr, b * lpc, _set_expected(ids, experts)))
            pieces += [np.frombuffer(frame, np.uint8), rng.integers(0, 256, gap, dtype=np.uint8)]
            pos += len(frame) + gap
        blob = np.concatenate([rng.integers(0, 256, gap, dtype=np.uint8), *pieces])
        a = {c: np.array(v, np.int64) for c, v in cols.items()}
        bits = max(1, (experts - 1).bit_length())
        dtype = np.dtype([np.uint8, np.uint16, np.int16, np.int32][int(rng.integers(0, 4))])
        if np.iinfo(dtype).max < (1 << bits) - 1:
            dtype = np.dtype(np.int32)
        expect = np.full((len(chunks) * cr + 2, nlc * lpc, k), 77, dtype)
        for row, layer, ids in want:
            expect[row : row + cr, layer : layer + lpc] = ids

        def decode(data: np.ndarray, out: np.ndarray, codec: SetCodec = codec, args: dict[str, np.ndarray] = a,
                   cr: int = cr, lpc: int = lpc) -> object:
            try:
                return codec.decode_frames(data, args["starts"], args["lengths"], out, args["rows"], args["layers"],
                                           chunk_rows=cr, layers_per_chunk=lpc, tag_prefix="s-00003",
                                           row_chunks=args["rc"], layer_chunks=args["lc"])
            except CodecError:
                return "CodecError"
            except Exception as exc:  # noqa: BLE001 - the oracle
                return f"{type(exc).__name__}: {exc}"

        geometry = f"{len(chunks)} frames, E={experts} k={k}, chunk {cr}x{lpc}, out {dtype}"
        for impl in impls:
            with kernels.use(impl):
                out = np.full_like(expect, 77)
                rc = decode(blob, out)
            run.check(rc == -1 and np.array_equal(out, expect),
                      lambda i=impl, r=rc: f"{i}: {geometry}: rc {r}, out differs {not np.array_equal(out, expect)}")
        # one changed byte anywhere in one frame
        f = int(rng.integers(0, len(chunks)))
        where = int(a["starts"][f] + rng.integers(0, a["lengths"][f]))
        bad = blob.copy()
        bad[where] ^= np.uint8(int(rng.integers(1, 256)))
        for impl in impls:
            with kernels.use(impl):
                rc = decode(bad, np.full_like(expect, 77))
            run.check(isinstance(rc, int) and 0 <= rc <= f,
                      lambda i=impl, r=rc: f"{i}: {geometry}: byte {where - a['starts'][f]} of frame {f} "
                                           f"({a['lengths'][f]} bytes) changed: rc {r}")
            if isinstance(rc, int) and 0 <= rc <= f:
                frame = bad[a["starts"][rc] : a["starts"][rc] + a["lengths"][rc]].tobytes()
                try:
                    codec.decode(frame, tag=position_tag("s-00003", int(a["rc"][rc]), int(a["lc"][rc])))
                    named = "decoded"
                except (ChecksumError, FormatError):
                    named = "refused"
                run.check(named == "refused", lambda i=impl, r=rc: f"{i}: {geometry}: frame {r} reported, decodes")
        # the codec of another table
        other_e = int(rng.choice([e for e in SET_EXPERTS if e >= k and e != experts] or [experts]))
        other = SetCodec(other_e, k) if other_e != experts else (SetCodec(experts, k - 1) if k > 1 else None)
        if other is not None:
            for impl in impls:
                with kernels.use(impl):
                    out = np.full((len(chunks) * cr + 2, nlc * lpc, other.top_k), 77, np.int32)
                    rc = decode(blob, out, codec=other)
                run.check(rc in (0, "CodecError"), lambda i=impl, r=rc, o=other: f"{i}: {geometry}: frames read "
                                                                                f"with {o.get_config()}: rc {r}")
        # places, lengths, output rows and layers past their bounds
        rows_out = int(rng.integers(0, cr * len(chunks) + 4))
        layers_out = int(rng.integers(lpc, nlc * lpc + 2))
        args = {"starts": _perturb(rng, a["starts"].tolist(), 0, blob.size),
                "lengths": _perturb(rng, a["lengths"].tolist(), 0, blob.size),
                "rows": _perturb(rng, rng.integers(0, max(rows_out, 1), len(chunks)).tolist(), 0, rows_out),
                "layers": _perturb(rng, rng.integers(0, layers_out, len(chunks)).tolist(), 0, layers_out),
                "rc": a["rc"], "lc": a["lc"]}
        results = {}
        edge = layers_out * k
        for impl in impls:
            room = np.full((rows_out + 2) * layers_out * k, 7, dtype)
            out = room[edge:-edge].reshape(rows_out, layers_out, k)
            with kernels.use(impl):
                rc = decode(blob, out, args=args)
            results[impl] = (rc, room)
            run.check((room[:edge] == 7).all() and (room[-edge:] == 7).all(),
                      lambda i=impl: f"{i}: {geometry}: decode_frames wrote outside out ({args})")
        (rc_a, out_a), (rc_b, out_b) = results["numpy"], results["native"]
        run.check(rc_a == rc_b and np.array_equal(out_a, out_b),
                  lambda: f"{geometry}: numpy {rc_a} vs native {rc_b}, out equal {np.array_equal(out_a, out_b)}: "
                          f"{ {c: v.tolist() for c, v in args.items()} }, out rows {rows_out}, layers {layers_out}")
    return run.report()


FRAMEWORKS = (None, None, None, "megatron", "verl", "slime", "miles", "nemo_rl", "skyrl", "prime_rl")
HOSTILE_SIZES = (0, -1, -(1 << 40), 1 << 31, (1 << 31) + 1, 1 << 62, True, False, 1.0, 2.5, "2", None, np.int64(2),
                 np.uint8(3), float("nan"), [2])


@contextmanager
def _gather(on: bool) -> Iterator[None]:
    native = _native()
    prev = native.setcodec_gather_decode(on)
    try:
        yield
    finally:
        native.setcodec_gather_decode(prev)


def set_ranges(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``SetCodec.decode_frames`` with random row ranges (``row_first``/``row_count``) of
    runs of set frames (exception rows, zero rows, 1..1,024 experts, chunks up to 300 rows to
    skip several blocks of digits): the numpy twin and the compiled kernels on every set path
    (portable, AVX2, AVX-512) with the gather decoder (``setcodec_gather_decode``) off and on
    give the rows of each range; after one changed byte of one frame every compiled path
    reports the same frame (at or before the changed one, the twin too) and leaves the same
    ``out`` bytes."""
    from r3store.codecs import SetCodec

    run = _Run("set_ranges", seed, cases, seconds)
    rng = run.rng
    native = _native()
    paths = [("numpy", False)] + [(p, g) for p in set_paths()
                                  for g in ((False, True) if hasattr(native, "setcodec_gather_decode") else (False,))]
    for _ in run:
        experts = int(rng.choice(SET_EXPERTS)) if rng.random() < 0.7 else int(rng.integers(1, 1025))
        k = int(rng.integers(1, min(16, experts) + 1))
        cr = int(rng.choice([int(rng.integers(1, 40)), int(rng.integers(1, 300))]))
        lpc, nrc, nlc = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        codec = SetCodec(experts, k)
        chunks = [(r, b) for r in range(nrc) for b in range(nlc)]
        rng.shuffle(chunks)
        chunks = chunks[: int(rng.integers(1, len(chunks) + 1))]
        gap = int(rng.integers(0, 9))
        cols: dict[str, list[int]] = {c: [] for c in ("starts", "lengths", "rows", "layers", "rc", "lc", "first",
                                                      "count")}
        pieces, want, pos, out_row = [], [], gap, 0
        for r, b in chunks:
            ids = _set_ids(rng, (cr, lpc, k), experts)
            frame = codec.encode(ids, tag=position_tag("s-00003", r, b))
            first = int(rng.integers(0, cr))
            count = int(rng.integers(1, cr - first + 1))
            for c, v in zip(cols, (pos, len(frame), out_row, b * lpc, r, b, first, count), strict=True):
                cols[c].append(v)
            want.append((out_row, b * lpc, _set_expected(ids, experts)[first : first + count]))
            pieces += [np.frombuffer(frame, np.uint8), rng.integers(0, 256, gap, dtype=np.uint8)]
            pos += len(frame) + gap
            out_row += count
        blob = np.concatenate([rng.integers(0, 256, gap, dtype=np.uint8), *pieces])
        a = {c: np.array(v, np.int64) for c, v in cols.items()}
        bits = max(1, (experts - 1).bit_length())
        dtype = np.dtype([np.uint8, np.uint16, np.int16, np.int32][int(rng.integers(0, 4))])
        if np.iinfo(dtype).max < (1 << bits) - 1:
            dtype = np.dtype(np.int32)
        expect = np.full((out_row + 2, nlc * lpc, k), 77, dtype)
        for row, layer, ids in want:
            expect[row : row + len(ids), layer : layer + lpc] = ids
        geometry = f"{len(chunks)} frames, E={experts} k={k}, chunk {cr}x{lpc}, out {dtype}, ranges " \
                   f"{list(zip(cols['first'], cols['count'], strict=True))}"

        def decode(data: np.ndarray, path: str, gather: bool, codec: SetCodec = codec,
                   args: dict[str, np.ndarray] = a, cr: int = cr, lpc: int = lpc) -> tuple[object, np.ndarray]:
            out = np.full_like(expect, 77)
            ctx = kernels.use("numpy") if path == "numpy" else _set_path(path)
            with ctx, (nullcontext() if path == "numpy" else _gather(gather)):
                try:
                    rc: object = codec.decode_frames(
                        data, args["starts"], args["lengths"], out, args["rows"], args["layers"], chunk_rows=cr,
                        layers_per_chunk=lpc, tag_prefix="s-00003", row_chunks=args["rc"], layer_chunks=args["lc"],
                        row_first=args["first"], row_count=args["count"])
                except CodecError:
                    rc = "CodecError"
                except Exception as exc:  # noqa: BLE001 - the oracle
                    rc = f"{type(exc).__name__}: {exc}"
            return rc, out

        for path, gather in paths:
            rc, out = decode(blob, path, gather)
            run.check(rc == -1 and np.array_equal(out, expect),
                      lambda p=path, g=gather, r=rc, o=out: f"{p} gather={g}: {geometry}: rc {r}, "
                                                             f"out differs {not np.array_equal(o, expect)}")
        f = int(rng.integers(0, len(chunks)))
        where = int(a["starts"][f] + rng.integers(0, a["lengths"][f]))
        bad = blob.copy()
        bad[where] ^= np.uint8(int(rng.integers(1, 256)))
        results = {(p, g): decode(bad, p, g) for p, g in paths}
        for (p, g), (rc, _) in results.items():
            run.check(isinstance(rc, int) and 0 <= rc <= f,
                      lambda p=p, g=g, r=rc: f"{p} gather={g}: {geometry}: byte {where - a['starts'][f]} of frame "
                                             f"{f} changed: rc {r}")
        compiled = [v for (p, _), v in results.items() if p != "numpy"]
        run.check(all(v[0] == compiled[0][0] and np.array_equal(v[1], compiled[0][1]) for v in compiled),
                  lambda: f"compiled paths disagree after byte {where - a['starts'][f]} of frame {f} changed: "
                          f"{geometry}: " + ", ".join(f"{k}: rc {v[0]}" for k, v in results.items()))
    return run.report()


def layout(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``plan_layout`` over every CP rank and (with sequence parallel) every TP rank of random
    micro-batches, sizes that do not divide the lengths, every layout and framework: each
    token of the concatenated order lands on exactly one rank (once, in one place), pads are
    -1, ``route_index`` maps each landed token to its route row (none for a sample's last
    token), and ``cu_seqlens`` start at 0 and do not decrease; hostile option values
    (0, negative, past 2**31, bool, float, str, None where an int is due, a rank past its
    size) and token counts (0, negative, empty, float, 2-D) raise ``LayoutOptionError``."""
    from r3store.errors import LayoutOptionError
    from r3store.layout import LayoutOptions, plan_layout, route_index

    run = _Run("layout", seed, cases, seconds)
    rng = run.rng
    for _ in run:
        b = int(rng.integers(1, 9))
        seqlens = rng.integers(1, int(rng.choice([3, 20, 200])), b).tolist()
        fw = FRAMEWORKS[int(rng.integers(0, len(FRAMEWORKS)))]
        cp, tp = int(rng.choice([1, 1, 2, 3, 4, 8])), int(rng.choice([1, 1, 2, 3, 4]))
        kw: dict[str, Any] = {"layout": str(rng.choice(["thd", "thd", "bshd", "sbhd"])), "cp_size": cp, "tp_size": tp,
                              "cp_mode": str(rng.choice(["zigzag", "contiguous"])),
                              "sequence_parallel": bool(tp > 1 and rng.random() < 0.5), "framework": fw}
        if rng.random() < 0.3:
            kw["pad_multiple"] = int(rng.choice([1, 3, 8, 128]))
        if kw["layout"] != "thd" and rng.random() < 0.3:
            kw["max_seqlen"] = int(max(seqlens) + rng.integers(0, 9))
        try:
            LayoutOptions(**kw)
            plan_layout(seqlens, **kw)
        except LayoutOptionError:
            run.counts["refused_options"] = run.counts.get("refused_options", 0) + 1
            continue  # a framework that does not take this layout or CP mode
        except Exception as exc:  # noqa: BLE001 - the oracle
            run.check(False, lambda e=exc: f"plan_layout({seqlens}, {kw}): {type(e).__name__}: {e}")
            continue
        total = sum(seqlens)
        seen = np.zeros(total, np.int64)
        for cp_rank in range(cp):
            for tp_rank in range(tp if kw["sequence_parallel"] else 1):
                plan = plan_layout(seqlens, **kw, cp_rank=cp_rank, tp_rank=tp_rank)
                idx = plan.index
                run.check(bool(((idx >= -1) & (idx < total)).all()),
                          lambda: f"{seqlens} {kw}: index outside [-1, {total})")
                np.add.at(seen, idx[idx >= 0], 1)
                rows = route_index(plan)
                want_rows = np.where(idx >= 0, 0, -1)
                landed = idx[idx >= 0]
                sample = np.searchsorted(np.cumsum(seqlens), landed, side="right")
                last = landed == np.cumsum(seqlens)[sample] - 1
                expect = np.where(last, -1, landed - sample)
                want_rows = want_rows.astype(np.int64)
                want_rows[idx >= 0] = expect
                run.check(np.array_equal(rows, want_rows), lambda: f"{seqlens} {kw}: route_index differs")
                cu = plan.cu_seqlens.astype(np.int64)
                run.check(cu.size >= 2 and cu[0] == 0 and bool((np.diff(cu) >= 0).all()),
                          lambda c=cu: f"{seqlens} {kw}: cu_seqlens {c.tolist()[:10]}")
        run.check(bool((seen == 1).all()), lambda: f"{seqlens} {kw} (every rank): tokens landing "
                                                   f"{sorted(set(seen.tolist()))} times, not once each")
        # hostile values: an option or the token counts
        field_name = str(rng.choice(["cp_size", "cp_rank", "tp_size", "tp_rank", "pad_multiple", "max_seqlen",
                                     "fill_value", "ep_size", "layout", "framework", "cp_mode", "num_tokens"]))
        value = HOSTILE_SIZES[int(rng.integers(0, len(HOSTILE_SIZES)))]
        if field_name == "cp_rank":
            value = cp if rng.random() < 0.5 else value
        if field_name == "max_seqlen" and isinstance(value, int) and 1 << 31 <= value <= 1 << 40:
            value = 0  # allowed: up to MAX_LOCAL_LENGTH positions per rank (16 GiB of index), as documented
        tokens: Any = seqlens
        bad_kw = dict(kw)
        if field_name == "num_tokens":
            tokens = [[], [0], [-1], [1.5], [[3, 4]], [2**41], np.array([3, 0]), "34", None][int(rng.integers(0, 9))]
        else:
            bad_kw[field_name] = value
        try:
            plan_layout(tokens, **bad_kw)
            outcome_ = "accepted"
        except (LayoutOptionError, OptionError):
            outcome_ = "refused"
        except Exception as exc:  # noqa: BLE001 - the oracle
            outcome_ = f"{type(exc).__name__}: {exc}"
        run.check(outcome_ in ("accepted", "refused"),
                  lambda o=outcome_: f"plan_layout({tokens!r}, {field_name}={value!r}, {kw}): {o}")
    return run.report()


def guarded(nbytes: int, *, at_end: bool = True) -> tuple[np.ndarray, mmap.mmap]:
    """A writable uint8 array of ``nbytes`` whose last byte lies just before a page that may
    not be read (``at_end``), or whose first byte lies just after one: a kernel reading one
    byte outside it dies of SIGSEGV. Linux/POSIX (``mprotect``); keep the mmap alive."""
    page = mmap.PAGESIZE
    pages = (nbytes + page - 1) // page + 1
    m = mmap.mmap(-1, pages * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    guard = base + (pages - 1) * page if at_end else base
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(ctypes.c_void_p(guard), ctypes.c_size_t(page), 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    offset = (pages - 1) * page - nbytes if at_end else page
    return np.frombuffer(m, np.uint8, count=nbytes, offset=offset), m


def overread(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """Kernel inputs that end just before (or start just after) a page that may not be read:
    ``unpack`` in every mode and output width, ``crc32c`` on every path, ``check_frame`` and
    ``decode_frames`` (with row ranges) of a blob whose last frame ends at the page. A load
    past the input (a 32-byte or masked AVX-512 load, a 512-bit fold) kills the process."""
    run = _Run("overread", seed, cases, seconds)
    rng = run.rng
    native = _native()
    modes, paths = unpack_modes()[1:], crc_paths()
    maps: list[mmap.mmap] = []
    for case in run:
        at_end = case % 4 != 3
        bits = int(rng.integers(1, 17))
        n = int(rng.integers(0, 70)) if rng.random() < 0.5 else int(rng.integers(0, 5000))
        ids = rng.integers(0, 1 << bits, n)
        packed = kernels.pack_bits(ids, bits) if n else np.zeros(0, np.uint8)
        buf, m = guarded(len(packed), at_end=at_end)
        maps.append(m)
        buf[:] = packed
        for mode in modes:
            with _unpack_mode(mode):
                for dtype in (np.uint8, np.uint16, np.int32):
                    out = np.zeros(n, dtype)
                    native.unpack(buf, 0, n, bits, out)
                    run.check(np.array_equal(out, ids.astype(dtype)),
                              lambda m=mode, d=dtype: f"{m}: unpack of {n} ids of {bits} bits into {d}")
        for path in paths:
            with crc_path(path):
                run.check(int(native.crc32c(buf)) == int(google_crc32c.value(packed.tobytes())),
                          lambda p=path: f"{p}: crc32c of {len(packed)} bytes at a page edge")
        # a blob of frames, the last one ending at the page
        cr, top_k = int(rng.integers(1, 65)), int(rng.integers(1, 9))
        codec = BitpackCodec(bits=bits, frame_version=2)
        chunks = [rng.integers(0, 1 << bits, (cr, 1, top_k)) for _ in range(int(rng.integers(1, 4)))]
        frames_ = [codec.encode(c, tag=position_tag("w-00007", r, 0)) for r, c in enumerate(chunks)]
        blob, m2 = guarded(sum(len(f) for f in frames_), at_end=at_end)
        maps.append(m2)
        blob[:] = np.frombuffer(b"".join(frames_), np.uint8)
        lengths = np.array([len(f) for f in frames_], np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        run.check(int(native.check_frame(blob[starts[-1] :], bits)[0]) == 0, lambda: "check_frame at a page edge")
        first = rng.integers(0, cr, len(chunks))
        count = np.array([int(rng.integers(1, cr - f + 1)) for f in first], np.int64)
        rows = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        out = np.zeros((int(count.sum()), 1, top_k), np.int32)
        rc = kernels.decode_frames(blob, starts, lengths, bits, out, rows, np.zeros(len(chunks), np.int64),
                                   chunk_rows=cr, layers_per_chunk=1, tag_prefix="w-00007",
                                   row_chunks=np.arange(len(chunks)), layer_chunks=np.zeros(len(chunks), np.int64),
                                   row_first=first.astype(np.int64), row_count=count)
        want = np.concatenate([c[f : f + k] for c, f, k in zip(chunks, first, count, strict=True)])
        run.check(rc == -1 and np.array_equal(out, want), lambda: f"decode_frames at a page edge: rc {rc}")
        del buf, blob
        if len(maps) > 64:
            maps = maps[-64:]  # older maps are unmapped once nothing views them
    return run.report()


# -- reads -------------------------------------------------------------------------------


def _routes(rng: np.random.Generator, rows: int, layers: int, experts: int, top_k: int) -> np.ndarray:
    if experts > 1024:  # ids b, b + s, b + 2s, ... mod experts: distinct while (top_k - 1) * s < experts
        step = rng.integers(1, experts // top_k + 1, (rows, layers, 1))
        first = rng.integers(0, experts, (rows, layers, 1))
        return ((first + step * np.arange(top_k)) % experts).astype(np.int32)
    keys = rng.random((rows, layers, experts))
    return np.argpartition(keys, top_k - 1, axis=-1)[..., :top_k].astype(np.int32) if top_k < experts else \
        np.argsort(keys, axis=-1).astype(np.int32)


def _random_store(rng: np.random.Generator, root: Path, max_rows: int, set_share: float = 0.0,
                  missing_share: float = 0.3) -> tuple[r3store.ModelSpec, dict[str, Any]]:
    experts = int(rng.choice([2, 3, 8, 40, 64, 128, 257, 1024, 4096, 65536]))
    top_k = int(rng.integers(1, min(experts, 8) + 1))
    layers = int(rng.integers(1, 6))
    spec = r3store.ModelSpec(num_layers=layers, num_experts=experts, top_k=top_k)
    lpc = int(rng.choice([d for d in range(1, layers + 1) if layers % d == 0]))
    config = {"chunk_rows": int(rng.choice([1, 2, 3, 7, 16, 64, 100, 128])), "layers_per_chunk": lpc,
              "object_bytes": int(rng.choice([1 << 10, 1 << 14, 1 << 25])),
              "codec": "set" if experts <= 1024 and rng.random() < set_share else "bitpack"}
    samples: dict[str, Any] = {}
    with r3store.RouteWriter(root, spec, config=config) as w:
        for i in range(int(rng.integers(1, 7))):
            rows = int(rng.integers(1, max_rows + 1)) if rng.random() < 0.8 else int(rng.integers(1, 4))
            routes = _routes(rng, rows, layers, experts, top_k)
            sid = f"s{i}"
            if rows > 2 and rng.random() < missing_share:
                a = int(rng.integers(0, rows - 1))
                routes[a : int(rng.integers(a + 1, rows))] = -1  # rows the engine could not capture
                w.append(sid, routes, allow_missing=True)
            else:
                w.append(sid, routes)
            samples[sid] = np.sort(routes, axis=-1) if config["codec"] == "set" else routes  # set: ids sorted
            if rng.random() < 0.3:
                w.flush()
    return spec, samples


def assemble(seed: int = 0, cases: int | None = None, seconds: float | None = None, max_rows: int = 300) -> Report:
    """``assemble`` of random stores (bitpack or, half of the time where it applies, the set codec;
    rows the engine could not capture) for every CP rank and, with sequence parallel, every TP
    rank, in random layouts, frameworks, route dtypes, pad policies and layer subsets: every
    position ``route_index`` gives a route row holds exactly that row's ids (of the layers
    asked for) with ``replay_mask`` True, every other position has ``replay_mask`` False."""
    from r3store.errors import LayoutOptionError
    from r3store.layout import plan_layout, route_index

    run = _Run("assemble", seed, cases, seconds)
    rng = run.rng
    for _ in run:
        root = Path(tempfile.mkdtemp(prefix="r3-fuzz-asm-"))
        try:
            spec, samples = _random_store(rng, root, max_rows, set_share=0.5)
            store = r3store.open_store(root)
            ids = [str(v) for v in rng.permutation(sorted(samples))[: int(rng.integers(1, len(samples) + 1))]]
            cp, tp = int(rng.choice([1, 1, 2, 3, 4])), int(rng.choice([1, 1, 2, 4]))
            opts: dict[str, Any] = {"layout": str(rng.choice(["thd", "thd", "bshd", "sbhd"])), "cp_size": cp,
                                    "tp_size": tp, "cp_mode": str(rng.choice(["zigzag", "contiguous"])),
                                    "sequence_parallel": bool(tp > 1 and rng.random() < 0.5),
                                    "framework": FRAMEWORKS[int(rng.integers(0, len(FRAMEWORKS)))],
                                    "dtype": str(rng.choice(["int32", "auto", "int16"])) if spec.num_experts <= 32767
                                    else "int32", "pad_policy": str(rng.choice(["spread", "fill"]))}
            keep = sorted(int(v) for v in rng.choice(spec.num_layers, int(rng.integers(1, spec.num_layers + 1)),
                                                     replace=False))
            layers = keep if rng.random() < 0.5 else None
            sel = keep if layers is not None else list(range(spec.num_layers))
            num_tokens = [samples[i].shape[0] + 1 for i in ids]
            try:
                plan_layout(num_tokens, **opts)
            except LayoutOptionError:
                run.counts["refused_options"] = run.counts.get("refused_options", 0) + 1
                continue
            concat = np.concatenate([samples[i] for i in ids])[:, sel].astype(np.int64)
            present = ~(concat == -1).all(axis=(1, 2))
            for cp_rank in range(cp):
                for tp_rank in range(tp if opts["sequence_parallel"] else 1):
                    rank = {**opts, "cp_rank": cp_rank, "tp_rank": tp_rank}
                    try:
                        batch = store.assemble(ids, rank, layers=layers)
                    except R3StoreError as exc:
                        run.check(False, lambda e=exc, r=rank: f"assemble({ids}, {r}): {type(e).__name__}: {e}")
                        continue
                    ri = route_index(plan_layout(num_tokens, **rank))
                    routes, mask = batch["routes"], batch["replay_mask"]
                    run.check(routes.shape[:-2] == ri.shape and mask.shape == ri.shape,
                              lambda r=rank, b=batch: f"{r}: routes {b['routes'].shape}, index {ri.shape}")
                    if routes.shape[:-2] != ri.shape:
                        continue
                    want_mask = np.where(ri >= 0, present[np.maximum(ri, 0)], False)
                    run.check(np.array_equal(mask, want_mask), lambda r=rank: f"{spec}, {ids}, {r}, layers "
                                                                              f"{layers}: replay_mask differs")
                    got = routes.astype(np.int64)[want_mask]
                    run.check(np.array_equal(got, concat[ri[want_mask]]),
                              lambda r=rank: f"{spec}, {ids}, {r}, layers {layers}: routes differ from the samples")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return run.report()

def assemble_paths(seed: int = 0, cases: int | None = None, seconds: float | None = None,
                   max_rows: int = 300) -> Report:
    """``assemble`` through its run planning in C (``route_runs``: THD and BSHD plans without
    missing rows) against its general path (``route_index``, every row gathered), on random stores,
    batches, layouts, CP/TP/SP ranks, frameworks, pad policies and fill values, dtypes, ``packed``,
    layer subsets, options given as objects and as dicts in turn (the memoised checks): every key of
    the two batches equal, pad rows included; an option one path refuses the other refuses alike."""
    from r3store.batch import _assemble
    from r3store.errors import LayoutOptionError

    run = _Run("assemble_paths", seed, cases, seconds)
    rng = run.rng
    real = _assemble._plan_runs
    planned = [0]

    def counted(plan: Any) -> Any:
        found = real(plan)
        planned[0] += found is not None
        return found
    for _ in run:
        root = Path(tempfile.mkdtemp(prefix="r3-fuzz-asm2-"))
        try:
            spec, samples = _random_store(rng, root, max_rows, set_share=0.3, missing_share=0.05)
            store = r3store.open_store(root)
            ids = [str(v) for v in rng.permutation(sorted(samples))[: int(rng.integers(1, len(samples) + 1))]]
            cp, tp = int(rng.choice([1, 1, 2, 3, 4])), int(rng.choice([1, 1, 2, 4]))
            opts: dict[str, Any] = {"layout": str(rng.choice(["thd", "thd", "bshd", "sbhd"])), "cp_size": cp,
                                    "tp_size": tp, "cp_mode": str(rng.choice(["zigzag", "contiguous"])),
                                    "sequence_parallel": bool(tp > 1 and rng.random() < 0.5),
                                    "framework": FRAMEWORKS[int(rng.integers(0, len(FRAMEWORKS)))],
                                    "dtype": str(rng.choice(["int32", "auto", "int16", "uint8"])),
                                    "pad_policy": str(rng.choice(["spread", "fill", "fill"])),
                                    "fill_value": int(rng.choice([-1, 0, 0, 1, spec.num_experts - 1, 65535])),
                                    "packed": bool(rng.random() < 0.25)}
            if rng.random() < 0.3:
                opts["pad_multiple"] = int(rng.choice([1, 8, 64]))
            layers = sorted(int(v) for v in rng.choice(spec.num_layers, int(rng.integers(1, spec.num_layers + 1)),
                                                       replace=False)) if rng.random() < 0.5 else None
            for cp_rank in range(cp):
                for tp_rank in range(tp if opts["sequence_parallel"] else 1):
                    rank = {**opts, "cp_rank": cp_rank, "tp_rank": tp_rank}
                    try:
                        given: Any = rank if rng.random() < 0.5 else r3store.LayoutOptions.from_dict(rank)
                    except LayoutOptionError:
                        given = rank  # refused by the constructor: assemble must refuse it too
                    results = []
                    for path in ("runs", "general"):
                        _assemble._plan_runs = counted if path == "runs" else lambda plan: None
                        try:
                            results.append(store.assemble(ids, given, layers=layers))
                        except (LayoutOptionError, OptionError) as exc:
                            results.append(outcome_of(exc))
                        except R3StoreError as exc:
                            results.append(outcome_of(exc))
                        finally:
                            _assemble._plan_runs = real
                    a, b = results
                    what = f"{spec}, {ids}, {rank}, layers {layers}"
                    if isinstance(a, str) or isinstance(b, str):
                        run.check(a == b, lambda w=what, a=a, b=b: f"{w}: runs path {_said(a)}, general {_said(b)}")
                        run.counts["refused alike"] = run.counts.get("refused alike", 0) + isinstance(a, str)
                        continue
                    bad = sorted(k for k in set(a) | set(b) if not _same_value(a.get(k), b.get(k)))
                    run.check(not bad, lambda w=what, k=bad: f"{w}: {k} differ between the runs and the general path")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    run.counts["batches through route_runs"] = planned[0]
    return run.report()


def _said(result: Any) -> str:
    return result if isinstance(result, str) else "a batch"


def outcome_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    return bool(a == b)



def _random_read(rng: np.random.Generator, routes: np.ndarray, layers: int) -> tuple[slice | None, list[int] | None]:
    n = routes.shape[0]
    rows = None
    if rng.random() < 0.7:
        a = int(rng.integers(0, n))
        rows = slice(a, int(rng.integers(a + 1, n + 1)))
    lays = None
    if rng.random() < 0.5:
        lays = [int(x) for x in rng.permutation(layers)[: int(rng.integers(1, layers + 1))]]
    return rows, lays


def _expected(routes: np.ndarray, rows: slice | None, lays: list[int] | None) -> np.ndarray:
    part = routes if rows is None else routes[rows]
    return part if lays is None else part[:, lays]


def _check_runs(run: _Run, store: Any, samples: dict[str, np.ndarray], spec: r3store.ModelSpec,
                corrupt: str | None = None) -> None:
    """``get_runs`` of random row ranges of random samples into a random dtype, at random rows."""
    rng = run.rng
    runs, wants = [], []
    for _ in range(int(rng.integers(1, 5))):
        sid = str(rng.choice(list(samples)))
        n = samples[sid].shape[0]
        a = int(rng.integers(0, n))
        b = int(rng.integers(a, n + 1))
        runs.append((sid, a, b))
        wants.append(samples[sid][a:b])
    lays = None if rng.random() < 0.5 else [int(x) for x in rng.permutation(spec.num_layers)[
        : int(rng.integers(1, spec.num_layers + 1))]]
    want = np.concatenate(wants)
    want = np.where(want < 0, 0, want)  # missing rows hold what is stored there (zeros)
    if lays is not None:
        want = want[:, lays]
    dtype = np.uint8 if spec.num_experts <= 256 and rng.random() < 0.4 else \
        np.uint16 if rng.random() < 0.5 else np.int32
    out = np.full(want.shape, 77, dtype)
    try:
        got = store.get_runs(runs, lays, out=out)
    except R3StoreError:
        run.check(corrupt is not None, lambda: f"get_runs({runs}, {lays}) of an intact store raised")
        return
    except Exception as exc:  # noqa: BLE001 - the oracle
        run.check(False, lambda e=exc: f"{corrupt or 'intact'}: get_runs raised {type(e).__name__}: {e}")
        return
    run.check(got is out and np.array_equal(out, want),
              lambda: f"{corrupt or 'intact store'}: get_runs({runs}, {lays}) into {np.dtype(dtype)} differs from "
                      "the written routes")


def reads(seed: int = 0, cases: int | None = None, seconds: float | None = None, max_rows: int = 600) -> Report:
    run = _Run("reads", seed, cases, seconds)
    rng = run.rng
    paths = crc_paths()
    tmp = Path(tempfile.mkdtemp(prefix="r3-fuzz-reads-"))
    try:
        for case in run:
            root = tmp / f"s{case}"
            spec, samples = _random_store(rng, root, max_rows, set_share=0.25)
            store = r3store.open_store(root)
            for _ in range(int(rng.integers(4, 16))):
                sid = str(rng.choice(list(samples)))
                rows, lays = _random_read(rng, samples[sid], spec.num_layers)
                want = _expected(samples[sid], rows, lays)
                out = None
                if rng.random() < 0.3:
                    dtype = np.dtype([np.int32, np.int16, np.int64, ">i4", np.uint8, np.uint16, np.int8][
                        int(rng.integers(0, 7))])
                    pre, post = int(rng.integers(0, 3)), int(rng.integers(0, 3))
                    room = np.full((pre + len(want) + post, *want.shape[1:]), 99, dtype)
                    out = room[pre : pre + len(want)]
                    if dtype.kind != "i" or np.iinfo(dtype).max < spec.num_experts - 1:
                        try:
                            store.get(sid, lays, rows=rows, out=out)
                            outcome = "filled"
                        except OptionError:
                            outcome = "OptionError"
                        run.check(outcome == "OptionError" and (room == 99).all(),
                                  lambda d=dtype, o=outcome: f"get({sid!r}, rows={rows}) into {d} out of a "
                                                             f"{spec.num_experts}-expert store: {o}")
                        continue
                got = store.get(sid, lays, rows=rows, out=out)
                if out is not None:
                    run.check((room[:pre] == 99).all() and (room[pre + len(want) :] == 99).all(),
                              lambda: f"get({sid!r}, rows={rows}, out=) wrote outside out")
                run.check(np.array_equal(got, want) and (out is None or got is out),
                          lambda s=sid, r=rows, la=lays, o=out: f"get({s!r}, {la}, rows={r}, out="
                                                                f"{'given' if o is not None else None}) differs "
                                                                "from the written routes")
                if got.flags.writeable:
                    got[...] = int(rng.integers(-5, 5))  # the caller reuses its result
                if rng.random() < 0.5:  # the same rows, and rows next to them (cached edge chunks)
                    n = samples[sid].shape[0]
                    a, b = (0, n) if rows is None else (rows.start, rows.stop)
                    for again in (slice(a, b), slice(max(0, a - 1), a + 1), slice(b - 1, min(n, b + 1))):
                        same = store.get(sid, lays, rows=again)
                        run.check(np.array_equal(same, _expected(samples[sid], again, lays)),
                                  lambda s=sid, r=again: f"get({s!r}, rows={r}) after the caller wrote into an "
                                                         "earlier result differs from the written routes")
                if rng.random() < 0.5:
                    _check_runs(run, store, samples, spec)
            objects = [p for p in root.rglob("*") if p.is_file() and "/c/" in p.as_posix() and p.stat().st_size]
            if not objects:
                continue
            victim = objects[int(rng.integers(0, len(objects)))]
            data = bytearray(victim.read_bytes())
            where = int(rng.integers(0, len(data)))
            data[where] ^= int(rng.integers(1, 256))
            victim.write_bytes(bytes(data))
            path = paths[int(rng.integers(0, len(paths)))]  # the frame checks run on every CRC path
            name = f"{victim.relative_to(root)} byte {where}, CRC-32C path {path}"
            with crc_path(path):
                store = r3store.open_store(root)
                for _ in range(int(rng.integers(2, 8))):
                    sid = str(rng.choice(list(samples)))
                    rows, lays = _random_read(rng, samples[sid], spec.num_layers)
                    try:
                        got = store.get(sid, lays, rows=rows)
                    except R3StoreError:
                        continue
                    except Exception as exc:  # noqa: BLE001 - the oracle
                        run.check(False, lambda e=exc: f"{name} changed: get raised {type(e).__name__}: {e}")
                        continue
                    run.check(np.array_equal(got, _expected(samples[sid], rows, lays)),
                              lambda s=sid, r=rows, la=lays: f"{name} changed: get({s!r}, {la}, rows={r}) "
                                                             "returned different routes without an error")
                for _ in range(int(rng.integers(0, 3))):
                    _check_runs(run, store, samples, spec, corrupt=name)
                refused = False
                for sid in samples:
                    try:
                        ok = np.array_equal(r3store.open_store(root).get(sid), samples[sid])
                    except R3StoreError:
                        refused = True
                        break
                    except Exception as exc:  # noqa: BLE001 - the oracle
                        run.check(False, lambda e=exc: f"{name} changed: get raised {type(e).__name__}: {e}")
                        refused = True
                        break
                    run.check(ok, lambda s=sid: f"{name} changed: full get({s!r}) differs without an error")
                run.check(refused, lambda: f"{name} changed: every sample read back without an error")
            shutil.rmtree(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return run.report()


# -- writer ------------------------------------------------------------------------------


def _valid_forms(rng: np.random.Generator, routes: np.ndarray) -> list[tuple[str, np.ndarray]]:
    forms = [("int32", routes), ("int64", routes.astype(np.int64)),
             ("big-endian int32", routes.astype(">i4")), ("uint16", routes.astype(np.uint16)),
             ("Fortran order", np.asfortranarray(routes))]
    if routes.max() < 1 << 15:
        forms.append(("big-endian int16", routes.astype(">i2")))
    if routes.max() < 128:
        forms.append(("int8", routes.astype(np.int8)))
    wide = np.empty((routes.shape[0] * 2, *routes.shape[1:]), routes.dtype)
    wide[::2] = routes
    forms.append(("row-strided", wide[::2]))
    rev = routes[::-1].copy()[::-1]
    forms.append(("negative row stride", rev))
    slot_rev = routes[:, :, ::-1].copy()[:, :, ::-1]
    forms.append(("negative slot stride", slot_rev))
    padded = np.zeros((*routes.shape[:2], routes.shape[2] + 3), routes.dtype)
    padded[..., 1 : 1 + routes.shape[2]] = routes
    forms.append(("slot-strided view", padded[..., 1 : 1 + routes.shape[2]]))
    tr = np.ascontiguousarray(routes.transpose(1, 0, 2)).transpose(1, 0, 2)
    forms.append(("layer-major", tr))
    return [forms[int(i)] for i in rng.permutation(len(forms))[: int(rng.integers(2, 5))]]


def _bad_forms(rng: np.random.Generator, routes: np.ndarray, experts: int) -> list[tuple[str, Any]]:
    bad: list[tuple[str, Any]] = []
    r = routes.copy()
    r[int(rng.integers(0, len(r))), int(rng.integers(0, r.shape[1])), int(rng.integers(0, r.shape[2]))] = experts
    bad.append(("id == num_experts", r))
    r = routes.astype(np.int64)
    r[int(rng.integers(0, len(r))), 0, 0] = -2
    bad.append(("negative id", r))
    r = routes.astype(np.int64)
    r[0, 0, 0] = (1 << 32) + int(routes[0, 0, 0])
    bad.append(("id wrapping to a valid one in 32 bits", r))
    if routes.shape[2] > 1:
        r = routes.copy()
        r[-1, -1, 1] = r[-1, -1, 0]
        bad.append(("repeated id", r))
    f = routes.astype(np.float64)
    bad.append(("float ids", f))
    f2 = f.copy()
    f2[0, 0, 0] = np.nan
    bad.append(("NaN", f2))
    bad.append(("bool", routes.astype(bool)))
    bad.append(("timedelta64", routes.astype("m8[s]")))  # an np.integer to numpy
    bad.append(("object", routes.astype(object)))
    bad.append(("2-D", routes[:, 0]))
    bad.append(("extra top_k slot", np.concatenate([routes, routes[..., :1]], axis=2)))
    bad.append(("one layer short", routes[:, 1:] if routes.shape[1] > 1 else routes[:, :0]))
    bad.append(("0 rows", routes[:0]))
    bad.append(("string", "1,2,3"))
    return [bad[int(i)] for i in rng.permutation(len(bad))[: int(rng.integers(3, 7))]]


def writer(seed: int = 0, cases: int | None = None, seconds: float | None = None, max_rows: int = 5000) -> Report:
    run = _Run("writer", seed, cases, seconds)
    rng = run.rng
    tmp = Path(tempfile.mkdtemp(prefix="r3-fuzz-writer-"))
    try:
        for case in run:
            local = rng.random() < 0.7
            root: Path | str = tmp / f"s{case}" if local else f"memory://r3-fuzz-writer/{seed}/{case}"
            experts = int(rng.choice([2, 3, 5, 16, 64, 255, 256, 257, 1000, 1024, 2049, 40000, 65536]))
            top_k = int(rng.integers(1, min(experts, 8) + 1))
            layers = int(rng.integers(1, 5))
            spec = r3store.ModelSpec(num_layers=layers, num_experts=experts, top_k=top_k)
            config = {"chunk_rows": int(rng.choice([1, 5, 32, 128, 1000])),
                      "layers_per_chunk": int(rng.choice([d for d in range(1, layers + 1) if layers % d == 0])),
                      "object_bytes": int(rng.choice([1 << 12, 1 << 16, 32 << 20])),
                      "buffer_bytes": int(rng.choice([1 << 12, 1 << 20, 256 << 20]))}
            samples: dict[str, np.ndarray] = {}
            with r3store.RouteWriter(root, spec, config=config) as w:
                for i in range(int(rng.integers(1, 5))):
                    rows = int(rng.integers(1, max_rows + 1)) if rng.random() < 0.5 else int(rng.integers(1, 40))
                    routes = _routes(rng, rows, layers, experts, top_k)
                    for form, arr in _valid_forms(rng, routes):
                        sid = f"v{i}-{len(samples)}"
                        cuts = sorted({0, rows, *(int(x) for x in rng.integers(1, rows + 1, int(rng.integers(0, 3))))})
                        try:  # in turns of random sizes (multi-turn continuation)
                            for a, b in itertools.pairwise(cuts):
                                w.append(sid, arr[a:b], start=a, final=b == rows)
                        except Exception as exc:  # noqa: BLE001 - the oracle
                            run.check(False, lambda f=form, e=exc: f"valid routes as {f} ({arr.dtype}, strides "
                                                                    f"{arr.strides}) refused: {type(e).__name__}: {e}")
                            continue
                        samples[sid] = routes
                    for form, arr in _bad_forms(rng, routes, experts):
                        try:
                            w.append(f"bad{i}-{form}", arr)
                            outcome = "accepted"
                        except R3StoreError as exc:
                            outcome = "r3store error" if str(exc) else "r3store error without a message"
                        except Exception as exc:  # noqa: BLE001 - the oracle
                            outcome = f"{type(exc).__name__}: {exc}"
                        run.check(outcome == "r3store error", lambda f=form, o=outcome: f"bad append ({f}): {o}")
                    if rng.random() < 0.4:
                        w.flush()
            store = r3store.open_store(root)
            run.check(sorted(store.sample_ids) == sorted(samples),
                      lambda: f"store lists {sorted(store.sample_ids)}, written {sorted(samples)}")
            for sid, routes in samples.items():
                try:
                    got = store.get(sid)
                except R3StoreError as exc:
                    run.check(False, lambda s=sid, e=exc: f"get({s!r}) of a valid append: {e}")
                    continue
                run.check(np.array_equal(got, routes), lambda s=sid: f"get({s!r}) differs from the written routes "
                                                                     f"(spec {spec}, config {config}, {root})")
            if isinstance(root, Path):
                shutil.rmtree(root)
            else:
                fsspec.filesystem("memory").rm(root.removeprefix("memory://"), recursive=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return run.report()


class _FailingBackend(LocalBackend):
    """A local backend whose ``fail_at``-th write fails (after writing half of the object)."""

    def __init__(self, root: Path, fail_at: int) -> None:
        super().__init__(root)
        self.fail_at, self.calls, self.failed = fail_at, 0, 0

    def _fail(self, key: str) -> bool:
        self.calls += 1
        return self.calls == self.fail_at

    def set(self, key: str, data: bytes | memoryview) -> None:
        if self._fail(key):
            super().set(key, bytes(data)[: len(data) // 2])  # a torn write, then the error
            self.failed += 1
            raise StorageError(self.path_of(key), "injected write failure")
        super().set(key, data)

    def set_if_absent(self, key: str, data: bytes) -> bool:
        if self._fail(key):
            self.failed += 1
            raise StorageError(self.path_of(key), "injected write failure")
        return super().set_if_absent(key, data)


def writer_faults(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """One write of a commit (an object, torn half-way; its array document; its sample table)
    fails with a StorageError: the append, flush or close that raised it is called again, and
    every sample appended must then read back exactly, none twice, none lost."""
    run = _Run("writer_faults", seed, cases, seconds)
    rng = run.rng
    tmp = Path(tempfile.mkdtemp(prefix="r3-fuzz-faults-"))
    try:
        for case in run:
            root = tmp / f"s{case}"
            experts = int(rng.choice([4, 300, 40000]))
            spec = r3store.ModelSpec(num_layers=2, num_experts=experts, top_k=2)
            backend = _FailingBackend(root, int(rng.integers(1, 30)))
            config = {"chunk_rows": int(rng.choice([1, 8, 128])), "object_bytes": int(rng.choice([1 << 10, 1 << 25])),
                      "buffer_bytes": int(rng.choice([1 << 12, 1 << 28]))}
            try:
                w = r3store.RouteWriter(backend, spec, config=config)
            except StorageError:
                backend.fail_at = -1
                w = r3store.RouteWriter(backend, spec, config=config)
            samples: dict[str, np.ndarray] = {}
            steps: list[Callable[[], object]] = []
            for i in range(int(rng.integers(1, 8))):
                routes = _routes(rng, int(rng.integers(1, 400)), 2, experts, 2)
                samples[f"s{i}"] = routes
                steps.append(lambda s=f"s{i}", r=routes: w.append(s, r))
                if rng.random() < 0.4:
                    steps.append(w.flush)
            steps.append(w.close)
            for step in steps:
                for _ in range(3):
                    try:
                        step()
                        break
                    except StorageError:
                        continue
                    except DuplicateSampleError:
                        break  # the append was buffered before its flush failed
            run.counts["failed_writes"] = run.counts.get("failed_writes", 0) + backend.failed
            store = r3store.open_store(root)
            run.check(sorted(store.sample_ids) == sorted(samples),
                      lambda: f"after {backend.failed} failed write(s) (write {backend.fail_at}, config {config}): "
                              f"store lists {sorted(store.sample_ids)}, appended {sorted(samples)}")
            for sid in set(store.sample_ids) & set(samples):
                run.check(np.array_equal(store.get(sid), samples[sid]),
                          lambda s=sid: f"after a failed write {backend.fail_at}: {s!r} differs")
            shutil.rmtree(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return run.report()


# -- Ray read_routes ---------------------------------------------------------------------


def _ray_store(rng: np.random.Generator, root: Path) -> tuple[r3store.ModelSpec, dict[str, np.ndarray]]:
    experts = int(rng.choice([4, 16, 255, 300, 1024]))
    top_k = int(rng.integers(1, min(experts, 6) + 1))
    layers = int(rng.integers(1, 4))
    spec = r3store.ModelSpec(num_layers=layers, num_experts=experts, top_k=top_k)
    samples: dict[str, np.ndarray] = {}
    config = {"chunk_rows": int(rng.choice([1, 4, 16, 128])), "object_bytes": int(rng.choice([1 << 10, 32 << 20]))}
    with r3store.RouteWriter(root, spec, config=config) as w:
        for i in range(int(rng.integers(2, 24))):
            rows = int(rng.integers(0, 60)) if rng.random() < 0.9 else int(rng.integers(200, 2000))
            routes = _routes(rng, rows, layers, experts, top_k)
            sid = f"s{i:02d}"
            w.append(sid, routes, num_tokens=rows + 1)
            samples[sid] = routes
            if rng.random() < 0.3:
                w.flush()
    return spec, samples


def ray_blocks(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """``r3store.ray.read_routes``: every sample's routes as written; a consumer writing into
    the arrays it was given (where numpy lets it) changes no other sample of its batch, no later
    read of the materialized dataset and no other consumer's rows. Needs ``ray.init()`` first."""
    import r3store.ray as r3ray

    run = _Run("ray_blocks", seed, cases, seconds)
    rng = run.rng
    tmp = Path(tempfile.mkdtemp(prefix="r3-fuzz-ray-"))
    try:
        for case in run:
            root = tmp / f"s{case}"
            spec, samples = _ray_store(rng, root)
            lays = None if rng.random() < 0.6 else [int(x) for x in rng.permutation(spec.num_layers)[
                : int(rng.integers(1, spec.num_layers + 1))]]
            want = {sid: r if lays is None else r[:, lays] for sid, r in samples.items()}
            blocks = int(rng.integers(1, 6)) if rng.random() < 0.7 else None
            ds = r3ray.read_routes(root, layers=lays, override_num_blocks=blocks).materialize()

            def same(rows: list[dict[str, Any]], what: str) -> None:
                got = {str(r["sample_id"]): np.asarray(r["routes"]) for r in rows}
                run.check(sorted(got) == sorted(want), lambda: f"{what}: samples {sorted(got)}, written {sorted(want)}")
                for sid in set(got) & set(want):
                    run.check(got[sid].shape == want[sid].shape and np.array_equal(got[sid], want[sid]),
                              lambda s=sid: f"{what}: routes of {s!r} differ from the written ones "
                                            f"(layers {lays}, {blocks} blocks)")

            same(ds.take_all(), "first read")
            size = int(rng.choice([1, 2, 3, 7, 4096])) if rng.random() < 0.8 else None
            for batch in ds.iter_batches(batch_format="numpy", batch_size=size):
                ids = [str(x) for x in batch["sample_id"]]
                arrays = list(batch["routes"])
                for k, (sid, arr) in enumerate(zip(ids, arrays, strict=True)):
                    run.check(np.array_equal(arr, want[sid]), lambda s=sid: f"batch of {size}: {s!r} differs")
                    if arr.flags.writeable:
                        arr[...] = 1 + k % 200  # the consumer reuses the array
                for k, (sid, arr) in enumerate(zip(ids, arrays, strict=True)):
                    if arr.flags.writeable:
                        run.check(bool((arr == 1 + k % 200).all()),
                                  lambda s=sid: f"batch of {size}: writing another sample's array changed {s!r}")
                    else:
                        run.check(np.array_equal(arr, want[sid]),
                                  lambda s=sid: f"batch of {size}: writing a neighbour changed read-only {s!r}")
            taken = ds.take_all()
            for row in taken:
                if row["routes"].flags.writeable:
                    row["routes"][...] = 0
            same(ds.take_all(), "read after consumers wrote into their arrays")

            def scribble(batch: dict[str, Any]) -> dict[str, Any]:
                for arr in batch["routes"]:
                    if arr.flags.writeable:
                        arr[...] = 3
                return {"sample_id": batch["sample_id"], "n": np.array([a.size for a in batch["routes"]])}

            ds.map_batches(scribble, batch_size=size, zero_copy_batch=True).materialize()
            same(ds.take_all(), "read after a map_batches wrote into its zero-copy batches")
            shutil.rmtree(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return run.report()


TARGETS: dict[str, Callable[..., Report]] = {
    "crc": crc, "unpack": unpack, "frames": frames, "frame_args": frame_args, "overread": overread, "reads": reads,
    "writer": writer, "writer_faults": writer_faults, "ray_blocks": ray_blocks, "set_frames": set_frames,
    "layout": layout, "assemble": assemble, "grouped": grouped,
    "set_encode": set_encode, "direct_writes": direct_writes,
    "ranges": ranges, "assemble_paths": assemble_paths, "fused": fused,
    "set_ranges": set_ranges}
"""Every target; ``ray_blocks`` needs a Ray cluster (``main`` starts a local one)."""


def run(target: str, seed: int = 0, cases: int | None = None, seconds: float | None = None) -> Report:
    """Run one target (see the module docstring) and return its report."""
    return TARGETS[target](seed=seed, cases=cases, seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.differential", description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(TARGETS), action="append")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    failed = False
    if "ray_blocks" in (args.target or TARGETS):
        import logging

        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
        ray.data.DataContext.get_current().enable_progress_bars = False
    for target in args.target or list(TARGETS):
        report = run(target, args.seed, args.cases, args.seconds)
        print(json.dumps(report), flush=True)
        failed |= bool(report["failures"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
