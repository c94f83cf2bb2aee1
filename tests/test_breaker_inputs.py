"""Adversarial inputs to the rank-local read path, layouts, dtypes and packing.

Each test pins a bad or edge-case input that once escaped as a bare builtin error, a
process death or silently different routes; the rule: a clear ``r3store.errors`` error
naming sample, field and fault, or exactly the routes of the whole-sample oracle
(``RouteReader.get`` then :func:`r3store.layout.apply_routes`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.batch import assemble
from r3store.codecs import kernels
from r3store.errors import CodecError
from r3store.layout import LayoutOptions, apply_routes, plan_layout
from r3store.reader import open_reader

SPEC = r3store.ModelSpec(num_layers=3, num_experts=8, top_k=2)
IMPLS = ["numpy", *(["native"] if kernels.native_module() is not None else [])]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Samples of 1 token (0 route rows) and one of 6 tokens with a missing row."""
    path = tmp_path_factory.mktemp("breaker")
    routes = np.tile(np.array([[0, 1], [2, 3], [4, 5]], np.int32), (5, 1, 1))
    routes[2] = -1
    with r3store.RouteWriter(path, SPEC, chunk_rows=2) as writer:
        writer.append("empty", np.zeros((0, 3, 2), np.int32), num_tokens=1)
        writer.append("empty2", np.zeros((0, 3, 2), np.int32), num_tokens=1)
        writer.append("five", routes, allow_missing=True)
    return path


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
def test_apply_routes_missing_on_a_batch_without_rows(layout: str) -> None:
    """Finding: ``apply_routes(..., missing=<0 rows>)`` on samples of 1 token raised IndexError."""
    plan = plan_layout([1, 1], LayoutOptions(layout=layout))
    out, mask = apply_routes(plan, np.zeros((0, 3, 2), np.int32), num_experts=8, missing=np.zeros(0, bool))
    ref, ref_mask = apply_routes(plan, np.zeros((0, 3, 2), np.int32), num_experts=8)
    assert np.array_equal(out, ref)
    assert np.array_equal(mask, ref_mask)
    assert not mask.any()


@pytest.mark.parametrize("layout", ["thd", "bshd", "sbhd"])
def test_assemble_zero_row_samples(tiny: Path, layout: str) -> None:
    reader = open_reader(tiny)
    batch = assemble(reader, ["empty", "empty2"], {"layout": layout})
    assert not batch["replay_mask"].any()
    assert batch["routes"].shape[-2:] == (3, 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("chunk_rows", "layers_per_chunk", "top_k"),
                         [(2**31, 1, 4), (2**26, 1, 2), (3, 1, 0), (2.0, 1, 4), (True, 1, 4)])
def test_decode_frames_refuses_a_chunk_it_cannot_hold(impl: str, chunk_rows: object, layers_per_chunk: int,
                                                      top_k: int) -> None:
    """Finding: a huge ``chunk_rows`` made the numpy twin allocate its scratch (bare
    MemoryError, even for no frames) and the C kernel raise a bare ValueError; 0 ids per
    chunk was misreported as too many. Both now raise CodecError before any work."""
    empty = np.zeros(0, np.int64)
    out = np.zeros((4, 1, top_k), np.int32)
    with kernels.use(impl), pytest.raises(CodecError, match="chunk_rows"):
        kernels.decode_frames(b"", empty, empty, 5, out, empty, empty, chunk_rows=chunk_rows,  # type: ignore[arg-type]
                              layers_per_chunk=layers_per_chunk)


WIDE = r3store.ModelSpec(num_layers=1, num_experts=300, top_k=2)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wide")
    with r3store.RouteWriter(path, WIDE, chunk_rows=4) as writer:
        writer.append("a", np.tile(np.array([[[299, 3]]], np.int32), (9, 1, 1)))
    return path


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float32, np.bool_])
def test_get_runs_refuses_an_out_that_cannot_hold_the_ids(wide: Path, dtype: type) -> None:
    """Finding: ``get_runs(out=<uint8 array>)`` on a 300-expert store wrapped id 299 to 43
    silently (and bool / float outs were filled); now an OptionError naming ``out``."""
    reader = open_reader(wide)
    with pytest.raises(r3store.errors.OptionError, match="out"):
        reader.get_runs([("a", 0, 9)], out=np.zeros((9, 1, 2), dtype))
    out = np.zeros((9, 1, 2), np.int16)
    np.testing.assert_array_equal(reader.get_runs([("a", 0, 9)], out=out), reader.get("a"))


@pytest.mark.parametrize(("runs", "at"), [([("a", 0.5, 2)], None), ([("a", False, True)], None), ([("a", 0)], None),
                                          ([("a", 3, 2)], None), ([(b"a", 0, 2)], None), ([("a", 0, 2)], [1.5])])
def test_get_runs_refuses_malformed_runs(wide: Path, runs: list, at: list | None) -> None:
    """Finding: a 2-tuple run raised a bare ValueError, a float start a misleading shape
    error, a reversed run asked for an ``out`` of -1 rows, and float ``at`` was truncated."""
    reader = open_reader(wide)
    with pytest.raises(r3store.errors.OptionError, match=r"^(runs|at)="):
        reader.get_runs(runs, out=np.zeros((2, 1, 2), np.int32), at=at)


def test_get_runs_refuses_a_read_only_out(wide: Path) -> None:
    """Finding: a read-only ``out`` failed inside the frame kernel (numpy: bare ValueError)."""
    out = np.zeros((9, 1, 2), np.int32)
    out.setflags(write=False)
    for impl in IMPLS:
        with kernels.use(impl), pytest.raises(r3store.errors.OptionError, match="out"):
            open_reader(wide).get_runs([("a", 0, 9)], out=out)


@pytest.mark.parametrize("shape", [(-2,), (-2, -3), (2.5,), "12", (True, 2)])
def test_unpack_routes_refuses_a_bad_shape(shape: object) -> None:
    """Finding: negative dims escaped as torch's RuntimeError and (2.5,) was truncated to (2,)."""
    torch = pytest.importorskip("torch")
    from r3store.dataset import unpack_routes

    with pytest.raises(r3store.errors.OptionError, match="shape"):
        unpack_routes(torch.zeros(10, dtype=torch.uint8), 4, shape)  # type: ignore[arg-type]


def test_max_seqlen_error_names_the_sample(tiny: Path) -> None:
    """Finding: an over-long sample was named by its batch position ("sample 2") only."""
    reader = open_reader(tiny)
    with pytest.raises(r3store.errors.LayoutOptionError, match="sample 'five' has 6 tokens"):
        assemble(reader, ["empty", "empty2", "five"], {"layout": "sbhd", "max_seqlen": 4})


@pytest.mark.parametrize("tokens", [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], None, "abcdef", 7, [True] * 6])
def test_assemble_refuses_tokens_that_are_not_integer_ids(tiny: Path, tokens: object) -> None:
    """Finding: float token ids were truncated to int64 silently; None, a str or a scalar
    gave a misleading "len(tokens) - 1 = 0" message."""
    reader = open_reader(tiny)
    with pytest.raises(r3store.errors.AlignmentError, match=r"'five'.*integer token ids"):
        assemble(reader, ["five"], tokens=[tokens])
    batch = assemble(reader, ["five"], tokens=[np.arange(6, dtype=np.uint16)])
    assert batch["tokens"][:6].tolist() == list(range(6))


@pytest.mark.parametrize("options", [{"endpoint_url": "localhost:9000"}, {"endpoint_url": ""},
                                     {"client_kwargs": {"endpoint_url": "127.0.0.1:9000"}},
                                     {"endpoint_url": "ftp://x"}])
def test_s3_endpoint_without_http_scheme_is_refused_at_open(options: dict) -> None:
    """Finding: ``endpoint_url="localhost:9000"`` (no scheme) escaped from ``open_store`` as
    botocore's bare ``ValueError: Invalid endpoint``; now a StorageError naming the option."""
    with pytest.raises(r3store.errors.StorageError, match=r"endpoint_url.*http"):
        r3store.open_store("s3://bucket/store", storage_options={"anon": True, **options})


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf")])
def test_s3_timeout_must_be_finite_and_positive(timeout: float) -> None:
    """Finding: a NaN, infinite, zero or negative timeout was accepted at open (NaN then
    failed every request as a connect timeout)."""
    with pytest.raises(r3store.errors.StorageError, match="connect_timeout"):
        r3store.open_store("s3://bucket/store", storage_options={
            "anon": True, "endpoint_url": "http://127.0.0.1:1", "config_kwargs": {"connect_timeout": timeout}})


def test_a_url_with_a_nul_byte_is_a_storage_error(tmp_path: Path) -> None:
    """Finding: ``open_store("/x\\x00y")`` and ``RouteWriter`` on such a path raised the OS's
    bare ``ValueError: embedded null byte``."""
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.open_store(f"{tmp_path}/a\x00b")
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.RouteWriter(f"{tmp_path}/a\x00b", SPEC)


def test_descriptor_close_survives_interpreter_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding: a reader still alive at interpreter exit printed "Exception ignored in
    _Handle.__del__ ... 'NoneType' object has no attribute 'suppress'" (module globals are
    None by then). Simulated here: the module's globals gone, the descriptor still closed."""
    import os

    from r3store.storage import _local

    path = tmp_path / "f"
    path.write_bytes(b"x")
    handle = _local._Handle(os.open(path, os.O_RDONLY), 1)
    fd = handle.fd
    monkeypatch.setattr(_local, "os", None)
    monkeypatch.setattr(_local, "contextlib", None, raising=False)
    handle.__del__()  # must neither raise nor leave the descriptor open
    monkeypatch.undo()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    handle.__del__()  # a second close (already closed) is quiet too
