"""``r3store compact`` (``r3store/cli/_compact.py``): its one-line report."""

from __future__ import annotations

from pathlib import Path

from tests.clirun import run_cli as run
from tests.routes import make_store


def test_compact_counts_in_the_singular(tmp_path: Path) -> None:
    """New-user finding: "1 commits"."""
    make_store(tmp_path / "s", n=1)
    wrote = run("compact", str(tmp_path / "s"))
    assert wrote.exit_code == 0, wrote.output
    assert ": 1 commit, 1 sample row, " in wrote.stdout
    again = run("compact", str(tmp_path / "s"))
    assert "already covers the 1 commit: nothing written" in again.stdout
