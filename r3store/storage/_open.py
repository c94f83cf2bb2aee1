"""``open_backend``: the backend for a path or fsspec URL."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from r3store._deprecated import warn
from r3store.errors import NotAStoreError, OptionError, StorageError
from r3store.storage._base import Backend
from r3store.storage._caching import CachingBackend, CachingStore, Immutable
from r3store.storage._errors import map_storage_errors, mask_userinfo
from r3store.storage._fsspec import FsspecBackend, mask_credentials
from r3store.storage._local import LocalBackend
from r3store.storage._s3 import s3_options

__all__ = ["install_hint", "local_options_fault", "open_backend", "refuse_local_options"]


def open_backend(
    url: str | os.PathLike[str] | Backend,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    immutable: Immutable | None = None,
) -> Backend:
    """Return the :class:`Backend` for a path or fsspec URL.

    Parameters
    ----------
    url : str, os.PathLike or Backend
        A local path, ``file://`` URL, or any fsspec URL (``memory://x``,
        ``s3://bucket/prefix``, chained ``filecache::s3://...``). A :class:`Backend` is
        returned as is.
    storage_options : mapping, optional
        Passed to the fsspec filesystem (for s3fs: ``endpoint_url``, ``key``,
        ``secret``, ``profile``, ``client_kwargs``, ``config_kwargs`` with botocore's
        ``retries``, ...). Without them s3fs reads the usual ``AWS_*`` environment
        variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
        ``AWS_ENDPOINT_URL_S3``, ...). For ``s3://`` (not chained) every option name
        is checked here (and the type of the well-known ones), and r3store's defaults
        apply unless given: ``config_kwargs`` ``connect_timeout=5``, ``read_timeout=10`` (seconds; a
        stalled response), ``retries={"total_max_attempts": 3, "mode": "standard"}``, and
        ``retries=2`` (s3fs's own retry loop around botocore's; an r3store option).
    cache_dir : str or os.PathLike, optional
        Read the keys ``immutable`` accepts through a local copy in this folder
        (:class:`CachingBackend`): the first read of such an object downloads it whole,
        later reads (the next epoch) make no requests for it.
    immutable : callable or sequence of str, optional
        Which keys never change once written (a predicate, or key prefixes); required
        with ``cache_dir``. Deprecated: ``cache_dir`` without it caches r3store's
        ``routes/`` and ``index/`` objects, as before.

    Raises
    ------
    r3store.errors.StorageError
        The filesystem cannot be created (unknown protocol, missing s3fs, an option
        the filesystem does not take, a ``*_kwargs`` option that is not a mapping, an
        s3 option of the wrong type or refused by botocore, ...), naming the option; or
        the URL holds a NUL byte.
    """
    backend = _open_uncached(url, storage_options)
    if cache_dir is None:
        return backend
    if immutable is None:
        warn("open_backend(cache_dir=...) without immutable=",
             "immutable= (or r3store.open_store(..., reader={'cache_dir': ...}))", stacklevel=3)
        return CachingStore(backend, cache_dir)
    return CachingBackend(backend, cache_dir, immutable=immutable)


def _open_uncached(url: str | os.PathLike[str] | Backend, storage_options: Mapping[str, Any] | None) -> Backend:
    if isinstance(url, Backend):
        return url
    url = os.fspath(url)
    if "\x00" in str(url):  # the OS would refuse it later, as a bare ValueError
        raise StorageError(mask_credentials(str(url)), "the URL holds a NUL byte")
    if "://" not in url and "::" not in url:
        if os.path.exists(url) and not os.path.isdir(url):
            raise NotAStoreError(url, "it is a file, not a folder (a store is a folder holding r3store.json)")
        return LocalBackend(url)
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    masked = mask_credentials(url)
    options = _checked_options(masked, storage_options)
    s3fs_retries = None
    if _protocol(url) in ("s3", "s3a") and "::" not in url:  # chained URLs nest options per protocol
        try:
            options, s3fs_retries = s3_options(masked, options)
        except ImportError as exc:
            raise StorageError(masked, f"{exc}{install_hint(url)}") from exc
    with map_storage_errors(masked):
        try:
            fs, root = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:
            raise StorageError(masked, f"{exc}{install_hint(url)}") from exc
        except TypeError as exc:  # an option the filesystem's constructor does not take
            raise StorageError(masked, f"bad storage options: {mask_userinfo(str(exc))}") from _cause(exc)
        except ValueError as exc:  # fsspec: "Protocol not known", a malformed URL
            raise StorageError(masked, f"cannot open: {mask_userinfo(str(exc))}") from _cause(exc)
    if isinstance(fs, LocalFileSystem):
        return LocalBackend(root)
    return FsspecBackend(fs, root, url, retries=s3fs_retries)


INSTALL_HINTS: dict[str, str] = {
    "s3": "pip install 'r3store[s3]'", "s3a": "pip install 'r3store[s3]'",
    "gs": "pip install gcsfs", "gcs": "pip install gcsfs",
    "az": "pip install adlfs", "abfs": "pip install adlfs", "abfss": "pip install adlfs",
}
"""URL protocol -> how to install the fsspec filesystem it needs."""


def install_hint(url: str) -> str:
    """``" (for gs:// URLs: pip install gcsfs)"``: the install hint for the protocol of ``url``,
    or ``""`` for a protocol with no known package (fsspec's own message names it).

    Examples
    --------
    >>> install_hint("gs://bucket/x"), install_hint("s3://b/x"), install_hint("weird://x")
    (' (for gs:// URLs: pip install gcsfs)', " (for s3:// URLs: pip install 'r3store[s3]')", '')
    """
    protocol = _protocol(url.split("::")[0])
    hint = INSTALL_HINTS.get(protocol)
    return f" (for {protocol}:// URLs: {hint})" if hint else ""


def local_options_fault(key: str, where: str) -> str:
    """Why a storage option given for a local store is refused (the CLI says the same)."""
    return (f"option {key!r} is not taken by {where}: local stores take no storage options (they go to fsspec "
            "and s3fs, for URLs such as s3://bucket/prefix)")


def refuse_local_options(url: str | os.PathLike[str] | Backend, storage_options: Mapping[str, Any] | None) -> None:
    """Refuse storage options given for a local store (a path or ``file://`` URL), which takes
    none (r3store reads and writes it itself), instead of ignoring them; what ``open_store``
    and ``RouteWriter`` do, as the CLI's ``-o`` does.

    Raises
    ------
    r3store.errors.OptionError
        ``storage_options`` is not empty and ``url`` is local.
    """
    if not storage_options or isinstance(url, Backend):
        return
    text = os.fspath(url)
    if text.lower().startswith("file://") or ("://" not in text and "::" not in text):
        key = str(next(iter(storage_options)))
        raise OptionError("storage_options", dict(storage_options), local_options_fault(key, f"a local store ({text})"))


def _cause(exc: BaseException) -> BaseException | None:
    """``exc`` to chain, or None where its text holds credentials (a traceback would print them)."""
    return None if mask_userinfo(str(exc)) != str(exc) else exc


def _protocol(url: str) -> str:
    """The protocol of a URL: ``s3`` for ``s3://bucket/x``."""
    return url.partition("://")[0].lower() if "://" in url else ""


def _checked_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` as a dict of str keys whose ``*_kwargs`` values are mappings
    (fsspec's convention; s3fs fails deep inside its first request otherwise)."""
    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise StorageError(url, f"storage_options must be a mapping, got {type(storage_options).__name__}")
    options = dict(storage_options or {})
    for key, value in options.items():
        if not isinstance(key, str):
            raise StorageError(url, f"storage option names must be str, got {key!r}")
        if key.endswith("_kwargs") and not isinstance(value, Mapping):
            raise StorageError(url, f"storage option {key} must be a mapping (a JSON object), "
                                    f"got {type(value).__name__}")
    return options
