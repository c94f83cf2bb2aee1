"""Short runs of the version 2 checkpoint attacks (``checkpoints.py``): a changed byte anywhere in
the golden ``v3-ckpt2`` checkpoint, a cut or extended one, and resealed header lies are refused
(or warned about, then the sample tables read) whichever call reads the rows first, never a
different answer; the Bloom filter has no false negative and equals FORMAT.md's. The long
campaign: ``python -m tests.fuzz.checkpoints`` (every byte position)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import checkpoints  # noqa: E402
from tests.fuzz.targets import Failure  # noqa: E402


def test_changed_bytes_of_a_v2_checkpoint_are_refused_or_harmless() -> None:
    report = checkpoints.flips(stride=150, seed=1)
    assert report["failures"] == 0
    assert report["cases"] >= 40


def test_cut_and_extended_v2_checkpoints_are_refused_or_harmless() -> None:
    report = checkpoints.truncations(stride=211, seed=1)
    assert report["failures"] == 0
    assert report["cases"] >= 30


def test_resealed_header_lies_are_refused_or_harmless() -> None:
    report = checkpoints.reseal(seed=1, orders_per_case=1, stores=1)  # the golden store
    assert report["failures"] == [], report["failures"]
    outcomes = report["outcomes"]
    assert isinstance(outcomes, dict)
    assert set(outcomes["watermark a day later"]) == {"commits hidden, named by validate"}
    assert set(outcomes["bloom of all but the last id"]) == {"ok"}  # harmless: no newer id to tell apart
    assert all("CheckpointWarning" in label for label in outcomes["two ids swapped in the rows, group digests kept"])
    assert report["cases"] >= 45


def test_bloom_filter_has_no_false_negative_and_follows_the_format() -> None:
    report = checkpoints.bloom(seed=1, cases=60)
    assert report["failures"] == 0


def test_the_oracle_sees_a_whole_forgery() -> None:
    """A checkpoint with every digest recomputed over swapped ids serves other routes: no reader
    can tell (a forgery, not damage), but the oracle must."""
    objects = checkpoints.golden_objects()
    key = checkpoints.ckpt_key(objects)
    forged = {**objects, key: checkpoints.forge(objects[key], rows=checkpoints.swap_first_ids, regroup=True)}
    truth = checkpoints.Truth(objects, {})
    with pytest.raises(Failure, match=r"differs|without an error"):
        checkpoints.check_uses(forged, truth, ["get", "row"] * 6, seed=0)


def test_resealed_lies_on_a_version_3_checkpoint_are_refused_once_the_rows_are_read() -> None:
    """Version 3 lookups trust the header's Bloom filters and recent commits (as ``len`` trusts its
    counts): a lie may be served by a lookup, but every later call that reads the rows raises."""
    report = checkpoints.reseal(seed=2, orders_per_case=1, stores=2)  # the golden store, then a v3 one
    assert report["failures"] == [], report["failures"]
    assert report["cases"] >= 100


def test_version_3_lookups_mixed_with_whole_list_uses_equal_the_tables() -> None:
    report = checkpoints.lookups(seed=1, stores=12, orders_per_store=3)
    assert report["failures"] == [], report["failures"]
    outcomes = report["outcomes"]
    assert isinstance(outcomes, dict)
    assert outcomes.get("none: ok", 0) >= 8  # undamaged stores: every answer equal, no warning
    assert report["cases"] >= 25


def test_changed_and_cut_bytes_of_a_v3_checkpoint_are_refused_or_harmless() -> None:
    """The golden ``v3-ckpt3`` checkpoint (one Bloom filter per row group, ``last``), each call
    order starting with another lookup or whole-list use."""
    assert checkpoints.flips(stride=150, seed=1, golden=checkpoints.GOLDEN_CKPT3)["cases"] >= 30
    assert checkpoints.truncations(stride=300, seed=1, golden=checkpoints.GOLDEN_CKPT3)["cases"] >= 20
