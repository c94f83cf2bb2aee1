"""The store manifest ``r3store.json`` (``r3store/_format/_manifest.py``): damaged, edited and forged manifests."""

from __future__ import annotations

import json
from pathlib import Path

import google_crc32c
import pytest

import r3store
import r3store.audit
from r3store.errors import ChecksumError, FormatError, FormatVersionError
from r3store.testing import forge
from tests.routes import SPEC_5X40
from tests.routes import sample_tables as _tables
from tests.routes import seeded_routes as _routes
from tests.routes import write_store as _write


@pytest.mark.parametrize(
    ("edit", "exc_type", "words"),
    [
        (lambda d: d.update(version=4), FormatVersionError, ["version 4", "not readable"]),
        (lambda d: d.update(format="zarr"), FormatVersionError, ["'zarr'"]),
        (lambda d: d["spec"].pop("top_k"), FormatError, ["top_k"]),
        (lambda d: d["spec"].update(num_experts=0), FormatError, ["num_experts"]),
    ],
)
def test_bad_manifest(committed, edit, exc_type, words) -> None:
    root, _, _, _ = committed
    forge.reseal_manifest(root / "r3store.json", edit)
    with pytest.raises(exc_type) as info:
        r3store.open_store(root)
    assert "r3store.json" in str(info.value)
    for word in words:
        assert word in str(info.value)
    with pytest.raises(exc_type):
        r3store.RouteWriter(root, SPEC_5X40)


def test_manifest_not_json(committed) -> None:
    root, _, _, _ = committed
    (root / "r3store.json").write_bytes(b"\x00{nope")
    with pytest.raises(FormatError, match="not valid JSON"):
        r3store.open_store(root)


try:
    from r3store.errors import SpecConflictError
except ImportError:  # r3store 0.1 (these tests also run against it, to show each failed there)
    SpecConflictError = ChecksumError  # type: ignore[misc, assignment]


def _manifest_crc(doc: dict[str, object]) -> str:
    """The format v2 checksum of a manifest document, computed here from FORMAT.md (not r3store)."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return f"crc32c:{google_crc32c.value(text):08x}"


def _edit_manifest(root: Path, edit: object, *, reseal: bool) -> None:
    """Edit r3store.json as text would be edited (one character), or as a forger would (checksum redone)."""
    path = root / "r3store.json"
    doc = json.loads(path.read_text())
    edit(doc)  # type: ignore[operator]
    if reseal and "checksum" in doc:
        doc["checksum"] = _manifest_crc(doc)
    path.write_text(json.dumps(doc, indent=2))


@pytest.mark.parametrize(("field", "value"), [("num_experts", 10), ("moe_layers", [0, 1, 2, 3, 4]), ("num_layers", 7)])
def test_one_character_manifest_edit_is_refused(tmp_path: Path, field: str, value: object) -> None:
    """Item 3: ``num_experts 12 -> 10``, ``moe_layers [1..5] -> [0..4]``, ``num_layers 6 -> 7`` opened
    fine and served the same bytes under other layer labels."""
    _write(tmp_path, {"s0": _routes(9, 0)})
    _edit_manifest(tmp_path, lambda d: d["spec"].__setitem__(field, value), reseal=False)
    with pytest.raises(FormatError, match=r"r3store.json") as info:
        r3store.open_store(tmp_path).get("s0", layers=[5, 2])
    assert isinstance(info.value, ChecksumError)
    assert "checksum" in str(info.value)


@pytest.mark.parametrize(("field", "value"), [("num_experts", 10), ("moe_layers", [0, 1, 2, 3, 4]), ("num_layers", 7)])
def test_forged_manifest_disagrees_with_the_tables(tmp_path: Path, field: str, value: object) -> None:
    """Item 3: with the checksum recomputed, the spec every sample table and route array repeats
    still disagrees: a SpecConflictError naming both objects and the field."""
    _write(tmp_path, {"s0": _routes(9, 0)})
    _edit_manifest(tmp_path, lambda d: d["spec"].__setitem__(field, value), reseal=True)
    with pytest.raises(SpecConflictError) as info:
        r3store.open_store(tmp_path).get("s0", layers=[5, 2])
    assert info.value.fields == (field,)
    assert _tables(tmp_path)[0].name in str(info.value)
    assert "r3store.json" in str(info.value)
