"""Test helper: run the ``r3store`` command in-process, and check its ``--json`` output.

Imported by the CLI test modules as ``tests.clirun`` (the suite runs from the repository root, as ``tests.fuzz`` does).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from click.testing import CliRunner, Result

import r3store
from r3store._format import load_schema
from r3store.cli import main
from tests.routes import SPEC_4X16, make_store, routes_4x16

__all__ = ["SPEC_3X16", "SPEC_4X16", "SPEC_13X128", "body_rows", "check_80", "checked_json", "invoke",
           "leave_uncommitted", "make_store", "routes_4x16", "routes_of_16", "routes_of_128", "run_cli"]

SPEC_3X16 = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])

SPEC_13X128 = r3store.ModelSpec(num_layers=13, num_experts=128, top_k=8, moe_layers=range(1, 13))


def run_cli(*args: str, columns: int = 240) -> Result:
    """Invoke ``r3store ARGS...`` with click's ``CliRunner`` at a terminal ``columns`` wide.

    Returns the click ``Result`` (``exit_code``, ``stdout``, ``stderr``). An exception other
    than ``SystemExit`` escaping the command is re-raised, so a traceback fails the test
    instead of reading as exit status 1.
    """
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": str(columns)})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def checked_json(result: Result, command: str) -> dict[str, Any]:
    """The ``--json`` document of ``result``, validated against the shipped ``cli-<command>`` schema.

    Raises
    ------
    json.JSONDecodeError
        stdout is not JSON.
    jsonschema.ValidationError
        The document does not match the schema.
    """
    doc: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(doc, load_schema(f"cli-{command}"))
    return doc


def invoke(*args: str) -> Any:
    """Invoke ``r3store ARGS...`` with a plain ``CliRunner`` (no terminal width set, exceptions caught)."""
    return CliRunner().invoke(main, list(args))


def body_rows(text: str) -> list[list[str]]:
    """The body lines of the rich tables in ``text``, split into cells."""
    return [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]


def check_80(result: Result) -> str:
    """``result``'s stdout, after checking it exited 0 or 1 with no line over 80 columns and nothing cut."""
    assert result.exit_code in (0, 1), result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.stdout  # nothing cut
    return result.stdout


def routes_of_16(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Valid int32 routes ``(rows, 2, 2)`` for ``SPEC_3X16``."""
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2].astype(np.int32)


def routes_of_128(rng: np.random.Generator, rows: int, layers: int = 12) -> np.ndarray:
    """Valid int32 routes ``(rows, layers, 8)`` for ``SPEC_13X128``."""
    return np.argsort(rng.random((rows, layers, 128)), axis=-1)[..., :8].astype(np.int32)


def leave_uncommitted(path: Path, age_s: float = 0.0) -> str:
    """Write a commit and delete its sample table: what a writer leaves while (or after) committing."""
    with r3store.RouteWriter(path, SPEC_13X128) as w:
        w.append(f"left-{age_s}", routes_of_128(np.random.default_rng(1), 5))
    (commit,) = w.commits
    next((path / "index").rglob(f"{commit}.parquet")).unlink()
    if age_s:
        then = time.time() - age_s
        for p in (path / "routes" / commit).rglob("*"):
            os.utime(p, (then, then))
    return commit
