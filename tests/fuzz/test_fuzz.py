"""Short fuzz runs of every target, the seed corpus and the regression inputs, and the
supervisor's own detection of deaths, hangs and oracle failures (see README.md here).

The long campaign is ``python -m tests.fuzz --target X --seconds 600``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import engine  # noqa: E402

TARGETS = ["codec", "ingest", "manifest", "zarr_json", "shard_index", "sample_table", "checkpoint"]
SECONDS = 3.0
MIN_RUNS = 40  # inputs per short run whatever the machine's load (start-up is not counted)


@pytest.mark.parametrize("target", TARGETS)
def test_short_fuzz_run_finds_nothing(target: str, tmp_path: Path) -> None:
    report = engine.fuzz(target, SECONDS, seed=1, out_dir=tmp_path, engine="builtin", min_runs=MIN_RUNS)
    assert report.failures == [], report.as_dict()
    assert report.executions >= MIN_RUNS, report.as_dict()
    assert report.refused > 0  # the mutations reach r3store's checks (not only the unmutated seeds)


@pytest.mark.parametrize("target", TARGETS)
def test_corpus_and_regression_inputs_are_refused_or_read_back(target: str, tmp_path: Path) -> None:
    paths = [p for p in (engine.CORPUS / target, engine.REGRESSIONS / target) if p.is_dir()]
    files = sum(1 for p in paths for f in p.iterdir() if f.is_file() and f.suffix != ".txt")
    report = engine.replay(target, [str(p) for p in paths], out_dir=tmp_path)
    assert report.failures == [], report.as_dict()
    assert report.executions == files


def test_every_target_has_regression_inputs() -> None:
    assert all(any((engine.REGRESSIONS / t).glob("*.bin")) for t in TARGETS)


@pytest.mark.parametrize(("data", "kind", "words"), [
    (b"A", "crash", "worker exited with -6"),
    (b"H", "hang", "no answer within 2 s"),
    (b"S", "hang", "no answer within 2 s of its CPU time"),
    (b"W", "oracle", "routes differ from the source"),
    (b"X", "oracle", "IndexError outside r3store.errors"),
])
def test_supervisor_saves_the_input_of_a_death_a_hang_and_an_oracle_failure(
        tmp_path: Path, data: bytes, kind: str, words: str) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "input").write_bytes(data)
    report = engine.replay("_selftest", [str(tmp_path / "in")], out_dir=tmp_path / "out", timeout=2)
    (failure,) = report.failures
    assert failure["kind"] == kind
    assert words in failure["note"]
    assert Path(failure["input"]).read_bytes() == data


def test_a_worker_starved_of_cpu_is_not_a_hang() -> None:
    """New-user finding: on a machine at load 38 a short run reported a hang (20 s of wall
    time without an answer). The wait counts the worker's CPU time: a worker given 1 s of
    wall time at about a tenth of a core answers after the 1 s span and is waited for."""
    import subprocess

    child = ("import time, sys\nend = time.monotonic() + 2.5\n"
             "while time.monotonic() < end:\n t = time.monotonic() + 0.01\n while time.monotonic() < t: pass\n"
             " time.sleep(0.09)\nsys.stdout.buffer.write(b'done'); sys.stdout.flush()\n")
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        import time

        assert engine._read_exact(proc.stdout, 4, time.monotonic() + 1.0, proc.pid) == b"done"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE)
    assert asleep.stdout is not None
    try:
        import time

        start = time.monotonic()
        assert engine._read_exact(asleep.stdout, 4, start + 1.0, asleep.pid) is None  # asleep: hung
        assert time.monotonic() - start < 9.0  # by the second deadline, not the 10 s cap
    finally:
        asleep.kill()
        asleep.wait()
        asleep.stdout.close()
