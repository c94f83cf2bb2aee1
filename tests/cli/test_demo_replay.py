"""``r3store demo`` ends with the replay loop on a tiny Qwen3-MoE."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import r3store
from r3store.audit import diff
from r3store.cli import main
from r3store.cli._demo_replay import HINT, replay_demo_cli


def test_demo_ends_with_replay(tmp_path: Path) -> None:
    target = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", str(target), "--writers", "2", "--loader-workers", "0"])
    assert result.exit_code == 0, result.output
    tail = result.output[result.output.index("every route bit-identical"):]
    assert "rollout: tiny Qwen3-MoE in bfloat16" in tail
    assert "RouteDataset streamed" in tail
    rows = {line.split("│")[1].strip(): line for line in tail.splitlines() if line.startswith("│")}
    assert "0.00% (0/" in rows["with replay"]
    assert "0.00% (0/" not in rows["without replay"]
    assert "router gradients under replay: finite and non-zero in all 4 MoE layers" in tail

    stores = {name: r3store.open_store(target / "replay-demo" / name)
              for name in ("engine", "trainer-live", "trainer-replay")}
    assert len(stores["engine"]) == 8
    assert stores["engine"].spec.num_experts == 128
    replayed, live = diff(stores["engine"], stores["trainer-replay"]), diff(stores["engine"], stores["trainer-live"])
    assert replayed["differing_decisions"] == 0
    assert live["differing_decisions"] > 0
    for sid in stores["engine"].sample_ids:  # the replayed routes are the rollout's, in order
        np.testing.assert_array_equal(stores["trainer-replay"].get(sid), stores["engine"].get(sid))
    assert f"{live['decision_flip_rate']:.2%}" in rows["without replay"]
    gap_live, gap_replay = (float(rows[k].split("│")[4]) for k in ("without replay", "with replay"))
    assert gap_replay < gap_live


def test_demo_hint_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    out = io.StringIO()
    assert replay_demo_cli(None, Console(file=out, width=200)) is None
    assert out.getvalue() == HINT + "\n"
