"""``CodecTests``: the conformance kit every :class:`r3store.codecs.Codec` must pass.

A codec's test module subclasses :class:`CodecTests` and supplies a ``codec`` fixture
(parametrise it to cover every configuration) and :meth:`CodecTests.id_bound`::

    class TestBitpack(CodecTests):
        @pytest.fixture(params=range(1, 17))
        def codec(self, request):
            return BitpackCodec(bits=request.param)

        def id_bound(self, codec):
            return 1 << codec.bits

A codec whose ``decode`` returns a canonical form of its input rather than the ids
themselves (:class:`r3store.codecs.SetCodec` sorts each row) overrides
:meth:`CodecTests.decoded` with an independent statement of that form.

The kit covers the round trip over edge sizes and id patterns, the JSON config round
trip through :func:`r3store.codecs.get_codec`, ``repr``, decoding into ``out``, input
immutability, corruption and truncation detection, rejection of ids the codec cannot
represent, and, for codecs that bind frames to their position
(:class:`r3store.codecs.SupportsBinding`; override :meth:`CodecTests.can_bind`), that a frame
bound elsewhere is refused, and, for codecs that batch-decode
(:class:`r3store.codecs.SupportsBatchDecode`), that a run of frames decodes into its places
as frame-by-frame decoding would, and stops at the first frame failing a check; for
codecs that batch-encode (:class:`r3store.codecs.SupportsBatchEncode`), that the frames are
byte for byte those of :meth:`~r3store.codecs.Codec.encode`.
Golden-fixture helpers (:func:`ensure_golden`, :func:`check_golden`) pin encoded bytes on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from r3store._format import position_tag
from r3store.codecs import Codec, SupportsBatchDecode, SupportsBatchEncode, SupportsBinding, get_codec
from r3store.errors import ChecksumError, CodecError, FormatError

__all__ = ["CodecTests", "EDGE_SIZES", "ID_PATTERNS", "check_golden", "ensure_golden", "make_ids"]

EDGE_SIZES = (0, 1, 7, 8, 9, 63, 1000, 65537)
"""Id counts around byte, word and 8-id group boundaries, plus two large ones."""

ID_PATTERNS = ("random", "zeros", "max", "zero-tail", "zero-head", "alternating")


def make_ids(pattern: str, n: int, bound: int, seed: int = 0) -> np.ndarray:
    """Ids in ``[0, bound)`` following a named pattern.

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, bound, size=n, dtype=np.int64)
    if pattern == "zeros":
        ids[:] = 0
    elif pattern == "max":
        ids[:] = bound - 1
    elif pattern == "zero-tail":
        ids[n // 2 :] = 0
        if n:
            ids[0] = bound - 1
    elif pattern == "zero-head":
        ids[: n // 2] = 0
        if n:
            ids[-1] = bound - 1
    elif pattern == "alternating":
        ids[::2] = bound - 1
        ids[1::2] = 0
    elif pattern != "random":
        raise ValueError(f"unknown id pattern {pattern!r}")
    return ids


def _flipped(buf: bytes, pos: int, mask: int) -> bytes:
    out = bytearray(buf)
    out[pos] ^= mask
    return bytes(out)


def _positions(size: int, limit: int = 48) -> list[int]:
    """Every byte position of a small frame; first/last 16 and an even sample of a large one."""
    if size <= limit:
        return list(range(size))
    middle = np.linspace(16, size - 17, num=limit - 32, dtype=np.int64).tolist()
    return sorted({*range(16), *middle, *range(size - 16, size)})


def _untouched_or_missing(out: np.ndarray, fill: int) -> None:
    """``out`` (filled with ``fill`` before a failed decode) is untouched, or all the missing
    marker (every bit set: -1 in signed dtypes, the maximum in unsigned ones)."""
    marker = np.array(-1).astype(out.dtype)
    assert (out == fill).all() or (out == marker).all(), f"out holds neither only {fill} nor only {marker}: {out}"


class CodecTests:
    """Abstract conformance tests for a :class:`r3store.codecs.Codec` (not collected).

    Subclasses provide a ``codec`` fixture and override :meth:`id_bound`.
    """

    detects_corruption: bool = True
    """Whether every single-byte corruption must be rejected (codecs with a checksum)."""

    def id_bound(self, codec: Codec) -> int:
        """Exclusive upper bound of the ids ``codec`` can represent."""
        raise NotImplementedError

    def decoded(self, codec: Codec, ids: np.ndarray) -> np.ndarray:
        """What ``codec.decode(codec.encode(ids))`` returns, flat (default: the ids, exactly)."""
        return np.asarray(ids).reshape(-1)

    def can_bind(self, codec: Codec) -> bool:
        """Whether ``codec`` writes frames bound to a position tag (default: it supports
        :class:`r3store.codecs.SupportsBinding`)."""
        return isinstance(codec, SupportsBinding)

    # -- round trip -----------------------------------------------------------------

    @pytest.mark.parametrize("n", EDGE_SIZES)
    @pytest.mark.parametrize("pattern", ["random", "zero-tail"])
    def test_round_trip_sizes(self, codec: Codec, n: int, pattern: str) -> None:
        ids = make_ids(pattern, n, self.id_bound(codec), seed=n)
        buf = codec.encode(ids)
        assert isinstance(buf, bytes)
        got = codec.decode(buf)
        assert got.dtype == np.int32
        assert got.shape == (n,)
        np.testing.assert_array_equal(got, self.decoded(codec, ids))

    @pytest.mark.parametrize("pattern", ID_PATTERNS)
    def test_round_trip_patterns(self, codec: Codec, pattern: str) -> None:
        ids = make_ids(pattern, 77, self.id_bound(codec), seed=1)
        np.testing.assert_array_equal(codec.decode(codec.encode(ids)), self.decoded(codec, ids))

    @pytest.mark.parametrize("dtype", ["uint8", "uint16", "int16", "int32", ">i4", "int64", "uint64"])
    def test_input_dtypes(self, codec: Codec, dtype: str) -> None:
        bound = min(self.id_bound(codec), int(np.iinfo(np.dtype(dtype)).max) + 1)
        ids = make_ids("random", 50, bound, seed=2)
        buf = codec.encode(ids.astype(dtype))
        assert buf == codec.encode(ids)
        np.testing.assert_array_equal(codec.decode(buf), self.decoded(codec, ids))

    def test_input_layouts(self, codec: Codec) -> None:
        """Any shape and memory layout is read in C order."""
        ids = make_ids("random", 6 * 4 * 5, self.id_bound(codec), seed=3).reshape(6, 4, 5)
        flat = ids.reshape(-1)
        assert codec.encode(ids) == codec.encode(flat)
        assert codec.encode(np.asfortranarray(ids)) == codec.encode(flat)
        strided = ids[:, ::2, :]
        assert codec.encode(strided) == codec.encode(strided.copy().reshape(-1))
        assert codec.encode(flat.tolist()) == codec.encode(flat)

    def test_encode_is_deterministic(self, codec: Codec) -> None:
        ids = make_ids("random", 100, self.id_bound(codec), seed=4)
        assert codec.encode(ids) == codec.encode(ids.copy())

    def test_encode_does_not_modify_input(self, codec: Codec) -> None:
        ids = make_ids("zero-tail", 100, self.id_bound(codec), seed=5)
        before = ids.copy()
        codec.encode(ids)
        np.testing.assert_array_equal(ids, before)
        ids.setflags(write=False)
        np.testing.assert_array_equal(codec.decode(codec.encode(ids)), self.decoded(codec, before))

    @pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "ndarray"])
    def test_decode_bytes_like(self, codec: Codec, kind: str) -> None:
        ids = make_ids("random", 33, self.id_bound(codec), seed=6)
        buf = codec.encode(ids)
        src: Any = {
            "bytes": buf,
            "bytearray": bytearray(buf),
            "memoryview": memoryview(buf),
            "ndarray": np.frombuffer(buf, dtype=np.uint8),
        }[kind]
        before = bytes(src)
        np.testing.assert_array_equal(codec.decode(src), self.decoded(codec, ids))
        assert bytes(src) == before

    # -- decode into out ------------------------------------------------------------

    @pytest.mark.parametrize("dtype", ["int32", "int64", "uint16"])
    def test_decode_into_out(self, codec: Codec, dtype: str) -> None:
        ids = make_ids("zero-tail", 96, self.id_bound(codec), seed=7)
        out = np.full((12, 8), 12345, dtype=dtype)
        got = codec.decode(codec.encode(ids), out=out)
        assert got is out
        np.testing.assert_array_equal(out.reshape(-1), self.decoded(codec, ids))

    @pytest.mark.parametrize("layout", ["strided", "fortran"])
    def test_decode_into_non_contiguous_out(self, codec: Codec, layout: str) -> None:
        """Such an ``out`` is filled (in C order) or rejected, never silently left as it was."""
        ids = make_ids("random", 24, self.id_bound(codec), seed=15) | 1
        if layout == "strided":
            out = np.zeros((6, 8), dtype=np.int32)[:, ::2]
        else:
            out = np.zeros((6, 4), dtype=np.int32, order="F")
        try:
            got = codec.decode(codec.encode(ids), out=out)
        except FormatError:
            return
        assert got is out
        np.testing.assert_array_equal(out, self.decoded(codec, ids).reshape(6, 4))

    @pytest.mark.parametrize("size", [95, 97, 0])
    def test_decode_into_out_of_wrong_size(self, codec: Codec, size: int) -> None:
        buf = codec.encode(make_ids("random", 96, self.id_bound(codec), seed=8))
        out = np.full(size, 7, dtype=np.int32)
        with pytest.raises(FormatError):
            codec.decode(buf, out=out)
        assert (out == 7).all()

    # -- config ---------------------------------------------------------------------

    def test_config_json_round_trip(self, codec: Codec) -> None:
        config = codec.get_config()
        assert config["id"] == type(codec).codec_id
        text = json.dumps(config, allow_nan=False)
        rebuilt = get_codec(json.loads(text))
        assert type(rebuilt) is type(codec)
        assert rebuilt == codec
        assert hash(rebuilt) == hash(codec)
        assert rebuilt.get_config() == config
        ids = make_ids("random", 40, self.id_bound(codec), seed=9)
        assert rebuilt.encode(ids) == codec.encode(ids)

    def test_from_config_ignores_id(self, codec: Codec) -> None:
        config = codec.get_config()
        assert type(codec).from_config(config) == codec
        assert type(codec).from_config({k: v for k, v in config.items() if k != "id"}) == codec

    def test_repr(self, codec: Codec) -> None:
        text = repr(codec)
        assert text.startswith(f"{type(codec).__name__}(")
        for key, value in codec.get_config().items():
            if key != "id":
                assert f"{key}={value!r}" in text
        assert eval(text, {type(codec).__name__: type(codec)}) == codec

    # -- corrupt input --------------------------------------------------------------

    @pytest.mark.parametrize("n", [0, 9, 500])
    def test_every_single_byte_corruption_is_detected(self, codec: Codec, n: int) -> None:
        if not self.detects_corruption:
            pytest.skip("codec has no checksum")
        buf = codec.encode(make_ids("random", n, self.id_bound(codec), seed=10))
        for pos in _positions(len(buf)):
            for mask in (0x01, 0x80, 0xFF):
                bad = _flipped(buf, pos, mask)
                with pytest.raises(FormatError):
                    codec.decode(bad)

    def test_truncated_frames(self, codec: Codec) -> None:
        buf = codec.encode(make_ids("random", 50, self.id_bound(codec), seed=11))
        for size in _positions(len(buf)):
            with pytest.raises(FormatError):
                codec.decode(buf[:size])

    def test_frame_with_trailing_bytes(self, codec: Codec) -> None:
        buf = codec.encode(make_ids("random", 50, self.id_bound(codec), seed=12))
        for extra in (b"\x00", b"\x01\x02\x03"):
            with pytest.raises(FormatError):
                codec.decode(buf + extra)

    @pytest.mark.parametrize("dtype", ["int32", "uint16", "uint8"])
    def test_a_failed_decode_leaves_out_untouched_or_all_missing(self, codec: Codec, dtype: str) -> None:
        """After any failure ``out`` holds no unchecked id: it is untouched, or every element
        is the missing marker (all bits set: -1 signed, the maximum unsigned), as a decoder
        that writes while it computes the checksum leaves it; a wrong-sized ``out`` is
        untouched."""
        bound = self.id_bound(codec)
        if np.iinfo(dtype).max < bound - 1:
            pytest.skip(f"{dtype} cannot hold every id")
        ids = make_ids("random", 16, bound, seed=13)
        buf = codec.encode(ids)
        bad: list[tuple[bytes, dict[str, int]]] = [
            (_flipped(buf, pos, mask), {}) for pos in _positions(len(buf)) for mask in (0x01, 0x80, 0xFF)]
        bad += [(buf[:size], {}) for size in _positions(len(buf))]
        bad += [(buf + b"\x00", {})]
        if self.can_bind(codec):
            bad += [(codec.encode(ids, tag=7), {"tag": 8})]  # type: ignore[call-arg]  # bound elsewhere
        for frame, kwargs in bad:
            out = np.full(16, 7, dtype=dtype)
            with pytest.raises(FormatError):
                codec.decode(frame, out=out, **kwargs)
            _untouched_or_missing(out, 7)
        for size in (15, 17):
            out = np.full(size, 7, dtype=dtype)
            with pytest.raises(FormatError):
                codec.decode(buf, out=out)
            assert (out == 7).all()

    # -- position binding -----------------------------------------------------------

    @pytest.mark.parametrize("tag", [1, 0x9E3779B9, 2**32 - 1])
    def test_bound_frames_decode_only_in_place(self, codec: Codec, tag: int) -> None:
        if not self.can_bind(codec):
            pytest.skip("codec does not bind frames to a position")
        ids = make_ids("random", 40, self.id_bound(codec), seed=16)
        frame = codec.encode(ids, tag=tag)  # type: ignore[call-arg]
        assert codec.frame_tag(frame) == tag  # type: ignore[attr-defined]
        want = self.decoded(codec, ids)
        np.testing.assert_array_equal(codec.decode(frame, tag=tag), want)  # type: ignore[call-arg]
        np.testing.assert_array_equal(codec.decode(frame), want)  # tag None: not checked
        out = np.full(40, 7, dtype=np.int32)
        for other in (0, tag ^ 1, tag ^ 0x80000000):
            with pytest.raises(ChecksumError):
                codec.decode(frame, out=out, tag=other)  # type: ignore[call-arg]
            _untouched_or_missing(out, 7)
        unbound = codec.encode(ids)
        assert codec.frame_tag(unbound) == 0  # type: ignore[attr-defined]
        with pytest.raises(ChecksumError):
            codec.decode(unbound, tag=tag)  # type: ignore[call-arg]

    # -- batch decode ---------------------------------------------------------------

    def _batch(self, codec: Codec, bind: bool) -> tuple[bytes, list[int], np.ndarray, dict[str, Any]]:
        """Four frames of (2 rows, 3 layers, top_k 4) chunks, back to back with a gap, for an
        out of (4, 6, 4): the blob, each frame's start, the expected out (each frame's
        :meth:`decoded` form), and the arguments."""
        bound = self.id_bound(codec)
        expected = make_ids("random", 4 * 6 * 4, bound, seed=21).reshape(4, 6, 4)
        expected[3, 3:] = 0  # a zero tail
        blob, starts, cols = b"", [], []
        for f, (rc, lc) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
            ids = expected[2 * rc : 2 * rc + 2, 3 * lc : 3 * lc + 3]
            frame = codec.encode(ids, tag=position_tag("c1", rc, lc)) if bind else codec.encode(ids)  # type: ignore[call-arg]
            blob += b"\xa5" * (f % 2)  # frames need not touch
            starts.append(len(blob))
            blob += frame
            cols.append((len(frame), 2 * rc, 3 * lc, rc, lc))
            expected[2 * rc : 2 * rc + 2, 3 * lc : 3 * lc + 3] = self.decoded(codec, ids).reshape(ids.shape)
        arrays = np.array(cols, dtype=np.int64).T
        kwargs: dict[str, Any] = {
            "starts": np.array(starts, dtype=np.int64), "lengths": arrays[0], "rows": arrays[1], "layers": arrays[2],
            "chunk_rows": 2, "layers_per_chunk": 3, "tag_prefix": "c1" if bind else None,
            "row_chunks": arrays[3], "layer_chunks": arrays[4]}
        return blob, starts, expected, kwargs

    @pytest.mark.parametrize("dtype", ["int32", "uint16", "int16"])
    def test_batch_decode_matches_frame_by_frame(self, codec: Codec, dtype: str) -> None:
        if not isinstance(codec, SupportsBatchDecode):
            pytest.skip("codec does not batch-decode")
        if np.iinfo(dtype).max < self.id_bound(codec) - 1:
            pytest.skip(f"{dtype} cannot hold every id")
        for bind in (False, True) if self.can_bind(codec) else (False,):
            blob, _, expected, kwargs = self._batch(codec, bind)
            out = np.full((4, 6, 4), 7, dtype=dtype)
            assert codec.decode_frames(blob, out=out, **kwargs) == -1
            np.testing.assert_array_equal(out, expected)
            out = np.full((4, 6, 4), 7, dtype=dtype)  # a numpy view of the bytes works the same
            assert codec.decode_frames(np.frombuffer(blob, np.uint8), out=out, **kwargs) == -1
            np.testing.assert_array_equal(out, expected)

    @pytest.mark.parametrize("fault", ["corrupt", "short", "out of blob", "out of out", "tag"])
    def test_batch_decode_stops_at_the_first_bad_frame(self, codec: Codec, fault: str) -> None:
        if not isinstance(codec, SupportsBatchDecode):
            pytest.skip("codec does not batch-decode")
        bind = fault == "tag"
        if bind and not self.can_bind(codec):
            pytest.skip("codec does not bind frames to a position")
        if fault == "corrupt" and not self.detects_corruption:
            pytest.skip("codec has no checksum")
        blob, starts, expected, kwargs = self._batch(codec, bind)
        if fault == "corrupt":
            blob = _flipped(blob, starts[2] + kwargs["lengths"][2] - 1, 0x10)
        elif fault == "short":
            kwargs["lengths"] = kwargs["lengths"].copy()
            kwargs["lengths"][2] -= 1
        elif fault == "out of blob":
            kwargs["starts"] = kwargs["starts"].copy()
            kwargs["starts"][2] = len(blob)
        elif fault == "out of out":
            kwargs["rows"] = kwargs["rows"].copy()
            kwargs["rows"][2] = 3
        else:
            kwargs["layer_chunks"] = kwargs["layer_chunks"].copy()
            kwargs["layer_chunks"][2] = 5  # bound to another place than the one it is read for
        out = np.full((4, 6, 4), 7, dtype=np.int32)
        assert codec.decode_frames(blob, out=out, **kwargs) == 2
        np.testing.assert_array_equal(out[:2], expected[:2])  # frames 0 and 1 decoded
        _untouched_or_missing(out[2:, :3], 7)  # frame 2: no unchecked id
        assert (out[2:, 3:] == 7).all()  # frame 3 untouched

    @pytest.mark.parametrize("layout", ["contiguous", "strided rows", "uint16", "zero tail"])
    def test_batch_encode_is_frame_by_frame_encode(self, codec: Codec, layout: str) -> None:
        if not isinstance(codec, SupportsBatchEncode):
            pytest.skip("codec does not batch-encode")
        bound = self.id_bound(codec)
        block = make_ids("random", 2 * 5 * 6 * 3, bound, seed=22).reshape(10, 6, 3)
        if layout == "strided rows":
            block = block[::2]
        elif layout == "uint16" and bound <= 1 << 16:
            block = block.astype(np.uint16)
        elif layout == "zero tail":
            block[3:, 4:] = 0
        tags = [position_tag("c9", 4, b) for b in range(3)] if self.can_bind(codec) else [0, 0, 0]
        frames, sizes = codec.encode_chunks(block, 2, tags)
        parts = [block[:, 2 * b : 2 * b + 2] for b in range(3)]
        expected = [codec.encode(part, tag=tag) if tag else codec.encode(part)  # type: ignore[call-arg]
                    for part, tag in zip(parts, tags, strict=True)]
        assert sizes == [len(f) for f in expected]
        assert bytes(frames) == b"".join(expected)
        bad = block.astype(np.int64)
        bad[-1, 3, 1] = bound
        with pytest.raises(CodecError):
            codec.encode_chunks(bad, 2, tags)

    # -- unrepresentable input ------------------------------------------------------

    @pytest.mark.parametrize("where", [0, 5, -1])
    def test_out_of_range_ids(self, codec: Codec, where: int) -> None:
        bound = self.id_bound(codec)
        for bad in (-1, bound, bound + 1, 2**40):
            ids = make_ids("random", 10, bound, seed=14)
            ids[where] = bad
            with pytest.raises(CodecError):
                codec.encode(ids)

    @pytest.mark.parametrize("values", [[0.0, 1.0], [True, False]])
    def test_non_integer_ids(self, codec: Codec, values: list[Any]) -> None:
        with pytest.raises(CodecError):
            codec.encode(np.array(values))


def _fixture_paths(folder: Path, name: str) -> tuple[Path, Path]:
    return folder / f"{name}.bin", folder / f"{name}.json"


def ensure_golden(folder: str | Path, name: str, codec: Codec, ids: np.ndarray, tag: int = 0) -> bool:
    """Write the golden fixture ``name`` (``.bin`` frame + ``.json`` config and ids) if absent.

    ``tag`` (a :class:`r3store.codecs.SupportsBinding` codec's position tag) is recorded
    and used when not 0.

    An existing fixture is never touched, so a format change shows up as a failing
    :func:`check_golden` and a new fixture name, never as an edit of an old file.

    Returns
    -------
    bool
        Whether this call wrote the fixture.
    """
    bin_path, json_path = _fixture_paths(Path(folder), name)
    if bin_path.exists() or json_path.exists():
        return False
    bin_path.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"config": codec.get_config(), "shape": list(ids.shape), "ids": ids.reshape(-1).tolist()}
    if tag:
        doc["tag"] = tag
    bin_path.write_bytes(codec.encode(ids, tag=tag) if tag else codec.encode(ids))  # type: ignore[call-arg]
    json_path.write_text(json.dumps(doc) + "\n")
    return True


def check_golden(folder: str | Path, name: str) -> None:
    """Decode fixture ``name`` byte-exactly, and re-encode its ids to the very same bytes."""
    bin_path, json_path = _fixture_paths(Path(folder), name)
    doc = json.loads(json_path.read_text())
    frame = bin_path.read_bytes()
    codec = get_codec(doc["config"])
    expected = np.array(doc["ids"], dtype=np.int64).reshape(doc["shape"])
    tag = doc.get("tag", 0)
    if tag:
        np.testing.assert_array_equal(codec.decode(frame, tag=tag), expected.reshape(-1))  # type: ignore[call-arg]
        again = codec.encode(expected, tag=tag)  # type: ignore[call-arg]
    else:
        np.testing.assert_array_equal(codec.decode(frame), expected.reshape(-1))
        again = codec.encode(expected)
    assert again == frame, f"{name}: encoding the ids no longer gives the committed bytes"
