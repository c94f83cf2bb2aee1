"""kernels.b64decode: pybase64 when installed, the standard library's result and errors always."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import pytest

from r3store.codecs import kernels

ODD = ["QQ", "QQ=", "Q===", "=", "QQ==QQ==", "QUJD\n", "QU JD", "QUJ*", "\u00e9QUJ", "QR==", "QUI=", "",
       "AAAA====", "QUJDQUJD" * 20 + "QU=D", "A"]


def _verdict(fn, value):  # type: ignore[no-untyped-def]
    try:
        return bytes(fn(value))
    except (binascii.Error, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("text", ODD)
@pytest.mark.parametrize("with_pybase64", [True, False])
def test_b64decode_is_the_standard_library_with_or_without_pybase64(monkeypatch: pytest.MonkeyPatch, text: str,
                                                                     with_pybase64: bool) -> None:
    if not with_pybase64:
        monkeypatch.setattr(kernels, "_pybase64", None)
    for value in (text, text.encode("utf-8")):
        expected = _verdict(lambda v: base64.b64decode(v, validate=True), value)
        assert _verdict(lambda v: kernels.b64decode(v).tobytes(), value) == expected


def test_pybase64_does_the_decoding_when_installed() -> None:
    pybase64 = pytest.importorskip("pybase64")
    assert kernels._pybase64 is pybase64
    raw = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
    got = kernels.b64decode(base64.b64encode(raw))
    assert got.dtype == np.uint8
    assert got.flags.writeable
    assert got.tobytes() == raw


def test_the_extension_has_no_base64_of_its_own() -> None:
    native = kernels.native_module()
    if native is None:
        pytest.skip("no C extension built")
    assert not hasattr(native, "b64decode")
    assert not hasattr(native, "b64_decoded_size")
