"""Parquet footers checked before pyarrow reads them (``r3store/_format/_footer.py``): bombs, bit flips."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store
from r3store.errors import FormatError
from tests.routes import index_file


def _write_with(path: Path, table: pa.Table, **kw: Any) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", **kw)
    path.write_bytes(buf.getvalue())


def test_parquet_bomb_is_refused_before_decompressing(small_store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("r3store._format._table.MAX_TABLE_BYTES", 1 << 20)
    path = index_file(small_store_dir)
    table = pq.read_table(path)
    _write_with(path, table.append_column("note", pa.array(["a" * (4 << 20)] * table.num_rows)))
    assert path.stat().st_size < 10_000
    with pytest.raises(FormatError, match=r"decodes to .* over the cap") as info:
        r3store.open_store(small_store_dir)
    assert path.name in str(info.value)


def test_dictionary_bomb_is_measured_before_decoding(small_store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One long dictionary value repeated by run-length encoding: tiny pages, huge strings."""
    monkeypatch.setattr("r3store._format._table.MAX_TABLE_BYTES", 1 << 20)
    path = index_file(small_store_dir)
    table = pq.read_table(path)
    note = pa.DictionaryArray.from_arrays(pa.array(np.zeros(table.num_rows, np.int32)), pa.array(["a" * (1 << 19)]))
    _write_with(path, table.append_column("note", note), store_schema=False)
    with pytest.raises(FormatError, match="strings decode to"):
        r3store.open_store(small_store_dir)


ROOT = Path(__file__).resolve().parents[2]


PARQUET = Path(__file__).resolve().parents[1] / "fixtures" / "parquet"


def _python(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter on this checkout (an abort shows as a negative return code)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


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
