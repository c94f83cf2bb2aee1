"""Short run of the sample table attack (``tables.py``): one changed byte of a one-sample table
is refused (skipped with a ``DamagedTableWarning`` under ``on_damaged_table="skip"``) or, where
no check binds it (page and column statistics, ``created_by``: FORMAT.md 8), changes nothing a
reader returns. The long campaign: ``python -m tests.fuzz.tables --stride 1``."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import tables  # noqa: E402


def test_changed_bytes_of_a_one_sample_table_are_refused_or_change_nothing() -> None:
    report = tables.flips(stride=23, masks=(0xFF,), seed=1)
    assert report["failures"] == [], report["failures"]
    assert report["cases"] >= 150
    assert report["undetected"], "no undetected byte at all: the attack no longer reaches the statistics"
