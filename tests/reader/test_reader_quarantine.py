"""Reading quarantined samples: hints name only parameters that exist; a sample whose
routes could not be stored is an error, not an empty array (issue 13 item 14)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import r3store
from r3store.cli import main
from r3store.errors import SampleNotFoundError

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2)


def routes_of(rng: np.random.Generator, rows: int) -> np.ndarray:
    return np.argsort(rng.random((rows, 4, 16)), axis=-1)[..., :2].astype(np.int32)


@pytest.fixture
def store(tmp_path: Path) -> r3store.RouteStore:
    rng = np.random.default_rng(14)
    rep = routes_of(rng, 20)
    rep[3, 1] = [5, 5]
    unstorable = routes_of(rng, 20)
    unstorable[3, 1] = [99, 5]  # >= 2**bits_per_id: cannot be bit-packed
    with r3store.RouteWriter(tmp_path, SPEC, config={"on_invalid": "quarantine"}) as w:
        w.append("rep", rep)  # 21 tokens, stored as received
        w.append("unstorable", unstorable)  # 21 tokens, routes not storable
        w.append_sglang("not-base64", "!!", num_tokens=21)
        w.append("ok", routes_of(rng, 20))
    return r3store.open_store(tmp_path)


def test_assemble_hint_names_only_parameters_that_exist(store: r3store.RouteStore) -> None:
    with pytest.raises(SampleNotFoundError) as info:
        store.assemble(["rep"])
    message = str(info.value)
    assert "is quarantined" in message
    assert "get(sample_id, include_quarantined=True)" in message
    for call, params in re.findall(r"(\w+)\(([^)]*)\)", message):
        method = getattr(store, call)
        for name in re.findall(r"(\w+)=", params):
            assert name in inspect.signature(method).parameters, (call, name)
    assert "include_quarantined" not in inspect.signature(store.assemble).parameters


def test_get_of_a_quarantined_21_token_sample_returns_its_rows(store: r3store.RouteStore) -> None:
    got = store.get("rep", include_quarantined=True)
    assert got.shape == (20, 4, 2)
    assert store.num_tokens("rep", include_quarantined=True) == 21


@pytest.mark.parametrize("sample_id", ["unstorable", "not-base64"])
def test_get_of_a_sample_whose_routes_were_not_stored_is_a_clear_error(store: r3store.RouteStore,
                                                                      sample_id: str) -> None:
    assert store.num_tokens(sample_id, include_quarantined=True) == 21  # the tokens received, not 1
    for include in (True, False):  # without include_quarantined: not a hint that leads to this error
        with pytest.raises(SampleNotFoundError, match=r"routes could not be stored \(none were kept\), so it has "
                                                      r"no rows to read") as info:
            store.get(sample_id, include_quarantined=include)
        assert "get(sample_id, include_quarantined=True) or" not in str(info.value)
    with pytest.raises(SampleNotFoundError, match=r"include_quarantined=True\) or r3store show reads it"):
        store.get("rep")  # quarantined with rows: the hint to read it stays
    result = CliRunner().invoke(main, ["show", store.url, sample_id])
    assert result.exit_code == 2
    assert "could not be stored" in result.stderr
