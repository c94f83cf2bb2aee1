"""Bad stored layer positions, a str for ``get_many`` and a non-reader for ``assemble`` are refused
with a clear error before anything is read (before: a false ChecksumError for -1, a raw
IndexError past the last layer, letters of a str looked up as ids, an AttributeError)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import OptionError
from tests.routes import SPEC_4X16, make_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[r3store.RouteStore, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("positions") / "store"
    data = make_store(root, n=2, rows=20)
    return r3store.open_store(root), data


@pytest.mark.parametrize("positions", [[-1], [4], [0, 0], [1.5], ["0"], [True], "01"])
def test_read_rows_and_read_runs_refuse_bad_positions(store: tuple[r3store.RouteStore, dict[str, np.ndarray]],
                                                      positions: object) -> None:
    reader, _ = store
    array = reader.row("s0")["array"]
    with pytest.raises(OptionError, match="positions"):
        reader.read_rows(array, 0, 5, positions)  # type: ignore[arg-type]
    out = np.empty((5, 1, SPEC_4X16.top_k), np.int32)
    with pytest.raises(OptionError, match="positions"):
        reader.read_runs(array, [(0, 5, 0)], positions, out)  # type: ignore[arg-type]


def test_good_positions_still_read(store: tuple[r3store.RouteStore, dict[str, np.ndarray]]) -> None:
    reader, data = store
    row = reader.row("s0")
    got = reader.read_rows(row["array"], row["row_start"], row["row_start"] + 20, [3, np.int64(1)])
    np.testing.assert_array_equal(got, data["s0"][:, [3, 1]])


def test_get_many_refuses_a_str(store: tuple[r3store.RouteStore, dict[str, np.ndarray]]) -> None:
    reader, data = store
    with pytest.raises(TypeError, match=r"use \['s0'\]"):
        reader.get_many("s0")  # type: ignore[arg-type]
    np.testing.assert_array_equal(reader.get_many(["s0"])[0], data["s0"])


def test_assemble_refuses_a_non_reader(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="RouteReader"):
        r3store.batch.assemble(5, ["s0"])  # type: ignore[arg-type]


@pytest.mark.parametrize("ids", [{"s0", "s1"}, frozenset({"s0"})])
def test_get_many_and_assemble_refuse_unordered_ids(store: tuple[r3store.RouteStore, dict[str, np.ndarray]],
                                                    ids: object) -> None:
    reader, _ = store
    with pytest.raises(TypeError, match="ordered sequence"):
        reader.get_many(ids)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ordered sequence"):
        reader.assemble(ids)  # type: ignore[arg-type]


def test_ordered_views_of_ids_are_taken(store: tuple[r3store.RouteStore, dict[str, np.ndarray]]) -> None:
    reader, data = store
    got = reader.get_many(data.keys())  # a dict's keys keep their order
    assert [g.shape for g in got] == [data[s].shape for s in data]
