"""``r3store stats`` (``r3store/cli/_stats.py``): plots, tables at 80 columns, policy ranges."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from tests.clirun import (
    SPEC_3X16,
    body_rows,
    check_80,
    checked_json,
    routes_of_16,
)
from tests.clirun import invoke as _cli
from tests.clirun import run_cli as run


def test_stats_plot_into_missing_folder(small_store_dir: Path) -> None:
    result = _cli("stats", str(small_store_dir), "--plot", "/nonexistent/dir/x.png")
    assert result.exit_code == 2
    assert "does not exist" in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, FileNotFoundError)


def test_plot_write_failure_is_a_usage_error(tmp_path: Path) -> None:
    import click

    from r3store.cli._scan import save_plot

    def draw(result: dict[str, Any], path: str, size: tuple[int, int]) -> None:
        raise PermissionError(13, "Permission denied", path)

    with pytest.raises(click.BadParameter, match=r"cannot write .*Permission denied"):
        save_plot(draw, {}, str(tmp_path / "x.png"), (100, 100))


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
        assert result.exit_code == 2
        assert "image format" in result.output
        assert ".jpg" in result.output
        assert not (tmp_path / name).exists()


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


def test_stats_policy_range_uses_every_version_of_a_sample(tmp_path: Path) -> None:
    """A sample whose rows came from versions 41 and 42 spans 41..42 (not 42..42), and is "1 sample"."""
    routes = routes_of_16(np.random.default_rng(1), 10)
    with r3store.RouteWriter(tmp_path / "s", SPEC_3X16) as w:
        w.append("s", routes[:6], final=False, policy_version=41)
        w.append("s", routes[6:], start=6, policy_version=42)
    result = run("stats", str(tmp_path / "s"))
    assert result.exit_code == 0, result.output
    assert "policy versions 41..42 on 1 sample; 1 sample mixes versions" in result.stdout
    doc = checked_json(run("stats", str(tmp_path / "s"), "--json"), "stats")
    assert doc["policy"] == {"samples_with_version": 1, "mixed_version_samples": 1, "min_version": 41,
                             "max_version": 42}


def test_stats_filter_selecting_no_sample_is_an_error(tmp_path: Path) -> None:
    """New-user finding: ``--sample-filter nomatch*`` printed statistics of nothing and exited 0."""
    from tests.clirun import run_cli
    from tests.routes import make_store

    make_store(tmp_path / "s", n=2)
    result = run_cli("stats", str(tmp_path / "s"), "--sample-filter", "nomatch*")
    assert result.exit_code == 2, result.output
    assert "--sample-filter 'nomatch*' matched no visible sample id" in result.stderr
    assert "(the store holds 2 visible samples)" in result.stderr
    assert run_cli("stats", str(tmp_path / "s"), "--limit", "0", "--json").exit_code == 2
    assert run_cli("stats", str(tmp_path / "s"), "--sample-filter", "s*").exit_code == 0


def test_stats_warns_of_duplicate_ids(tmp_path: Path) -> None:
    from tests.clirun import run_cli
    from tests.routes import make_store

    make_store(tmp_path / "s", n=2)
    make_store(tmp_path / "s", n=2)
    result = run_cli("stats", str(tmp_path / "s"), "--json")
    assert result.exit_code == 0
    assert "2 sample ids are committed more than once" in result.stderr
    assert "'s0' (commits " in result.stderr
    assert "'s1' (commits " in result.stderr
    assert json.loads(result.stdout)["samples"] == 2


def test_stats_plot_counts_samples_in_whole_numbers(small_store_dir: Path, tmp_path: Path) -> None:
    """New-user finding: the length histogram's y axis had ticks at 1.25 and 1.75 samples."""
    pytest.importorskip("matplotlib")
    from r3store.audit import stats
    from r3store.cli._stats import plot_stats

    result = stats(r3store.open_store(small_store_dir))
    fig = plot_stats(result, str(tmp_path / "s.svg"), (800, 400))
    ticks = fig.axes[1].get_yticks()
    assert len(ticks) >= 2
    assert all(float(t).is_integer() for t in ticks), ticks
