"""``r3store inspect`` (``r3store/cli/_inspect.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import r3store
from tests.clirun import SPEC_3X16, checked_json, routes_of_16
from tests.clirun import run_cli as run


def test_inspect_labels_the_commit_count_and_time_range_apart(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path / "s", SPEC_3X16) as w:
        w.append("s", routes_of_16(np.random.default_rng(2), 5))
    result = run("inspect", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 2:
            assert cells[0] not in rows, f"two rows labelled {cells[0]!r}"
            rows[cells[0]] = cells[1]
    doc = checked_json(run("inspect", str(tmp_path / "s"), "--json"), "inspect")
    assert rows["commits"] == "1"
    assert rows["committed"] == f"{doc['first_commit']} .. {doc['last_commit']}"
