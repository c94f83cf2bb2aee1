"""Issue 13, the I/O items: malformed engine payloads and storage options are r3store errors,
credentials never reach a message, a stalled S3 response is a bounded StorageError.

(Item 2, an object truncated under a reader, is in ``test_storage.py``; the fuzz harness and
its regression inputs in ``tests/fuzz/``.)
"""

from __future__ import annotations

import base64
import io
import pickle
import struct
import time
import traceback
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import PayloadDecodeError, R3StoreError, StorageError
from r3store.storage import FsspecBackend, open_backend
from r3store.testing.s3 import S3Counter

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
ROUTES = np.array([[[0, 1], [2, 3]]] * 5)
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"

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


# -- item 7: s3 storage_options checked at open ---------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize(("edit", "words"), [
    ({"endpont_url": "http://127.0.0.1:9"}, "unknown storage option 'endpont_url' (did you mean 'endpoint_url'?)"),
    ({"anon": "yes"}, "storage option 'anon' must be true or false, got str 'yes'"),
    ({"key": 123}, "storage option 'key' must be a string, got int 123"),
    ({"use_ssl": "no"}, "storage option 'use_ssl' must be true or false"),
    ({"client_kwargs": {"endpoint": "http://x"}}, "unknown storage option 'client_kwargs.endpoint' (did you mean"),
    ({"client_kwargs": {"endpoint_url": 5}}, "storage option 'client_kwargs.endpoint_url' must be a string"),
    ({"config_kwargs": {"connect_timout": 3}}, "unknown storage option 'config_kwargs.connect_timout' (did you"),
    ({"config_kwargs": {"retries": "x"}}, "storage option 'config_kwargs' is refused by botocore"),
    ({"config_kwargs": {"retries": {"mode": "sometimes"}}}, "storage option 'config_kwargs' is refused by botocore"),
    ({"config_kwargs": {"read_timeout": "10"}}, "'config_kwargs.read_timeout' must be a number of seconds"),
    ({"retries": 0}, "storage option 'retries' (attempts of s3fs's retry loop) must be an integer in [1, 100]"),
])
def test_bad_s3_storage_options_are_refused_at_open(s3_url: str, s3_storage_options: dict[str, Any],
                                                    edit: dict[str, Any], words: str) -> None:
    """Item 7: unknown or mistyped s3 options raised TypeError/AttributeError at the first request
    (or were taken: ``anon="yes"``); they are refused when the store is opened, naming the option."""
    options = {**s3_storage_options, **edit}
    if "client_kwargs" in edit:
        options["client_kwargs"] = {**s3_storage_options["client_kwargs"], **edit["client_kwargs"]}
    for call in (lambda: open_backend(s3_url, options),
                 lambda: r3store.RouteWriter(s3_url, SPEC, storage_options=options),
                 lambda: r3store.open_store(s3_url, storage_options=options)):
        with pytest.raises(StorageError) as info:
            call()
        assert words in str(info.value)
        assert s3_url in str(info.value)


@pytest.mark.s3
def test_good_s3_storage_options_still_work(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    options = {**s3_storage_options, "anon": False, "use_listings_cache": False, "skip_instance_cache": True,
               "retries": 3, "config_kwargs": {"max_pool_connections": 20, "retries": {"max_attempts": 4}},
               "client_kwargs": {**s3_storage_options["client_kwargs"], "verify": False}}
    with r3store.RouteWriter(s3_url, SPEC, storage_options=options) as w:
        w.append("a", ROUTES)
    backend = open_backend(s3_url, options)
    assert isinstance(backend, FsspecBackend)
    assert backend.fs.retries == 3
    assert backend.fs.config_kwargs == {"connect_timeout": 5, "read_timeout": 5, "max_pool_connections": 20,
                                        "retries": {"max_attempts": 4, "mode": "standard"}}
    assert options["config_kwargs"] == {"max_pool_connections": 20, "retries": {"max_attempts": 4}}  # not changed
    np.testing.assert_array_equal(r3store.open_store(s3_url, storage_options=options).get("a"), ROUTES)


# -- item 10: credentials in URLs masked in every message ------------------------------------------------


@pytest.mark.s3
def test_credentials_in_the_url_never_reach_a_message(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    """Item 10: the prefix was masked but the same StorageError quoted botocore's
    ``Invalid bucket name "KEY:SECRET@bucket"``, and the traceback its cause."""
    url = f"s3://AKIAKEYID:{SECRET}@{s3_bucket}/store"
    calls = [lambda: r3store.open_store(url, storage_options=s3_storage_options),
             lambda: r3store.RouteWriter(url, SPEC, storage_options=s3_storage_options),
             lambda: open_backend(url, s3_storage_options).get("r3store.json"),
             lambda: open_backend(url, s3_storage_options).list_prefix("index/")]
    for call in calls:
        with pytest.raises(R3StoreError) as info:
            call()
        text = "".join(traceback.format_exception(info.value))
        assert SECRET not in text
        assert "AKIAKEYID" not in text
        assert "***@" in str(info.value)


def test_masking_of_foreign_messages() -> None:
    from r3store.storage import map_storage_errors

    with pytest.raises(StorageError) as info, map_storage_errors("s3://***@bucket/x"):
        raise OSError(f'Invalid bucket name "KEY:{SECRET}@bucket": must match; see http://u:{SECRET}@proxy:8080/')
    assert SECRET not in str(info.value)
    assert str(info.value).count("***@") == 3
    assert info.value.__cause__ is None  # the cause's own text held them
    with pytest.raises(StorageError) as info, map_storage_errors("s3://bucket/x"):
        raise OSError("slow down at 10:30, user@example")
    assert "10:30, user@example" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


# -- item 18: a stalled S3 response is a bounded StorageError ---------------------------------------------


@pytest.mark.s3
def test_s3_defaults_bound_every_request(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    """Item 18: no timeout was set (botocore's 60 s read timeout x legacy 5 attempts x s3fs's 5)."""
    backend = open_backend(s3_url, {**s3_storage_options, "skip_instance_cache": True})
    assert isinstance(backend, FsspecBackend)
    assert backend.fs.config_kwargs == {"connect_timeout": 5, "read_timeout": 5,
                                        "retries": {"total_max_attempts": 3, "mode": "standard"}}
    assert backend.fs.retries == 2
    forked = pickle.loads(pickle.dumps(backend))  # as in a DataLoader worker: the filesystem is re-created
    assert forked.fs is not backend.fs
    assert forked.fs.retries == 2


@pytest.mark.s3
@pytest.mark.parametrize("where", ["route object", "manifest"])
def test_stalled_s3_response_is_a_storage_error_naming_the_object(
        s3_url: str, s3_storage_options: dict[str, Any], s3_counter: S3Counter, where: str) -> None:
    """Item 18: a stalled response blocked a read forever; with a 1 s read timeout, 2 botocore
    attempts and 1 s3fs attempt, 20 stalled responses in a row end in about 2 s as a StorageError.
    (With the defaults, 10 s, 3 and 2: 12 attempts, 125 s measured; s3fs nests its loop.)"""
    with r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options) as w:
        w.append("a", ROUTES)
    options = {**s3_storage_options, "skip_instance_cache": True, "retries": 1,
               "config_kwargs": {"read_timeout": 1, "retries": {"total_max_attempts": 2}}}
    store = r3store.open_store(s3_url, storage_options=options) if where == "route object" else None
    s3_counter.stall_next(20, 60, methods={"GET"})
    start = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.get("a") if store is not None else r3store.open_store(s3_url, storage_options=options)
    took = time.monotonic() - start
    stalled = [r for r in s3_counter.log if r.fault == "stall"]
    s3_counter.reset()  # ends the stalls still held by the server
    assert took < 15, took
    assert "ReadTimeoutError" in str(info.value) or "timeout" in str(info.value).lower()
    name = "/routes/" if where == "route object" else "/r3store.json"
    assert name in str(info.value), str(info.value)
    assert len(stalled) == 2, stalled  # botocore's 2 attempts, s3fs's 1
