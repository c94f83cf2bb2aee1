"""Issue 22 item 1 (found by the swap attack): a storage object of another store whose commit has
the same name and geometry read back silently wrong; format v3 frames carry the store identity in
their position tag, so it is a checksum error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import ChecksumError

SPEC = r3store.ModelSpec(num_layers=2, num_experts=16, top_k=2)


def _write(root: Path, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    routes = np.stack([np.stack([rng.permutation(16)[:2] for _ in range(2)]) for _ in range(9)]).astype(np.int32)
    with r3store.RouteWriter(root, SPEC, config={"writer_id": "w"}) as w:
        w.append("s", routes)
    return routes


def test_a_storage_object_of_another_store_with_the_same_commit_name_is_refused(tmp_path: Path) -> None:
    mine = _write(tmp_path / "mine", 0)
    _write(tmp_path / "other", 1)
    obj = Path("routes") / "w-00000" / "c" / "0" / "0" / "0"
    np.testing.assert_array_equal(r3store.open_store(tmp_path / "mine").get("s"), mine)
    (tmp_path / "mine" / obj).write_bytes((tmp_path / "other" / obj).read_bytes())
    with pytest.raises(ChecksumError, match=r"another place \(or another store\)"):
        r3store.open_store(tmp_path / "mine").get("s")
