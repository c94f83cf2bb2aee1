"""Test kits for r3store and for code built on it (needs pytest and hypothesis).

* :class:`CodecTests` (:mod:`r3store.testing.codec`): conformance tests for codecs,
  plus golden-fixture helpers.
* :class:`StoreTests` (:mod:`r3store.testing.store`): conformance tests for storage
  backends.
* :mod:`r3store.testing.strategies`: hypothesis strategies for ids, specs and routes.
* :mod:`r3store.testing.s3`: a loopback S3 server (moto) with a request counter, and
  pytest fixtures for it.
"""

import pytest

# The kits' plain asserts get pytest's rich failure messages.
pytest.register_assert_rewrite("r3store.testing.codec", "r3store.testing.store")

from r3store.testing.codec import CodecTests  # noqa: E402
from r3store.testing.store import StoreTests  # noqa: E402

__all__ = ["CodecTests", "StoreTests"]
