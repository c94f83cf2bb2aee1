"""Changed bytes of a one-sample sample table: refused, skipped, or harmless.

A sample table's digest (FORMAT.md 6.1) binds every cell, the column names and types and its
key-value metadata; Parquet's page CRC-32 binds each page's payload. Bytes that bind no cell
are not covered by either: the statistics in each page header and column chunk (min, max,
null count), the footer's ``created_by``, the schema root's name, encoding lists and a few
offsets Arrow does not use. A changed byte there is not detected, and must change nothing a
reader returns. Each case changes one byte (XOR with a mask) of the table of a store holding
one sample with a missing row and opens it twice:

* ``on_damaged_table="raise"``: an r3store error, or every answer (ids, ``len``, the
  ``samples`` table, each ``row``, ``get``, ``num_tokens``) equal to the undamaged store's,
  with no warning;
* ``on_damaged_table="skip"``: the same answers with no warning, or a ``DamagedTableWarning``,
  an empty store and the commit in ``skipped_commits``.

The report counts the undetected changes per Parquet column chunk (``footer`` for the footer).

    python -m tests.fuzz.tables --stride 1 --masks 255,1,128,16
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import r3store
from r3store import errors

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.routes import SPEC_5X40, random_routes  # noqa: E402

__all__ = ["flips", "main"]


def _answers(url: Path, options: dict[str, Any] | None) -> tuple[dict[str, Any], list[warnings.WarningMessage],
                                                                   dict[str, str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = r3store.open_store(url, reader=options)
        out: dict[str, Any] = {"ids": store.sample_ids, "len": len(store), "samples": store.samples.to_pylist()}
        for sid in store.sample_ids:
            row = sorted((k, repr(v)) for k, v in store.row(sid).items())
            out[sid] = (np.asarray(store.get(sid)).tobytes(), row, store.num_tokens(sid))
        skipped = dict(store.skipped_commits)
    return out, list(caught), skipped


def _regions(data: bytes) -> list[tuple[int, int, str]]:
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    out = []
    for c in range(md.num_columns):
        cc = md.row_group(0).column(c)
        start = cc.data_page_offset
        if cc.has_dictionary_page and cc.dictionary_page_offset:
            start = cc.dictionary_page_offset
        out.append((start, start + cc.total_compressed_size, cc.path_in_schema))
    return out


def flips(*, stride: int = 1, masks: tuple[int, ...] = (0xFF,), seed: int = 1) -> dict[str, Any]:
    """Change one byte of a one-sample table at every ``stride``-th position (from an offset
    drawn from ``seed``) with each mask; return ``cases``, ``undetected`` (per region),
    ``failures`` (their descriptions) and ``seconds``."""
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    failures: list[str] = []
    undetected: Counter[str] = Counter()
    cases = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        routes = random_routes(rng, 7)
        routes[2] = -1
        with r3store.RouteWriter(src, SPEC_5X40) as writer:
            writer.append("s0", routes, allow_missing=True)
        want, caught, _ = _answers(src, None)
        assert not caught
        assert len(want["ids"]) == 1
        table = next(src.rglob("*.parquet"))
        data = table.read_bytes()
        commit = want["samples"][0]["commit"]
        regions = _regions(data)
        dst = Path(tmp) / "dst"
        shutil.copytree(src, dst)
        target = dst / table.relative_to(src)
        for pos in range(int(rng.integers(stride)), len(data), stride):
            where = next((name for a, b, name in regions if a <= pos < b), "footer")
            for mask in masks:
                changed = bytearray(data)
                changed[pos] ^= mask
                target.write_bytes(bytes(changed))
                cases += 1
                label = f"byte {pos} ({where}) ^ {mask:#04x}"
                try:
                    got, caught, _ = _answers(dst, None)
                except errors.R3StoreError:
                    got = None
                except Exception as exc:  # noqa: BLE001 (the oracle: anything else is a failure)
                    failures.append(f"{label}: {type(exc).__name__} outside r3store.errors: {exc}")
                    continue
                if got is not None:
                    undetected[where] += 1
                    if caught:
                        failures.append(f"{label}: undetected with a warning {caught[0].category.__name__}")
                    if got != want:
                        keys = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                        failures.append(f"{label}: undetected and different: {keys}")
                try:
                    skip, caught, skipped = _answers(dst, {"on_damaged_table": "skip"})
                except errors.R3StoreError as exc:
                    if got is not None:
                        failures.append(f"{label}: skip raised {type(exc).__name__} where raise read it")
                    continue
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"{label}: skip: {type(exc).__name__} outside r3store.errors: {exc}")
                    continue
                if got is not None:
                    if skip != want or caught:
                        failures.append(f"{label}: skip answers otherwise than raise")
                elif not (skip["ids"] == [] and list(skipped) == [commit]
                          and [w.category for w in caught] == [errors.DamagedTableWarning]):
                    failures.append(f"{label}: skip: ids {skip['ids']}, skipped {list(skipped)}, "
                                    f"warnings {[w.category.__name__ for w in caught]}")
    return {"cases": cases, "undetected": dict(undetected), "failures": failures,
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.tables", description=__doc__.split("\n")[0])
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--masks", default="255", help="comma-separated XOR masks (1..255)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    masks = tuple(int(m, 0) for m in args.masks.split(","))
    report = flips(stride=args.stride, masks=masks, seed=args.seed)
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
