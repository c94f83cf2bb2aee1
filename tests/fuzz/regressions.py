"""Regression inputs of the fuzz targets: the crash inputs of issue 13, as target inputs.

``python -m tests.fuzz.regressions`` (re)writes them under ``tests/fuzz/regressions/<target>/``;
the test suite replays every file there (``test_fuzz.py``), each of which once raised an
exception outside :mod:`r3store.errors`, allocated without bound, or served wrong routes.
Inputs the fuzzer finds later are copied there by hand (``findings/<target>/*.bin``).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent / "regressions"


def _frame(bits: int, n_total: int, n_encoded: int, payload: bytes, tag: int = 0) -> bytes:
    head = b"R3BP" + bytes([2, bits, 0, 0]) + struct.pack("<III", n_total, n_encoded, tag)
    return head + struct.pack("<I", google_crc32c.value(head + payload)) + payload


def _index(entries: np.ndarray) -> bytes:
    raw = entries.astype("<u8").tobytes()
    return raw + struct.pack("<I", google_crc32c.value(raw))


def build() -> dict[str, dict[str, bytes]]:
    from tests.fuzz.targets import COMMIT, OBJECT, _index_size, _table_key, base_objects

    objects = base_objects()
    out: dict[str, dict[str, bytes]] = {}

    # item 9: a frame with a valid CRC declaring 2**32 - 1 ids (16 GiB of int32 decoded)
    out["codec"] = {"item9-frame-declares-16gib": bytes([6]) + _frame(7, 2**32 - 1, 0, b"")}

    # item 7: .npy headers numpy parses with tokenize/ast; a header claiming 10**12 rows
    def npy(header: str) -> bytes:
        text = header + " " * (63 - len(header) % 64) + "\n"
        return b"\x02\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + b"\0" * 16

    out["ingest"] = {
        "item7-npy-header-unterminated": npy("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 4, 2), "),
        "item7-npy-header-syntax": npy("{'descr': '<i4' 'shape': (3, 4, 2)}"),
        "npy-header-claims-1e12-rows": npy(
            "{'descr': '<i4', 'fortran_order': False, 'shape': (1000000000000, 4, 2), }"),
        "sglang-int64-payload": b"\x01" + np.arange(1, 25, dtype="<i8").tobytes(),
    }

    # items 3 and 7: one-character manifest edits that keep it valid; an integer of 5,000 digits
    manifest = objects["r3store.json"].decode()
    out["manifest"] = {
        "item3-num-experts-edit": manifest.replace('"num_experts": 300', '"num_experts": 200').encode(),
        "item3-moe-layers-shift": manifest.replace('"moe_layers": [\n      1', '"moe_layers": [\n      0')
                                          .replace("      4\n", "      3\n").encode(),
        "item3-num-layers-edit": manifest.replace('"num_layers": 5', '"num_layers": 6').encode(),
        "item7-huge-integer": manifest.replace('"top_k": 3', '"top_k": ' + "9" * 5000).encode(),
        "deeply-nested": manifest.replace('"created_by"', '"x": ' + "[" * 100_000 + "]" * 100_000 + ', "created_by"')
                                 .encode(),
    }

    # items 3, 7 and 17: zarr.json edits
    doc_key = f"routes/{COMMIT}/zarr.json"
    doc = json.loads(objects[doc_key])
    huge = dict(doc, shape=[2**40, *doc["shape"][1:]])
    other_layers = json.loads(objects[doc_key])
    other_layers["attributes"] = {**other_layers.get("attributes", {})}
    out["zarr_json"] = {
        "item7-huge-integer": objects[doc_key].replace(b'"zarr_format": 3', b'"zarr_format": ' + b"3" * 5000),
        "item17-shape-2-40-rows": json.dumps(huge, indent=2).encode(),
        "shape-one-row-short": json.dumps(dict(doc, shape=[doc["shape"][0] - 1, *doc["shape"][1:]])).encode(),
    }

    # items 5 and 7: shard index entries with a valid CRC: nbytes 0, past the end, swapped frames
    blob = objects[OBJECT]
    size = _index_size()
    entries = np.frombuffer(blob[-size:-4], "<u8").reshape(-1, 2).copy()
    zero = entries.copy()
    zero[-1, 1] = 0
    past = entries.copy()
    past[0, 0] = len(blob)
    swapped = entries[[1, 0, *range(2, len(entries))]]
    huge_entry = entries.copy()
    huge_entry[0, 1] = 2**63
    out["shard_index"] = {
        "item7-entry-nbytes-0": _index(zero),
        "entry-past-the-end": _index(past),
        "item5-frames-swapped": _index(swapped),
        "entry-2-63-bytes": _index(huge_entry),
    }

    # items 4, 7 and 17: sample tables edited and resealed (digest recomputed) or edited without it
    from r3store.testing import forge

    table = objects[_table_key()]

    def set_column(name: str, values: pa.Array) -> bytes:
        return forge.reseal_table(table, lambda t: t.set_column(t.schema.get_field_index(name),
                                                                t.schema.field(name), values))

    import io

    import pyarrow.parquet as pq

    current = pq.read_table(io.BytesIO(table))
    ids = current.column("sample_id").to_pylist()
    bad_utf8 = pa.array([i.encode() for i in ids[:-1]] + [b"s\xff"], pa.binary()).cast(pa.string(), safe=False)
    rows = current.column("num_rows").to_pylist()
    out["sample_table"] = {
        "item7-invalid-utf8-sample-id": set_column("sample_id", bad_utf8),
        "item17-2-39-rows": forge.reseal_table(table, lambda t: t.set_column(
            t.schema.get_field_index("num_rows"), "num_rows", pa.array([2**39, *rows[1:]], pa.int64()))),
        "item4-ids-swapped-not-resealed": _swap_ids_keep_digest(table, ids),
    }
    return out


def _swap_ids_keep_digest(table: bytes, ids: list[str]) -> bytes:
    """Two sample ids swapped, the table written again with its old metadata (digest not recomputed)."""
    import io

    import pyarrow.parquet as pq

    t = pq.read_table(io.BytesIO(table))
    swapped = [ids[1], ids[0], *ids[2:]]
    t = t.set_column(t.schema.get_field_index("sample_id"), t.schema.field("sample_id"), pa.array(swapped, pa.string()))
    sink = io.BytesIO()
    pq.write_table(t, sink, compression="zstd", write_page_checksum=True)
    return sink.getvalue()


def main() -> None:
    for target, inputs in build().items():
        folder = HERE / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in inputs.items():
            (folder / f"{name}.bin").write_bytes(data)
        print(target, len(inputs))


if __name__ == "__main__":
    main()
