"""Decode routed-expert payloads from inference engines into ``(rows, layers, top_k)`` arrays."""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from r3store._spec import ModelSpec
from r3store._validate import as_numpy
from r3store.codecs import kernels
from r3store.errors import PayloadDecodeError

__all__ = ["decode_sglang", "decode_vllm", "encode_sglang"]


def _payload_from_meta(sample_id: str, payload: Any) -> Any:
    """Find the routes in an SGLang ``meta_info`` dict or OpenAI-style ``sglext`` dict."""
    if not isinstance(payload, Mapping):
        return payload
    for key in ("routed_experts",):
        if key in payload:
            return payload[key]
    ext = payload.get("sglext")
    if isinstance(ext, Mapping) and "routed_experts" in ext:
        return ext["routed_experts"]
    meta = payload.get("meta_info")
    if isinstance(meta, Mapping) and "routed_experts" in meta:
        return meta["routed_experts"]
    raise PayloadDecodeError(sample_id, "meta_info", f"has no 'routed_experts' key (keys: {sorted(map(str, payload))})")


def decode_sglang(sample_id: str, payload: Any, spec: ModelSpec) -> np.ndarray:
    """Decode SGLang routed experts into an int32 array.

    Parameters
    ----------
    sample_id : str
        For error messages.
    payload : str, bytes, mapping, ndarray, torch tensor or nested list
        SGLang ``meta_info["routed_experts"]`` (or the ``meta_info`` dict itself, or an
        OpenAI-style response dict with ``sglext.routed_experts``): base64 of raw
        little-endian int32 in C order, flattened ``[rows, num_hidden_layers, top_k]``,
        with no shape sent. An already-decoded array (flat or 3-D) is accepted too.
    spec : ModelSpec
        Gives ``num_hidden_layers`` (``spec.num_layers``) and ``top_k`` for the reshape.

    Returns
    -------
    ndarray of int32, shape (rows, num_layers, top_k)
        rows = prompt + output tokens - 1, or fewer with ``routed_experts_start_len``.

    Raises
    ------
    r3store.errors.PayloadDecodeError
        The string is not base64, its length is not a whole number of int32, or the ids
        do not divide into ``(rows, num_layers, top_k)``.

    Notes
    -----
    Source: SGLang ``/generate`` ``meta_info["routed_experts"]`` (dense layers present as
    rows of zeros; shared experts not included).
    """
    payload = _payload_from_meta(sample_id, payload)
    if payload is None:
        raise PayloadDecodeError(sample_id, "routed_experts",
                                 "is None: the engine returned no routes (is routed-expert capture enabled, "
                                 "e.g. SGLang --enable-return-routed-experts and return_routed_experts=True?)")
    if isinstance(payload, str | bytes | bytearray | memoryview):
        try:
            raw = kernels.b64decode(payload)  # a fresh writable uint8 array, as base64.b64decode(validate=True)
        except (binascii.Error, ValueError) as exc:
            raise PayloadDecodeError(sample_id, "routed_experts", f"is not valid base64: {exc}") from exc
        if raw.size % 4:
            raise PayloadDecodeError(sample_id, "routed_experts",
                                     f"decodes to {raw.size} bytes, not a whole number of int32")
        flat = raw.view("<i4")
        flat = flat if flat.dtype.isnative else flat.astype(np.int32)
    else:
        flat = as_numpy(sample_id, "routed_experts", payload)
        if flat.ndim == 3:
            return flat
        flat = flat.reshape(-1)
    per_row = spec.num_layers * spec.top_k
    _reject_int64(sample_id, flat, per_row)
    if flat.size % per_row:
        raise PayloadDecodeError(
            sample_id, "routed_experts",
            f"{flat.size} ids do not divide into (rows, num_layers={spec.num_layers}, top_k={spec.top_k})",
        )
    return flat.reshape(-1, spec.num_layers, spec.top_k)


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
    payload : ndarray, torch tensor, or str/bytes
        A numpy array ``[seq_len - 1, L, top_k]`` of any integer dtype (int16, uint8,
        uint16 or int32 depending on the vLLM version), or over HTTP a base64 ``.npy``
        blob whose header carries dtype and shape. ``.npy`` is read with
        ``allow_pickle=False``: an object array is rejected, never unpickled; a header
        claiming more data than the blob holds is rejected before anything is allocated.

    Returns
    -------
    ndarray, shape (rows, L, top_k)
        The layer axis is as vLLM sent it (MoE-layer ordinal in newer versions).

    Raises
    ------
    r3store.errors.PayloadDecodeError
    """
    if isinstance(payload, str | bytes | bytearray | memoryview):
        try:
            raw = base64.b64decode(payload, validate=True)
            _check_npy_header(sample_id, raw)
            decoded: np.ndarray = np.load(io.BytesIO(raw), allow_pickle=False)
            return decoded
        except PayloadDecodeError:
            raise
        except (binascii.Error, ValueError, OSError, EOFError) as exc:
            raise PayloadDecodeError(sample_id, "routed_experts", f"is not a base64 .npy blob: {exc}") from exc
    return as_numpy(sample_id, "routed_experts", payload)


_NPY_MAGIC = b"\x93NUMPY"
_NPY_ENTRY = re.compile(
    r"\s*'(descr|fortran_order|shape)'\s*:\s*"
    r"('[<>|=]?[iu][1248]'|True|False|\(\s*(?:\d{1,19}\s*,\s*){0,31}(?:\d{1,19}\s*)?\))"
    r"\s*(,|(?=\}))"
)
"""One entry of a ``.npy`` header dict: only the three keys numpy writes, an integer dtype,
a bool, or a tuple of at most 32 non-negative integers (the whitelist: nothing else is parsed)."""


def _check_npy_header(sample_id: str, raw: bytes) -> None:
    """Check a ``.npy`` header (format 1.0 or 2.0) against the bytes that follow it.

    The header (a Python dict literal, see ``numpy.lib.format``) is parsed here with a
    whitelist, never by Python's parser: ``{'descr': <integer dtype>, 'fortran_order':
    True|False, 'shape': (<ints>)}``, keys in any order, each once, spaces and a trailing
    comma allowed, then spaces and a newline. numpy's own reader (``np.load``) then sees
    only headers it parses the same way.

    Raises
    ------
    r3store.errors.PayloadDecodeError
        Not a ``.npy`` blob, another format version, a header outside the whitelist (an
        object or other non-integer dtype included), or a shape needing more bytes than
        follow the header.
    """

    def bad(fault: str) -> PayloadDecodeError:
        return PayloadDecodeError(sample_id, "routed_experts", fault)

    if raw[:6] != _NPY_MAGIC or len(raw) < 10:
        raise bad(f"is not a .npy blob (it starts with {bytes(raw[:8])!r}, not {_NPY_MAGIC!r})")
    version = (raw[6], raw[7])
    if version not in ((1, 0), (2, 0)):
        raise bad(f".npy format version {version} is not read (1.0, 2.0)")
    size_bytes = 2 if version == (1, 0) else 4
    start = 8 + size_bytes
    if len(raw) < start:
        raise bad(f".npy blob of {len(raw)} bytes ends inside its header length")
    length = int.from_bytes(raw[8:start], "little")
    if length > 65535 or start + length > len(raw):
        raise bad(f".npy header claims {length:,} bytes, {len(raw) - start:,} follow")
    try:
        text = bytes(raw[start : start + length]).decode("ascii")
    except UnicodeDecodeError:
        raise bad(".npy header is not ASCII") from None
    body = text.rstrip(" \n")
    if not (body.startswith("{") and body.endswith("}")) or not text.endswith("\n"):
        raise bad(".npy header is not a dict literal ending in a newline")
    found: dict[str, str] = {}
    pos, inner = 1, body[:-1]
    while inner[pos:].strip():
        match = _NPY_ENTRY.match(body, pos)
        if match is None or match.group(1) in found:
            raise bad(f".npy header is not of the form numpy writes: {body[:120]!r}")
        found[match.group(1)] = match.group(2)
        pos = match.end()
    if body[pos:].strip() != "}" or len(found) != 3:
        raise bad(f".npy header is not of the form numpy writes: {body[:120]!r}")
    dtype = np.dtype(found["descr"].strip("'"))
    shape = tuple(int(v) for v in found["shape"].strip("()").replace(",", " ").split())
    need, have = math.prod(shape) * dtype.itemsize, len(raw) - start - length
    if need > have:
        fault = f".npy header claims shape {shape} of {dtype} ({need:,} bytes), only {have:,} bytes follow"
        raise bad(fault)
