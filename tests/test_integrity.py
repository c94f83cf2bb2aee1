"""Issue 13, the format items: every byte of a store checked and bound to its place, every fault
a named r3store error, no input that kills the process.

Each test names the item it proves. Inputs that once aborted the interpreter (a C++
``std::terminate`` inside pyarrow) run in a subprocess, so an abort fails the test instead of
killing pytest.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store
import r3store.audit
from r3store.errors import ChecksumError, FormatError, StorageError
from r3store.storage import LocalBackend

try:
    from r3store.errors import SpecConflictError
except ImportError:  # r3store 0.1 (these tests also run against it, to show each failed there)
    SpecConflictError = ChecksumError  # type: ignore[misc, assignment]

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


# -- shared helpers ------------------------------------------------------------------------------------

SPEC6 = r3store.ModelSpec(num_layers=6, num_experts=12, top_k=2, moe_layers=[1, 2, 3, 4, 5])


def _routes(rows: int, seed: int, spec: r3store.ModelSpec = SPEC6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((rows, spec.num_moe_layers, spec.num_experts)), axis=-1)[..., : spec.top_k].astype(
        np.int32)


def _write(root: Path, samples: dict[str, np.ndarray], spec: r3store.ModelSpec = SPEC6, **kw: object) -> str:
    with r3store.RouteWriter(root, spec, **kw) as w:
        for sid, r in samples.items():
            w.append(sid, r)
        return w.flush() or w.commits[-1]


def _tables(root: Path) -> list[Path]:
    return sorted((root / "index").rglob("*.parquet"))


def _manifest_crc(doc: dict[str, object]) -> str:
    """The format v2 checksum of a manifest document, computed here from FORMAT.md (not r3store)."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    return f"crc32c:{google_crc32c.value(text):08x}"


def _edit_manifest(root: Path, edit: object, *, reseal: bool) -> None:
    """Edit r3store.json as text would be edited (one character), or as a forger would (checksum redone)."""
    path = root / "r3store.json"
    doc = json.loads(path.read_text())
    edit(doc)  # type: ignore[operator]
    if reseal and "checksum" in doc:
        doc["checksum"] = _manifest_crc(doc)
    path.write_text(json.dumps(doc, indent=2))


# -- item 3: the manifest is checksummed and cross-checked ---------------------------------------------


@pytest.mark.parametrize(("field", "value"), [("num_experts", 10), ("moe_layers", [0, 1, 2, 3, 4]), ("num_layers", 7)])
def test_one_character_manifest_edit_is_refused(tmp_path: Path, field: str, value: object) -> None:
    """Item 3: ``num_experts 12 -> 10``, ``moe_layers [1..5] -> [0..4]``, ``num_layers 6 -> 7`` opened
    fine and served the same bytes under other layer labels."""
    _write(tmp_path, {"s0": _routes(9, 0)})
    _edit_manifest(tmp_path, lambda d: d["spec"].__setitem__(field, value), reseal=False)
    with pytest.raises(FormatError, match="r3store.json") as info:
        r3store.open_store(tmp_path).get("s0", layers=[5, 2])
    assert isinstance(info.value, ChecksumError)
    assert "checksum" in str(info.value)


@pytest.mark.parametrize(("field", "value"), [("num_experts", 10), ("moe_layers", [0, 1, 2, 3, 4]), ("num_layers", 7)])
def test_forged_manifest_disagrees_with_the_tables(tmp_path: Path, field: str, value: object) -> None:
    """Item 3: with the checksum recomputed, the spec every sample table and route array repeats
    still disagrees: a SpecConflictError naming both objects and the field."""
    _write(tmp_path, {"s0": _routes(9, 0)})
    _edit_manifest(tmp_path, lambda d: d["spec"].__setitem__(field, value), reseal=True)
    with pytest.raises(SpecConflictError) as info:
        r3store.open_store(tmp_path).get("s0", layers=[5, 2])
    assert info.value.fields == (field,)
    assert _tables(tmp_path)[0].name in str(info.value) and "r3store.json" in str(info.value)


def test_array_document_disagrees_with_the_manifest(tmp_path: Path) -> None:
    """Item 3: a route array's ``attributes.r3store.spec`` is compared with the manifest too."""
    commit = _write(tmp_path, {"s0": _routes(9, 0)})
    path = tmp_path / "routes" / commit / "zarr.json"
    doc = json.loads(path.read_text())
    doc["attributes"]["r3store"]["spec"]["moe_layers"] = [0, 1, 2, 3, 4]
    path.write_text(json.dumps(doc))
    store = r3store.open_store(tmp_path)
    with pytest.raises(SpecConflictError, match="moe_layers") as info:
        store.get("s0")
    assert f"{commit}/zarr.json" in str(info.value)


# -- item 4: sample tables are checksummed ---------------------------------------------------------------


def test_sample_table_edit_with_its_old_metadata_is_refused(tmp_path: Path) -> None:
    """Item 4: rewriting a table with ``s4`` renamed ``s2`` (metadata kept) served s4's routes as s2."""
    data = {f"s{i}": _routes(5 + i, i) for i in (1, 3, 4)}
    _write(tmp_path, data)
    (path,) = _tables(tmp_path)
    table = pq.read_table(path)
    ids = ["s2" if s == "s4" else s for s in table.column("sample_id").to_pylist()]
    table = table.set_column(0, table.schema.field(0), pa.array(ids))
    pq.write_table(table, path)  # the footer keeps r3store.version / spec (and the now stale digest)
    with pytest.raises(ChecksumError, match="digest") as info:
        r3store.open_store(tmp_path)
    assert path.name in str(info.value)


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


# -- item 5: frames and storage objects are bound to their place -------------------------------------------


def _two_object_store(root: Path, prefix: str = "", **kw: object) -> tuple[str, dict[str, np.ndarray]]:
    """One commit whose route array spans two storage objects of identical geometry."""
    data = {f"{prefix}a": _routes(40, 1), f"{prefix}b": _routes(40, 2)}
    commit = _write(root, data, chunk_rows=8, layers_per_chunk=5, object_bytes=100, **kw)
    objects = sorted((root / "routes" / commit / "c").glob("*/0/0"))
    assert len(objects) >= 2
    return commit, data


def test_swapped_storage_objects_are_refused(tmp_path: Path) -> None:
    """Item 5: swapping ``c/0/0/0`` and ``c/1/0/0`` of one array read back silently wrong."""
    commit, data = _two_object_store(tmp_path)
    first, second = (tmp_path / "routes" / commit / "c" / str(i) / "0" / "0" for i in (0, 1))
    one, two = first.read_bytes(), second.read_bytes()
    assert len(one) == len(two)
    first.write_bytes(two)
    second.write_bytes(one)
    store = r3store.open_store(tmp_path)
    with pytest.raises(ChecksumError, match=r"frame belongs to chunk \(\d+, 0, 0\) of routes/") as info:
        store.get("a")
    assert info.value.array == f"routes/{commit}"
    report = r3store.audit.validate(r3store.open_store(tmp_path, on_duplicate="report"))
    assert report.counts.get("checksum", 0) >= 2


def test_object_copied_from_another_commit_is_refused(tmp_path: Path) -> None:
    """Item 5: copying another commit's object of the same geometry over one read back wrong."""
    mine, _ = _two_object_store(tmp_path, writer_id="mine")
    theirs, _ = _two_object_store(tmp_path, "their-", writer_id="theirs")
    target = tmp_path / "routes" / mine / "c" / "0" / "0" / "0"
    target.write_bytes((tmp_path / "routes" / theirs / "c" / "0" / "0" / "0").read_bytes())
    with pytest.raises(ChecksumError, match=f"frame belongs to chunk \\(0, 0, 0\\) of routes/{theirs}"):
        r3store.open_store(tmp_path).get("a")


def test_frames_swapped_inside_an_object_are_refused(tmp_path: Path) -> None:
    """Item 5: two index entries exchanged (index CRC redone): each frame lands on another chunk."""
    commit, _ = _two_object_store(tmp_path)
    obj = tmp_path / "routes" / commit / "c" / "0" / "0" / "0"
    blob = obj.read_bytes()
    store = r3store.open_store(tmp_path)
    geometry = store.geometry_of(f"routes/{commit}")
    entries = geometry.row_chunks_per_object * geometry.layer_chunks
    index = np.frombuffer(blob[-(16 * entries + 4) : -4], "<u8").reshape(entries, 2).copy()
    index[[0, 1]] = index[[1, 0]]
    raw = index.tobytes()
    obj.write_bytes(blob[: -(16 * entries + 4)] + raw + struct.pack("<I", google_crc32c.value(raw)))
    with pytest.raises(ChecksumError, match=r"chunk \((1, 0, 0\): frame belongs to chunk \(0|0, 0, 0\): frame belongs to chunk \(1), 0, 0\)"):
        r3store.open_store(tmp_path).get("a")


# -- item 6: a commit retried after gc --delete is complete ---------------------------------------------


class _FailTableOnce(LocalBackend):
    """Local storage whose first write of a sample table fails (an S3 PUT that timed out)."""

    failed = False

    def set_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith("index/") and not self.failed:
            self.failed = True
            raise StorageError(self.path_of(key), "injected failure")
        return super().set_if_absent(key, data)


def test_commit_retried_after_gc_delete_is_complete(tmp_path: Path) -> None:
    """Item 6: the retry "succeeded" without ``routes/<commit>/zarr.json``; every read then raised."""
    backend = _FailTableOnce(tmp_path)
    writer = r3store.RouteWriter(backend, SPEC6)
    writer.append("a", _routes(7, 3))
    with pytest.raises(StorageError, match="injected"):
        writer.flush()
    gone = r3store.audit.collect_garbage(tmp_path, older_than_s=0, delete=True)
    assert [g.commit for g in gone] and not (tmp_path / "routes" / gone[0].commit / "zarr.json").exists()
    commit = writer.flush()
    writer.close()
    assert commit == gone[0].commit
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("a"), _routes(7, 3))
    assert r3store.audit.validate(store).ok


# -- item 7: invalid UTF-8 and zero-length index entries --------------------------------------------------


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
        store = r3store.open_store(tmp_path)
        store.samples.to_pylist()


def test_index_entry_of_zero_bytes_is_a_format_error(tmp_path: Path) -> None:
    """Item 7: a storage-object index entry with nbytes=0 raised a bare IndexError."""
    commit = _write(tmp_path, {"s0": _routes(9, 0)}, chunk_rows=4, layers_per_chunk=5)
    obj = tmp_path / "routes" / commit / "c" / "0" / "0" / "0"
    blob = obj.read_bytes()
    entries = r3store.open_store(tmp_path).geometry_of(f"routes/{commit}").row_chunks_per_object
    index = np.frombuffer(blob[-(16 * entries + 4) : -4], "<u8").reshape(entries, 2).copy()
    assert entries == 3
    index[2, 1] = 0  # the last frame of the object: its empty range fell off the coalesced reads
    raw = index.tobytes()
    obj.write_bytes(blob[: -(16 * entries + 4)] + raw + struct.pack("<I", google_crc32c.value(raw)))
    with pytest.raises(FormatError, match=r"chunk \(2, 0, 0\)") as info:
        r3store.open_store(tmp_path).get("s0")
    assert not isinstance(info.value, IndexError)


# -- item 15: rows the engine could not capture ----------------------------------------------------------------


def test_rows_of_minus_one_are_stored_as_missing(tmp_path: Path) -> None:
    """Item 15: NeMo-RL's all -1 rows (prefix-cache hits) were rejected; now they are missing rows:
    -1 from ``get``, ``replay_mask`` False in batches, reported by ``validate`` (more in test_format_v2)."""
    arr = _routes(6, 0)
    arr[1:3] = -1
    with r3store.RouteWriter(tmp_path, SPEC6) as w:
        w.append("s", arr, allow_missing=True)
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s"), arr)
    assert store.assemble(["s"])["replay_mask"].tolist() == [True, False, False, True, True, True, False]
    assert r3store.audit.validate(store).counts == {"missing_rows": 1}


# -- item 17: a cap on rows per sample, checked before allocating ------------------------------------------------


def test_forged_huge_sample_is_refused_before_allocating(tmp_path: Path) -> None:
    """Item 17: a few-KB store declaring a sample of 2**39 rows made ``get`` ask numpy for 20 TiB
    (MemoryError); it is refused when the store is opened, naming the sample, rows and cap."""
    with r3store.RouteWriter(tmp_path, SPEC6) as w:
        w.append("big", _routes(4, 0))
    rows = 2**39

    def edit(t: pa.Table) -> pa.Table:
        t = t.set_column(2, "num_rows", pa.array([rows], pa.int64()))
        return t.set_column(1, "num_tokens", pa.array([rows + 1], pa.int64()))

    (path,) = _tables(tmp_path)
    try:
        from r3store.testing import forge
    except ImportError:  # r3store 0.1: tables carry no digest to forge
        pq.write_table(edit(pq.read_table(path)), path)
    else:
        forge.rewrite_table(path, edit)
    (doc_path,) = (tmp_path / "routes").glob("*/zarr.json")
    doc = json.loads(doc_path.read_text())
    doc["shape"][0] = rows
    doc_path.write_text(json.dumps(doc))
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 10_000
    with pytest.raises(FormatError, match=r"sample 'big' has 549,755,813,888 rows, more than the cap of 4,194,304"):
        r3store.open_store(tmp_path).get("big")
