"""CLI rough edges: leftovers of running writers, plot formats, the demo without torch,
``show --help``, tables at 80 columns, start-up imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from click.testing import Result

import r3store
from r3store._format import load_schema
from r3store.cli._main import COMMANDS
from tests.clirun import run_cli as run

SPEC = r3store.ModelSpec(num_layers=13, num_experts=128, top_k=8, moe_layers=range(1, 13))


def routes_of(rng: np.random.Generator, rows: int, layers: int = 12) -> np.ndarray:
    return np.argsort(rng.random((rows, layers, 128)), axis=-1)[..., :8].astype(np.int32)



@pytest.fixture
def store(tmp_path: Path) -> Path:
    rng = np.random.default_rng(16)
    path = tmp_path / "store"
    with r3store.RouteWriter(path, SPEC, on_invalid="quarantine") as w:
        for i in range(4):
            w.append(f"step-1/prompt-{i}/sample-{i}", routes_of(rng, 40 + 10 * i))
        bad = routes_of(rng, 12)
        bad[3, 2, :2] = 7
        w.append("bad", bad)
    return path


def leave_uncommitted(path: Path, age_s: float = 0.0) -> str:
    """Write a commit and delete its sample table: what a writer leaves while (or after) committing."""
    with r3store.RouteWriter(path, SPEC) as w:
        w.append(f"left-{age_s}", routes_of(np.random.default_rng(1), 5))
    (commit,) = w.commits
    next((path / "index").rglob(f"{commit}.parquet")).unlink()
    if age_s:
        then = time.time() - age_s
        for p in (path / "routes" / commit).rglob("*"):
            os.utime(p, (then, then))
    return commit


# -- gc and validate with leftovers of a running writer ------------------------------------------


def test_gc_says_how_many_younger_leftovers_it_kept(store: Path) -> None:
    leave_uncommitted(store)
    result = run("gc", str(store))
    assert result.exit_code == 0, result.output
    assert "no uncommitted leftovers older than 1h" in result.stdout
    assert "kept 1 younger leftover(s)" in result.stdout and "still be committing" in result.stdout
    old = leave_uncommitted(store, age_s=7200)
    doc = json.loads(run("gc", str(store), "--json").stdout)
    jsonschema.validate(doc, load_schema("cli-gc"))
    assert [item["commit"] for item in doc["leftovers"]] == [old] and doc["kept_younger"] == 1
    deleted = run("gc", str(store), "--delete")
    assert old in deleted.stdout and "kept 1 younger" in deleted.stdout
    assert not [p for p in (store / "routes" / old).rglob("*") if p.is_file()]


def test_validate_exits_0_for_a_running_writers_young_leftover(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with r3store.RouteWriter(path, SPEC) as w:
        w.append("ok", routes_of(np.random.default_rng(2), 9))
    leave_uncommitted(path)
    result = run("validate", str(path))
    assert result.exit_code == 0, result.output
    assert "uncommitted" in result.stdout and "still committing" in result.stdout
    assert run("validate", str(path), "--json").exit_code == 0
    assert run("validate", str(path), "--grace", "0s").exit_code == 1
    leave_uncommitted(path, age_s=7200)  # a crashed writer's: a finding
    assert run("validate", str(path)).exit_code == 1
    assert run("validate", str(path), "--grace", "soon").exit_code == 2


# -- --plot formats ----------------------------------------------------------------------------


@pytest.mark.parametrize(("suffix", "magic"), [(".jpg", b"\xff\xd8\xff"), (".JPEG", b"\xff\xd8\xff"),
                                               (".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_format_follows_the_suffix(store: Path, tmp_path: Path, suffix: str, magic: bytes) -> None:
    out = tmp_path / f"load{suffix}"
    assert run("stats", str(store), "--plot", str(out)).exit_code == 0
    assert out.read_bytes().startswith(magic)
    flips = tmp_path / f"flips{suffix}"
    assert run("diff", str(store), str(store), "--plot", str(flips)).exit_code == 0
    assert flips.read_bytes().startswith(magic)


def test_unknown_plot_suffix_is_a_usage_error_before_the_scan(store: Path, tmp_path: Path) -> None:
    for name in ("load.gif", "load"):
        result = run("stats", str(store), "--plot", str(tmp_path / name))
        assert result.exit_code == 2 and "image format" in result.output and ".jpg" in result.output
        assert not (tmp_path / name).exists()


# -- demo without torch, show --help --------------------------------------------------------------


def test_demo_without_torch_prints_an_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails as if torch were not installed
    result = run("demo", str(tmp_path / "demo"))
    assert result.exit_code == 2
    assert "pip install 'r3store[torch]'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "demo").exists()  # nothing was written


def test_show_help_tells_which_layers_the_table_shows() -> None:
    text = " ".join(run("show", "--help").stdout.split())
    assert "as many of the first MoE layers as fit the terminal, up to 8, in the table" in text and "every MoE layer with --json" in text


# -- tables at 80 columns -------------------------------------------------------------------------


def body_rows(text: str) -> list[list[str]]:
    """The body lines of the rich tables in ``text``, split into cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def check_80(result: Result) -> str:
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout  # nothing cut
    return result.stdout


def test_stats_at_80_columns_keeps_headers_and_numbers_whole(store: Path) -> None:
    out = check_80(run("stats", str(store), columns=80))
    for word in ("layer", "mean", "load", "max/mean", "entropy", "(bits)", "unused", "experts", "hottest",
                 "expert"):
        assert re.search(rf"[┃ ]{re.escape(word)}[┃ ]", out), word
    doc = json.loads(run("stats", str(store), "--json").stdout)
    rows = [r for r in body_rows(out) if len(r) == 8]
    for lay, row in zip(doc["layers"], rows, strict=False):
        assert row[:5] == [str(lay["layer"]), f"{lay['mean_load']:,.1f}", f"{lay['max_load']:,}",
                           f"{lay['max_over_mean']:.2f}", f"{lay['entropy_bits']:.3f}"]


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


def test_validate_inspect_diff_at_80_columns(store: Path) -> None:
    leave_uncommitted(store, age_s=7200)
    out = check_80(run("validate", str(store), columns=80))
    flat = " ".join(out.split())
    commits = r3store.open_store(store).commits
    for commit in commits:
        assert commit in out  # commit names are never split
    assert "repeated_ids: sample 'bad', decoder layer 3, rows 3" in flat
    check_80(run("inspect", str(store), columns=80))
    check_80(run("diff", str(store), str(store), columns=80))


# -- start-up ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)])  # every command, compact included
def test_help_imports_neither_numpy_pyarrow_zarr_nor_torch(command: list[str]) -> None:
    code = (f"import sys\nfrom r3store.cli import main\ntry:\n    main({[*command, '--help']!r})\nexcept SystemExit:\n"
            "    pass\n"
            "print(sorted(m for m in ('numpy', 'pyarrow', 'zarr', 'torch', 'r3store.reader', 'r3store.writer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_lazy_top_level_names_are_the_real_objects() -> None:
    from r3store.reader import RouteReader
    from r3store.writer import RouteWriter

    names: dict[str, Any] = {name: getattr(r3store, name) for name in r3store.__all__}
    assert names["RouteReader"] is RouteReader and names["RouteWriter"] is RouteWriter
    assert RouteWriter.__module__ == "r3store"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        r3store.nope  # noqa: B018
