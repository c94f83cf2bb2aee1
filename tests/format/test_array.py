"""Route arrays (``r3store/_format/_array.py``): ``zarr.json`` bounds, array documents, index entries."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest

import r3store
import r3store.audit
from r3store.errors import ChecksumError, FormatError
from tests.routes import array_dir, deadline
from tests.routes import seeded_routes as _routes
from tests.routes import write_store as _write


def edit_zarr(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = array_dir(root) / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def test_index_entry_marked_missing_inside_the_rows(small_store_dir: Path) -> None:
    obj = array_dir(small_store_dir) / "c" / "0" / "0" / "0"
    blob = obj.read_bytes()
    index = np.frombuffer(blob[-20:-4], "<u8").copy()
    index[:] = 2**64 - 1
    raw = index.tobytes()
    obj.write_bytes(blob[:-20] + raw + struct.pack("<I", google_crc32c.value(raw)))
    store = r3store.open_store(small_store_dir)
    with pytest.raises(FormatError, match=r"marks chunk \(0, 0, 0\) missing"):
        store.get("s0")


@pytest.mark.parametrize(("rows", "finding"), [(10**15, "malformed_chunk"), (10**9, "malformed_chunk"),
                                               (31, "malformed_chunk"), (29, "table_mismatch")])
def test_zarr_rows_must_match_the_sample_table(small_store_dir: Path, rows: int, finding: str) -> None:
    """The table ends at row 30; zarr.json claiming 10**15 rows made validate scan them all."""
    edit_zarr(small_store_dir, lambda d: d["shape"].__setitem__(0, rows))
    store = r3store.open_store(small_store_dir)
    with deadline(30), pytest.raises(FormatError, match=r"zarr.json"):
        store.get("s0")
    with deadline(30):
        report = r3store.audit.validate(store)
    assert [f.kind for f in report.findings] == [finding]


def _both_chunk_rows(value: int) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        d["chunk_grid"]["configuration"]["chunk_shape"][0] = value
        d["codecs"][0]["configuration"]["chunk_shape"][0] = value
    return edit


@pytest.mark.parametrize(("edit", "words"), [
    (_both_chunk_rows(2**31), "ids per inner chunk"),  # was a 64 GiB MemoryError
    (lambda d: d["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(0, 30 * 2**21), "inner chunks per storage"),
    (lambda d: d["chunk_grid"]["configuration"]["chunk_shape"].__setitem__(0, 45), "bad geometry"),
    (lambda d: d["codecs"][0]["configuration"]["chunk_shape"].__setitem__(1, 400), "layers_per_chunk"),
    (lambda d: d["codecs"][0]["configuration"]["chunk_shape"].__setitem__(2, 99), "do not tile"),
    (lambda d: d["shape"].__setitem__(0, 2**40), "rows"),
    (lambda d: d["shape"].__setitem__(0, 30.0), "expected 3 integers"),
    (lambda d: d["shape"].__setitem__(1, True), "expected 3 integers"),
    (lambda d: d["codecs"][0]["configuration"]["codecs"][0]["configuration"].update(bits=99), "disagrees"),
])
def test_zarr_json_bounds(small_store_dir: Path, edit: Callable[[dict[str, Any]], None], words: str) -> None:
    edit_zarr(small_store_dir, edit)
    store = r3store.open_store(small_store_dir)
    with pytest.raises(FormatError, match=words) as info:
        store.get("s0")
    assert "zarr.json" in str(info.value)


def test_route_array_metadata_disagrees(committed) -> None:
    root, array, _, _ = committed
    meta = root / array / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][0]["configuration"]["codecs"][0]["configuration"]["bits"] = 7
    meta.write_text(json.dumps(doc))
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g0")
    assert "zarr.json" in str(info.value)
    assert os.path.basename(array) in str(info.value)


try:
    from r3store.errors import SpecConflictError
except ImportError:  # r3store 0.1 (these tests also run against it, to show each failed there)
    SpecConflictError = ChecksumError  # type: ignore[misc, assignment]


def test_array_document_disagrees_with_the_manifest(tmp_path: Path) -> None:
    """Item 3: a route array's ``attributes.r3store.spec`` is compared with the manifest too."""
    commit = _write(tmp_path, {"s0": _routes(9, 0)})
    path = tmp_path / "routes" / commit / "zarr.json"
    doc = json.loads(path.read_text())
    doc["attributes"]["r3store"]["spec"]["moe_layers"] = [0, 1, 2, 3, 4]
    path.write_text(json.dumps(doc))
    store = r3store.open_store(tmp_path)
    with pytest.raises(SpecConflictError, match="moe_layers") as info:
        store.get("s0")
    assert f"{commit}/zarr.json" in str(info.value)


def test_index_entry_of_zero_bytes_is_a_format_error(tmp_path: Path) -> None:
    """Item 7: a storage-object index entry with nbytes=0 raised a bare IndexError."""
    commit = _write(tmp_path, {"s0": _routes(9, 0)}, chunk_rows=4, layers_per_chunk=5)
    obj = tmp_path / "routes" / commit / "c" / "0" / "0" / "0"
    blob = obj.read_bytes()
    entries = r3store.open_store(tmp_path).geometry_of(f"routes/{commit}").row_chunks_per_object
    index = np.frombuffer(blob[-(16 * entries + 4) : -4], "<u8").reshape(entries, 2).copy()
    assert entries == 3
    index[2, 1] = 0  # the last frame of the object: its empty range fell off the coalesced reads
    raw = index.tobytes()
    obj.write_bytes(blob[: -(16 * entries + 4)] + raw + struct.pack("<I", google_crc32c.value(raw)))
    with pytest.raises(FormatError, match=r"chunk \(2, 0, 0\)") as info:
        r3store.open_store(tmp_path).get("s0")
    assert not isinstance(info.value, IndexError)
