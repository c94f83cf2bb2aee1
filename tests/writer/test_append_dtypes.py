"""``append`` takes routes of any integer dtype, byte order and memory layout and refuses
every other dtype as a RouteShapeError naming the sample (found by the differential fuzz
targets: timedelta64 routes, which numpy files under ``np.signedinteger``, got past the
dtype check and failed in the kernels with a CodecError naming neither the sample nor the
field)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import RouteShapeError

SPEC = r3store.ModelSpec(num_layers=3, num_experts=300, top_k=2)
ROUTES = np.argsort(np.random.default_rng(0).random((20, 3, 300)), axis=-1)[..., :2].astype(np.int32)


@pytest.mark.parametrize("dtype", ["m8[s]", "m8[ns]", "M8[s]", "f4", "c8", "?", "U3", "O"])
def test_a_non_integer_dtype_is_a_route_shape_error_naming_the_sample(tmp_path: Path, dtype: str) -> None:
    with r3store.RouteWriter(tmp_path / "s", SPEC) as w:
        with pytest.raises(RouteShapeError, match=r"sample 'x': routes: dtype must be integer"):
            w.append("x", ROUTES.astype(dtype))
        w.append("ok", ROUTES)
    assert r3store.open_store(tmp_path / "s").sample_ids == ["ok"]


@pytest.mark.parametrize("form", ["<i2", ">i2", ">i8", "<u2", ">u4", "reversed", "fortran", "strided"])
def test_integer_routes_in_any_byte_order_and_layout_read_back(tmp_path: Path, form: str) -> None:
    if form == "reversed":
        arr = ROUTES[::-1].copy()[::-1]
    elif form == "fortran":
        arr = np.asfortranarray(ROUTES)
    elif form == "strided":
        arr = np.repeat(ROUTES, 2, axis=2)[..., ::2]
    else:
        arr = ROUTES.astype(form)
    with r3store.RouteWriter(tmp_path / "s", SPEC) as w:
        w.append("x", arr)
    np.testing.assert_array_equal(r3store.open_store(tmp_path / "s").get("x"), ROUTES)


def test_timedelta_routes_and_tokens_are_refused_or_quarantined_without_routes(tmp_path: Path) -> None:
    with r3store.RouteWriter(tmp_path / "s", SPEC, config={"on_invalid": "quarantine"}) as w:
        w.append("td", ROUTES.astype("m8[s]"))
        w.append("ok", ROUTES)
    with r3store.RouteWriter(tmp_path / "t", SPEC) as w2, \
            pytest.raises(r3store.errors.RouteValidationError, match="sample 'tok': tokens: must be a 1-D integer"):
        w2.append("tok", ROUTES, tokens=np.arange(21).astype("m8[s]"))
    store = r3store.open_store(tmp_path / "s")
    assert store.sample_ids == ["ok"]
    assert "dtype must be integer" in store.row("td", include_quarantined=True)["reason"]
    with pytest.raises(r3store.errors.SampleNotFoundError):
        store.get("td", include_quarantined=True)
