"""``r3store gc`` (``r3store/cli/_gc.py``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import r3store
from r3store._format import load_schema
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


def test_gc_says_how_many_younger_leftovers_it_kept(store: Path) -> None:
    leave_uncommitted(store)
    result = run("gc", str(store))
    assert result.exit_code == 0, result.output
    assert "no uncommitted leftovers older than 1h" in result.stdout
    assert "kept 1 younger leftover(s)" in result.stdout
    assert "still be committing" in result.stdout
    old = leave_uncommitted(store, age_s=7200)
    doc = json.loads(run("gc", str(store), "--json").stdout)
    jsonschema.validate(doc, load_schema("cli-gc"))
    assert [item["commit"] for item in doc["leftovers"]] == [old]
    assert doc["kept_younger"] == 1
    deleted = run("gc", str(store), "--delete")
    assert old in deleted.stdout
    assert "kept 1 younger" in deleted.stdout
    assert not [p for p in (store / "routes" / old).rglob("*") if p.is_file()]
