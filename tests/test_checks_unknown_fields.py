"""A name that is no field of a settings object: one error, naming the object, the name and the closest fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import r3store
from r3store._checks import closest_names
from r3store.errors import LayoutOptionError, OptionError, UnknownLayoutOptionError, UnknownOptionError
from r3store.layout import LayoutOptions
from r3store.reader import ReaderOptions
from r3store.writer import WriterConfig


def _settings() -> list[type]:
    classes: list[type] = [LayoutOptions, ReaderOptions, WriterConfig]
    try:
        from r3store.ray import RouteColumns
    except ImportError:  # pragma: no cover - r3store[ray] absent
        return classes
    return [*classes, RouteColumns]


@pytest.mark.parametrize(("cls", "typo", "meant"), [
    (LayoutOptions, "cp", "cp_size"),
    (LayoutOptions, "cp_sise", "cp_size"),
    (LayoutOptions, "sequence_paralel", "sequence_parallel"),
    (ReaderOptions, "on_duplicates", "on_duplicate"),
    (ReaderOptions, "cach_bytes", "cache_bytes"),
    (WriterConfig, "buffer", "buffer_bytes"),
    (WriterConfig, "chunk_row", "chunk_rows"),
])
def test_a_typo_names_the_object_the_name_and_the_field_meant(cls: type, typo: str, meant: str) -> None:
    for build in (lambda: cls(**{typo: 2}), lambda: cls.from_dict({typo: 2})):
        with pytest.raises(UnknownOptionError) as info:
            build()
        err = info.value
        assert (err.owner, err.option, err.value) == (cls.__name__, typo, 2)
        assert err.suggestions[0] == meant
        text = str(err)
        assert cls.__name__ in text
        assert typo in text
        assert f"did you mean {meant!r}" in text


@pytest.mark.parametrize("cls", _settings())
def test_every_settings_object_refuses_unknown_names_both_ways(cls: type) -> None:
    for how, build in (("keyword", lambda: cls(zzz_unknown=1)), ("dict", lambda: cls.from_dict({"zzz_unknown": 1}))):
        with pytest.raises(UnknownOptionError) as info:
            build()
        err = info.value
        # still what was raised before: a TypeError for a keyword, an OptionError (ValueError) for a key
        assert isinstance(err, TypeError), how
        assert isinstance(err, OptionError), how
        assert isinstance(err, ValueError), how
        assert err.suggestions == ()
        assert "its fields: " in str(err), how
        assert all(name in str(err) for name in err.fields), how


def test_layout_options_keep_their_error_class() -> None:
    with pytest.raises(LayoutOptionError, match=r"did you mean 'cp_size'"):
        LayoutOptions.from_dict({"cp": 2})
    with pytest.raises(UnknownLayoutOptionError, match=r"^LayoutOptions\(\) got an unexpected keyword argument 'cp'"):
        LayoutOptions(cp=2)


def test_the_dict_form_of_an_entry_point_names_the_typo(tmp_path: Any) -> None:
    spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    calls: list[Callable[[], Any]] = [
        lambda: r3store.RouteWriter(tmp_path / "w", spec, {"buffer_byte": 1 << 20}),
        lambda: r3store.LayoutOptions.resolve({"tp": 2}),
    ]
    for call in calls:
        with pytest.raises(UnknownOptionError, match="did you mean"):
            call()


def test_valid_names_and_values_still_build() -> None:
    assert LayoutOptions(cp_size=2, cp_rank=1) == LayoutOptions.from_dict({"cp_size": 2, "cp_rank": 1})
    assert WriterConfig(buffer_bytes=1 << 20).buffer_bytes == 1 << 20
    with pytest.raises(OptionError, match="cp_size"):  # a bad value of a real field is unchanged
        LayoutOptions(cp_size=0)


def test_closest_names_prefers_close_spellings_then_prefixes() -> None:
    assert closest_names("cp", ["layout", "cp_size", "cp_rank"]) == ("cp_size", "cp_rank")
    assert closest_names("layuot", ["layout", "cp_size"]) == ("layout",)
    assert closest_names("q", ["layout"]) == ()


def test_an_entry_point_keyword_typo_points_at_the_settings_field(tmp_path: Any) -> None:
    spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    with pytest.raises(TypeError, match=r"^RouteWriter\(\) got an unexpected keyword argument 'chunk_row'; "
                                        r"did you mean config=\{'chunk_rows': \.\.\.\}\?$"):
        r3store.RouteWriter(tmp_path / "w", spec, chunk_row=2)
    with r3store.RouteWriter(tmp_path / "s", spec) as w:
        w.append("a", np.array([[[0, 1], [2, 3]]], np.int32))
    with pytest.raises(TypeError, match=r"did you mean reader=\{'on_duplicate': \.\.\.\}\?"):
        r3store.open_store(tmp_path / "s", on_duplicates="first")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'$"):  # nothing close: Python's words
        r3store.open_store(tmp_path / "s", zzz=1)
