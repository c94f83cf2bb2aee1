"""Storage backends: the byte layer where a store's objects live (local disk, memory, S3, any fsspec URL).

A :class:`Backend` is a flat key space of byte objects with ranged reads and atomic
writes; it knows nothing of the r3store format. :func:`open_backend` picks one for a URL.
"""

from r3store._deprecated import module_getattr as _module_getattr
from r3store.storage._base import REMOTE_COALESCE_GAP, Backend, ByteRange, ObjectInfo, SuffixByteRange
from r3store.storage._caching import CachingBackend, KeyPrefixes
from r3store.storage._caching import CachingStore as _CachingStore
from r3store.storage._errors import handled_exceptions, map_storage_errors
from r3store.storage._fsspec import FsspecBackend
from r3store.storage._local import LocalBackend
from r3store.storage._open import local_options_fault, open_backend, refuse_local_options

__all__ = [
    "Backend",
    "ByteRange",
    "CachingBackend",
    "FsspecBackend",
    "KeyPrefixes",
    "LocalBackend",
    "ObjectInfo",
    "REMOTE_COALESCE_GAP",
    "SuffixByteRange",
    "handled_exceptions",
    "local_options_fault",
    "map_storage_errors",
    "open_backend",
    "refuse_local_options",
]


__getattr__ = _module_getattr(__name__, {
    "Store": ("r3store.storage.Backend", lambda: Backend),
    "LocalStore": ("r3store.storage.LocalBackend", lambda: LocalBackend),
    "FsspecStore": ("r3store.storage.FsspecBackend", lambda: FsspecBackend),
    "CachingStore": ("r3store.storage.CachingBackend(inner, cache_dir, immutable=...)", lambda: _CachingStore),
    "HANDLED_EXCEPTIONS": ("r3store.storage.handled_exceptions()", handled_exceptions),
})
