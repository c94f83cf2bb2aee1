"""Checks run on routes before a writer accepts them (nothing is written on failure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from r3store._checks import is_int
from r3store._format import RESERVED_COLUMNS
from r3store._spec import ModelSpec
from r3store.codecs import kernels
from r3store.codecs.kernels import first_repeat, repeated_ids
from r3store.errors import ExpertIdError, RouteShapeError, RouteValidationError, RowCountError

__all__ = [
    "as_numpy",
    "check_metadata",
    "check_policy_version",
    "check_routes",
    "check_row_count",
    "check_sample_id",
    "check_tokens",
    "find_missing_rows",
    "first_repeat",
    "repeated_ids",
]

_SCALARS = (bool, int, float, str)


def as_numpy(sample_id: str, field: str, value: Any) -> np.ndarray:
    """Return ``value`` (numpy array, torch tensor, nested list) as a numpy array.

    torch tensors are detached and moved to the CPU without importing torch here.
    """
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()
    if isinstance(value, Mapping):  # an engine response handed over whole: name that, not "dtype object"
        keys = ", ".join(repr(k) for k in list(value)[:8]) or "none"
        raise RouteShapeError(sample_id, field, f"is a {type(value).__name__} (keys {keys}), not an array: pass the "
                                                "engine's routed experts (vLLM: r3store.decode_vllm(id, "
                                                "output.routed_experts); SGLang: RouteWriter.append_sglang(id, "
                                                "response))")
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise RouteShapeError(sample_id, field, f"cannot be read as an array: {exc}") from exc


def check_routes(sample_id: str, routes: np.ndarray, spec: ModelSpec, *,
                 missing: np.ndarray | None = None, allow_missing: bool = False) -> np.ndarray:
    """Validate routes and return the MoE-layer ids.

    Parameters
    ----------
    sample_id : str
    routes : ndarray of integer dtype, shape (rows, num_layers, top_k) or (rows, num_moe_layers, top_k)
        Global expert ids. With all decoder layers (SGLang's layout), dense layers must be
        all zero.
    spec : ModelSpec
    missing : ndarray of bool, shape (rows,), optional
        Rows the engine could not capture (:func:`find_missing_rows`): skipped by the
        checks and returned as 0.
    allow_missing : bool
        Whether the caller accepts missing rows (only changes the hints of the errors).

    Returns
    -------
    ndarray of uint16, shape (rows, num_moe_layers, top_k)

    Raises
    ------
    r3store.errors.RouteShapeError
        Not an integer array, wrong rank, layer count or top-k.
    r3store.errors.ExpertIdError
        An id is out of ``[0, num_experts)``, repeated within a row, or a dense layer
        holds non-zero ids.
    """
    if missing is not None and missing.any():
        _check_shape(sample_id, routes, spec)
        kept = np.flatnonzero(~missing)
        moe = np.zeros((routes.shape[0], spec.num_moe_layers, spec.top_k), dtype=np.uint16)
        moe[kept] = _check_ids(sample_id, routes[kept], spec, kept, allow_missing)
        return moe
    _check_shape(sample_id, routes, spec)
    return _check_ids(sample_id, routes, spec, None, allow_missing)


def find_missing_rows(sample_id: str, routes: np.ndarray, spec: ModelSpec) -> np.ndarray | None:
    """Rows the engine could not capture: every MoE-layer id is -1 (NeMo-RL's marker).

    Parameters
    ----------
    sample_id : str
    routes : ndarray of integer dtype, shape (rows, num_layers or num_moe_layers, top_k)
        As :func:`check_routes` takes them; dense layers of a missing row may be 0 or -1.

    Returns
    -------
    ndarray of bool, shape (rows,), or None
        None when no row is missing (or ``routes`` is not a 3-D signed integer array;
        :func:`check_routes` then names the fault).

    Raises
    ------
    r3store.errors.ExpertIdError
        A missing row's dense layer holds an id other than 0 or -1.
    """
    if routes.ndim != 3 or routes.dtype.kind != "i" or not routes.size:
        return None
    if routes.shape[1] == spec.num_layers and spec.num_layers != spec.num_moe_layers:
        moe, dense = routes[:, list(spec.moe_layers)], routes[:, list(spec.dense_layers)]
    else:
        moe, dense = routes, None
    if moe.shape[1] != spec.num_moe_layers:
        return None
    missing = (moe == -1).all(axis=(1, 2))
    if not missing.any():
        return None
    if dense is not None and dense.size:
        bad = np.argwhere(((dense != 0) & (dense != -1)).any(axis=2) & missing[:, None])
        if bad.size:
            row, pos = (int(v) for v in bad[0])
            raise ExpertIdError(sample_id, "routes", f"row {row} is missing (all MoE ids -1) but dense decoder layer "
                                                     f"{spec.dense_layers[pos]} holds {dense[row, pos].tolist()}")
    return np.asarray(missing)


def _check_shape(sample_id: str, routes: np.ndarray, spec: ModelSpec) -> None:
    if routes.dtype.kind not in "iu":  # not issubdtype(np.integer): numpy files timedelta64 under it
        raise RouteShapeError(sample_id, "routes", f"dtype must be integer, got {routes.dtype}")
    if routes.ndim != 3:
        raise RouteShapeError(sample_id, "routes",
                              f"must have 3 dims (rows, layers, top_k), got shape {routes.shape}")
    if routes.shape[2] != spec.top_k:
        raise RouteShapeError(sample_id, "routes",
                              f"top_k mismatch: last dim is {routes.shape[2]}, spec.top_k is {spec.top_k}")
    layers = routes.shape[1]
    if layers not in (spec.num_moe_layers, spec.num_layers):
        raise RouteShapeError(sample_id, "routes",
                              f"layer dim is {layers}; expected num_layers={spec.num_layers} (all decoder "
                              f"layers) or {spec.num_moe_layers} (MoE layers only)")


def _check_ids(sample_id: str, routes: np.ndarray, spec: ModelSpec, rows: np.ndarray | None,
               allow_missing: bool = False) -> np.ndarray:
    """The MoE ids of checked-shape routes, or the first fault (``rows``: original row numbers)."""
    layers = routes.shape[1]
    moe_mask = None if layers == spec.num_moe_layers else [layer in spec.moe_layers for layer in range(layers)]
    moe = np.empty((routes.shape[0], spec.num_moe_layers, spec.top_k), dtype=np.uint16)
    fault = kernels.check_ids(routes, spec.num_experts, moe=moe_mask, out=moe)
    if fault is not None:
        raise _fault_error(sample_id, routes, spec, fault, all_layers=moe_mask is not None, rows=rows,
                           allow_missing=allow_missing)
    return moe


def _fault_error(sample_id: str, routes: np.ndarray, spec: ModelSpec, fault: kernels.RouteFault,
                 *, all_layers: bool, rows: np.ndarray | None = None, allow_missing: bool = False) -> ExpertIdError:
    """The error for the first fault :func:`kernels.check_ids` found (its message names the spot)."""
    row, ids = fault.row if rows is None else int(rows[fault.row]), routes[fault.row, fault.layer]
    moe_ids = routes[fault.row][list(spec.moe_layers)] if all_layers else routes[fault.row]
    if fault.kind == "dense":
        hint = ("the ModelSpec's moe_layers may be wrong (or, for a flat engine payload reshaped with the spec, "
                "its top_k or num_layers)")
        if (moe_ids == -1).all() and not allow_missing:
            return ExpertIdError(sample_id, "routes",
                                 f"row {row} is -1 in every MoE layer (and dense decoder layer {fault.layer} holds "
                                 f"{ids.tolist()}, not zeros): a row the engine could not capture; pass "
                                 "allow_missing=True to store it as missing")
        return ExpertIdError(sample_id, "routes",
                             f"dense decoder layer {fault.layer} has non-zero ids at row {row} ({ids.tolist()}); "
                             + hint)
    layer = fault.layer if all_layers else spec.moe_layers[fault.layer]
    if fault.kind == "repeat":
        hint = ""
        zero_rows = np.flatnonzero(~_moe_all(routes, spec, all_layers).any(axis=(1, 2)))
        if not ids.any() and len(zero_rows) and fault.row in zero_rows:
            first, last = (int(zero_rows[0]), int(zero_rows[-1])) if rows is None else \
                (int(rows[zero_rows[0]]), int(rows[zero_rows[-1]]))
            hint = (f"; row {row} is zeros in every MoE layer ({len(zero_rows)} such rows, {first}..{last}): rows "
                    "the engine did not route (SGLang returns zero rows for prompt tokens it did not capture, e.g. "
                    "from its prefix cache), not a dense layer; mark them -1 and pass allow_missing=True to store "
                    "them as missing, or append only the captured rows (start=...)")
        elif not ids.any() and not _moe_all(routes, spec, all_layers)[:, _moe_position(spec, layer)].any():
            hint = (f"; all zeros in every row: is decoder layer {layer} dense (engines send dense layers as zero "
                    "rows)? Then leave it out of ModelSpec(moe_layers=...)")
        elif not ids.any():
            hint = (f"; all zeros in this row of decoder layer {layer} only (other rows and layers hold ids): "
                    "a failed capture of this row?")
        return ExpertIdError(sample_id, "routes", f"expert id repeated within row {row}, decoder layer {layer}: "
                                                  f"{ids.tolist()}{hint}")
    value = int(ids[fault.slot])
    why = "negative" if value < 0 else f">= num_experts ({spec.num_experts})"
    hint = "; physical (EP-remapped) ids instead of logical ids?"
    if value == -1 and allow_missing:
        hint = ("; allow_missing=True stores a row as missing only when every MoE id of it is -1, "
                "and this row has -1 in some layers only")
    elif value == -1:
        hint = ("; rows whose MoE ids are all -1 are rows the engine could not capture: pass allow_missing=True "
                "to store them as missing")
    elif value < 0:
        hint = ""
    return ExpertIdError(sample_id, "routes",
                         f"expert id {value} at row {row}, decoder layer {layer} is {why}{hint}")


def _moe_all(routes: np.ndarray, spec: ModelSpec, all_layers: bool) -> np.ndarray:
    """The MoE layers of checked-shape routes (all decoder layers given, or MoE layers only)."""
    return routes[:, list(spec.moe_layers)] if all_layers else routes


def _moe_position(spec: ModelSpec, layer: int) -> int:
    """Position of decoder layer ``layer`` among the MoE layers."""
    return list(spec.moe_layers).index(layer)


def check_row_count(sample_id: str, rows: int, num_tokens: int | None, tokens: np.ndarray | None) -> int:
    """Check ``rows == num_tokens - 1`` (and ``len(tokens) == num_tokens``); return num_tokens.

    Raises
    ------
    r3store.errors.RowCountError
    """
    if tokens is not None:
        if num_tokens is not None and num_tokens != len(tokens):
            raise RowCountError(sample_id, "tokens", f"len(tokens) = {len(tokens)} but num_tokens = {num_tokens}")
        num_tokens = len(tokens)
    if num_tokens is None:
        return rows + 1
    if not is_int(num_tokens) or num_tokens < 1:
        raise RowCountError(sample_id, "num_tokens", f"must be an int >= 1, got {num_tokens!r}")
    if rows != num_tokens - 1:
        extra = " (a row for the last token too? engines return num_tokens - 1 rows)" if rows == num_tokens else ""
        raise RowCountError(sample_id, "routes", f"has {rows} rows, expected num_tokens - 1 = {num_tokens - 1}{extra}")
    return int(num_tokens)


def check_policy_version(sample_id: str, version: Any) -> int | None:
    """A policy (weight) version: None, or an int in ``[0, 2**63)``.

    Raises
    ------
    r3store.errors.RouteValidationError
    """
    if version is None:
        return None
    if not is_int(version) or not 0 <= version < 2**63:
        raise RouteValidationError(sample_id, "policy_version",
                                   f"must be an int in [0, 2**63) or None, got {version!r}")
    return int(version)


def check_tokens(sample_id: str, tokens: Any) -> np.ndarray | None:
    """Token ids as a 1-D integer array (or None)."""
    if tokens is None:
        return None
    arr = as_numpy(sample_id, "tokens", tokens)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):  # timedelta64 is an np.integer
        raise RouteValidationError(sample_id, "tokens",
                                   f"must be a 1-D integer sequence, got shape {arr.shape}, dtype {arr.dtype}")
    return arr


def check_sample_id(sample_id: Any) -> str:
    """A sample id: a non-empty str of valid UTF-8, at most 4096 bytes.

    Raises
    ------
    r3store.errors.RouteValidationError
    """
    if not isinstance(sample_id, str) or not sample_id:
        raise RouteValidationError(repr(sample_id), "sample_id", "must be a non-empty str")
    if not _utf8(sample_id) or len(sample_id.encode("utf-8")) > 4096:
        raise RouteValidationError(ascii(sample_id)[:80], "sample_id", "must be valid UTF-8 of at most 4096 bytes")
    return sample_id


EXACT_FLOAT_INT = 2**53
"""Largest int magnitude a float64 column holds exactly."""


def check_metadata(sample_id: str, metadata: Mapping[str, Any] | None,
                   types: dict[str, tuple[type, int]]) -> dict[str, Any]:
    """Validate user metadata: str keys, JSON scalar values, one type per key per writer.

    ``types`` maps each key seen so far to ``(type, largest int magnitude seen)``; the
    caller adopts the updated mapping only when every check of the sample passes. An int
    column becomes a float column when a float arrives, as long as every int in it is
    exact in float64 (|v| <= 2**53); otherwise Parquet could not hold the column.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise RouteValidationError(sample_id, "metadata", f"must be a mapping, got {type(metadata).__name__}")
    try:
        items = list(metadata.items())
    except Exception as exc:
        raise RouteValidationError(sample_id, "metadata", f"cannot be read: {type(exc).__name__}: {exc}") from exc
    out: dict[str, Any] = {}
    for key, value in items:
        value = value.item() if isinstance(value, np.generic) else value
        _check_meta_value(sample_id, key, value)
        out[key] = value
        if value is not None:
            types[key] = _merge_kind(sample_id, key, value, types.get(key))
    return out


def _check_meta_value(sample_id: str, key: Any, value: Any) -> None:
    if not isinstance(key, str) or not key or key in RESERVED_COLUMNS or not _utf8(key):
        raise RouteValidationError(sample_id, f"metadata[{key!r}]", "key must be a non-empty str of valid UTF-8 and "
                                                                    f"not one of {sorted(RESERVED_COLUMNS)}")
    if value is None:
        return
    if not isinstance(value, _SCALARS) or (isinstance(value, float) and not math.isfinite(value)):
        raise RouteValidationError(sample_id, f"metadata[{key!r}]", f"must be a finite JSON scalar, got {value!r}")
    # what Parquet cannot hold would fail only at commit, taking the whole buffer with it
    if is_int(value) and not -(2**63) <= value < 2**63:
        raise RouteValidationError(sample_id, f"metadata[{key!r}]", f"int {value} does not fit in int64")
    if isinstance(value, str) and not _utf8(value):
        raise RouteValidationError(sample_id, f"metadata[{key!r}]",
                                   f"str {value!r} is not valid UTF-8 (lone surrogate)")


def _merge_kind(sample_id: str, key: str, value: Any, known: tuple[type, int] | None) -> tuple[type, int]:
    kind = type(value)
    magnitude = abs(value) if kind is int else 0
    if known is None:
        return kind, magnitude
    old_kind, old_magnitude = known
    magnitude = max(magnitude, old_magnitude)
    if {old_kind, kind} <= {int, float}:
        merged = float if float in (old_kind, kind) else int
        if merged is float and magnitude > EXACT_FLOAT_INT:
            raise RouteValidationError(sample_id, f"metadata[{key!r}]",
                                       f"mixes floats with ints beyond 2**53 ({magnitude}), which float64 cannot hold")
        return merged, magnitude
    if old_kind is not kind:
        raise RouteValidationError(sample_id, f"metadata[{key!r}]",
                                   f"is {kind.__name__} here but {old_kind.__name__} in earlier samples")
    return kind, magnitude


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
