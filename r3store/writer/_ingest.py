"""Decode routed-expert payloads from inference engines into ``(rows, layers, top_k)`` arrays."""

from __future__ import annotations

import ast
import base64
import binascii
import io
import math
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import numpy.lib.format as npy_format

from r3store._checks import is_int
from r3store._spec import ModelSpec
from r3store._validate import as_numpy
from r3store.codecs import kernels
from r3store.errors import PayloadDecodeError, RowCountError

__all__ = ["NO_ROUTES_HINT", "SGLANG_DTYPES", "decode_sglang", "decode_vllm", "encode_sglang", "sglang_meta",
           "sglang_num_tokens", "sglang_start"]

NO_ROUTES_HINT = ("the engine returned no routes: is routed-expert capture enabled (e.g. SGLang "
                  "--enable-return-routed-experts and return_routed_experts=True in the request)?")
"""What an absent or None ``routed_experts`` most likely means."""

SGLANG_DTYPES: Mapping[str, str] = {"uint8": "<u1", "uint16": "<u2", "int16": "<i2", "int32": "<i4"}
"""``meta_info["routed_experts_dtype"]`` -> the little-endian numpy dtype of the base64 payload.
Source: SGLang's compact routed-expert wire dtypes (an open SGLang change); without the key
the payload is int32, as released SGLang sends it."""


def sglang_meta(payload: Any) -> Mapping[str, Any] | None:
    """The mapping that holds ``routed_experts`` (``meta_info``, ``sglext`` or the payload itself), or None."""
    if not isinstance(payload, Mapping):
        return None
    if "routed_experts" in payload:
        return payload
    for key in ("sglext", "meta_info"):
        inner = payload.get(key)
        if isinstance(inner, Mapping) and "routed_experts" in inner:
            return inner
    return None


def _payload_from_meta(sample_id: str, payload: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """Find the routes in an SGLang ``meta_info`` dict or OpenAI-style ``sglext`` dict."""
    if not isinstance(payload, Mapping):
        return payload, None
    meta = sglang_meta(payload)
    if meta is None:
        raise PayloadDecodeError(sample_id, "meta_info", f"has no 'routed_experts' key "
                                                         f"(keys: {sorted(map(str, payload))}): {NO_ROUTES_HINT}")
    return meta["routed_experts"], meta


def _count(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return int(value) if is_int(value) else None


def sglang_num_tokens(meta: Mapping[str, Any] | None) -> int | None:
    """``prompt_tokens + completion_tokens`` of an SGLang ``meta_info`` (None unless both are ints).

    Source: SGLang ``/generate`` ``meta_info``; the routes hold one row per token but the last.
    """
    if meta is None:
        return None
    prompt, completion = _count(meta, "prompt_tokens"), _count(meta, "completion_tokens")
    return None if prompt is None or completion is None else prompt + completion


def sglang_start(meta: Mapping[str, Any] | None) -> int | None:
    """``meta_info["routed_experts_start_len"]``: the first row of the routes within the sample (None: absent)."""
    return None if meta is None else _count(meta, "routed_experts_start_len")


def decode_sglang(sample_id: str, payload: Any, spec: ModelSpec, *, num_rows: int | None = None) -> np.ndarray:
    """Decode SGLang routed experts into an int32 array.

    Parameters
    ----------
    sample_id : str
        For error messages.
    payload : str, bytes, mapping, ndarray, torch tensor or nested list
        SGLang ``meta_info["routed_experts"]`` (or the ``meta_info`` dict itself, or an
        OpenAI-style response dict with ``sglext.routed_experts``): base64 of raw
        little-endian int32 in C order, flattened ``[rows, num_hidden_layers, top_k]``,
        with no shape sent; when the dict carries ``routed_experts_dtype`` (``"uint8"``,
        ``"uint16"``, ``"int16"`` or ``"int32"``, SGLang's compact wire dtypes) the
        payload is read as that little-endian dtype. An already-decoded array (flat or
        3-D) is accepted too.
    spec : ModelSpec
        Gives ``num_hidden_layers`` (``spec.num_layers``) and ``top_k`` for the reshape.
    num_rows : int, optional
        The rows the payload must hold, when known (``num_tokens - 1 - start``): a payload
        of another size is an error naming the likely fault (a wrong ``top_k``, a row
        count off by some).

    Returns
    -------
    ndarray of int32, shape (rows, num_layers, top_k)
        rows = prompt + output tokens - 1, or fewer with ``routed_experts_start_len``.

    Raises
    ------
    r3store.errors.PayloadDecodeError
        ``routed_experts`` is absent, None or an empty payload (the engine returned no
        routes); the string is not base64, its length is not a whole number of ids of
        its dtype, the dtype is not one of :data:`SGLANG_DTYPES`, or the ids do not divide
        into ``(rows, num_layers, top_k)`` (or ``num_rows`` rows).

    Notes
    -----
    Source: SGLang ``/generate`` ``meta_info["routed_experts"]`` (dense layers present as
    rows of zeros; shared experts not included).
    """
    payload, meta = _payload_from_meta(sample_id, payload)
    if payload is None:
        raise PayloadDecodeError(sample_id, "routed_experts", f"is None: {NO_ROUTES_HINT}")
    wire = _wire_dtype(sample_id, meta)
    nbytes = None  # of a base64 payload (whose dtype is not sent unless routed_experts_dtype is)
    if isinstance(payload, str | bytes | bytearray | memoryview):
        if not len(payload) and num_rows != 0:
            raise PayloadDecodeError(sample_id, "routed_experts", f"is empty: {NO_ROUTES_HINT}")
        try:
            raw = kernels.b64decode(payload)  # a fresh writable uint8 array, as base64.b64decode(validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PayloadDecodeError(sample_id, "routed_experts", f"is not valid base64: {exc}") from exc
        itemsize = np.dtype(wire or "<i4").itemsize
        if raw.size % itemsize:
            raise PayloadDecodeError(sample_id, "routed_experts",
                                     f"decodes to {raw.size} bytes, not a whole number of "
                                     f"{_dtype_name(wire)} ({itemsize} bytes each)"
                                     + _dtype_hint(wire, raw.size, spec.num_layers * spec.top_k))
        nbytes = raw.size
        flat = raw.view(wire or "<i4")
        flat = flat if flat.dtype.isnative else flat.astype(flat.dtype.newbyteorder("="))
    else:
        flat = as_numpy(sample_id, "routed_experts", payload)
        if not flat.size:
            if num_rows != 0:
                raise PayloadDecodeError(sample_id, "routed_experts", f"is empty: {NO_ROUTES_HINT}")
            flat = flat.astype(np.int32)  # an empty list is float64 to numpy
        if flat.dtype.kind not in "iu":
            raise PayloadDecodeError(sample_id, "routed_experts",
                                     f"has dtype {flat.dtype}; expert ids must be integers")
        if flat.ndim == 3:
            return flat
        flat = flat.reshape(-1)
    per_row = spec.num_layers * spec.top_k
    if wire is None:
        _reject_int64(sample_id, flat, per_row)
    if num_rows is not None and flat.size != num_rows * per_row:
        _wrong_size(sample_id, flat, num_rows, spec, wire, nbytes)
    if flat.size % per_row:
        raise PayloadDecodeError(
            sample_id, "routed_experts",
            f"{flat.size} ids do not divide into (rows, num_layers={spec.num_layers}, "
            f"top_k={spec.top_k})" + _dtype_hint(wire, nbytes, per_row),
        )
    return flat.reshape(-1, spec.num_layers, spec.top_k)


def _wire_dtype(sample_id: str, meta: Mapping[str, Any] | None) -> str | None:
    """The payload dtype named by ``routed_experts_dtype`` (None: not given, int32)."""
    if meta is None or meta.get("routed_experts_dtype") is None:
        return None
    name = meta["routed_experts_dtype"]
    key = name.removeprefix("torch.").removeprefix("numpy.") if isinstance(name, str) else ""
    if key not in SGLANG_DTYPES:
        raise PayloadDecodeError(sample_id, "routed_experts_dtype",
                                 f"is {name!r}; expected one of {', '.join(SGLANG_DTYPES)}")
    return SGLANG_DTYPES[key]


def _dtype_name(wire: str | None) -> str:
    return "int32" if wire is None else str(np.dtype(wire))


def _dtype_hint(wire: str | None, nbytes: int | None, per_row: int) -> str:
    """Which other wire dtype ``nbytes`` of base64 payload would fit, when it is read as int32 by default."""
    if nbytes is None:
        return ""
    if wire is not None:
        return f" (meta_info routed_experts_dtype is {_dtype_name(wire)})"
    fits = [name for name, code in SGLANG_DTYPES.items()
            if name != "int32" and nbytes % np.dtype(code).itemsize == 0
            and (nbytes // np.dtype(code).itemsize) % per_row == 0]
    if fits:
        return (f"; read as int32 (no routed_experts_dtype in meta_info), but the bytes would fit {' or '.join(fits)}"
                ": pass the meta_info dict with its routed_experts_dtype")
    return ""


def _wrong_size(sample_id: str, flat: np.ndarray, num_rows: int, spec: ModelSpec, wire: str | None,
                nbytes: int | None) -> NoReturn:
    """Raise for a payload of ``flat.size`` ids that should hold ``num_rows`` rows, naming the likely fault."""
    size = flat.size
    have = f"{size} ids" + (f" of {flat.dtype}" if wire is not None else "")
    per_row = spec.num_layers * spec.top_k
    read_as = np.dtype(wire or "<i4")
    exact = [name for name, code in SGLANG_DTYPES.items() if nbytes is not None and np.dtype(code) != read_as
             and nbytes == num_rows * per_row * np.dtype(code).itemsize]
    dtype_note = (f"its {nbytes:,} bytes are exactly {num_rows:,} rows of ids of {exact[0]}: is the payload "
                  f"{exact[0]}, not {_dtype_name(wire)} (meta_info routed_experts_dtype)?") if exact else ""
    if num_rows > 0 and size and size % (num_rows * spec.num_layers) == 0:
        top_k = size // (num_rows * spec.num_layers)
        other = f" (or {size // per_row:,} rows, not {num_rows:,}?)" if size % per_row == 0 else ""
        raise PayloadDecodeError(sample_id, "routed_experts",
                                 f"{have} divide into {num_rows:,} rows x num_layers={spec.num_layers} x {top_k}: "
                                 f"is top_k {top_k}, not the ModelSpec's top_k={spec.top_k}?{other}"
                                 + (f"; or {dtype_note}" if dtype_note else ""))
    if dtype_note:
        raise PayloadDecodeError(sample_id, "routed_experts",
                                 f"{have} do not make {num_rows:,} rows x num_layers={spec.num_layers} x "
                                 f"top_k={spec.top_k}, but {dtype_note}")
    if size % per_row == 0:
        rows = size // per_row
        raise RowCountError(sample_id, "routed_experts",
                            f"holds {rows:,} rows (of num_layers={spec.num_layers} x top_k={spec.top_k}), expected "
                            f"num_tokens - 1 - start = {num_rows:,}")
    raise PayloadDecodeError(sample_id, "routed_experts",
                             f"{have} do not divide into {num_rows:,} rows x num_layers={spec.num_layers} x "
                             f"top_k={spec.top_k}"
                             + _dtype_hint(wire, nbytes, per_row))


def _reject_int64(sample_id: str, flat: np.ndarray, per_row: int) -> None:
    """Catch int64 payloads read as int32: every odd word is 0 (or -1) and the even ones are ids."""
    if flat.size < 2 * per_row or flat.size % 2:
        return
    high = flat[1::2]
    probe = high[:4096]  # real int32 routes give up here: some odd word is an MoE id
    if not ((probe == 0) | (probe == -1)).all():
        return
    if ((high == 0) | (high == -1)).all() and flat[0::2].any() and (flat[0::2].size % per_row == 0):
        raise PayloadDecodeError(
            sample_id, "routed_experts",
            "looks like int64 (every second 32-bit word is 0); SGLang sends little-endian int32: "
            "convert with np.frombuffer(raw, '<i8').astype('<i4') before encoding",
        )


def encode_sglang(routes: np.ndarray) -> str:
    """Encode routes the way SGLang sends them: base64 of little-endian int32, C order.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, num_layers, top_k)

    Examples
    --------
    >>> import numpy as np
    >>> encode_sglang(np.array([[[1, 2]]]))
    'AQAAAAIAAAA='
    """
    return base64.b64encode(np.ascontiguousarray(routes, dtype="<i4").tobytes()).decode("ascii")


def decode_vllm(sample_id: str, payload: Any) -> np.ndarray:
    """Decode vLLM ``CompletionOutput.routed_experts``.

    Parameters
    ----------
    payload : ndarray, torch tensor, str/bytes, or an output carrying ``routed_experts``
        A vLLM ``CompletionOutput`` or a response dict is read through its
        ``routed_experts`` (absent or None: an error saying capture is off). A numpy
        array ``[seq_len - 1, L, top_k]`` of any integer dtype (int16, uint8,
        uint16 or int32 depending on the vLLM version), or over HTTP a base64 ``.npy``
        blob whose header carries dtype and shape (raw ``.npy`` bytes, as ``np.save``
        writes them, are read too). ``.npy`` is read with
        ``allow_pickle=False``: an object array is rejected, never unpickled; a header
        claiming more data than the blob holds is rejected before anything is allocated.

    Returns
    -------
    ndarray, shape (rows, L, top_k)
        The layer axis is as vLLM sent it (MoE-layer ordinal in newer versions).

    Raises
    ------
    r3store.errors.PayloadDecodeError
        ``payload`` is None or an output without routed experts (the engine returned no
        routes), neither ``.npy`` bytes nor a base64 ``.npy`` blob, a blob that cannot be
        read safely, or routes that are not 3-D.
    """
    if payload is None:
        raise PayloadDecodeError(sample_id, "routed_experts", f"is None: {_VLLM_NO_ROUTES_HINT}")
    if isinstance(payload, Mapping) or hasattr(payload, "routed_experts"):  # a whole output / response
        inner = payload.get("routed_experts") if isinstance(payload, Mapping) else payload.routed_experts
        if inner is None:
            keys = ", ".join(repr(k) for k in list(payload)[:8]) if isinstance(payload, Mapping) else ""
            what = f"a {type(payload).__name__}" + (f" (keys {keys or 'none'})" if isinstance(payload, Mapping) else "")
            raise PayloadDecodeError(sample_id, "routed_experts", f"is missing: {what} without routed experts; "
                                     f"{_VLLM_NO_ROUTES_HINT}")
        return decode_vllm(sample_id, inner)
    if isinstance(payload, bytes | bytearray | memoryview) and bytes(memoryview(payload)[:6]) == _NPY_MAGIC:
        routes = _read_npy(sample_id, np.frombuffer(payload, np.uint8).copy())  # raw .npy bytes (np.save's)
    elif isinstance(payload, str | bytes | bytearray | memoryview):
        try:
            raw = kernels.b64decode(payload)  # a fresh writable uint8 array, as base64.b64decode(validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PayloadDecodeError(sample_id, "routed_experts",
                                     f"is neither .npy bytes nor a base64 .npy blob: {exc}") from exc
        routes = _read_npy(sample_id, raw)
    else:
        routes = as_numpy(sample_id, "routed_experts", payload)
    if routes.ndim != 3:
        raise PayloadDecodeError(sample_id, "routed_experts",
                                 f"has shape {routes.shape}: vLLM sends (num_tokens - 1, layers, top_k)")
    return routes


_VLLM_NO_ROUTES_HINT = ("the engine returned no routes: is routed-expert capture enabled in vLLM (the engine's "
                        "option to return routed experts, and the request's)?")


_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 65535
"""Longest ``.npy`` header read (what format 1.0's 2-byte length can say; numpy writes ~120 bytes)."""
_NPY_MAX_DIMS = 32
_NPY_WRITES = "an integer dtype, fortran_order True or False, a shape of at most 32 non-negative ints"


def _read_npy(sample_id: str, raw: np.ndarray) -> np.ndarray:
    """The array of a ``.npy`` blob (format 1.0 or 2.0), checked before it is read.

    The header is read by ``numpy.lib.format`` (:func:`~numpy.lib.format.read_magic`,
    :func:`~numpy.lib.format.read_array_header_1_0` / ``_2_0`` with ``max_header_size``,
    ``ast.literal_eval`` underneath: no pickle, no code), after r3store's own checks of its
    framing: magic, version, a length within the blob, ASCII, a dict literal ending in a
    newline, valid Python syntax (so numpy never falls back to its tokenize-based reader
    for Python-2 headers). Its entries must then be what numpy writes for an integer array
    (``descr`` an integer dtype, ``fortran_order`` a bool, ``shape`` a tuple of at most 32
    non-negative ints), and the shape must fit in the bytes that follow, before anything
    is allocated.

    Returns
    -------
    ndarray, the blob's dtype and shape
        A view of ``raw`` (writable; C or Fortran order as the header says), as
        ``np.load(..., allow_pickle=False)`` would return it.

    Raises
    ------
    r3store.errors.PayloadDecodeError
        Not a ``.npy`` blob, another format version, a header numpy does not write (an
        object or other non-integer dtype included), or a shape needing more bytes than
        follow the header.
    """

    def bad(fault: str) -> PayloadDecodeError:
        return PayloadDecodeError(sample_id, "routed_experts", fault)

    head = raw[:8].tobytes()
    if head[:6] != _NPY_MAGIC or len(raw) < 10:
        raise bad(f"is not a .npy blob (it starts with {head!r}, not {_NPY_MAGIC!r})")
    version = (int(raw[6]), int(raw[7]))
    if version not in ((1, 0), (2, 0)):
        raise bad(f".npy format version {version} is not read (1.0, 2.0)")
    start = 10 if version == (1, 0) else 12
    if len(raw) < start:
        raise bad(f".npy blob of {len(raw)} bytes ends inside its header length")
    length = int.from_bytes(raw[8:start].tobytes(), "little")
    if length > _NPY_MAX_HEADER or start + length > len(raw):
        raise bad(f".npy header claims {length:,} bytes, {len(raw) - start:,} follow")
    try:
        text = raw[start : start + length].tobytes().decode("ascii")
    except UnicodeDecodeError:
        raise bad(".npy header is not ASCII") from None
    body = text.rstrip(" \n")
    if not (body.startswith("{") and body.endswith("}")) or not text.endswith("\n"):
        raise bad(".npy header is not a dict literal ending in a newline")
    try:  # numpy would retry a header that is not valid syntax with Python 2's tokenize rules
        ast.parse(body, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise bad(f".npy header is not of the form numpy writes ({_NPY_WRITES}): {body[:120]!r} "
                  f"({type(exc).__name__})") from None
    fp = io.BytesIO(raw[: start + length].tobytes())
    try:
        found = npy_format.read_magic(fp)
        reader = npy_format.read_array_header_1_0 if found == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = reader(fp, max_header_size=_NPY_MAX_HEADER)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, MemoryError, OverflowError,
            SyntaxError) as exc:  # SyntaxError: numpy parses a comma-string 'descr' such as 'i4,(' as Python
        raise bad(f".npy header is not of the form numpy writes ({_NPY_WRITES}): {exc!s:.200}") from None
    if (dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8) or dtype.fields is not None
            or dtype.subdtype is not None):
        raise bad(f".npy header entry 'descr' is {str(dtype)[:40]!r}, not of the form numpy writes ({_NPY_WRITES})")
    if len(shape) > _NPY_MAX_DIMS or any(type(n) is not int or not 0 <= n < 1 << 63 for n in shape):
        raise bad(f".npy header entry 'shape' is {str(shape)[:40]!r}, not of the form numpy writes "
                  f"({_NPY_WRITES})")
    need, have = math.prod(shape) * dtype.itemsize, len(raw) - start - length
    if need > have:
        fault = f".npy header claims shape {shape} of {dtype} ({need:,} bytes), only {have:,} bytes follow"
        raise bad(fault)
    data = raw[start + length : start + length + need].view(dtype)
    if fortran_order:
        return data.reshape(shape[::-1]).transpose()
    return data.reshape(shape)
