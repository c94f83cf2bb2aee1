"""Options shared by every command (``r3store/cli/_options.py``): layers, rows, storage options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.audit import parse_layers, parse_rows
from r3store.cli._options import is_local_url
from tests.clirun import SPEC_3X16, routes_of_16
from tests.clirun import invoke as _cli
from tests.clirun import run_cli as run


def test_parse_layers_and_rows() -> None:
    assert parse_layers("3,0-1") == [3, 0, 1]
    assert parse_rows(":4") == slice(None, 4)
    for text in ("2,1-3", "0-100000"):
        with pytest.raises(ValueError, match="layers="):
            parse_layers(text)


@pytest.mark.parametrize("option", ['config_kwargs="notadict"', "client_kwargs=3", "s3_additional_kwargs=[1]"])
def test_storage_option_that_must_be_a_mapping(option: str) -> None:
    result = _cli("inspect", "s3://bucket/x", "-o", option)
    assert result.exit_code == 2, result.output
    assert "must be a mapping" in " ".join(result.output.split()), result.output
    assert len(result.output.strip().splitlines()) <= 3  # one message (rich wraps long lines)


@pytest.mark.parametrize("command", [["inspect"], ["validate"], ["stats"], ["show", "s0"], ["gc"], ["compact"],
                                     ["diff", "{store}"]])
def test_storage_options_for_local_stores_are_refused_naming_the_key(tmp_path: Path, command: list[str]) -> None:
    """A local store takes no storage option: one given is refused, not silently ignored (new-user finding)."""
    store = tmp_path / "s"
    with r3store.RouteWriter(store, SPEC_3X16) as w:
        w.append("s0", routes_of_16(np.random.default_rng(0), 9))
    name, *rest = command
    args = [name, str(store), *(a.format(store=store) for a in rest)]
    result = run(*args, "-o", "anon=true", "-o", "profile=x")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --storage-option 'anon=true': option 'anon' is not taken by "), line
    assert "local stores take no storage options" in line
    assert run(*args).exit_code in (0, 1)  # without the option the command runs


def test_is_local_url() -> None:
    assert [is_local_url(u) for u in ("runs/s", "/abs/s", "file:///abs/s", "FILE:///s")] == [True] * 4
    assert [is_local_url(u) for u in ("s3://b/s", "memory://s", "filecache::s3://b/s", "gs://b/s")] == [False] * 4


def test_storage_options_still_go_to_a_remote_store_of_a_diff(tmp_path: Path) -> None:
    """diff of a local and a remote store: the options are for the remote one (not refused)."""
    result = run("diff", "s3://bucket/x", str(tmp_path / "nothing-here"), "-o", "bogus=1")
    assert result.exit_code == 2
    assert "unknown storage option 'bogus'" in result.stderr  # s3fs's check, not the local refusal


@pytest.mark.parametrize("command", ["inspect", "stats", "validate"])
def test_a_long_store_path_is_printed_whole_on_a_line_of_its_own_at_80_columns(tmp_path: Path, command: str) -> None:
    """The headers naming a store folded a long path at the table's width (inspect, validate) or
    mid-name at 80 columns (stats): now a header that does not fit puts the path whole on a line
    of its own, and the rest of the output still fits 80 columns."""
    path = tmp_path / "rollouts-of-a-long-running-job" / "step-000123" / "rollout-routes"
    rng = np.random.default_rng(0)
    bad = routes_of_16(rng, 6)
    bad[2, 0] = [5, 5]  # a quarantined sample: validate has a finding to head
    with r3store.RouteWriter(path, SPEC_3X16, {"on_invalid": "quarantine"}) as w:
        w.append("s0", routes_of_16(rng, 6))
        w.append("rep", bad)
    title = "r3store" if command == "inspect" else f"r3store {command}"
    result = run(command, str(path), columns=80)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(f"{title} {path}") > 80  # the case at hand
    assert lines[:2] == [title, str(path)]
    assert max(len(line) for line in lines[2:]) <= 80
    assert run(command, str(path), columns=400).stdout.splitlines()[0] == f"{title} {path}"
