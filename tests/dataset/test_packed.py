"""Bit-packed routes on the device (``r3store/dataset/_packed.py``)."""

from __future__ import annotations

import pytest

import r3store


@pytest.mark.parametrize("shape", [(-2,), (-2, -3), (2.5,), "12", (True, 2)])
def test_unpack_routes_refuses_a_bad_shape(shape: object) -> None:
    """Finding: negative dims escaped as torch's RuntimeError and (2.5,) was truncated to (2,)."""
    torch = pytest.importorskip("torch")
    from r3store.dataset import unpack_routes

    with pytest.raises(r3store.errors.OptionError, match="shape"):
        unpack_routes(torch.zeros(10, dtype=torch.uint8), 4, shape)  # type: ignore[arg-type]
