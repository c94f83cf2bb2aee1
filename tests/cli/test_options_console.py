"""The consoles of every command (``make_console``): ``NO_COLOR`` turns off every style as
``--no-color`` does, output that is no terminal is not wrapped at 80 columns, and ``show``
keeps room for its text markers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

import r3store
from r3store.cli import main
from r3store.cli._options import PIPE_WIDTH
from tests.clirun import SPEC_13X128, leave_uncommitted, routes_of_128
from tests.clirun import run_cli as run


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "s"
    with r3store.RouteWriter(path, SPEC_13X128) as w:
        w.append("ok", routes_of_128(np.random.default_rng(2), 9))
    leave_uncommitted(path, age_s=7200)
    return path


def test_no_color_on_a_terminal_prints_no_style(tmp_path: Path) -> None:
    path = _store(tmp_path)
    env = {"FORCE_COLOR": "1", "COLUMNS": "240"}  # rich takes the output for a terminal
    styled_out = CliRunner().invoke(main, ["validate", str(path)], env=env)
    assert "\x1b[1m" in styled_out.stdout  # the check can fail
    plain = CliRunner().invoke(main, ["validate", str(path)], env={**env, "NO_COLOR": "1"})
    assert plain.exit_code == 1
    assert "\x1b[" not in plain.stdout
    no_color = CliRunner().invoke(main, ["--no-color", "validate", str(path)], env=env)
    assert plain.stdout == no_color.stdout


def test_piped_output_keeps_each_finding_on_one_line(tmp_path: Path) -> None:
    path = _store(tmp_path)
    result = CliRunner().invoke(main, ["validate", str(path)], env={"COLUMNS": None})  # no terminal, no COLUMNS
    assert result.exit_code == 1
    (line,) = [line for line in result.stdout.splitlines() if "uncommitted" in line and "│" in line]
    assert "bytes, no sample table" in line
    assert line.rstrip().endswith("│")  # the whole detail on this line
    assert "gc --delete" in line
    assert PIPE_WIDTH > 1000


def test_show_keeps_a_marked_cell_on_one_line_at_80_columns(tmp_path: Path) -> None:
    spec = r3store.ModelSpec(num_layers=5, num_experts=32, top_k=4)
    routes = np.tile(np.array([12, 14, 22, 28], np.int32), (4, 5, 1))
    routes[1, 2] = [30, 30, 29, 11]
    with r3store.RouteWriter(tmp_path / "s", spec, {"on_invalid": "quarantine"}) as w:
        w.append("bad", routes)
    result = run("--no-color", "show", str(tmp_path / "s"), "bad", "--rows", "0:4", columns=80)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == 4  # one line per row: no cell wrapped
    assert "30,30,29,11 *" in rows[1]
