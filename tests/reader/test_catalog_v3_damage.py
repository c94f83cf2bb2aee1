"""Damage in the golden ``v3-ckpt3`` checkpoint met by a lookup that reads one row group: an
r3store error or a fall back to the sample tables (a ``CheckpointWarning``), never pyarrow's own
exception. Found by the checkpoint fuzzer's flips on that checkpoint (``tests/fuzz/checkpoints.py``,
``--golden v3-ckpt3``): a damaged Arrow schema (the ``ARROW:schema`` footer entry, which no digest
binds) made the first ``row`` raise ``OSError``; a damaged dictionary page made the group read
raise ``ArrowIndexError`` (its dictionaries were decoded outside the read's error mapping)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import CheckpointWarning

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "stores" / "v3-ckpt3"


def _damaged(tmp_path: Path, pos: int, xor: int) -> Path:
    root = tmp_path / "store"
    shutil.copytree(GOLDEN, root)
    (path,) = (root / "index").glob("*.checkpoint")
    buf = bytearray(path.read_bytes())
    buf[pos] ^= xor
    path.write_bytes(bytes(buf))
    return root


def test_row_after_a_lookup_with_a_damaged_arrow_schema_falls_back(tmp_path: Path) -> None:
    root = _damaged(tmp_path, 4384, 1)  # inside the base64 ARROW:schema value
    tables = r3store.open_store(root, reader={"use_checkpoint": False})
    store = r3store.open_store(root)
    np.testing.assert_array_equal(store.get("b0"), tables.get("b0"))  # its row group reads
    with pytest.warns(CheckpointWarning):
        row = store.row("b0")
    assert row == tables.row("b0")
    assert store.sample_ids == tables.sample_ids


def test_a_damaged_dictionary_page_met_by_a_lookup_falls_back(tmp_path: Path) -> None:
    root = _damaged(tmp_path, 363, 16)  # a dictionary page of row group 0: indices past the dictionary
    tables = r3store.open_store(root, reader={"use_checkpoint": False})
    store = r3store.open_store(root)
    with pytest.warns(CheckpointWarning, match="out of bounds"):
        assert "a0" in store
    assert store.row("a0") == tables.row("a0")
    assert store.sample_ids == tables.sample_ids
