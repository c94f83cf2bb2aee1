"""WriterConfig.codec: set-coded route arrays (format v3), read back as ascending rows, audited alike."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import zarr

import r3store
from r3store.audit import diff, stats, summarize, validate
from r3store.errors import OptionError
from r3store.writer import WriterConfig

SPEC = r3store.ModelSpec(num_layers=6, num_experts=64, top_k=6, moe_layers=[1, 2, 3, 5])


def routes(rows: int, seed: int, spec: r3store.ModelSpec = SPEC) -> np.ndarray:
    """Random distinct top-k ids per (row, MoE layer), in random order."""
    rng = np.random.default_rng(seed)
    keys = rng.random((rows, spec.num_moe_layers, spec.num_experts))
    return np.argsort(keys, axis=-1)[..., : spec.top_k].astype(np.int32)


def write(path: Path, codec: str, samples: dict[str, np.ndarray], **config: object) -> None:
    with r3store.RouteWriter(path, SPEC, {"codec": codec, "writer_id": "w", "chunk_rows": 16, **config}) as w:
        for sid, arr in samples.items():
            w.append(sid, arr, allow_missing=True)


@pytest.fixture
def samples() -> dict[str, np.ndarray]:
    out = {f"s{i}": routes(37 + 20 * i, i) for i in range(4)}
    out["s1"][5] = -1  # a row the engine could not capture
    return out


def test_set_store_reads_rows_ascending(tmp_path: Path, samples: dict[str, np.ndarray]) -> None:
    write(tmp_path, "set", samples)
    doc = json.loads((tmp_path / "routes" / "w-00000" / "zarr.json").read_text())
    inner = doc["codecs"][0]["configuration"]["codecs"]
    assert inner == [{"name": "r3store.set", "configuration": {"num_experts": 64, "top_k": 6}}]
    assert doc["attributes"]["r3store"]["format_version"] == 3
    store = r3store.open_store(tmp_path)
    assert store.format_version == 3
    for sid, arr in samples.items():
        np.testing.assert_array_equal(store.get(sid), np.sort(arr, axis=-1))
    got = store.get("s2", layers=[5, 2], rows=slice(3, 30))
    np.testing.assert_array_equal(got, np.sort(samples["s2"], axis=-1)[3:30][:, [3, 1]])
    assert (store.get("s1")[5] == -1).all()


def test_bitpack_stays_the_default_and_keeps_the_order(tmp_path: Path, samples: dict[str, np.ndarray]) -> None:
    assert WriterConfig().codec == "bitpack"
    with r3store.RouteWriter(tmp_path, SPEC, config={"writer_id": "w"}) as w:
        w.append("s0", samples["s0"])
    np.testing.assert_array_equal(r3store.open_store(tmp_path).get("s0"), samples["s0"])


def test_set_store_is_smaller_and_audits_alike(tmp_path: Path, samples: dict[str, np.ndarray]) -> None:
    write(tmp_path / "set", "set", samples)
    write(tmp_path / "bitpack", "bitpack", samples)
    a, b = r3store.open_store(tmp_path / "set"), r3store.open_store(tmp_path / "bitpack")
    assert a.storage_usage().route_bytes < 0.85 * b.storage_usage().route_bytes
    report = diff(a, b)
    assert report["differing_decisions"] == 0
    assert report["decision_flip_rate"] == 0.0
    assert validate(a).ok
    assert validate(a).findings == validate(b).findings
    sa, sb = stats(a), stats(b)
    assert (sa["layers"], sa["load"]) == (sb["layers"], sb["load"])
    summary = summarize(a)
    assert summary["codec"] == "r3store.set"
    assert summarize(b)["codec"] == "r3store.bitpack"
    assert summary["set_bound_bits_per_id"] == pytest.approx(math.log2(math.comb(64, 6)) / 6, abs=1e-4)
    assert summary["bits_per_id"] < summarize(b)["bits_per_id"]


def test_one_store_may_hold_both_codecs(tmp_path: Path, samples: dict[str, np.ndarray]) -> None:
    write(tmp_path, "bitpack", {"s0": samples["s0"]})
    with r3store.RouteWriter(tmp_path, SPEC, WriterConfig(codec="set", writer_id="v")) as w:
        w.append("s3", samples["s3"])
    store = r3store.open_store(tmp_path)
    np.testing.assert_array_equal(store.get("s0"), samples["s0"])
    np.testing.assert_array_equal(store.get("s3"), np.sort(samples["s3"], axis=-1))


def test_zarr_reads_a_set_coded_array(tmp_path: Path, samples: dict[str, np.ndarray]) -> None:
    write(tmp_path, "set", {"s0": samples["s0"]})
    arr = zarr.open_array(str(tmp_path / "routes" / "w-00000"), mode="r")
    np.testing.assert_array_equal(arr[...], np.sort(samples["s0"], axis=-1))


def test_quarantined_routes_are_kept_exactly(tmp_path: Path) -> None:
    bad = routes(20, 9)
    bad[3, 1] = [7, 7, 7, 1, 2, 3]  # a repeated id: quarantined, stored as received
    write(tmp_path, "set", {"bad": bad}, on_invalid="quarantine")
    got = r3store.open_store(tmp_path).get("bad", include_quarantined=True)
    assert got[3, 1].tolist() == [7, 7, 7, 1, 2, 3]
    np.testing.assert_array_equal(got[4], np.sort(bad[4], axis=-1))


@pytest.mark.parametrize("codec", ["zstd", "", None, 3])
def test_unknown_codec_is_an_option_error(codec: object) -> None:
    with pytest.raises(OptionError, match="codec"):
        WriterConfig(codec=codec)  # type: ignore[arg-type]


def test_set_codec_needs_a_spec_in_its_range(tmp_path: Path) -> None:
    wide = r3store.ModelSpec(num_layers=2, num_experts=2048, top_k=8)
    with pytest.raises(OptionError, match="at most 1024 experts"):
        r3store.RouteWriter(tmp_path, wide, {"codec": "set"})


def test_config_round_trips_the_codec() -> None:
    config = WriterConfig(codec="set")
    assert WriterConfig.from_dict(config.to_dict()) == config
