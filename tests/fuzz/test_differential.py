"""Short runs of the differential targets (``differential.py``): every CRC-32C path equals
google_crc32c and refuses flipped frames, every unpack path equals the numpy twin,
decode_frames with row ranges equals its twin and reports a changed byte of any frame, reads
of random stores return the written routes (a caller's writes into a result change nothing)
and never accept a changed byte, the writer reads back what valid appends in any layout gave
and refuses bad ones. The long campaign: ``python -m tests.fuzz.differential --seconds 600``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from r3store.codecs import kernels  # noqa: E402
from tests.fuzz import differential  # noqa: E402

pytestmark = pytest.mark.skipif(kernels.native_module() is None, reason="differential targets need the C extension")

CASES = {"crc": 400, "unpack": 400, "frames": 200, "frame_args": 2000, "overread": 300, "reads": 6, "writer": 4,
         "set_frames": 150, "layout": 300, "assemble": 3, "grouped": 300, "set_encode": 400,
         "direct_writes": 60, "ranges": 400, "assemble_paths": 4, "fused": 300,
         "set_ranges": 150}


@pytest.mark.parametrize("target", sorted(CASES))
def test_short_differential_run_finds_nothing(target: str) -> None:
    report = differential.run(target, seed=1, cases=CASES[target])
    assert report["failures"] == [], report
    assert report["cases"] == CASES[target]
    assert report["checks"] > report["cases"]


def test_every_crc_path_of_this_cpu_is_compared() -> None:
    paths = differential.crc_paths()
    assert paths[0] == "table"
    features = kernels.native_module().cpu_features()
    assert ("avx512" in paths) == bool(features.get("vpclmulqdq") and features.get("avx512bw"))


def test_the_crc_oracle_sees_a_wrong_path(monkeypatch: pytest.MonkeyPatch) -> None:
    native = kernels.native_module()
    real = native.crc32c

    class Wrong:
        def __getattr__(self, name: str) -> object:
            return getattr(native, name)

        @staticmethod
        def crc32c(data: object, value: int = 0) -> int:
            n = len(memoryview(data))  # type: ignore[arg-type]
            return int(real(data, value)) ^ (1 if n == 8192 + 376 and native.crc_path() == "avx512" else 0)

    monkeypatch.setattr(differential, "_native", lambda: Wrong())
    report = differential.crc(seed=2, cases=3000)
    assert report["failures"], report
    assert all("8568 bytes" in f for f in report["failures"]), report


def test_the_unpack_oracle_sees_a_wrong_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    native = kernels.native_module()

    class Wrong:
        def __getattr__(self, name: str) -> object:
            return getattr(native, name)

        @staticmethod
        def unpack(buf: object, offset: int, n: int, bits: int, out: np.ndarray) -> None:
            native.unpack(buf, offset, n, bits, out)
            if bits == 9 and n > 16:
                out[16] ^= 1

    monkeypatch.setattr(differential, "_native", lambda: Wrong())
    report = differential.unpack(seed=3, cases=300)
    assert report["failures"], report
    assert all("of 9 bits" in f for f in report["failures"]), report


@pytest.mark.ray
@pytest.mark.xdist_group("ray")
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")
def test_short_ray_read_routes_run_finds_nothing(ray_cluster: str) -> None:
    report = differential.run("ray_blocks", seed=1, cases=2)
    assert report["failures"] == [], report
    assert report["checks"] > 10


def test_the_writer_fault_target_injects_failures() -> None:
    report = differential.run("writer_faults", seed=1, cases=10)
    assert report["failures"] == [], report
    assert report["failed_writes"] >= 3, report


def test_the_set_frames_oracle_sees_a_wrong_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    from r3store.codecs import SetCodec

    real = SetCodec._decode_frames_each

    def wrong(self: SetCodec, data: np.ndarray, cols: list[np.ndarray], out: np.ndarray, *args: object) -> int:
        rc = real(self, data, cols, out, *args)
        if rc == -1 and out.size:
            out.reshape(-1)[0] ^= 1  # one id of the run wrong
        return rc

    monkeypatch.setattr(SetCodec, "_decode_frames_each", wrong)
    report = differential.set_frames(seed=4, cases=20)
    assert report["failures"], report
    assert all("numpy" in f for f in report["failures"]), report



@pytest.mark.parametrize("fault", ["before left out", "failed frame written"])
def test_the_grouped_oracle_sees_a_wrong_write_around_a_failed_frame(
        monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A decode_frames that leaves out the frames before a failed one, or writes something of the
    failed frame (a group flushed past it), is caught."""
    real = kernels.decode_frames

    def wrong(blob: object, starts: np.ndarray, lengths: np.ndarray, bits: int, out: np.ndarray,
              rows: np.ndarray, layers: np.ndarray, **kwargs: object) -> int:
        rc = int(real(blob, starts, lengths, bits, out, rows, layers, **kwargs))
        if rc >= 0 and fault == "before left out":
            out[...] = 77
        elif rc >= 0:
            out[rows[rc], layers[rc]] = 0
        return rc

    monkeypatch.setattr(kernels, "decode_frames", wrong)
    report = differential.grouped(seed=3, cases=40)
    assert report["failures"], f"the oracle missed: {fault}"


def test_the_set_encode_oracle_sees_a_wrong_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A set encoder whose AVX-512 path changed one byte of frames of 33 rows or more is caught."""
    from r3store.codecs import SetCodec

    real = SetCodec.encode
    native = kernels.native_module()

    def wrong(self: SetCodec, ids: object, *, tag: int = 0) -> bytes:
        frame = real(self, ids, tag=tag)
        on = native.setcodec_avx512(False)
        native.setcodec_avx512(on)
        if on and np.asarray(ids).size >= 33 * self.top_k:
            frame = frame[:-1] + bytes([frame[-1] ^ 1])
        return frame

    if "avx512" not in differential.set_paths():
        pytest.skip("no AVX-512 set encoder on this CPU")
    monkeypatch.setattr(SetCodec, "encode", wrong)
    report = differential.set_encode(seed=3, cases=200)
    assert report["failures"]


def test_the_ranges_oracle_sees_a_clipped_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that clipped rows past a sample's end (numpy's slicing) instead of refusing is caught."""
    from r3store.reader import _reader

    def clipped(sample_id: str, rows: object, num_rows: int) -> tuple[int, int]:
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = slice(rows.start if rows.start is not None else None, rows.stop).indices(num_rows)
            return start, max(start, stop)
        return 0, num_rows

    monkeypatch.setattr(_reader, "sample_rows", clipped)
    report = differential.ranges(seed=3, cases=200)
    assert any("the rules refuse it" in f for f in report["failures"])


def test_the_assemble_paths_oracle_sees_a_wrong_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run planning that put one run a position late is caught (its batch differs from the general path's)."""
    from r3store.batch import _assemble

    real = _assemble._plan_runs

    def late(plan: object) -> object:
        planned = real(plan)  # type: ignore[arg-type]
        if planned is not None and len(planned[1]) and planned[1][0, 2] - planned[1][0, 1] > 1:
            planned[1][0, 1] += 1
            planned[1][0, 3] += 1
        return planned

    monkeypatch.setattr(_assemble, "_plan_runs", late)
    report = differential.assemble_paths(seed=4, cases=6)
    assert any("differ between the runs and the general path" in f for f in report["failures"])


def test_the_fused_oracle_sees_unchecked_ids_left_by_a_failed_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode that writes the ids before it checks the CRC (and keeps them on a failure)."""
    base = differential.BitpackCodec

    class Leaky(base):  # type: ignore[misc, valid-type]
        def decode(self, data, *, out=None, tag=None):  # type: ignore[no-untyped-def]
            try:
                return super().decode(data, out=out, tag=tag)
            except differential.ChecksumError:
                if out is not None and len(out):
                    out[...] = 1  # an unchecked id
                raise

    monkeypatch.setattr(differential, "BitpackCodec", Leaky)
    report = differential.fused(seed=2, cases=60)
    assert any("ChecksumError" in f for f in report["failures"]), report


def test_the_set_ranges_oracle_sees_a_range_decoded_from_the_chunk_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from r3store.codecs import SetCodec

    original = SetCodec.decode_frames

    def from_start(self, *args, row_first=None, row_count=None, **kw):  # type: ignore[no-untyped-def]
        first = None if row_first is None else np.zeros_like(row_first)
        return original(self, *args, row_first=first, row_count=row_count, **kw)

    monkeypatch.setattr(SetCodec, "decode_frames", from_start)
    report = differential.set_ranges(seed=3, cases=40)
    assert any("out differs True" in f for f in report["failures"]), report
