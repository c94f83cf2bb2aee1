"""A loopback S3 server (moto) for tests, with a request counter.

Usage from a test module (or ``tests/conftest.py`` through
``pytest_plugins = ["r3store.testing.s3"]``)::

    from r3store.testing.s3 import s3_server, s3_bucket, s3_url, s3_storage_options

    @pytest.mark.s3
    def test_something(s3_url, s3_storage_options):
        store = r3store.storage.open_backend(s3_url, s3_storage_options)

Fixtures
--------
s3_server
    Session-scoped :class:`MotoServer` on ``127.0.0.1`` (a free port).
s3_bucket
    Function-scoped: resets the server, drops s3fs's cached listings, creates a fresh
    bucket and yields its name.
s3_storage_options
    Function-scoped: the ``storage_options`` dict for s3fs pointing at the server.
s3_url
    Function-scoped: ``s3://<bucket>/store``, a store URL inside the fresh bucket.
s3_counter
    Function-scoped: the server's :class:`S3Counter`, zeroed, with no faults pending.

Another process
---------------
``python -m r3store.testing.s3`` runs a server, prints its endpoint and serves until its
standard input closes (benchmarks use it to keep the server's CPU off the client's
GIL). :func:`remote_counts` and :func:`reset_remote_counter` read and zero its
:class:`S3Counter` over HTTP (``GET``/``DELETE /r3store-counter``, never counted).

Faults
------
:meth:`S3Counter.fail_next` answers the next requests with an S3 error (503 ``SlowDown``,
500 ``InternalError``, 403 ``AccessDenied``, ...) and :meth:`S3Counter.drop_next` closes
their connections without a response, and :meth:`S3Counter.stall_next` holds them open without
a byte of response for a while, so that retries, timeouts and error mapping are tested
against real HTTP traffic instead of a mocked client.

Notes
-----
This follows s3fs's own test suite: ``moto.server.ThreadedMotoServer`` semantics on
loopback, dummy credentials, ``POST /moto-api/reset`` between tests. The server is
built from the same parts as ``ThreadedMotoServer`` (werkzeug's ``make_server`` around
moto's ``DomainDispatcherApplication``) so that a counting WSGI middleware can sit in
front of it.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import pytest

__all__ = [
    "ACCESS_KEY",
    "MotoServer",
    "REGION",
    "S3Counter",
    "S3Request",
    "SECRET_KEY",
    "clear_s3fs_cache",
    "forget_listings",
    "make_bucket",
    "moto_server",
    "remote_counts",
    "reset_remote_counter",
    "reset_server",
    "s3_bucket",
    "s3_counter",
    "s3_server",
    "s3_storage_options",
    "s3_url",
    "storage_options",
]

ACCESS_KEY = "testing"
"""Dummy access key id moto accepts."""
SECRET_KEY = "r3store-test-secret-do-not-print"
"""Dummy secret key; distinctive so tests can assert it never appears in a message."""
REGION = "us-east-1"

COUNTER_PATH = "/r3store-counter"
"""Path of the counter's own control endpoint (see :func:`remote_counts`)."""

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass
class S3Request:
    """One request the server received (see :attr:`S3Counter.log`)."""

    method: str
    """HTTP method."""
    path: str
    """URL path, ``/<bucket>/<key>`` (path-style addressing, as s3fs sends it)."""
    range: str | None
    """The ``Range`` header, e.g. ``bytes=-1028`` or ``bytes=0-99``, if any."""
    fault: str | None
    """``"503"``, ``"drop"``, ...: the fault injected instead of an answer, if any."""
    query: str = ""
    """The query string (``list-type=2&prefix=...`` for a listing)."""
    nbytes: int = 0
    """Response body bytes sent."""

    @property
    def key(self) -> str:
        """The object key (the path without the bucket); ``""`` for bucket-level requests."""
        return self.path.lstrip("/").partition("/")[2]

    @property
    def is_listing(self) -> bool:
        """Whether this is a ListObjects request."""
        return self.method == "GET" and not self.key and "prefix=" in self.query


_ERROR_CODES = {
    400: "BadRequest", 403: "AccessDenied", 404: "NoSuchKey", 500: "InternalError",
    502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout",
}


@dataclass
class _Fault:
    remaining: int
    status: int | None  # None: drop the connection (or stall, with stall_s)
    methods: frozenset[str] | None
    stall_s: float = 0.0  # > 0: answer normally after this long (a stalled response)


@dataclass
class S3Counter:
    """Counts of S3 requests served and body bytes sent, per server, plus fault injection.

    Requests to moto's own control API (``/moto-api/...``) are not counted. Requests
    answered by an injected fault are counted (the client made them) and logged with
    their fault.
    """

    requests: int = 0
    """Every S3 request (any method)."""
    gets: int = 0
    """GET requests (object reads and listings)."""
    ranged_gets: int = 0
    """GET requests that carried a ``Range`` header."""
    heads: int = 0
    """HEAD requests."""
    puts: int = 0
    """PUT requests."""
    bytes_sent: int = 0
    """Response body bytes sent to clients (all methods)."""
    bytes_received: int = 0
    """Request body bytes clients sent (``Content-Length``: PUT bodies)."""
    faults: int = 0
    """Requests answered by an injected fault."""
    log: list[S3Request] = field(default_factory=list, repr=False)
    """Every counted request, in arrival order."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[_Fault] = []
        self._release = threading.Event()

    def reset(self) -> None:
        """Zero every count, clear the log, cancel pending faults and end stalls in progress."""
        self._release.set()
        self._release = threading.Event()
        with self._lock:
            self.requests = self.gets = self.ranged_gets = self.heads = self.puts = self.bytes_sent = 0
            self.bytes_received = self.faults = 0
            self.log = []
            self._pending = []

    def snapshot(self) -> dict[str, int]:
        """The counts (without :attr:`bytes_received`, :attr:`faults` and :attr:`log`) as a plain dict."""
        with self._lock:
            return {
                "requests": self.requests,
                "gets": self.gets,
                "ranged_gets": self.ranged_gets,
                "heads": self.heads,
                "puts": self.puts,
                "bytes_sent": self.bytes_sent,
            }

    def requests_for(self, key_prefix: str = "", method: str | None = None) -> list[S3Request]:
        """Logged requests whose object key starts with ``key_prefix`` (and of ``method``)."""
        with self._lock:
            log = list(self.log)
        return [r for r in log if r.key.startswith(key_prefix) and (method is None or r.method == method)]

    # -- faults ---------------------------------------------------------------------

    def fail_next(self, n: int, status: int = 503, *, methods: Collection[str] | None = None) -> None:
        """Answer the next ``n`` requests (of ``methods``, default any) with an S3 error.

        The body is S3's error XML with the usual code for ``status`` (503 ``SlowDown``,
        500 ``InternalError``, 403 ``AccessDenied``, 404 ``NoSuchKey``, ...); moto never
        sees the request. Faults queue up: a second call applies after the first is used.
        """
        self._queue(_Fault(n, int(status), None if methods is None else frozenset(methods)))

    def drop_next(self, n: int, *, methods: Collection[str] | None = None) -> None:
        """Close the connection of the next ``n`` requests without answering them."""
        self._queue(_Fault(n, None, None if methods is None else frozenset(methods)))

    def stall_next(self, n: int, seconds: float, *, methods: Collection[str] | None = None) -> None:
        """Hold the next ``n`` requests ``seconds`` before answering them (a stalled server:
        the connection is open, no byte of the response comes); :meth:`reset` ends a stall."""
        self._queue(_Fault(n, None, None if methods is None else frozenset(methods), float(seconds)))

    def _queue(self, fault: _Fault) -> None:
        if fault.remaining < 0:
            raise ValueError(f"n must be >= 0, got {fault.remaining}")
        with self._lock:
            self._pending.append(fault)

    def _take_fault(self, method: str) -> _Fault | None:
        with self._lock:
            while self._pending and self._pending[0].remaining == 0:
                self._pending.pop(0)
            if not self._pending:
                return None
            fault = self._pending[0]
            if fault.methods is not None and method not in fault.methods:
                return None
            fault.remaining -= 1
            return fault

    # -- WSGI -----------------------------------------------------------------------

    def _record(self, environ: dict[str, Any], fault: _Fault | None) -> S3Request:
        method = environ.get("REQUEST_METHOD", "")
        label = None if fault is None else ("stall" if fault.stall_s else "drop" if fault.status is None
                                            else str(fault.status))
        with self._lock:
            self.requests += 1
            self.gets += method == "GET"
            self.ranged_gets += method == "GET" and "HTTP_RANGE" in environ
            self.heads += method == "HEAD"
            self.puts += method == "PUT"
            self.faults += fault is not None
            self.bytes_received += int(environ.get("CONTENT_LENGTH") or 0)
            request = S3Request(method, environ.get("PATH_INFO", ""), environ.get("HTTP_RANGE"), label,
                                environ.get("QUERY_STRING", ""))
            self.log.append(request)
        return request

    def _add_bytes(self, request: S3Request, n: int) -> None:
        with self._lock:
            self.bytes_sent += n
            request.nbytes += n

    def middleware(self, app: WSGIApp) -> WSGIApp:
        """Wrap a WSGI app so that every request and body byte is counted here."""

        def counting_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
            if environ.get("PATH_INFO", "").startswith("/moto-api"):
                yield from app(environ, start_response)
                return
            if environ.get("PATH_INFO", "") == COUNTER_PATH:
                yield self._answer_control(environ, start_response)
                return
            fault = self._take_fault(environ.get("REQUEST_METHOD", ""))
            request = self._record(environ, fault)
            if fault is not None and fault.stall_s:
                self._release.wait(fault.stall_s)
            elif fault is not None:
                yield from self._answer_fault(fault, request, environ, start_response)
                return
            body = app(environ, start_response)
            try:
                for chunk in body:
                    self._add_bytes(request, len(chunk))
                    yield chunk
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

        return counting_app

    def _answer_control(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> bytes:
        doc: dict[str, Any] = {**self.snapshot(), "bytes_received": self.bytes_received, "faults": self.faults}
        if "log=1" in environ.get("QUERY_STRING", ""):
            doc["log"] = [[r.method, r.path, r.range, r.nbytes] for r in list(self.log)]
        body = json.dumps(doc).encode()
        if environ.get("REQUEST_METHOD") == "DELETE":
            self.reset()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return body

    def _answer_fault(self, fault: _Fault, request: S3Request, environ: dict[str, Any],
                      start_response: Callable[..., Any]) -> Iterator[bytes]:
        if fault.status is None:  # the headers below are never sent: the socket is gone
            start_response("503 Service Unavailable", [("Content-Length", "0")])
            sock = environ.get("werkzeug.socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
            return
        code = _ERROR_CODES.get(fault.status, HTTPStatus(fault.status).phrase.replace(" ", ""))
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                "<Message>injected by r3store.testing.s3</Message>"
                "<RequestId>r3store-fault</RequestId></Error>").encode()
        if environ.get("REQUEST_METHOD") == "HEAD":
            body = b""
        start_response(f"{fault.status} {HTTPStatus(fault.status).phrase}",
                       [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        self._add_bytes(request, len(body))
        yield body


class MotoServer:
    """moto's S3 on a loopback port, in a daemon thread, behind an :class:`S3Counter`.

    Parameters
    ----------
    port : int
        0 (the default) picks a free port.
    """

    def __init__(self, port: int = 0) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        class _QuietHandler(MotoRequestHandler):
            def log_request(self, *args: Any, **kwargs: Any) -> None:
                pass

        self.counter = S3Counter()
        app = self.counter.middleware(DomainDispatcherApplication(create_backend_app))
        self._server = make_server("127.0.0.1", port, app, threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._serve, name="r3store-moto", daemon=True)

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._server.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextmanager
def moto_server() -> Iterator[str]:
    """Run a loopback S3 server for the duration of the block; yields its endpoint URL.

    Use ``with MotoServer() as server:`` instead when the block needs ``server.counter``.
    """
    with MotoServer() as server:
        yield server.endpoint


def _request(url: str, method: str) -> int:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        status: int = resp.status
    return status


def _request_json(url: str, method: str) -> dict[str, Any]:
    req = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(req, timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def remote_counts(endpoint: str, *, log: bool = False) -> dict[str, Any]:
    """:meth:`S3Counter.snapshot` (plus ``bytes_received`` and ``faults``) of a server in
    another process; with ``log``, also ``log``: ``[method, path, range, nbytes]`` per request."""
    return _request_json(f"{endpoint}{COUNTER_PATH}{'?log=1' if log else ''}", "GET")


def reset_remote_counter(endpoint: str, *, log: bool = False) -> dict[str, Any]:
    """Zero the counter of a server in another process; returns what :func:`remote_counts`
    returned just before."""
    return _request_json(f"{endpoint}{COUNTER_PATH}{'?log=1' if log else ''}", "DELETE")


def reset_server(endpoint: str) -> None:
    """Drop every bucket and object on the server (``POST /moto-api/reset``)."""
    _request(f"{endpoint}/moto-api/reset", "POST")


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` with a plain PUT (moto does not check signatures).

    s3fs's ``mkdir`` would send a ``LocationConstraint`` of ``us-east-1``, which S3 rejects.
    """
    _request(f"{endpoint}/{bucket}", "PUT")


def storage_options(endpoint: str) -> dict[str, Any]:
    """``storage_options`` for s3fs (and :func:`r3store.storage.open_backend`) to reach ``endpoint``."""
    return {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
    }


def clear_s3fs_cache() -> None:
    """Forget cached s3fs filesystems (and with them their listing caches)."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def forget_listings() -> None:
    """Drop the listing caches of every cached s3fs filesystem, keeping the instances.

    Cheaper than :func:`clear_s3fs_cache` between tests: a new instance builds a new
    botocore client (about 0.1 to 0.3 s), while a kept one only needs its listings
    forgotten after the server is reset.
    """
    import s3fs

    for fs in list(s3fs.S3FileSystem._cache.values()):
        fs.invalidate_cache()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoServer]:
    """Session-scoped loopback S3 server."""
    pytest.importorskip("s3fs")
    with MotoServer() as server:
        yield server
    clear_s3fs_cache()


@pytest.fixture
def s3_bucket(s3_server: MotoServer) -> str:
    """A fresh, empty bucket on a freshly reset server."""
    s3_server.counter.reset()
    reset_server(s3_server.endpoint)
    forget_listings()
    bucket = "r3store-test"
    make_bucket(s3_server.endpoint, bucket)
    s3_server.counter.reset()
    return bucket


@pytest.fixture
def s3_storage_options(s3_server: MotoServer) -> dict[str, Any]:
    """s3fs storage options for the loopback server."""
    return storage_options(s3_server.endpoint)


@pytest.fixture
def s3_url(s3_bucket: str) -> str:
    """``s3://<fresh bucket>/store``."""
    return f"s3://{s3_bucket}/store"


@pytest.fixture
def s3_counter(s3_server: MotoServer, s3_bucket: str) -> Iterator[S3Counter]:
    """The server's request counter, zeroed after the bucket was made; faults are
    cancelled again afterwards."""
    s3_server.counter.reset()
    yield s3_server.counter
    s3_server.counter.reset()


def _main() -> None:
    """Serve on loopback until standard input closes; print the endpoint first."""
    with MotoServer() as server:
        print(server.endpoint, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    _main()
