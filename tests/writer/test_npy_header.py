"""decode_vllm reads .npy headers through numpy.lib.format, with r3store's framing and whitelist checks."""

from __future__ import annotations

import base64
import io
import struct
import warnings

import numpy as np
import pytest

import r3store
from r3store.errors import PayloadDecodeError


def _npy(header: str, body: bytes = b"\x00" * 96, version: bytes = b"\x01\x00") -> bytes:
    text = header + " " * (63 - len(header) % 64) + "\n"
    size = struct.pack("<H" if version == b"\x01\x00" else "<I", len(text))
    return b"\x93NUMPY" + version + size + text.encode("latin-1") + body


@pytest.mark.parametrize(("header", "words"), [
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (3L, 4L), }", "not of the form numpy writes"),  # Python 2
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (True, 2), }", "'shape'"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (-3, 4, 2), }", "'shape'"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (" + "1, " * 33 + "), }", "'shape'"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", "'descr'"),
    ("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", "'descr'"),
    ("{'descr': ('<i4', (2,)), 'fortran_order': False, 'shape': (3,), }", "'descr'"),
    ("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,), }", "'descr'"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': " + "(" * 300 + ")" * 300 + "}", "not of the form"),
    ("{'descr': '<i4', 'fortran_order': False}", "not of the form numpy writes"),
    ("{'descr': '<i4', 'fortran_order': False, 'shape': (100, 4, 2), }", "only 96 bytes follow"),
    ("{'descr': 'i4,(', 'fortran_order': False, 'shape': (3,), }", "not of the form numpy writes"),
])
def test_headers_numpy_does_not_write_are_payload_errors_without_warnings(header: str, words: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(PayloadDecodeError, match="routed_experts") as info:
            r3store.decode_vllm("s", base64.b64encode(_npy(header)))
    assert words in str(info.value)


def test_header_longer_than_a_format_1_length_is_refused() -> None:
    blob = b"\x93NUMPY\x02\x00" + struct.pack("<I", 70_000) + b"{" + b" " * 69_998 + b"\n"
    with pytest.raises(PayloadDecodeError, match="header claims 70,000 bytes"):
        r3store.decode_vllm("s", base64.b64encode(blob))


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<i4", "<u2", "|i1", ">i8"])
def test_arrays_come_back_as_np_load_gives_them(order: str, dtype: str) -> None:
    routes = np.random.default_rng(1).integers(0, 100, (5, 3, 2)).astype(dtype)
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(routes) if order == "F" else routes)
    buf.write(b"trailing bytes are ignored, as np.load ignores them")
    got = r3store.decode_vllm("s", base64.b64encode(buf.getvalue()))
    expected = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.flags.f_contiguous == expected.flags.f_contiguous
    assert got.flags.writeable
    np.testing.assert_array_equal(got, routes)
