"""JSON documents of a store parsed safely (``r3store/_format/_json.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
import r3store.audit
from r3store.errors import FormatError
from tests.routes import array_dir


@pytest.mark.parametrize("target", ["manifest", "zarr"])
def test_deeply_nested_json(small_store_dir: Path, target: str) -> None:
    path = small_store_dir / "r3store.json" if target == "manifest" else array_dir(small_store_dir) / "zarr.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FormatError, match="nested too deeply"):
        r3store.open_store(small_store_dir).get("s0")


def _store(tmp_path: Path) -> Path:

    spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    with r3store.RouteWriter(tmp_path / "s", spec) as w:
        w.append("a", np.array([[[0, 1], [2, 3]]] * 3))
    return tmp_path / "s"


@pytest.mark.parametrize("where", ["manifest", "zarr.json"])
def test_huge_json_integer_is_a_format_error(tmp_path: Path, where: str) -> None:
    """Item 7: Python's int-string limit raised a bare ValueError from ``json.loads``."""
    root = _store(tmp_path)
    path = root / "r3store.json" if where == "manifest" else next((root / "routes").glob("*/zarr.json"))
    text = path.read_text()
    path.write_text(text.replace('"top_k": 2', '"top_k": ' + "9" * 5000, 1) if where == "manifest"
                    else text.replace('"zarr_format": 3', '"zarr_format": ' + "3" * 5000, 1))
    with pytest.raises(FormatError, match="an integer of 5000 digits") as info:
        r3store.open_store(root).get("a")
    assert path.name in str(info.value)
