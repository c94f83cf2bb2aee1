"""Test helper: model specs, valid random routes and small committed stores shared by test modules.

Imported as ``tests.routes`` (the suite runs from the repository root, as ``tests.clirun`` is).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import r3store
from r3store.testing import forge

__all__ = [
    "BASE_COLUMNS", "GOOD", "LATER", "OK5", "SPEC6", "SPEC_4X16", "SPEC_5X40", "array_dir",
    "check_store_after", "deadline", "index_file", "make_store", "random_routes", "rewrite_table",
    "routes_4x16", "sample_tables", "seeded_routes", "set_column", "write_committed", "write_store"
]

# 5 decoder layers, dense layers 0 and 3; 40 experts -> 6 bits per id
SPEC_5X40 = r3store.ModelSpec(num_layers=5, num_experts=40, top_k=3, moe_layers=[1, 2, 4])

SPEC_4X16 = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)

SPEC6 = r3store.ModelSpec(num_layers=6, num_experts=12, top_k=2, moe_layers=[1, 2, 3, 4, 5])


def random_routes(rng: np.random.Generator, rows: int, layers: int = 3, num_experts: int = 40,
                  top_k: int = 3) -> np.ndarray:
    """Valid routes: per (row, layer) a random permutation prefix of the experts."""
    return np.argsort(rng.random((rows, layers, num_experts)), axis=-1)[..., :top_k].astype(np.int32)


_RNG = np.random.default_rng(1234)
GOOD = {f"g{i}": random_routes(_RNG, n) for i, n in enumerate([5, 11, 1])}

LATER = random_routes(_RNG, 4)

OK5 = random_routes(_RNG, 5)  # valid routes the bad cases start from

BASE_COLUMNS = {"sample_id", "num_tokens", "num_rows", "row_start", "array", "commit", "writer_id", "token_hash",
                "committed_at", "quarantined", "reason", "missing_rows", "policy_spans", "policy_version"}


def check_store_after(url: str, later: bool = True) -> r3store.RouteStore:
    """Open ``url`` and check it holds exactly GOOD (and LATER as ``later``), with only the base columns."""
    store = r3store.open_store(url)
    want = [*GOOD, "later"] if later else list(GOOD)
    assert store.sample_ids == want
    assert store.samples.column("sample_id").to_pylist() == want  # nothing quarantined or half-written
    for sid, routes in GOOD.items():
        np.testing.assert_array_equal(store.get(sid), routes)
    if later:
        np.testing.assert_array_equal(store.get("later"), LATER)
    assert set(store.samples.column_names) <= BASE_COLUMNS | {"step", "bad_only"}
    return store


def write_committed(root: Path) -> tuple[Path, str, Path, np.ndarray]:
    """A local store: GOOD + one more sample in one shard, 4-row chunks, one layer per chunk.

    Returns ``(root, array, shard_file, big)``: the route array's name, its one shard file and
    the 20-row sample ``big``.
    """
    big = random_routes(np.random.default_rng(5), 20)
    with r3store.RouteWriter(root, SPEC_5X40, config={"chunk_rows": 4, "layers_per_chunk": 1}) as w:
        for sid, routes in GOOD.items():
            w.append(sid, routes)
        w.append("big", big)
    store = r3store.open_store(root)
    array = store.row("big")["array"]
    shard_file = root / array / "c" / "0" / "0" / "0"
    assert shard_file.is_file()
    return root, array, shard_file, big


def seeded_routes(rows: int, seed: int, spec: r3store.ModelSpec = SPEC6) -> np.ndarray:
    """Valid int32 routes ``(rows, spec.num_moe_layers, spec.top_k)`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((rows, spec.num_moe_layers, spec.num_experts)), axis=-1)[..., : spec.top_k].astype(
        np.int32)


def write_store(root: Path, samples: dict[str, np.ndarray], spec: r3store.ModelSpec = SPEC6, **kw: object) -> str:
    """Write ``samples`` to a store at ``root`` with writer config ``kw``; returns the last commit id."""
    with r3store.RouteWriter(root, spec, kw) as w:
        for sid, r in samples.items():
            w.append(sid, r)
        return w.flush() or w.commits[-1]


def sample_tables(root: Path) -> list[Path]:
    """The store's sample-table parquet files, sorted."""
    return sorted((root / "index").rglob("*.parquet"))


def routes_4x16(rows: int, seed: int) -> np.ndarray:
    """Valid int32 routes ``(rows, 4, 2)`` for ``SPEC_4X16`` drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    scores = rng.random((rows, SPEC_4X16.num_moe_layers, SPEC_4X16.num_experts))
    return np.argsort(scores, axis=-1)[..., :SPEC_4X16.top_k].astype(np.int32)


def make_store(root: Path | str, n: int = 3, rows: int = 10, seed: int = 0, **kw: Any) -> dict[str, np.ndarray]:
    """Write ``n`` samples ``s0..`` of ``rows`` rows (``SPEC_4X16``, step 1) to ``root``; returns them."""
    data = {f"s{i}": routes_4x16(rows, seed + i) for i in range(n)}
    with r3store.RouteWriter(str(root), SPEC_4X16, **kw) as w:
        for sid, r in data.items():
            w.append(sid, r, metadata={"step": 1})
    return data


def index_file(root: Path) -> Path:
    """The store's one sample-table parquet file."""
    (path,) = (root / "index").rglob("*.parquet")
    return path


def array_dir(root: Path) -> Path:
    """The store's one route-array folder under ``routes/``."""
    (path,) = (p for p in (root / "routes").iterdir() if p.is_dir())
    return path


def rewrite_table(root: Path, edit: Callable[[pa.Table], pa.Table]) -> Path:
    """Edit the store's sample table as a forger would: the digest recomputed, so the row rules are what refuse it."""
    return forge.rewrite_table(index_file(root), edit)


def set_column(table: pa.Table, name: str, values: list[Any]) -> pa.Table:
    """``table`` with column ``name`` replaced by ``values`` (nullable, same type)."""
    i = table.schema.get_field_index(name)
    field = table.schema.field(i)
    return table.set_column(i, field.with_nullable(True), pa.array(values, type=field.type))


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (instead of hanging the suite) when the block takes longer than ``seconds``."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
