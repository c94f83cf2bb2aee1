"""``kernels.decode_frames`` (the batch frame decode of rank-local reads): compiled == numpy
reference on every width, odd shapes and output dtypes; faults found at the right frame;
rank-local reads identical with the compiled kernels disabled."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store._format import position_tag
from r3store.batch import assemble
from r3store.codecs import BitpackCodec, kernels
from r3store.errors import ChecksumError, CodecError, FormatError

IMPLS = ["numpy", *(["native"] if kernels.native_module() is not None else [])]


def _frames(rng: np.random.Generator, bits: int, cr: int, lpc: int, top_k: int, places: list[tuple[int, int]],
            layers: int) -> tuple[bytes, dict[str, np.ndarray], np.ndarray]:
    codec = BitpackCodec(bits=bits, frame_version=2)
    blob, cols = b"", {k: [] for k in ("starts", "lengths", "rows", "layers", "rc", "lc")}
    rows = (max(r for r, _ in places) + 1) * cr
    want = np.zeros((rows, layers, top_k), np.int64)
    for f, (r, b) in enumerate(places):
        ids = rng.integers(0, 1 << bits, (cr, lpc, top_k))
        if f % 3 == 1:  # a trimmed tail: n_encoded < n_total
            ids.reshape(-1)[-(f % 7 + 1):] = 0
        frame = codec.encode(ids.astype(np.int32), tag=position_tag("w-00001", r, b))
        for k, v in zip(cols, (len(blob), len(frame), r * cr, b * lpc, r, b), strict=True):
            cols[k].append(v)
        blob += frame
        want[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc] = ids
    return blob, {k: np.array(v, np.int64) for k, v in cols.items()}, want


def _call(blob: bytes, c: dict[str, np.ndarray], bits: int, out: np.ndarray, cr: int, lpc: int,
          prefix: str | None = "w-00001") -> int:
    return kernels.decode_frames(blob, c["starts"], c["lengths"], bits, out, c["rows"], c["layers"], chunk_rows=cr,
                                 layers_per_chunk=lpc, tag_prefix=prefix, row_chunks=c["rc"], layer_chunks=c["lc"])


@pytest.mark.parametrize("bits", range(1, 17))
@pytest.mark.parametrize("impl", IMPLS)
def test_decode_frames_equals_reference(impl: str, bits: int) -> None:
    rng = np.random.default_rng(bits)
    for cr, lpc, top_k, layers in ((3, 1, 6, 5), (7, 2, 8, 5), (128, 4, 8, 12)):
        places = [(r, b) for r in (0, 2, 3) for b in range(layers // lpc)][::-1]  # any order
        blob, cols, want = _frames(rng, bits, cr, lpc, top_k, places, layers)
        for dtype in (np.int32, np.uint16, np.int16, np.uint8):
            if np.iinfo(dtype).max < (1 << bits) - 1:
                continue
            with kernels.use(impl):
                out = np.full(want.shape, 99, dtype)
                assert _call(blob, cols, bits, out, cr, lpc) == -1
            untouched = np.ones(want.shape[:2], bool)
            for r, b in places:
                untouched[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc] = False
            np.testing.assert_array_equal(out[~untouched], want[~untouched].astype(dtype))
            assert (out[untouched] == 99).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_frames_reports_the_first_bad_frame(impl: str) -> None:
    rng = np.random.default_rng(0)
    blob, cols, want = _frames(rng, 7, 4, 2, 8, [(0, 0), (0, 1), (1, 0), (1, 1)], 4)
    with kernels.use(impl):
        out = np.zeros(want.shape, np.int32)
        assert _call(blob, cols, 7, out, 4, 2, prefix="w-00002") == 0  # bound to another commit
        assert _call(blob, cols, 7, out, 4, 2, prefix=None) == -1  # tags not checked
        bad = bytearray(blob)
        bad[int(cols["starts"][2]) + 30] ^= 4  # a payload bit of frame 2
        assert _call(bytes(bad), cols, 7, out, 4, 2) == 2
        assert _call(blob, cols, 6, out, 4, 2) == 0  # another width
        assert _call(blob, cols, 7, out, 3, 2) == 0  # another chunk size
        moved = {**cols, "rows": cols["rows"] + 5}
        assert _call(blob, moved, 7, out, 4, 2) == 0  # outside out
        short = {**cols, "lengths": cols["lengths"] - np.array([0, 0, 0, 1])}
        assert _call(blob, short, 7, out, 4, 2) == 3
        with pytest.raises(CodecError):
            _call(blob, cols, 7, out[:, :, :4].copy()[:, ::2], 4, 2)  # not C-contiguous


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = r3store.ModelSpec(num_layers=6, num_experts=40, top_k=6, moe_layers=[0, 1, 2, 4, 5])
    path = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(1)
    with r3store.RouteWriter(path, spec, config={"chunk_rows": 16}) as writer:
        for i in range(6):
            n = int(rng.integers(30, 200))
            keys = rng.random((n - 1, spec.num_moe_layers, spec.num_experts))
            writer.append(f"s{i}", np.argsort(keys, axis=-1)[..., : spec.top_k].astype(np.int32))
    return path


@pytest.mark.parametrize("options", [{}, {"cp_size": 2, "cp_rank": 1}, {"tp_size": 4, "tp_rank": 2,
                                                                         "sequence_parallel": True}])
@pytest.mark.parametrize("dtype", ["int32", "uint8"])
def test_rank_local_reads_same_without_the_extension(store: Path, options: dict, dtype: str) -> None:
    reader = r3store.open_store(store)
    ids = reader.sample_ids
    fast = assemble(reader, ids, {**options, "dtype": dtype})["routes"]
    with kernels.use("numpy"):
        slow = assemble(r3store.open_store(store), ids, {**options, "dtype": dtype})["routes"]
    np.testing.assert_array_equal(fast, slow)


def test_a_corrupt_frame_is_named_by_the_batch_path(store: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    obj = next(p for p in (copy / "routes").rglob("c/0/0/0") if p.is_file())
    data = bytearray(obj.read_bytes())
    data[200] ^= 1  # inside the first frames
    obj.write_bytes(bytes(data))
    reader = r3store.open_store(copy)
    with pytest.raises((ChecksumError, FormatError), match=r"routes/.*chunk \(0, \d, 0\)"):
        assemble(reader, reader.sample_ids, {})


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("chunk_rows", "layers_per_chunk", "top_k"),
                         [(2**31, 1, 4), (2**26, 1, 2), (3, 1, 0), (2.0, 1, 4), (True, 1, 4)])
def test_decode_frames_refuses_a_chunk_it_cannot_hold(impl: str, chunk_rows: object, layers_per_chunk: int,
                                                      top_k: int) -> None:
    """Finding: a huge ``chunk_rows`` made the numpy twin allocate its scratch (bare
    MemoryError, even for no frames) and the C kernel raise a bare ValueError; 0 ids per
    chunk was misreported as too many. Both now raise CodecError before any work."""
    empty = np.zeros(0, np.int64)
    out = np.zeros((4, 1, top_k), np.int32)
    with kernels.use(impl), pytest.raises(CodecError, match="chunk_rows"):
        kernels.decode_frames(b"", empty, empty, 5, out, empty, empty, chunk_rows=chunk_rows,  # type: ignore[arg-type]
                              layers_per_chunk=layers_per_chunk)


@pytest.mark.parametrize("bits", [3, 7, 8, 11])
@pytest.mark.parametrize("impl", IMPLS)
def test_decode_frames_writes_only_the_row_ranges_asked(impl: str, bits: int) -> None:
    """``row_first``/``row_count``: each entry writes rows of its frame's chunk at its output row
    (the same frame twice, for two pieces), leaves every other row alone, and a range outside
    the chunk or the output is that entry's failure."""
    rng = np.random.default_rng(bits)
    cr, lpc, top_k, layers = 16, 2, 8, 4
    places = [(r, b) for r in range(3) for b in range(layers // lpc)]
    blob, c, want = _frames(rng, bits, cr, lpc, top_k, places, layers)
    # frame f again for a second piece: entries (frame, first chunk row, rows, output row)
    pieces = [(0, 5, 11, 0), (1, 5, 11, 0), (2, 0, 16, 11), (3, 0, 16, 11), (4, 0, 3, 27), (5, 0, 3, 27),
              (4, 9, 7, 40), (5, 9, 0, 30)]
    f = np.array([p[0] for p in pieces])
    cols = {k: v[f] for k, v in c.items()}
    cols["rows"] = np.array([p[3] for p in pieces], np.int64)
    first, count = np.array([p[1] for p in pieces], np.int64), np.array([p[2] for p in pieces], np.int64)
    expected = np.full((47, layers, top_k), 99, np.int64)
    for (_fr, r0, n, at), (r, b) in zip(pieces, [places[p[0]] for p in pieces], strict=True):
        expected[at : at + n, b * lpc : (b + 1) * lpc] = want[r * cr + r0 : r * cr + r0 + n, b * lpc : (b + 1) * lpc]
    with kernels.use(impl):
        out = np.full(expected.shape, 99, np.int32)
        assert kernels.decode_frames(blob, cols["starts"], cols["lengths"], bits, out, cols["rows"], cols["layers"],
                                     chunk_rows=cr, layers_per_chunk=lpc, tag_prefix="w-00001",
                                     row_chunks=cols["rc"], layer_chunks=cols["lc"], row_first=first,
                                     row_count=count) == -1
        np.testing.assert_array_equal(out, expected)
        for bad_first, bad_count, bad_at in ((-1, 3, 0), (14, 3, 0), (0, 17, 0), (0, 8, 40)):
            f2, n2, at2 = first.copy(), count.copy(), cols["rows"].copy()
            f2[3], n2[3], at2[3] = bad_first, bad_count, bad_at
            assert kernels.decode_frames(blob, cols["starts"], cols["lengths"], bits, np.zeros_like(out), at2,
                                         cols["layers"], chunk_rows=cr, layers_per_chunk=lpc, row_first=f2,
                                         row_count=n2) == 3
        with pytest.raises(CodecError, match="together"):
            kernels.decode_frames(blob, cols["starts"], cols["lengths"], bits, out, cols["rows"], cols["layers"],
                                  chunk_rows=cr, layers_per_chunk=lpc, row_first=first)


# -- frames side by side (one output row filled by several frames): every kernel path --------


def _modes() -> list[str]:
    """``numpy``, ``scalar`` (portable C), ``avx2`` (AVX-512 off) and ``avx512``, as this CPU has
    them; ``+nt``: with non-temporal stores forced (``set_stream_min(0)``)."""
    native = kernels.native_module()
    if native is None:
        return ["numpy"]
    modes = ["numpy", "scalar"]
    if native.cpu_features()["avx2"]:
        modes.append("avx2")
        modes.append("avx2+nt")
        try:
            native.set_avx512(native.set_avx512(True))
            modes += ["avx512", "avx512+nt"]
        except ValueError:
            pass
    return modes


@contextmanager
def _mode(mode: str) -> Iterator[None]:
    if mode == "numpy":
        with kernels.use("numpy"):
            yield
        return
    native = kernels.native_module()
    saved = native.set_avx512(mode.startswith("avx512")) if mode != "scalar" else None
    saved_min = native.set_stream_min(0 if mode.endswith("+nt") else -1)
    try:
        with kernels.use("native" if mode == "scalar" else "native-avx2"):
            yield
    finally:
        native.set_stream_min(saved_min)
        if saved is not None:
            native.set_avx512(saved)


def _side_by_side(rng: np.random.Generator, bits: int, cr: int, lpc: int, top_k: int, row_chunks: int, layers: int,
                  trimmed: tuple[int, ...] = ()) -> tuple[bytes, dict[str, np.ndarray], np.ndarray]:
    """Every chunk of a (row_chunks * cr, layers, top_k) array, in C order of (row chunk, layer
    chunk): the frames of a row chunk fill its output rows side by side. Frames numbered in
    ``trimmed`` end in zero ids (a shorter payload: the general path, between groups)."""
    codec = BitpackCodec(bits=bits, frame_version=2)
    want = rng.integers(0, 1 << bits, (row_chunks * cr, layers, top_k))
    parts, cols = [], {k: [] for k in ("starts", "lengths", "rows", "layers", "rc", "lc")}
    at = 0
    for r in range(row_chunks):
        for b in range(layers // lpc):
            if len(cols["starts"]) in trimmed:
                want[(r + 1) * cr - 1, (b + 1) * lpc - 1, -3:] = 0
            frame = codec.encode(want[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc].astype(np.int32),
                                 tag=position_tag("w-00001", r, b))
            for k, v in zip(cols, (at, len(frame), r * cr, b * lpc, r, b), strict=True):
                cols[k].append(v)
            parts.append(frame)
            at += len(frame)
    return b"".join(parts), {k: np.array(v, np.int64) for k, v in cols.items()}, want


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [5, 7, 8, 9, 16])
def test_frames_side_by_side_decode_alike_on_every_path(mode: str, bits: int) -> None:
    """decode_frames writes the frames of one row chunk row by row across them (a group); the
    result equals the array encoded, for every output width, on every kernel path, with
    groups cut by trimmed frames and by the group's size limit (70 frames side by side)."""
    rng = np.random.default_rng(bits)
    for cr, lpc, top_k, layers, trimmed in ((5, 2, 8, 6, ()), (3, 1, 8, 70, (5, 71)), (4, 2, 4, 6, (2,)),
                                            (7, 4, 6, 8, ()), (512, 2, 8, 58, (40,))):
        blob, cols, want = _side_by_side(rng, bits, cr, lpc, top_k, 2, layers, trimmed)
        for dtype in (np.int32, np.uint32, np.uint16, np.int16, np.uint8, np.int8):
            if np.iinfo(dtype).max < (1 << bits) - 1:
                continue
            out = np.full(want.shape, 99, dtype)
            with _mode(mode):
                assert _call(blob, cols, bits, out, cr, lpc) == -1
            np.testing.assert_array_equal(out, want.astype(dtype), err_msg=f"{mode} {dtype} {cr, lpc, top_k}")


@pytest.mark.parametrize("mode", _modes())
@pytest.mark.parametrize("bits", [7, 8])
def test_a_bad_frame_in_a_group_leaves_it_and_the_later_frames_untouched(mode: str, bits: int) -> None:
    """The frames of a group are written only once all of them passed their checks: a group cut
    by a bad frame writes the frames before it, and nothing of it or after it."""
    rng = np.random.default_rng(3)
    blob, cols, want = _side_by_side(rng, bits, 16, 2, 8, 1, 12)
    bad = bytearray(blob)
    bad[int(cols["starts"][3]) + 40] ^= 1  # a payload bit of frame 3 of 6
    for dtype in (np.uint8, np.int32):
        out = np.full(want.shape, 99, dtype)
        with _mode(mode):
            assert _call(bytes(bad), cols, bits, out, 16, 2) == 3
        np.testing.assert_array_equal(out[:, :6], want[:, :6].astype(dtype))
        assert (out[:, 6:] == 99).all()
