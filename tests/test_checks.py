"""One rule for ints (``is_int``: numpy ints accepted, bools refused) behind every check of a count or id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import r3store
from r3store._checks import MAX_ROWS, is_int, parse_bool, parse_int
from r3store.codecs import kernels
from r3store.errors import CodecError, OptionError, RouteValidationError, StorageError
from r3store.storage import open_backend

SPEC = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), np.int32(-1)])
def test_integers_of_every_kind_are_ints(value: object) -> None:
    assert is_int(value)
    assert parse_int("n", value) == int(value)  # type: ignore[call-overload]
    assert type(parse_int("n", value)) is int


@pytest.mark.parametrize("value", [True, np.bool_(False), 3.0, np.float32(3), "3", None])
def test_bools_floats_and_strings_are_not(value: object) -> None:
    assert not is_int(value)
    with pytest.raises(OptionError, match="must be an int"):
        parse_int("n", value)


def test_parse_bool_takes_numpy_bools_only_as_bools() -> None:
    assert parse_bool("flag", np.bool_(True)) is True
    with pytest.raises(OptionError, match="must be a bool"):
        parse_bool("flag", 1)


def test_checks_that_used_to_disagree_agree(tmp_path: Path) -> None:
    """Sites that refused numpy ints (or took bools) now follow the one rule."""
    assert kernels.unpack_bits(kernels.pack_bits([1, 2, 3], np.int64(2)), 3, np.int64(2)).tolist() == [1, 2, 3]
    with pytest.raises(CodecError, match="bits"):
        kernels.pack_bits([1], True)
    config = r3store.WriterConfig(chunk_rows=np.int64(4), max_sample_rows=np.uint32(100))
    assert (type(config.chunk_rows), type(config.max_sample_rows)) == (int, int)
    with pytest.raises(OptionError, match="chunk_rows"):
        r3store.WriterConfig(chunk_rows=True)
    routes = np.tile(np.array([0, 1]), (3, 2, 1))
    with r3store.RouteWriter(tmp_path, SPEC) as w:
        w.append("a", routes, num_tokens=np.int64(4), policy_version=np.int64(5))
        with pytest.raises(RouteValidationError, match="policy_version"):
            w.append("b", routes, policy_version=True)
        with pytest.raises(RouteValidationError, match="num_tokens"):
            w.append("c", routes, num_tokens=True)
    store = r3store.open_store(tmp_path)
    assert store.policy_spans("a") == [(0, 3, 5)]
    assert store.get("a", layers=[np.int64(1)]).shape == (3, 1, 2)


def test_storage_options_take_numpy_ints() -> None:
    """S3 options refused numpy ints (retries, max_concurrency) while layout options took them."""
    pytest.importorskip("s3fs")
    backend = open_backend("s3://bucket/x", {"retries": np.int64(3), "anon": True, "max_concurrency": np.int32(4)})
    assert backend.url.startswith("s3://")
    with pytest.raises(StorageError, match="retries"):
        open_backend("s3://bucket/x", {"retries": True, "anon": True})


def test_unpack_routes_takes_a_numpy_bit_width() -> None:
    torch = pytest.importorskip("torch")
    from r3store.dataset import unpack_routes

    packed = torch.from_numpy(kernels.pack_bits(np.arange(6) % 4, 2))
    assert unpack_routes(packed, np.int64(2), (3, 1, 2)).flatten().tolist() == [0, 1, 2, 3, 0, 1]
    with pytest.raises(OptionError, match="bits"):
        unpack_routes(packed, True, (3, 1, 2))


def test_one_bound_on_sample_lengths() -> None:
    """``MAX_ROWS`` bounds max_seqlen and stored rows alike (one name; MAX_SEQLEN is gone)."""
    assert r3store.LayoutOptions(layout="bshd", max_seqlen=MAX_ROWS).max_seqlen == MAX_ROWS
    with pytest.raises(OptionError, match="max_seqlen"):
        r3store.LayoutOptions(layout="bshd", max_seqlen=MAX_ROWS + 1)
    with pytest.raises(OptionError, match="max_sample_rows"):
        r3store.ReaderOptions(max_sample_rows=MAX_ROWS + 1)
