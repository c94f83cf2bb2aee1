"""The ``r3store`` command line with hostile arguments and stores (seeded, no mutation engine).

commands
    Random command lines of every subcommand (``inspect``, ``show``, ``stats``, ``validate``,
    ``diff``, ``compact``, ``gc``, ``demo``'s argument checks) run in-process with click's
    runner: sample ids (unicode, control characters, newlines, 4,096 and 10,000 characters, empty,
    option-like), row ranges, layer lists, limits, globs, durations, plot sizes, storage
    options and URLs (a store of hostile ids, the golden stores ``v3-ckpt2`` and ``v3-set``,
    a store with a changed byte in a storage object, one with a damaged checkpoint, an empty
    folder, a file, a folder that does not exist). Oracle: no exception escapes but
    ``SystemExit``, no ``Traceback`` in the output, exit status 0, 1 or 2, exit status 2 comes
    with an error line on stderr, no raw control character printed, and every ``--json``
    output of status 0 or 1 parses and matches its ``r3store/_schema/cli-<command>`` schema
    (``validate``'s ``"ok"`` true exactly when it exits 0).
pipes
    Each subcommand as a separate process whose standard output is closed before it writes:
    it must end with status 0 and no traceback.

``python -m tests.fuzz.cli --cases 2000 --seed 3`` runs both and prints one JSON line each.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from click.testing import CliRunner

import r3store
from r3store._format import load_schema
from r3store.cli import main as cli_main

__all__ = ["commands", "pipes", "stores"]

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "stores"
SPEC = r3store.ModelSpec(num_layers=3, num_experts=16, top_k=2, moe_layers=[1, 2])
IDS = ["plain", "ünïcödé-漢字-😀", "nl\nid", "tab\tid", "\x1b[2J", "-", "--json", " ", "a" * 4096,
       "../../etc/passwd", "%s%n", "id with spaces", "\u202eevil", "x\x00y", "step-1/prompt-0/sample-0"]
"""Sample ids written to the hostile store (the longest a writer takes: 4096 bytes)."""
ASKED = [*IDS, "", "a" * 10_000, "never-written", "bad", "a0", "b0", "\udcff", "A" * 100_000, "*", "[", "\n"]
ROWS = ["0:1", "0:", ":3", "3:1", "-1:", "-5:-2", "1:1", "0:0", "::", "a:b", "", " ", "1e3:", "0:99999999999999999999",
        "99999999999999999999:", "5", "0:1:2", "\uff11:\uff12", "0x1:0x3", "+1:+2", "\n", "2:", ":-1"]
LAYERS = ["1", "2", "1,2", "0", "3", "99", "-1", "2-1", "1-2", "1,,2", "", ",", "1-", "-", "a", "\uff11", "1 , 2",
          "0-2", "1,1", "9" * 30, "\x1b[2J"]
NUMBERS = ["0", "1", "2", "-1", "10", "99999999999999999999", "1.5", "", "x", "1e3", " 3"]
DURATIONS = ["0", "1s", "5m", "2h", "3d", "-5s", "1y", "", "s", "999999999999999999d", "1.5h", "nan", "inf", "1 h"]
GLOBS = ["*", "step-*", "[", "[!a]*", "**", "\n", "", "?", "ünï*", "a" * 5000]
SIZES = ["800x600", "0x0", "1x1", "-1x5", "x", "99999x99999", "800", "800X600", "a x b"]
OPTIONS = ["anon=true", "a", "=b", "k=", "key=value", "x=1=2", "endpoint_url=http://127.0.0.1:1"]


def _routes(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 2, 16)), axis=-1)[..., :2].astype(np.int32)


@contextmanager
def stores() -> Iterator[dict[str, str]]:
    """The stores and non-stores the command lines point at (copies: compact and gc write)."""
    root = Path(tempfile.mkdtemp(prefix="r3-cli-fuzz-"))
    try:
        rng = np.random.default_rng(0)
        hostile = root / "hostile"
        with r3store.RouteWriter(hostile, SPEC, config={"on_invalid": "quarantine", "chunk_rows": 4}) as w:
            for i, sid in enumerate(IDS):
                w.append(sid, _routes(rng, 1 + i % 7), metadata={"step": i, "note": f"\x1b[31m{sid[:20]}"})
            bad = _routes(rng, 4)
            bad[1, 0] = [3, 3]
            w.append("bad", bad)
        (hostile / "routes" / "x-00000").mkdir()
        (hostile / "routes" / "x-00000" / "zarr.json").write_text("{}")
        other = root / "other"
        with r3store.RouteWriter(other, SPEC) as w:
            for i, sid in enumerate(IDS[:8]):
                w.append(sid, _routes(rng, 1 + i % 7))
        found = {"hostile": hostile, "other": other}
        for name in ("v3-ckpt2", "v3-set", "v2-odd"):
            shutil.copytree(FIXTURES / name, root / name)
            found[name] = root / name
        corrupt = root / "corrupt"
        shutil.copytree(FIXTURES / "v3-ckpt2", corrupt)
        obj = next(p for p in sorted((corrupt / "routes").rglob("0")) if p.is_file())
        data = bytearray(obj.read_bytes())
        data[len(data) // 3] ^= 0x40
        obj.write_bytes(bytes(data))
        found["corrupt"] = corrupt
        damaged = root / "damaged-ckpt"
        shutil.copytree(FIXTURES / "v3-ckpt2", damaged)
        ckpt = next((damaged / "index").glob("*.checkpoint"))
        data = bytearray(ckpt.read_bytes())
        data[len(data) // 2] ^= 0x01
        ckpt.write_bytes(bytes(data))
        found["damaged-ckpt"] = damaged
        (root / "empty").mkdir()
        found["empty"] = root / "empty"
        (root / "afile").write_bytes(b"not a store")
        found["afile"] = root / "afile"
        found["missing"] = root / "does-not-exist"
        yield {k: str(v) for k, v in found.items()} | {"relative-dots": str(root / "hostile" / ".." / "hostile"),
                                                         "file-url": f"file://{hostile}"}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _maybe(rng: random.Random, p: float, *args: str) -> list[str]:
    return list(args) if rng.random() < p else []


def command_line(rng: random.Random, urls: dict[str, str]) -> list[str]:
    """One random command line."""
    url = urls[rng.choice(list(urls))] if rng.random() < 0.9 else rng.choice(["", "-", "s3://", "::", "\x00"])
    cmd = rng.choice(["inspect", "show", "stats", "validate", "diff", "compact", "gc", "show", "show", "demo"])
    scan = [*_maybe(rng, 0.3, "--sample-filter", rng.choice(GLOBS)), *_maybe(rng, 0.3, "--limit", rng.choice(NUMBERS)),
            *_maybe(rng, 0.2, "--workers", rng.choice(NUMBERS))]
    common = [*_maybe(rng, 0.5, "--json"), *_maybe(rng, 0.1, "-o", rng.choice(OPTIONS))]
    if cmd == "show":
        if rng.random() < 0.6:  # mostly ids the store holds, so that the row and layer checks run
            url, asked = urls["hostile"], rng.choice(IDS)
        else:
            asked = rng.choice(ASKED)
        args = ["show", url, asked, *_maybe(rng, 0.5, "--rows", rng.choice(ROWS)),
                *_maybe(rng, 0.4, "--layers", rng.choice(LAYERS))]
    elif cmd == "stats":
        args = ["stats", url, *scan, *_maybe(rng, 0.3, "--top", rng.choice(NUMBERS)),
                *_maybe(rng, 0.1, "--plot-size", rng.choice(SIZES))]
    elif cmd == "validate":
        args = ["validate", url, *scan, *_maybe(rng, 0.3, "--grace", rng.choice(DURATIONS)),
                *_maybe(rng, 0.3, "--strict")]
    elif cmd == "diff":
        args = ["diff", url, urls[rng.choice(list(urls))], *scan, *_maybe(rng, 0.1, "--plot-size", rng.choice(SIZES))]
    elif cmd == "gc":
        args = ["gc", url, *_maybe(rng, 0.5, "--older-than", rng.choice(DURATIONS)), *_maybe(rng, 0.2, "--delete")]
    elif cmd == "demo":  # argument checks only: a value that passes would start the whole job
        bad = rng.choice(["0", "-1", "x", "", "99999999999999999999", "1.5"])
        return ["demo", urls["afile"], rng.choice(["--writers", "--loader-workers"]), bad]
    else:
        args = [cmd, url]
    if rng.random() < 0.05:  # an unknown option or a missing argument
        args = rng.choice([[*args, "--no-such-option"], args[:1], [*args, "extra-arg"]])
    return [*args, *common]


def _controls(text: str) -> list[str]:
    return sorted({repr(c) for c in text if not c.isprintable() and c != "\n"})


def check(args: list[str]) -> str:
    """Run one command line in-process; an outcome label, or AssertionError naming the fault."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # warnings go to stderr as text; not the oracle's concern
        result = CliRunner().invoke(cli_main, args, env={"COLUMNS": "100"})
    what = f"r3store {' '.join(repr(a[:60]) for a in args)}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        raise AssertionError(f"{what}: {type(exc).__name__} escaped: {str(exc)[:300]}")
    out, err = result.stdout, result.stderr
    code = result.exit_code
    assert code in (0, 1, 2), f"{what}: exit status {code}"
    assert "Traceback" not in out + err, f"{what}: a traceback: {(out + err)[-500:]}"
    assert not _controls(out + err), f"{what}: raw control characters {_controls(out + err)}"
    if code == 2:
        assert err.strip(), f"{what}: exit status 2 with nothing on stderr"
    if "--json" in args and code in (0, 1) and args[0] in ("inspect", "show", "stats", "validate", "diff", "compact",
                                                           "gc"):
        try:
            doc = json.loads(out)
        except ValueError:
            raise AssertionError(f"{what}: --json output is not JSON: {out[:300]!r}") from None
        try:
            jsonschema.validate(doc, load_schema(f"cli-{args[0]}"))
        except jsonschema.ValidationError as exc:
            raise AssertionError(f"{what}: --json output does not match its schema: {exc.message[:300]}") from None
        if args[0] == "validate":
            assert doc["ok"] == (code == 0), f"{what}: exit status {code} with \"ok\": {doc['ok']}"
        if args[0] == "show":
            assert code == 0, f"{what}: --json printed with exit status {code}"
    return f"{args[0]} {code}"


def commands(seed: int = 0, cases: int | None = None, seconds: float | None = None) -> dict[str, Any]:
    """Random command lines until ``cases`` ran or ``seconds`` passed."""
    rng = random.Random(seed)
    failures: list[str] = []
    counts: dict[str, int] = {}
    start = time.monotonic()
    done = 0
    with stores() as urls:
        while (cases is None or done < cases) and (seconds is None or time.monotonic() - start < seconds):
            args = command_line(rng, urls)
            done += 1
            try:
                label = check(args)
            except AssertionError as exc:
                if len(failures) < 20:
                    failures.append(f"case {done - 1} (seed {seed}): {exc}")
                label = "FAILURE"
            counts[label] = counts.get(label, 0) + 1
    return {"target": "cli_commands", "seed": seed, "cases": done, "outcomes": counts, "failures": failures,
            "seconds": round(time.monotonic() - start, 1)}


def pipes(limit: int | None = None) -> dict[str, Any]:
    """Every subcommand (the first ``limit`` command lines) in its own process with standard output
    closed: status 0, no traceback."""
    failures = []
    with stores() as urls:
        lines = [["inspect", urls["hostile"]], ["inspect", urls["hostile"], "--json"],
                 ["show", urls["hostile"], IDS[9]], ["show", urls["hostile"], IDS[9], "--json"],
                 ["stats", urls["hostile"]], ["validate", urls["hostile"]], ["validate", urls["hostile"], "--json"],
                 ["diff", urls["hostile"], urls["other"]], ["gc", urls["hostile"]], ["compact", urls["other"]]]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
        lines = lines[:limit]
        for args in lines:
            read, write = os.pipe()
            os.close(read)  # the reader is gone before the first write
            proc = subprocess.run([sys.executable, "-m", "r3store.cli", *args], stdout=write, stderr=subprocess.PIPE,
                                  env=env, timeout=300, check=False)
            os.close(write)
            err = proc.stderr.decode(errors="replace")
            if proc.returncode != 0 or "Traceback" in err:
                failures.append(f"r3store {args[0]} {' '.join(args[2:])} into a closed pipe: status "
                                f"{proc.returncode}, stderr {err[-400:]!r}")
    return {"target": "cli_pipes", "cases": len(lines), "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.cli", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-pipes", action="store_true")
    args = parser.parse_args(argv)
    reports = [commands(args.seed, args.cases if args.cases or args.seconds else 500, args.seconds)]
    if not args.no_pipes:
        reports.append(pipes())
    for report in reports:
        print(json.dumps(report, ensure_ascii=False), flush=True)
    return int(any(r["failures"] for r in reports))


if __name__ == "__main__":
    raise SystemExit(main())
