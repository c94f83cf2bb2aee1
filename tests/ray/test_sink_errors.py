"""Issue 22 item 5: ``r3store.ray.write_routes`` names the real fault, as the r3store error it was.

A reused ``write_id`` was refused only after Ray started the write (and printed a long
traceback), and errors raised inside the write tasks reached the caller wrapped by Ray
(the sink's test caught ``Exception``). Now the write id is checked on the driver before
Ray runs anything, and a task's r3store error reaches the caller as its own class
(``ExpertIdError`` for a bad sample), on a real local Ray cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.errors import ExpertIdError, OptionError, R3StoreError
from r3store.testing.faults import distinct_routes

ray = pytest.importorskip("ray")
import r3store.ray as r3ray  # noqa: E402 - after the importorskip

SPEC = r3store.ModelSpec(num_layers=5, num_experts=48, top_k=2, moe_layers=[1, 2, 3, 4])


def _items(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    return [{"sample_id": f"s{i:03d}", "routes": distinct_routes(rng, 3 + i, 4, 48, 2)} for i in range(n)]


def test_a_task_error_reaches_the_caller_as_its_r3store_class(tmp_path: Path, ray_cluster: str) -> None:
    data = _items(3)
    data[1]["routes"] = data[1]["routes"].copy()
    data[1]["routes"][1, 3] = [5, 5]
    with pytest.raises(ExpertIdError, match=r"s001.*expert id repeated within row 1, decoder layer 4") as info:
        r3ray.write_routes(ray.data.from_items(data).repartition(1), tmp_path / "bad", SPEC)
    assert type(info.value) is ExpertIdError  # the class itself, not a Ray wrapper deriving from it
    assert isinstance(info.value, R3StoreError)


def test_a_reused_write_id_is_refused_before_ray_runs(tmp_path: Path, ray_cluster: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ds = ray.data.from_items(_items(2))
    r3ray.write_routes(ds, tmp_path / "out", SPEC, write_id="once")
    ran: list[str] = []
    real = ray.data.Dataset.write_datasink
    monkeypatch.setattr(ray.data.Dataset, "write_datasink", lambda *a, **k: ran.append("ran") or real(*a, **k))
    with pytest.raises(OptionError, match="was used before") as info:
        r3ray.write_routes(ds, tmp_path / "out", SPEC, write_id="once")
    assert ran == []  # refused on the driver: Ray started nothing
    assert type(info.value) is OptionError
