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
    (["--rows", "99999999999999999999999:"], "starts past the end of the sample"),
    (["--rows", "10"], "reaches past the end of the sample (stop 11 > 10); sample 's0' has 10 rows (0 to 9)"),
    (["--rows", "0:11"], "reaches past the end of the sample (stop 11 > 10); sample 's0' has 10 rows (0 to 9)"),
    (["--rows", "10:"], "selects no row; sample 's0' has 10 rows (0 to 9)"),
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


@pytest.fixture
def unstored(tmp_path: Path) -> Path:
    """A store with a quarantined sample whose routes could not be stored (wrong top_k: none kept)."""
    import numpy as np

    import r3store

    spec = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])
    path = tmp_path / "s"
    with r3store.RouteWriter(path, spec, config={"on_invalid": "quarantine"}) as w:
        w.append("ok", np.tile(np.array([0, 1], np.int32), (5, 2, 1)))
        w.append("wide", np.tile(np.array([0, 1, 2], np.int32), (5, 2, 1)), num_tokens=6)
    return path


def test_show_of_a_quarantined_sample_with_no_stored_routes_says_so(unstored: Path) -> None:
    """No Python call as a remedy (new-user finding): one line with the sample, its reason, and
    that there are no routes to show (exit 2, as for a sample that is not there)."""
    for extra in ([], ["--json"]):
        result = run("show", str(unstored), "wide", *extra)
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        (line,) = result.stderr.strip().splitlines()
        assert line == (f"error: SampleNotFoundError: sample 'wide' in {unstored} is quarantined (routes: top_k "
                        "mismatch: last dim is 3, spec.top_k is 2 (routes not storable; none kept)); its routes could "
                        "not be stored (none were kept), so there are no routes to show")
    assert run("show", str(unstored), "ok").exit_code == 0


def test_show_prints_a_long_quarantine_reason_at_the_console_width(store: Path) -> None:
    """The title sits above the table: a long reason is not folded to a narrow table's width."""
    out = run("show", str(store), "bad", "--layers", "1", columns=100).stdout
    title = out[: out.index("┏")].splitlines()
    assert max(len(line) for line in title) > 60  # wrapped at 100 columns, not at the 2-column table's ~40


def test_show_of_a_duplicated_id_warns_and_names_the_copy_shown(tmp_path: Path) -> None:
    """New-user finding: show used one copy of a duplicated id silently (open_store refuses the store)."""
    import pyarrow.compute as pc

    import r3store
    from tests.routes import make_store

    make_store(tmp_path / "s", n=2)
    make_store(tmp_path / "s", n=1, seed=9)
    store = r3store.open_store(tmp_path / "s", reader={"on_duplicate": "first"})
    commits = store.duplicates["s0"]
    read = store.samples.filter(pc.field("sample_id") == "s0").column("commit")[0].as_py()
    assert read == commits[0]  # the earliest commit's copy
    result = run("show", str(tmp_path / "s"), "s0", "--json")
    assert result.exit_code == 0
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"warning: sample 's0' of {tmp_path / 's'} is committed by commits {commits[0]}, "
                           f"{commits[1]}; showing the copy of {read}")
    assert json.loads(result.stdout)["sample_id"] == "s0"
    assert run("show", str(tmp_path / "s"), "s1").stderr == ""  # not duplicated: no warning


def test_show_prints_a_head_of_a_long_sample_and_says_how_to_see_all(tmp_path: Path) -> None:
    """New-user finding: a 32K-token sample printed 32K lines; now the first DEFAULT_ROWS and a hint."""
    from r3store.cli._show import DEFAULT_ROWS
    from tests.routes import make_store

    make_store(tmp_path / "s", n=1, rows=120)
    result = run("show", str(tmp_path / "s"), "s0")
    assert result.exit_code == 0
    assert len(body_rows(result.stdout)) == DEFAULT_ROWS
    assert f"showing rows 0-{DEFAULT_ROWS - 1} of 120: --rows a:b shows others, --rows 0: all" in result.stdout
    assert len(body_rows(run("show", str(tmp_path / "s"), "s0", "--rows", "0:").stdout)) == 120
    assert len(json.loads(run("show", str(tmp_path / "s"), "s0", "--json").stdout)["routes"]) == 120
    short = run("show", str(tmp_path / "s"), "s0", "--rows", "0:3")
    assert "showing rows" not in short.stdout
