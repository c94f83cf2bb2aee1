"""The FLAME-MoE-290M trace: loading it, its ModelSpec, and cutting it into samples."""

from __future__ import annotations

from importlib.resources import files

import numpy as np

from r3store._spec import ModelSpec

__all__ = ["FLAME_SEQ_TOKENS", "flame_samples", "flame_spec", "load_flame"]

FLAME_FILE = "flame_moe_290m_prefill_2048tok_8layers_top6.npz"
FLAME_SEQ_TOKENS = 64
"""Tokens per sequence in the trace stream (upstream: 32 sequences x 64 tokens)."""


def load_flame() -> tuple[np.ndarray, np.ndarray]:
    """The real FLAME-MoE-290M trace.

    Returns
    -------
    expert_ids : ndarray of int16, shape (2048, 8, 6)
        Routed expert ids (0..63) per token, MoE layer and top-6 slot, each row ordered
        by router score (descending).
    layers : ndarray of int64, shape (8,)
        Global decoder-layer index of each MoE layer (2..9).

    Notes
    -----
    Upstream: Hugging Face dataset ``CMU-FLAME/FLAME-MoE-Traces``
    (``actives/flame-moe-290m/31066/5473``), Apache-2.0. Loaded with
    ``allow_pickle=False``.
    """
    path = files("r3store.data").joinpath("flame-moe-290m", FLAME_FILE)
    with path.open("rb") as f, np.load(f, allow_pickle=False) as npz:
        return npz["expert_ids"].copy(), npz["layers"].copy()


def flame_spec() -> ModelSpec:
    """ModelSpec for the trace: 64 routed experts, top-6, MoE layers 2..9 of 10 decoder layers.

    The trace records decoder layers 2..9 only; layers 0 and 1 are modelled as layers
    without routes (SGLang-style payloads carry them as zero rows).
    """
    _, layers = load_flame()
    return ModelSpec(num_layers=int(layers[-1]) + 1, num_experts=64, top_k=6, moe_layers=layers.tolist())


def flame_samples(num_tokens: int = FLAME_SEQ_TOKENS) -> dict[str, np.ndarray]:
    """The trace cut into samples of ``num_tokens`` tokens (R3 layout: ``num_tokens - 1`` rows).

    Sequence ``i`` of the stream (rows ``[64 i, 64 i + 64)``) becomes sample
    ``"flame-{i:02d}"`` with its first ``num_tokens - 1`` rows: the row of the last token
    is dropped, as an engine never routes the last sampled token.

    Returns
    -------
    dict of str to ndarray of int32, shape (num_tokens - 1, 8, 6)
    """
    ids, _ = load_flame()
    seqs = ids.reshape(-1, FLAME_SEQ_TOKENS, *ids.shape[1:])
    return {f"flame-{i:02d}": seq[: num_tokens - 1].astype(np.int32) for i, seq in enumerate(seqs)}
