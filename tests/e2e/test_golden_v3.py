"""The golden format v3 store ``v3-ckpt`` reads back bit-identically, forever.

Written once by ``tests/fixtures/stores/make_v3_ckpt.py`` (a fixed store identity, a
checkpoint covering the first commit and a second commit after it, missing rows, policy
versions, metadata, a quarantined and a 0-row sample, 5-bit ids, 16-row chunks);
``expected-v3-ckpt.npz`` holds the routes each sample was written with.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store._format import load_schema
from r3store.audit import validate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stores"
STORE = FIXTURES / "v3-ckpt"
STORE_ID = "5e1f0c3a9b7d4e2f8a6c1b0d3e5f7a9c"


def _expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected-v3-ckpt.npz", allow_pickle=False) as npz:
        return {key.partition("__")[2]: npz[key] for key in npz.files}


@pytest.mark.parametrize("use_checkpoint", [True, False])
def test_v3_store_reads_bit_identically(use_checkpoint: bool) -> None:
    store = r3store.open_store(STORE, reader={"use_checkpoint": use_checkpoint})
    assert store.format_version == 3
    assert (store.checkpoint is not None) == use_checkpoint
    expected = _expected()
    assert sorted(store.sample_ids) == sorted(set(expected) - {"bad"})
    for sid, routes in expected.items():
        got = store.get(sid, include_quarantined=sid == "bad")
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, routes)
    assert store.missing_rows("a0") == [(5, 9)]
    assert store.policy_spans("a0") == [(0, 40, 7)]
    assert store.row("a1")["note"] == "plain"


def test_v3_manifest_carries_the_identity() -> None:
    import jsonschema

    doc = json.loads((STORE / "r3store.json").read_text())
    assert doc["version"] == 3
    assert doc["store_id"] == STORE_ID
    jsonschema.validate(doc, load_schema("manifest"))
    zarr_json = json.loads((STORE / "routes" / "golden-v3-b-00000" / "zarr.json").read_text())
    assert zarr_json["attributes"]["r3store"]["store_id"] == STORE_ID


def test_v3_store_validates_with_only_its_planted_faults() -> None:
    report = validate(r3store.open_store(STORE))
    assert report.counts == {"repeated_ids": 1, "quarantined": 1, "missing_rows": 1}  # "bad" and a0's gap
    assert {f.sample_id for f in report.findings} == {"bad", "a0"}
