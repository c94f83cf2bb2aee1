"""CLI problems a new user met: missing rows fail ``validate``, ``stats``'s policy line,
``inspect``'s two ``commits`` rows, ``compact --json`` without a schema."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import numpy as np

import r3store
from r3store._format import load_schema
from tests.clirun import checked_json
from tests.clirun import run_cli as run

SPEC = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])


def routes_of(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2].astype(np.int32)




def test_validate_exits_0_when_missing_rows_are_all_it_found(tmp_path: Path) -> None:
    """Rows stored as missing on purpose (allow_missing=True) are informational, not a fault."""
    rng = np.random.default_rng(0)
    gap = routes_of(rng, 10)
    gap[2:4] = -1
    with r3store.RouteWriter(tmp_path / "s", SPEC) as w:
        w.append("ok", routes_of(rng, 9))
        w.append("gap", gap, allow_missing=True)
    result = run("validate", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    assert "missing_rows" in result.stdout and "clean" in result.stdout
    as_json = run("validate", str(tmp_path / "s"), "--json")
    assert as_json.exit_code == 0
    doc = checked_json(as_json, "validate")
    assert doc["ok"] is True and doc["summary"]["by_kind"] == {"missing_rows": 1}
    assert [f["kind"] for f in doc["findings"]] == ["missing_rows"]
    with r3store.RouteWriter(tmp_path / "s", SPEC, on_invalid="quarantine") as w:  # a real finding as well
        bad = routes_of(rng, 6)
        bad[1, 0] = [3, 3]
        w.append("bad", bad)
    failed = run("validate", str(tmp_path / "s"), "--json")
    assert failed.exit_code == 1 and checked_json(failed, "validate")["ok"] is False


def test_validate_help_lists_missing_rows() -> None:
    text = " ".join(run("validate", "--help").stdout.split())
    assert "missing rows" in text and "exit status 0" in text.lower()


def test_stats_policy_range_uses_every_version_of_a_sample(tmp_path: Path) -> None:
    """A sample whose rows came from versions 41 and 42 spans 41..42 (not 42..42), and is "1 sample"."""
    routes = routes_of(np.random.default_rng(1), 10)
    with r3store.RouteWriter(tmp_path / "s", SPEC) as w:
        w.append("s", routes[:6], final=False, policy_version=41)
        w.append("s", routes[6:], start=6, policy_version=42)
    result = run("stats", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    assert "policy versions 41..42 on 1 sample; 1 sample mixes versions" in result.stdout
    doc = checked_json(run("stats", str(tmp_path / "s"), "--json"), "stats")
    assert doc["policy"] == {"samples_with_version": 1, "mixed_version_samples": 1, "min_version": 41,
                             "max_version": 42}


def test_inspect_labels_the_commit_count_and_time_range_apart(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path / "s", SPEC) as w:
        w.append("s", routes_of(np.random.default_rng(2), 5))
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


def test_every_json_command_has_a_shipped_schema() -> None:
    import importlib

    from r3store.cli._main import COMMANDS

    with_json = [name for name, (module, _) in COMMANDS.items()
                 if any(p.name == "as_json" for p in getattr(importlib.import_module(module), name).params)]
    assert "compact" in with_json
    for name in with_json:
        schema = load_schema(f"cli-{name}")
        assert schema["title"] == f"r3store {name} --json", name
        jsonschema.validators.validator_for(schema).check_schema(schema)
