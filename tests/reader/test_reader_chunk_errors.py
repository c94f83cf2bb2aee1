"""What ``get`` says about a damaged route object: the sample, its rows and the decoder layer of a
chunk that fails its CRC-32C; the object's size when its index fails (a truncated object)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import r3store
from r3store.errors import ChecksumError
from tests.routes import write_committed


def test_a_corrupt_chunk_names_the_sample_its_rows_and_the_decoder_layer(tmp_path: Path) -> None:
    root, _, shard_file, _ = write_committed(tmp_path / "s")
    before = r3store.open_store(root)
    assert before.geometry_of(before.row("g0")["array"]).layers_per_chunk == 1
    buf = bytearray(shard_file.read_bytes())
    buf[30] ^= 0x10  # inside the first frame: row chunk 0, layer chunk 0 (decoder layer 1)
    shard_file.write_bytes(bytes(buf))
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError) as caught:
        store.get("g0")
    text = str(caught.value)
    assert caught.value.chunk == (0, 0, 0)
    assert "sample 'g0'" in text
    assert "its rows 0-3" in text
    assert "decoder layer 1 " in text
    assert "row chunk 0: array rows 0-3" in text


def test_a_truncated_object_reports_its_size(tmp_path: Path) -> None:
    root, _, shard_file, _ = write_committed(tmp_path / "s")
    size = shard_file.stat().st_size
    os.truncate(shard_file, size // 2)
    store = r3store.open_store(root)
    with pytest.raises(ChecksumError, match="truncated") as caught:
        store.get("big")
    assert f"the object is {size // 2:,} bytes" in str(caught.value)
    assert "sample 'big'" in str(caught.value)
