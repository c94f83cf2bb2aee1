"""``r3store demo`` (``r3store/cli/_demo.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.clirun import run_cli as run


def test_demo_without_torch_prints_an_install_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import fails as if torch were not installed
    result = run("demo", str(tmp_path / "demo"))
    assert result.exit_code == 2
    assert "pip install 'r3store[torch]'" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "demo").exists()  # nothing was written
