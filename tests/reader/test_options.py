"""``ReaderOptions``: the reader's settings passed whole to ``open_store`` / ``RouteReader`` / ``RouteDataset``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import r3store
from r3store.errors import OptionError, R3StoreDeprecationWarning
from r3store.reader import ReaderOptions, RouteReader

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Two writers' commits; ``dup`` is committed by both, ``step`` is 0 or 1."""
    for step in range(2):
        with r3store.RouteWriter(tmp_path, SPEC, {"writer_id": f"step{step}"}) as w:
            w.append(f"s{step}", np.full((3, 2, 2), [0, 1]), metadata={"step": step})
            w.append("dup", np.full((2, 2, 2), [2 + step, 4]), metadata={"step": step})
    return tmp_path


def test_fields_are_checked_and_normalised(tmp_path: Path) -> None:
    opts = ReaderOptions(cache_dir=tmp_path, commits=["w-00001", "w-00000", "w-00001"], cache_bytes=np.int64(0))
    assert opts.cache_dir == str(tmp_path)
    assert opts.commits == ("w-00000", "w-00001")
    assert opts.cache_bytes == 0
    assert type(opts.cache_bytes) is int
    for bad in ({"on_duplicate": "last"}, {"cache_bytes": -1}, {"cache_bytes": True}, {"commits": "w-00000"},
                {"commits": ["../etc"]}, {"filter": "step == 1"}, {"use_checkpoint": 1}, {"max_sample_rows": 0},
                {"cache_dir": 3}):
        with pytest.raises(OptionError, match=next(iter(bad))):
            ReaderOptions(**bad)
    with pytest.raises(OptionError, match="is not a reader option"):
        ReaderOptions.from_dict({"on_duplicates": "first"})


def test_options_compare_field_by_field_filters_included() -> None:
    assert ReaderOptions(filter=pc.field("step") == 1) == ReaderOptions.from_dict({"filter": pc.field("step") == 1})
    assert ReaderOptions(filter=pc.field("step") == 1) != ReaderOptions(filter=pc.field("step") == 2)
    assert ReaderOptions() != ReaderOptions(filter=pc.field("step") == 1)


def test_open_store_takes_the_object_or_its_dict(store: Path) -> None:
    by_object = r3store.open_store(store, reader=ReaderOptions(on_duplicate="first", filter=pc.field("step") == 1))
    by_dict = r3store.open_store(store, reader={"on_duplicate": "first", "filter": pc.field("step") == 1})
    assert by_object.sample_ids == by_dict.sample_ids == ["s1", "dup"]
    assert by_object.options == by_dict.options
    assert by_object.get("dup")[0, 0].tolist() == [3, 4]  # the only copy the filter keeps


def test_open_store_reads_some_commits(store: Path) -> None:
    """``commits`` was an option of ``open_reader`` only; every entry point now takes it."""
    part = r3store.open_store(store, reader={"commits": ["step1-00000"]})
    assert part.is_partial
    assert part.commits == ["step1-00000"]
    assert sorted(part.sample_ids) == ["dup", "s1"]


@pytest.mark.parametrize("opener", [lambda url, **kw: r3store.open_store(url, **kw),
                                    lambda url, **kw: RouteReader.open(url, **kw)])
def test_loose_reader_keywords_warn_and_still_work(store: Path, opener) -> None:
    with pytest.warns(R3StoreDeprecationWarning, match=r"on_duplicate=\.\.\.\) is deprecated .* r3store 0\.4\.0"):
        reader = opener(store, on_duplicate="first")
    assert reader.options.on_duplicate == "first"
    assert len(reader) == 3


def test_a_field_given_both_ways_must_agree(store: Path) -> None:
    with pytest.warns(R3StoreDeprecationWarning), pytest.raises(OptionError, match="on_duplicate"):
        r3store.open_store(store, reader={"on_duplicate": "report"}, on_duplicate="first")
    with pytest.raises(TypeError, match="unexpected keyword argument 'on_duplicates'"):
        r3store.open_store(store, on_duplicates="first")


def test_open_reader_and_route_store_open_are_deprecated(store: Path) -> None:
    with pytest.warns(R3StoreDeprecationWarning, match=r"r3store\.open_reader is deprecated .*0\.4\.0.*open_store"):
        reader = r3store.open_reader(store, reader={"on_duplicate": "first"})
    assert isinstance(reader, RouteReader)
    assert len(reader) == 3
    with pytest.warns(R3StoreDeprecationWarning, match=r"RouteStore\.open is deprecated"):
        assert len(r3store.RouteStore.open(store, reader={"on_duplicate": "first"})) == 3
    assert "open_reader" not in r3store.__all__
    assert "open_reader" not in r3store.reader.__all__
