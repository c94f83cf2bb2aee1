"""Deprecated: the storage conformance kit moved to :mod:`r3store.testing.backend` (``BackendTests``)."""

from __future__ import annotations

import pytest

from r3store._deprecated import module_getattr as _module_getattr
from r3store.storage import Backend
from r3store.testing.backend import BackendTests

__all__: list[str] = []


class _StoreTests(BackendTests):
    """``StoreTests`` of the last release: a kit whose backend fixture is named ``store``."""

    @pytest.fixture
    def backend(self, store: Backend) -> Backend:
        return store


__getattr__ = _module_getattr(__name__, {"StoreTests": ("r3store.testing.BackendTests", lambda: _StoreTests)})
