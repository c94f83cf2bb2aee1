"""Test helper: run the ``r3store`` command in-process, and check its ``--json`` output.

Imported by the CLI test modules as ``tests.clirun`` (the suite runs from the repository root, as ``tests.fuzz`` does).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
from click.testing import CliRunner, Result

from r3store._format import load_schema
from r3store.cli import main

__all__ = ["checked_json", "run_cli"]


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
