"""The chunk reader (``r3store/reader/_chunks.py``): damaged frames and objects, ``get_runs``, allocation bounds."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import r3store
import r3store.audit
from r3store import open_store
from r3store.codecs import kernels
from r3store.errors import ChecksumError, FormatError, R3StoreError
from tests.routes import GOOD, SPEC6
from tests.routes import sample_tables as _tables
from tests.routes import seeded_routes as _routes
from tests.routes import write_store as _write


def _index(shard_file: Path, row_chunks: int, layer_chunks: int) -> np.ndarray:
    raw = shard_file.read_bytes()
    n = row_chunks * layer_chunks * 16
    return np.frombuffer(raw[-4 - n : -4], dtype="<u8").reshape(row_chunks, layer_chunks, 2)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_corrupt_chunk_frame(committed) -> None:
    root, array, shard_file, big = committed
    # rows: g0 [0, 5), g1 [5, 16), g2 [16, 17), big [17, 37): 10 row chunks x 3 layer chunks
    index = _index(shard_file, 10, 3)
    offset, nbytes = (int(v) for v in index[1, 2])  # rows [4, 8), decoder layer 4
    assert nbytes > 24
    _flip(shard_file, offset + 22)  # inside the payload of that frame
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError) as info:
        store.get("g1")
    exc = info.value
    assert exc.array == array
    assert exc.chunk == (1, 2, 0)
    assert array in str(exc)
    assert "(1, 2, 0)" in str(exc)
    assert "CRC-32C" in str(exc)
    assert isinstance(exc, FormatError)
    # the damage is local: other chunks read fine
    np.testing.assert_array_equal(store.get("g1", layers=[1, 2]), GOOD["g1"][:, :2])
    np.testing.assert_array_equal(store.get("g1", rows=slice(3, 11)), GOOD["g1"][3:11])
    np.testing.assert_array_equal(store.get("big"), big)
    np.testing.assert_array_equal(store.get("g2"), GOOD["g2"])
    with pytest.raises(ChecksumError):
        store.get("g0", layers=[4])


def test_corrupt_frame_header(committed) -> None:
    root, array, shard_file, _ = committed
    offset, _ = (int(v) for v in _index(shard_file, 10, 3)[3, 0])
    _flip(shard_file, offset + 13)  # the n_encoded field of the header
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g1")
    assert array in str(info.value)
    assert "(3, 0, 0)" in str(info.value)


def test_corrupt_shard_index(committed) -> None:
    root, array, shard_file, _ = committed
    size = shard_file.stat().st_size
    _flip(shard_file, size - 4 - 16 * 7 + 3)  # inside the (offset, nbytes) table
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError) as info:
        store.get("g2")
    assert array in str(info.value)
    assert "index" in str(info.value)
    assert "CRC-32C" in str(info.value)


def test_truncated_shard_object(committed) -> None:
    root, array, shard_file, _ = committed
    shard_file.write_bytes(shard_file.read_bytes()[:-40])
    with pytest.raises(FormatError) as info:
        r3store.open_store(root).get("g0")
    assert array in str(info.value)


def test_missing_shard_object(committed) -> None:
    root, array, shard_file, _ = committed
    shard_file.unlink()
    with pytest.raises(FileNotFoundError) as info:
        r3store.open_store(root).get("g0")
    assert isinstance(info.value, R3StoreError)
    assert array in str(info.value)


IMPLS = ["numpy", *(["native"] if kernels.native_module() is not None else [])]


WIDE = r3store.ModelSpec(num_layers=1, num_experts=300, top_k=2)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wide")
    with r3store.RouteWriter(path, WIDE, config={"chunk_rows": 4}) as writer:
        writer.append("a", np.tile(np.array([[[299, 3]]], np.int32), (9, 1, 1)))
    return path


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32, np.bool_])
def test_get_runs_refuses_an_out_that_cannot_hold_the_ids(wide: Path, dtype: type) -> None:
    """Finding: ``get_runs(out=<uint8 array>)`` on a 300-expert store wrapped id 299 to 43
    silently (and bool / float outs were filled); now an OptionError naming ``out``."""
    reader = open_store(wide)
    with pytest.raises(r3store.errors.OptionError, match="out"):
        reader.get_runs([("a", 0, 9)], out=np.zeros((9, 1, 2), dtype))
    out = np.zeros((9, 1, 2), np.int16)
    np.testing.assert_array_equal(reader.get_runs([("a", 0, 9)], out=out), reader.get("a"))


@pytest.mark.parametrize(("runs", "at"), [([("a", 0.5, 2)], None), ([("a", False, True)], None), ([("a", 0)], None),
                                          ([("a", 3, 2)], None), ([(b"a", 0, 2)], None), ([("a", 0, 2)], [1.5])])
def test_get_runs_refuses_malformed_runs(wide: Path, runs: list, at: list | None) -> None:
    """Finding: a 2-tuple run raised a bare ValueError, a float start a misleading shape
    error, a reversed run asked for an ``out`` of -1 rows, and float ``at`` was truncated."""
    reader = open_store(wide)
    with pytest.raises(r3store.errors.OptionError, match=r"^(runs|at)="):
        reader.get_runs(runs, out=np.zeros((2, 1, 2), np.int32), at=at)


def test_get_runs_refuses_a_read_only_out(wide: Path) -> None:
    """Finding: a read-only ``out`` failed inside the frame kernel (numpy: bare ValueError)."""
    out = np.zeros((9, 1, 2), np.int32)
    out.setflags(write=False)
    for impl in IMPLS:
        with kernels.use(impl), pytest.raises(r3store.errors.OptionError, match="out"):
            open_store(wide).get_runs([("a", 0, 9)], out=out)


def _two_object_store(root: Path, prefix: str = "", **kw: object) -> tuple[str, dict[str, np.ndarray]]:
    """One commit whose route array spans two storage objects of identical geometry."""
    data = {f"{prefix}a": _routes(40, 1), f"{prefix}b": _routes(40, 2)}
    commit = _write(root, data, chunk_rows=8, layers_per_chunk=5, object_bytes=100, **kw)
    objects = sorted((root / "routes" / commit / "c").glob("*/0/0"))
    assert len(objects) >= 2
    return commit, data


def test_swapped_storage_objects_are_refused(tmp_path: Path) -> None:
    """Item 5: swapping ``c/0/0/0`` and ``c/1/0/0`` of one array read back silently wrong."""
    commit, _data = _two_object_store(tmp_path)
    first, second = (tmp_path / "routes" / commit / "c" / str(i) / "0" / "0" for i in (0, 1))
    one, two = first.read_bytes(), second.read_bytes()
    assert len(one) == len(two)
    first.write_bytes(two)
    second.write_bytes(one)
    store = r3store.open_store(tmp_path)
    with pytest.raises(ChecksumError, match=r"frame belongs to chunk \(\d+, 0, 0\) of routes/") as info:
        store.get("a")
    assert info.value.array == f"routes/{commit}"
    report = r3store.audit.validate(r3store.open_store(tmp_path, reader={"on_duplicate": "report"}))
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
    with pytest.raises(ChecksumError, match=r"chunk \((1, 0, 0\): frame belongs to chunk \(0"
                                            r"|0, 0, 0\): frame belongs to chunk \(1), 0, 0\)"):
        r3store.open_store(tmp_path).get("a")


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


@pytest.mark.parametrize("layers_per_chunk", [1, 3])
def test_get_results_and_the_chunk_cache_do_not_share_memory(tmp_path: Path, layers_per_chunk: int) -> None:
    """``get`` decodes a sample's edge chunks into room around its result and caches them: writing
    into one result (here -1, as ``get`` itself does on missing rows) never changes what a
    neighbour sharing those chunks reads, nor what the next ``get`` returns."""
    spec = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2)
    rng = np.random.default_rng(3)
    source = {f"s{i}": np.sort(rng.permuted(np.tile(np.arange(16), (n, 3, 1)), axis=-1)[..., :2], axis=-1)
              for i, n in enumerate([5, 11, 7])}
    with r3store.RouteWriter(tmp_path, spec, config={"chunk_rows": 4, "layers_per_chunk": layers_per_chunk}) as w:
        for sid, routes in source.items():
            w.append(sid, routes)
    reader = open_store(tmp_path)
    for sid, routes in source.items():
        got = reader.get(sid)
        np.testing.assert_array_equal(got, routes)
        assert got.flags.c_contiguous
        assert got.flags.writeable
        got[...] = -1
    for sid, routes in source.items():  # the edge chunks now come from the cache
        np.testing.assert_array_equal(reader.get(sid), routes)
        np.testing.assert_array_equal(reader.get(sid, rows=slice(1, 3)), routes[1:3])


def test_get_runs_of_empty_runs_only_writes_nothing(wide: Path) -> None:
    """Finding (differential fuzzing, this round): when every run was empty, the pieces the
    runs cut were grouped by chunk with an index into no pieces (IndexError)."""
    reader = open_store(wide)
    out = np.full((3, 1, 2), 7, np.int32)
    assert reader.get_runs([("a", 4, 4), ("a", 9, 9)], out=out, at=[0, 3]) is out
    assert (out == 7).all()
    empty = np.zeros((0, 1, 2), np.int32)
    assert reader.get_runs([("a", 2, 2)], out=empty).shape == (0, 1, 2)
