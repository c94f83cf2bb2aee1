"""``get_many`` and ``assemble`` of one bytes object name it, as they name a single str (iterated,
it gave its byte values: "sample_id must be a str, got int")."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from tests.routes import SPEC_4X16, routes_4x16


@pytest.mark.parametrize("ids", [b"s0", bytearray(b"s0"), memoryview(b"s0")])
def test_get_many_and_assemble_name_a_bytes_id_list(tmp_path: Path, ids: object) -> None:
    with r3store.RouteWriter(str(tmp_path), SPEC_4X16) as w:
        w.append("s0", routes_4x16(6, 1))
    store = r3store.open_store(tmp_path)
    with pytest.raises(TypeError, match=r"sample_ids must be a sequence of str ids, got the bytes"):
        store.get_many(ids)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"sample_ids must be a sequence of str ids, got the bytes"):
        store.assemble(ids)  # type: ignore[arg-type]
