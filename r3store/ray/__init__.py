"""r3store on Ray: Ray Data source and sink, cluster-wide audits, the rollout-to-trainer hand-off.

Needs ``pip install 'r3store[ray]'``; ``import r3store`` never imports this package (nor ray).

* :func:`read_routes` / :class:`RouteDatasource`: a store as a ``ray.data.Dataset``, one
  row per sample (``sample_id``, ``routes`` as a ragged uint8 (uint16 past 256 experts) tensor column,
  ``num_tokens``, metadata), one read task per group of commits;
* :func:`write_routes` / :class:`RouteDatasink`: a dataset of routes (arrays or SGLang
  payloads) into a store, each write task one :class:`r3store.RouteWriter`; a task that
  Ray retries re-commits nothing its earlier attempt committed;
* :func:`validate`, :func:`stats`, :func:`diff`, :func:`run_plan`: the audits of
  :mod:`r3store.audit` as Ray tasks over groups of commits, merged to exactly the
  single-process result (``r3store validate|stats|diff URL --ray [ADDRESS]``);
* :func:`connect`, :func:`object_store_bytes`: joining a cluster, and measuring what a
  value costs in the object store (the hand-off: send sample ids, not routes).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

try:
    import ray as _ray  # noqa: F401  (the extra's presence, checked before the modules that need it)
except ImportError as _exc:
    raise ImportError("r3store.ray needs ray: pip install 'r3store[ray]'") from _exc

from r3store.ray._audit import diff, run_plan, stats, validate
from r3store.ray._cluster import connect, object_store_bytes

if TYPE_CHECKING:
    from r3store.ray._sink import RouteColumns, RouteColumnsDict, RouteDatasink, WriteSummary, write_routes
    from r3store.ray._source import RouteDatasource, block_dtype, read_routes

__all__ = [
    "RouteColumns",
    "RouteColumnsDict",
    "RouteDatasink",
    "RouteDatasource",
    "WriteSummary",
    "block_dtype",
    "connect",
    "diff",
    "object_store_bytes",
    "read_routes",
    "run_plan",
    "stats",
    "validate",
    "write_routes",
]

# The source and the sink need ray.data (about 4 s to import): loaded on first use, so that
# the audits' tasks (and `r3store validate --ray`) start without it.
_LAZY = {"RouteColumns": "_sink", "RouteColumnsDict": "_sink", "RouteDatasink": "_sink", "WriteSummary": "_sink",
         "write_routes": "_sink",
         "RouteDatasource": "_source", "block_dtype": "_source", "read_routes": "_source"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value

