"""Codecs: the CodecTests kit on r3store.bitpack, fast-path twins, golden frames, registry, zarr."""

from __future__ import annotations

import json
import struct
from importlib.metadata import EntryPoint
from pathlib import Path
from types import MappingProxyType
from typing import Any

import google_crc32c
import numpy as np
import pytest
import zarr
import zarr.registry
from hypothesis import given
from hypothesis import strategies as st
from zarr.codecs import ShardingCodec
from zarr.storage import LocalStore as ZarrLocalStore
from zarr.storage import MemoryStore

import r3store.codecs._registry as registry_module
from r3store._spec import ModelSpec
from r3store._validate import check_routes
from r3store.codecs import (
    BitpackCodec,
    Codec,
    SupportsFrameSize,
    get_codec,
    pack_bits,
    pack_bits_reference,
    register_codec,
    registry,
    unpack_bits,
    unpack_bits_reference,
)
from r3store.codecs._zarr import ZarrBitpackCodec
from r3store.errors import ChecksumError, CodecError, FormatError, UnknownCodecError
from r3store.testing import CodecTests
from r3store.testing.codec import check_golden, ensure_golden
from r3store.testing.strategies import bit_widths, expert_ids, model_specs, payloads, spec_routes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "codecs"

# -- the conformance kit ------------------------------------------------------------


class TestBitpackCodec(CodecTests):
    @pytest.fixture(params=[(b, v) for v in (1, 2) for b in range(1, 17)], ids=lambda p: f"bits{p[0]}-v{p[1]}")
    def codec(self, request: pytest.FixtureRequest) -> BitpackCodec:
        bits, version = request.param
        return BitpackCodec(bits=bits, frame_version=version)

    def id_bound(self, codec: Codec) -> int:
        assert isinstance(codec, BitpackCodec)
        return 1 << codec.bits

    def can_bind(self, codec: Codec) -> bool:
        assert isinstance(codec, BitpackCodec)
        return codec.frame_version == 2


# -- r3store.bitpack frame layout -----------------------------------------------------


def _frame(
    bits: int, n_total: int, n_encoded: int, payload: bytes, *, magic: bytes = b"R3BP", version: int = 1
) -> bytes:
    """A frame with a *valid* CRC, whatever its other fields say."""
    head = struct.pack("<4sBBHII", magic, version, bits, 0, n_total, n_encoded)
    crc = google_crc32c.extend(google_crc32c.value(head), payload)
    return head + struct.pack("<I", crc) + payload


def test_frame_bytes_by_hand() -> None:
    """ids [3, 63, 0, 17] at 6 bits, LSB first: 0xC3 0x0F 0x44 (worked out on paper)."""
    buf = BitpackCodec(6).encode(np.array([3, 63, 0, 17]))
    assert buf == _frame(6, 4, 4, bytes([0xC3, 0x0F, 0x44]))
    assert buf[:4] == b"R3BP"
    assert len(buf) == 23


def test_frame_bytes_by_hand_odd_width() -> None:
    """ids [1, 2, 511] at 9 bits: stream 1 | 2 << 9 | 511 << 18 = 0x7FC0401."""
    buf = BitpackCodec(9).encode([1, 2, 511])
    assert buf == _frame(9, 3, 3, (1 | 2 << 9 | 511 << 18).to_bytes(4, "little"))


def _frame_v2(bits: int, n_total: int, n_encoded: int, tag: int, payload: bytes) -> bytes:
    head = struct.pack("<4sBBHIII", b"R3BP", 2, bits, 0, n_total, n_encoded, tag)
    crc = google_crc32c.extend(google_crc32c.value(head), payload)
    return head + struct.pack("<I", crc) + payload


def test_v2_frame_bytes_by_hand() -> None:
    """The FORMAT.md example: ids [3, 63, 0, 17] at 6 bits, bound to chunk (0, 0) of commit w-00000."""
    tag = google_crc32c.value(b"w-00000/0/0")
    assert tag == 0x02472BB0
    buf = BitpackCodec(6, frame_version=2).encode(np.array([3, 63, 0, 17]), tag=tag)
    assert buf == _frame_v2(6, 4, 4, tag, bytes([0xC3, 0x0F, 0x44]))
    assert buf.hex(" ") == "52 33 42 50 02 06 00 00 04 00 00 00 04 00 00 00 b0 2b 47 02 c7 f1 0b 51 c3 0f 44"
    assert len(buf) == 27
    assert BitpackCodec(6).decode(buf, tag=tag).tolist() == [3, 63, 0, 17]  # any codec reads both versions
    assert BitpackCodec(6, frame_version=2).get_config() == {"id": "r3store.bitpack", "bits": 6, "frame_version": 2}
    assert BitpackCodec(6).get_config() == {"id": "r3store.bitpack", "bits": 6}


def test_v1_frames_are_unbound() -> None:
    frame = BitpackCodec(6).encode([1, 2])
    assert BitpackCodec(6, frame_version=2).decode(frame).tolist() == [1, 2]
    assert BitpackCodec(6).frame_tag(frame) == 0
    with pytest.raises(ChecksumError, match="no tag"):
        BitpackCodec(6).decode(frame, tag=7)
    with pytest.raises(CodecError, match="no position tag"):
        BitpackCodec(6).encode([1, 2], tag=7)
    for bad in (-1, 2**32, True, 1.5):
        with pytest.raises(CodecError, match="tag"):
            BitpackCodec(6, frame_version=2).encode([1, 2], tag=bad)
    for bad in (0, 3, "2", None):
        with pytest.raises(CodecError, match="frame_version"):
            BitpackCodec(6, frame_version=bad)


def test_tag_is_covered_by_the_crc() -> None:
    frame = bytearray(BitpackCodec(6, frame_version=2).encode(np.arange(8), tag=5))
    frame[16] ^= 0x01  # another tag, stale CRC
    with pytest.raises(ChecksumError, match="CRC-32C mismatch"):
        BitpackCodec(6).decode(bytes(frame))


@pytest.mark.parametrize("n_total", [2**26 + 1, 2**27, 2**32 - 1])
@pytest.mark.parametrize("version", [1, 2])
def test_decode_never_allocates_what_a_forged_header_declares(version: int, n_total: int) -> None:
    """Issue 13 item 9: a 20-byte frame with a valid CRC declared 2**32 - 1 ids (16 GiB of int32)."""
    frame = _frame(6, n_total, 0, b"") if version == 1 else _frame_v2(6, n_total, 0, 0, b"")
    with pytest.raises(FormatError, match="more than the 67,108,864 decode allocates without out"):
        BitpackCodec(6).decode(frame)
    out = np.zeros(16, dtype=np.int32)
    with pytest.raises(FormatError, match="out holds 16 ids"):
        BitpackCodec(6).decode(frame, out=out)


def test_zarr_adapter_decodes_into_the_chunk_shape() -> None:
    """zarr.open_array over a forged frame: refused by the chunk spec's size, nothing allocated."""
    store = MemoryStore()
    arr = zarr.create_array(store, shape=(8, 2), chunks=(4, 2), dtype="int32", fill_value=0,
                            serializer=ZarrBitpackCodec(bits=6), compressors=None)
    arr[:] = np.arange(16).reshape(8, 2) % 64
    np.testing.assert_array_equal(arr[:], np.arange(16).reshape(8, 2) % 64)
    frame = BitpackCodec(6).encode(np.zeros(0))
    bomb = _frame(6, 2**27, 0, b"")  # 512 MiB of int32 decoded, for an 8-id chunk
    for key in ("c/0/0", "c/1/0"):
        store._store_dict[key] = zarr.core.buffer.cpu.Buffer.from_bytes(bomb)
    with pytest.raises(FormatError, match="out holds 8 ids, the frame 134217728"):
        zarr.open_array(store, mode="r")[:]
    assert frame  # an empty frame is 20 bytes


@pytest.mark.parametrize("n", [0, 1, 1000])
def test_zero_ids_cost_nothing(n: int) -> None:
    buf = BitpackCodec(9).encode(np.zeros(n, dtype=np.int32))
    assert buf == _frame(9, n, 0, b"")
    np.testing.assert_array_equal(BitpackCodec(9).decode(buf), np.zeros(n))


def test_zero_tail_is_trimmed() -> None:
    ids = np.zeros(100, dtype=np.int64)
    ids[:10] = 5
    buf = BitpackCodec(4).encode(ids)
    assert buf == _frame(4, 100, 10, bytes([0x55] * 5))
    np.testing.assert_array_equal(BitpackCodec(4).decode(buf), ids)


@pytest.mark.parametrize(
    ("frame", "fault"),
    [
        (_frame(6, 4, 4, b"\x00\x00\x00", magic=b"R3BQ"), "bad magic"),
        (_frame(6, 4, 4, b"\x00\x00\x00", version=3), "unsupported frame version 3"),
        (_frame(6, 4, 4, b"\x00\x00\x00", version=2), "shorter than the 24-byte header of a version-2 frame"),
        (_frame(7, 4, 4, b"\x00\x00\x00\x00"), "7 bits"),
        (_frame(6, 3, 4, b"\x00\x00\x00"), "4/3 ids"),
        (_frame(6, 4, 4, b"\x00\x00"), "payload is 2 bytes, expected 3"),
        (_frame(6, 4, 4, b"\x00\x00\x00\x00"), "payload is 4 bytes, expected 3"),
        (b"R3BP\x01\x06", "shorter than the 20-byte header"),
    ],
    ids=["magic", "version", "v2-short-header", "bits", "n_encoded>n_total", "short-payload", "long-payload",
         "short-header"],
)
def test_malformed_frames_with_valid_crc(frame: bytes, fault: str) -> None:
    with pytest.raises(FormatError, match=fault) as info:
        BitpackCodec(6).decode(frame)
    assert not isinstance(info.value, ChecksumError)
    assert isinstance(info.value, ValueError)


def test_payload_corruption_is_a_checksum_error() -> None:
    buf = bytearray(BitpackCodec(6).encode(np.arange(64)))
    buf[30] ^= 0x04
    with pytest.raises(ChecksumError, match="CRC-32C mismatch"):
        BitpackCodec(6).decode(bytes(buf))


@pytest.mark.parametrize("bits", [0, 17, -1, True, 6.0, "6", None])
def test_invalid_bits(bits: Any) -> None:
    with pytest.raises(CodecError, match=r"bits must be (in \[1, 16\]|an int)"):
        BitpackCodec(bits)
    with pytest.raises(CodecError):
        get_codec({"id": "r3store.bitpack", "bits": bits})
    with pytest.raises(CodecError):
        ZarrBitpackCodec(bits=bits)


def test_out_of_range_message_names_the_range() -> None:
    with pytest.raises(CodecError, match=r"\[0, 64\) for 6 bits, got range \[0, 64\]") as info:
        BitpackCodec(6).encode(np.array([0, 64]))
    assert info.value.codec_id == "r3store.bitpack"


# -- fast path vs. slow twin ----------------------------------------------------------


@given(st.data())
def test_pack_bits_matches_reference(data: st.DataObject) -> None:
    bits = data.draw(bit_widths())
    ids = data.draw(expert_ids(bits))
    packed = pack_bits(ids, bits)
    assert packed.dtype == np.uint8
    assert packed.tobytes() == pack_bits_reference(ids, bits)


@given(st.data())
def test_unpack_bits_matches_reference(data: st.DataObject) -> None:
    """Any payload, padding bits included, unpacks the same way (not only packed ones)."""
    bits = data.draw(bit_widths())
    n = data.draw(st.integers(0, 2000))
    payload = data.draw(payloads(n, bits))
    fast = unpack_bits(np.frombuffer(payload, dtype=np.uint8), n, bits)
    assert fast.dtype == np.int32
    np.testing.assert_array_equal(fast, unpack_bits_reference(payload, n, bits))


@given(st.data())
def test_pack_unpack_round_trip(data: st.DataObject) -> None:
    bits = data.draw(bit_widths())
    ids = data.draw(expert_ids(bits, dtype=data.draw(st.sampled_from([np.uint16, np.int32, np.int64]))))
    np.testing.assert_array_equal(unpack_bits(pack_bits(ids, bits), ids.size, bits), ids)


@pytest.mark.parametrize("bits", range(1, 17))
def test_twins_agree_on_every_small_size(bits: int) -> None:
    """Exhaustive over n = 0..40 (every position in an 8-id group, five groups deep)."""
    rng = np.random.default_rng(bits)
    for n in range(41):
        ids = rng.integers(0, 1 << bits, size=n)
        ref = pack_bits_reference(ids, bits)
        assert pack_bits(ids, bits).tobytes() == ref
        np.testing.assert_array_equal(unpack_bits(np.frombuffer(ref, dtype=np.uint8), n, bits), ids)
        np.testing.assert_array_equal(unpack_bits_reference(ref, n, bits), ids)


@given(spec_routes(model_specs(max_layers=8, max_experts=1024), max_rows=40))
def test_codec_round_trips_valid_routes(pair: tuple[ModelSpec, np.ndarray]) -> None:
    spec, routes = pair
    codec = BitpackCodec(spec.bits_per_id)
    decoded = codec.decode(codec.encode(routes))
    np.testing.assert_array_equal(decoded.reshape(routes.shape), routes)


@given(spec_routes(max_rows=20, all_layers=True))
def test_strategy_routes_are_valid(pair: tuple[ModelSpec, np.ndarray]) -> None:
    spec, routes = pair
    assert routes.shape[1:] == (spec.num_layers, spec.top_k)
    moe = check_routes("s", routes, spec)
    assert moe.shape == (routes.shape[0], spec.num_moe_layers, spec.top_k)


# -- golden frames --------------------------------------------------------------------


def _golden_ids(bits: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1 << bits, size=n)
    ids[0] = (1 << bits) - 1
    ids[-(n // 4) :] = 0
    return ids


GOLDEN: dict[str, tuple[int, np.ndarray]] = {
    **{f"bitpack-v1-bits{b}-mixed": (b, _golden_ids(b, 37, b)) for b in (1, 6, 7, 8, 9, 16)},
    "bitpack-v1-bits6-empty": (6, np.zeros(0, dtype=np.int64)),
    "bitpack-v1-bits9-zeros": (9, np.zeros(12, dtype=np.int64)),
    "bitpack-v1-bits7-routes": (7, _golden_ids(7, 24, 70).reshape(3, 4, 2)),
    **{f"bitpack-v2-bits{b}-mixed": (b, _golden_ids(b, 37, 100 + b)) for b in (1, 6, 9, 16)},
    "bitpack-v2-bits6-empty": (6, np.zeros(0, dtype=np.int64)),
    "bitpack-v2-bits7-routes": (7, _golden_ids(7, 24, 170).reshape(3, 4, 2)),
}
GOLDEN_TAGS = {"bitpack-v2-bits7-routes": 0x02472BB0, "bitpack-v2-bits9-mixed": 0xFFFFFFFF}
"""Position tags of bound golden frames (the other v2 frames are unbound)."""


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_frames(name: str) -> None:
    bits, ids = GOLDEN[name]
    version = 2 if name.startswith("bitpack-v2") else 1
    ensure_golden(FIXTURES, name, BitpackCodec(bits, frame_version=version), ids, tag=GOLDEN_TAGS.get(name, 0))
    check_golden(FIXTURES, name)


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
def test_every_committed_frame_still_decodes(name: str) -> None:
    """Fixtures of earlier format versions stay here, and readable, forever."""
    check_golden(FIXTURES, name)


def test_golden_helper_never_overwrites(tmp_path: Path) -> None:
    ids = np.array([1, 2, 3])
    assert ensure_golden(tmp_path, "f", BitpackCodec(2), ids) is True
    first = (tmp_path / "f.bin").read_bytes()
    assert ensure_golden(tmp_path, "f", BitpackCodec(3), ids) is False
    assert (tmp_path / "f.bin").read_bytes() == first
    assert json.loads((tmp_path / "f.json").read_text())["config"] == {"id": "r3store.bitpack", "bits": 2}
    (tmp_path / "f.bin").write_bytes(BitpackCodec(2).encode([1, 2, 2]))
    with pytest.raises(AssertionError):
        check_golden(tmp_path, "f")


# -- registry -------------------------------------------------------------------------


def test_registry_holds_bitpack_read_only() -> None:
    assert registry["r3store.bitpack"] is BitpackCodec
    with pytest.raises(TypeError):
        registry["x"] = BitpackCodec  # type: ignore[index]


def test_unknown_codec_id() -> None:
    with pytest.raises(UnknownCodecError, match=r"'no.such.codec'") as info:
        get_codec({"id": "no.such.codec"})
    assert info.value.codec_id == "no.such.codec"
    assert isinstance(info.value, ValueError)
    assert "'r3store.codecs' entry-point group" in info.value.hint  # how to install one


def test_frame_size_is_an_optional_ability() -> None:
    assert isinstance(BitpackCodec(6), SupportsFrameSize)
    assert not isinstance(_NoFrameSize(6), SupportsFrameSize)
    assert "frame_size" not in Codec.__abstractmethods__


class _NoFrameSize(Codec):
    """A codec without the optional ability: bitpack frames, decoded by delegation."""

    codec_id = "r3store.test-no-frame-size"

    def __init__(self, bits: int, frame_version: int = 1) -> None:
        self.inner = BitpackCodec(bits, frame_version)

    def encode(self, ids: Any) -> bytes:
        return self.inner.encode(ids)

    def decode(self, buf: Any, out: np.ndarray | None = None) -> np.ndarray:
        return self.inner.decode(buf, out)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, **{k: v for k, v in self.inner.get_config().items() if k != "id"}}


def _store_with_codec_name(root: Path, name: str) -> Any:
    """A small store whose route array's metadata names the codec ``name``."""
    import r3store

    spec = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)
    with r3store.RouteWriter(root, spec) as w:
        w.append("s", np.tile(np.array([3, 9]), (7, 2, 1)))
    (array,) = [p for p in (root / "routes").iterdir() if p.is_dir()]
    doc = json.loads((array / "zarr.json").read_text())
    doc["codecs"][0]["configuration"]["codecs"][0]["name"] = name
    (array / "zarr.json").write_text(json.dumps(doc))
    return r3store.open_store(root)


def test_reader_takes_the_codec_from_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read path names no codec class: the array metadata's codec id goes through get_codec."""
    store = _store_with_codec_name(tmp_path / "a", "no.such.codec")
    with pytest.raises(UnknownCodecError, match=r"no.such.codec.*entry-point group"):
        store.get("s")
    monkeypatch.setattr(registry_module, "_registry", dict(registry_module._registry))
    register_codec(_NoFrameSize)
    store = _store_with_codec_name(tmp_path / "b", _NoFrameSize.codec_id)
    np.testing.assert_array_equal(store.get("s"), np.tile(np.array([3, 9]), (7, 2, 1)))


@pytest.mark.parametrize("config", [None, [], {}, {"id": 5}, {"bits": 6}], ids=repr)
def test_config_without_id(config: Any) -> None:
    with pytest.raises(CodecError, match="string 'id'"):
        get_codec(config)


def test_config_with_unknown_parameter() -> None:
    with pytest.raises(CodecError, match="invalid config") as info:
        get_codec({"id": "r3store.bitpack", "bits": 6, "level": 3})
    assert isinstance(info.value.__cause__, TypeError)


class _Dummy(BitpackCodec):
    codec_id = "r3store.test-dummy"


def test_register_codec_clobber(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_registry", dict(registry_module._registry))
    monkeypatch.setattr(registry_module, "registry", MappingProxyType(registry_module._registry))
    register_codec(_Dummy)
    register_codec(_Dummy)  # the same class again is fine
    assert registry_module._registry["r3store.test-dummy"] is _Dummy
    with pytest.raises(CodecError, match="already registered to BitpackCodec"):
        register_codec(_Dummy, "r3store.bitpack")
    register_codec(_Dummy, "r3store.bitpack", clobber=True)
    assert type(get_codec({"id": "r3store.bitpack", "bits": 3})) is _Dummy


def test_entry_point_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "_registry", {})
    ep = EntryPoint(name="r3store.bitpack", value="r3store.codecs._bitpack:BitpackCodec", group="r3store.codecs")

    def fake_entry_points(*, group: str, name: str) -> list[EntryPoint]:
        return [ep] if (group, name) == ("r3store.codecs", ep.name) else []

    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points)
    assert get_codec({"id": "r3store.bitpack", "bits": 5}) == BitpackCodec(5)
    assert registry_module._registry == {"r3store.bitpack": BitpackCodec}
    with pytest.raises(UnknownCodecError):
        get_codec({"id": "other"})


# -- zarr adapter ---------------------------------------------------------------------


def test_zarr_entry_point_resolves() -> None:
    assert zarr.registry.get_codec_class("r3store.bitpack") is ZarrBitpackCodec


def test_zarr_codec_dict_round_trip() -> None:
    codec = ZarrBitpackCodec(bits=7)
    assert codec.to_dict() == {"name": "r3store.bitpack", "configuration": {"bits": 7}}
    assert ZarrBitpackCodec.from_dict(codec.to_dict()) == codec
    assert ZarrBitpackCodec.from_dict(json.loads(json.dumps(codec.to_dict()))) == codec


def _routes(shape: tuple[int, ...], bits: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << bits, size=shape).astype(np.int32)


def test_zarr_sharded_array_round_trip(tmp_path: Path) -> None:
    data = _routes((100, 4, 8), 7)
    data[90:] = 0  # all-zero inner chunk
    store = ZarrLocalStore(tmp_path / "routes.zarr")
    arr = zarr.create_array(
        store=store,
        shape=data.shape,
        chunks=(50, 4, 8),
        dtype="int32",
        serializer=ShardingCodec(chunk_shape=(10, 4, 8), codecs=[ZarrBitpackCodec(bits=7)]),
        compressors=None,
        fill_value=0,
    )
    arr[:] = data
    meta = json.loads((tmp_path / "routes.zarr" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["codecs"]
    assert inner == [{"name": "r3store.bitpack", "configuration": {"bits": 7}}]
    again = zarr.open_array(store=ZarrLocalStore(tmp_path / "routes.zarr", read_only=True))
    np.testing.assert_array_equal(again[:], data)
    np.testing.assert_array_equal(again[37:61, 1:3], data[37:61, 1:3])


def test_zarr_chunks_are_bitpack_frames() -> None:
    """Each unsharded chunk object is exactly one r3store.bitpack frame; the edge chunk is padded."""
    data = _routes((25, 3, 2), 5, seed=1)
    store = MemoryStore()
    arr = zarr.create_array(
        store=store, shape=data.shape, chunks=(10, 3, 2), dtype="int32",
        serializer=ZarrBitpackCodec(bits=5), compressors=None, fill_value=0,
    )
    arr[:] = data
    np.testing.assert_array_equal(zarr.open_array(store=store)[:], data)
    frame = store._store_dict["c/0/0/0"].to_bytes()
    np.testing.assert_array_equal(BitpackCodec(5).decode(frame), data[:10].reshape(-1))
    edge = BitpackCodec(5).decode(store._store_dict["c/2/0/0"].to_bytes())
    np.testing.assert_array_equal(edge[:30], data[20:].reshape(-1))
    assert (edge[30:] == 0).all()


def test_zarr_corrupt_chunk_raises_checksum_error() -> None:
    data = _routes((10, 2, 2), 4, seed=2) | 1
    store = MemoryStore()
    arr = zarr.create_array(
        store=store, shape=data.shape, chunks=(10, 2, 2), dtype="int32",
        serializer=ZarrBitpackCodec(bits=4), compressors=None, fill_value=0,
    )
    arr[:] = data
    buf = bytearray(store._store_dict["c/0/0/0"].to_bytes())
    buf[-1] ^= 0x10
    store._store_dict["c/0/0/0"] = store._store_dict["c/0/0/0"].from_bytes(bytes(buf))
    with pytest.raises(ChecksumError):
        zarr.open_array(store=store)[:]


def test_zarr_rejects_float_arrays() -> None:
    with pytest.raises(TypeError, match="integer data type"):
        zarr.create_array(
            store=MemoryStore(), shape=(4,), chunks=(4,), dtype="float32",
            serializer=ZarrBitpackCodec(bits=4), compressors=None,
        )


def test_validate_reports_an_unknown_codec_as_a_finding(tmp_path: Path) -> None:
    from r3store.audit import validate

    store = _store_with_codec_name(tmp_path, "no.such.codec")
    report = validate(store)
    (finding,) = [f for f in report.findings if f.kind == "malformed_chunk"]
    assert "no.such.codec" in finding.detail
    assert "entry-point group" in finding.detail


def _recrc(frame: bytearray) -> bytes:
    struct.pack_into("<I", frame, 16, google_crc32c.extend(google_crc32c.value(bytes(frame[:16])), bytes(frame[20:])))
    return bytes(frame)


def test_bitpack_reserved_bytes_must_be_zero() -> None:
    frame = bytearray(BitpackCodec(3).encode(np.array([1, 2])))
    struct.pack_into("<H", frame, 6, 0xBEEF)
    with pytest.raises(FormatError, match="reserved"):
        BitpackCodec(3).decode(_recrc(frame))


def test_bitpack_unused_high_bits_must_be_zero() -> None:
    frame = bytearray(BitpackCodec(3).encode(np.array([1])))
    frame[20] |= 0xF8
    with pytest.raises(FormatError, match="unused high bits"):
        BitpackCodec(3).decode(_recrc(frame))
    assert BitpackCodec(3).decode(BitpackCodec(3).encode(np.array([7, 7, 7]))).tolist() == [7, 7, 7]
