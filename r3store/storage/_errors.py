"""Translate foreign storage exceptions into :mod:`r3store.errors` at the boundary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from r3store.errors import ObjectNotFoundError, R3StoreError, StorageError

__all__ = ["HANDLED_EXCEPTIONS", "map_storage_errors"]


def _foreign_exceptions() -> tuple[type[BaseException], ...]:
    """Exception types raised by fsspec, s3fs, botocore and aiohttp that we translate."""
    found: list[type[BaseException]] = [OSError, TimeoutError, ValueError, RuntimeError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        found += [BotoCoreError, ClientError]
    except ImportError:  # s3 extra not installed
        pass
    try:
        from aiohttp import ClientError as AiohttpClientError

        found.append(AiohttpClientError)
    except ImportError:
        pass
    return tuple(found)


HANDLED_EXCEPTIONS: tuple[type[BaseException], ...] = _foreign_exceptions()
"""Every foreign exception type :func:`map_storage_errors` translates."""


@contextmanager
def map_storage_errors(url: str) -> Iterator[None]:
    """Re-raise foreign storage exceptions as r3store errors naming ``url``.

    ``FileNotFoundError`` (and ``KeyError`` from mapping-style backends, and a botocore
    ``ClientError`` with code ``NoSuchKey``, ``NoSuchBucket`` or ``404``) becomes
    :class:`r3store.errors.ObjectNotFoundError`; any other handled exception becomes
    :class:`r3store.errors.StorageError`. r3store's own errors pass through. The
    original exception is chained (``raise ... from exc``). Messages carry the URL,
    never credentials.
    """
    try:
        yield
    except R3StoreError:
        raise
    except (FileNotFoundError, KeyError) as exc:
        raise ObjectNotFoundError(url, "no such object") from exc
    except PermissionError as exc:
        raise StorageError(url, f"permission denied ({exc.strerror or exc})") from exc
    except HANDLED_EXCEPTIONS as exc:
        if _is_not_found(exc):
            raise ObjectNotFoundError(url, "no such object") from exc
        raise StorageError(url, f"{type(exc).__name__}: {_describe(exc)}") from exc


_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})


def _is_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` is a botocore ``ClientError`` for a missing key or bucket."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    return response.get("Error", {}).get("Code") in _NOT_FOUND_CODES


def _describe(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return text if len(text) <= 300 else text[:297] + "..."
