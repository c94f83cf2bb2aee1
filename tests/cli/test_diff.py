"""``r3store diff`` (``r3store/cli/_diff.py``): comparisons that compare nothing, duplicate ids."""

from __future__ import annotations

from pathlib import Path

import r3store
from tests.clirun import checked_json
from tests.clirun import run_cli as run
from tests.routes import SPEC_4X16, make_store, routes_4x16


def test_diff_of_stores_sharing_no_sample_id_is_an_error(tmp_path: Path) -> None:
    """"0% differ" over no sample is no result: exit 2, one line naming what each side holds."""
    make_store(tmp_path / "a", n=2)
    with r3store.RouteWriter(tmp_path / "b", SPEC_4X16) as w:
        w.append("other", routes_4x16(10, 5))
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 2, result.output
    assert "the stores share no sample id" in result.stderr
    assert "only in A:" in result.stderr
    assert "'s0'" in result.stderr
    assert "only in B:" in result.stderr
    assert "1 sample (e.g. 'other')" in result.stderr
    assert "0.0000%" not in result.output
    assert run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json").exit_code == 2


def test_diff_limit_0_and_unmatched_filter_are_errors(tmp_path: Path) -> None:
    make_store(tmp_path / "a", n=2)
    make_store(tmp_path / "b", n=2, seed=3)
    limited = run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--limit", "0")
    assert limited.exit_code == 2
    assert "--limit 0 selects no sample" in limited.stderr
    unmatched = run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--sample-filter", "nomatch*")
    assert unmatched.exit_code == 2
    assert "share no sample id matching --sample-filter 'nomatch*'" in unmatched.stderr
    doc = checked_json(run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json"), "diff")
    assert doc["samples_compared"] == 2


def test_diff_warns_of_duplicate_ids_and_names_the_copy_read(tmp_path: Path) -> None:
    make_store(tmp_path / "a", n=2)
    make_store(tmp_path / "a", n=1)
    make_store(tmp_path / "b", n=2)
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("warning:")]
    assert f"1 sample id is committed more than once in {tmp_path / 'a'}: 's0' (commits " in line
    assert "read: " in line
    assert "DuplicateSampleError" in line


def test_diff_header_at_80_columns_names_each_store_whole_on_a_line_of_its_own(tmp_path: Path) -> None:
    """New-user finding: at 80 columns the header wrapped the second path mid-name (the title
    was folded to the table's width). Now the folders the two stores share get a line of their
    own and A and B name the rest; the table still fits."""
    runs = tmp_path / "rollouts-of-a-long-running-job" / "step-000123"
    make_store(runs / "rollout-routes", n=2)
    make_store(runs / "trainer-routes", n=2, seed=3)
    result = run("diff", str(runs / "rollout-routes"), str(runs / "trainer-routes"), columns=80)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:4] == ["r3store diff", f"  in {runs}/", "  A rollout-routes", "  B trainer-routes"]
    assert max(len(line) for line in lines[4:]) <= 80
    wide = run("diff", str(runs / "rollout-routes"), str(runs / "trainer-routes"), columns=400)
    assert wide.stdout.splitlines()[:3] == ["r3store diff", f"  A {runs}/rollout-routes", f"  B {runs}/trainer-routes"]
