"""``WriterConfig.direct_write_bytes``: the writer's O_DIRECT threshold is a setting, checked,
and a real commit honours it both ways."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store.errors import OptionError
from r3store.storage import LocalBackend
from tests.routes import random_routes

SPEC = r3store.ModelSpec(num_layers=4, num_experts=128, top_k=8)  # 7 bits per id: 28 bytes a row


def test_direct_write_bytes_defaults_to_the_local_backends_threshold_and_round_trips_its_dict_form() -> None:
    assert r3store.WriterConfig().direct_write_bytes == LocalBackend.direct_write_bytes == 1 << 20
    config = r3store.WriterConfig.from_dict({"direct_write_bytes": None})
    assert config.direct_write_bytes is None
    assert r3store.WriterConfig.from_dict(config.to_dict()) == config
    assert r3store.WriterConfig(direct_write_bytes=np.int64(4096)).direct_write_bytes == 4096


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1M", True])
def test_a_bad_direct_write_bytes_is_an_option_error_naming_the_field(bad: object) -> None:
    with pytest.raises(OptionError, match="direct_write_bytes"):
        r3store.WriterConfig(direct_write_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="direct_write_bytes"):
        r3store.WriterConfig.from_dict({"direct_write_bytes": bad})


def _direct_io_taken(folder: Path) -> bool:
    try:
        os.close(os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600))
    except (AttributeError, OSError):
        return False
    finally:
        (folder / ".probe").unlink(missing_ok=True)
    return True


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux (O_DIRECT)")
@pytest.mark.parametrize("direct", [1 << 20, None])
@pytest.mark.parametrize("given", ["path", "backend"])
def test_a_commit_writes_its_large_storage_object_with_o_direct_unless_the_setting_is_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: int | None, given: str) -> None:
    import fcntl

    if not _direct_io_taken(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    written: list[tuple[bool, int]] = []  # (O_DIRECT set on the descriptor, bytes) of each write call
    pwrite, write = os.pwrite, os.write

    def watched_pwrite(fd: int, buf: memoryview, offset: int) -> int:
        written.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), len(buf)))
        return pwrite(fd, buf, offset)

    def watched_write(fd: int, buf: memoryview) -> int:
        written.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), len(buf)))
        return write(fd, buf)

    routes = random_routes(np.random.default_rng(0), 40_000, layers=4, num_experts=128, top_k=8)
    url = tmp_path / "s" if given == "path" else LocalBackend(tmp_path / "s")
    with r3store.RouteWriter(url, SPEC, {"direct_write_bytes": direct}) as writer:
        assert isinstance(writer.backend, LocalBackend)
        assert writer.backend.direct_write_bytes == direct
        writer.append("a", routes)
        monkeypatch.setattr(os, "pwrite", watched_pwrite)
        monkeypatch.setattr(os, "write", watched_write)
        writer.flush()
        monkeypatch.undo()
    objects = [p for p in (tmp_path / "s" / "routes").rglob("*") if p.is_file() and p.name != "zarr.json"]
    sizes = sorted(os.path.getsize(p) for p in objects)
    assert sizes[-1] >= 1 << 20  # at least one object reaches the threshold
    directly = [n for on, n in written if on]
    if direct is None:
        assert directly == []
    else:
        assert sorted(directly) == sorted(s // 4096 * 4096 for s in sizes if s >= direct)
    store = r3store.open_store(tmp_path / "s", reader={"cache_bytes": 0})
    np.testing.assert_array_equal(store.get("a"), routes)
