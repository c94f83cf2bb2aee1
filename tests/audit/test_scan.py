"""Audit scans as plans: units that run anywhere with readers of their commits, and a pure merge.

The single-process scans (``validate``, ``stats``, ``diff``) are ``run_plan`` over the same
units and merge; here each unit is run with a reader opened on *only its commits* (as a
Ray task does), the partial results are shuffled and the merge must give the
single-process report exactly, findings, truncation and JSON included.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from r3store.audit import ScanPlan, diff, plan_diff, plan_stats, plan_validate, run_plan, stats, validate
from r3store.errors import FormatError
from r3store.reader import RouteReader, open_reader
from r3store.testing.faults import FaultyStore, write_faulty_store


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    return write_faulty_store(tmp_path_factory.mktemp("faulty") / "store")


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    """Same sample ids, other routes (seed), no corrupted frame: the B side of a diff."""
    return write_faulty_store(tmp_path_factory.mktemp("other") / "store", seed=1, corrupt=False)


def scattered(plan: ScanPlan[Any], urls: list[str], seed: int) -> Any:
    """Run every unit with readers of only its commits, in a random order, then merge."""
    units = list(plan.units)
    random.Random(seed).shuffle(units)
    partials = []
    for unit in units:
        readers = [open_reader(url, commits=commits, on_duplicate=plan.on_duplicate)  # type: ignore[arg-type]
                   for url, commits in zip(urls, unit.commits, strict=True)]
        assert all(r.is_partial for r in readers)
        partials.append(plan.mapper(readers, unit, lambda rows: None))
    return plan.merge(iter(partials))


def as_json(result: Any) -> str:
    return json.dumps(result if isinstance(result, dict) else result.to_dict(), sort_keys=False)


def test_plans_name_the_commits_of_their_units(faulty: FaultyStore) -> None:
    store = open_reader(faulty.url, on_duplicate="report")
    plan = plan_validate(store)
    assert [u.index for u in plan.units] == list(range(len(plan.units)))
    assert sorted(c for u in plan.units for (c,) in u.commits) == faulty.commits  # one unit per route array
    assert plan.total_rows == sum(u.rows for u in plan.units) > 0
    diff_plan = plan_diff(store, open_reader(faulty.url, on_duplicate="first"))
    dup = next(u for u in diff_plan.units if u.work[0] == "dup")
    assert dup.commits == (("w1-00001",), ("w1-00001",))  # the copy readers keep: the earliest commit


@pytest.mark.parametrize("max_findings", [10_000, 3])
def test_validate_scattered_equals_single_process(faulty: FaultyStore, max_findings: int) -> None:
    store = open_reader(faulty.url, on_duplicate="report")
    whole = validate(store, max_findings=max_findings)
    assert set(whole.counts) >= {"checksum", "zero_layer", "repeated_ids", "id_out_of_range", "row_count",
                                 "duplicate_sample", "quarantined", "uncommitted"}
    assert whole.truncated == (max_findings == 3)
    plan = plan_validate(store, max_findings=max_findings)
    for seed in range(3):
        assert as_json(scattered(plan, [faulty.url], seed)) == as_json(whole)
    assert as_json(run_plan(plan, [store], workers=3)) == as_json(whole)


def test_validate_subset_scattered(faulty: FaultyStore) -> None:
    store = open_reader(faulty.url, on_duplicate="report")
    whole = validate(store, sample_filter="w1-*", limit=3)
    plan = plan_validate(store, sample_filter="w1-*", limit=3)
    assert as_json(scattered(plan, [faulty.url], 0)) == as_json(whole)
    assert whole.counts == {"checksum": 1}


def test_stats_and_diff_scattered_equal_single_process(faulty: FaultyStore, other: FaultyStore) -> None:
    store = open_reader(faulty.url, on_duplicate="first")
    ref = open_reader(other.url, on_duplicate="first")
    for kwargs in ({}, {"sample_filter": "w2-*"}, {"limit": 4}):  # stats reads every row: the clean store
        assert as_json(scattered(plan_stats(ref, **kwargs), [other.url], 1)) == as_json(stats(ref, **kwargs))
    readable = "w[02]-*"  # the corrupted frame makes a sample of w1 unreadable
    whole = diff(store, ref, sample_filter=readable)
    assert whole["samples_compared"] > 5
    assert whole["decision_flip_rate"] > 0.5
    assert as_json(scattered(plan_diff(store, ref, sample_filter=readable), [faulty.url, other.url], 2)) \
        == as_json(whole)


def test_merge_is_pure_and_order_free(faulty: FaultyStore) -> None:
    """Merging the same partials twice, in other orders, gives equal results; no store is read."""
    store = open_reader(faulty.url, on_duplicate="report")
    plan = plan_validate(store)
    partials = [plan.mapper([store], u, lambda rows: None) for u in plan.units]
    first = as_json(plan.merge(partials))
    assert as_json(plan.merge(reversed(partials))) == first
    assert as_json(plan.merge(iter(partials[1:] + partials[:1]))) == first


def test_run_plan_reports_progress(other: FaultyStore) -> None:
    store = open_reader(other.url, on_duplicate="first")
    seen: list[tuple[int, int]] = []
    plan = plan_stats(store)
    run_plan(plan, [store], progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (0, plan.total_rows)
    assert seen[-1] == (plan.total_rows, plan.total_rows)


def test_units_read_nothing_outside_their_commits(other: FaultyStore) -> None:
    """A reader of the wrong commit cannot run a unit: units really are self-contained."""
    store: RouteReader = open_reader(other.url, on_duplicate="report")
    plan = plan_stats(store)
    unit = next(u for u in plan.units if u.commits[0] != ("w2-00000",))
    wrong = open_reader(other.url, commits=["w2-00000"])
    with pytest.raises(FormatError, match="not a committed route array"):
        plan.mapper([wrong], unit, lambda rows: None)
    right = open_reader(other.url, commits=unit.commits[0])
    np.testing.assert_array_equal(plan.mapper([right], unit, lambda rows: None),
                                  plan.mapper([store], unit, lambda rows: None))
