"""API misuse gets a clear error, not an AttributeError deep inside."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import PayloadDecodeError, SpecError, SpecMismatchError

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


@pytest.fixture
def store(tmp_path: Path) -> r3store.RouteStore:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("s00", np.tile(np.array([0, 1]), (5, 4, 1)))
    return r3store.open_store(tmp_path)


def test_scalar_arguments_are_rejected_with_a_hint(store: r3store.RouteStore) -> None:
    with pytest.raises(TypeError, match="slice"):
        store.get("s00", rows=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use \[3\]"):
        store.get("s00", layers=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"use \['s00'\]"):
        store.assemble("s00")  # type: ignore[arg-type]


def test_spec_accepts_numpy_ints_and_says_in_range() -> None:
    spec = r3store.ModelSpec(num_layers=np.int64(4), num_experts=np.int32(16), top_k=np.int8(2))
    assert spec == SPEC and type(spec.num_layers) is int
    with pytest.raises(SpecError, match=r"top_k must be in \[1, 16\]"):
        r3store.ModelSpec(num_layers=4, num_experts=16, top_k=17)


def test_spec_mismatch_names_the_differing_fields(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC):
        pass
    other = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=3, moe_layers=range(1, 4))
    with pytest.raises(SpecMismatchError) as err:
        r3store.RouteWriter(tmp_path, other)
    assert err.value.fields == ("top_k", "moe_layers")
    assert "top_k 2 there vs 3" in str(err.value) and "0..3 there vs 1..3" in str(err.value)


def test_sglang_none_and_int64_payloads(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        with pytest.raises(PayloadDecodeError, match="is None.*capture"):
            w.append_sglang("a", {"routed_experts": None})
        routes = np.tile(np.array([3, 7]), (6, 4, 1))
        as_int64 = base64.b64encode(routes.astype("<i8").tobytes()).decode()
        with pytest.raises(PayloadDecodeError, match="int64"):
            w.append_sglang("a", {"routed_experts": as_int64})
        w.append_sglang("a", {"routed_experts": r3store.encode_sglang(routes)})
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("a"), routes)
