"""``assemble``'s run planning (issue 21 item 7): a THD or BSHD plan's route rows found as runs
by one compiled pass (``route_runs``) instead of :func:`r3store.layout.route_index` and numpy.

Oracles: :func:`r3store.layout.route_index` for the kernel, and ``assemble``'s general path
(the one SBHD, missing rows and builds without the extension take) for the batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import r3store
from r3store.batch import _assemble, assemble
from r3store.codecs import kernels
from r3store.errors import LayoutOptionError
from r3store.layout import LayoutOptions, plan_layout, route_index

NATIVE = kernels.native_module()
needs_native = pytest.mark.skipif(NATIVE is None, reason="the C extension is not built")
SPEC = r3store.ModelSpec(num_layers=5, num_experts=16, top_k=4, moe_layers=[0, 1, 3, 4])
CASES = [
    {},
    {"cp_size": 2, "cp_rank": 1},
    {"cp_size": 4, "cp_rank": 2, "cp_mode": "contiguous"},
    {"cp_size": 2, "cp_rank": 0, "tp_size": 4, "tp_rank": 3, "sequence_parallel": True},
    {"layout": "bshd", "cp_size": 2, "cp_rank": 1},
    {"layout": "bshd", "max_seqlen": 64, "tp_size": 2},
    {"framework": "verl", "cp_size": 2, "cp_rank": 1},
    {"layout": "bshd", "framework": "megatron", "cp_size": 2, "cp_rank": 1},
]


def _runs(plan: Any, capacity: int | None = None) -> tuple[int, np.ndarray, np.ndarray]:
    index = np.ascontiguousarray(plan.index, dtype=np.int64).reshape(-1)
    mask = np.full(index.size, 7, np.uint8)
    runs = np.zeros((index.size if capacity is None else capacity, 4), np.int64)
    assert NATIVE is not None
    return NATIVE.route_runs(index, plan.token_offsets, mask, runs), mask, runs


@needs_native
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", range(4))
def test_route_runs_are_route_index(case: dict[str, Any], seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_tokens = rng.integers(1, 60, rng.integers(1, 6)).tolist()
    try:
        plan = plan_layout(num_tokens, LayoutOptions(**case))
    except LayoutOptionError:  # a sample longer than max_seqlen
        pytest.skip("plan refused")
    want = route_index(plan).reshape(-1)
    m, mask, runs = _runs(plan)
    np.testing.assert_array_equal(mask, want >= 0)
    rows = np.concatenate(([0], np.cumsum(np.asarray(num_tokens) - 1)))
    got = np.full(want.size, -1)
    for s, a, b, at in runs[:m].tolist():
        assert 0 <= a < b <= num_tokens[s] - 1
        got[at : at + b - a] = rows[s] + np.arange(a, b)
    np.testing.assert_array_equal(got, want)
    starts = runs[:m, 3]
    assert (np.diff(starts) > 0).all()  # in position order, each a maximal run
    joined = (runs[:-1, 0] == runs[1:, 0]) & (runs[:-1, 2] == runs[1:, 1]) & \
        (runs[:-1, 3] + runs[:-1, 2] - runs[:-1, 1] == runs[1:, 3])
    assert not joined[: max(m - 1, 0)].any()


@needs_native
def test_route_runs_reports_overflow_and_bad_tokens() -> None:
    plan = plan_layout([12, 12, 12], LayoutOptions(cp_size=2))  # two runs per sample: chunks 0 and 3 of 4
    assert _runs(plan)[0] == 6
    assert _runs(plan, capacity=5)[0] == -1
    assert NATIVE is not None
    mask, runs = np.zeros(3, np.uint8), np.zeros((3, 4), np.int64)
    with pytest.raises(IndexError, match="outside"):
        NATIVE.route_runs(np.array([0, 27, 1]), np.array([0, 9, 18, 27]), mask, runs)
    with pytest.raises(IndexError, match="outside"):
        NATIVE.route_runs(np.array([-2, 0, 1]), np.array([0, 9]), mask, runs)
    with pytest.raises(ValueError, match="increase"):
        NATIVE.route_runs(np.array([0, 1, 2]), np.array([0, 4, 4]), mask, runs)
    with pytest.raises(TypeError, match="int64"):
        NATIVE.route_runs(np.array([0, 1, 2], np.int32), np.array([0, 9]), mask, runs)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(5)
    with r3store.RouteWriter(path, SPEC, config={"chunk_rows": 8, "layers_per_chunk": 2}) as writer:
        for i in range(6):
            keys = rng.random((int(rng.integers(1, 70)), SPEC.num_moe_layers, SPEC.num_experts))
            writer.append(f"s{i}", np.argsort(keys, axis=-1)[..., : SPEC.top_k].astype(np.int32))
    return path


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("form", [{}, {"dtype": "uint8"}, {"pad_policy": "fill", "fill_value": 3},
                                  {"ep_size": 4}, {"packed": True}])
def test_assemble_by_runs_equals_the_general_path(store: Path, case: dict[str, Any], form: dict[str, Any],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    reader = r3store.open_store(store)
    ids = ["s3", "s0", "s5", "s1"]
    options = {**case, **form}
    if options.get("max_seqlen"):
        ids = [s for s in ids if reader.num_tokens(s) <= options["max_seqlen"]]
    if NATIVE is not None:  # the runs path is the one taken
        plan = plan_layout([reader.num_tokens(s) for s in ids], LayoutOptions(**options))
        assert _assemble._plan_runs(plan) is not None
    fast = assemble(reader, ids, options, layers=[4, 0, 1])
    monkeypatch.setattr(_assemble, "_plan_runs", lambda plan: None)
    slow = assemble(r3store.open_store(store), ids, options, layers=[4, 0, 1])
    assert fast.keys() == slow.keys()
    for key, value in fast.items():
        np.testing.assert_array_equal(value, slow[key], err_msg=key)
        assert np.asarray(value).dtype == np.asarray(slow[key]).dtype, key


def test_memoised_checks_raise_every_time(store: Path) -> None:
    reader = r3store.open_store(store)
    assemble(reader, ["s0"], {"pad_policy": "fill", "fill_value": 1})
    for _ in range(2):  # a failed check is not remembered
        with pytest.raises(LayoutOptionError, match="fill_value"):
            assemble(reader, ["s0"], {"pad_policy": "fill", "fill_value": 1 << 40})
    with pytest.raises(LayoutOptionError, match="ep_size"):
        assemble(reader, ["s0"], {"ep_size": 3})
