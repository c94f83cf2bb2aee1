"""Issue 22 item 3: one escaping rule for every byte of user data the CLI prints.

``r3store show`` printed control characters of sample ids raw in its title (an id like
``"\\x1b]0;pwned\\x07"`` set the terminal title, ``"\\x1b[2J"`` cleared the screen). Every
command, with and without ``--json``, now prints no character Python does not call
printable (C0/C1 controls, DEL, bidirectional overrides) other than its own line breaks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.cli._options import printable
from tests.clirun import run_cli

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)
HOSTILE = ["\x1b]0;pwned\x07", "\x1b[2J", "c1\x9b31m", "bidi\u202eevil", "nl\nx\ry", "del\x7f", "nul\x00", "bell\x07"]


def _routes(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.stack([rng.permutation(16)[:2] for _ in range(2)]) for _ in range(rows)]).astype(np.int32)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    for root, shift in ((a, 0), (b, 1)):
        with r3store.RouteWriter(root, SPEC, config={"on_invalid": "quarantine"}) as w:
            for i, sid in enumerate(HOSTILE):
                w.append(sid, _routes(5, i + shift), metadata={"note": f"\x1b[31m{sid}", "step": i})
            bad = _routes(4, 99)
            bad[1, 0] = [3, 3]
            w.append("\x1b[2Jquarantined", bad, metadata={"note": "\x9b2J"})
    (a / "routes" / "x-00000").mkdir()  # an uncommitted leftover for gc
    (a / "routes" / "x-00000" / "zarr.json").write_text("{}")
    return a, b


def _clean(text: str) -> list[str]:
    """The characters of ``text`` that could drive a terminal (anything not printable but its line breaks)."""
    return sorted({repr(c) for c in text if not c.isprintable() and c != "\n"})


def _commands(a: Path, b: Path) -> list[list[str]]:
    url, other = str(a), str(b)
    out = []
    for args in (["inspect", url], ["validate", url], ["stats", url], ["diff", url, other], ["gc", url],
                 ["compact", url]):
        out += [args, [*args, "--json"]]
    for sid in [*HOSTILE, "\x1b[2Jquarantined", "\x1b]0;missing\x07"]:
        out += [["show", url, sid], ["show", url, sid, "--json"]]
    out.append(["show", url, HOSTILE[0], "--layers", "\x1b[2J"])
    return out


def test_no_command_prints_a_raw_control_character(stores: tuple[Path, Path]) -> None:
    for args in _commands(*stores):
        result = run_cli(*args, columns=80)
        assert result.exit_code in (0, 1, 2), (args, result.output)
        assert _clean(result.stdout) == [], (args, result.stdout)
        assert _clean(result.stderr) == [], (args, result.stderr)


def test_show_title_escapes_the_id(stores: tuple[Path, Path]) -> None:
    result = run_cli("show", str(stores[0]), "\x1b]0;pwned\x07", columns=200)
    assert result.exit_code == 0
    assert result.stdout.startswith("\\x1b]0;pwned\\x07: 6")


def test_the_escaping_rule() -> None:
    assert printable("plain id-1 ünï [x]") == "plain id-1 ünï [x]"
    assert printable("\x1b[2J\x9b\u202e\x7f\n") == "\\x1b[2J\\x9b\\u202e\\x7f\\n"
    assert printable("a\nb", keep="\n") == "a\nb"
