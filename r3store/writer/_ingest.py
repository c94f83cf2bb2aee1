"""Decode routed-expert payloads from inference engines into ``(rows, layers, top_k)`` arrays."""

from __future__ import annotations

import base64
import binascii
import io
import math
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


def _check_npy_header(sample_id: str, raw: bytes) -> None:
    """Check a ``.npy`` header (format 1.0 or 2.0) against the bytes that follow it.

    Raises
    ------
    r3store.errors.PayloadDecodeError
        Another format version, an object dtype, or a shape needing more bytes than present.
    ValueError
        The header is malformed.
    """
    fp = io.BytesIO(raw)
    version = np.lib.format.read_magic(fp)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read is None:
        raise PayloadDecodeError(sample_id, "routed_experts", f".npy format version {version} is not read (1.0, 2.0)")
    shape, _, dtype = read(fp)
    if dtype.hasobject:
        raise PayloadDecodeError(sample_id, "routed_experts", f".npy holds dtype {dtype}: never unpickled")
    need, have = math.prod(shape) * dtype.itemsize, len(raw) - fp.tell()
    if need > have:
        fault = f".npy header claims shape {shape} of {dtype} ({need:,} bytes), only {have:,} bytes follow"
        raise PayloadDecodeError(sample_id, "routed_experts", fault)
