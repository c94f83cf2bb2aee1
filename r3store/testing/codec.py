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
bound elsewhere is refused. Golden-fixture helpers (:func:`ensure_golden`,
:func:`check_golden`) pin encoded bytes on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from r3store.codecs import Codec, SupportsBinding, get_codec
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

    def test_corrupt_frame_leaves_out_untouched(self, codec: Codec) -> None:
        buf = codec.encode(make_ids("random", 16, self.id_bound(codec), seed=13))
        out = np.full(16, 7, dtype=np.int32)
        with pytest.raises(FormatError):
            codec.decode(_flipped(buf, len(buf) - 1, 0xFF), out=out)
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
        assert (out == 7).all()
        unbound = codec.encode(ids)
        assert codec.frame_tag(unbound) == 0  # type: ignore[attr-defined]
        with pytest.raises(ChecksumError):
            codec.decode(unbound, tag=tag)  # type: ignore[call-arg]

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
