"""``assemble``: one trainer micro-batch of routes (numpy), laid out like the trainer's tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from r3store._format import token_hash
from r3store._validate import as_numpy
from r3store.errors import AlignmentError
from r3store.layout import (
    LayoutOptions,
    LayoutOptionsDict,
    LayoutPlan,
    apply_plan,
    apply_routes,
    check_pad_args,
    plan_layout,
    route_index,
)
from r3store.reader import RouteReader

__all__ = ["BATCH_KEYS", "PadPolicy", "assemble"]

BATCH_KEYS = ("routes", "replay_mask", "cu_seqlens", "num_tokens", "sample_ids", "layers", "sp_range")
"""Keys of every batch (``tokens`` is added when token ids are given, ``policy_version`` when asked for)."""

PadPolicy = Literal["spread", "fill"]


def _check_tokens(reader: RouteReader, sample_ids: Sequence[str], tokens: Sequence[Any]) -> np.ndarray:
    if len(tokens) != len(sample_ids):
        raise AlignmentError("<batch>", f"got token ids for {len(tokens)} samples, asked for {len(sample_ids)}")
    parts = []
    for sid, toks in zip(sample_ids, tokens, strict=True):
        arr = as_numpy(sid, "tokens", toks).reshape(-1)
        row = reader.row(sid)
        if len(arr) - 1 != row["num_rows"]:
            raise AlignmentError(sid, f"len(tokens) - 1 = {len(arr) - 1} but the sample has {row['num_rows']} "
                                      f"route rows (recorded for num_tokens = {row['num_tokens']})")
        stored = row["token_hash"]
        if stored is not None and token_hash(arr) != stored:
            raise AlignmentError(sid, f"token ids do not match the tokens the routes were recorded for "
                                      f"(hash {token_hash(arr)} != stored {stored})")
        parts.append(arr.astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def assemble(
    reader: RouteReader,
    sample_ids: Sequence[str],
    options: LayoutOptions | LayoutOptionsDict | Mapping[str, Any] | None = None,
    *,
    layers: Sequence[int] | None = None,
    pad_policy: PadPolicy = "spread",
    fill_value: int = -1,
    tokens: Sequence[Any] | None = None,
    return_policy_version: bool = False,
) -> dict[str, Any]:
    """Read and lay out the routes of ``sample_ids`` as one micro-batch (numpy arrays).

    For trainers that choose their own micro-batches (Miles, verl); the torch layer
    (:class:`r3store.RouteDataset`, ``r3store.dataset.batch_to_tensors``) turns the
    result into tensors.

    Parameters
    ----------
    reader : RouteReader
    sample_ids : sequence of str
        The samples, in batch order.
    options : LayoutOptions or LayoutOptionsDict, optional
        How the trainer lays out tokens (THD/BSHD, CP, TP/SP); default ``LayoutOptions()``.
    layers : sequence of int, optional
        Global decoder layers to keep (a pipeline stage's MoE layers).
    pad_policy : {"spread", "fill"}
        Pad rows get distinct in-range ids spread over all experts, or ``fill_value``.
    fill_value : int
        Pad id with ``pad_policy="fill"``.
    tokens : sequence of int sequences, optional
        Each sample's token ids: checked against the stored token hash and
        ``len(tokens) - 1 == rows``, and laid out as ``batch["tokens"]``.
    return_policy_version : bool
        Add ``policy_version``: per row, the policy (weight) version that produced it
        (:meth:`r3store.RouteReader.policy_spans`), laid out like the routes.

    Returns
    -------
    dict
        ``routes`` int32 ``(T, n_layers, top_k)`` (THD) or ``(B, T, n_layers, top_k)``
        (BSHD); ``replay_mask`` bool ``(T,)`` / ``(B, T)`` (False on pad rows and on rows
        the engine could not capture, which hold pad-row ids); ``cu_seqlens`` int32;
        ``num_tokens`` int32 ``(B,)``; ``sample_ids`` list of str; ``layers`` list of
        global decoder-layer indices; ``sp_range`` (start, end); ``tokens`` int64 laid
        out the same way when ``tokens`` is given (pad positions 0); ``policy_version``
        int64 ``(T,)`` / ``(B, T)`` with ``return_policy_version`` (-1 on pad rows and in
        samples written without a version). See :func:`r3store.layout.plan_layout` for
        ``cu_seqlens`` under CP/TP.

    Raises
    ------
    r3store.errors.AlignmentError
        ``tokens`` given and a sample's ``len(tokens) - 1`` differs from its route rows,
        or its token hash differs from the stored one.
    r3store.errors.LayoutOptionError
        An option, ``pad_policy`` or ``fill_value`` is invalid.
    r3store.errors.SampleNotFoundError, r3store.errors.LayerError
    TypeError
        ``sample_ids`` is a single str.
    """
    if isinstance(sample_ids, str):
        raise TypeError(f"sample_ids must be a sequence of ids, got the str {sample_ids!r}; use [{sample_ids!r}]")
    opts = LayoutOptions.resolve(options)
    spec = reader.spec
    check_pad_args(spec.num_experts, pad_policy, fill_value)
    sample_ids = list(sample_ids)
    positions = spec.layer_positions(layers)
    flat_tokens = _check_tokens(reader, sample_ids, tokens) if tokens is not None else None
    num_tokens = [reader.num_tokens(s) for s in sample_ids]
    offsets = np.concatenate([[0], np.cumsum([n - 1 for n in num_tokens])]).astype(np.int64)
    routes = np.empty((int(offsets[-1]), len(positions), spec.top_k), dtype=np.int32)
    missing: np.ndarray | None = None
    for sid, lo, hi in zip(sample_ids, offsets[:-1], offsets[1:], strict=True):
        reader.get(sid, layers, out=routes[lo:hi])
        for a, b in reader.missing_rows(sid):
            missing = np.zeros(len(routes), bool) if missing is None else missing
            missing[lo + a : lo + b] = True
    plan = plan_layout(num_tokens, opts)
    out, mask = apply_routes(plan, routes, num_experts=spec.num_experts, pad_policy=pad_policy, fill_value=fill_value,
                             missing=missing)
    batch: dict[str, Any] = {
        "routes": out,
        "replay_mask": mask,
        "cu_seqlens": np.array(plan.cu_seqlens, dtype=np.int32),
        "num_tokens": np.array(plan.seqlens, dtype=np.int32),
        "sample_ids": sample_ids,
        "layers": [spec.moe_layers[p] for p in positions],
        "sp_range": tuple(int(v) for v in plan.sp_range),
    }
    if flat_tokens is not None:
        batch["tokens"] = apply_plan(plan, flat_tokens, fill_value=0)
    if return_policy_version:
        batch["policy_version"] = _policy_versions(reader, sample_ids, offsets, plan)
    return batch


def _policy_versions(reader: RouteReader, sample_ids: list[str], offsets: np.ndarray,
                     plan: LayoutPlan) -> np.ndarray:
    """Per output row, the policy version of the route there (-1: a pad row, or no version)."""
    versions = np.full(int(offsets[-1]), -1, dtype=np.int64)
    for sid, lo in zip(sample_ids, offsets[:-1], strict=True):
        for a, b, v in reader.policy_spans(sid):
            versions[lo + a : lo + b] = v
    ridx = route_index(plan)
    return np.where(ridx >= 0, versions[np.maximum(ridx, 0)] if len(versions) else -1, -1)
