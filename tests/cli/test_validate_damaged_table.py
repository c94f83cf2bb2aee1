"""A damaged sample table is a finding of ``r3store validate`` (``damaged_table``, exit 1, every
other commit still checked), and ``inspect`` / ``stats`` open the store and report it, before and
after ``r3store compact``."""

from __future__ import annotations

from pathlib import Path

import r3store
from tests.clirun import checked_json
from tests.clirun import run_cli as run
from tests.reader.test_catalog_damaged_table import commit_of, damage, write_three_commits
from tests.routes import sample_tables


def _damaged(tmp_path: Path, compacted: bool) -> tuple[Path, str]:
    root = tmp_path / "store"
    write_three_commits(root)
    if compacted:
        r3store.compact(str(root))
    table = sample_tables(root)[1]
    damage(table)
    return root, commit_of(table)


def _damaged_findings(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == "damaged_table"]


def test_validate_reports_the_table_and_checks_every_other_commit(tmp_path: Path) -> None:
    root, commit = _damaged(tmp_path, compacted=False)
    result = run("validate", str(root), "--json")
    assert result.exit_code == 1, result.output
    doc = checked_json(result, "validate")
    (finding,) = _damaged_findings(doc)
    assert finding["severity"] == "error"
    assert commit in finding["array"]
    assert f"{commit}.parquet" in finding["detail"]
    assert "routes were not checked" in finding["detail"]
    assert doc["summary"]["samples_checked"] == 4  # the two other commits' samples
    assert doc["summary"]["by_kind"] == {"damaged_table": 1}
    text = run("validate", str(root))
    assert text.exit_code == 1
    assert "damaged_table" in text.stdout


def test_inspect_and_stats_open_the_store_and_report_the_table(tmp_path: Path) -> None:
    root, commit = _damaged(tmp_path, compacted=False)
    for command in ("inspect", "stats"):
        result = run(command, str(root), "--json")
        assert result.exit_code == 1, result.output
        assert "damaged_table" in result.stderr
        assert commit in result.stderr
        doc = checked_json(result, command)
        assert doc["samples"] == 4
        if command == "inspect":
            assert list(doc["damaged_tables"]) == [commit]
    assert "damaged sample tables" in run("inspect", str(root)).stdout


def test_validate_after_compact_checks_the_commit_from_the_checkpoint(tmp_path: Path) -> None:
    root, commit = _damaged(tmp_path, compacted=True)
    result = run("validate", str(root), "--json")
    assert result.exit_code == 1, result.output
    doc = checked_json(result, "validate")
    (finding,) = _damaged_findings(doc)
    assert commit in finding["array"]
    assert "a checkpoint covers this commit" in finding["detail"]
    assert doc["summary"]["by_kind"] == {"damaged_table": 1}  # the checkpoint itself agrees with every intact table
    assert doc["summary"]["samples_checked"] == 6
    assert run("inspect", str(root)).exit_code == 0  # readers use the checkpoint: nothing is missing
