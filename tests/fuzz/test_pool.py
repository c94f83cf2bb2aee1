"""Short run of the output pool attack (``pool.py``): results kept in every form stay equal to an
unpooled reader's while the pooled reader builds later outputs in released blocks, and the pool
stays within its budget; the oracle sees a pool that hands out a busy block. The long campaign:
``python -m tests.fuzz.pool --steps 5000``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from r3store.reader import _pool  # noqa: E402
from tests.fuzz import pool  # noqa: E402


def test_kept_results_stay_equal_while_the_pool_reuses_released_blocks() -> None:
    report = pool.run(steps=200, seed=1, budget_mib=64)
    assert report["failures"] == [], report["failures"]
    assert report["reused"] >= 10  # the attack reaches reuse


def test_the_oracle_sees_a_busy_block_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pool, "_OWN_REFS", _pool._OWN_REFS + 1)  # one outside reference counted as free
    report = pool.run(steps=200, seed=1, budget_mib=64)
    assert any("changed" in f or "differs" in f for f in report["failures"])
