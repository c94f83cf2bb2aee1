"""The audit commands of the CLI: validate, stats, diff, show (and inspect's JSON schema).

Run through click's CliRunner on real stores; every ``--json`` output is validated
against its schema in ``schema/``; ``--plot`` files are checked to be PNGs of the
requested size; one test runs ``inspect`` and ``validate`` on s3:// (moto on loopback).
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.testing.s3 import ACCESS_KEY, REGION, SECRET_KEY, s3_bucket, s3_server, s3_storage_options, s3_url  # noqa: F401 - pytest fixtures
from tests.clirun import checked_json
from tests.clirun import run_cli as run

SPEC = r3store.ModelSpec(num_layers=5, num_experts=64, top_k=2, moe_layers=[1, 2, 3, 4])


def routes_of(rng: np.random.Generator, rows: int, num_layers: int = 4, num_experts: int = 64,
              top_k: int = 2) -> np.ndarray:
    return np.argsort(rng.random((rows, num_layers, num_experts)), axis=-1)[..., :top_k].astype(np.int64)




def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "clean"
    with r3store.RouteWriter(path, SPEC) as w:
        for i in range(6):
            w.append(f"step1-{i}", routes_of(rng, 20 + 5 * i), metadata={"step": 1})
    return path


@pytest.fixture
def faulty(tmp_path: Path) -> Path:
    """A store with a repeated-id sample, an off-by-one sample and a corrupted frame."""
    rng = np.random.default_rng(1)
    path = tmp_path / "faulty"
    rep = routes_of(rng, 16)
    rep[2:5, 1] = [9, 9]
    with r3store.RouteWriter(path, SPEC,
                             config={"on_invalid": "quarantine", "chunk_rows": 8, "layers_per_chunk": 1}) as w:
        w.append("good", routes_of(rng, 16))
        w.append("rep", rep)
        w.append("fork", routes_of(rng, 8), num_tokens=8)
    (shard,) = w.commits
    obj = path / "routes" / shard / "c" / "0" / "0" / "0"
    data = bytearray(obj.read_bytes())
    data[25] ^= 0x01  # a payload byte of frame (0, 0): rows 0-7 of decoder layer 1
    obj.write_bytes(bytes(data))
    return path


# -- validate -----------------------------------------------------------------------------


def test_validate_clean_exits_0(clean: Path) -> None:
    result = run("validate", str(clean))
    assert result.exit_code == 0, result.output
    assert "clean" in result.stdout
    assert "6 samples" in result.stdout
    doc = checked_json(run("validate", str(clean), "--json"), "validate")
    assert doc["ok"] is True
    assert doc["findings"] == []
    assert doc["summary"]["samples_checked"] == 6


def test_validate_findings_exit_1(faulty: Path) -> None:
    result = run("validate", str(faulty))
    assert result.exit_code == 1
    for words in ("checksum", "chunk (0, 0, 0)", "repeated_ids", "rep", "row_count", "fork", "quarantined", "2-4"):
        assert words in result.stdout, words
    as_json = run("validate", str(faulty), "--json")
    assert as_json.exit_code == 1
    doc = checked_json(as_json, "validate")
    by_kind = {f["kind"]: f for f in doc["findings"]}
    assert by_kind["checksum"]["chunk"] == [0, 0, 0]
    assert by_kind["checksum"]["layer"] == 1
    assert by_kind["checksum"]["array"].startswith("routes/")
    assert by_kind["checksum"]["rows"] == [[0, 7]]
    repeated = by_kind["repeated_ids"]
    assert (repeated["sample_id"], repeated["layer"], repeated["rows_text"]) == ("rep", 2, "2-4")
    assert by_kind["row_count"]["sample_id"] == "fork"
    assert doc["summary"]["by_kind"] == {"checksum": 1, "repeated_ids": 1, "row_count": 1, "quarantined": 2}


def test_validate_subset_and_errors(faulty: Path, tmp_path: Path) -> None:
    doc = checked_json(run("validate", str(faulty), "--json", "--sample-filter", "fork"), "validate")
    assert doc["sample_filter"] == "fork"
    assert doc["summary"]["samples_checked"] == 1
    assert {f["kind"] for f in doc["findings"]} == {"row_count", "quarantined"}
    nothing = run("validate", str(faulty), "--json", "--limit", "0")  # selects nothing: no clean result
    assert nothing.exit_code == 2
    assert "--limit 0 selects no sample" in nothing.stderr
    (tmp_path / "plain").mkdir()
    missing = run("validate", str(tmp_path / "plain"))
    assert missing.exit_code == 2
    assert "NotAStoreError" in missing.output
    assert run("validate", str(faulty), "--limit", "-1").exit_code == 2
    assert run("validate", str(faulty), "--workers", "2", "--json").exit_code == 1


# -- stats ----------------------------------------------------------------------------------


def test_stats_table_json_and_plot(clean: Path, tmp_path: Path) -> None:
    result = run("stats", str(clean), "--top", "3")
    assert result.exit_code == 0, result.output
    for words in ("max/mean", "entropy", "unused", "hottest experts", "sequence length"):
        assert words in result.stdout
    doc = checked_json(run("stats", str(clean), "--json"), "stats")
    assert doc["samples"] == 6
    assert len(doc["layers"]) == 4
    assert len(doc["hottest"]) == 10
    assert all(sum(row) == doc["rows"] * 2 for row in doc["load"])
    assert doc["lengths"]["min"] == 21
    assert doc["lengths"]["max"] == 46
    png = tmp_path / "stats.png"
    plotted = run("stats", str(clean), "--plot", str(png), "--plot-size", "640x480")
    assert plotted.exit_code == 0
    assert png_size(png) == (640, 480)
    default = tmp_path / "default.png"
    assert run("stats", str(clean), "--json", "--plot", str(default)).exit_code == 0
    assert png_size(default) == (1200, 800)
    assert run("stats", str(clean), "--plot", str(png), "--plot-size", "big").exit_code == 2


def test_plot_without_matplotlib_gives_install_hint(clean: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    result = run("stats", str(clean), "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    assert "pip install 'r3store[plot]'" in result.output
    assert run("stats", str(clean)).exit_code == 0  # matplotlib is only needed for --plot


def test_matplotlib_is_imported_only_for_plots(clean: Path) -> None:
    code = ("import sys; from click.testing import CliRunner; from r3store.cli import main; "
            f"r = CliRunner().invoke(main, ['stats', {str(clean)!r}]); assert r.exit_code == 0, r.output; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- diff -------------------------------------------------------------------------------------


def test_diff_json_table_and_plot(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    a = {f"s{i}": routes_of(rng, 10) for i in range(3)}
    b = {sid: r.copy() for sid, r in a.items()}
    for t in range(5):  # rows 0-4 of decoder layer 4: one of the two experts replaced
        row = b["s1"][t, 3]
        row[0] = min(set(range(64)) - set(row.tolist()))
    for name, samples in (("a", {**a, "extra": routes_of(rng, 4)}), ("b", b)):
        with r3store.RouteWriter(tmp_path / name, SPEC) as w:
            for sid, routes in samples.items():
                w.append(sid, routes)
    doc = checked_json(run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json"), "diff")
    assert doc["samples_compared"] == 3
    assert doc["only_in_a"] == 1
    assert doc["only_in_a_examples"] == ["extra"]
    assert doc["differing_decisions"] == 5
    assert doc["decisions"] == 30 * 4
    assert doc["tokens_with_diff"] == 5
    assert doc["decision_flip_rate"] == pytest.approx(5 / 120)
    assert doc["set_overlap"] == pytest.approx(1 - 5 / 240)
    assert [p["differing"] for p in doc["per_layer"]] == [0, 0, 0, 5]
    result = run("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.exit_code == 0
    for words in ("decisions whose expert sets differ", "tokens with >= 1 differing layer", "set overlap",
                  "flip rate per MoE layer", "only in A: 1"):
        assert words in result.stdout
    png = tmp_path / "diff.png"
    assert run("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(png)).exit_code == 0
    assert png_size(png) == (1200, 800)


def test_diff_spec_mismatch_exits_2(clean: Path, tmp_path: Path) -> None:
    other = r3store.ModelSpec(num_layers=5, num_experts=32, top_k=2, moe_layers=[1, 2, 3, 4])
    with r3store.RouteWriter(tmp_path / "other", other) as w:
        w.append("step1-0", routes_of(np.random.default_rng(3), 20, num_experts=32))
    result = run("diff", str(clean), str(tmp_path / "other"))
    assert result.exit_code == 2
    assert "SpecMismatchError" in result.output


# -- show --------------------------------------------------------------------------------------


def test_show_table_and_json(faulty: Path) -> None:
    result = run("show", str(faulty), "rep", "--layers", "2,3-4", "--rows", "1:4")
    assert result.exit_code == 0, result.output
    assert "quarantined" in result.stdout
    assert "9,9" in result.stdout
    assert "L3" in result.stdout
    doc = checked_json(run("show", str(faulty), "rep", "--layers", "2", "--rows", "2:4", "--json"), "show")
    assert doc["routes"] == [[[9, 9]], [[9, 9]]]
    assert doc["repeated"] == [[2, 2], [3, 2]]
    full = checked_json(run("show", str(faulty), "good", "--layers", "2-4", "--json"), "show")
    assert np.array(full["routes"]).shape == (16, 3, 2)


@pytest.mark.parametrize(("args", "words"), [
    (["good", "--layers", "2,x"], "--layers"),
    (["good", "--rows", "a:b"], "--rows"),
    (["good", "--layers", "0"], "LayerError"),
    (["nope"], "SampleNotFoundError"),
    (["good", "--layers", "1"], "ChecksumError"),  # the corrupted frame
])
def test_show_bad_arguments_exit_2(faulty: Path, args: list[str], words: str) -> None:
    result = run("show", str(faulty), *args)
    assert result.exit_code == 2
    assert words in result.output


# -- inspect schema, S3 ------------------------------------------------------------------------


def test_inspect_json_matches_schema(clean: Path) -> None:
    doc = checked_json(run("inspect", str(clean), "--json"), "inspect")
    assert doc["samples"] == 6


@pytest.mark.s3
def test_inspect_and_validate_on_s3(s3_url: str, s3_storage_options: dict[str, Any]) -> None:  # noqa: F811
    rng = np.random.default_rng(4)
    rep = routes_of(rng, 12)
    rep[7, 0] = [3, 3]
    for w_i in range(2):
        with r3store.RouteWriter(s3_url, SPEC, storage_options=s3_storage_options,
                                 config={"on_invalid": "quarantine"}) as w:
            w.append(f"w{w_i}-ok", routes_of(rng, 12))
            w.append(f"w{w_i}-rep", rep)
    endpoint = s3_storage_options["client_kwargs"]["endpoint_url"]
    opts = ["-o", f"key={ACCESS_KEY}", "-o", f"secret={SECRET_KEY}", "-o", f"endpoint_url={endpoint}",
            "-o", f"region_name={REGION}"]
    inspected = checked_json(run("inspect", s3_url, "--json", *opts), "inspect")
    assert inspected["samples"] == 2
    assert inspected["quarantined"] == 2
    assert inspected["commits"] == 2
    result = run("validate", s3_url, "--json", "--strict", *opts)  # quarantined samples alone fail only --strict
    assert result.exit_code == 1
    doc = checked_json(result, "validate")
    repeated = sorted((f["sample_id"], f["layer"], f["rows_text"])
                      for f in doc["findings"] if f["kind"] == "repeated_ids")
    assert repeated == [("w0-rep", 1, "7"), ("w1-rep", 1, "7")]
    assert doc["summary"]["arrays_checked"] == 2
    assert SECRET_KEY not in result.output
    human = run("validate", s3_url, *opts)
    assert human.exit_code == 0
    assert "repeated_ids" in human.stdout


# -- compact schema -----------------------------------------------------------------------------


def test_compact_json_matches_schema(clean: Path, tmp_path: Path) -> None:
    first = run("compact", str(clean), "--json")
    assert first.exit_code == 0, first.output
    doc = checked_json(first, "compact")
    assert doc["written"] is True
    assert doc["commits"] == 1
    assert doc["samples"] == 6
    assert doc["nbytes"] > 0
    again = checked_json(run("compact", str(clean), "--json"), "compact")
    assert again["written"] is False
    assert again["key"] == doc["key"]
    assert again["nbytes"] == 0
    with r3store.RouteWriter(tmp_path / "empty", SPEC):
        pass
    empty = checked_json(run("compact", str(tmp_path / "empty"), "--json"), "compact")
    assert empty["key"] is None
    assert empty["watermark"] is None
    assert empty["commits"] == 0
