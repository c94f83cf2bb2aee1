"""Compiled kernels == numpy twins == plain-Python references, on every width, size and layout.

Every test runs once per implementation available here (``numpy``, and with the C
extension built ``native`` (portable C) and ``native-avx2``), switched with
:func:`r3store.codecs.kernels.use`. The fallback is also checked the way users get it:
in a subprocess with ``R3STORE_NO_NATIVE=1``, and with the extension made unimportable.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import r3store
from r3store import decode_sglang, encode_sglang
from r3store._format import MANIFEST_KEY, make_manifest, manifest_bytes
from r3store._validate import check_routes
from r3store.codecs import (
    BitpackCodec,
    kernels,
    pack_bits_reference,
    unpack_bits_reference,
)
from r3store.errors import CodecError, ExpertIdError, PayloadDecodeError
from r3store.layout import pad_routes
from r3store.testing.strategies import (
    bit_widths,
    distinct_ids,
    expert_ids,
    payloads,
    seeds,
)

ROOT = Path(__file__).resolve().parents[2]
IMPLEMENTATIONS = ["numpy"] + (
    ["native"] + (["native-avx2"] if kernels.native_module() and kernels.native_module().cpu_features()["avx2"]
                  else [])
    if kernels.native_module() is not None else []
)
ODD_SIZES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
             1023, 4095, 4096, 4097, 8191, 8193, 12345]
INT_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    with kernels.use(request.param):
        assert request.param == kernels.IMPLEMENTATION
        yield request.param


def _each_impl() -> Iterator[str]:
    """Inside a hypothesis test (no fixtures per example): run the body once per implementation."""
    for name in IMPLEMENTATIONS:
        with kernels.use(name):
            yield name


def _layout(ids: np.ndarray, how: str) -> np.ndarray:
    """The same ids (C order) in another memory layout: strided, reversed or unaligned."""
    if how == "contiguous":
        return ids
    if how == "strided":
        wide = np.zeros(ids.size * 3, dtype=ids.dtype)
        wide[::3] = ids
        return wide[::3]
    if how == "reversed":
        return ids[::-1].copy()[::-1]
    raw = np.zeros(ids.nbytes + 1, dtype=np.uint8)  # one byte off the allocation's alignment
    view = raw[1:].view(ids.dtype) if ids.size else raw[1:1].view(ids.dtype)
    view[...] = ids
    return view


LAYOUTS = ["contiguous", "strided", "reversed", "unaligned"]


# -- bit-packing ---------------------------------------------------------------------


@pytest.mark.parametrize("bits", range(1, 17))
def test_pack_unpack_every_width_and_odd_size(impl: str, bits: int) -> None:
    rng = np.random.default_rng(bits)
    for n in ODD_SIZES:
        ids = rng.integers(0, 1 << bits, size=n)
        ids[: min(n, 3)] = (1 << bits) - 1  # the widest value in the first group
        ref = pack_bits_reference(ids, bits)
        for dtype in ("uint16", "int32", "int64"):
            assert kernels.pack_bits(ids.astype(dtype), bits).tobytes() == ref, (impl, bits, n, dtype)
        payload = np.frombuffer(ref, dtype=np.uint8)
        for out_dtype in kernels.OUT_DTYPES:
            if (1 << bits) - 1 > np.iinfo(out_dtype).max:
                continue
            got = kernels.unpack_bits(payload, n, bits, dtype=out_dtype)
            assert got.dtype == out_dtype
            assert got.shape == (n,)
            np.testing.assert_array_equal(got, ids, err_msg=f"{impl} bits={bits} n={n} {out_dtype}")


@given(st.data())
def test_pack_bits_any_dtype_and_layout(data: st.DataObject) -> None:
    bits = data.draw(bit_widths())
    dtype = data.draw(st.sampled_from([d for d in INT_DTYPES if np.iinfo(d).max >= (1 << bits) - 1]))
    ids = data.draw(expert_ids(bits, max_size=3000, dtype=dtype))
    how = data.draw(st.sampled_from(LAYOUTS))
    ref = pack_bits_reference(ids, bits)
    for name in _each_impl():
        packed = kernels.pack_bits(_layout(ids, how), bits)
        assert packed.dtype == np.uint8
        assert packed.tobytes() == ref, (name, how)


@given(st.data())
def test_unpack_any_payload_into_any_out(data: st.DataObject) -> None:
    """Any payload (padding bits included) into every dtype and layout of out; zeros after n."""
    bits = data.draw(bit_widths())
    n = data.draw(st.one_of(st.sampled_from(ODD_SIZES[:20]), st.integers(0, 3000)))
    payload = data.draw(payloads(n, bits))
    extra = data.draw(st.integers(0, 9))
    dtype = data.draw(st.sampled_from(INT_DTYPES))
    how = data.draw(st.sampled_from(LAYOUTS))
    expected = unpack_bits_reference(payload, n, bits).astype(np.int64).astype(dtype)  # wraps like numpy
    for name in _each_impl():
        out = _layout(np.full(n + extra, 99, dtype=dtype), how)
        got = kernels.unpack_into(np.frombuffer(payload, dtype=np.uint8), n, bits, out)
        assert got is out
        np.testing.assert_array_equal(out[:n], expected, err_msg=f"{name} {how}")
        assert (out[n:] == 0).all(), name


def test_unpack_reads_only_its_bytes(impl: str) -> None:
    """A payload exactly ceil(n * bits / 8) bytes long, at the very end of its buffer."""
    for bits in range(1, 17):
        for n in (1, 9, 17, 100, 1001):
            ids = np.random.default_rng(n).integers(0, 1 << bits, size=n)
            ref = pack_bits_reference(ids, bits)
            np.testing.assert_array_equal(kernels.unpack_bits(memoryview(ref), n, bits), ids)


def test_unpack_argument_errors(impl: str) -> None:
    with pytest.raises(CodecError, match="bits must be"):
        kernels.unpack_bits(b"\x00", 1, 17)
    with pytest.raises(CodecError, match="cannot hold 9-bit ids"):
        kernels.unpack_bits(b"\x00\x00", 1, 9, dtype=np.uint8)
    with pytest.raises(CodecError, match="cannot hold 16-bit ids"):
        kernels.unpack_bits(b"\x00\x00", 1, 16, dtype=np.int16)
    with pytest.raises(CodecError, match="output dtype"):
        kernels.unpack_bits(b"\x00", 1, 4, dtype=np.float32)
    with pytest.raises(CodecError, match="need 2 payload bytes"):
        kernels.unpack_bits(b"\x00", 2, 5)
    with pytest.raises(CodecError, match="room in out"):
        kernels.unpack_into(b"\x00" * 8, 5, 8, np.zeros(4, np.int32))
    with pytest.raises(CodecError, match="integer ndarray"):
        kernels.unpack_into(b"\x00", 1, 8, np.zeros(4, np.float64))


# -- whole frames --------------------------------------------------------------------


@given(st.data())
def test_frames_identical_across_implementations(data: st.DataObject) -> None:
    bits = data.draw(bit_widths())
    dtype = data.draw(st.sampled_from([d for d in INT_DTYPES if np.iinfo(d).max >= (1 << bits) - 1]))
    ids = data.draw(expert_ids(bits, max_size=3000, dtype=dtype))
    how = data.draw(st.sampled_from(LAYOUTS))
    version = data.draw(st.sampled_from([1, 2]))
    tag = data.draw(st.integers(0, 2**32 - 1)) if version == 2 else 0
    codec = BitpackCodec(bits, frame_version=version)
    frames = {}
    for name in _each_impl():
        frames[name] = codec.encode(_layout(ids, how), tag=tag)
        check = kernels.check_frame(frames[name], bits)
        assert (check.status, check.n_total, check.tag) == (0, ids.size, tag)
        assert check.header == kernels.FRAME_HEADERS[version]
        for out_dtype in ("int32", "int64", "uint16"):
            out = np.full(ids.size, 7, dtype=out_dtype)
            got = codec.decode(frames[name], out=out, tag=tag if version == 2 else None)
            assert got is out
            np.testing.assert_array_equal(out, ids)
    assert len(set(frames.values())) == 1, "frame bytes differ between implementations"


@given(st.data())
def test_check_frame_agrees_on_damaged_frames(data: st.DataObject) -> None:
    """Compiled and numpy frame checks find the same first fault in v1 and v2 frames, however damaged."""
    bits = data.draw(bit_widths())
    version = data.draw(st.sampled_from([1, 2]))
    ids = data.draw(expert_ids(bits, max_size=200))
    frame = bytearray(kernels.encode_frame(ids, bits, version=version,
                                           tag=data.draw(st.integers(0, 2**32 - 1)) if version == 2 else 0) or b"")
    for _ in range(data.draw(st.integers(0, 3))):
        what = data.draw(st.sampled_from(["flip", "cut", "grow", "version"]))
        if what == "flip" and frame:
            frame[data.draw(st.integers(0, len(frame) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        elif what == "cut":
            del frame[data.draw(st.integers(0, len(frame))):]
        elif what == "grow":
            frame += bytes(data.draw(st.binary(min_size=1, max_size=4)))
        elif len(frame) > 4:
            frame[4] = data.draw(st.sampled_from([0, 1, 2, 3]))
    found = {name: kernels.check_frame(bytes(frame), bits) for name in _each_impl()}
    assert len(set(found.values())) == 1, found


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_frame_range_errors_name_the_range(impl: str, dtype: str) -> None:
    codec = BitpackCodec(5)
    info = np.iinfo(dtype)
    for bad in {32, info.max, info.min if info.min < 0 else 33}:
        ids = np.array([1, 2, bad, 3], dtype=dtype)
        lo, hi = min(1, int(bad)), max(3, int(bad))
        with pytest.raises(CodecError, match=rf"got range \[{lo}, {hi}\]"):
            codec.encode(ids)


def test_frame_faults_are_named_as_before(impl: str) -> None:
    frame = bytearray(BitpackCodec(6).encode(np.arange(64) % 64))
    frame[-1] ^= 0x01
    with pytest.raises(r3store.errors.ChecksumError, match="CRC-32C mismatch"):
        BitpackCodec(6).decode(bytes(frame))
    with pytest.raises(r3store.errors.FormatError, match="shorter than the 20-byte header"):
        BitpackCodec(6).decode(b"R3BP")


def test_native_crc32c_matches_google_crc32c() -> None:
    native = kernels.native_module()
    if native is None:
        pytest.skip(f"no C extension: {kernels.NATIVE_UNAVAILABLE}")
    data = np.random.default_rng(0).integers(0, 256, 10_007, dtype=np.uint8).tobytes()
    for simd in ("scalar", "avx2") if native.cpu_features()["sse4.2"] else ("scalar",):
        prev = native.set_simd(simd)
        try:
            for cut in (0, 1, 7, 8, 9, 4096, 10_007):
                assert native.crc32c(data[:cut]) == google_crc32c.value(data[:cut])
                assert native.crc32c(data[cut:], google_crc32c.value(data[:cut])) == google_crc32c.value(data)
        finally:
            native.set_simd(prev)
    assert native.crc32c(b"123456789") == 0xE3069283  # schema/FORMAT.md check value


# -- route checks --------------------------------------------------------------------


def _routes_with_faults(rng: np.random.Generator, rows: int, layers: int, top_k: int, num_experts: int,
                        dense: list[int], faults: set[str]) -> np.ndarray:
    """Valid int64 routes, then up to three faults of each kind in ``faults`` at random spots."""
    routes = distinct_ids(rng, (rows, layers), num_experts, top_k)
    routes[:, dense] = 0
    moe = [layer for layer in range(layers) if layer not in dense]
    for kind in sorted(faults):
        spots = dense if kind == "dense" else moe
        if not rows or not spots or (kind == "repeat" and top_k < 2):
            continue
        for _ in range(int(rng.integers(1, 4))):  # several faults: the first one must be reported
            r, layer, k = int(rng.integers(rows)), int(rng.choice(spots)), int(rng.integers(top_k))
            if kind == "range":
                routes[r, layer, k] = rng.choice([-1, num_experts, num_experts + 1000])
            elif kind == "repeat":
                routes[r, layer, k] = routes[r, layer, (k + 1) % top_k]
            else:
                routes[r, layer, k] = 5
    return routes


@given(st.data())
def test_check_ids_agrees_with_numpy(data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(seeds()))
    num_experts = data.draw(st.sampled_from([2, 8, 64, 100, 256, 512, 65536]))
    top_k = data.draw(st.integers(1, min(num_experts, 20)))
    layers = data.draw(st.integers(1, 9))
    rows = data.draw(st.sampled_from([0, 1, 2, 7, 33, 200]))
    dense = sorted({int(v) for v in rng.integers(0, layers, size=data.draw(st.integers(0, layers - 1)))})
    faults = data.draw(st.sets(st.sampled_from(["range", "repeat", "dense"])))
    routes = _routes_with_faults(rng, rows, layers, top_k, num_experts, dense, faults)
    dtype = data.draw(st.sampled_from(["int32", "int64", "int16", "uint16"] if num_experts < 30000
                                      else ["int32", "int64", "uint32"]))
    if np.dtype(dtype).kind == "u":
        routes = np.where(routes < 0, np.iinfo(dtype).max, routes)
    routes = routes.astype(dtype)
    if data.draw(st.booleans()):
        routes = np.ascontiguousarray(np.swapaxes(routes, 0, 1)).swapaxes(0, 1)  # layer-major memory
    moe = None if not dense else [layer not in dense for layer in range(layers)]
    results = {}
    for name in _each_impl():
        out = np.full((rows, layers - len(dense), top_k), 7, dtype=np.uint16)
        results[name] = kernels.check_ids(routes, num_experts, moe=moe, out=out)
        if results[name] is None:
            np.testing.assert_array_equal(out, routes[:, [i for i in range(layers) if i not in dense]])
    assert len(set(results.values())) == 1, results
    if not faults:
        assert results["numpy"] is None


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "int8"])
def test_check_routes_messages_unchanged(impl: str, dtype: str) -> None:
    """The writer's messages name the same row, decoder layer and ids on every implementation."""
    spec = r3store.ModelSpec(num_layers=6, num_experts=100, top_k=4, moe_layers=[1, 2, 4, 5])
    rng = np.random.default_rng(1)
    full = np.zeros((10, 6, 4), dtype=np.int64)
    full[:, [1, 2, 4, 5]] = distinct_ids(rng, (10, 4), 100, 4)
    cases: list[tuple[Any, str]] = []
    bad = full.copy()
    bad[7, 4, 2] = 100
    bad[8, 3, 1] = 4  # a later dense fault still wins: dense layers are checked first
    cases.append((bad, r"dense decoder layer 3 has non-zero ids at row 8 \(\[0, 4, 0, 0\]\)"))
    bad = full.copy()
    bad[7, 4, 2] = 100
    bad[3, 1, 0] = bad[3, 1, 1]  # an earlier repeat loses to the range fault
    cases.append((bad, r"expert id 100 at row 7, decoder layer 4 is >= num_experts \(100\); physical"))
    bad = full.copy()
    bad[5, 5, 3] = bad[5, 5, 0]
    cases.append((bad, rf"expert id repeated within row 5, decoder layer 5: \[{', '.join(map(str, bad[5, 5]))}\]"))
    if np.iinfo(dtype).min < 0:
        bad = full.copy()
        bad[2, 2, 1] = -3
        cases.append((bad, r"expert id -3 at row 2, decoder layer 2 is negative"))
    for routes, message in cases:
        narrow = routes.astype(dtype) if np.iinfo(dtype).max >= 100 else None
        if narrow is None:
            continue
        for arr in (narrow, narrow[:, [1, 2, 4, 5]] if "dense" not in message else narrow):
            with pytest.raises(ExpertIdError, match=message):
                check_routes("s", arr, spec)
    np.testing.assert_array_equal(check_routes("s", full.astype(dtype), spec), full[:, [1, 2, 4, 5]])


# -- row gather ----------------------------------------------------------------------


@given(st.data())
def test_gather_rows_agrees_with_numpy(data: st.DataObject) -> None:
    rng = np.random.default_rng(data.draw(seeds()))
    rows, layers, top_k = data.draw(st.integers(0, 50)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 9))
    num_experts = data.draw(st.sampled_from([top_k, 64, 128, 256]))
    src = rng.integers(0, num_experts, size=(rows, layers, top_k)).astype(
        data.draw(st.sampled_from(["int32", "uint16", "int64", "uint8"])))
    if data.draw(st.booleans()):
        src = np.asfortranarray(src)
    n = data.draw(st.integers(0, 80))
    index = rng.integers(-1, rows, size=n).astype(np.int64) if rows else np.full(n, -1, dtype=np.int64)
    out_dtype = data.draw(st.sampled_from(kernels.OUT_DTYPES))
    spread = data.draw(st.booleans())
    pad_start = data.draw(st.integers(0, 1000))
    expected = np.empty((n, layers, top_k), dtype=np.int64)
    pads = index < 0
    expected[~pads] = src[index[~pads]]
    if spread:
        expected[pads] = pad_routes(int(pad_start + pads.sum()), layers, top_k, num_experts)[pad_start:]
    else:
        expected[pads] = 3
    for name in _each_impl():
        out = np.full((n, layers, top_k), 77, dtype=out_dtype)
        got = kernels.gather_rows(src, index, out, fill_value=3, num_experts=num_experts if spread else None,
                                  pad_start=pad_start)
        assert got == int(pads.sum())
        np.testing.assert_array_equal(out, expected.astype(out_dtype), err_msg=name)


def test_gather_rows_rejects_bad_index(impl: str) -> None:
    src = np.zeros((4, 2, 2), np.int32)
    for bad in (4, -2):
        with pytest.raises(CodecError, match="outside"):
            kernels.gather_rows(src, np.array([0, bad]), np.zeros((2, 2, 2), np.int32))
    with pytest.raises(CodecError, match="int64 index"):
        kernels.gather_rows(src, np.array([0], dtype=np.int32), np.zeros((1, 2, 2), np.int32))


# -- base64 --------------------------------------------------------------------------


@given(st.binary(max_size=3000), st.booleans())
def test_b64decode_matches_the_standard_library(raw: bytes, as_str: bool) -> None:
    text: str | bytes = base64.b64encode(raw)
    text = text.decode() if as_str else text
    for name in _each_impl():
        got = kernels.b64decode(text)
        assert got.dtype == np.uint8
        assert got.flags.writeable
        assert got.tobytes() == raw, name


@pytest.mark.parametrize("text", [
    "QQ", "QQ=", "Q===", "=", "==", "QQ==QQ==", "QUJD\n", "QU JD", "QUJ*", "QUJDQUJD" * 20 + "QU=D",
    "QUJDQUJD" * 20 + "!UJD", "QUJDQUJD" * 20 + "QUJ", "\u00e9QUJ", "QR==", "QUI=", "",
])
def test_b64decode_odd_input_as_the_standard_library(impl: str, text: str) -> None:
    """Valid or not, the result (or the error and its message) is base64.b64decode(validate=True)'s."""
    for value in (text, text.encode("utf-8")):
        try:
            expected: bytes | str = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            expected = f"{type(exc).__name__}: {exc}"
        try:
            got: bytes | str = kernels.b64decode(value).tobytes()
        except (binascii.Error, ValueError) as exc:
            got = f"{type(exc).__name__}: {exc}"
        assert got == expected


def test_decode_sglang_on_every_implementation(impl: str) -> None:
    spec = r3store.ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=range(3, 61))
    routes = np.zeros((300, 61, 8), dtype=np.int32)
    routes[:, 3:] = distinct_ids(np.random.default_rng(0), (300, 58), 256, 8)
    got = decode_sglang("s", encode_sglang(routes), spec)
    assert got.dtype == np.int32
    assert got.flags.writeable
    np.testing.assert_array_equal(got, routes)
    with pytest.raises(PayloadDecodeError, match="is not valid base64: Only base64 data is allowed"):
        decode_sglang("s", encode_sglang(routes)[:-8] + "!AAAAAAA", spec)
    with pytest.raises(PayloadDecodeError, match="looks like int64"):
        decode_sglang("s", base64.b64encode(routes.astype("<i8").tobytes()).decode(), spec)


# -- the writer end to end, and the fallback as users get it -------------------------


def test_writer_stores_identical_bytes_on_every_implementation(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=5, num_experts=64, top_k=6, moe_layers=[1, 2, 3, 4])
    rng = np.random.default_rng(3)
    routes = np.zeros((700, 5, 6), dtype=np.int32)
    routes[:, 1:] = distinct_ids(rng, (700, 4), 64, 6)
    stores = {}
    for name in IMPLEMENTATIONS:
        with kernels.use(name):
            where = tmp_path / name
            where.mkdir()  # one store identity for all: format 3 frame tags include it
            (where / MANIFEST_KEY).write_bytes(manifest_bytes(make_manifest(spec, store_id="0" * 32)))
            with r3store.RouteWriter(where, spec, config={"writer_id": "w"}) as writer:
                writer.append_sglang("a", encode_sglang(routes), num_tokens=701)
                writer.append("b", routes[:333, 1:], num_tokens=334)
            with r3store.open_store(where) as store:
                np.testing.assert_array_equal(store.get("a"), routes[:, 1:])
                np.testing.assert_array_equal(store.get("b"), routes[:333, 1:])
            stores[name] = sorted(p.read_bytes() for p in (where / "routes").rglob("c/*/*/*"))
    assert all(blobs == stores["numpy"] for blobs in stores.values())


def _run(code: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **env}, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


ROUND_TRIP = """
import json, sys
{setup}
import numpy as np
import r3store
from r3store.codecs import BitpackCodec, kernels
ids = np.arange(1000) % 100
frame = BitpackCodec(7).encode(ids)
ok = (BitpackCodec(7).decode(frame) == ids).all()
print(json.dumps({{"impl": kernels.IMPLEMENTATION, "why": kernels.NATIVE_UNAVAILABLE, "ok": bool(ok),
                  "frame": frame.hex()}}))
"""


def test_fallback_with_env_var_disabled() -> None:
    report = _run(ROUND_TRIP.format(setup=""), {"R3STORE_NO_NATIVE": "1"})
    assert report["impl"] == "numpy"
    assert "R3STORE_NO_NATIVE" in report["why"]
    assert report["ok"]
    assert bytes.fromhex(report["frame"]) == BitpackCodec(7).encode(np.arange(1000) % 100)


def test_fallback_when_the_extension_is_absent() -> None:
    block = "sys.modules['r3store.codecs._kernels'] = None  # import fails as if never built"
    report = _run(ROUND_TRIP.format(setup=block), {"R3STORE_NO_NATIVE": ""})
    assert report["impl"] == "numpy"
    assert "not built" in report["why"]
    assert report["ok"]


def test_extension_is_built_where_a_compiler_is() -> None:
    """After ``pip install`` (CI installs from a fresh clone) the kernels must be there."""
    if not os.environ.get("CI"):
        pytest.skip("checked in CI, which installs the package first (a bare checkout has no build)")
    if shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0]) is None:
        pytest.skip("no C compiler: the numpy fallback is expected")
    assert kernels.IMPLEMENTATION.startswith("native"), kernels.NATIVE_UNAVAILABLE


def test_use_rejects_unknown_names() -> None:
    with pytest.raises(CodecError, match="implementation must be"), kernels.use("fortran"):
        pass
    before = kernels.IMPLEMENTATION
    with kernels.use("numpy"):
        assert kernels.implementation() == "numpy"
    assert before == kernels.IMPLEMENTATION


def test_describe_and_version_report_the_implementation() -> None:
    from click.testing import CliRunner

    from r3store.cli import main

    info = kernels.describe()
    assert info["implementation"] == kernels.IMPLEMENTATION
    assert (info["extension"] is None) == (kernels.native_module() is None) == (info["unavailable"] is not None)
    assert info["disable_env"] == "R3STORE_NO_NATIVE"
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert f"(kernels: {kernels.IMPLEMENTATION})" in result.output


# -- the AVX-512 (VBMI) unpack and the AVX2 one it replaces where the CPU has it -----------


def _avx512_levels() -> list[bool]:
    native = kernels.native_module()
    if native is None or not native.cpu_features()["avx2"] or not hasattr(native, "set_avx512"):
        return []
    try:
        native.set_avx512(native.set_avx512(True))
    except ValueError:
        return [False]
    return [False, True]


@pytest.mark.parametrize("avx512", _avx512_levels())
def test_unpack_avx2_and_avx512_equal_the_reference(avx512: bool) -> None:
    """Every width into every output word, sizes around the 16-id step, payloads that end
    exactly where their ids do (the plain 32-byte loads stop before the end, the masked
    ones finish it)."""
    native = kernels.native_module()
    assert native is not None
    rng = np.random.default_rng(512)
    with kernels.use("native-avx2"):
        prev = native.set_avx512(avx512)
        try:
            for bits in range(1, 17):
                for n in (*range(50), 63, 64, 65, 255, 256, 257, 1000, 4099):
                    ids = rng.integers(0, 1 << bits, n)
                    payload = pack_bits_reference(ids, bits)
                    for dtype in (np.uint8, np.uint16, np.int32):
                        want = ids.astype(np.int64).astype(dtype)  # truncated like a cast
                        out = np.full(n + 3, 99, dtype)
                        native.unpack(payload, 0, n, bits, out)
                        np.testing.assert_array_equal(out[:n], want, err_msg=f"avx512={avx512} {bits=} {n=} {dtype}")
                        assert (out[n:] == 0).all()
        finally:
            native.set_avx512(prev)


@pytest.mark.parametrize("avx512", _avx512_levels())
def test_decode_frames_rows_path_avx2_and_avx512(avx512: bool) -> None:
    """Chunks whose rows are byte-aligned (layers_per_chunk * top_k a multiple of 8, odd and
    even multiples) decode straight into int32 rows with the AVX2 and AVX-512 kernels."""
    native = kernels.native_module()
    assert native is not None
    rng = np.random.default_rng(8)
    with kernels.use("native-avx2"):
        prev = native.set_avx512(avx512)
        try:
            for bits in (3, 6, 7, 9, 12, 15):
                codec = BitpackCodec(bits, 2)
                for cr, lpc, top_k, layers in ((5, 1, 8, 3), (4, 3, 8, 6), (3, 4, 6, 8), (2, 2, 8, 4)):
                    want = rng.integers(0, 1 << bits, (3 * cr, layers, top_k))
                    frames, starts, rows, lays = [], [], [], []
                    for r in range(3):
                        for b in range(layers // lpc):
                            starts.append(sum(len(f) for f in frames))
                            frames.append(codec.encode(want[r * cr : (r + 1) * cr, b * lpc : (b + 1) * lpc]))
                            rows.append(r * cr)
                            lays.append(b * lpc)
                    out = np.full(want.shape, 99, np.int32)
                    n = len(frames)
                    got = kernels.decode_frames(b"".join(frames), np.array(starts, np.int64),
                                                np.array([len(f) for f in frames], np.int64), bits, out,
                                                np.array(rows, np.int64), np.array(lays, np.int64), chunk_rows=cr,
                                                layers_per_chunk=lpc, row_chunks=np.zeros(n, np.int64),
                                                layer_chunks=np.zeros(n, np.int64))
                    assert got == -1
                    np.testing.assert_array_equal(out, want, err_msg=f"avx512={avx512} {bits=} {cr=} {lpc=}")
        finally:
            native.set_avx512(prev)


def test_set_avx512_reports_and_refuses() -> None:
    native = kernels.native_module()
    if native is None or not hasattr(native, "set_avx512"):
        pytest.skip("no extension with set_avx512")
    if _avx512_levels() == [False, True]:
        with kernels.use("native-avx2"):
            prev = native.set_avx512(False)
            try:
                assert native.set_avx512(True) is False
                assert native.set_avx512(True) is True
            finally:
                native.set_avx512(prev)
    else:
        with pytest.raises(ValueError, match="AVX-512"):
            native.set_avx512(True)


@pytest.mark.parametrize("avx512", _avx512_levels())
def test_unpack_with_non_temporal_stores_equals_the_reference(avx512: bool) -> None:
    """``set_stream_min(0)``: every unpack writes with non-temporal stores (by default only
    outputs of a last-level cache or more); every width into every output word, at every
    alignment of ``out`` to 32 bytes (the head before the first aligned store), and out of
    its word's alignment (plain stores)."""
    native = kernels.native_module()
    assert native is not None
    rng = np.random.default_rng(16)
    with kernels.use("native-avx2"):
        prev, prev_min = native.set_avx512(avx512), native.set_stream_min(0)
        try:
            for bits in range(1, 17):
                for n in (0, 1, 7, 8, 15, 16, 17, 31, 33, 64, 129, 1000, 4099):
                    ids = rng.integers(0, 1 << bits, n)
                    payload = pack_bits_reference(ids, bits)
                    for dtype in (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.uint32):
                        size = np.dtype(dtype).itemsize
                        for shift in (0, 1, 3, 8, 31) if size == 1 else (0, 1, 4, 7):
                            buf = np.full((n + 40) * size + 40, 99, np.uint8)
                            start = shift * size + (-buf.ctypes.data) % 32
                            out = buf[start : start + (n + 3) * size].view(dtype)
                            native.unpack(payload, 0, n, bits, out)
                            np.testing.assert_array_equal(out[:n], ids.astype(np.int64).astype(dtype),
                                                          err_msg=f"{avx512=} {bits=} {n=} {dtype} {shift=}")
                            assert (out[n:] == 0).all()
                            assert (buf[:start] == 99).all()
                            assert (buf[start + (n + 3) * size :] == 99).all()
                        if size > 1 and n:  # not aligned to its word
                            raw = np.full((n + 3) * size + 1, 99, np.uint8)
                            odd = raw[1:].view(dtype)
                            native.unpack(payload, 0, n, bits, odd)
                            np.testing.assert_array_equal(odd[:n], ids.astype(np.int64).astype(dtype))
        finally:
            native.set_avx512(prev)
            native.set_stream_min(prev_min)


def test_set_stream_min_reports_and_refuses() -> None:
    native = kernels.native_module()
    if native is None or not hasattr(native, "set_stream_min"):
        pytest.skip("no extension with set_stream_min")
    default = native.set_stream_min(-1)
    try:
        assert native.set_stream_min(12345) > 0  # the default: one last-level cache
        assert native.set_stream_min(-1) == 12345
        with pytest.raises(ValueError, match="nbytes"):
            native.set_stream_min(-2)
    finally:
        native.set_stream_min(default)
