"""``r3store show`` (``r3store/cli/_show.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clirun import body_rows, check_80
from tests.clirun import invoke as _cli
from tests.clirun import run_cli as run


@pytest.mark.parametrize(("args", "words"), [
    (["--layers", "0-2000000000"], "more than 100,000 layers"),
    (["--layers", "1,1"], "layer 1 is listed twice"),
    (["--rows", "-1"], "no negative numbers"),
    (["--rows", "-3:-1"], "no negative numbers"),
    (["--rows", "5:2"], "end must be greater"),
    (["--rows", "99999999999999999999999:"], "select none of the sample's 10 rows"),
    (["--rows", "10"], "select none"),
])
def test_show_usage_errors(small_store_dir: Path, args: list[str], words: str) -> None:
    result = _cli("show", str(small_store_dir), "s0", *args)
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split()), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_show_rows_still_work(small_store_dir: Path) -> None:
    result = _cli("show", str(small_store_dir), "s0", "--rows", "9:", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["row_start"] == 9


def test_show_help_tells_which_layers_the_table_shows() -> None:
    text = " ".join(run("show", "--help").stdout.split())
    assert "as many of the first MoE layers as fit the terminal, up to 8, in the table" in text
    assert "every MoE layer with --json" in text


def test_show_at_80_columns_breaks_cells_between_ids_only(store: Path) -> None:
    out = check_80(run("show", str(store), "step-1/prompt-0/sample-0", "--rows", "0:5", columns=80))
    doc = json.loads(run("show", str(store), "step-1/prompt-0/sample-0", "--rows", "0:5", "--json").stdout)
    layers = doc["layers"][: len(body_rows(out)[0]) - 1]  # as many as fit 80 columns
    cells: list[list[str]] = []
    for row in body_rows(out):
        if row[0]:
            cells.append(["" for _ in layers])
        for j, part in enumerate(row[1:]):
            assert not (cells[-1][j] and part) or cells[-1][j].endswith(","), (cells[-1][j], part)  # after commas only
            cells[-1][j] += part
    assert len(cells) == 5
    for t, row in enumerate(cells):
        for j, text in enumerate(row):
            assert text == ",".join(map(str, doc["routes"][t][j])), (t, layers[j])
