"""Issue 22: the swap and sweep attacks (``attacks.py``) find nothing: a foreign checkpoint (and
every other object of a store with the same commit names) is refused or harmless, and no writer
or compaction clock hides an acknowledged sample."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import attacks  # noqa: E402


def test_swap_attack_with_a_foreign_checkpoint() -> None:
    report = attacks.swap()
    outcomes = report["outcomes"]
    assert isinstance(outcomes, dict)
    assert outcomes["foreign checkpoint claiming more commits"] == "CheckpointWarning, then the tables"
    assert outcomes["foreign checkpoint under our key"] == "CheckpointWarning, then the tables"
    assert int(str(report["cases"])) >= 8


def test_sweep_attack_with_skewed_writer_and_compaction_clocks() -> None:
    report = attacks.sweep((-2 * 3600, -16 * 60, 0, 2 * 3600))
    assert report["failures"] == 0
