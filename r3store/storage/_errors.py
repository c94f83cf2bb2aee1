"""Translate foreign storage exceptions into :mod:`r3store.errors` at the boundary.

The mapping is narrow: it translates only the exception types storage libraries raise
for I/O failures (``OSError`` and its subclasses, which fsspec and s3fs use, and
botocore's and aiohttp's own errors). Anything else raised inside a storage block
(``KeyError``, ``ValueError``, ``TypeError``, ... from a bug) propagates as it is, so a
bug never reads as "no such object". botocore and aiohttp are optional (``r3store[s3]``)
and are never imported by the mapping: an exception of theirs can only occur once they
are imported, so the mapping looks their classes up in ``sys.modules``.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from r3store.errors import ObjectNotFoundError, R3StoreError, StorageError

__all__ = ["handled_exceptions", "map_storage_errors"]

_OPTIONAL = (("botocore.exceptions", ("BotoCoreError", "ClientError")), ("aiohttp", ("ClientError",)))
"""Foreign exception classes by module, translated when their library is installed."""


def _optional_types(*, load: bool) -> list[type[BaseException]]:
    """The optional libraries' exception classes: those already imported, or (``load``) installed."""
    found: list[type[BaseException]] = []
    for module_name, names in _OPTIONAL:
        module = sys.modules.get(module_name)
        if module is None and load:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # the s3 extra is not installed
                continue
        found += [getattr(module, name) for name in names] if module is not None else []
    return found


def handled_exceptions() -> tuple[type[BaseException], ...]:
    """Every foreign exception type :func:`map_storage_errors` translates.

    ``OSError`` (``FileNotFoundError``, ``PermissionError``, ``TimeoutError``,
    ``ConnectionError``, ...), plus botocore's ``BotoCoreError`` and ``ClientError`` and
    aiohttp's ``ClientError`` where those libraries are installed (imported here).
    """
    return (OSError, *_optional_types(load=True))


@contextmanager
def map_storage_errors(url: str) -> Iterator[None]:
    """Re-raise foreign storage exceptions as r3store errors naming ``url``.

    ``FileNotFoundError`` (and a botocore ``ClientError`` with code ``NoSuchKey``,
    ``NoSuchBucket`` or ``404``) becomes :class:`r3store.errors.ObjectNotFoundError`;
    any other exception of :func:`handled_exceptions` becomes
    :class:`r3store.errors.StorageError`. r3store's own errors and every other
    exception pass through unchanged. The original exception is chained
    (``raise ... from exc``), except where its text (or its own cause's) holds credentials
    given in a URL (``s3://KEY:SECRET@bucket``, which botocore quotes back): then the
    chain is dropped. Messages carry the URL, never credentials: ``user:password@`` in
    foreign text is masked as ``***@``.
    """
    try:
        yield
    except R3StoreError:
        raise
    except FileNotFoundError as exc:
        raise ObjectNotFoundError(url, "no such object") from exc
    except PermissionError as exc:
        _raise(StorageError(url, f"permission denied ({exc.strerror or exc})"), exc)
    except OSError as exc:
        _raise(StorageError(url, f"{type(exc).__name__}: {_describe(exc)}"), exc)
    except Exception as exc:
        if not isinstance(exc, tuple(_optional_types(load=False))):
            raise
        if _is_not_found(exc):
            raise ObjectNotFoundError(url, "no such object") from exc
        _raise(StorageError(url, f"{type(exc).__name__}: {_describe(exc)}"), exc)


def _raise(error: StorageError, cause: BaseException) -> NoReturn:
    """Raise ``error`` from ``cause``; without the chain where the foreign text held credentials
    (a traceback prints the cause's own message, which masking cannot reach)."""
    if any(_has_credentials(str(e)) for e in _chain(cause)):
        raise error from None
    raise error from cause


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


_USERINFO = re.compile(r"(?<![\w.+-])([A-Za-z][A-Za-z0-9+.-]*://)(?:[^\s\"'/@<>()\[\]{},;]*@)"
                       r"|(?<![\w.+-])()[^\s\"'/@<>()\[\]{},;:]*:[^\s\"'/@<>()\[\]{},;]*@")
"""``user:password@`` (with or without a ``scheme://`` before it): credentials put in a URL,
as botocore quotes them back (``Invalid bucket name "KEY:SECRET@bucket"``)."""


def _has_credentials(text: str) -> bool:
    return mask_userinfo(text) != text


def mask_userinfo(text: str) -> str:
    """``text`` with every ``user:password@`` replaced by ``***@`` (messages of foreign libraries)."""
    return _USERINFO.sub(lambda m: f"{m.group(1) or ''}***@", text)


_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})


def _is_not_found(exc: BaseException) -> bool:
    """Whether ``exc`` is a botocore ``ClientError`` for a missing key or bucket."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    return response.get("Error", {}).get("Code") in _NOT_FOUND_CODES


def _describe(exc: BaseException) -> str:
    text = mask_userinfo(str(exc) or repr(exc))
    return text if len(text) <= 300 else text[:297] + "..."
