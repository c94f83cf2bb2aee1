"""Hot loops of r3store, compiled where possible: bit-packing, route checks, row gather; base64.

Each function runs the C extension ``r3store.codecs._kernels`` when it was built, and
its numpy twin (:mod:`r3store.codecs._kernels_numpy`, the reference) otherwise. Both
compute the same function; the test suite checks that on random inputs of every width
and odd size. The C kernels release the GIL, accept any integer dtype and memory layout
(strided, unaligned), and use AVX2/BMI2 where the CPU has them (checked at import).
Frame checksums (CRC-32C) run the fastest code the CPU has: 4 x 512-bit VPCLMULQDQ
folding with three ``crc32`` instruction streams alongside (AVX-512), else three SSE4.2
``crc32`` streams, else a slicing-by-8 table; :func:`describe` names it.

:data:`IMPLEMENTATION` tells which runs (``r3store --version`` prints it,
:func:`describe` tells more):

* ``"native-avx2"``: the extension, with its AVX2/BMI2 kernels;
* ``"native"``: the extension, portable C (no AVX2, or another architecture);
* ``"numpy"``: no extension (not built, or disabled with ``R3STORE_NO_NATIVE=1`` in the
  environment at import; :data:`NATIVE_UNAVAILABLE` says why).

Examples
--------
>>> import numpy as np
>>> from r3store.codecs import kernels
>>> kernels.IMPLEMENTATION in ("native-avx2", "native", "numpy")
True
>>> payload = kernels.pack_bits(np.array([3, 63, 0, 17]), 6)
>>> payload.tobytes().hex()
'c30f44'
>>> kernels.unpack_bits(payload, 4, 6, dtype=np.uint8)
array([ 3, 63,  0, 17], dtype=uint8)
"""

from __future__ import annotations

import binascii
import importlib
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import google_crc32c
import numpy as np
import numpy.typing as npt

from r3store._checks import is_int
from r3store.codecs._kernels_numpy import (
    FRAME_HEADERS,
    FrameCheck,
    RouteFault,
    b64decode_numpy,
    check_frame_numpy,
    check_ids_numpy,
    decode_frames_numpy,
    encode_frame_numpy,
    first_repeat,
    gather_rows_numpy,
    pack_bits_numpy,
    repeated_ids,
    route_stats_numpy,
    route_stats_pieces_numpy,
    unpack_into_numpy,
)
from r3store.errors import CodecError

_pybase64: ModuleType | None
try:
    import pybase64 as _pybase64
except ImportError:  # pragma: no cover - a dependency; the standard library decodes without it
    _pybase64 = None

__all__ = [
    "DISABLE_ENV",
    "FRAME_HEADERS",
    "FrameCheck",
    "IMPLEMENTATION",
    "MAX_CHUNK_IDS",
    "NATIVE_UNAVAILABLE",
    "OUT_DTYPES",
    "RouteFault",
    "b64decode",
    "check_frame",
    "check_ids",
    "decode_frames",
    "describe",
    "encode_frame",
    "first_repeat",
    "gather_rows",
    "implementation",
    "native_module",
    "pack_bits",
    "repeated_ids",
    "route_stats",
    "route_stats_pieces",
    "unpack_bits",
    "unpack_into",
    "use",
]

DISABLE_ENV = "R3STORE_NO_NATIVE"
"""Environment variable: set to anything but ``""`` or ``"0"`` to use the numpy code."""

MAX_CHUNK_IDS = 1 << 26
"""Most ids of one chunk :func:`decode_frames` decodes (its scratch: 256 MiB at most)."""

OUT_DTYPES = (np.dtype(np.int32), np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.uint8))
"""Output dtypes of :func:`unpack_bits` and :func:`gather_rows` (any integer dtype works
for :func:`unpack_into`; these are the ones the kernels write directly)."""

_KERNELS = "r3store.kernels"


def _load() -> tuple[ModuleType | None, str | None]:
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None, f"disabled by {DISABLE_ENV}={os.environ[DISABLE_ENV]!r}"
    try:
        return importlib.import_module("r3store.codecs._kernels"), None
    except ImportError as exc:
        return None, f"the C extension is not built ({exc})"


_built, NATIVE_UNAVAILABLE = _load()
_native: ModuleType | None = _built


def implementation() -> str:
    """``"native-avx2"``, ``"native"`` or ``"numpy"``: the code that runs now."""
    if _native is None:
        return "numpy"
    return "native-avx2" if _native.simd() == "avx2" else "native"


IMPLEMENTATION = implementation()
"""The implementation in use: chosen at import (see the module docstring), changed only inside :func:`use`."""


def native_module() -> ModuleType | None:
    """The C extension module when it is in use, else None (for r3store's own fast paths)."""
    return _native


def describe() -> dict[str, object]:
    """What runs here, for bug reports.

    Returns
    -------
    dict
        ``implementation`` (as :data:`IMPLEMENTATION`, but current), ``extension`` (path of
        the compiled module, or None), ``unavailable`` (why not, or None), ``cpu`` (the
        features the extension detected: ``avx2``, ``bmi2``, ``sse4.2``, ``pclmulqdq``,
        ``avx512f``, ``avx512bw``, ``vpclmulqdq``; empty without it), ``crc32c`` (the
        CRC-32C code in use: the extension's path, ``"avx512"``, ``"pclmul"``, ``"sse4.2"``
        or ``"table"``, else ``"google_crc32c"``), ``disable_env`` (the variable that forces
        numpy).
    """
    crc = getattr(_native, "crc_path", None)
    return {
        "implementation": implementation(),
        "extension": getattr(_built, "__file__", None),
        "unavailable": NATIVE_UNAVAILABLE,
        "cpu": _built.cpu_features() if _built is not None else {},
        "crc32c": crc() if crc is not None else "google_crc32c",
        "disable_env": DISABLE_ENV,
    }


@contextmanager
def use(name: str) -> Iterator[None]:
    """Run the block with implementation ``name`` (for tests and benchmarks).

    Parameters
    ----------
    name : {"numpy", "native", "native-avx2"}
        ``"native"`` runs the extension's portable C even on an AVX2 machine.

    Raises
    ------
    r3store.errors.CodecError
        ``name`` is unknown, or not available here (no extension, no AVX2).
    """
    global _native, IMPLEMENTATION
    if name not in ("numpy", "native", "native-avx2"):
        raise CodecError(_KERNELS, f"implementation must be 'numpy', 'native' or 'native-avx2', got {name!r}")
    if name != "numpy" and _built is None:
        raise CodecError(_KERNELS, f"{name} is not available: {NATIVE_UNAVAILABLE}")
    saved_native, saved_simd = _native, _built.simd() if _built is not None else None
    try:
        if _built is not None and name != "numpy":
            try:
                _built.set_simd("avx2" if name == "native-avx2" else "scalar")
            except ValueError as exc:
                raise CodecError(_KERNELS, f"{name} is not available: {exc}") from exc
        _native = None if name == "numpy" else _built
        IMPLEMENTATION = implementation()
        yield
    finally:
        _native = saved_native
        if _built is not None and saved_simd is not None:
            _built.set_simd(saved_simd)
        IMPLEMENTATION = implementation()


# -- bit-packing ---------------------------------------------------------------------


def _check_bits(bits: object) -> int:
    if not is_int(bits) or not 1 <= bits <= 16:
        raise CodecError(_KERNELS, f"bits must be an int in [1, 16], got {bits!r}")
    return int(bits)


def _as_payload(payload: npt.ArrayLike | bytes | memoryview) -> np.ndarray:
    if isinstance(payload, np.ndarray):
        return np.ascontiguousarray(payload).view(np.uint8).reshape(-1)
    data: np.ndarray = np.frombuffer(payload, dtype=np.uint8)  # type: ignore[call-overload]
    return data


def _native_ints(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "iu" and arr.dtype.isnative


def pack_bits(ids: npt.ArrayLike, bits: int) -> np.ndarray:
    """Pack ids into the ``r3store.bitpack`` bit stream (``schema/FORMAT.md`` 5.1).

    Parameters
    ----------
    ids : array_like of integer dtype, any shape and memory layout
        Read in C order; values in ``[0, 2**bits)`` (not checked: higher bits are dropped).
    bits : int
        Bits per id, 1 to 16.

    Returns
    -------
    ndarray of uint8, shape (ceil(n * bits / 8),)
        Id ``i`` occupies stream bits ``[i * bits, (i + 1) * bits)``, least significant bit
        first; the unused high bits of the last byte are 0.

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` is out of range.
    """
    bits = _check_bits(bits)
    arr = np.asarray(ids)
    if _native is None or not _native_ints(arr):
        return pack_bits_numpy(arr, bits)
    out = np.empty((arr.size * bits + 7) // 8, dtype=np.uint8)
    _native.pack(arr, bits, out)
    return out


def unpack_bits(payload: npt.ArrayLike | bytes | memoryview, n: int, bits: int,
                dtype: npt.DTypeLike = np.int32) -> np.ndarray:
    """Inverse of :func:`pack_bits`.

    Parameters
    ----------
    payload : bytes-like or ndarray of uint8, at least ceil(n * bits / 8) bytes
    n : int
        Ids to read.
    bits : int
        Bits per id, 1 to 16.
    dtype : {int32, int16, uint16, uint8}
        Output dtype; it must hold ``2**bits - 1``.

    Returns
    -------
    ndarray of ``dtype``, shape (n,)

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` is out of range, ``dtype`` cannot hold ``bits``-bit ids, or the payload
        is too short.
    """
    out = np.empty(max(int(n), 0), dtype=_out_dtype(dtype, _check_bits(bits)))
    return unpack_into(payload, n, bits, out)


def _out_dtype(dtype: npt.DTypeLike, bits: int) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in OUT_DTYPES:
        raise CodecError(_KERNELS, f"output dtype must be one of {[str(d) for d in OUT_DTYPES]}, got {dt}")
    if (1 << bits) - 1 > np.iinfo(dt).max:
        raise CodecError(_KERNELS, f"{dt} cannot hold {bits}-bit ids")
    return dt


def unpack_into(payload: npt.ArrayLike | bytes | memoryview, n: int, bits: int, out: np.ndarray) -> np.ndarray:
    """Unpack ``n`` ids into ``out`` (in C order); the rest of ``out`` is set to 0.

    Parameters
    ----------
    payload : bytes-like or ndarray of uint8, at least ceil(n * bits / 8) bytes
    n : int
        Ids to read (a frame's ``n_encoded``; the zeros after them are its trimmed tail).
    bits : int
        Bits per id, 1 to 16.
    out : ndarray of integer dtype, any shape and memory layout, at least n elements
        Written in C order; ids wider than its dtype wrap as in a numpy cast.

    Returns
    -------
    ndarray
        ``out``.

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` out of range, ``n`` negative or above ``out.size``, ``out`` not an
        integer array, or ``payload`` shorter than ``ceil(n * bits / 8)`` bytes.
    """
    bits = _check_bits(bits)
    n = int(n)
    data = _as_payload(payload)
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "iu":
        raise CodecError(_KERNELS, f"out must be an integer ndarray, got {getattr(out, 'dtype', type(out))}")
    if n < 0 or n > out.size or data.size < (n * bits + 7) // 8:
        raise CodecError(_KERNELS, f"{n} ids of {bits} bits need {(n * bits + 7) // 8} payload bytes "
                                   f"(got {data.size}) and room in out ({out.size} elements)")
    if _native is None or not out.dtype.isnative or not out.flags.writeable:
        return unpack_into_numpy(data, n, bits, out)
    _native.unpack(data, 0, n, bits, out)
    return out


# -- whole frames --------------------------------------------------------------------


def encode_frame(ids: npt.ArrayLike, bits: int, *, version: int = 1, tag: int = 0) -> bytes | None:
    """One ``r3store.bitpack`` frame of ``ids`` (``schema/FORMAT.md`` 5.1): header, CRC-32C, payload.

    Parameters
    ----------
    ids : array_like of integer dtype, any shape and memory layout
        Read in C order; fewer than ``2**32`` of them.
    bits : int
        Bits per id, 1 to 16.
    version : {1, 2}
        Frame version: 1 (20-byte header) or 2 (24-byte header with a position tag).
    tag : int
        Position tag of a version-2 frame, ``[0, 2**32)`` (0: unbound); 0 for version 1.

    Returns
    -------
    bytes or None
        The frame (trailing zero ids trimmed from the payload), or None when an id lies
        outside ``[0, 2**bits)`` (the caller names it).

    Raises
    ------
    r3store.errors.CodecError
        ``bits``, ``version`` or ``tag`` is out of range, ``ids`` is not an integer array,
        or it holds ``2**32`` ids or more.
    """
    bits = _check_bits(bits)
    if version not in FRAME_HEADERS or not is_int(tag) or \
            not 0 <= int(tag) < 1 << 32 or (version == 1 and tag):
        raise CodecError(_KERNELS, f"frame version must be 1 or 2 and tag a 32-bit int (0 for version 1), "
                                   f"got version {version!r}, tag {tag!r}")
    arr = np.asarray(ids)
    if arr.size and arr.dtype.kind not in "iu":
        raise CodecError(_KERNELS, f"ids must be integers, got dtype {arr.dtype}")
    if arr.size >= 1 << 32:
        raise CodecError(_KERNELS, f"a frame holds fewer than 2**32 ids, got {arr.size}")
    if _native is None or not _native_ints(arr):
        return encode_frame_numpy(arr, bits, version, int(tag))
    frame: bytes | None = _native.encode_frame(arr, bits, version, int(tag))
    return frame


def check_frame(buf: npt.ArrayLike | bytes | memoryview, bits: int) -> FrameCheck:
    """Verify an ``r3store.bitpack`` frame of version 1 or 2 without decoding its ids.

    Checks the magic, version, CRC-32C, bit width, sizes, reserved bytes and the unused
    high bits of the last payload byte, in the order of :attr:`FrameCheck.status`.

    Parameters
    ----------
    buf : bytes-like or ndarray of uint8
        One whole frame.
    bits : int
        Bits per id the frame must have, 1 to 16.

    Returns
    -------
    FrameCheck
        ``status`` 0 when valid; ``n_total``, ``n_encoded``, ``header`` (payload offset) and
        ``tag`` from the header.

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` is out of range.
    """
    bits = _check_bits(bits)
    data = _as_payload(buf)
    if _native is None:
        return check_frame_numpy(data, bits)
    return FrameCheck(*_native.check_frame(data, bits))


# -- routes --------------------------------------------------------------------------


def check_ids(routes: np.ndarray, num_experts: int, *, moe: Sequence[bool] | None = None,
              out: np.ndarray | None = None) -> RouteFault | None:
    """Find the first fault in routes: a non-zero dense layer, an id out of range, a repeat.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, layers, top_k), any memory layout
        Global expert ids.
    num_experts : int
        Ids must lie in ``[0, num_experts)``.
    moe : sequence of bool, length layers, optional
        False for a dense decoder layer (all its ids must be 0, as SGLang sends them);
        default: every layer is an MoE layer.
    out : ndarray of uint16, shape (rows, MoE layers, top_k), C-contiguous, optional
        Receives the MoE layers' ids when there is no fault (the writer's buffer dtype).

    Returns
    -------
    RouteFault or None
        The first fault in this order of precedence: ``"dense"`` (first non-zero id of
        a dense layer in C order), ``"range"`` (first id outside ``[0, num_experts)`` in
        C order over the MoE layers), ``"repeat"`` (first (row, layer) holding an id
        twice). None when the routes are valid.

    Raises
    ------
    r3store.errors.CodecError
        ``routes`` is not a 3-D integer array, ``moe`` or ``out`` does not fit it.
    """
    if not isinstance(routes, np.ndarray) or routes.ndim != 3 or routes.dtype.kind not in "iu":
        raise CodecError(_KERNELS, "routes must be a 3-D integer ndarray (rows, layers, top_k)")
    mask = [True] * routes.shape[1] if moe is None else [bool(m) for m in moe]
    if len(mask) != routes.shape[1] or not is_int(num_experts) or int(num_experts) < 1:
        raise CodecError(_KERNELS, f"moe needs one flag per layer ({routes.shape[1]}), num_experts >= 1")
    want = (routes.shape[0], sum(mask), routes.shape[2])
    if out is not None and (out.dtype != np.uint16 or out.shape != want or not out.flags.c_contiguous
                            or not out.flags.writeable):
        raise CodecError(_KERNELS, f"out must be a writable C-contiguous uint16 array of shape {want}")
    if _native is None or not routes.dtype.isnative:
        return check_ids_numpy(routes, int(num_experts), moe=None if moe is None else mask, out=out)
    found = _native.check_routes(routes, bytes(mask), int(num_experts), out)
    if found is None:
        return None
    kind, row, layer, slot = found
    return RouteFault(("dense", "range", "repeat")[kind - 1], row, layer, slot)


def gather_rows(src: np.ndarray, index: np.ndarray, out: np.ndarray, *, fill_value: int = 0,
                num_experts: int | None = None, pad_start: int = 0) -> int:
    """``out[i] = src[index[i]]`` (converted to ``out.dtype``), pad rows where ``index[i] == -1``.

    Parameters
    ----------
    src : ndarray of integer dtype, shape (rows, layers, top_k), any memory layout
    index : ndarray of int64, shape (n,)
        Rows of ``src`` in ``[0, rows)``, or -1 for a pad row.
    out : ndarray of integer dtype, shape (n, layers, top_k), C-contiguous
        int32, int16, uint16 or uint8 as trainers take them (any integer dtype works);
        values must fit its dtype (they are cast as numpy casts).
    fill_value : int
        Every id of a pad row when ``num_experts`` is None.
    num_experts : int, optional
        Spread pad rows over all experts instead: pad row ``p`` (numbered from
        ``pad_start`` in output order) holds ``(p * top_k + j) % num_experts`` in slot
        ``j`` of every layer, as :func:`r3store.layout.pad_routes` builds them.
    pad_start : int
        Number of the first pad row (to continue a numbering across calls).

    Returns
    -------
    int
        Pad rows written.

    Raises
    ------
    r3store.errors.CodecError
        Shapes or dtypes do not fit, or ``index`` holds a row outside ``[-1, rows)``.
    """
    index = np.asarray(index)
    ok = (isinstance(src, np.ndarray) and src.ndim == 3 and src.dtype.kind in "iu" and index.ndim == 1
          and index.dtype == np.int64 and isinstance(out, np.ndarray) and out.dtype.kind in "iu"
          and out.shape == (index.size, *src.shape[1:]) and out.flags.c_contiguous and out.flags.writeable)
    if not ok:
        raise CodecError(_KERNELS, "gather_rows needs src (rows, layers, top_k) and out (len(index), layers, "
                                   "top_k) integer arrays (out C-contiguous) and an int64 index")
    if num_experts is not None and int(num_experts) < 1:
        raise CodecError(_KERNELS, f"num_experts must be >= 1, got {num_experts}")
    try:
        if _native is None or not (src.dtype.isnative and out.dtype.isnative):
            return gather_rows_numpy(src, index, out, fill_value=fill_value, num_experts=num_experts,
                                     pad_start=pad_start)
        return int(_native.gather_rows(src, np.ascontiguousarray(index), out, int(fill_value),
                                       int(num_experts or 0), int(pad_start)))
    except IndexError as exc:
        raise CodecError(_KERNELS, str(exc)) from exc


def route_stats(routes: np.ndarray, hist: np.ndarray | None = None,
                mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The audit's per-cell statistics of routes in one pass: top id, repeats, id histogram.

    ``validate``'s checks (:mod:`r3store.audit`): which (row, layer) cells hold an id twice
    (what :func:`repeated_ids` computes), their largest id (ids out of range, all-zero
    layers), and how often each id occurs per layer.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, layers, top_k), any memory layout
    hist : ndarray of int64, shape (layers, nbins), C-contiguous, writable, optional
        Incremented by the number of times each id in ``[0, nbins)`` occurs in a counted
        cell, per layer (ids outside are not counted).
    mask : ndarray of bool, shape (rows, layers), optional
        The cells counted in ``hist`` (default: every cell).

    Returns
    -------
    top : ndarray of int64, shape (rows, layers)
        The largest id of each cell (0 when ``top_k`` is 0).
    repeated : ndarray of bool, shape (rows, layers)
        Whether the cell holds an id more than once.

    Raises
    ------
    r3store.errors.CodecError
        ``routes`` is not a 3-D integer array, or ``hist``/``mask`` do not fit it.
    """
    mask = _stats_args(routes, hist, mask)
    cells = routes.shape[:2]
    if _native is None or not routes.dtype.isnative:
        return route_stats_numpy(routes, hist, mask)
    top = np.empty(cells, np.int64)
    repeated = np.empty(cells, np.bool_)
    _native.route_stats(routes, top, repeated.view(np.uint8), hist, mask)
    return top, repeated

def _stats_args(routes: np.ndarray, hist: np.ndarray | None, mask: np.ndarray | None) -> np.ndarray | None:
    """The checks of :func:`route_stats`'s arguments; ``mask`` made C-contiguous."""
    if not isinstance(routes, np.ndarray) or routes.ndim != 3 or routes.dtype.kind not in "iu":
        raise CodecError(_KERNELS, "routes must be a 3-D integer ndarray (rows, layers, top_k)")
    cells = routes.shape[:2]
    if hist is not None and not (isinstance(hist, np.ndarray) and hist.dtype == np.int64 and hist.ndim == 2
                                 and hist.shape[0] == routes.shape[1] and hist.flags.c_contiguous
                                 and hist.flags.writeable):
        raise CodecError(_KERNELS, f"hist must be a writable C-contiguous int64 array of shape ({routes.shape[1]}, "
                                   "nbins)")
    if mask is not None:
        if not isinstance(mask, np.ndarray) or mask.shape != cells or mask.dtype != np.bool_:
            raise CodecError(_KERNELS, f"mask must be a bool array of shape {cells}")
        mask = np.ascontiguousarray(mask)
    return mask


def route_stats_pieces(routes: np.ndarray, cuts: Sequence[int] | np.ndarray, hist: np.ndarray | None = None,
                       mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`route_stats` summed over pieces of rows, without a per-cell result.

    ``validate`` checks a row block holding several samples: per sample and layer it needs
    only the largest id, whether a cell repeats an id and how many cells are not all zeros
    (the per-cell results are read again only for a sample with a fault). The per-cell
    results of a tile of rows stay in a cache-sized scratch.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, layers, top_k), any memory layout
    cuts : sequence of int, non-decreasing, from 0 to rows
        Piece ``p`` is rows ``[cuts[p], cuts[p + 1])``.
    hist, mask
        As in :func:`route_stats` (every cell of every piece is counted where ``mask`` keeps it).

    Returns
    -------
    top : ndarray of int64, shape (pieces, layers)
        The largest id of the piece's cells per layer (-1 for a piece without rows).
    repeated : ndarray of bool, shape (pieces, layers)
        Whether one of the piece's cells in the layer holds an id twice.
    nonzero : ndarray of int64, shape (pieces, layers)
        How many of the piece's cells in the layer hold an id other than 0.

    Raises
    ------
    r3store.errors.CodecError
        ``routes`` is not a 3-D integer array, ``hist``/``mask`` do not fit it, or ``cuts``
        does not rise from 0 to the rows.
    """
    mask = _stats_args(routes, hist, mask)
    cut = np.ascontiguousarray(cuts, dtype=np.int64)
    if cut.ndim != 1 or not len(cut) or cut[0] != 0 or cut[-1] != len(routes) or (np.diff(cut) < 0).any():
        raise CodecError(_KERNELS, f"cuts must rise from 0 to the {len(routes)} rows, got {cut.tolist()[:8]}")
    if _native is None or not routes.dtype.isnative:
        return route_stats_pieces_numpy(routes, cut, hist, mask)
    n = len(cut) - 1
    top = np.empty((n, routes.shape[1]), np.int64)
    repeated = np.empty((n, routes.shape[1]), np.bool_)
    nonzero = np.empty((n, routes.shape[1]), np.int64)
    _native.route_stats_pieces(routes, cut, top, repeated.view(np.uint8), nonzero, hist, mask)
    return top, repeated, nonzero


def decode_frames(blob: npt.ArrayLike | bytes | memoryview, starts: np.ndarray, lengths: np.ndarray, bits: int,
                  out: np.ndarray, rows: np.ndarray, layers: np.ndarray, *, chunk_rows: int, layers_per_chunk: int,
                  tag_prefix: str | None = None, row_chunks: np.ndarray | None = None,
                  layer_chunks: np.ndarray | None = None, row_first: np.ndarray | None = None,
                  row_count: np.ndarray | None = None) -> int:
    """Check and decode many ``r3store.bitpack`` frames straight into their places in ``out``.

    The batch decode of rank-local reads: one call per storage object instead of one per
    frame. Frame ``f`` is ``blob[starts[f] : starts[f] + lengths[f]]``; it must be a valid
    frame (the checks of :func:`check_frame`) of ``bits`` bits holding
    ``chunk_rows * layers_per_chunk * top_k`` ids, and is written to
    ``out[rows[f] : rows[f] + chunk_rows, layers[f] : layers[f] + layers_per_chunk]``
    (ids after its ``n_encoded`` are 0).

    Parameters
    ----------
    blob : bytes-like or ndarray of uint8
    starts, lengths, rows, layers : ndarray of int64, shape (n,)
    bits : int
        1 to 16.
    out : ndarray, C-contiguous, shape (N, L, top_k), int32, int16, uint16, uint8 (any 1-,
        2- or 4-byte integer dtype; ids are cast as numpy casts)
    chunk_rows, layers_per_chunk : int
        The inner-chunk shape (FORMAT.md section 5).
    tag_prefix : str, optional
        Check each frame's position tag: the CRC-32C of
        ``f"{tag_prefix}/{row_chunks[f]}/{layer_chunks[f]}"`` (``r3store._format.position_tag``
        with ``tag_prefix`` the commit). None: tags are not checked.
    row_chunks, layer_chunks : ndarray of int64, shape (n,), optional
        Needed with ``tag_prefix``.
    row_first, row_count : ndarray of int64, shape (n,), optional
        Given together: only rows ``[row_first[f], row_first[f] + row_count[f])`` of frame
        ``f``'s chunk are written, to ``out[rows[f] : rows[f] + row_count[f], ...]`` (a
        sample's partial first and last chunks, a CP rank's pieces, decoded in place); the
        whole frame is still checked. Default: every row.

    Returns
    -------
    int
        -1 when every frame decoded; else the index of the first frame that failed a check
        or lies outside ``blob`` or ``out`` (the frames before it are decoded): decode that
        one with :class:`r3store.codecs.BitpackCodec` to name its fault.

    Raises
    ------
    r3store.errors.CodecError
        Arguments of the wrong type, dtype or shape, or a chunk of other than 1 to
        :data:`MAX_CHUNK_IDS` ids.
    """
    data = _as_payload(blob)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (starts, lengths, rows, layers)]
    n = arrays[0].size
    check = tag_prefix is not None
    rc = np.ascontiguousarray(row_chunks if row_chunks is not None else np.zeros(n), dtype=np.int64)
    lc = np.ascontiguousarray(layer_chunks if layer_chunks is not None else np.zeros(n), dtype=np.int64)
    if not (isinstance(out, np.ndarray) and out.ndim == 3 and out.dtype.kind in "iu" and out.dtype.itemsize <= 4
            and out.flags.c_contiguous and out.flags.writeable and all(a.size == n for a in (*arrays, rc, lc))
            and 1 <= layers_per_chunk <= out.shape[1] and chunk_rows >= 1 and (not check or (
                row_chunks is not None and layer_chunks is not None))):
        raise CodecError(_KERNELS, "decode_frames needs a writable C-contiguous 3-D out of 1-, 2- or 4-byte integers, "
                                   "1 <= layers_per_chunk <= its layers, and int64 arrays of one length")
    if (row_first is None) != (row_count is None):
        raise CodecError(_KERNELS, "decode_frames needs row_first and row_count together, or neither")
    ranges = None if row_first is None or row_count is None else [np.ascontiguousarray(a, dtype=np.int64)
                                                                   for a in (row_first, row_count)]
    if ranges is not None and not all(a.size == n for a in ranges):
        raise CodecError(_KERNELS, "decode_frames needs row_first and row_count of one length with starts")
    ints = is_int(chunk_rows) and is_int(layers_per_chunk)
    if not ints or not 1 <= int(chunk_rows) * int(layers_per_chunk) * out.shape[2] <= MAX_CHUNK_IDS:
        raise CodecError(_KERNELS, f"decode_frames needs int chunk_rows and layers_per_chunk whose chunk holds 1 to "
                                   f"2**26 ids, got chunk_rows={chunk_rows!r}, layers_per_chunk={layers_per_chunk!r}, "
                                   f"top_k={out.shape[2]}")
    bits = _check_bits(bits)
    prefix_crc = int(google_crc32c.value(f"{tag_prefix}/".encode())) if check else 0
    if _native is None or not out.dtype.isnative:
        return decode_frames_numpy(data, arrays[0], arrays[1], bits, out, arrays[2], arrays[3], chunk_rows,
                                   layers_per_chunk, prefix_crc, rc, lc, check, *(ranges or ()))
    return int(_native.decode_frames(data, arrays[0], arrays[1], bits, out, arrays[2], arrays[3], int(chunk_rows),
                                     int(layers_per_chunk), prefix_crc, rc, lc, check, *(ranges or ())))


# -- base64 --------------------------------------------------------------------------


def b64decode(text: str | bytes | bytearray | memoryview) -> np.ndarray:
    """Decode base64 exactly as ``base64.b64decode(text, validate=True)`` does.

    Parameters
    ----------
    text : str or bytes-like
        Standard alphabet (RFC 4648 section 4), ``=`` padding; no whitespace.

    Returns
    -------
    ndarray of uint8, shape (decoded bytes,)
        Writable, freshly allocated.

    Raises
    ------
    binascii.Error
        Not valid base64 (the message binascii gives).
    ValueError
        A str with non-ASCII characters.

    Notes
    -----
    Decoded by ``pybase64.b64decode_as_bytearray(text, validate=True)`` (SIMD on every
    CPU) when pybase64 is installed; input it refuses, and every input without it, goes to
    :func:`base64.b64decode`, so the result and the error are always the standard
    library's (pybase64 is stricter: it refuses padding past the last quantum, which the
    standard library ignores).
    """
    if _pybase64 is not None:
        try:
            return np.frombuffer(_pybase64.b64decode_as_bytearray(text, validate=True), dtype=np.uint8)
        except (binascii.Error, ValueError, TypeError):
            pass  # the standard library gives the verdict, and its message
    return b64decode_numpy(text)
