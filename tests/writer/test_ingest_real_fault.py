"""Issue 22 item 5: engine payload errors name the real fault.

* A vLLM output or response dict without routed experts said "routes: dtype must be
  integer, got object".
* SGLang zero rows (prompt positions the engine did not route) got the hint "is decoder
  layer 0 dense?".
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest

import r3store
from r3store.errors import ExpertIdError, PayloadDecodeError, RouteShapeError

SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2, moe_layers=[1, 2, 3])


def _routes(rows: int) -> np.ndarray:
    rng = np.random.default_rng(rows)
    out = np.stack([np.stack([rng.permutation(16)[:2] for _ in range(4)]) for _ in range(rows)]).astype(np.int32)
    out[:, 0] = 0  # the dense decoder layer, as SGLang sends it
    return out


def test_a_vllm_dict_without_routed_experts_says_so() -> None:
    response = {"text": "hi", "token_ids": [1, 2, 3], "finish_reason": "stop"}
    with pytest.raises(PayloadDecodeError, match=r"routed_experts: is missing: a dict \(keys 'text', 'token_ids'"):
        r3store.decode_vllm("s", response)
    with pytest.raises(PayloadDecodeError, match="routed-expert capture enabled in vLLM"):
        r3store.decode_vllm("s", SimpleNamespace(text="hi", routed_experts=None))


def test_a_vllm_output_with_routed_experts_is_read_through_it() -> None:
    routes = _routes(4)[:, 1:]
    np.testing.assert_array_equal(r3store.decode_vllm("s", {"routed_experts": routes}), routes)
    np.testing.assert_array_equal(r3store.decode_vllm("s", SimpleNamespace(routed_experts=routes)), routes)


def test_appending_a_response_dict_names_it(tmp_path: object) -> None:
    with r3store.RouteWriter(str(tmp_path), SPEC) as w, \
            pytest.raises(RouteShapeError, match=r"is a dict \(keys 'text'\), not an array"):
        w.append("s", {"text": "hi"})


def test_sglang_zero_prompt_rows_are_not_called_a_dense_layer(tmp_path: object) -> None:
    routes = _routes(6)
    routes[:3] = 0  # the prompt rows the engine did not route
    meta = {"routed_experts": base64.b64encode(routes.astype("<i4").tobytes()).decode(), "prompt_tokens": 4,
            "completion_tokens": 3}
    with r3store.RouteWriter(str(tmp_path), SPEC) as w:
        with pytest.raises(ExpertIdError) as info:
            w.append_sglang("s", {"meta_info": meta})
        text = str(info.value)
        assert "is decoder layer" not in text
        assert "row 0 is zeros in every MoE layer (3 such rows, 0..2)" in text
        assert "allow_missing=True" in text


def test_a_layer_of_zeros_in_every_row_still_asks_whether_it_is_dense(tmp_path: object) -> None:
    routes = _routes(5)
    routes[:, 2] = 0
    with r3store.RouteWriter(str(tmp_path), SPEC) as w, \
            pytest.raises(ExpertIdError, match="all zeros in every row: is decoder layer 2 dense"):
        w.append("s", routes)
