"""Every command without colours (``--no-color``, ``NO_COLOR``, no terminal) says all it says in colour."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from r3store.cli import main

ANSI = re.compile(r"\x1b\[[0-9;]*m")

COMMANDS = [
    ["inspect", "{s}"],
    ["validate", "{s}"],
    ["stats", "{s}"],
    ["diff", "{s}", "{s}"],
    ["show", "{s}", "s0"],
    ["gc", "{s}"],
    ["compact", "{s}"],
]


def _run(args: list[str], store: Path, **env: str | None) -> tuple[int, str]:
    result = CliRunner().invoke(main, [a.format(s=store) for a in args], env={"COLUMNS": "160", **env})
    return result.exit_code, result.output


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_colour_adds_nothing_but_colour(small_store_dir: Path, tmp_path: Path, args: list[str]) -> None:
    stores = []
    for name in ("s1", "s2", "s3", "s4"):  # compact writes: a store each (names of one length: same wrapping)
        shutil.copytree(small_store_dir, tmp_path / name)
        stores.append(tmp_path / name)
    plain = _run(args, stores[0], FORCE_COLOR=None, NO_COLOR=None)  # CliRunner's output is no terminal
    flag = _run([*args, "--no-color"], stores[1], FORCE_COLOR="1", NO_COLOR=None)
    colour = _run(args, stores[2], FORCE_COLOR="1", NO_COLOR=None)
    no_color_env = _run(args, stores[3], FORCE_COLOR="1", NO_COLOR="1")
    assert plain[0] == flag[0] == colour[0] == no_color_env[0] == 0, (plain, colour)
    assert "\x1b" not in plain[1]
    assert "\x1b" not in flag[1]
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", no_color_env[1])  # NO_COLOR: styles such as bold at most

    def words(text: str, store: Path) -> str:  # without blanks: a long path wraps where the line ends
        return re.sub(r"\s+", "", ANSI.sub("", text)).replace(str(store), "STORE")

    want = words(plain[1], stores[0])
    if args[0] == "compact":  # names the checkpoint it wrote, with a random part
        want = re.sub(r"\S+\.checkpoint", "C", want)
    for got, store in ((flag[1], stores[1]), (colour[1], stores[2]), (no_color_env[1], stores[3])):
        text = words(got, store)
        if args[0] == "compact":
            text = re.sub(r"\S+\.checkpoint", "C", text)
        assert text == want
