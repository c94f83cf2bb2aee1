"""JSON documents of a store parsed safely (``r3store/_format/_json.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
import r3store.audit
from r3store.errors import FormatError

SPEC_4X16 = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scores = rng.random((rows, SPEC_4X16.num_moe_layers, SPEC_4X16.num_experts))
    return np.argsort(scores, axis=-1)[..., :SPEC_4X16.top_k].astype(np.int32)


def make_store(root: Path | str, n: int = 3, rows: int = 10, seed: int = 0, **kw: Any) -> dict[str, np.ndarray]:
    data = {f"s{i}": routes(rows, seed + i) for i in range(n)}
    with r3store.RouteWriter(str(root), SPEC_4X16, **kw) as w:
        for sid, r in data.items():
            w.append(sid, r, metadata={"step": 1})
    return data


def array_dir(root: Path) -> Path:
    (path,) = (p for p in (root / "routes").iterdir() if p.is_dir())
    return path


@pytest.fixture
def small_store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    make_store(root)
    return root


@pytest.mark.parametrize("target", ["manifest", "zarr"])
def test_deeply_nested_json(small_store_dir: Path, target: str) -> None:
    path = small_store_dir / "r3store.json" if target == "manifest" else array_dir(small_store_dir) / "zarr.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FormatError, match="nested too deeply"):
        r3store.open_store(small_store_dir).get("s0")


def _store(tmp_path: Path) -> Path:
    import numpy as np

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
