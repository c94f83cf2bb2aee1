"""Shared fixtures: hermetic environment, hypothesis profiles, stores on every backend."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["r3store.testing.s3", "r3store.testing.ray_cluster"]

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci", max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("nightly", max_examples=2000, deadline=None)
settings.load_profile(os.environ.get("R3STORE_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS_* / R3STORE_* variable of the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "R3STORE_")):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture
def memory_url() -> Iterator[str]:
    """A fresh ``memory://`` store URL, removed afterwards."""
    import fsspec

    url = f"memory://r3store-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    path = url.removeprefix("memory://")
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture
def committed(tmp_path: Path) -> tuple[Path, str, Path, np.ndarray]:
    """``(root, array, shard_file, big)``: a local store written by ``tests.routes.write_committed``."""
    from tests.routes import write_committed

    return write_committed(tmp_path)


@pytest.fixture
def small_store_dir(tmp_path: Path) -> Path:
    """``tests.routes.make_store``'s three 10-row samples at ``tmp_path / "store"``."""
    from tests.routes import make_store

    root = tmp_path / "store"
    make_store(root)
    return root
