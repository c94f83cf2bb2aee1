"""``examples/trl_grpo_r3.py`` refuses an output folder whose ``r3-routes`` holds an earlier run's
routes (a rerun would add to the same store), before anything is written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_r3.py"


def test_a_rerun_into_the_same_folder_is_refused(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("trl_grpo_r3", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "r3-routes").mkdir()
    (tmp_path / "r3-routes" / "r3store.json").write_text("{}")
    with pytest.raises(FileExistsError, match="earlier run"):
        module.run(str(tmp_path), steps=1)
    assert not (tmp_path / "tiny-model").exists()  # nothing written
