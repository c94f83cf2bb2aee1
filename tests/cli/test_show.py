"""``r3store show`` (``r3store/cli/_show.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

import r3store
from r3store.cli._main import main
from tests.clirun import run_cli as run

SPEC_4X16 = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scores = rng.random((rows, SPEC_4X16.num_moe_layers, SPEC_4X16.num_experts))
    return np.argsort(scores, axis=-1)[..., :SPEC_4X16.top_k].astype(np.int32)


def make_store(root: Path | str, n: int = 3, rows: int = 10, seed: int = 0, **kw: Any) -> dict[str, np.ndarray]:
    data = {f"s{i}": routes(rows, seed + i) for i in range(n)}
    with r3store.RouteWriter(str(root), SPEC_4X16, **kw) as w:
        for sid, r in data.items():
            w.append(sid, r, metadata={"step": 1})
    return data


@pytest.fixture
def small_store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    make_store(root)
    return root


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


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


def test_show_help_tells_which_layers_the_table_shows() -> None:
    text = " ".join(run("show", "--help").stdout.split())
    assert "first 8 MoE layers in the table" in text
    assert "every MoE layer with --json" in text


def body_rows(text: str) -> list[list[str]]:
    """The body lines of the rich tables in ``text``, split into cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def check_80(result: Result) -> str:
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout  # nothing cut
    return result.stdout


def test_show_at_80_columns_breaks_cells_between_ids_only(store: Path) -> None:
    out = check_80(run("show", str(store), "step-1/prompt-0/sample-0", "--rows", "0:5", columns=80))
    doc = json.loads(run("show", str(store), "step-1/prompt-0/sample-0", "--rows", "0:5", "--json").stdout)
    layers = doc["layers"][:8]
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
