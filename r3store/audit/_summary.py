"""`summarize`: what ``r3store inspect`` prints, as plain data."""

from __future__ import annotations

import math
from typing import Any

import pyarrow.compute as pc

from r3store._format import RESERVED_COLUMNS
from r3store.reader import RouteReader

__all__ = ["summarize"]


def summarize(store: RouteReader) -> dict[str, Any]:
    """Summary of a store: counts, spec, bytes, bits per expert id, commits.

    Parameters
    ----------
    store : RouteReader

    Returns
    -------
    dict
        JSON-ready: ``url``, ``format_version`` (of the store: 1 or 2), ``spec``, ``samples`` (visible),
        ``quarantined``, ``duplicates``, ``damaged_tables`` (commit -> fault of each sample table
        a reader opened with ``on_damaged_table="skip"`` left out; its samples are not counted),
        ``tokens``, ``route_rows``, ``expert_ids``,
        ``route_bytes`` (bytes of the chunk objects of committed route arrays),
        ``index_bytes`` (Parquet sample tables), ``bits_per_id`` (route_bytes * 8 /
        expert_ids), ``ideal_bits_per_id`` (``ceil(log2(num_experts))``),
        ``overhead_pct`` (over the ideal), ``codec`` (the codec id of the newest
        commit's route array: ``"r3store.bitpack"``, ``"r3store.set"``; None without
        commits), ``codecs`` (every codec id of the committed route arrays, with how many
        arrays use it: a store written with several codecs has several),
        ``set_bound_bits_per_id`` (``log2 C(num_experts, top_k) / top_k``: the
        fewest bits per id any coder of uniformly random sets spends, the bound
        ``r3store.set`` comes within 2% of), ``size_vs_int32`` (route_bytes / (4 *
        expert_ids)), ``int32_bytes``, ``commits``, ``writers``, ``uncommitted_commits``,
        ``uncommitted_bytes``, ``first_commit``/``last_commit`` (ISO 8601, UTC) and
        ``metadata_columns`` (``schema/cli-inspect.schema.json`` version 3: ``codecs`` added;
        version 2 dropped the old ``shards`` and ``uncommitted_shards`` keys).
    """
    spec = store.spec
    table = store.samples
    rows = int(pc.sum(table.column("num_rows")).as_py() or 0)
    ids = rows * spec.num_moe_layers * spec.top_k
    usage = store.storage_usage()
    route_bytes = usage.route_bytes
    committed = table.column("committed_at")
    quarantined = int(pc.sum(table.column("quarantined")).as_py() or 0)
    bits = route_bytes * 8 / ids if ids else 0.0
    codec = None
    if len(table):
        newest = table.column("array")[pc.index(table.column("committed_at"), pc.max(table.column("committed_at")))
                                       .as_py()].as_py()
        codec = store.geometry_of(newest).codec["id"]
    codecs: dict[str, int] = {}
    for array in sorted(set(table.column("array").to_pylist())):
        codec_id = store.geometry_of(array).codec["id"]
        codecs[codec_id] = codecs.get(codec_id, 0) + 1
    bound = math.log2(math.comb(spec.num_experts, spec.top_k)) / spec.top_k
    return {
        "url": store.url,
        "format_version": store.format_version,
        "spec": dict(spec.to_dict()),
        "samples": len(store),
        "quarantined": quarantined,
        "duplicates": {k: list(v) for k, v in store.duplicates.items()},
        "damaged_tables": store.skipped_commits,
        "tokens": int(pc.sum(table.column("num_tokens")).as_py() or 0),
        "route_rows": rows,
        "expert_ids": ids,
        "route_bytes": route_bytes,
        "index_bytes": usage.index_bytes,
        "int32_bytes": ids * 4,
        "bits_per_id": round(bits, 4),
        "ideal_bits_per_id": spec.bits_per_id,
        "overhead_pct": round((bits / spec.bits_per_id - 1) * 100, 3) if ids else 0.0,
        "codec": codec,
        "codecs": dict(sorted(codecs.items())),
        "set_bound_bits_per_id": round(bound, 4),
        "size_vs_int32": round(route_bytes / (ids * 4), 5) if ids else 0.0,
        "commits": len(store.commits),
        "writers": len(set(table.column("writer_id").to_pylist())),
        "uncommitted_commits": sorted(usage.uncommitted),
        "uncommitted_bytes": sum(usage.uncommitted.values()),
        "first_commit": pc.min(committed).as_py().isoformat() if len(table) else None,
        "last_commit": pc.max(committed).as_py().isoformat() if len(table) else None,
        "metadata_columns": [c for c in table.column_names if c not in RESERVED_COLUMNS],
    }
