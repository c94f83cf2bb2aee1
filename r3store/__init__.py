"""r3store: store and stream MoE routing traces for Rollout Routing Replay (R3).

Writer -> codec -> storage -> reader -> batch (layout applied) -> dataset (torch)::

    import r3store
    spec = r3store.ModelSpec(num_layers=48, num_experts=128, top_k=8)
    with r3store.RouteWriter("traces/", spec) as w:
        w.append("sample-0", routes)            # (num_tokens - 1, num_layers, top_k)
    store = r3store.open_store("traces/")
    store.get("sample-0", layers=range(0, 12))  # int32 (num_tokens - 1, 12, top_k)

``RouteDataset`` (needs torch) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from r3store import errors
from r3store._spec import ModelSpec
from r3store._store import RouteStore, open_store
from r3store._version import __version__
from r3store.reader import RouteReader, compact, open_reader
from r3store.writer import RouteWriter, WriterConfig, decode_sglang, decode_vllm, encode_sglang

__all__ = [
    "ModelSpec",
    "RouteDataset",
    "RouteReader",
    "RouteStore",
    "RouteWriter",
    "WriterConfig",
    "__version__",
    "compact",
    "decode_sglang",
    "decode_vllm",
    "encode_sglang",
    "errors",
    "open_reader",
    "open_store",
    "to_device",
]

_LAZY = {"RouteDataset": "r3store.dataset", "to_device": "r3store.dataset"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'r3store' has no attribute {name!r}")


for _obj in (ModelSpec, RouteReader, RouteStore, RouteWriter, WriterConfig, open_reader, open_store, decode_sglang,
             decode_vllm, encode_sglang, compact):
    _obj.__module__ = "r3store"
del _obj
