"""The read core: open a store, find samples, read their routes (numpy, no layout, no torch).

* :class:`RouteReader` (opened with :meth:`RouteReader.open`; users call
  :func:`r3store.open_store`) and :class:`ReaderOptions`, its options passed whole:
  random access by sample id, row range and layer range (``open_reader`` is a deprecated
  alias of opening);
* the sample catalogue (``_catalog.py``): sample tables found (:func:`table_keys`),
  loaded, checked, merged and deduplicated, optionally on top of rows loaded elsewhere
  (:class:`Preloaded`: a verified table and the commits it covers); which commits exist
  and which route objects belong to none (:func:`committed_commits`,
  :func:`uncommitted_route_objects`);
* :func:`compact` (``_compact.py``): a checkpoint of every commit so far, which
  catalogues start from (``load_checkpoint``, ``checkpoint_keys``);
* :func:`sample_rows`: the one rule for a row range of a sample (``get(rows=)``,
  ``show --rows``): past either end is refused, never clipped;
* :func:`filter_samples`: the rows of a sample table a pyarrow compute expression
  selects (the one code path behind every ``filter=``);
* the chunk reader (``_chunks.py``): array documents checked against their commit,
  object indexes, ranged reads coalesced (:func:`merge_ranges`), frames decoded through
  the codec registry and checked against their place (format v2), an LRU cache;
* :class:`BufferPool` (``_pool.py``): the memory of released output arrays, reused for
  later outputs (``ReaderOptions.output_pool_bytes``).

It imports nothing above it: laying routes out for a trainer is :mod:`r3store.batch`.
"""

from typing import Any

from r3store.reader._catalog import (
    LoadedCheckpoint,
    OnDuplicate,
    Preloaded,
    StorageUsage,
    checkpoint_keys,
    committed_commits,
    load_checkpoint,
    read_all_rows,
    table_keys,
    uncommitted_route_objects,
)
from r3store.reader._chunks import merge_ranges
from r3store.reader._compact import CompactResult, compact
from r3store.reader._filter import filter_samples
from r3store.reader._options import ReaderOptions, ReaderOptionsDict
from r3store.reader._pool import BufferPool
from r3store.reader._ranges import describe_rows, sample_rows
from r3store.reader._reader import RouteReader

__all__ = [
    "BufferPool",
    "CompactResult",
    "LoadedCheckpoint",
    "OnDuplicate",
    "Preloaded",
    "ReaderOptions",
    "ReaderOptionsDict",
    "RouteReader",
    "StorageUsage",
    "checkpoint_keys",
    "committed_commits",
    "compact",
    "describe_rows",
    "filter_samples",
    "load_checkpoint",
    "merge_ranges",
    "read_all_rows",
    "sample_rows",
    "table_keys",
    "uncommitted_route_objects",
]


def __getattr__(name: str) -> Any:
    if name == "open_reader":  # deprecated (warns when called; removed in 0.4.0): not in __all__
        from r3store.reader._reader import open_reader

        return open_reader
    raise AttributeError(f"module 'r3store.reader' has no attribute {name!r}")
