"""``r3store demo`` (``r3store/cli/_demo.py``): bad process counts are one-line usage errors (exit 2),
refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clirun import run_cli as run


@pytest.mark.parametrize(("option", "value"), [("--writers", "0"), ("--writers", "33"), ("--loader-workers", "-1")])
def test_a_bad_count_is_a_one_line_error_and_writes_nothing(tmp_path: Path, option: str, value: str) -> None:
    target = tmp_path / "demo"
    result = run("demo", option, value, str(target))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error:")
    assert option in line
    assert not target.exists()  # nothing was written
