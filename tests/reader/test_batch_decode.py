"""The reader chooses its decode path by codec ability (SupportsBatchDecode), never by class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.codecs import BitpackCodec, Codec, SupportsBatchDecode, SupportsBinding
from r3store.errors import ChecksumError
from r3store.reader import _chunks
from r3store.testing.synthetic import uniform_routes

SPEC = r3store.ModelSpec(num_layers=7, num_experts=32, top_k=4, moe_layers=range(1, 7))


class FrameByFrame(Codec):
    """A codec of r3store.bitpack frames that is not a BitpackCodec and cannot batch-decode."""

    codec_id = "r3store.bitpack"

    def __init__(self, inner: BitpackCodec) -> None:
        self.inner = inner
        self.decodes = 0

    def encode(self, ids: Any, *, tag: int = 0) -> bytes:
        return self.inner.encode(ids, tag=tag)

    def decode(self, buf: Any, out: np.ndarray | None = None, *, tag: int | None = None) -> np.ndarray:
        self.decodes += 1
        return self.inner.decode(buf, out, tag=tag)

    def frame_tag(self, buf: Any) -> int:
        return self.inner.frame_tag(buf)

    def get_config(self) -> dict[str, Any]:
        return self.inner.get_config()


class Batching(FrameByFrame):
    """The same, with the batch ability (delegated), counting its calls."""

    def __init__(self, inner: BitpackCodec) -> None:
        super().__init__(inner)
        self.batches: list[int] = []

    def decode_frames(self, blob: Any, starts: np.ndarray, *args: Any, **kwargs: Any) -> int:
        self.batches.append(len(starts))
        return self.inner.decode_frames(blob, starts, *args, **kwargs)


@pytest.fixture
def store(tmp_path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    source = {f"s{i}": uniform_routes(rng, n, 6, 32, 4) for i, n in enumerate([37, 64, 5, 90])}
    with r3store.RouteWriter(tmp_path, SPEC, config={"chunk_rows": 8, "layers_per_chunk": 2}) as writer:
        for sid, routes in source.items():
            writer.append(sid, routes)
    return source


def _reader_with(monkeypatch: pytest.MonkeyPatch, root: Path, kind: type[FrameByFrame]) -> tuple[Any, list[Any]]:
    made: list[FrameByFrame] = []
    build = _chunks._build_codec

    def wrapped(config: dict[str, Any], path: str) -> Codec:
        codec = kind(build(config, path))  # type: ignore[arg-type]
        made.append(codec)
        return codec

    monkeypatch.setattr(_chunks, "_build_codec", wrapped)
    return r3store.open_store(root), made


def test_abilities_are_protocols_not_classes() -> None:
    assert isinstance(BitpackCodec(5), SupportsBatchDecode)
    assert isinstance(Batching(BitpackCodec(5)), SupportsBatchDecode)
    assert not isinstance(FrameByFrame(BitpackCodec(5)), SupportsBatchDecode)
    assert isinstance(FrameByFrame(BitpackCodec(5)), SupportsBinding)


@pytest.mark.parametrize("kind", [FrameByFrame, Batching])
def test_any_codec_reads_the_same_routes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         store: dict[str, np.ndarray], kind: type[FrameByFrame]) -> None:
    reader, made = _reader_with(monkeypatch, tmp_path, kind)
    for sid, routes in store.items():
        np.testing.assert_array_equal(reader.get(sid), routes)
        np.testing.assert_array_equal(reader.get(sid, [6, 2, 3]), routes[:, [5, 1, 2]])
        rows = slice(min(3, len(routes)), min(30, len(routes)))  # within the sample: a range past it is refused
        np.testing.assert_array_equal(reader.get(sid, rows=rows), routes[rows])
    out = np.zeros((40, 6, 4), np.uint8)
    reader.get_runs([("s1", 0, 16), ("s3", 10, 34)], out=out)
    np.testing.assert_array_equal(out, np.concatenate([store["s1"][:16], store["s3"][10:34]]))
    (codec,) = made
    if kind is Batching:
        assert codec.batches  # whole chunks went through decode_frames
    else:
        assert codec.decodes > 0


def test_get_decodes_whole_chunks_in_one_call_per_range(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       store: dict[str, np.ndarray]) -> None:
    reader, made = _reader_with(monkeypatch, tmp_path, Batching)
    np.testing.assert_array_equal(reader.get("s1"), store["s1"])  # rows 37..101: chunks 4..12, 4 and 12 partial
    (codec,) = made
    # chunks 4..12 (three layer chunks each) in place, the partial 4 and 12 into room around the result:
    # one call for the one local range, none frame by frame
    assert codec.batches == [9 * 3]
    assert codec.decodes == 0
    np.testing.assert_array_equal(reader.get("s1", rows=slice(0, 3)), store["s1"][:3])  # chunk 4: cached
    assert codec.batches == [9 * 3]
    assert codec.decodes == 0


def test_a_bad_frame_in_a_batch_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         store: dict[str, np.ndarray]) -> None:
    reader = r3store.open_store(tmp_path)
    array = reader.row("s1")["array"]
    geometry = reader.geometry_of(array)
    index = reader._chunks.object_index(array, geometry, 0)
    offset, nbytes = (int(v) for v in index[8, 1])
    path = tmp_path / array / "c" / "0" / "0" / "0"
    blob = bytearray(path.read_bytes())
    blob[offset + nbytes - 1] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(ChecksumError, match=r"\(8, 1, 0\)"):
        r3store.open_store(tmp_path).get("s1")


class RangeBatching(Batching):
    """Batching whose decode_frames also takes row ranges (the ability read from its signature)."""

    def decode_frames(self, blob: Any, starts: np.ndarray, *args: Any, row_first: np.ndarray | None = None,
                      row_count: np.ndarray | None = None, **kwargs: Any) -> int:
        self.batches.append(len(starts))
        return self.inner.decode_frames(blob, starts, *args, row_first=row_first, row_count=row_count, **kwargs)


@pytest.mark.parametrize("kind", [Batching, RangeBatching])
def test_partial_chunks_decode_in_place_when_the_codec_takes_row_ranges(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, store: dict[str, np.ndarray], kind: type[Batching]) -> None:
    opener = r3store.open_store
    monkeypatch.setattr(r3store, "open_store", lambda root: opener(root, reader={"cache_bytes": 0}))
    reader, made = _reader_with(monkeypatch, tmp_path, kind)
    out = np.zeros((40, 6, 4), np.int32)
    reader.get_runs([("s1", 0, 16), ("s3", 10, 34)], out=out)  # both runs start and end mid-chunk
    np.testing.assert_array_equal(out, np.concatenate([store["s1"][:16], store["s3"][10:34]]))
    (codec,) = made
    # one call per fetched range with row ranges; a second per range (the scratch) without
    assert len(codec.batches) == (2 if kind is RangeBatching else 4)
    assert codec.decodes == 0


def test_a_bad_byte_outside_the_rows_read_is_still_found(tmp_path: Path, store: dict[str, np.ndarray]) -> None:
    """A partial chunk decoded in place by row range is checked whole: a flipped bit in rows the
    read does not return still fails its CRC-32C."""
    reader = r3store.open_store(tmp_path)
    array = reader.row("s1")["array"]
    index = reader._chunks.object_index(array, reader.geometry_of(array), 0)
    offset, _ = (int(v) for v in index[4, 0])  # chunk 4 holds rows 32..39; s1 starts at row 37
    path = tmp_path / array / "c" / "0" / "0" / "0"
    blob = bytearray(path.read_bytes())
    blob[offset + 24] ^= 0x01  # the first payload byte: row 32, not s1's
    path.write_bytes(bytes(blob))
    damaged = r3store.open_store(tmp_path, reader={"cache_bytes": 0})
    with pytest.raises(ChecksumError, match=r"\(4, 0, 0\)"):
        damaged.get_runs([("s1", 0, 3)], out=np.zeros((3, 6, 4), np.int32))
    with pytest.raises(ChecksumError, match=r"\(4, 0, 0\)"):
        damaged.get("s1", rows=slice(0, 3))
