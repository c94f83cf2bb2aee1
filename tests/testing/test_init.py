"""The kits of ``r3store.testing`` (``r3store/testing/__init__.py``) resolve whatever was imported first.

``r3store.testing.<Kit>`` registers the kit modules for pytest's assertion rewriting. A kit
module already imported (directly, or by the doctest collection of ``r3store/testing``)
cannot be rewritten any more, and registering it again made pytest warn
(``PytestAssertRewriteWarning``), an error under ``-W error``: ``pytest r3store/testing
tests/test_deprecated.py::test_store_tests_alias_takes_a_store_fixture`` failed, the same
test alone passed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ORDER_TEST = '''
import pytest

import r3store.testing.backend  # imported before any kit is looked up: not rewritten
import r3store.testing.layout

import r3store.testing


def test_kits_after_their_modules() -> None:
    with pytest.deprecated_call(match="StoreTests"):
        kit = r3store.testing.StoreTests
    assert issubclass(kit, r3store.testing.BackendTests)
    assert r3store.testing.LayoutParity is r3store.testing.layout.LayoutParity
'''


def test_kits_resolve_after_their_modules_were_imported(tmp_path: Path) -> None:
    pytest.importorskip("hypothesis")  # the kits' own dependency
    (tmp_path / "test_order.py").write_text(ORDER_TEST)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-W", "error", "test_order.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
