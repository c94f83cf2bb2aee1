"""Stores the CLI test modules share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from tests.clirun import SPEC_13X128, routes_of_128


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Four ``SPEC_13X128`` samples (40-70 rows) and one quarantined invalid sample ``bad``."""
    rng = np.random.default_rng(16)
    path = tmp_path / "store"
    with r3store.RouteWriter(path, SPEC_13X128, config={"on_invalid": "quarantine"}) as w:
        for i in range(4):
            w.append(f"step-1/prompt-{i}/sample-{i}", routes_of_128(rng, 40 + 10 * i))
        bad = routes_of_128(rng, 12)
        bad[3, 2, :2] = 7
        w.append("bad", bad)
    return path
