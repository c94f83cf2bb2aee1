"""``LayoutOptions`` holds the whole batch form (pad policy, fill value, dtype, packed), passed whole."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.batch import assemble
from r3store.errors import LayoutOptionError, OptionError, R3StoreDeprecationWarning
from r3store.layout import LayoutOptions, LayoutOptionsDict
from r3store.reader import ReaderOptions, ReaderOptionsDict
from r3store.writer import WriterConfig, WriterConfigDict

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


@pytest.mark.parametrize(("cls", "mirror"), [(LayoutOptions, LayoutOptionsDict), (ReaderOptions, ReaderOptionsDict),
                                             (WriterConfig, WriterConfigDict)])
def test_every_settings_object_has_its_dict_form(cls: type, mirror: type) -> None:
    """The TypedDict mirrors the dataclass field for field, and a dict round-trips."""
    assert set(typing.get_type_hints(mirror)) == {f.name for f in dataclasses.fields(cls)}
    assert cls.from_dict(cls().to_dict()) == cls()


def test_batch_form_fields_are_checked_and_canonical() -> None:
    assert LayoutOptions(dtype=np.int16).dtype == LayoutOptions(dtype=np.dtype("int16")).dtype == "int16"
    opts = LayoutOptions.from_dict({"pad_policy": "fill", "fill_value": np.int64(7), "packed": np.bool_(True)})
    assert (opts.fill_value, opts.packed, type(opts.fill_value), type(opts.packed)) == (7, True, int, bool)
    for bad, field in [({"dtype": "int64"}, "dtype"), ({"dtype": "float32"}, "dtype"), ({"pad_policy": "zero"}, "pad"),
                       ({"fill_value": 2**31}, "fill_value"), ({"fill_value": True}, "fill_value"),
                       ({"packed": 1}, "packed"), ({"packed": True, "pad_policy": "fill"}, "fill_value")]:
        with pytest.raises(LayoutOptionError, match=field):
            LayoutOptions(**bad)
    assert issubclass(LayoutOptionError, OptionError)


@pytest.fixture
def store(tmp_path: Path) -> r3store.RouteStore:
    rng = np.random.default_rng(0)
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        for i, rows in enumerate((5, 8, 3)):
            w.append(f"s{i}", np.argsort(rng.random((rows, 2, 8)), axis=-1)[..., :2])
    return r3store.open_store(tmp_path)


def test_assemble_takes_the_batch_form_in_options(store: r3store.RouteStore) -> None:
    ids = ["s0", "s1", "s2"]
    options = {"layout": "bshd", "cp_size": 2, "cp_rank": 1, "pad_policy": "fill", "fill_value": 9, "dtype": "auto"}
    batch = store.assemble(ids, options)
    assert batch["routes"].dtype == np.uint8
    assert (batch["routes"][~batch["replay_mask"]] == 9).all()
    same = assemble(store, ids, LayoutOptions(**options))
    np.testing.assert_array_equal(batch["routes"], same["routes"])
    packed = store.assemble(ids, {**options, "packed": True})
    assert packed["routes"].dtype == np.uint8
    assert packed["routes_shape"] == batch["routes"].shape


def test_loose_layout_keywords_warn_and_give_the_same_batch(store: r3store.RouteStore) -> None:
    ids = ["s0", "s1"]
    want = store.assemble(ids, {"cp_size": 2, "cp_rank": 0, "dtype": "int16"})
    old = r"RouteStore\.assemble\(cp_size=\.\.\., cp_rank=\.\.\., dtype=\.\.\.\) is deprecated .* r3store 0\.4\.0"
    with pytest.warns(R3StoreDeprecationWarning, match=old):
        got = store.assemble(ids, cp_size=2, cp_rank=0, dtype="int16")
    np.testing.assert_array_equal(got["routes"], want["routes"])
    assert got["routes"].dtype == np.int16
    new = r"use options=\{'pad_policy': \.\.\., 'fill_value': \.\.\.\}"
    with pytest.warns(R3StoreDeprecationWarning, match=r"assemble\(pad_policy=\.\.\., fill_value=\.\.\.\) .*" + new):
        filled = assemble(store, ids, {"cp_size": 2}, pad_policy="fill", fill_value=7)
    assert (filled["routes"][~filled["replay_mask"]] == 7).all()
    with pytest.warns(R3StoreDeprecationWarning), pytest.raises(LayoutOptionError, match="cp_size"):
        store.assemble(ids, {"cp_size": 4}, cp_size=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'cp_sise'"):
        store.assemble(ids, cp_sise=2)


def test_a_fill_value_the_dtype_cannot_hold_is_refused_when_the_options_are_built() -> None:
    with pytest.raises(LayoutOptionError, match="pad id does not fit the routes dtype uint8"):
        LayoutOptions(dtype="uint8", pad_policy="fill", fill_value=-1)
    assert LayoutOptions(dtype="int16", pad_policy="fill", fill_value=-1).fill_value == -1
    assert LayoutOptions(dtype="auto", pad_policy="fill", fill_value=-1).dtype == "auto"  # chosen per batch
    assert LayoutOptions(dtype="uint8", fill_value=-1).pad_policy == "spread"  # no fill rows: nothing to hold
