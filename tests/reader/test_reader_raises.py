"""Every error a bad input makes ``get``, ``get_many``, ``read_rows`` and ``assemble`` raise is
named in the ``Raises`` section of that function's docstring (the class raised or one of its
bases). New-user finding: ``RouteReader.get`` raised a plain ``TypeError`` for ``rows=5`` that
its docstring did not list, and ``get_many`` listed no error at all.

The inputs run on a real store with a corrupted frame (``r3store.testing.faults``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.batch import assemble
from r3store.errors import (
    AlignmentError,
    ChecksumError,
    FormatError,
    LayerError,
    LayoutOptionError,
    OptionError,
    RangeError,
    SampleNotFoundError,
    UnknownLayoutOptionError,
)
from r3store.reader import RouteReader
from r3store.testing.faults import FaultyStore, write_faulty_store


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> FaultyStore:
    return write_faulty_store(tmp_path_factory.mktemp("raises") / "faulty", clean_samples=6)


def raises_section(func: Callable[..., Any]) -> set[str]:
    """The class names a numpydoc ``Raises`` section lists (``r3store.errors.X`` as ``X``)."""
    doc = inspect.getdoc(func) or ""
    assert "\nRaises\n------\n" in doc, f"{func.__qualname__} has no Raises section"
    section = doc.split("\nRaises\n------\n", 1)[1]
    names: set[str] = set()
    for line in section.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            continue  # a description
        if not line[0].isalpha() or line.endswith(("-", ":")):
            break  # the next section
        names.update(n.strip().rsplit(".", 1)[-1] for n in line.split(","))
    return names


CASES: list[tuple[str, str, type[BaseException], Callable[[r3store.RouteStore, FaultyStore], Any]]] = [
    ("get", "rows not a slice", TypeError, lambda s, f: s.get("dup", rows=5)),
    ("get", "rows a tuple", TypeError, lambda s, f: s.get("dup", rows=(0, 2))),
    ("get", "rows with a float bound", RangeError, lambda s, f: s.get("dup", rows=slice(0.5, 2))),
    ("get", "rows past the end", RangeError, lambda s, f: s.get("dup", rows=slice(0, 99))),
    ("get", "layers an int", TypeError, lambda s, f: s.get("dup", 2)),
    ("get", "layers holding a str", TypeError, lambda s, f: s.get("dup", ["a"])),
    ("get", "a layer twice", LayerError, lambda s, f: s.get("dup", [1, 1])),
    ("get", "a dense layer", LayerError, lambda s, f: s.get("dup", [99])),
    ("get", "sample_id not a str", TypeError, lambda s, f: s.get(5)),
    ("get", "no such sample", SampleNotFoundError, lambda s, f: s.get("nope")),
    ("get", "out a list", OptionError, lambda s, f: s.get("dup", out=[1])),
    ("get", "out unsigned", OptionError, lambda s, f: s.get("dup", out=np.zeros((5, 4, 2), np.uint8))),
    ("get", "a corrupted frame", ChecksumError, lambda s, f: s.get(f.corrupt)),
    ("get_many", "an id not a str", TypeError, lambda s, f: s.get_many(["dup", 5])),
    ("get_many", "not iterable", TypeError, lambda s, f: s.get_many(None)),
    ("get_many", "no such sample", SampleNotFoundError, lambda s, f: s.get_many(["dup", "nope"])),
    ("get_many", "a dense layer", LayerError, lambda s, f: s.get_many(["dup"], [99])),
    ("get_many", "a corrupted frame", ChecksumError, lambda s, f: s.get_many([f.corrupt])),
    ("read_rows", "start negative", OptionError, lambda s, f: s.read_rows(_array(s, "dup"), -1, 2, [0])),
    ("read_rows", "stop before start", OptionError, lambda s, f: s.read_rows(_array(s, "dup"), 3, 2, [0])),
    ("read_rows", "no committed array", FormatError, lambda s, f: s.read_rows("routes/x", 0, 2, [0])),
    ("read_rows", "past the array's end", FormatError, lambda s, f: s.read_rows(_array(s, "dup"), 0, 10**6, [0])),
    ("read_rows", "out of the wrong shape", OptionError,
     lambda s, f: s.read_rows(_array(s, "dup"), 0, 2, [0], out=np.zeros((3, 1, 2), np.int32))),
    ("read_rows", "a corrupted frame", ChecksumError, lambda s, f: s.read_rows(_array(s, f.corrupt), 0, 8, [0])),
    ("assemble", "a single str", TypeError, lambda s, f: assemble(s, "dup")),
    ("assemble", "an id not a str", TypeError, lambda s, f: assemble(s, ["dup", 5])),
    ("assemble", "not iterable", TypeError, lambda s, f: assemble(s, None)),
    ("assemble", "no ids", OptionError, lambda s, f: assemble(s, [])),
    ("assemble", "no such sample", SampleNotFoundError, lambda s, f: assemble(s, ["nope"])),
    ("assemble", "options not options", LayoutOptionError, lambda s, f: assemble(s, ["dup"], 5)),  # type: ignore[arg-type]
    ("assemble", "an unknown option", UnknownLayoutOptionError, lambda s, f: assemble(s, ["dup"], {"cp": 2})),
    ("assemble", "a sample over max_seqlen", LayoutOptionError,
     lambda s, f: assemble(s, ["dup"], {"layout": "bshd", "max_seqlen": 2})),
    ("assemble", "a bad dtype", LayoutOptionError, lambda s, f: assemble(s, ["dup"], {"dtype": "float32"})),
    ("assemble", "layers an int", TypeError, lambda s, f: assemble(s, ["dup"], layers=2)),  # type: ignore[arg-type]
    ("assemble", "a dense layer", LayerError, lambda s, f: assemble(s, ["dup"], layers=[99])),
    ("assemble", "tokens that do not match", AlignmentError, lambda s, f: assemble(s, ["dup"], tokens=[[1, 2]])),
    ("assemble", "a corrupted frame", ChecksumError, lambda s, f: assemble(s, [f.corrupt])),
    ("RouteStore.assemble", "a single str", TypeError, lambda s, f: s.assemble("dup")),
    ("RouteStore.assemble", "an id not a str", TypeError, lambda s, f: s.assemble(["dup", 5])),
    ("RouteStore.assemble", "return_tensors", OptionError, lambda s, f: s.assemble(["dup"], return_tensors="tf")),
    ("RouteStore.assemble", "an unknown option", UnknownLayoutOptionError, lambda s, f: s.assemble(["dup"], {"cp": 2})),
    ("RouteStore.assemble", "a dense layer", LayerError, lambda s, f: s.assemble(["dup"], layers=[0])),
    ("RouteStore.assemble", "a corrupted frame", ChecksumError, lambda s, f: s.assemble([f.corrupt])),
]

FUNCS: dict[str, Callable[..., Any]] = {"get": RouteReader.get, "get_many": RouteReader.get_many,
                                        "read_rows": RouteReader.read_rows, "assemble": assemble,
                                        "RouteStore.assemble": r3store.RouteStore.assemble}


def _array(store: r3store.RouteStore, sample_id: str) -> str:
    return str(store.row(sample_id)["array"])


@pytest.mark.parametrize(("func", "case", "error", "call"), CASES, ids=[f"{f}: {c}" for f, c, _, _ in CASES])
def test_each_error_a_bad_input_raises_is_listed_in_the_docstring(faulty: FaultyStore, func: str, case: str,
                                                                   error: type[BaseException],
                                                                   call: Callable[..., Any]) -> None:
    store = r3store.open_store(faulty.url, reader={"on_duplicate": "first", "cache_bytes": 0})
    with pytest.raises(error) as info:
        call(store, faulty)
    listed = raises_section(FUNCS[func])
    named = [cls.__name__ for cls in type(info.value).__mro__ if cls.__name__ in listed]
    assert named, f"{func} raised {type(info.value).__name__} ({info.value}) for {case}; its Raises lists {listed}"


def test_the_dense_layer_of_the_faulty_spec_is_not_stored(faulty: FaultyStore) -> None:
    assert 0 not in faulty.spec.moe_layers  # the LayerError cases above
    assert 99 not in faulty.spec.moe_layers
