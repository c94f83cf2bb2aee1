"""encode_object: frames bound to their place, the binding decided once per object."""

from __future__ import annotations

import numpy as np
import pytest

from r3store._format import ArrayGeometry, decode_index, encode_object, position_tag
from r3store.codecs import BitpackCodec, SupportsBinding


def _geometry(frame_version: int) -> ArrayGeometry:
    codec = {"id": "r3store.bitpack", "bits": 5} | ({"frame_version": 2} if frame_version == 2 else {})
    return ArrayGeometry.for_rows(37, num_moe_layers=5, top_k=3, codec=codec, chunk_rows=4, layers_per_chunk=2,
                                  object_rows=12)


@pytest.mark.parametrize("first_row_chunk", [0, 3, 1234])
def test_every_frame_carries_the_tag_of_its_place(first_row_chunk: int) -> None:
    geometry = _geometry(2)
    rng = np.random.default_rng(0)
    blocks = [rng.integers(0, 32, (4, 5, 3)).astype(np.uint16) for _ in range(3)]
    blob = encode_object(iter(blocks), geometry, commit="w-00007", first_row_chunk=first_row_chunk)
    index = decode_index(blob[-geometry.index_nbytes :], geometry, "routes/w-00007", 0)
    codec = BitpackCodec(5, frame_version=2)
    for a in range(3):
        for b in range(geometry.layer_chunks):
            offset, nbytes = (int(v) for v in index[a, b])
            frame = blob[offset : offset + nbytes]
            tag = position_tag("w-00007", first_row_chunk + a, b)
            assert codec.frame_tag(frame) == tag
            got = codec.decode(frame, tag=tag).reshape(4, 2, 3)
            want = np.zeros((4, 2, 3), np.uint16)
            part = blocks[a][:, 2 * b : 2 * b + 2]
            want[:, : part.shape[1]] = part
            np.testing.assert_array_equal(got, want)


def test_capabilities_are_checked_once_per_object(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    check = type(SupportsBinding).__instancecheck__

    def counting(cls: type, obj: object) -> bool:
        if cls is SupportsBinding:
            calls.append(obj)
        return bool(check(cls, obj))

    monkeypatch.setattr(type(SupportsBinding), "__instancecheck__", counting)
    blocks = [np.zeros((4, 5, 3), np.uint16)] * 3
    encode_object(iter(blocks), _geometry(2), commit="w-00007")
    assert len(calls) == 1  # not once per frame (9 frames)


def _geometry4(rows: int = 37) -> ArrayGeometry:  # 4 MoE layers in 2 layer chunks: the batch-encoded shape
    return ArrayGeometry.for_rows(rows, num_moe_layers=4, top_k=3, codec={"id": "r3store.bitpack", "bits": 5,
                                                                          "frame_version": 2},
                                  chunk_rows=4, layers_per_chunk=2, object_rows=16)


@pytest.mark.parametrize("commit", ["w-00007", None])
def test_spans_of_many_row_blocks_encode_as_block_by_block(commit: str | None) -> None:
    geometry = _geometry4()
    ids = np.random.default_rng(3).integers(0, 32, (37, 4, 3)).astype(np.uint16)
    for i in range(geometry.num_objects):
        rows = ids[i * 16 : (i + 1) * 16]
        one_by_one = [rows[j : j + 4] for j in range(0, len(rows), 4)]
        spans = [rows[:8], rows[8:]] if len(rows) > 8 else [rows]  # the last object: 5 rows, 1 short block
        want = bytes(encode_object(iter(one_by_one), geometry, commit=commit, first_row_chunk=4 * i))
        scratch: list[np.ndarray] = []
        got = encode_object(iter(spans), geometry, commit=commit, first_row_chunk=4 * i, scratch=scratch)
        assert bytes(got) == want
        again = encode_object(iter(spans), geometry, commit=commit, first_row_chunk=4 * i, scratch=scratch)
        assert bytes(again) == want  # the reused buffer gives the same object


def test_a_span_past_the_objects_end_is_refused() -> None:
    with pytest.raises(ValueError, match="runs past the object's end"):
        encode_object(iter([np.zeros((20, 4, 3), np.uint16)]), _geometry4(), commit="w-00007")


def test_the_object_buffer_starts_on_a_page_so_a_local_disk_can_write_it_directly() -> None:
    # LocalBackend.set writes a page-aligned object of >= 1 MiB with O_DIRECT (no page-cache copy)
    geometry = _geometry4(rows=4000)
    scratch: list[np.ndarray] = []
    ids = np.random.default_rng(4).integers(0, 32, (16, 4, 3)).astype(np.uint16)
    blob = encode_object(iter([ids]), geometry, commit="w-00007", scratch=scratch)
    assert scratch[0].ctypes.data % 4096 == 0
    assert np.frombuffer(blob, np.uint8).ctypes.data == scratch[0].ctypes.data
