"""``open_backend`` (``r3store/storage/_open.py``): URLs and storage options checked at open."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from r3store.errors import StorageError
from r3store.storage import open_backend


def test_storage_options_checked_in_open_backend() -> None:
    with pytest.raises(StorageError, match="config_kwargs must be a mapping"):
        open_backend("memory://x", {"config_kwargs": "notadict"})
    with pytest.raises(StorageError, match="must be a mapping"):
        open_backend("memory://x", ["not", "a", "mapping"])  # type: ignore[arg-type]


SPEC_3X8 = r3store.ModelSpec(num_layers=3, num_experts=8, top_k=2)


def test_a_url_with_a_nul_byte_is_a_storage_error(tmp_path: Path) -> None:
    """Finding: ``open_store("/x\\x00y")`` and ``RouteWriter`` on such a path raised the OS's
    bare ``ValueError: embedded null byte``."""
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.open_store(f"{tmp_path}/a\x00b")
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.RouteWriter(f"{tmp_path}/a\x00b", SPEC_3X8)
