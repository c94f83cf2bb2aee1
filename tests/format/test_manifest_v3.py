"""Issue 22: the format v3 manifest (``store_id``) and a store of a newer format.

A store of a newer format said it was not readable but not to upgrade; the manifest's
``created_by`` names the writer's release, and the message now does too.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import r3store
from r3store._format import FORMAT_VERSION, READ_VERSIONS, STORE_ID, load_schema, make_manifest, parse_manifest
from r3store.errors import FormatError, FormatVersionError, NotAStoreError
from r3store.testing import forge

SPEC = r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)


def test_format_3_is_written_and_1_to_3_are_read() -> None:
    assert FORMAT_VERSION == 3
    assert READ_VERSIONS == (1, 2, 3)


def test_a_new_manifest_carries_a_random_identity() -> None:
    a, b = make_manifest(SPEC), make_manifest(SPEC)
    assert STORE_ID.fullmatch(a["store_id"])
    assert a["store_id"] != b["store_id"]
    jsonschema.validate(a, load_schema("manifest"))
    assert parse_manifest(a, "r3store.json").store_id == a["store_id"]


@pytest.mark.parametrize("edit", [lambda d: d.pop("store_id"), lambda d: d.update(store_id="ABC"),
                                  lambda d: d.update(version=2)])
def test_the_identity_is_required_in_v3_and_absent_in_v2(edit: object) -> None:
    from r3store._format import manifest_checksum

    doc = make_manifest(SPEC)
    edit(doc)  # type: ignore[operator]
    doc["checksum"] = manifest_checksum(doc)
    with pytest.raises(FormatError, match="store_id"):
        parse_manifest(doc, "r3store.json")


def test_a_newer_format_says_to_upgrade_and_names_the_writer(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", np.zeros((2, 1, 1), np.int32))

    def newer(doc: dict[str, object]) -> None:
        doc.update(version=4, created_by="r3store 0.9.1", tables_v4={"x": 1})

    forge.reseal_manifest(tmp_path / "r3store.json", newer)
    with pytest.raises(FormatVersionError) as info:
        r3store.open_store(tmp_path)
    text = str(info.value)
    assert "format version 4" in text
    assert "written by 'r3store 0.9.1'" in text
    assert "upgrade r3store" in text


def test_a_folder_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(NotAStoreError, match="does-not-exist' does not exist"):
        r3store.open_store(tmp_path / "does-not-exist")
    with pytest.raises(NotAStoreError, match=r"r3store\.json not found"):
        r3store.open_store(tmp_path)


def test_the_schema_copies_agree() -> None:
    shipped = load_schema("manifest")
    source = json.loads((Path(__file__).parents[2] / "schema" / "manifest.schema.json").read_text())
    assert shipped == source
