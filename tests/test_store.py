"""``open_store`` and ``RouteStore`` (``r3store/_store.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from r3store.errors import NotAStoreError


def test_open_folder_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError) as info:
        r3store.open_store(tmp_path)
    assert isinstance(info.value, FileNotFoundError)
    assert str(tmp_path) in str(info.value)
    assert "r3store.json" in str(info.value)
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError, match=r"r3store.json"):
        r3store.open_store(missing)
    assert not missing.exists()
    with pytest.raises(NotAStoreError):
        r3store.open_store("memory://r3store-test-nothing-here")
