"""``r3store show`` without colours: the faulty cells carry text markers, the legend explains them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import r3store
from tests.clirun import run_cli

SPEC = r3store.ModelSpec(num_layers=3, num_experts=12, top_k=2)
LEGEND = "!: a cell holding an id >= num_experts (12); *: a cell holding an id twice"


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    """A quarantined sample: row 1 repeats id 5 in decoder layer 0, row 2 holds id 13 (>= 12) in layer 1."""
    rng = np.random.default_rng(0)
    routes = np.argsort(rng.random((6, 3, 12)), axis=-1)[..., :2].astype(np.int32)
    routes[1, 0] = [5, 5]
    routes[2, 1] = [3, 13]
    with r3store.RouteWriter(tmp_path / "s", SPEC, {"on_invalid": "quarantine"}) as w:
        w.append("bad", routes)
    return tmp_path / "s"


def _cell(stdout: str, row: int, column: int) -> str:
    line = next(line for line in stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip() == str(row))
    return line.split("│")[column + 2].strip()


@pytest.mark.parametrize("how", [[], ["--no-color"], ["--no-color", "FORCE"], ["NO_COLOR"]])
def test_without_colour_faulty_cells_are_marked(bad: Path, how: list[str]) -> None:
    env = {"COLUMNS": "120", "FORCE_COLOR": "1" if "FORCE" in how else None,
           "NO_COLOR": "1" if "NO_COLOR" in how else None}
    flags = [h for h in how if h.startswith("--")]
    from click.testing import CliRunner

    from r3store.cli import main

    result = CliRunner().invoke(main, ["show", str(bad), "bad", *flags], env=env)  # not a terminal
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout
    assert _cell(result.stdout, 1, 0) == "5,5 *"
    assert _cell(result.stdout, 2, 1) == "3,13 !"
    assert _cell(result.stdout, 0, 0).isascii()
    assert "!" not in _cell(result.stdout, 0, 0)
    assert LEGEND in " ".join(result.stdout.split())
    assert "red" not in result.stdout


def test_with_colour_the_cells_are_coloured_and_unmarked(bad: Path) -> None:
    from click.testing import CliRunner

    from r3store.cli import main

    result = CliRunner().invoke(main, ["show", str(bad), "bad"], env={"COLUMNS": "120", "FORCE_COLOR": "1",
                                                                        "NO_COLOR": None})
    assert result.exit_code == 0, result.output
    assert "\x1b[31m" in result.stdout  # red
    assert "\x1b[33m" in result.stdout  # yellow
    assert "5,5 *" not in result.stdout
    assert "a cell holding an id >= num_experts (12)" in result.stdout


def test_group_flag_and_command_flag_agree(bad: Path) -> None:
    one = run_cli("--no-color", "show", str(bad), "bad")
    two = run_cli("show", str(bad), "bad", "--no-color")
    assert one.exit_code == two.exit_code == 0
    assert one.stdout == two.stdout


def test_show_through_a_pipe_marks_cells(bad: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "r3store.cli", "show", str(bad), "bad"], capture_output=True,
                         text=True, check=True, env={"PATH": "", "COLUMNS": "100", "PYTHONPATH": ""}).stdout
    assert "\x1b" not in out
    assert "5,5 *" in out
    assert LEGEND in " ".join(out.split())
