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


# -- new-user findings: empty selections, quarantined samples, duplicate ids ----------------------


def test_validate_filter_or_limit_selecting_no_sample_is_an_error(tmp_path: Path) -> None:
    """A mistyped filter must fail a CI job, not report "clean" over nothing."""
    from tests.routes import make_store

    make_store(tmp_path / "s", n=3)
    for args, words in ((["--sample-filter", "zzz*"], "--sample-filter 'zzz*' matched no sample id"),
                        (["--limit", "0"], "--limit 0 selects no sample")):
        result = run("validate", str(tmp_path / "s"), *args)
        assert result.exit_code == 2, result.output
        assert words in result.stderr
        assert "clean" not in result.output
    assert "(the store holds 3 samples)" in run("validate", str(tmp_path / "s"), "--sample-filter", "x").stderr
    assert run("validate", str(tmp_path / "s"), "--sample-filter", "s1").exit_code == 0


def quarantined_store(path: Path) -> Path:
    """One valid sample and one quarantined for a repeated id (row 3, decoder layer 1)."""
    rng = np.random.default_rng(7)
    bad = routes_of_16(rng, 8)
    bad[3, 0] = [5, 5]
    with r3store.RouteWriter(path, SPEC_3X16, config={"on_invalid": "quarantine"}) as w:
        w.append("ok", routes_of_16(rng, 8))
        w.append("bad", bad)
    return path


def test_validate_quarantined_sample_is_a_warning_and_exits_0(tmp_path: Path) -> None:
    """The writer did what on_invalid="quarantine" promised: text, JSON "ok" and exit status agree."""
    path = quarantined_store(tmp_path / "q")
    result = run("validate", str(path))
    assert result.exit_code == 0, result.output
    assert "0 error(s), 2 warning(s): 1 repeated_ids, 1 quarantined" in result.stdout
    assert "error" not in result.stdout.replace("0 error(s)", "").replace("no errors", "")
    assert "expert id repeated within row 3, decoder layer 1" in result.stdout  # the recorded reason
    assert "ok: no errors" in result.stdout
    doc = checked_json(run("validate", str(path), "--json"), "validate")
    assert doc["ok"] is True
    assert doc["strict"] is False
    assert (doc["summary"]["errors"], doc["summary"]["warnings"]) == (0, 2)
    assert doc["summary"]["on_quarantined"] == {"repeated_ids": 1}
    assert {(f["kind"], f["severity"]) for f in doc["findings"]} == {("repeated_ids", "warning"),
                                                                     ("quarantined", "warning")}


def test_validate_strict_fails_on_quarantined_samples(tmp_path: Path) -> None:
    path = quarantined_store(tmp_path / "q")
    strict = run("validate", str(path), "--strict")
    assert strict.exit_code == 1
    assert "--strict: quarantined samples count as faults" in strict.stdout
    result = run("validate", str(path), "--strict", "--json")
    assert result.exit_code == 1
    doc = checked_json(result, "validate")
    assert (doc["ok"], doc["strict"]) == (False, True)


def test_validate_a_real_fault_next_to_a_quarantined_sample_still_exits_1(tmp_path: Path) -> None:
    path = quarantined_store(tmp_path / "q")
    with r3store.RouteWriter(path, SPEC_3X16) as w:  # "ok" again: a duplicate id, an error
        w.append("ok", routes_of_16(np.random.default_rng(1), 8))
    result = run("validate", str(path), "--json")
    assert result.exit_code == 1
    doc = checked_json(result, "validate")
    assert doc["ok"] is False
    assert doc["summary"]["errors"] == 1


def test_validate_duplicate_text_says_what_readers_do(tmp_path: Path) -> None:
    from tests.routes import make_store

    make_store(tmp_path / "d", n=1)
    make_store(tmp_path / "d", n=1)
    result = run("validate", str(tmp_path / "d"))
    assert result.exit_code == 1
    text = " ".join(result.stdout.split())
    assert "readers keep the first" not in text
    assert "open_store refuses the store (DuplicateSampleError)" in text
    assert "on_duplicate is 'first' or 'report'" in text
