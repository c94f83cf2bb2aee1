"""Issue 22 item 7: ``r3store show`` at 80 columns shows as many layers as fit.

It showed the first 8 MoE layers whatever the width, so at 80 columns each top-8 id list
of 128 experts wrapped over 6-7 lines. Now it picks as many layers as fit with each cell
on one line (at least one, at most 8).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import r3store
from tests.clirun import run_cli

SPEC = r3store.ModelSpec(num_layers=48, num_experts=128, top_k=8)


def _store(root: Path) -> Path:
    rng = np.random.default_rng(0)
    routes = np.stack([np.stack([rng.permutation(128)[:8] for _ in range(48)]) for _ in range(12)])
    with r3store.RouteWriter(root, SPEC) as w:
        w.append("s", routes.astype(np.int32))
    return root


def _body_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("│")]


def test_show_at_80_columns_fits_each_cell_on_one_line(tmp_path: Path) -> None:
    result = run_cli("show", str(_store(tmp_path)), "s", columns=80)
    assert result.exit_code == 0, result.output
    assert "showing MoE layers 0..1 of 48" in result.stdout
    assert len(_body_lines(result.stdout)) == 12  # one line per row: no cell wraps
    assert all(len(line) <= 80 for line in result.stdout.splitlines())


def test_show_on_a_wide_terminal_keeps_eight_layers(tmp_path: Path) -> None:
    result = run_cli("show", str(_store(tmp_path)), "s", columns=300)
    assert "showing MoE layers 0..7 of 48" in result.stdout
    assert len(_body_lines(result.stdout)) == 12
