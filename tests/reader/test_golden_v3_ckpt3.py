"""The golden format v3 store ``v3-ckpt3`` (checkpoint version 3) reads back bit-identically, forever.

Written once by ``tests/fixtures/stores/make_v3_ckpt3.py``: the samples of ``v3-ckpt``, with a
version 3 checkpoint (one Bloom filter per row group, the last row's store-order key)
covering the first commit, and a second commit after it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store._format import read_checkpoint_header
from r3store.audit import validate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stores"
STORE = FIXTURES / "v3-ckpt3"


def _expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "expected-v3-ckpt3.npz", allow_pickle=False) as npz:
        return {key.partition("__")[2]: npz[key] for key in npz.files}


def test_v3_ckpt3_checkpoint_is_version_3_with_a_filter_per_group() -> None:
    store = r3store.open_store(STORE)
    key = store.checkpoint
    assert key is not None
    header = read_checkpoint_header((STORE / key).read_bytes(), key, spec=store.spec, version=3,
                                    store_id=store.manifest.store_id)
    assert header is not None
    assert header.layout == 3
    assert (header.rows, header.visible, header.commits, header.unique_ids) == (3, 2, 1, True)
    assert header.recent == {"golden-v3-a-00000"}
    assert header.last is not None
    assert header.last[1] == "golden-v3-a-00000"
    assert header.group_blooms is not None
    assert len(header.group_blooms.filters) == 1
    assert header.group_blooms.groups_of("a1") == [0]
    assert header.bloom.hits(["a0", "a1", "bad", "b0", "b1"])[:3] == ["a0", "a1", "bad"]


@pytest.mark.parametrize("use_checkpoint", [True, False])
def test_v3_ckpt3_store_reads_bit_identically(use_checkpoint: bool) -> None:
    store = r3store.open_store(STORE, reader={"use_checkpoint": use_checkpoint})
    assert store.format_version == 3
    assert (store.checkpoint is not None) == use_checkpoint
    assert len(store) == 4
    expected = _expected()
    for sid, routes in expected.items():
        got = store.get(sid, include_quarantined=sid == "bad")
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, routes)
    assert store.missing_rows("a0") == [(5, 9)]
    assert store.policy_spans("a0") == [(0, 40, 7)]
    assert store.row("a1")["note"] == "plain"
    assert store.row("b0")["note"] is None
    assert sorted(store.sample_ids) == sorted(set(expected) - {"bad"})
    assert store.commits == ["golden-v3-a-00000", "golden-v3-b-00000"]


def test_v3_ckpt3_first_get_reads_one_group_and_pickles() -> None:
    store = r3store.open_store(STORE)
    assert store._catalog.in_parts
    np.testing.assert_array_equal(store.get("a1"), _expected()["a1"])
    with pytest.raises(r3store.errors.SampleNotFoundError, match="quarantined"):
        store.get("bad")
    assert store._catalog.in_parts  # the group was read, not every row
    clone = pickle.loads(pickle.dumps(store))  # reads the rows first
    np.testing.assert_array_equal(clone.get("b0"), _expected()["b0"])
    assert not store._catalog.in_parts


def test_v3_ckpt3_validates_with_only_its_planted_faults() -> None:
    report = validate(r3store.open_store(STORE))
    assert report.counts == {"repeated_ids": 1, "quarantined": 1, "missing_rows": 1}
    assert {f.sample_id for f in report.findings} == {"bad", "a0"}
