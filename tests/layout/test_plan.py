"""The layout plan (``r3store/layout/_plan.py``): sizes checked before anything is allocated."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from r3store.errors import LayoutOptionError
from r3store.layout import plan_layout


@pytest.mark.parametrize(("kwargs", "option"), [
    ({"tp_size": 2**33, "tp_rank": 0, "sequence_parallel": True}, "tp_size"),
    ({"tp_size": 2**31, "pad_multiple": 2**31}, "tp_size * pad_multiple"),
    ({"pad_multiple": 2**40}, "pad_multiple"),
    ({"layout": "bshd", "max_seqlen": 2**40}, "max_seqlen"),
    ({"layout": "bshd", "max_seqlen": 2**41}, "max_seqlen"),
])
def test_plan_layout_refuses_huge_padding_before_allocating(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(LayoutOptionError) as info:
        plan_layout([3], **kwargs)
    assert info.value.option == option


@pytest.mark.parametrize("num_tokens", [np.array([2**63 + 5], np.uint64), [2**40 + 1], [2**40, 2**40]])
def test_plan_layout_refuses_huge_token_counts(num_tokens: Any) -> None:
    with pytest.raises(LayoutOptionError, match="num_tokens"):
        plan_layout(num_tokens)


def test_plan_layout_huge_cp_size_is_small() -> None:
    assert plan_layout([3], cp_size=2**31, cp_rank=0).index.shape == (2,)
