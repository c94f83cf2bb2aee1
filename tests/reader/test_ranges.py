"""Row and layer ranges of a sample: refused past either end, never clipped (``r3store/reader/_ranges.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import LayerError, OptionError, RangeError
from r3store.reader import sample_rows
from tests.clirun import run_cli
from tests.routes import make_store

ROWS = 10  # make_store's samples: s0, s1, s2 of 10 rows, SPEC_4X16 (decoder layers 0..3, all MoE)


@pytest.fixture
def store(tmp_path: Path) -> tuple[r3store.RouteStore, dict[str, np.ndarray]]:
    data = make_store(tmp_path / "s")
    return r3store.open_store(tmp_path / "s"), data


@pytest.mark.parametrize(("rows", "words"), [
    (slice(0, 1000), "reaches past the end of the sample (stop 1,000 > 10)"),
    (slice(5, 11), "reaches past the end of the sample (stop 11 > 10)"),
    (slice(None, 11), "reaches past the end of the sample (stop 11 > 10)"),
    (slice(11, None), "starts past the end of the sample (start 11 > 10)"),
    (slice(-11, None), "starts 1 row before the sample's first row"),
    (slice(-20, -15), "starts 10 rows before the sample's first row"),
    (slice(5, 2), "ends before it starts (stop 2 < start 5)"),
    (slice(-1, -3), "ends before it starts (stop 7 < start 9)"),
    (slice(0, 10, 2), "must have step 1"),
    (slice(0, 10, -1), "must have step 1"),
    (slice(0, 2.0), "the stop must be an int, not float"),
])
def test_get_refuses_a_row_range_past_the_sample(store: tuple[r3store.RouteStore, Any], rows: slice,
                                                 words: str) -> None:
    reader, _ = store
    with pytest.raises(RangeError) as info:
        reader.get("s1", rows=rows)
    err = info.value
    assert isinstance(err, IndexError)  # and an OptionError (a ValueError), which get raised for a bad step
    assert isinstance(err, OptionError)
    assert (err.sample_id, err.option, err.value) == ("s1", "rows", rows)
    assert err.bounds == "10 rows (0 to 9)"
    text = str(err)
    assert words in text
    assert text.startswith(f"rows={rows!r}: ")
    assert text.endswith("sample 's1' has 10 rows (0 to 9)")


@pytest.mark.parametrize(("rows", "want"), [
    (None, slice(0, 10)),
    (slice(0, 10), slice(0, 10)),
    (slice(3, None), slice(3, 10)),
    (slice(None, 4), slice(0, 4)),
    (slice(-3, None), slice(7, 10)),  # a negative index counts from the end, as in Python
    (slice(-10, -9), slice(0, 1)),
    (slice(4, 4), slice(4, 4)),  # an empty range inside the sample is no clipping
    (slice(10, 10), slice(10, 10)),
    (slice(np.int64(2), np.int32(5), 1), slice(2, 5)),
])
def test_get_reads_exactly_the_rows_asked(store: tuple[r3store.RouteStore, dict[str, np.ndarray]], rows: slice | None,
                                          want: slice) -> None:
    reader, data = store
    got = reader.get("s1", rows=rows)
    np.testing.assert_array_equal(got, data["s1"][want])
    assert len(got) == want.stop - want.start


def test_a_layer_past_the_model_names_the_sample_and_the_layers(store: tuple[r3store.RouteStore, Any]) -> None:
    reader, _ = store
    for call in (lambda: reader.get("s2", range(10)), lambda: reader.get_many(["s0", "s2"][1:], [2, 4])):
        with pytest.raises(LayerError, match=re.escape("sample 's2': layers=")) as info:
            call()
        assert info.value.layer == 4
        assert info.value.sample_id == "s2"
        assert "(MoE layers: 0..3)" in str(info.value)
    with pytest.raises(LayerError, match=re.escape("sample 's0': layers=[-1]: decoder layer -1")):
        reader.get("s0", [-1])


def test_get_runs_refuses_a_run_past_its_sample(store: tuple[r3store.RouteStore, Any]) -> None:
    reader, _ = store
    out = np.zeros((11, 4, 2), np.int32)
    with pytest.raises(RangeError, match=re.escape("runs=('s0', 0, 11): reaches past the end of the sample "
                                                   "(stop 11 > 10); sample 's0' has 10 rows (0 to 9)")):
        reader.get_runs([("s0", 0, 11)], out=out)


def test_read_rows_refuses_a_reversed_or_negative_range(store: tuple[r3store.RouteStore, Any]) -> None:
    reader, _ = store
    array = reader.samples["array"][0].as_py()
    with pytest.raises(OptionError, match=r"stop=2: must be >= 5"):  # numpy's "negative dimensions" before
        reader.read_rows(array, 5, 2, [0])
    with pytest.raises(OptionError, match=r"start=-1: must be >= 0"):
        reader.read_rows(array, -1, 2, [0])
    assert reader.read_rows(array, 2, 2, [0]).shape == (0, 1, 2)


def test_the_command_line_and_the_library_say_the_same(small_store_dir: Path) -> None:
    reader = r3store.open_store(small_store_dir)
    with pytest.raises(RangeError) as info:
        reader.get("s0", rows=slice(3, 12))
    result = run_cli("show", str(small_store_dir), "s0", "--rows", "3:12", columns=20)  # one layer fits
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --rows '3:12': {info.value.fault}"
    assert result.stdout == ""  # no "showing MoE layers" note before the error
    assert "sample 's0' has 10 rows (0 to 9)" in info.value.fault


def test_the_default_show_window_fits_a_short_sample(small_store_dir: Path) -> None:
    result = run_cli("show", str(small_store_dir), "s0")  # 10 rows, fewer than the 50 shown by default
    assert result.exit_code == 0, result.output
    assert "rows 0-9" in result.stdout


def test_sample_rows_is_the_one_rule() -> None:
    assert sample_rows("s", None, 0) == (0, 0)
    assert sample_rows("s", slice(0, 0), 0) == (0, 0)
    with pytest.raises(RangeError, match="sample 's' has no rows"):
        sample_rows("s", slice(0, 1), 0)
    with pytest.raises(TypeError, match=re.escape("use slice(0, 4)")):
        sample_rows("s", (0, 4), 9)  # type: ignore[arg-type]
