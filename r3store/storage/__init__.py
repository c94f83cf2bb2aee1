"""Storage backends: where a store's objects live (local disk, memory, S3, any fsspec URL)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from r3store.storage._base import ByteRange, ObjectInfo, Store, SuffixByteRange
from r3store.storage._caching import CachingStore
from r3store.storage._errors import HANDLED_EXCEPTIONS, map_storage_errors
from r3store.storage._fsspec import FsspecStore, _mask_credentials
from r3store.storage._local import LocalStore

__all__ = [
    "ByteRange",
    "CachingStore",
    "FsspecStore",
    "HANDLED_EXCEPTIONS",
    "LocalStore",
    "ObjectInfo",
    "Store",
    "SuffixByteRange",
    "map_storage_errors",
    "open_backend",
]


def open_backend(
    url: str | os.PathLike[str] | Store,
    storage_options: Mapping[str, Any] | None = None,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Store:
    """Return the :class:`Store` for a path or fsspec URL.

    Parameters
    ----------
    url : str, os.PathLike or Store
        A local path, ``file://`` URL, or any fsspec URL (``memory://x``,
        ``s3://bucket/prefix``, chained ``filecache::s3://...``). A :class:`Store` is
        returned as is.
    storage_options : mapping, optional
        Passed to the fsspec filesystem (for s3fs: ``endpoint_url``, ``key``,
        ``secret``, ``profile``, ``client_kwargs``, ``config_kwargs`` with botocore's
        ``retries``, ...). Without them s3fs reads the usual ``AWS_*`` environment
        variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``,
        ``AWS_ENDPOINT_URL_S3``, ...).
    cache_dir : str or os.PathLike, optional
        Read write-once objects through a local copy in this folder
        (:class:`CachingStore`): the first read of a route or index object downloads it
        whole, later reads (the next epoch) make no requests for it.

    Raises
    ------
    r3store.errors.StorageError
        The filesystem cannot be created (unknown protocol, missing s3fs, an option
        the filesystem does not take, a ``*_kwargs`` option that is not a mapping, ...).
    """
    store = _open_uncached(url, storage_options)
    return store if cache_dir is None else CachingStore(store, cache_dir)


def _open_uncached(url: str | os.PathLike[str] | Store, storage_options: Mapping[str, Any] | None) -> Store:
    if isinstance(url, Store):
        return url
    url = os.fspath(url)
    if "://" not in url and "::" not in url:
        return LocalStore(url)
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from r3store.errors import StorageError

    options = _checked_options(_mask_credentials(url), storage_options)
    with map_storage_errors(_mask_credentials(url)):
        try:
            fs, root = fsspec.core.url_to_fs(url, **options)
        except ImportError as exc:
            raise StorageError(_mask_credentials(url), f"{exc} (for s3:// URLs: pip install 'r3store[s3]')") from exc
        except TypeError as exc:  # an option the filesystem's constructor does not take
            raise StorageError(_mask_credentials(url), f"bad storage options: {exc}") from exc
    if isinstance(fs, LocalFileSystem):
        return LocalStore(root)
    return FsspecStore(fs, root, url)


def _checked_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` as a dict of str keys whose ``*_kwargs`` values are mappings
    (fsspec's convention; s3fs fails deep inside its first request otherwise)."""
    from r3store.errors import StorageError

    if storage_options is not None and not isinstance(storage_options, Mapping):
        raise StorageError(url, f"storage_options must be a mapping, got {type(storage_options).__name__}")
    options = dict(storage_options or {})
    for key, value in options.items():
        if not isinstance(key, str):
            raise StorageError(url, f"storage option names must be str, got {key!r}")
        if key.endswith("_kwargs") and not isinstance(value, Mapping):
            raise StorageError(url, f"storage option {key} must be a mapping (a JSON object), got {type(value).__name__}")
    return options
