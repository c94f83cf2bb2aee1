"""The Parquet sample table (``r3store/_format/_table.py``): names, shape caps, damaged and forged tables."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store
import r3store.audit
from r3store.errors import ChecksumError, FormatError, FormatVersionError
from r3store.testing import forge
from tests.routes import array_dir, index_file, make_store, rewrite_table, set_column
from tests.routes import sample_tables as _tables
from tests.routes import seeded_routes as _routes
from tests.routes import write_store as _write


def test_forged_array_column_cannot_read_another_store(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    make_store(mine)
    make_store(other, seed=100)
    foreign = os.path.relpath(array_dir(other), mine)
    path = rewrite_table(mine, lambda t: set_column(t, "array", [foreign] * t.num_rows))
    with pytest.raises(FormatError, match="column 'array'") as info:
        r3store.open_store(mine)
    assert path.name in str(info.value)
    assert info.value.path.endswith(path.name)


@pytest.mark.parametrize(("column", "value"),
                         [("commit", "someone-else-00000"), ("array", "routes/someone-else-00000")])
def test_sample_table_names_only_its_own_shard(small_store_dir: Path, column: str, value: str) -> None:
    path = rewrite_table(small_store_dir, lambda t: set_column(t, column, [value] * t.num_rows))
    with pytest.raises(FormatError, match=f"column '{column}'") as info:
        r3store.open_store(small_store_dir)
    assert path.name in str(info.value)


def test_sample_table_copied_under_another_name(small_store_dir: Path) -> None:
    (index_file(small_store_dir).parent / "copy-00000.parquet").write_bytes(index_file(small_store_dir).read_bytes())
    with pytest.raises(FormatError, match=r"copy-00000.parquet.*column 'commit'"):
        r3store.open_store(small_store_dir)


def _write_with(path: Path, table: pa.Table, **kw: Any) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", **kw)
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("shape", ["columns", "cells", "nested"])
def test_sample_table_shape_caps(small_store_dir: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    path = index_file(small_store_dir)
    table = pq.read_table(path)
    if shape == "columns":
        for i in range(1000):
            table = table.append_column(f"m{i}", pa.array([i] * table.num_rows))
    elif shape == "cells":
        monkeypatch.setattr("r3store._format._table.MAX_TABLE_CELLS", 20)
    else:
        table = table.append_column("nested", pa.array([[1, 2]] * table.num_rows))
    _write_with(path, table)
    with pytest.raises(FormatError, match=r"columns|cells|scalars"):
        r3store.open_store(small_store_dir)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "plain-parquet"])
def test_bad_sample_table(committed, damage) -> None:
    root, _array, _, _ = committed
    (table,) = (root / "index").rglob("*.parquet")
    raw = table.read_bytes()
    if damage == "garbage":
        table.write_bytes(b"this is not parquet" * 10)
    elif damage == "truncated":
        table.write_bytes(raw[: len(raw) // 2])
    elif damage == "empty":
        table.write_bytes(b"")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"sample_id": ["x"]}), table)
    with pytest.raises(FormatError) as info:
        r3store.open_store(root)
    assert table.name in str(info.value)
    if damage == "plain-parquet":
        assert isinstance(info.value, FormatVersionError)


def test_sample_table_missing_column(committed) -> None:
    import pyarrow.parquet as pq

    root, _, _, _ = committed
    (path,) = (root / "index").rglob("*.parquet")
    forge.rewrite_table(path, lambda t: t.drop_columns(["row_start"]))
    with pytest.raises(FormatError, match="column 'row_start' should be int64, found None"):
        r3store.open_store(root)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["reason"]), path)  # metadata kept, digest stale
    with pytest.raises(ChecksumError, match="digest"):
        r3store.open_store(root)


ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter on this checkout (an abort shows as a negative return code)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


BYTE_FLIPS = """
import sys, pathlib
import r3store
root = pathlib.Path(sys.argv[1])
(path,) = sorted((root / "index").rglob("*.parquet"))
blob = path.read_bytes()
expected = r3store.open_store(root).samples
for pos in range(4, len(blob) - 8, 5):  # every 5th byte, a different bit each time (about 1,000 flips)
    bad = bytearray(blob)
    bad[pos] ^= 1 << (pos % 8)
    path.write_bytes(bytes(bad))
    try:
        got = r3store.open_store(root).samples
    except r3store.errors.FormatError as exc:
        print("refused", type(exc).__name__, flush=True)
    else:
        print("same" if got.equals(expected) else f"CHANGED at {pos}", flush=True)
"""


def test_every_bit_flip_of_a_sample_table_is_refused_or_harmless(tmp_path: Path) -> None:
    """Item 4: one bit flipped anywhere in a sample table (pages, page headers, footer) is a
    FormatError (mostly a ChecksumError: page CRC or digest), or changes nothing a reader sees;
    never another table, never a crash (a subprocess: an abort fails the test)."""
    _write(tmp_path, {f"s{i}": _routes(3 + i, i) for i in range(4)}, writer_id="flips")
    proc = _python(BYTE_FLIPS, str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outcomes = proc.stdout.splitlines()
    assert not [o for o in outcomes if o.startswith("CHANGED")]
    assert len(outcomes) > 800
    assert sum(o == "refused ChecksumError" for o in outcomes) > len(outcomes) / 10


def test_invalid_utf8_in_a_sample_table_is_a_format_error(tmp_path: Path) -> None:
    """Item 7: a string column holding invalid UTF-8 raised UnicodeDecodeError."""
    _write(tmp_path, {"s0": _routes(4, 0), "s1": _routes(4, 1)})
    (path,) = _tables(tmp_path)
    table = pq.read_table(path)
    bad = pa.array([b"s0", b"s\xff"], pa.binary()).cast(pa.string(), safe=False)  # bytes as they might be on disk
    table = table.set_column(0, table.schema.field(0), bad)
    meta = dict(table.schema.metadata or {})
    if b"r3store.digest" in meta:  # forge the digest too (the digest is over bytes, not text)
        from r3store.testing import forge
        path.write_bytes(forge.reseal_table(path.read_bytes(), lambda t: t.set_column(0, t.schema.field(0), bad)))
    else:
        pq.write_table(table, path)
    with pytest.raises(FormatError, match="column 'sample_id' holds a string that is not valid UTF-8"):
        r3store.open_store(tmp_path).samples.to_pylist()
