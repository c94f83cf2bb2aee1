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
    Function-scoped: the server's :class:`S3Counter`, zeroed.

Notes
-----
This follows s3fs's own test suite: ``moto.server.ThreadedMotoServer`` semantics on
loopback, dummy credentials, ``POST /moto-api/reset`` between tests. The server is
built from the same parts as ``ThreadedMotoServer`` (werkzeug's ``make_server`` around
moto's ``DomainDispatcherApplication``) so that a counting WSGI middleware can sit in
front of it.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = [
    "ACCESS_KEY",
    "MotoServer",
    "REGION",
    "S3Counter",
    "SECRET_KEY",
    "clear_s3fs_cache",
    "forget_listings",
    "make_bucket",
    "moto_server",
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

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass
class S3Counter:
    """Counts of S3 requests served and body bytes sent, per server.

    Requests to moto's own control API (``/moto-api/...``) are not counted.
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

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Zero every count."""
        with self._lock:
            self.requests = self.gets = self.ranged_gets = self.heads = self.puts = self.bytes_sent = 0

    def snapshot(self) -> dict[str, int]:
        """The counts as a plain dict."""
        with self._lock:
            return {
                "requests": self.requests,
                "gets": self.gets,
                "ranged_gets": self.ranged_gets,
                "heads": self.heads,
                "puts": self.puts,
                "bytes_sent": self.bytes_sent,
            }

    def _record(self, environ: dict[str, Any]) -> None:
        method = environ.get("REQUEST_METHOD", "")
        with self._lock:
            self.requests += 1
            self.gets += method == "GET"
            self.ranged_gets += method == "GET" and "HTTP_RANGE" in environ
            self.heads += method == "HEAD"
            self.puts += method == "PUT"

    def _add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_sent += n

    def middleware(self, app: WSGIApp) -> WSGIApp:
        """Wrap a WSGI app so that every request and body byte is counted here."""

        def counting_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
            if environ.get("PATH_INFO", "").startswith("/moto-api"):
                yield from app(environ, start_response)
                return
            self._record(environ)
            body = app(environ, start_response)
            try:
                for chunk in body:
                    self._add_bytes(len(chunk))
                    yield chunk
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

        return counting_app


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
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback test server
        status: int = resp.status
    return status


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
def s3_counter(s3_server: MotoServer, s3_bucket: str) -> S3Counter:
    """The server's request counter, zeroed after the bucket was made."""
    s3_server.counter.reset()
    return s3_server.counter
