"""``open_backend`` (``r3store/storage/_open.py``): URLs and storage options checked at open."""

from __future__ import annotations

from pathlib import Path

import pytest

import r3store
from r3store.errors import StorageError
from r3store.storage import open_backend


def test_storage_options_checked_in_open_backend() -> None:
    with pytest.raises(StorageError, match="config_kwargs must be a mapping"):
        open_backend("memory://x", {"config_kwargs": "notadict"})
    with pytest.raises(StorageError, match="must be a mapping"):
        open_backend("memory://x", ["not", "a", "mapping"])  # type: ignore[arg-type]


SPEC_3X8 = r3store.ModelSpec(num_layers=3, num_experts=8, top_k=2)


def test_a_url_with_a_nul_byte_is_a_storage_error(tmp_path: Path) -> None:
    """Finding: ``open_store("/x\\x00y")`` and ``RouteWriter`` on such a path raised the OS's
    bare ``ValueError: embedded null byte``."""
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.open_store(f"{tmp_path}/a\x00b")
    with pytest.raises(r3store.errors.StorageError, match="NUL"):
        r3store.RouteWriter(f"{tmp_path}/a\x00b", SPEC_3X8)


# -- new-user findings: local stores and options, files as stores, install hints per protocol -----


def test_open_store_and_writer_refuse_storage_options_for_a_local_store(tmp_path: Path) -> None:
    """They were silently ignored, while the CLI's ``-o`` refused them: same refusal, same words."""
    from r3store.cli._options import BadValue, parse_storage_options
    from r3store.errors import OptionError
    from tests.routes import SPEC_4X16, make_store

    make_store(tmp_path / "s", n=1)
    fault = "option 'anon' is not taken by a local store"
    for url in (str(tmp_path / "s"), f"file://{tmp_path / 's'}"):
        with pytest.raises(OptionError, match=fault):
            r3store.open_store(url, storage_options={"anon": True})
    with pytest.raises(OptionError, match=fault):
        r3store.RouteWriter(tmp_path / "new", SPEC_4X16, storage_options={"anon": True})
    assert not (tmp_path / "new").exists()  # refused before anything is written
    with pytest.raises(BadValue) as cli:
        parse_storage_options(("anon=true",), str(tmp_path / "s"))
    assert fault in cli.value.fault
    assert "local stores take no storage options" in cli.value.fault
    assert len(r3store.open_store(tmp_path / "s", storage_options={})) == 1  # empty options are fine


def test_a_regular_file_as_store_path_is_not_a_store(tmp_path: Path) -> None:
    """Was a NotADirectoryError text (reader) and a leaked temporary name (writer)."""
    from r3store.errors import NotAStoreError
    from tests.routes import SPEC_4X16

    afile = tmp_path / "afile.txt"
    afile.write_text("hello")
    for make in (lambda: r3store.open_store(afile), lambda: r3store.RouteWriter(afile, SPEC_4X16)):
        with pytest.raises(NotAStoreError, match=r"afile\.txt is not an r3store store: it is a file") as e:
            make()
        assert ".tmp" not in str(e.value)
    assert afile.read_text() == "hello"


def test_missing_filesystem_hint_names_the_package_of_the_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gs://`` said "for s3:// URLs: pip install 'r3store[s3]'"."""
    import sys

    import fsspec.registry  # noqa: F401 - the module, whose _registry caches loaded classes

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if gcsfs were not installed
    for protocol in ("gs", "gcs"):  # forget a class an earlier test may have loaded
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, protocol, raising=False)
    with pytest.raises(StorageError) as err:
        open_backend("gs://bucket/store")
    assert "(for gs:// URLs: pip install gcsfs)" in str(err.value)
    assert "s3" not in str(err.value)
