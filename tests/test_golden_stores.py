"""Stores written by r3store 0.1.0 (format v1) read back bit-identically, forever.

The stores under ``tests/fixtures/stores/`` were written once and are never rewritten; a
format change adds new fixtures beside them. ``expected-v1.npz`` holds the routes each
sample was written with (keys ``<store>__<sample_id>``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store

FIXTURES = Path(__file__).parent / "fixtures" / "stores"


def _expected() -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(FIXTURES / "expected-v1.npz", allow_pickle=False) as npz:
        for key in npz.files:
            store, _, sid = key.partition("__")
            out.setdefault(store, {})[sid] = npz[key]
    return out


EXPECTED = _expected()


@pytest.mark.parametrize("store", sorted(EXPECTED))
def test_v1_store_reads_bit_identically(store: str) -> None:
    reader = r3store.open_store(FIXTURES / store)
    quarantined = {"bad"} if store == "v1-odd" else set()
    assert sorted(reader.sample_ids) == sorted(set(EXPECTED[store]) - quarantined)
    for sid, routes in EXPECTED[store].items():
        got = reader.get(sid, include_quarantined=sid in quarantined)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, routes)


def test_v1_layer_and_row_subsets() -> None:
    reader = r3store.open_store(FIXTURES / "v1-odd")
    full = EXPECTED["v1-odd"]["odd-2"]
    np.testing.assert_array_equal(reader.get("odd-2", layers=[4, 2], rows=slice(3, 31)), full[3:31][:, [3, 1]])


def test_v1_metadata_and_token_hashes() -> None:
    reader = r3store.open_store(FIXTURES / "v1-flame")
    table = reader.samples.to_pydict()
    steps = dict(zip(table["sample_id"], table["step"], strict=True))
    assert [steps[f"flame-{i:02d}"] for i in range(8)] == [0, 1, 2, 3, 9, 9, 9, 9]
    ids = [f"flame-{i:02d}" for i in range(4)]
    tokens = [np.arange(64) * 7 + i for i in range(4)]
    batch = reader.assemble(ids, tokens=tokens, return_tensors="np")
    assert batch["routes"].shape == (4 * 64, 8, 6)
    with pytest.raises(r3store.errors.AlignmentError):
        reader.assemble(ids, tokens=[t + 1 for t in tokens], return_tensors="np")
