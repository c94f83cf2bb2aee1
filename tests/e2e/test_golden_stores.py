"""Stores written by earlier releases read back bit-identically, forever.

The stores under ``tests/fixtures/stores/`` were written once and are never rewritten; a
format change adds new fixtures beside them:

* ``v1-*``: format v1, written by r3store 0.1.0; ``expected-v1.npz`` holds the routes
  each sample was written with (keys ``<store>__<sample_id>``).
* ``v2-*``: format v2, written by r3store 0.2.0 (the real FLAME trace with metadata,
  token hashes and policy versions over two commits; an odd geometry with 9-bit ids,
  many small storage objects, missing rows, a quarantined and a 0-row sample and a cap of
  1000 rows per sample; the smallest store); ``expected-v2.npz`` likewise, holding -1 in
  the rows the engine could not capture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.audit import validate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"


def _expected(version: int) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(FIXTURES / f"expected-v{version}.npz", allow_pickle=False) as npz:
        for key in npz.files:
            store, _, sid = key.partition("__")
            out.setdefault(store, {})[sid] = npz[key]
    return out


EXPECTED = {**_expected(1), **_expected(2)}
QUARANTINED = {"v1-odd": {"bad"}, "v2-odd": {"bad"}}


@pytest.mark.parametrize("store", sorted(EXPECTED))
def test_store_reads_bit_identically(store: str) -> None:
    reader = r3store.open_store(FIXTURES / store)
    assert reader.format_version == int(store[1])
    quarantined = QUARANTINED.get(store, set())
    assert sorted(reader.sample_ids) == sorted(set(EXPECTED[store]) - quarantined)
    for sid, routes in EXPECTED[store].items():
        got = reader.get(sid, include_quarantined=sid in quarantined)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, routes)


@pytest.mark.parametrize("store", ["v1-odd", "v2-odd"])
def test_layer_and_row_subsets(store: str) -> None:
    reader = r3store.open_store(FIXTURES / store)
    full = EXPECTED[store]["odd-2"]
    np.testing.assert_array_equal(reader.get("odd-2", layers=[4, 2], rows=slice(3, 31)), full[3:31][:, [3, 1]])


@pytest.mark.parametrize("store", ["v1-flame", "v2-flame"])
def test_metadata_and_token_hashes(store: str) -> None:
    reader = r3store.open_store(FIXTURES / store)
    table = reader.samples.to_pydict()
    steps = dict(zip(table["sample_id"], table["step"], strict=True))
    assert [steps[f"flame-{i:02d}"] for i in range(8)] == [0, 1, 2, 3, 9, 9, 9, 9]
    ids = [f"flame-{i:02d}" for i in range(4)]
    tokens = [np.arange(64) * 7 + i for i in range(4)]
    batch = reader.assemble(ids, tokens=tokens, return_tensors="np")
    assert batch["routes"].shape == (4 * 64, 8, 6)
    with pytest.raises(r3store.errors.AlignmentError):
        reader.assemble(ids, tokens=[t + 1 for t in tokens], return_tensors="np")


def test_v2_policy_versions_and_missing_rows() -> None:
    flame = r3store.open_store(FIXTURES / "v2-flame")
    assert flame.policy_spans("flame-00") == [(0, 63, 3)]
    assert flame.policy_spans("flame-04") == []
    assert flame.policy_spans("chat") == [(0, 40, 4), (40, 83, 5)]
    batch = flame.assemble(["chat"], return_policy_version=True)
    assert batch["policy_version"].tolist() == [4] * 40 + [5] * 43 + [-1]
    odd = r3store.open_store(FIXTURES / "v2-odd")
    assert odd.missing_rows("gaps") == [(0, 5), (9, 10)]
    assert odd.missing_rows("sglang") == [(6, 11)]
    assert odd.assemble(["gaps"])["replay_mask"].tolist() == [False] * 5 + [True] * 4 + [False] + [True] * 7 + [False]
    report = validate(r3store.open_store(FIXTURES / "v2-odd", on_duplicate="report"))
    assert report.counts == {"repeated_ids": 1, "quarantined": 1, "missing_rows": 2}


def test_v2_manifest_limits() -> None:
    assert r3store.open_store(FIXTURES / "v2-odd")._catalog.max_sample_rows == 1000
    assert r3store.open_store(FIXTURES / "v2-flame")._catalog.max_sample_rows == 2**22
    with pytest.raises(r3store.errors.SampleTooLargeError, match="'odd-2' has 31 rows, more than the cap of 20"):
        r3store.open_store(FIXTURES / "v2-odd", max_sample_rows=20)
