"""``diff``'s only-in-A / only-in-B lists follow ``sample_filter`` and ``limit`` as the compared samples do."""

from __future__ import annotations

from pathlib import Path

import r3store
from r3store.audit import diff
from tests.routes import SPEC_4X16, routes_4x16


def _store(root: Path, ids: list[str]) -> r3store.RouteStore:
    with r3store.RouteWriter(str(root), SPEC_4X16) as w:
        for i, sid in enumerate(ids):
            w.append(sid, routes_4x16(5, i))
    return r3store.open_store(root)


def test_only_in_lists_follow_the_sample_filter(tmp_path: Path) -> None:
    a = _store(tmp_path / "a", ["step0/x", "step0/y", "step1/x", "step1/a-only"])
    b = _store(tmp_path / "b", ["step0/x", "step0/y", "step1/x", "extra/b-only", "step0/b-only"])
    d = diff(a, b, sample_filter="step0/*")
    assert d["samples_compared"] == 2
    assert (d["only_in_a"], d["only_in_b"]) == (0, 1)
    assert d["only_in_b_examples"] == ["step0/b-only"]
    whole = diff(a, b)
    assert (whole["only_in_a"], whole["only_in_b"]) == (1, 2)


def test_only_in_lists_stop_at_the_last_compared_sample_when_the_limit_is_reached(tmp_path: Path) -> None:
    a = _store(tmp_path / "a", ["s0", "a-only0", "s1", "a-only1", "s2"])
    b = _store(tmp_path / "b", ["s0", "s1", "b-only0", "s2", "b-only1"])
    d = diff(a, b, limit=2)
    assert d["samples_compared"] == 2
    assert d["only_in_a_examples"] == ["a-only0"]
    assert d["only_in_b_examples"] == []
    loose = diff(a, b, limit=10)  # not reached: the whole stores
    assert loose["only_in_a_examples"] == ["a-only0", "a-only1"]
    assert loose["only_in_b_examples"] == ["b-only0", "b-only1"]
