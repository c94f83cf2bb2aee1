"""The error tree, and the translation of foreign storage exceptions at the boundary."""

from __future__ import annotations

import builtins
import pickle
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

import r3store.errors as errors_module
from r3store.errors import (
    ChecksumError,
    CodecError,
    FormatError,
    ObjectNotFoundError,
    PayloadDecodeError,
    R3StoreError,
    R3StoreWarning,
    SampleNotFoundError,
    StorageError,
)
from r3store.storage import FsspecBackend, LocalBackend, handled_exceptions, map_storage_errors, open_backend
from r3store.testing.s3 import SECRET_KEY, storage_options

URL = "s3://bucket/store/routes/shard-0"


def _client_error(code: str, status: int) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} message"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")


# (foreign exception, r3store error it must become, a fragment of the message)
FOREIGN: list[tuple[BaseException, type[StorageError], str]] = [
    (FileNotFoundError(2, "No such file or directory", "/x"), ObjectNotFoundError, "no such object"),
    (PermissionError(13, "Permission denied"), StorageError, "permission denied (Permission denied)"),
    (TimeoutError("read timed out"), StorageError, "TimeoutError: read timed out"),
    (ConnectionError("connection reset"), StorageError, "ConnectionError: connection reset"),
    (ConnectionResetError(104, "Connection reset by peer"), StorageError, "Connection reset by peer"),
    (OSError(5, "Input/output error"), StorageError, "OSError: [Errno 5] Input/output error"),
    (_client_error("NoSuchKey", 404), ObjectNotFoundError, "no such object"),
    (_client_error("NoSuchBucket", 404), ObjectNotFoundError, "no such object"),
    (_client_error("AccessDenied", 403), StorageError, "ClientError: An error occurred (AccessDenied)"),
    (_client_error("SlowDown", 503), StorageError, "SlowDown"),
    (EndpointConnectionError(endpoint_url="http://10.0.0.1:9000"), StorageError, "EndpointConnectionError"),
    (ReadTimeoutError(endpoint_url="http://10.0.0.1:9000"), StorageError, "ReadTimeoutError"),
    (aiohttp.ClientError("payload error"), StorageError, "ClientError: payload error"),
    (aiohttp.ServerDisconnectedError(), StorageError, "ServerDisconnectedError"),
]


@pytest.mark.parametrize(
    ("exc", "expected", "fragment"), FOREIGN, ids=[f"{type(e).__name__}-{i}" for i, (e, _, _) in enumerate(FOREIGN)]
)
def test_foreign_exception_is_translated(exc: BaseException, expected: type[StorageError], fragment: str) -> None:
    with pytest.raises(StorageError) as info, map_storage_errors(URL):
        raise exc
    err = info.value
    assert type(err) is expected
    assert err.__cause__ is exc
    assert err.url == URL
    assert str(err).startswith(f"{URL}: ")
    assert fragment in str(err)
    assert isinstance(err, R3StoreError)
    assert isinstance(err, OSError)


def test_every_handled_exception_has_a_case() -> None:
    """A type added to handled_exceptions() needs a row in FOREIGN.

    (The pattern of httpx's ``test_httpcore_all_exceptions_mapped``.)
    """
    covered = {type(exc) for exc, _, _ in FOREIGN}
    missing = [t.__qualname__ for t in handled_exceptions() if not any(issubclass(c, t) for c in covered)]
    assert missing == []
    assert {OSError, ClientError, aiohttp.ClientError} <= set(handled_exceptions())


@pytest.mark.parametrize(
    "exc",
    [
        FormatError("p", "bad"),
        ObjectNotFoundError("u", "gone"),
        CodecError("c", "bad"),
        ChecksumError("a", (0,), "crc"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_own_errors_pass_through(exc: R3StoreError) -> None:
    with pytest.raises(type(exc)) as info, map_storage_errors(URL):
        raise exc
    assert info.value is exc
    assert info.value.__cause__ is None


@pytest.mark.parametrize("exc", [TypeError("programming error"), AttributeError("x"), KeyboardInterrupt(),
                                 KeyError("routes/shard-0"), ValueError("bad range"), RuntimeError("loop closed")],
                         ids=repr)
def test_unhandled_exceptions_are_not_translated(exc: BaseException) -> None:
    """The mapping is narrow: a bug inside a storage block (a KeyError from a dict lookup, a
    ValueError) shows as itself, never as "no such object" or a storage failure."""
    with pytest.raises(type(exc)) as info, map_storage_errors(URL):
        raise exc
    assert info.value is exc


def test_mapping_imports_no_optional_library() -> None:
    """botocore and aiohttp (the s3 extra) are looked up, never imported, by the mapping."""
    code = ("import sys, r3store, r3store.storage as s\n"
            "with s.map_storage_errors('u'):\n    pass\n"
            "try:\n    with s.map_storage_errors('u'):\n        raise ValueError('bug')\nexcept ValueError:\n    pass\n"
            "assert not {'botocore', 'aiohttp', 's3fs'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_long_foreign_messages_are_shortened() -> None:
    with pytest.raises(StorageError) as info, map_storage_errors(URL):
        raise OSError("x" * 5000)
    assert len(str(info.value)) == len(URL) + 2 + len("OSError: ") + 300
    assert str(info.value).endswith("...")


def test_no_error_means_no_translation() -> None:
    with map_storage_errors(URL):
        value = 1 + 1
    assert value == 2


# -- the error tree -------------------------------------------------------------------

BUILTIN_BASES = (ValueError, KeyError, IndexError, OSError, RuntimeError, UserWarning)


@pytest.mark.parametrize("name", errors_module.__all__)
def test_every_error_has_a_builtin_base(name: str) -> None:
    cls = getattr(errors_module, name)
    assert isinstance(cls, type)
    assert cls.__module__ == "r3store.errors"
    if issubclass(cls, Warning):
        assert issubclass(cls, R3StoreWarning)
        assert issubclass(cls, UserWarning)
        return
    assert issubclass(cls, R3StoreError)
    if cls is not R3StoreError:
        assert issubclass(cls, BUILTIN_BASES), f"{name} is not also a builtin a caller would catch"


def test_all_lists_every_public_class_and_is_sorted() -> None:
    public = {
        name for name, obj in vars(errors_module).items()
        if isinstance(obj, type) and issubclass(obj, BaseException) and not name.startswith("_")
        and obj.__module__ == "r3store.errors"
    }
    assert set(errors_module.__all__) == public
    assert errors_module.__all__ == sorted(errors_module.__all__)


@pytest.mark.parametrize("name", errors_module.__all__)
def test_module_docstring_draws_every_error(name: str) -> None:
    assert errors_module.__doc__ is not None
    assert f" {name} " in errors_module.__doc__ or f" {name}\n" in errors_module.__doc__


def test_documented_builtin_bases_match() -> None:
    """``Name (Builtin)`` in the drawn tree is true of the class."""
    doc = errors_module.__doc__ or ""
    checked = 0
    for line in doc.splitlines():
        words = line.replace("├──", " ").replace("└──", " ").replace("│", " ").split()
        if len(words) >= 2 and words[0] in errors_module.__all__ and words[1].startswith("("):
            base = getattr(builtins, words[1].strip("()"))
            assert issubclass(getattr(errors_module, words[0]), base), line
            checked += 1
    assert checked >= 15


def test_option_errors_carry_option_value_and_fault() -> None:
    err = errors_module.OptionError("buffer_bytes", 0, "must be >= 1")
    assert (err.option, err.value, err.fault) == ("buffer_bytes", 0, "must be >= 1")
    assert str(err) == "buffer_bytes=0: must be >= 1"
    assert isinstance(err, ValueError)
    assert isinstance(err, R3StoreError)
    layout = errors_module.LayoutOptionError("cp_rank", 2, "must be < cp_size=2")
    assert isinstance(layout, errors_module.OptionError)
    assert len(str(errors_module.OptionError("num_tokens", list(range(10_000)), "bad"))) < 250  # long values cut


def test_sample_not_found_reads_well() -> None:
    err = SampleNotFoundError("sample-7", "s3://b/traces")
    assert str(err) == "no committed sample 'sample-7' in s3://b/traces"
    assert str(SampleNotFoundError("s")) == "no committed sample 's'"
    assert err.sample_id == "sample-7"
    with pytest.raises(KeyError):
        raise err
    assert "Error: no committed sample" in "".join(traceback.format_exception_only(err))


def test_errors_keep_their_facts() -> None:
    err = ChecksumError("routes/layers-0", (3, 1, 0), "CRC-32C mismatch")
    assert (err.array, err.chunk, err.path) == ("routes/layers-0", (3, 1, 0), "routes/layers-0")
    assert str(err) == "routes/layers-0: chunk (3, 1, 0): CRC-32C mismatch"
    assert isinstance(err, FormatError)
    assert isinstance(err, ValueError)
    storage = ObjectNotFoundError("s3://b/k", "no such object")
    assert storage.url == "s3://b/k"
    assert isinstance(storage, FileNotFoundError)


@pytest.mark.parametrize(
    "err",
    [FormatError("p", "bad"), StorageError("u", "bad"), CodecError("c", "bad"), ChecksumError("a", (1,), "bad")],
    ids=lambda e: type(e).__name__,
)
def test_errors_pickle(err: R3StoreError) -> None:
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is type(err)
    assert str(clone) == str(err)
    assert clone.__dict__ == err.__dict__


# -- real backends --------------------------------------------------------------------


def test_local_permission_error_is_translated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalBackend(tmp_path)
    store.set("obj", b"x")

    def denied(self: Path, *args: Any, **kwargs: Any) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_file", denied)
    monkeypatch.setattr(LocalBackend, "_open", denied)  # reads open the file with os.open (regular files only)
    for call in (lambda: store.exists("obj"), lambda: store.get("obj")):
        with pytest.raises(StorageError, match="permission denied") as info:
            call()
        assert f"{tmp_path}/obj" in str(info.value)
        assert isinstance(info.value.__cause__, PermissionError)


def _assert_no_secret(err: BaseException) -> None:
    text = "".join(traceback.format_exception(err))
    assert SECRET_KEY not in text
    assert SECRET_KEY not in repr(err.args)


@pytest.mark.s3
def test_s3_missing_bucket(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    store = open_backend("s3://no-such-bucket/store", s3_storage_options)
    with pytest.raises(ObjectNotFoundError) as info:
        store.get("r3store.json")
    assert "s3://no-such-bucket/store/r3store.json" in str(info.value)
    assert info.value.__cause__ is not None
    _assert_no_secret(info.value)
    with pytest.raises(StorageError) as write_info:
        store.set("r3store.json", b"{}")
    assert "s3://no-such-bucket/store/r3store.json" in str(write_info.value)
    _assert_no_secret(write_info.value)
    assert store.exists("r3store.json") is False


@pytest.mark.s3
def test_s3_missing_key_message(s3_url: str, s3_storage_options: dict[str, Any]) -> None:
    store = open_backend(s3_url, s3_storage_options)
    with pytest.raises(ObjectNotFoundError, match=f"{s3_url}/routes/zarr.json") as info:
        store.get("routes/zarr.json")
    _assert_no_secret(info.value)


@pytest.mark.s3
def test_s3_unreachable_endpoint_is_a_storage_error() -> None:
    """Connection refused surfaces as StorageError (not 'missing', not a silent False)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = storage_options(f"http://127.0.0.1:{port}")
    options["config_kwargs"] = {"retries": {"max_attempts": 1, "mode": "standard"}, "connect_timeout": 1}
    options["skip_instance_cache"] = True
    store = open_backend("s3://bucket/store", options)
    assert isinstance(store, FsspecBackend)
    store.fs.retries = 1  # s3fs's own retry loop (a class attribute, not an option)
    for call in (lambda: store.get("k"), lambda: store.exists("k")):
        with pytest.raises(StorageError) as info:
            call()
        assert not isinstance(info.value, ObjectNotFoundError)
        assert "s3://bucket/store/k: EndpointConnectionError" in str(info.value)
        _assert_no_secret(info.value)


def test_payload_decode_error_is_an_r3store_error() -> None:
    assert issubclass(PayloadDecodeError, R3StoreError)
