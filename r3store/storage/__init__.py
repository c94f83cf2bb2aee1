"""Storage backends: where a store's objects live (local disk, memory, S3, any fsspec URL)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from r3store.storage._base import ByteRange, ObjectInfo, Store, SuffixByteRange
from r3store.storage._errors import HANDLED_EXCEPTIONS, map_storage_errors
from r3store.storage._fsspec import FsspecStore
from r3store.storage._local import LocalStore

__all__ = [
    "ByteRange",
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
        ``secret``, ``profile``, ``client_kwargs``, ...).

    Raises
    ------
    r3store.errors.StorageError
        The filesystem cannot be created (unknown protocol, missing s3fs, ...).
    """
    if isinstance(url, Store):
        return url
    url = os.fspath(url)
    if "://" not in url and "::" not in url:
        return LocalStore(url)
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    from r3store.errors import StorageError

    with map_storage_errors(url):
        try:
            fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except ImportError as exc:
            raise StorageError(url, f"{exc} (for s3:// URLs: pip install 'r3store[s3]')") from exc
    if isinstance(fs, LocalFileSystem):
        return LocalStore(root)
    return FsspecStore(fs, root, url)
