"""Test kits for r3store and for code built on it (needs pytest and hypothesis).

* :class:`CodecTests` (:mod:`r3store.testing.codec`): conformance tests for codecs,
  plus golden-fixture helpers.
* :class:`LayoutParity` (:mod:`r3store.testing.layout`): ``LayoutOptions(framework=...)``
  checked against a framework's own packing function, over TP x CP x SP x every rank.
* :class:`BackendTests` (:mod:`r3store.testing.backend`): conformance tests for storage
  backends (``StoreTests`` is its deprecated name).
* :mod:`r3store.testing.strategies`: hypothesis strategies for ids, specs and routes.
* :mod:`r3store.testing.s3`: a loopback S3 server (moto) with a request counter, and
  pytest fixtures for it.
* :mod:`r3store.testing.synthetic`: realistic synthetic traces (needs only numpy).
* :mod:`r3store.testing.faults`: a small store holding one of each fault ``validate``
  reports, on any backend.
* :mod:`r3store.testing.counting`: :class:`~r3store.testing.counting.CountingBackend`, a
  backend wrapper counting read requests and bytes (what a reader fetches).
* :mod:`r3store.testing.forge`: edit a store's sample table or manifest and recompute its
  checksums (a consistent forgery), to test the rules that sit behind the checksums.

The kits are imported on first use, so ``r3store.testing.synthetic`` works without pytest.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BackendTests", "CodecTests", "LayoutParity"]

_KITS = {"BackendTests": "r3store.testing.backend", "CodecTests": "r3store.testing.codec",
         "LayoutParity": "r3store.testing.layout", "StoreTests": "r3store.testing.store"}


def __getattr__(name: str) -> Any:
    if name not in _KITS:
        raise AttributeError(f"module 'r3store.testing' has no attribute {name!r}")
    import importlib
    import sys

    import pytest

    # The kits' plain asserts get pytest's rich failure messages. A kit already imported (directly,
    # or by doctest collection) cannot be rewritten any more: registering it again would only warn
    # (PytestAssertRewriteWarning, an error under filterwarnings=error), whatever ran first.
    pending = [module for module in _KITS.values() if module not in sys.modules]
    if pending:
        pytest.register_assert_rewrite(*pending)
    return getattr(importlib.import_module(_KITS[name]), name)
