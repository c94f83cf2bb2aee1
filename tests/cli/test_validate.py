"""``r3store validate`` (``r3store/cli/_validate.py``): leftovers of running writers, missing rows, narrow terminals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import r3store
from tests.clirun import SPEC_3X16, SPEC_13X128, check_80, checked_json, leave_uncommitted, routes_of_16, routes_of_128
from tests.clirun import run_cli as run


def test_validate_exits_0_for_a_running_writers_young_leftover(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with r3store.RouteWriter(path, SPEC_13X128) as w:
        w.append("ok", routes_of_128(np.random.default_rng(2), 9))
    leave_uncommitted(path)
    result = run("validate", str(path))
    assert result.exit_code == 0, result.output
    assert "uncommitted" in result.stdout
    assert "still committing" in result.stdout
    assert run("validate", str(path), "--json").exit_code == 0
    assert run("validate", str(path), "--grace", "0s").exit_code == 1
    leave_uncommitted(path, age_s=7200)  # a crashed writer's: a finding
    assert run("validate", str(path)).exit_code == 1
    assert run("validate", str(path), "--grace", "soon").exit_code == 2


def test_validate_inspect_diff_at_80_columns(store: Path) -> None:
    leave_uncommitted(store, age_s=7200)
    out = check_80(run("validate", str(store), columns=80))
    flat = " ".join(out.split())
    commits = r3store.open_store(store).commits
    for commit in commits:
        assert commit in out  # commit names are never split
    assert "repeated_ids: sample 'bad', decoder layer 3, rows 3" in flat
    check_80(run("inspect", str(store), columns=80))
    check_80(run("diff", str(store), str(store), columns=80))


def test_validate_exits_0_when_missing_rows_are_all_it_found(tmp_path: Path) -> None:
    """Rows stored as missing on purpose (allow_missing=True) are informational, not a fault."""
    rng = np.random.default_rng(0)
    gap = routes_of_16(rng, 10)
    gap[2:4] = -1
    with r3store.RouteWriter(tmp_path / "s", SPEC_3X16) as w:
        w.append("ok", routes_of_16(rng, 9))
        w.append("gap", gap, allow_missing=True)
    result = run("validate", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    assert "missing_rows" in result.stdout
    assert "clean" in result.stdout
    as_json = run("validate", str(tmp_path / "s"), "--json")
    assert as_json.exit_code == 0
    doc = checked_json(as_json, "validate")
    assert doc["ok"] is True
    assert doc["summary"]["by_kind"] == {"missing_rows": 1}
    assert [f["kind"] for f in doc["findings"]] == ["missing_rows"]
    with r3store.RouteWriter(tmp_path / "s", SPEC_3X16,
                             config={"on_invalid": "quarantine"}) as w:  # a real finding as well
        bad = routes_of_16(rng, 6)
        bad[1, 0] = [3, 3]
        w.append("bad", bad)
    failed = run("validate", str(tmp_path / "s"), "--json", "--strict")  # quarantined: a fault with --strict
    assert failed.exit_code == 1
    assert checked_json(failed, "validate")["ok"] is False


def test_validate_help_lists_missing_rows() -> None:
    text = " ".join(run("validate", "--help").stdout.split())
    assert "missing rows" in text
    assert "exit status 0" in text.lower()


def test_validate_limit_reports_the_rows_of_the_samples_it_selects(tmp_path: Path) -> None:
    """--limit N counts samples (its --help says so): the report's rows are theirs, not the
    rows of the whole chunks decoded for them (new-user finding: 2 samples of 30 rows read
    as 128 rows)."""
    path = tmp_path / "s"
    rng = np.random.default_rng(5)
    with r3store.RouteWriter(path, SPEC_3X16, config={"chunk_rows": 64}) as w:
        for i in range(20):
            w.append(f"s{i}", routes_of_16(rng, 30))
    assert "first N (matching) samples" in " ".join(run("validate", "--help").stdout.split())
    doc = checked_json(run("validate", str(path), "--limit", "2", "--json"), "validate")
    assert doc["limit"] == 2
    assert (doc["summary"]["samples_checked"], doc["summary"]["rows_checked"]) == (2, 60)
    assert doc["summary"]["rows_decoded"] == 64  # one whole 64-row chunk
    text = " ".join(run("validate", str(path), "--limit", "2").stdout.split())
    assert "2 samples, 60 rows (decoded: 64 rows in " in text
    whole = checked_json(run("validate", str(path), "--json"), "validate")["summary"]
    assert (whole["samples_checked"], whole["rows_checked"], whole["rows_decoded"]) == (20, 600, 600)
