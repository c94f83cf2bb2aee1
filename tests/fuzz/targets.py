"""Fuzz targets: each turns one input (bytes) into a call of r3store and checks the oracle.

Oracle, for every target:

* an exception from :mod:`r3store.errors` (any ``R3StoreError``) is a correct refusal;
* any other exception (``IndexError``, ``UnicodeDecodeError``, ``MemoryError``,
  ``RecursionError``, ...) is a failure;
* routes returned without an error that differ from the source are a failure;
* process death (a signal, ``std::terminate``) and hangs are failures, caught by the
  supervisor in :mod:`tests.fuzz.engine`, which saves the input.

A target is a function ``run(data: bytes) -> str``: it returns an *outcome* label (``"ok"``
or the r3store error's class and the start of its message) and raises :class:`Failure`
when the oracle is violated. ``seeds()`` gives the inputs the corpus starts from.

Targets
-------
codec
    One ``r3store.bitpack`` frame: byte 0 picks the codec's ``bits`` (``1 + b % 16``), the rest
    is the frame. Decoded by the native kernels and by their numpy twins (they must agree),
    and checked against a reference decoder written here from ``schema/FORMAT.md`` 5.1.
ingest
    An engine payload: byte 0 picks the path (SGLang base64 text, SGLang raw int32 stream,
    vLLM ``.npy`` blob, vLLM base64 text, SGLang response or ``meta_info`` dict as JSON),
    the rest is the payload. Decoded routes that come
    back are checked as a writer checks them (``check_routes``).
checkpoint
    The checkpoint of the golden format v3 store ``tests/fixtures/stores/v3-ckpt`` (it covers
    the first of two commits; the store has a fixed identity, missing rows, policy versions,
    metadata, a quarantined and a 0-row sample), replaced by the input, checked like the
    store targets below against ``expected-v3-ckpt.npz``: a checkpoint that passes its
    checks must serve exactly the rows of the sample tables it stands for.
manifest, zarr_json, sample_table, shard_index
    The golden store ``tests/fixtures/stores/v2-odd`` (missing rows, a quarantined and a
    0-row sample, 10 storage objects, 9-bit ids) with one object replaced by the input:
    ``r3store.json``; the route array's ``zarr.json``; the sample table; the trailing
    index (entries and CRC) of storage object ``c/0/0/0`` (its frames kept). The store is
    opened from memory, every sample read with ``get`` and compared to the routes it was
    written with (and its sample-table row to the source's), and all of them assembled into
    one batch compared to the source's.
"""

from __future__ import annotations

import base64
import io
import json
import re
import struct
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

import r3store
from r3store.errors import R3StoreError
from r3store.storage import Backend, ByteRange, ObjectInfo, SuffixByteRange

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
STORE = FIXTURES / "stores" / "v2-odd"
STORE_NAME = "v2-odd"
QUARANTINED = frozenset({"bad"})
COMMIT = "golden-v2-c-00000"

__all__ = ["TARGETS", "Failure", "Target"]


class Failure(Exception):
    """The oracle was violated (never raised by r3store itself)."""


def outcome(exc: BaseException) -> str:
    """A short label of a refusal: the error class and the first words of its message (the
    store's URL, numbers, quoted values and bytes left out), so that similar refusals share one."""
    text = re.sub(r"fuzz://\S*|'[^']*'|\"[^\"]*\"|b'[^']*'", " ", str(exc))
    return f"{type(exc).__name__}: {' '.join(re.findall(r'[A-Za-z_]{3,}', text)[:6])}"


def _call(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``fn()`` and None, or None and the r3store error it raised (anything else: Failure)."""
    try:
        return fn(), None
    except R3StoreError as exc:
        return None, exc
    except Failure:
        raise
    except BaseException as exc:  # the oracle: nothing but r3store errors
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        raise Failure(f"{type(exc).__name__} outside r3store.errors: {exc!s:.300}") from exc


# -- codec -----------------------------------------------------------------------------------------


def _reference_frame(frame: bytes, bits: int) -> tuple[list[int], int] | None:
    """Decode a version-2 ``r3store.bitpack`` frame as FORMAT.md 5.1 says; None if invalid.

    Returns the ``n_encoded`` ids of the payload and ``n_total`` (the ids after them are 0).

    Written from the specification only (no r3store code), as the independent side of the
    differential check. Version-1 frames (section 10) are not decoded here.
    """
    if len(frame) < 24 or frame[:4] != b"R3BP" or frame[4] != 2 or frame[5] != bits or frame[6:8] != b"\0\0":
        return None
    n_total, n_encoded, _tag, crc = struct.unpack_from("<IIII", frame, 8)
    if n_encoded > n_total:
        return None
    payload = frame[24:]
    if len(payload) != (n_encoded * bits + 7) // 8:
        return None
    if google_crc32c.value(frame[:20] + payload) != crc:
        return None
    stream = int.from_bytes(payload, "little")
    if stream >> (n_encoded * bits):  # unused high bits must be 0
        return None
    mask = (1 << bits) - 1
    return [(stream >> (i * bits)) & mask for i in range(n_encoded)], n_total


MAX_DECODE_IDS = 1 << 26
"""``r3store.codecs.bitpack.MAX_DECODE_IDS`` as documented: the most ids decode allocates itself."""
MAX_ZERO_TAIL_IDS = 1 << 18
"""``MAX_ZERO_TAIL_IDS`` as documented: the most zero ids past its payload a frame may declare
when decode allocates (so decoding is bounded by the frame's size)."""


@cache
def _codec(bits: int) -> Any:
    from r3store.codecs import BitpackCodec

    return BitpackCodec(bits=bits, frame_version=2)


def _decode_numpy(frame: bytes, bits: int) -> np.ndarray:
    """The numpy twin of the native decode path (``kernels.use("numpy")``)."""
    from r3store.codecs import kernels

    with kernels.use("numpy"):
        return np.asarray(_codec(bits).decode(frame))


def run_codec(data: bytes) -> str:
    if not data:
        return "empty"
    bits, frame = 1 + data[0] % 16, bytes(data[1:])
    codec = _codec(bits)
    native, native_err = _call(lambda: np.asarray(codec.decode(frame)))
    twin, twin_err = _call(lambda: _decode_numpy(frame, bits))
    if (native_err is None) != (twin_err is None):
        raise Failure(f"native and numpy decoders disagree: native {native_err or 'decoded'}, "
                      f"numpy {twin_err or 'decoded'}")
    if native is not None and not np.array_equal(native, twin):
        raise Failure("native and numpy decoders return different ids")
    if frame[4:5] == b"\x02":
        ref = _reference_frame(frame, bits)
        if ref is not None and (ref[1] > MAX_DECODE_IDS or ref[1] - len(ref[0]) > MAX_ZERO_TAIL_IDS):
            if native_err is None:  # documented: decode allocates no more on its own
                raise Failure(f"decode of a {len(frame)}-byte frame allocated {ref[1]:,} ids, past its bound")
        elif (ref is None) != (native is None):
            raise Failure(f"r3store {'accepts' if native is not None else 'refuses'} a frame the FORMAT.md "
                          f"reference decoder {'refuses' if ref is None else 'accepts'} ({native_err})")
        elif ref is not None and native is not None:
            ids, n_total = ref
            if native.size != n_total or native[: len(ids)].tolist() != ids or native[len(ids):].any():
                raise Failure("decoded ids differ from the FORMAT.md reference decoder's")
    for probe in (codec.frame_size, codec.frame_tag):
        _call(lambda probe=probe: probe(frame))
    return "ok" if native_err is None else outcome(native_err)


def codec_seeds() -> list[bytes]:
    seeds = []
    for meta in sorted((FIXTURES / "codecs").glob("bitpack-v2-*.json")):

        config = json.loads(meta.read_text())["config"]
        seeds.append(bytes([config["bits"] - 1]) + meta.with_suffix(".bin").read_bytes())
    return seeds


# -- ingest ----------------------------------------------------------------------------------------

INGEST_SPEC = r3store.ModelSpec(num_layers=4, num_experts=16, top_k=2, moe_layers=[1, 2, 3])


def _check_decoded(routes: Any) -> str:
    """Check decoded routes as ``RouteWriter.append`` does (rank, layers, top-k, ids)."""
    from r3store._validate import check_routes

    if not isinstance(routes, np.ndarray) or routes.dtype.kind not in "iu":
        raise Failure(f"decoder returned {type(routes).__name__} {getattr(routes, 'dtype', '')}, "
                      "not an integer array")
    if routes.ndim == 3 and routes.shape[1] == INGEST_SPEC.num_layers:  # SGLang sends dense layers too
        routes = routes[:, INGEST_SPEC.moe_layers]
    _, err = _call(lambda: check_routes("fuzz", routes, INGEST_SPEC))
    return "ok" if err is None else outcome(err)


def run_ingest(data: bytes) -> str:
    if not data:
        return "empty"
    mode, body = data[0] % 5, bytes(data[1:])
    if mode == 0:  # SGLang: the base64 text as received
        got, err = _call(lambda: r3store.decode_sglang("fuzz", body.decode("latin-1"), INGEST_SPEC))
    elif mode == 1:  # SGLang: the int32 stream behind valid base64
        got, err = _call(lambda: r3store.decode_sglang("fuzz", base64.b64encode(body).decode(), INGEST_SPEC))
    elif mode == 2:  # vLLM: the .npy blob behind valid base64
        got, err = _call(lambda: r3store.decode_vllm("fuzz", base64.b64encode(body)))
    elif mode == 3:  # vLLM: the base64 text as received
        got, err = _call(lambda: r3store.decode_vllm("fuzz", body))
    else:  # SGLang: a response or meta_info dict, as JSON
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            return "not JSON"
        got, err = _call(lambda: r3store.decode_sglang("fuzz", doc, INGEST_SPEC))
    if err is not None:
        return outcome(err)
    return _check_decoded(got)


def ingest_seeds() -> list[bytes]:
    rng = np.random.default_rng(0)
    routes = np.stack([rng.permutation(16)[:2] for _ in range(5 * 4)]).reshape(5, 4, 2).astype("<i4")
    routes[:, 0] = 0  # the dense layer, as SGLang sends it
    npy = io.BytesIO()
    np.save(npy, routes[:, 1:].astype(np.uint16))
    npy32 = io.BytesIO()
    np.save(npy32, routes[:, 1:].astype("<i4"))
    text = base64.b64encode(routes.tobytes()).decode()
    meta = {"meta_info": {"routed_experts": text, "prompt_tokens": 3, "completion_tokens": 3, "id": "x"}}
    return [b"\x00" + text.encode(), b"\x01" + routes.tobytes(), b"\x02" + npy.getvalue(),
            b"\x02" + npy32.getvalue(), b"\x03" + base64.b64encode(npy.getvalue()),
            b"\x04" + json.dumps(meta).encode(), b"\x04" + json.dumps({"sglext": {"routed_experts": text}}).encode()]


# -- whole stores ----------------------------------------------------------------------------------


class MemoryBackend(Backend):
    """A read-only store held in a dict (fresh per input: no cache survives between inputs)."""

    supports_writes = False

    def __init__(self, objects: dict[str, bytes], name: str = STORE_NAME) -> None:
        super().__init__(f"fuzz://{name}")
        self._objects = objects

    def _blob(self, key: str) -> bytes:
        try:
            return self._objects[key]
        except KeyError:
            raise r3store.errors.ObjectNotFoundError(self.path_of(key), "no such object") from None

    def get(self, key: str, byte_range: ByteRange | SuffixByteRange | None = None) -> bytes:
        blob = self._blob(key)
        if byte_range is None:
            return blob
        if isinstance(byte_range, SuffixByteRange):
            return blob[max(0, len(blob) - byte_range.nbytes):]
        return blob[byte_range.start:byte_range.end]

    def set(self, key: str, data: bytes | memoryview) -> None:
        raise r3store.errors.ReadOnlyStoreError(self.path_of(key), "the fuzz store is read-only")

    def exists(self, key: str) -> bool:
        return key in self._objects

    def delete(self, key: str) -> None:
        self.set(key, b"")

    def list_prefix(self, prefix: str) -> list[str]:
        return sorted(k for k in self._objects if k.startswith(prefix))

    def info(self, key: str) -> ObjectInfo:
        return ObjectInfo(size=len(self._blob(key)), mtime=0.0)


GOLDEN = {STORE_NAME: (STORE, "expected-v2.npz", QUARANTINED),
          "v3-ckpt": (FIXTURES / "stores" / "v3-ckpt", "expected-v3-ckpt.npz", frozenset({"bad"}))}
"""The golden stores the store targets start from: folder, expected routes, quarantined ids."""


@cache
def base_objects(name: str = STORE_NAME) -> dict[str, bytes]:
    root = GOLDEN[name][0]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@cache
def expected(name: str = STORE_NAME) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "stores" / GOLDEN[name][1], allow_pickle=False) as npz:
        return {k.partition("__")[2]: npz[k] for k in npz.files if k.startswith(name + "__")}


@cache
def expected_batch(name: str = STORE_NAME) -> dict[str, Any]:
    store = r3store.open_store(MemoryBackend(dict(base_objects(name)), name))
    return store.assemble(sorted(store.sample_ids))


@cache
def expected_rows(name: str = STORE_NAME) -> dict[str, dict[str, Any]]:
    """Each sample's sample-table row (ids, counts, commit, quarantine, missing rows, policy spans, ...)."""
    store = r3store.open_store(MemoryBackend(dict(base_objects(name)), name), reader={"use_checkpoint": False})
    quarantined = GOLDEN[name][2]
    return {sid: store.row(sid, include_quarantined=sid in quarantined) for sid in expected(name)}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return bool(a == b)


def check_store(objects: dict[str, bytes], name: str = STORE_NAME) -> str:
    """Open ``objects`` as a store and compare everything it serves with the source (the golden
    store ``name``); the sample-table rows are compared with those read from its tables."""
    quarantined = GOLDEN[name][2]
    store, err = _call(lambda: r3store.open_store(MemoryBackend(objects, name)))
    if err is not None:
        return outcome(err)
    source = expected(name)
    listed, err = _call(lambda: sorted(store.sample_ids))
    if err is not None:
        return outcome(err)
    if listed != sorted(set(source) - quarantined):
        raise Failure(f"listing differs from the source: {listed}")
    first: BaseException | None = None
    for sid, routes in source.items():
        got, err = _call(lambda sid=sid: store.get(sid, include_quarantined=sid in quarantined))
        if err is not None:
            first = first or err
            continue
        if not _same(got, routes):
            raise Failure(f"sample {sid!r}: routes differ from the source without an error")
        row, err = _call(lambda sid=sid: store.row(sid, include_quarantined=sid in quarantined))
        if err is None and row != expected_rows(name)[sid]:
            raise Failure(f"sample {sid!r}: its sample-table row differs from the source without an error: {row}")
    batch, err = _call(lambda: store.assemble(listed))
    if err is not None:
        return outcome(first or err)
    want = expected_batch(name)
    for key in want:
        if not _same(batch.get(key), want[key]):
            raise Failure(f"assemble: {key!r} differs from the source's batch without an error")
    return "ok" if first is None else outcome(first)


def _store_target(key: str) -> tuple[Callable[[bytes], str], Callable[[], list[bytes]]]:
    def run(data: bytes) -> str:
        return check_store({**base_objects(), key: bytes(data)})

    def seeds() -> list[bytes]:
        return [base_objects()[key]]

    return run, seeds


OBJECT = f"routes/{COMMIT}/c/0/0/0"


def _index_size() -> int:
    """Bytes of the index (entries and CRC) at the end of storage object ``c/0/0/0``."""
    doc = json.loads(base_objects()[f"routes/{COMMIT}/zarr.json"])
    inner = doc["codecs"][0]["configuration"]["chunk_shape"]
    grid = [o // i for o, i in zip(doc["chunk_grid"]["configuration"]["chunk_shape"], inner, strict=True)]
    return 16 * int(np.prod(grid)) + 4


def run_shard_index(data: bytes) -> str:
    blob = base_objects()[OBJECT]
    return check_store({**base_objects(), OBJECT: blob[: len(blob) - _index_size()] + bytes(data)})


def shard_index_seeds() -> list[bytes]:
    blob = base_objects()[OBJECT]
    return [blob[len(blob) - _index_size():]]


class Target:
    """A named fuzz target: ``run`` (input -> outcome, or Failure) and its seed inputs."""

    def __init__(self, name: str, run: Callable[[bytes], str], seeds: Callable[[], Sequence[bytes]],
                 tokens: Iterable[bytes] = ()) -> None:
        self.name = name
        self.run = run
        self.seeds = seeds
        self.tokens = tuple(tokens)
        """Byte strings the built-in mutator splices in (a dictionary, as libFuzzer's ``-dict``)."""


JSON_TOKENS = (b'"', b"{", b"}", b"[", b"]", b",", b":", b"null", b"true", b"false", b"-1", b"0", b"1e309",
               b"9" * 20, b"9" * 5000, b"-0", b"1.5", b"\\u0000", b"\\ud800", b'"\xff"', b"[" * 200)
BINARY_TOKENS = (b"\x00" * 4, b"\xff" * 4, b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00",
                 struct.pack("<Q", 1 << 40), struct.pack("<I", 1 << 31), b"PAR1", b"R3BP")


CHECKPOINT_STORE = "v3-ckpt"


def checkpoint_key() -> str:
    """The key of the golden v3 store's checkpoint."""
    return next(k for k in base_objects(CHECKPOINT_STORE) if k.endswith(".checkpoint"))


def run_checkpoint(data: bytes) -> str:
    """The golden v3 store with its checkpoint replaced by ``data``: refused (a warning, then the
    sample tables) or read back exactly; a CheckpointWarning is a refusal, not a failure."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = check_store({**base_objects(CHECKPOINT_STORE), checkpoint_key(): bytes(data)}, CHECKPOINT_STORE)
    skipped = [w for w in caught if issubclass(w.category, r3store.errors.CheckpointWarning)]
    others = [w for w in caught if not issubclass(w.category, r3store.errors.CheckpointWarning)]
    if others:
        raise Failure(f"unexpected warning {others[0].category.__name__}: {others[0].message}")
    if skipped and result == "ok":
        return "CheckpointWarning: " + outcome(Exception(str(skipped[0].message).partition("(")[2]))
    return result


def _table_key() -> str:
    return next(k for k in base_objects() if k.endswith(".parquet"))


def _selftest(data: bytes) -> str:
    """Misbehaves on purpose (tests of the supervisor): ``A`` aborts, ``H`` hangs asleep, ``S`` spins,
    ``W`` serves wrong routes."""
    import os
    import time

    if data.startswith(b"A"):
        os.abort()
    if data.startswith(b"H"):
        time.sleep(3600)
    if data.startswith(b"S"):  # spins: hung in CPU time, however loaded the machine
        while time.monotonic() > 0:
            pass
    if data.startswith(b"W"):
        raise Failure("routes differ from the source without an error (self-test)")
    if data.startswith(b"X"):
        raise IndexError("a bare IndexError (self-test)")
    return "ok"


SELFTEST = "_selftest"
"""A target for testing the harness itself; not run by ``--target all``."""

TARGETS: dict[str, Target] = {
    "codec": Target("codec", run_codec, codec_seeds, (*BINARY_TOKENS, b"R3BP\x02", b"R3BP\x01")),
    "ingest": Target("ingest", run_ingest, ingest_seeds,
                     (*BINARY_TOKENS, b"\x93NUMPY\x01\x00", b"'descr': '<i4'", b"'shape': (", b"True", b"=", b"\n",
                                      b"'fortran_order': True", b"(1000000000000, 4, 2)", b"'|O'")),
    "manifest": Target("manifest", *_store_target("r3store.json"),
                       tokens=(*JSON_TOKENS, b'"version": 1', b'"moe_layers"')),
    "zarr_json": Target("zarr_json", *_store_target(f"routes/{COMMIT}/zarr.json"),
                        tokens=(*JSON_TOKENS, b'"shape": [', b'"chunk_shape": [', b'"crc32c"', b'"bits": ')),
    "shard_index": Target("shard_index", run_shard_index, shard_index_seeds, BINARY_TOKENS),
    "sample_table": Target("sample_table", lambda d: check_store({**base_objects(), _table_key(): bytes(d)}),
                           lambda: [base_objects()[_table_key()]], BINARY_TOKENS),
    "checkpoint": Target("checkpoint", run_checkpoint, lambda: [base_objects(CHECKPOINT_STORE)[checkpoint_key()]],
                         (*BINARY_TOKENS, b'"store_id"', b'"watermark"', b"r3store.store_id", b"r3store.checkpoint")),
    SELFTEST: Target(SELFTEST, lambda d: _call(lambda: _selftest(d))[0] or "ok", lambda: [b"ok"]),
}
