"""``r3store gc`` (``r3store/cli/_gc.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from r3store._format import load_schema
from tests.clirun import leave_uncommitted
from tests.clirun import run_cli as run


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
