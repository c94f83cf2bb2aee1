"""The CLI prints data verbatim (never as rich markup) and maps r3store errors to exit 2, one line.

Sample ids, paths, commit names, quarantine reasons and exception texts are data: a
sample id ``[/]`` once crashed ``show`` with rich's ``MarkupError``, ``[bold]x`` was shown
as ``x``, botocore's "Invalid bucket name" text (which quotes a regex with ``[/:]``)
crashed ``inspect``, and the missing-extra hint lost its ``[s3]``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

import r3store
from r3store._format import load_schema
from r3store.cli import main
from r3store.cli._main import COMMANDS
from r3store.errors import NotAStoreError, R3StoreError
from r3store.testing.s3 import ACCESS_KEY, REGION, SECRET_KEY, s3_bucket, s3_server, s3_storage_options, s3_url  # noqa: F401 - pytest fixtures
from tests.clirun import invoke as _cli
from tests.clirun import run_cli as run
from tests.routes import rewrite_table, set_column

SPEC = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])
ODD_IDS = ("[/]", "[bold]x", "plain[red]", "a[/:]b")


def routes_of(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2].astype(np.int32)


def flat(text: str) -> str:
    """``text`` without whitespace (a long title may wrap)."""
    return "".join(text.split())


@pytest.fixture
def odd(tmp_path: Path) -> Path:
    """A store in a folder named with markup, holding samples whose ids are markup; one quarantined."""
    path = tmp_path / "run[/]x [bold]y"
    rng = np.random.default_rng(0)
    rep = routes_of(rng, 6)
    rep[3, 0] = [5, 5]
    with r3store.RouteWriter(path, SPEC, config={"on_invalid": "quarantine"}) as w:
        for sid in ODD_IDS:
            w.append(sid, routes_of(rng, 6))
        w.append("[red]rep[/red]", rep)
    return path


@pytest.mark.parametrize("sample_id", ODD_IDS)
def test_show_prints_markup_like_sample_ids_verbatim(odd: Path, sample_id: str) -> None:
    result = run("show", str(odd), sample_id)
    assert result.exit_code == 0, result.output
    assert sample_id in result.stdout
    assert str(odd) not in result.stderr


def test_show_quarantined_title_and_cells_verbatim(odd: Path) -> None:
    result = run("show", str(odd), "[red]rep[/red]")
    assert result.exit_code == 0, result.output
    assert "[red]rep[/red]" in result.stdout
    assert "quarantined" in result.stdout
    assert "5,5" in result.stdout


def test_inspect_validate_stats_print_paths_and_ids_verbatim(odd: Path) -> None:
    inspected = run("inspect", str(odd))
    assert inspected.exit_code == 0
    assert flat(str(odd)) in flat(inspected.stdout)
    validated = run("validate", str(odd), "--strict")  # its only findings are a quarantined sample's
    assert validated.exit_code == 1, validated.output
    assert "[red]rep[/red]" in validated.stdout
    assert flat(str(odd)) in flat(validated.stdout)
    stats = run("stats", str(odd))
    assert stats.exit_code == 0
    assert flat(str(odd)) in flat(stats.stdout)


def test_diff_prints_ids_only_in_one_store_verbatim(odd: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    with r3store.RouteWriter(other, SPEC) as w:
        w.append("[/]", r3store.open_store(odd).get("[/]"))
    result = run("diff", str(odd), str(other))
    assert result.exit_code == 0, result.output
    assert "[bold]x" in result.stdout
    assert "plain[red]" in result.stdout


def test_error_text_with_markup_is_one_verbatim_line_exit_2(tmp_path: Path) -> None:
    where = tmp_path / "no[/:]store [bold]here"
    where.mkdir(parents=True)
    result = run("inspect", str(where))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: NotAStoreError: ")
    assert str(where) in lines[0]


def test_error_lines_are_one_line_even_when_wrapped_or_multiline(tmp_path: Path) -> None:
    where = tmp_path / ("x" * 150)
    where.mkdir()
    result = run("validate", str(where), columns=40)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_missing_extra_hint_keeps_its_brackets(monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec.registry  # noqa: F401 - the module, whose _registry caches loaded classes

    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if s3fs were not installed
    for protocol in ("s3", "s3a"):  # forget the class an earlier test may have loaded
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)
    result = run("inspect", "s3://bucket/store")
    assert result.exit_code == 2
    assert "pip install 'r3store[s3]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.s3
def test_botocore_message_with_regex_brackets_does_not_crash(s3_storage_options: dict[str, Any]) -> None:  # noqa: F811
    endpoint = s3_storage_options["client_kwargs"]["endpoint_url"]
    opts = ["-o", f"key={ACCESS_KEY}", "-o", f"secret={SECRET_KEY}", "-o", f"endpoint_url={endpoint}",
            "-o", f"region_name={REGION}"]
    result = run("inspect", "s3://not a valid bucket!/store", *opts)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert "[/:]" in line


@click.command()
def boom() -> None:
    """A command without handle_errors that fails with an r3store error whose text is markup."""
    raise NotAStoreError("mem://[bold]x[/]", "no r3store.json\nsecond line [/:]")


def test_group_maps_every_r3store_error_to_one_line_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Errors that escape a command's own handler (callbacks, undecorated commands) are still mapped."""
    monkeypatch.setitem(COMMANDS, "boom", (__name__, "A failing command."))
    result = CliRunner().invoke(main, ["boom"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("error: NotAStoreError: mem://[bold]x[/] is not an r3store store: no r3store.json "
                                     "second line [/:]")


def test_cli_over_a_forged_store_is_one_line(small_store_dir: Path) -> None:
    rewrite_table(small_store_dir, lambda t: set_column(t, "num_tokens", [2**45] * t.num_rows))
    for command in (["inspect"], ["validate"], ["stats"], ["show", "--", "s0"]):
        args = [command[0], str(small_store_dir), *command[1:]]
        result = _cli(*args)
        if command[0] == "show":
            assert result.exit_code == 2, (command, result.output)
            assert "FormatError" in result.output, (command, result.output)
        else:  # the audits open the store and report the table (a damaged_table finding)
            assert result.exit_code == 1, (command, result.output)
            assert "damaged_table" in result.output, (command, result.output)
            assert "num_tokens" in result.output, (command, result.output)
        assert not isinstance(result.exception, R3StoreError)  # handled, not raised


@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)])  # every command, compact included
def test_help_imports_neither_numpy_pyarrow_zarr_nor_torch(command: list[str]) -> None:
    code = (f"import sys\nfrom r3store.cli import main\ntry:\n    main({[*command, '--help']!r})\nexcept SystemExit:\n"
            "    pass\n"
            "print(sorted(m for m in ('numpy', 'pyarrow', 'zarr', 'torch', 'r3store.reader', 'r3store.writer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_every_json_command_has_a_shipped_schema() -> None:
    import importlib

    from r3store.cli._main import COMMANDS

    with_json = [name for name, (module, _) in COMMANDS.items()
                 if any(p.name == "as_json" for p in getattr(importlib.import_module(module), name).params)]
    assert "compact" in with_json
    for name in with_json:
        schema = load_schema(f"cli-{name}")
        assert schema["title"] == f"r3store {name} --json", name
        jsonschema.validators.validator_for(schema).check_schema(schema)


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small"
    with r3store.RouteWriter(path, SPEC) as w:
        w.append("s0", routes_of(np.random.default_rng(3), 9))
    return path


@pytest.mark.parametrize(("args", "line"), [
    (["show", "{store}", "s0", "--rows", "5:2"], "error: --rows '5:2': empty row range"),
    (["show", "{store}", "s0", "--layers", "2,x"], "error: --layers '2,x': "),
    (["demo", "{full}"], "error: DIRECTORY '{full}': not empty"),
    (["stats", "{store}", "--plot", "{tmp}/no/such/folder/x.png"], "error: --plot '{tmp}/no/such/folder/x.png': "
                                                                    "its folder does not exist"),
    (["stats", "{store}", "--plot", "{tmp}/x.gif"], "error: --plot '{tmp}/x.gif': cannot tell the image format"),
    (["stats", "{store}", "--plot-size", "3x3"], "error: --plot-size '3x3': expected WIDTHxHEIGHT"),
    (["stats", "{store}", "--limit", "-1"], "error: Invalid value for '--limit': -1 is not in the range x>=0"),
    (["validate", "{store}", "--grace", "soon"], "error: --grace 'soon': expected a duration"),
    (["gc", "{store}", "--older-than", "soon"], "error: --older-than 'soon': expected a duration"),
    (["inspect", "{store}", "-o", "novalue"], "error: --storage-option 'novalue': expected key=value"),
])
def test_bad_values_are_one_line_naming_option_value_and_fault(small: Path, tmp_path: Path, args: list[str],
                                                               line: str) -> None:
    """A bad value gets one line (no click usage block), exit 2 (new-user finding)."""
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    names = {"store": str(small), "full": str(full), "tmp": str(tmp_path)}
    result = run(*(a.format(**names) for a in args))
    assert result.exit_code == 2, result.output
    (got,) = result.stderr.strip().splitlines()
    assert got.startswith(line.format(**names)), got
    assert "Usage:" not in result.output
    assert (full / "keep.txt").read_text() == "x"  # demo refused before touching anything


def test_plot_without_matplotlib_is_one_line_before_the_scan(small: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    result = run("stats", str(small), "--plot", str(tmp_path / "x.png"))
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --plot needs matplotlib")
    assert line.endswith("pip install 'r3store[plot]'")
    assert result.stdout == ""


@pytest.mark.parametrize("args", [["stats"], ["stats", "{store}", "--bogus"], ["nosuchcommand"]])
def test_missing_arguments_and_unknown_options_keep_clicks_usage(small: Path, args: list[str]) -> None:
    result = run(*(a.format(store=str(small)) for a in args))
    assert result.exit_code == 2
    assert "Usage:" in result.stderr


@pytest.mark.parametrize("args", [["show", "{store}", "s0", "--rows", "0:"], ["show", "{store}", "s0", "--json"],
                                  ["stats", "{store}"]])
def test_closed_output_pipe_exits_0_quietly(tmp_path: Path, args: list[str]) -> None:
    """New-user finding: ``r3store stats s | head -3`` exited 1 (rich's broken-pipe handler)."""
    from tests.routes import make_store

    make_store(tmp_path / "s", n=1, rows=6000)  # far more output than a pipe buffer holds
    cmd = [sys.executable, "-m", "r3store.cli", *(a.format(store=tmp_path / "s") for a in args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # what head does after its lines
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err == b""


def test_python_dash_m_r3store_runs_the_command_line() -> None:
    """``python -m r3store`` is the ``r3store`` command (new-user finding: no ``__main__``)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "r3store", "--version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("r3store ")
    bad = subprocess.run([sys.executable, "-m", "r3store", "inspect"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert "Usage: r3store inspect" in bad.stderr
