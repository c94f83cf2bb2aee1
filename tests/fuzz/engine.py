"""The fuzzing engine: a supervisor process and a worker that runs a target on inputs.

The **worker** (``python -m tests.fuzz --worker ...``) runs one target. With the built-in
engine it mutates inputs itself and, before running each one, sends it to the supervisor
over its stdout pipe (``b"I"`` + length + bytes), then the result (``b"R"`` + status +
length + text). With atheris (``--engine atheris``) libFuzzer drives the worker instead,
with coverage feedback from the instrumented r3store modules; libFuzzer itself saves the
input of a crash, an oracle failure or a hang (``-timeout``), and the supervisor parses its
final statistics.

The **supervisor** (:func:`fuzz`) starts the worker, waits for each result at most
``timeout`` seconds, and records a *failure* when the oracle is violated, when the worker
dies (signal, abort, ``os._exit``) or when it hangs (killed then); the input is saved under
``out/<target>/`` as ``<kind>-<sha1>.bin`` with a ``.txt`` note, and a fresh worker carries
on until the time is up.

The built-in mutator is libFuzzer's set without coverage: bit flips, byte sets to
interesting values, little-endian integers (0, -1, 2**31, 2**40, the input length, ...),
inserts, deletes, block copies, truncations, splices of another corpus entry and of the
target's dictionary tokens, stacked 1 to 8 deep. An input whose outcome (refusal class and
message start) was not seen before joins the corpus, a crude feedback that walks past the
first checks (magic, version, CRC) into the later ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import select
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
REGRESSIONS = HERE / "regressions"

OK, REFUSED, FAILED = 0, 1, 2
INTERESTING_INTS = (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096,
                    32767, 32768, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1)


@dataclass
class Report:
    """What one run found (printed as JSON by the command line)."""

    target: str
    engine: str
    seconds: float = 0.0
    executions: int = 0
    refused: int = 0
    workers: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        doc = {"target": self.target, "engine": self.engine, "seconds": round(self.seconds, 1),
               "executions": self.executions, "refused": self.refused, "workers": self.workers,
               "failures": self.failures, "distinct_outcomes": len(self.outcomes),
               "top_outcomes": dict(self.outcomes.most_common(8))}
        if self.engine == "atheris":  # libFuzzer reports executions and failures only
            for key in ("refused", "distinct_outcomes", "top_outcomes"):
                del doc[key]
        return doc


# -- mutation ----------------------------------------------------------------------------------------


class Mutator:
    """libFuzzer-style byte mutations (no coverage), seeded for reproducible runs."""

    def __init__(self, rng: random.Random, tokens: tuple[bytes, ...], max_len: int) -> None:
        self.rng = rng
        self.tokens = tokens
        self.max_len = max_len

    def mutate(self, data: bytes, other: bytes) -> bytes:
        buf = bytearray(data)
        for _ in range(1 + min(7, int(self.rng.expovariate(0.7)))):
            buf = self._one(buf, other)
        return bytes(buf[: self.max_len])

    def _one(self, buf: bytearray, other: bytes) -> bytearray:
        r = self.rng
        n = len(buf)
        op = r.randrange(11)
        if n == 0 or op == 10:
            pos = r.randint(0, n)
            return buf[:pos] + bytearray(r.choice(self.tokens) if self.tokens and r.random() < 0.7
                                         else bytes(r.randrange(256) for _ in range(r.randint(1, 8)))) + buf[pos:]
        pos = r.randrange(n)
        if op == 0:  # flip a bit
            buf[pos] ^= 1 << r.randrange(8)
        elif op == 1:  # an interesting byte
            buf[pos] = r.choice((0, 1, 0x7F, 0x80, 0xFF, 0x20, 0x22, 0x5C, 0x2C))
        elif op == 2:  # a random byte
            buf[pos] = r.randrange(256)
        elif op == 3:  # an interesting little-endian integer
            width = r.choice((1, 2, 4, 8))
            value = r.choice((*INTERESTING_INTS, n, n - pos, r.randrange(1 << 16)))
            if r.random() < 0.2:
                value = -value
            raw = (value % (1 << (8 * width))).to_bytes(width, "little")
            buf[pos : pos + width] = raw
        elif op == 4:  # delete a range
            del buf[pos : pos + r.randint(1, max(1, min(64, n - pos)))]
        elif op == 5:  # duplicate a block elsewhere
            size = r.randint(1, max(1, min(64, n - pos)))
            at = r.randint(0, n)
            buf[at:at] = buf[pos : pos + size]
        elif op == 6:  # overwrite with a block from elsewhere
            size = r.randint(1, max(1, min(32, n - pos)))
            src = r.randrange(n)
            buf[pos : pos + size] = buf[src : src + size]
        elif op == 7:  # truncate
            del buf[pos:]
        elif op == 8:  # splice another corpus entry
            if other:
                cut = r.randrange(len(other))
                buf = buf[:pos] + bytearray(other[cut : cut + r.randint(1, 256)]) + buf[pos:]
        elif op == 9:  # ASCII digit edits (JSON numbers, .npy headers)
            digits = [i for i in range(max(0, pos - 64), min(n, pos + 64)) if 0x30 <= buf[i] <= 0x39]
            if digits:
                buf[r.choice(digits)] = r.choice(b"0123456789-")
        return buf


# -- worker ------------------------------------------------------------------------------------------


def _send(out: BinaryIO, kind: bytes, payload: bytes, status: int = 0) -> None:
    out.write(kind + struct.pack("<BI", status, len(payload)) + payload)
    out.flush()


def _limit_memory(gib: float) -> None:
    """Cap the worker's address space, so an unbounded allocation is a MemoryError (a failure)."""
    try:
        import resource

        limit = int(gib * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass


def run_one(target: Any, data: bytes) -> tuple[int, str]:
    """Run one input; (status, outcome or failure text)."""
    from tests.fuzz.targets import Failure

    try:
        return OK if (result := target.run(data)) == "ok" else REFUSED, result
    except Failure as exc:
        return FAILED, str(exc)


def worker_builtin(name: str, seed: int, seconds: float, memory_gib: float, min_runs: int = 0) -> None:
    """Fuzz ``name`` with the built-in mutator, reporting every input on stdout.

    Runs for ``seconds`` after start-up and at least ``min_runs`` inputs (so a short run on a
    busy machine still exercises the target).
    """
    from tests.fuzz.targets import TARGETS

    _limit_memory(memory_gib)
    target = TARGETS[name]
    out = sys.stdout.buffer
    rng = random.Random(seed)
    corpus = list(target.seeds()) + _load_dir(CORPUS / name)
    max_len = max(4096, 2 * max(map(len, corpus)))
    mutator = Mutator(rng, target.tokens, max_len)
    seen: set[str] = set()
    queue = list(corpus)  # the corpus entries run once, unmutated, first
    deadline = time.monotonic() + seconds
    runs = 0
    while time.monotonic() < deadline or runs < min_runs:
        runs += 1
        data = queue.pop(0) if queue else mutator.mutate(rng.choice(corpus), rng.choice(corpus))
        _send(out, b"I", data)
        status, text = run_one(target, data)
        _send(out, b"R", text.encode("utf-8", "replace")[:2000], status)
        if status != FAILED and text not in seen:
            seen.add(text)
            corpus.append(data)
    _send(out, b"E", b"")


def worker_replay(name: str, paths: list[str], memory_gib: float) -> None:
    """Run the given inputs (files or folders of them) once each."""
    from tests.fuzz.targets import TARGETS

    _limit_memory(memory_gib)
    target = TARGETS[name]
    out = sys.stdout.buffer
    for path in paths:
        for data in _load_dir(Path(path)) if Path(path).is_dir() else [Path(path).read_bytes()]:
            _send(out, b"I", data)
            status, text = run_one(target, data)
            _send(out, b"R", text.encode("utf-8", "replace")[:2000], status)
    _send(out, b"E", b"")


def worker_atheris(name: str, seconds: float, timeout: float, out_dir: Path, memory_gib: float) -> None:
    """Fuzz ``name`` under libFuzzer (atheris), r3store instrumented for coverage."""
    import atheris

    with atheris.instrument_imports(include=["r3store"]):
        import r3store
        import r3store.codecs
        import r3store.reader
        import r3store.writer  # noqa: F401
    from tests.fuzz.targets import TARGETS, Failure

    target = TARGETS[name]
    work = out_dir / name / "atheris-corpus"
    work.mkdir(parents=True, exist_ok=True)
    seeds = [*target.seeds(), *_load_dir(CORPUS / name)]
    for i, seed in enumerate(seeds):
        (work / f"seed-{i}").write_bytes(seed)

    def one(data: bytes) -> None:
        try:
            target.run(data)
        except Failure as exc:
            raise AssertionError(f"oracle failure: {exc}") from None

    dictionary = out_dir / name / "tokens.dict"
    dictionary.write_text("".join('"' + "".join(f"\\x{b:02x}" for b in tok) + '"\n' for tok in target.tokens))
    argv = [sys.argv[0], str(work), f"-max_total_time={int(seconds)}", f"-timeout={int(timeout)}",
            f"-rss_limit_mb={int(memory_gib * 1024)}", f"-artifact_prefix={out_dir / name}/",
            f"-max_len={max(4096, 2 * max(map(len, seeds)))}", "-print_final_stats=1",
            *([f"-dict={dictionary}"] if target.tokens else [])]
    atheris.Setup(argv, one)
    atheris.Fuzz()


def _load_dir(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(folder.glob("*")) if p.is_file() and not p.name.endswith(".txt")]


# -- supervisor --------------------------------------------------------------------------------------


def _save(out_dir: Path, report: Report, kind: str, data: bytes, note: str) -> None:
    folder = out_dir / report.target
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{kind}-{hashlib.sha1(data).hexdigest()[:16]}"
    (folder / f"{name}.bin").write_bytes(data)
    (folder / f"{name}.txt").write_text(f"{kind}: {note}\n")
    report.failures.append({"kind": kind, "input": str(folder / f"{name}.bin"), "note": note[:500]})


def _read_exact(stream: BinaryIO, n: int, deadline: float, pid: int | None = None) -> bytes | None:
    """``n`` bytes from the pipe, or None when ``deadline`` passes; EOFError when the pipe closes.

    With ``pid`` (the worker's), the wait is for the worker's CPU time, not the wall clock's:
    on a loaded machine a worker that got less than the wait's span of CPU is not hung, so the
    deadline moves on (up to 10 times the span of wall time). A worker that used almost no
    CPU since the previous deadline (blocked, asleep) is hung.
    """
    chunks, got = [], 0
    fd = stream.fileno()
    start = time.monotonic()
    span, cpu0 = deadline - start, _cpu_seconds(pid)
    last = (start, cpu0)  # the wall time and CPU time at the previous deadline
    while got < n:
        now = time.monotonic()
        if now >= deadline:
            used = None if cpu0 is None else _cpu_seconds(pid)
            if used is None or cpu0 is None or now >= start + 10 * span or used - cpu0 >= span:
                return None
            if last[1] is not None and used - last[1] < 0.002 * (now - last[0]):  # no CPU since: blocked, asleep
                return None
            last, deadline = (now, used), now + max(0.5, span - (used - cpu0))
            continue
        if not select.select([fd], [], [], deadline - now)[0]:
            continue
        chunk = os.read(fd, n - got)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a live process (Linux ``/proc/<pid>/stat``), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _worker_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "tests.fuzz", "--worker", *args]


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def supervise(report: Report, args: list[str], out_dir: Path, timeout: float, budget: float,
              max_failures: int) -> bool:
    """Run one worker to its end; False when it died or hung (the caller may start another)."""
    report.workers += 1
    stderr = tempfile.TemporaryFile()  # noqa: SIM115 - a file, not a pipe: a chatty worker never blocks on it
    proc = subprocess.Popen(_worker_cmd(args), stdout=subprocess.PIPE, stderr=stderr, cwd=ROOT, env=_env())
    assert proc.stdout is not None
    current: bytes | None = None
    startup = time.monotonic() + max(60.0, timeout)  # imports before the first input
    hung = False
    try:
        while True:
            try:
                head = _read_exact(proc.stdout, 6, startup if current is None and report.executions == 0
                                   else time.monotonic() + (timeout if current is not None else budget), proc.pid)
                if head is None:
                    hung = True
                    break
                kind, (status, size) = head[:1], struct.unpack("<BI", head[1:])
                body = _read_exact(proc.stdout, size, time.monotonic() + timeout, proc.pid) if size else b""
            except EOFError:
                break
            if body is None:
                hung = True
                break
            if kind == b"I":
                current = body
            elif kind == b"R":
                report.executions += 1
                text = body.decode("utf-8", "replace")
                report.outcomes[text if status != FAILED else "FAILURE"] += 1
                report.refused += status == REFUSED
                if status == FAILED:
                    _save(out_dir, report, "oracle", current or b"", text)
                    if len(report.failures) >= max_failures:
                        return True
                current = None
            elif kind == b"E":
                return True
        # the pipe closed (a death) or no answer came in time (a hang)
        if hung:
            proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stderr.seek(0)
        err = stderr.read().decode("utf-8", "replace")[-1500:]
        if current is not None or proc.returncode:
            kind = "hang" if hung else "crash"
            note = (f"no answer within {timeout:g} s of its CPU time" if hung
                    else f"worker exited with {proc.returncode}")
            _save(out_dir, report, kind, current or b"", f"{note}; stderr: {err}")
        return False
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        stderr.close()


def fuzz(target: str, seconds: float, *, seed: int = 0, timeout: float = 20.0, out_dir: Path | None = None,
         engine: str = "builtin", memory_gib: float = 4.0, max_failures: int = 20, min_runs: int = 0) -> Report:
    """Fuzz ``target`` for ``seconds``; failures are saved under ``out_dir/<target>/``.

    ``min_runs`` (built-in engine): the first worker runs at least that many inputs even when
    ``seconds`` has passed.
    """
    out_dir = out_dir or HERE / "findings"
    report = Report(target, engine)
    start = time.monotonic()
    if engine == "atheris":
        _fuzz_atheris(report, seconds, timeout, out_dir, memory_gib)
    else:
        attempt = 0
        while (left := seconds - (time.monotonic() - start)) > 0.5 and len(report.failures) < max_failures:
            args = ["builtin", target, str(seed + attempt), f"{left:.1f}", str(memory_gib),
                    str(min_runs if attempt == 0 else 0)]
            if supervise(report, args, out_dir, timeout, left + timeout, max_failures):
                break
            attempt += 1
    report.seconds = time.monotonic() - start
    return report


def replay(target: str, paths: list[str], *, timeout: float = 20.0, out_dir: Path | None = None,
           memory_gib: float = 4.0) -> Report:
    """Run saved inputs (files or folders) once each under the same supervision."""
    report = Report(target, "replay")
    start = time.monotonic()
    supervise(report, ["replay", target, str(memory_gib), *paths], out_dir or HERE / "findings", timeout,
              timeout, max_failures=10**6)
    report.seconds = time.monotonic() - start
    return report


def _fuzz_atheris(report: Report, seconds: float, timeout: float, out_dir: Path, memory_gib: float) -> None:
    args = ["atheris", report.target, f"{seconds:.0f}", f"{timeout:.0f}", str(out_dir), str(memory_gib)]
    report.workers = 1
    proc = subprocess.run(_worker_cmd(args), capture_output=True, text=True, cwd=ROOT, env=_env(),
                          timeout=seconds + 120, check=False)
    log = proc.stdout + proc.stderr
    runs = re.findall(r"stat::number_of_executed_units: (\d+)", log) or re.findall(r"#(\d+)\s+DONE", log)
    report.executions = int(runs[-1]) if runs else 0
    if proc.returncode:
        artifacts = re.findall(r"Test unit written to (\S+)", log)
        for path in artifacts:
            data = Path(path).read_bytes() if Path(path).exists() else b""
            kind = "hang" if "timeout-" in path else "crash" if "crash-" in path or "oom-" in path else "oracle"
            _save(out_dir, report, kind, data, log[-1500:])
        if not artifacts:
            report.failures.append({"kind": "crash", "input": "", "note": log[-1500:]})


def main(argv: list[str] | None = None) -> int:
    import argparse

    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description="Fuzz r3store's parsers.")
    public = [n for n in TARGETS if not n.startswith("_")]
    parser.add_argument("--target", default="all", help=f"one of {', '.join(public)}, or all (default)")
    parser.add_argument("--seconds", type=float, default=60.0, help="per target (default 60)")
    parser.add_argument("--engine", choices=("auto", "atheris", "builtin"), default="auto",
                        help="auto: atheris when importable, else the built-in mutator")
    parser.add_argument("--seed", type=int, default=0, help="seed of the built-in mutator")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds one input may take (a hang after)")
    parser.add_argument("--memory-gib", type=float, default=4.0, help="address-space cap of the worker")
    parser.add_argument("--out", type=Path, default=HERE / "findings", help="where failing inputs are saved")
    parser.add_argument("--replay", nargs="+", metavar="PATH", help="run these inputs (files or folders) once")
    parser.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        return _worker_main(args.worker)
    names = [n for n in TARGETS if not n.startswith("_")] if args.target == "all" else [args.target]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r}; choose from {', '.join(TARGETS)}")
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401

            engine = "atheris"
        except ImportError:
            engine = "builtin"
    failed = False
    for name in names:
        if args.replay:
            report = replay(name, args.replay, timeout=args.timeout, out_dir=args.out, memory_gib=args.memory_gib)
        else:
            report = fuzz(name, args.seconds, seed=args.seed, timeout=args.timeout, out_dir=args.out,
                          engine=engine, memory_gib=args.memory_gib)
        print(json.dumps(report.as_dict()), flush=True)
        failed |= bool(report.failures)
    return 1 if failed else 0


def _worker_main(argv: list[str]) -> int:
    mode, name, *rest = argv
    if mode == "builtin":
        worker_builtin(name, int(rest[0]), float(rest[1]), float(rest[2]), int(rest[3]) if len(rest) > 3 else 0)
    elif mode == "replay":
        worker_replay(name, rest[1:], float(rest[0]))
    elif mode == "atheris":
        worker_atheris(name, float(rest[0]), float(rest[1]), Path(rest[2]), float(rest[3]))
    return 0
