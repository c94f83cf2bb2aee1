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
        The filesystem cannot be created (unknown protocol, missing s3fs, ...).
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

    with map_storage_errors(_mask_credentials(url)):
        try:
            fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:
            raise StorageError(_mask_credentials(url), f"{exc} (for s3:// URLs: pip install 'r3store[s3]')") from exc
    if isinstance(fs, LocalFileSystem):
        return LocalStore(root)
    return FsspecStore(fs, root, url)
