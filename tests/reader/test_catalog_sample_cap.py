"""A sample over the reader's ``max_sample_rows`` cap (``r3store/reader/_catalog.py``): only the cap's error.

New-user finding: opening a compacted store with a cap below a sample's rows warned
"checkpoint ignored" (the checkpoint was intact) before raising the cap's error.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import r3store
from r3store.errors import CheckpointWarning, SampleTooLargeError
from tests.routes import SPEC_4X16, routes_4x16


@pytest.fixture
def compacted(tmp_path: Path) -> Path:
    with r3store.RouteWriter(tmp_path, SPEC_4X16) as w:
        w.append("short", routes_4x16(5, seed=1))
        w.append("long", routes_4x16(30, seed=2))
    r3store.compact(tmp_path)
    assert r3store.open_store(tmp_path).checkpoint is not None
    return tmp_path


def test_a_sample_over_the_cap_raises_only_the_caps_error(compacted: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SampleTooLargeError, match="sample 'long' has 30 rows, more than the cap of 10"):
            r3store.open_store(compacted, reader={"max_sample_rows": 10})
    assert [w for w in caught if issubclass(w.category, CheckpointWarning)] == []


def test_without_the_checkpoint_the_same_error(compacted: Path) -> None:
    with pytest.raises(SampleTooLargeError, match="sample 'long' has 30 rows, more than the cap of 10"):
        r3store.open_store(compacted, reader={"max_sample_rows": 10, "use_checkpoint": False})


def test_a_cap_the_samples_fit_uses_the_checkpoint(compacted: Path) -> None:
    store = r3store.open_store(compacted, reader={"max_sample_rows": 30})
    assert store.get("long").shape[0] == 30
