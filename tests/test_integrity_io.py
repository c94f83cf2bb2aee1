"""Issue 13, the I/O items: malformed engine payloads and storage options are r3store errors,
credentials never reach a message, a stalled S3 response is a bounded StorageError.

(Item 2, an object truncated under a reader, is in ``test_storage.py``; the fuzz harness and
its regression inputs in ``tests/fuzz/``.)
"""

from __future__ import annotations

import base64
import io
import struct

import numpy as np
import pytest

import r3store
from r3store.errors import PayloadDecodeError, R3StoreError

# -- item 7: malformed .npy headers in decode_vllm ------------------------------------------------------


def _npy(header: str, body: bytes = b"\x00" * 96, version: bytes = b"\x01\x00") -> bytes:
    text = header + " " * (63 - len(header) % 64) + "\n"
    size = struct.pack("<H" if version == b"\x01\x00" else "<I", len(text))
    return b"\x93NUMPY" + version + size + text.encode("latin-1") + body


@pytest.mark.parametrize("header", [
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), ",  # TokenError (EOF in multi-line statement)
    "{'descr': '<i4' 'fortran_order': False, 'shape': (3, 4, 2)}",  # SyntaxError
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4sn, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), 'x': __import__('os').getpid()}",
    "{'descr': '<i4', 'fortran_order': False, 'shape': [3, 4, 2]}",
    "{'descr': '<i4', 'descr': '<i4', 'shape': (3, 4, 2)}",
    "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 4, 1), }",
    "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,), }",
    "{'descr': '<i4', 'fortran_order': 0, 'shape': (3, 4, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (-3, 4, 2), }",
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), }\udcff",
    "",
])
def test_malformed_npy_header_is_a_payload_error(header: str) -> None:
    """Item 7: numpy's header parser (``ast``/``tokenize``) raised TokenError or SyntaxError out of
    ``decode_vllm``; the header is now parsed with a whitelist and refused as a PayloadDecodeError."""
    blob = _npy(header.encode("utf-8", "surrogateescape").decode("latin-1"))
    with pytest.raises(PayloadDecodeError, match="routed_experts") as info:
        r3store.decode_vllm("s7", base64.b64encode(blob))
    assert info.value.sample_id == "s7"


@pytest.mark.parametrize("raw", [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00\xff\xff{", b"\x93NUMPY\x03\x00\x10\x00\x00\x00",
                                 b"PK\x03\x04 a zip, as np.load would open"])
def test_truncated_or_foreign_npy_blob_is_a_payload_error(raw: bytes) -> None:
    with pytest.raises(PayloadDecodeError):
        r3store.decode_vllm("s", base64.b64encode(raw))


@pytest.mark.parametrize(("dtype", "order"), [("<i4", "C"), ("<u2", "C"), ("|u1", "C"), ("<i8", "F"), (">i2", "C")])
def test_npy_headers_numpy_writes_still_decode(dtype: str, order: str) -> None:
    routes = np.arange(24).reshape(3, 4, 2).astype(dtype)
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(routes) if order == "F" else routes)
    for version in ((1, 0), (2, 0)):
        blob = buf.getvalue() if version == (1, 0) else _v2(buf.getvalue())
        got = r3store.decode_vllm("s", base64.b64encode(blob))
        np.testing.assert_array_equal(got, routes)


def _v2(blob: bytes) -> bytes:
    """A format 1.0 ``.npy`` rewritten as format 2.0 (a 4-byte header length)."""
    (length,) = struct.unpack_from("<H", blob, 8)
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", length) + blob[10:]


def test_every_r3store_error_here_is_one() -> None:
    assert issubclass(PayloadDecodeError, R3StoreError)
