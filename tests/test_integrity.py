"""Issue 13, the format items: every byte of a store checked and bound to its place, every fault
a named r3store error, no input that kills the process.

Each test names the item it proves. Inputs that once aborted the interpreter (a C++
``std::terminate`` inside pyarrow) run in a subprocess, so an abort fails the test instead of
killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import r3store
from r3store.errors import FormatError

ROOT = Path(__file__).resolve().parents[1]
PARQUET = Path(__file__).parent / "fixtures" / "parquet"


def _python(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter on this checkout (an abort shows as a negative return code)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


# -- item 1: Parquet footers never reach a C++ abort ------------------------------------------------

FOOTER_FLIPS = """
import json, shutil, sys, pathlib
import r3store
fixture, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
doc = json.loads((fixture.parent / "footer-crashes.json").read_text())
blob = (fixture / doc["table"]).read_bytes()
for flip in doc["flips"]:
    print("flip", flip["offset"], flip["bit"], flush=True)
    store = work / f"s{flip['offset']}-{flip['bit']}"
    shutil.copytree(fixture, store)
    bad = bytearray(blob)
    bad[flip["offset"]] ^= 1 << flip["bit"]
    (store / doc["table"]).write_bytes(bytes(bad))
    try:
        r3store.open_store(store)
    except r3store.errors.FormatError as exc:
        print("refused", type(exc).__name__, flush=True)
    else:
        print("opened", flush=True)
"""


def test_footer_bit_flips_that_aborted_pyarrow_are_format_errors(tmp_path: Path) -> None:
    """Item 1: 43 single-bit flips of a sample table's footer each killed every process opening the
    store (SIGABRT from ``meta.row_group(i).column(j)``); each is now a FormatError."""
    flips = json.loads((PARQUET / "footer-crashes.json").read_text())["flips"]
    assert len(flips) == 43
    proc = _python(FOOTER_FLIPS, str(PARQUET / "footer-crash-store"), str(tmp_path))
    tried = [line for line in proc.stdout.splitlines() if line.startswith("flip")]
    assert proc.returncode == 0, f"died ({proc.returncode}) at {tried[-1:]}: {proc.stderr[-500:]}"
    outcomes = [line for line in proc.stdout.splitlines() if not line.startswith("flip")]
    assert outcomes == ["refused FormatError"] * len(flips)


# -- item 7: JSON integers of more than 4,300 digits ------------------------------------------------


def _store(tmp_path: Path) -> Path:
    import numpy as np

    spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    with r3store.RouteWriter(tmp_path / "s", spec) as w:
        w.append("a", np.array([[[0, 1], [2, 3]]] * 3))
    return tmp_path / "s"


@pytest.mark.parametrize("where", ["manifest", "zarr.json"])
def test_huge_json_integer_is_a_format_error(tmp_path: Path, where: str) -> None:
    """Item 7: Python's int-string limit raised a bare ValueError from ``json.loads``."""
    root = _store(tmp_path)
    path = root / "r3store.json" if where == "manifest" else next((root / "routes").glob("*/zarr.json"))
    text = path.read_text()
    path.write_text(text.replace('"top_k": 2', '"top_k": ' + "9" * 5000, 1) if where == "manifest"
                    else text.replace('"zarr_format": 3', '"zarr_format": ' + "3" * 5000, 1))
    with pytest.raises(FormatError, match="an integer of 5000 digits") as info:
        r3store.open_store(root).get("a")
    assert path.name in str(info.value)
