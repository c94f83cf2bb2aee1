"""The public surface: __all__ lists exactly what exists, exported objects show public paths."""

from __future__ import annotations

import inspect

import pytest

import r3store
import r3store.audit
import r3store.batch
import r3store.codecs
import r3store.dataset
import r3store.errors
import r3store.layout
import r3store.reader
import r3store.storage


@pytest.mark.parametrize("module", [r3store, r3store.codecs, r3store.storage, r3store.layout, r3store.errors,
                                    r3store.audit, r3store.dataset, r3store.reader, r3store.batch])
def test_all_is_sorted_and_complete(module) -> None:
    names = module.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(module, name), f"{module.__name__}.{name} is in __all__ but missing"
    public = {n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)
              and getattr(v, "__module__", module.__name__).startswith("r3store")}
    public -= {"annotations", "Any"}
    missing = public - set(names) - {"TYPE_CHECKING"}
    assert not missing, f"public names of {module.__name__} not in __all__: {missing}"


def test_top_level_objects_report_public_module() -> None:
    for name in ("ModelSpec", "RouteWriter", "RouteReader", "RouteStore", "RouteDataset", "open_reader", "open_store"):
        assert getattr(r3store, name).__module__ == "r3store"


def test_importing_r3store_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, r3store; r3store.open_store; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_error_tree_is_rooted_in_builtins() -> None:
    builtins = (ValueError, KeyError, IndexError, OSError, RuntimeError, UserWarning)
    for name in r3store.errors.__all__:
        cls = getattr(r3store.errors, name)
        if issubclass(cls, Warning):
            assert issubclass(cls, r3store.errors.R3StoreWarning)
            continue
        assert issubclass(cls, r3store.errors.R3StoreError)
        if cls is not r3store.errors.R3StoreError:
            assert issubclass(cls, builtins), name
