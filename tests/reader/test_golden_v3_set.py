"""The golden format v3 set-coded store reads back as written (tests/fixtures/make_v3_set_store.py made it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.audit import summarize, validate
from r3store.codecs import kernels

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stores"
STORE = FIXTURES / "v3-set"


def _expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected-v3.npz", allow_pickle=False) as npz:
        return {key.partition("__")[2]: npz[key] for key in npz.files}


@pytest.mark.parametrize("implementation", ["native", "numpy"])
def test_v3_set_store_reads_bit_identically(implementation: str) -> None:
    if implementation == "native" and kernels.native_module() is None:
        pytest.skip("the C extension is not built")
    expected = _expected()
    with kernels.use(implementation):
        store = r3store.open_store(STORE)
        assert store.format_version == 3
        assert sorted(store.sample_ids) == sorted(set(expected) - {"bad"})
        for sid, routes in expected.items():
            got = store.get(sid, include_quarantined=sid == "bad")
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, routes)
        np.testing.assert_array_equal(store.get("flame-02", layers=[9, 3], rows=slice(5, 40)),
                                      expected["flame-02"][5:40][:, [7, 1]])


def test_v3_set_store_names_its_codec_and_validates() -> None:
    for meta in (STORE / "routes").glob("*/zarr.json"):
        inner = json.loads(meta.read_text())["codecs"][0]["configuration"]["codecs"]
        assert inner == [{"name": "r3store.set", "configuration": {"num_experts": 64, "top_k": 6}}]
    store = r3store.open_store(STORE)
    report = validate(store)  # the quarantined sample's repeat, and the rows not captured: nothing else
    assert sorted(f.kind for f in report.findings) == ["missing_rows", "quarantined", "repeated_ids"]
    summary = summarize(store)
    assert summary["codec"] == "r3store.set"
    assert summary["format_version"] == 3
    assert summary["bits_per_id"] < summary["ideal_bits_per_id"]
