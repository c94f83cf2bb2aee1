"""``get``/``read_rows``/``read_runs`` into a caller's ``out``: an array that cannot hold every
expert id (or, for ``get``, the -1 of missing rows) is refused with an OptionError naming
``out`` before anything is read, never filled with wrapped ids (found by the differential fuzz
targets: a uint8 ``out`` of a 300-expert store came back with ids modulo 256, no error)."""

from __future__ import annotations

import numpy as np
import pytest

import r3store
from r3store.errors import OptionError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=300, top_k=2)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[r3store.RouteStore, np.ndarray]:
    root = tmp_path_factory.mktemp("get-out") / "store"
    rng = np.random.default_rng(0)
    routes = np.argsort(rng.random((50, 2, 300)), axis=-1)[..., :2].astype(np.int32)
    routes[10:13] = -1  # missing rows
    with r3store.RouteWriter(root, SPEC, config={"chunk_rows": 8}) as w:
        w.append("a", routes, allow_missing=True)
    return r3store.open_store(root), routes


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16, np.uint32, np.bool_, np.float64])
def test_get_refuses_an_out_that_cannot_hold_every_id_or_minus_one(
        store: tuple[r3store.RouteStore, np.ndarray], dtype: type) -> None:
    reader, _ = store
    out = np.full((50, 2, 2), 7, dtype)
    with pytest.raises(OptionError, match="out"):
        reader.get("a", out=out)
    assert (out == dtype(7)).all()  # nothing written


def test_get_refuses_a_read_only_out(store: tuple[r3store.RouteStore, np.ndarray]) -> None:
    reader, _ = store
    out = np.zeros((50, 2, 2), np.int32)
    out.flags.writeable = False
    with pytest.raises(OptionError, match="writable"):
        reader.get("a", out=out)


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, ">i4"])
def test_get_fills_a_signed_out_wide_enough(store: tuple[r3store.RouteStore, np.ndarray], dtype: str) -> None:
    reader, routes = store
    out = np.zeros((17, 2, 2), dtype)
    assert reader.get("a", rows=slice(3, 20), out=out) is out
    np.testing.assert_array_equal(out, routes[3:20])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.bool_])
def test_read_rows_and_read_runs_refuse_an_out_too_narrow(store: tuple[r3store.RouteStore, np.ndarray],
                                                          dtype: type) -> None:
    reader, _ = store
    array = reader.row("a")["array"]
    out = np.full((20, 2, 2), 7, dtype)
    with pytest.raises(OptionError, match="out"):
        reader.read_rows(array, 20, 40, [0, 1], out)
    with pytest.raises(OptionError, match="out"):
        reader.read_runs(array, [(20, 40, 0)], [0, 1], out)
    assert (out == dtype(7)).all()


def test_read_runs_into_uint16_still_reads(store: tuple[r3store.RouteStore, np.ndarray]) -> None:
    reader, routes = store
    array = reader.row("a")["array"]
    out = np.zeros((20, 2, 2), np.uint16)
    reader.read_runs(array, [(20, 40, 0)], [0, 1], out)
    np.testing.assert_array_equal(out, routes[20:40])
