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


# -- new-user findings: mixed codecs, signs, set-coded widths, empty stores -------------------------


def test_inspect_lists_every_codec_of_a_mixed_store(tmp_path: Path) -> None:
    from tests.routes import SPEC_4X16, routes_4x16

    path = tmp_path / "mixed"
    for i, codec in enumerate(("bitpack", "set", "set")):
        with r3store.RouteWriter(path, SPEC_4X16, {"codec": codec}) as w:
            w.append(f"s{i}", routes_4x16(20, i))
    doc = checked_json(run("inspect", str(path), "--json"), "inspect")
    assert doc["codecs"] == {"r3store.bitpack": 1, "r3store.set": 2}
    assert doc["codec"] in doc["codecs"]  # the newest commit's, as before
    text = run("inspect", str(path)).stdout
    assert "r3store.bitpack (1 array), r3store.set (2 arrays)" in text
    assert "ideal" not in text  # a set coder beats the bit-packed width: it is no ideal


def test_inspect_signs_and_set_coded_width(tmp_path: Path) -> None:
    from tests.routes import SPEC_4X16, routes_4x16

    with r3store.RouteWriter(tmp_path / "set", SPEC_4X16, {"codec": "set"}) as w:
        w.append("s", routes_4x16(400, 1))
    doc = checked_json(run("inspect", str(tmp_path / "set"), "--json"), "inspect")
    assert doc["overhead_pct"] < 0
    (line,) = [ln for ln in run("inspect", str(tmp_path / "set")).stdout.splitlines() if "bits per expert id" in ln]
    assert f"(bit-packed width 4, {doc['overhead_pct']:+.3f}%" in line
    assert "+-" not in line


def test_inspect_and_stats_of_an_empty_store(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path / "e", SPEC_3X16):
        pass
    text = run("inspect", str(tmp_path / "e")).stdout
    assert "None" not in text
    assert "0.000x" not in text
    assert "committed" in text
    doc = checked_json(run("inspect", str(tmp_path / "e"), "--json"), "inspect")
    assert doc["codecs"] == {}
    stats = run("stats", str(tmp_path / "e"))
    assert stats.exit_code == 0
    assert "hottest experts" not in stats.stdout
    assert "no samples" in stats.stdout
