"""Short runs of the command-line fuzzer (``cli.py``): random hostile command lines of every
subcommand exit 0, 1 or 2 without a traceback, print no raw control character, and their
``--json`` output matches the shipped schema; a closed standard output ends a command quietly.
The long campaign: ``python -m tests.fuzz.cli --seconds 600``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz import cli  # noqa: E402


def test_short_run_of_hostile_command_lines_finds_nothing() -> None:
    report = cli.commands(seed=1, cases=60)
    assert report["failures"] == [], report["failures"]
    codes = {label.split()[-1] for label in report["outcomes"]}
    assert {"0", "2"} <= codes  # commands that ran and commands refused


def test_commands_into_a_closed_pipe_end_quietly() -> None:
    report = cli.pipes(limit=2)
    assert report["failures"] == [], report["failures"]


def test_the_oracle_sees_json_that_breaks_its_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    with cli.stores() as urls:
        assert cli.check(["inspect", urls["hostile"], "--json"]) == "inspect 0"
        monkeypatch.setattr(cli, "load_schema", lambda name: {"type": "object", "required": ["no-such-key"]})
        with pytest.raises(AssertionError, match="does not match its schema"):
            cli.check(["inspect", urls["hostile"], "--json"])
