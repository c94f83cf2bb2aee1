"""``r3store validate`` (``r3store/cli/_validate.py``): leftovers of running writers, missing rows, narrow terminals."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import Result

import r3store
from tests.clirun import checked_json
from tests.clirun import run_cli as run

SPEC_13X128 = r3store.ModelSpec(num_layers=13, num_experts=128, top_k=8, moe_layers=range(1, 13))


def routes_of_128(rng: np.random.Generator, rows: int, layers: int = 12) -> np.ndarray:
    return np.argsort(rng.random((rows, layers, 128)), axis=-1)[..., :8].astype(np.int32)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    rng = np.random.default_rng(16)
    path = tmp_path / "store"
    with r3store.RouteWriter(path, SPEC_13X128, on_invalid="quarantine") as w:
        for i in range(4):
            w.append(f"step-1/prompt-{i}/sample-{i}", routes_of_128(rng, 40 + 10 * i))
        bad = routes_of_128(rng, 12)
        bad[3, 2, :2] = 7
        w.append("bad", bad)
    return path


def leave_uncommitted(path: Path, age_s: float = 0.0) -> str:
    """Write a commit and delete its sample table: what a writer leaves while (or after) committing."""
    with r3store.RouteWriter(path, SPEC_13X128) as w:
        w.append(f"left-{age_s}", routes_of_128(np.random.default_rng(1), 5))
    (commit,) = w.commits
    next((path / "index").rglob(f"{commit}.parquet")).unlink()
    if age_s:
        then = time.time() - age_s
        for p in (path / "routes" / commit).rglob("*"):
            os.utime(p, (then, then))
    return commit


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


def check_80(result: Result) -> str:
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout  # nothing cut
    return result.stdout


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


SPEC_3X16 = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])


def routes_of_16(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2].astype(np.int32)


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
    with r3store.RouteWriter(tmp_path / "s", SPEC_3X16, on_invalid="quarantine") as w:  # a real finding as well
        bad = routes_of_16(rng, 6)
        bad[1, 0] = [3, 3]
        w.append("bad", bad)
    failed = run("validate", str(tmp_path / "s"), "--json")
    assert failed.exit_code == 1
    assert checked_json(failed, "validate")["ok"] is False


def test_validate_help_lists_missing_rows() -> None:
    text = " ".join(run("validate", "--help").stdout.split())
    assert "missing rows" in text
    assert "exit status 0" in text.lower()
