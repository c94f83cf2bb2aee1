"""A damaged sample table costs only its own commit when the reader asks for it
(``ReaderOptions.on_damaged_table="skip"``): warned, listed, every other commit read; the
default still raises (a trainer never trains on fewer samples without being told)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import DamagedTableWarning, FormatError, OptionError
from tests.routes import SPEC_4X16, routes_4x16, sample_tables


def write_three_commits(root: Path) -> dict[str, np.ndarray]:
    """Three commits of two samples each (``c<commit>s<sample>``), no checkpoint."""
    data = {}
    with r3store.RouteWriter(str(root), SPEC_4X16) as w:
        for c in range(3):
            for s in range(2):
                sid = f"c{c}s{s}"
                data[sid] = routes_4x16(6, 10 * c + s)
                w.append(sid, data[sid])
            w.flush()
    return data


def damage(table: Path, offset: int = 50) -> None:
    """Flip one byte of a sample table (a page header or page: it fails to parse or its CRC fails)."""
    buf = bytearray(table.read_bytes())
    buf[offset] ^= 0xFF
    table.write_bytes(bytes(buf))


def commit_of(table: Path) -> str:
    return table.name.removesuffix(".parquet")


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray], str]:
    root = tmp_path / "store"
    data = write_three_commits(root)
    table = sample_tables(root)[1]
    damage(table)
    return root, data, commit_of(table)


def test_the_default_still_raises_on_a_damaged_table(damaged: tuple[Path, dict[str, np.ndarray], str]) -> None:
    root, _, commit = damaged
    with pytest.raises(FormatError, match=commit):
        r3store.open_store(root)


def test_skip_leaves_out_only_the_damaged_commit(damaged: tuple[Path, dict[str, np.ndarray], str]) -> None:
    root, data, commit = damaged
    with pytest.warns(DamagedTableWarning) as caught:
        store = r3store.open_store(root, reader={"on_damaged_table": "skip"})
    (warning,) = caught
    message = warning.message
    assert isinstance(message, DamagedTableWarning)
    assert message.commit == commit
    assert commit in message.path
    assert message.fault
    assert list(store.skipped_commits) == [commit]
    assert commit in store.skipped_commits[commit]  # the table's path, then the fault
    assert store.sample_ids == ["c0s0", "c0s1", "c2s0", "c2s1"]
    assert commit not in store.commits
    assert len(store.commits) == 2
    for sid in store.sample_ids:
        np.testing.assert_array_equal(store.get(sid), data[sid])


def test_refresh_skips_a_damaged_new_table_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    write_three_commits(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = r3store.open_store(root, reader={"on_damaged_table": "skip"})
    assert store.skipped_commits == {}
    with r3store.RouteWriter(str(root), SPEC_4X16) as w:
        w.append("late0", routes_4x16(6, 99))
        w.flush()
        w.append("late1", routes_4x16(6, 98))
    new = [t for t in sample_tables(root) if commit_of(t) not in store.commits]
    assert len(new) == 2
    damage(min(new))
    with pytest.warns(DamagedTableWarning):
        assert store.refresh() == 1
    assert list(store.skipped_commits) == [commit_of(min(new))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not read (nor warned about) again
        assert store.refresh() == 0


def test_a_checkpoint_covering_the_commit_needs_no_table(tmp_path: Path) -> None:
    root = tmp_path / "store"
    data = write_three_commits(root)
    r3store.compact(str(root))
    damage(sample_tables(root)[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        store = r3store.open_store(root)  # default options: the checkpoint holds the commit's rows
    assert store.sample_ids == list(data)
    np.testing.assert_array_equal(store.get("c1s0"), data["c1s0"])


def test_the_option_is_checked() -> None:
    with pytest.raises(OptionError, match="on_damaged_table"):
        r3store.ReaderOptions(on_damaged_table="ignore")  # type: ignore[arg-type]
    assert r3store.ReaderOptions().on_damaged_table == "raise"
    assert r3store.ReaderOptions.from_dict({"on_damaged_table": "skip"}).on_damaged_table == "skip"
