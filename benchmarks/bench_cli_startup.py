"""Start-up of the ``r3store`` command: ``--help`` against what it used to import.

Run from the repository root (r3store importable)::

    python benchmarks/bench_cli_startup.py            # median of 15 runs per row
    python benchmarks/bench_cli_startup.py --quick    # median of 5

Each row is a fresh ``python`` process (wall time, process start included), run one after
the other in this one run:

* ``python -c pass``: the interpreter alone (the floor);
* ``r3store --help``: the command group, which imports no command module (**after**);
* ``import r3store.reader, r3store.writer + --help`` (**before**): what ``r3store --help``
  loaded when ``import r3store`` imported the reader and the writer eagerly (numpy,
  pyarrow, zarr): the baseline of the ratio;
* ``r3store show --help``, ``r3store validate --help``: a command's own help, which
  imports that command's module (and so the reader).

Target: ``r3store --help`` at most 0.25x the eager baseline.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

HELP = "from r3store.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
ROWS = {
    "python -c pass": "pass",
    "r3store --help": HELP,
    "import r3store.reader, r3store.writer + --help (before)": "import r3store.reader, r3store.writer\n" + HELP,
    "r3store show --help": HELP.replace("['--help']", "['show', '--help']"),
    "r3store validate --help": HELP.replace("['--help']", "['validate', '--help']"),
}


def median_s(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 runs per row instead of 15")
    args = parser.parse_args()
    repeats = 5 if args.quick else 15
    results = {name: median_s(code, repeats) for name, code in ROWS.items()}
    width = max(map(len, results))
    for name, seconds in results.items():
        print(f"{name:<{width}}  {seconds * 1000:7.0f} ms")
    ratio = results["r3store --help"] / results["import r3store.reader, r3store.writer + --help (before)"]
    verdict = "met" if ratio <= 0.25 else "MISSED"
    print(f"r3store --help / eager baseline: {ratio:.2f}x (target <= 0.25x: {verdict})")


if __name__ == "__main__":
    main()
