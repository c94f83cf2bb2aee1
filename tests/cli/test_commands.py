"""The `r3store` CLI: inspect and demo (audit commands live in test_audit_commands.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import r3store
from r3store.cli import main
from r3store.cli._options import parse_storage_options
from r3store.data import flame_samples, flame_spec


@pytest.fixture
def flame_store(tmp_path: Path) -> Path:
    path = tmp_path / "flame"
    with r3store.RouteWriter(path, flame_spec()) as w:
        for sid, routes in flame_samples().items():
            w.append(sid, routes, metadata={"step": 1})
    return path


def test_inspect_json_reports_sizes(flame_store: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(flame_store), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["samples"] == 32
    assert summary["tokens"] == 32 * 64
    assert summary["expert_ids"] == 32 * 63 * 8 * 6
    assert summary["ideal_bits_per_id"] == 6
    assert 6 <= summary["bits_per_id"] < 6 * 1.02
    assert summary["size_vs_int32"] == pytest.approx(summary["route_bytes"] / (4 * summary["expert_ids"]), rel=1e-3)
    assert summary["commits"] == 1
    assert summary["writers"] == 1
    assert summary["metadata_columns"] == ["step"]
    assert summary["spec"]["moe_layers"] == list(range(2, 10))


def test_inspect_human_output(flame_store: Path) -> None:
    result = CliRunner().invoke(main, ["inspect", str(flame_store)])
    assert result.exit_code == 0, result.output
    for words in ("bits per expert id", "size vs int32", "64 experts, top-6", "MoE: 2..9", "32"):
        assert words in result.output


def test_inspect_not_a_store_exits_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 2
    assert "NotAStoreError" in result.output
    assert "r3store.json" in result.output


def test_storage_option_parsing() -> None:
    opts = parse_storage_options(("key=abc", "endpoint_url=http://127.0.0.1:9", "anon=false", "retries=3"))
    assert opts == {"key": "abc", "anon": False, "retries": 3, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    result = CliRunner().invoke(main, ["inspect", "x", "-o", "novalue"])
    assert result.exit_code == 2
    assert "key=value" in result.output


def test_demo_runs_and_verifies(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", str(target), "--writers", "2", "--loader-workers", "2"])
    assert result.exit_code == 0, result.output
    assert "every route bit-identical" in result.output
    assert f"stores kept in {target}: rollout" in " ".join(result.output.split())
    store = r3store.open_store(target / "rollout")
    assert len(store) == 32
    assert len(store.commits) == 2
    source = flame_samples()
    for sid in store.sample_ids:
        np.testing.assert_array_equal(store.get(sid), source[sid])
    assert sorted(store.samples.column("worker").to_pylist()) == sorted([0, 1] * 16)


def test_demo_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    result = CliRunner().invoke(main, ["demo", str(tmp_path)])
    assert result.exit_code == 2
    assert (tmp_path / "x").read_text() == "keep me"


def test_gc_json_validates_and_groups_a_shard(tmp_path: Path) -> None:
    import jsonschema

    from r3store._format import load_schema

    url = tmp_path / "store"
    with r3store.RouteWriter(url, flame_spec()) as w:
        w.append("a", flame_samples()["flame-00"])
        shard = w.flush()
    next((url / "index").rglob(f"{shard}.parquet")).unlink()
    (url / "routes" / shard / "c" / ".0.tmp").write_bytes(b"partial")  # a torn temp file of that shard
    result = CliRunner().invoke(main, ["gc", str(url), "--older-than", "0s", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    jsonschema.validate(doc, load_schema("cli-gc"))
    assert [item["commit"] for item in doc["leftovers"]] == [shard]
    assert not doc["deleted"]
    assert any(k.endswith(".0.tmp") for k in doc["leftovers"][0]["keys"])


def test_show_defaults_to_eight_layers_and_rejects_empty_rows(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=12, num_experts=16, top_k=2)
    with r3store.RouteWriter(tmp_path, spec) as w:
        w.append("s", np.tile(np.array([1, 2]), (3, 12, 1)))
    result = CliRunner().invoke(main, ["show", str(tmp_path), "s"], env={"COLUMNS": "200"})  # 8 fit
    assert result.exit_code == 0
    assert "L7" in result.output
    assert "L8" not in result.output
    assert "pick others with --layers" in result.output
    result = CliRunner().invoke(main, ["show", str(tmp_path), "s", "--rows", "10:5"])
    assert result.exit_code == 2
    assert "empty row range" in result.output


def test_help_imports_no_command_and_lists_their_help() -> None:
    """--help is fast: the command modules (audits, readers) are imported when a command runs."""
    import importlib
    import subprocess
    import sys

    from r3store.cli._main import COMMANDS

    code = ("import sys\nfrom r3store.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert not [m for m in sys.modules if m.startswith(('r3store.cli._inspect', 'r3store.audit', "
            "'r3store.cli._gc', 'rich.table'))], sorted(sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    for name, (module, short) in COMMANDS.items():
        assert name in out
        command = getattr(importlib.import_module(module), name)
        assert command.get_short_help_str(limit=1000) == short, name  # the help kept here matches the command's
