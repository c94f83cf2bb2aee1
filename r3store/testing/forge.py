"""Forge consistent-looking store objects, to test the rules that sit behind the checksums.

A format v2 store checksums its manifest (CRC-32C) and sample tables (page CRCs and a
BLAKE2b digest), so a naive edit is caught as a :class:`r3store.errors.ChecksumError`
before any rule about the content is reached. These helpers make the edit *and* recompute
the checksums, as a deliberate forger (or a buggy writer) would; readers must still refuse
what breaks a rule. They are test tools: nothing in r3store writes through them.

Examples
--------
>>> import numpy as np, r3store, tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> with r3store.RouteWriter(root, r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)) as w:
...     w.append("a", np.zeros((3, 1, 1), int))
>>> path = rewrite_table(next((root / "index").rglob("*.parquet")),
...                      lambda t: t.set_column(2, "num_rows", pa.array([9], pa.int64())))
>>> r3store.open_store(root)
Traceback (most recent call last):
...
r3store.errors.FormatError: ...column 'num_rows' must be num_tokens - 1 ...; row 0 (sample 'a') has 9
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from r3store._format import manifest_checksum, table_digest

__all__ = ["reseal_manifest", "reseal_table", "rewrite_table"]


def reseal_table(data: bytes, edit: Callable[[pa.Table], pa.Table] | None = None) -> bytes:
    """A sample table's bytes after ``edit``, with its digest recomputed (format v2 and later; v1: unchanged).

    Parameters
    ----------
    data : bytes
        A Parquet sample table.
    edit : callable, optional
        Takes and returns the table (as pyarrow reads it, key-value metadata included).

    Returns
    -------
    bytes
        The table written again (zstd, page CRCs) with ``r3store.digest`` matching its new
        content and its ``r3store.version`` / ``r3store.spec`` metadata.
    """
    table = pq.read_table(io.BytesIO(data))
    meta = dict(table.schema.metadata or {})
    if edit is not None:
        table = edit(table)
    version = meta.get(b"r3store.version", b"").decode()
    if version not in ("", "1"):  # format v2 and later carry a digest
        spec = meta.get(b"r3store.spec", b"").decode()
        meta[b"r3store.digest"] = table_digest(table.replace_schema_metadata(None), version, spec).encode()
    table = table.replace_schema_metadata(meta)
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
    return sink.getvalue()


def rewrite_table(path: str | Path, edit: Callable[[pa.Table], pa.Table]) -> Path:
    """Edit the sample table at ``path`` in place, resealed (see :func:`reseal_table`); return ``path``."""
    path = Path(path)
    path.write_bytes(reseal_table(path.read_bytes(), edit))
    return path


def reseal_manifest(path: str | Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """Edit a store's ``r3store.json`` in place (``edit`` changes the dict) and recompute its checksum."""
    path = Path(path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    if edit is not None:
        edit(doc)
    if doc.get("version", 1) >= 2:
        doc["checksum"] = manifest_checksum(doc)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path
