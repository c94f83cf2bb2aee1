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

import importlib
from typing import TYPE_CHECKING, Any

from r3store import errors
from r3store._version import __version__

if TYPE_CHECKING:
    from r3store._spec import ModelSpec
    from r3store._store import RouteStore, open_store
    from r3store.dataset import RouteDataset, to_device
    from r3store.layout import LayoutOptions
    from r3store.reader import ReaderOptions, RouteReader, compact
    from r3store.writer import RouteWriter, WriterConfig, decode_sglang, decode_vllm, encode_sglang

__all__ = [
    "LayoutOptions",
    "ModelSpec",
    "ReaderOptions",
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
    "open_store",
    "to_device",
]

_LAZY = {
    "LayoutOptions": "r3store.layout",
    "ModelSpec": "r3store._spec",
    "ReaderOptions": "r3store.reader",
    "RouteDataset": "r3store.dataset",
    "RouteReader": "r3store.reader",
    "RouteStore": "r3store._store",
    "RouteWriter": "r3store.writer",
    "WriterConfig": "r3store.writer",
    "decode_sglang": "r3store.writer",
    "decode_vllm": "r3store.writer",
    "encode_sglang": "r3store.writer",
    "compact": "r3store.reader",
    "open_store": "r3store._store",
    "to_device": "r3store.dataset",
}
"""Public names imported on first use, so that ``import r3store`` (and ``r3store --help``)
loads neither numpy, pyarrow nor zarr until something needs them (torch: only the
dataset names)."""

_SHOWN_HERE = frozenset(_LAZY) - {"RouteDataset", "to_device", "LayoutOptions", "ReaderOptions"}
"""Names documented as ``r3store.<name>`` (their ``__module__`` is set to ``"r3store"``)."""


_SUBPACKAGES = frozenset({"audit", "batch", "cli", "codecs", "data", "dataset", "layout", "ray", "reader", "replay",
                          "storage", "testing", "writer"})
"""Subpackages reachable as ``r3store.<name>`` after a plain ``import r3store`` (imported on
first use; ``r3store.ray`` needs the ``[ray]`` extra, ``dataset``/``replay`` need torch)."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        if name in _SHOWN_HERE:
            value.__module__ = "r3store"
        globals()[name] = value  # later lookups skip this function
        return value
    if name == "open_reader":  # deprecated (warns when called; removed in 0.4.0): never bound here, not in __all__
        from r3store.reader import open_reader

        return open_reader
    if name in _SUBPACKAGES:
        return importlib.import_module(f"r3store.{name}")  # the import binds it in this module
    raise AttributeError(f"module 'r3store' has no attribute {name!r}")
