"""``r3store.megatron`` is torch-only at import: megatron-core is imported on first call, and
``import r3store`` does not import the package at all."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_importing_r3store_megatron_imports_no_megatron_core() -> None:
    pytest.importorskip("torch")
    code = ("import sys, r3store\n"
            "assert 'r3store.megatron' not in sys.modules\n"
            "import r3store.megatron\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'megatron')\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
