"""Options of the scanning commands (``r3store/cli/_scan.py``): ``--ray`` with an address where no cluster runs.

New-user finding: ``--ray`` with an unreachable address hung for minutes in Ray's own retries.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.cli._scan import RAY_CLIENT_PORT, probe, ray_endpoint
from tests.clirun import SPEC_3X16, routes_of_16

pytest.importorskip("ray")  # ray_endpoint reads addresses with ray's own parser

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    """A TCP port nothing listens on (bound on every interface, then released)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]
    return port


def test_ray_at_a_closed_port_fails_fast_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with r3store.RouteWriter(path, SPEC_3X16) as w:
        w.append("s0", routes_of_16(np.random.default_rng(0), 9))
    address = f"127.0.0.1:{closed_port()}"
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "r3store.cli", "validate", str(path), "--ray", address],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    took = time.monotonic() - began
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith(f"error: --ray '{address}': cannot connect to Ray: no Ray cluster answers at "), line
    assert "Connection refused" in line
    assert took < 60  # Ray's own retries took minutes


def test_ray_endpoint_reads_addresses_as_ray_does() -> None:
    assert ray_endpoint("ray://head.example") == ("head.example", RAY_CLIENT_PORT)
    assert ray_endpoint("ray://head.example:4321/ns") == ("head.example", 4321)
    assert ray_endpoint("ray://[::1]:4321") == ("::1", 4321)
    host, port = ray_endpoint("10.1.2.3:6379") or ("", 0)
    assert (host, port) == ("10.1.2.3", 6379)
    with pytest.raises(ValueError, match="Invalid address format"):
        ray_endpoint("nonsense")
    with pytest.raises(ValueError, match="expected host:port"):
        ray_endpoint("ray://head.example:99999")


def test_probe_names_the_address_and_the_cause() -> None:
    port = closed_port()
    with pytest.raises(ConnectionError, match=rf"127\.0\.0\.1:{port} \(Connection refused"):
        probe(("127.0.0.1", port), 5.0)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        probe(server.getsockname(), 5.0)  # a listening port passes


RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING)\s+\S+\.py:\d+ -- ", re.M)
"""A line of Ray's Python loggers below ERROR (``2026-01-02 03:04:05,678\tINFO worker.py:1 -- ...``)."""


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
def test_ray_starts_quietly_unless_asked_for_its_log_lines(tmp_path: Path) -> None:
    # New-user finding: `validate --ray` printed Ray's own log lines into the command's output.
    # A new local cluster ("local": never one another test or user started), as a user without
    # RAY_ADDRESS or RAY_AUTH_MODE set gets; with -v Ray's lines come back (the check can fail).
    path = tmp_path / "s"
    with r3store.RouteWriter(path, SPEC_3X16) as w:
        w.append("s0", routes_of_16(np.random.default_rng(0), 9))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    local = subprocess.run([sys.executable, "-m", "r3store.cli", "validate", str(path), "--json"],
                           capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    runs = {flag: subprocess.run([sys.executable, "-m", "r3store.cli", "validate", str(path), "--json", *flag,
                                  "--ray", "local"], capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
            for flag in ((), ("-v",))}
    quiet, verbose = runs[()], runs[("-v",)]
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, local.stdout, ""), quiet.stderr
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stdout == local.stdout  # Ray's lines go to stderr only
    assert re.search(r"\tINFO .* -- Started a local Ray instance", verbose.stderr), verbose.stderr
    assert RAY_LOG_LINE.search(verbose.stderr)
