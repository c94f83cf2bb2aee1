"""``framework=``: the packing rules of one RL framework, read from its own code.

Each framework pads, cuts (context parallel) and splits (sequence parallel) a micro-batch
its own way; ``LayoutOptions(framework=...)`` makes :func:`r3store.layout.plan_layout`
follow that framework's code for the given ``tp_size`` / ``cp_size`` /
``sequence_parallel``, so ``tokens``, ``routes``, ``cu_seqlens`` and ``replay_mask``
land on the framework's rows on every ``(cp_rank, tp_rank)``. The code followed, at the
commit read (tests/layout/oracles/ holds copies that the tests run as oracles):

========== ================================================ ======================================================
framework  repository @ commit                              functions
========== ================================================ ======================================================
megatron   NVIDIA/Megatron-LM @ d98e8a64ddf3                megatron/core/utils.py
                                                            ``_get_batch_on_this_cp_rank_per_sequence_balancing``
verl       volcengine/verl @ b178a3cd56f5                   verl/models/mcore/util.py ``preprocess_packed_seqs``;
                                                            verl/utils/megatron/router_replay_utils.py
                                                            ``set_router_replay_data``
slime      THUDM/slime @ 624b824a898a                       slime/backends/megatron_utils/data.py ``get_batch``;
                                                            cp_utils.py ``slice_with_cp``,
                                                            ``prepare_routed_experts_for_routing_replay``
miles      radixark/miles @ 31f1ca961a94                    miles/backends/training_utils/data.py ``get_batch``,
                                                            ``get_rollout_data``; cp_utils.py ``slice_with_cp``;
                                                            replay_data.py ``fill_replay_data``
nemo_rl    NVIDIA-NeMo/RL @ 7ea279abfbeb                    nemo_rl/models/megatron/data.py
                                                            ``_pack_sequences_for_megatron``,
                                                            ``_get_pack_sequence_parameters_for_megatron``,
                                                            ``_shard_routed_experts_for_cp``; router_replay.py
                                                            ``_split_for_sequence_parallel``
skyrl      NovaSky-AI/SkyRL @ a9564572eb8e                  skyrl/backends/skyrl_train/distributed/megatron/
                                                            token_metadata.py ``align_token_metadata``;
                                                            utils/replay_utils.py (TP slice)
prime_rl   PrimeIntellect-ai/prime-rl @ 559b44772e47        src/prime_rl/trainer/batch.py ``pad_micro_batch``;
                                                            src/prime_rl/utils/cp.py ``shard_for_cp``
========== ================================================ ======================================================

Rules (THD: packed, ``cu_seqlens``; BSHD: one row per sample):

* ``megatron`` (BSHD/SBHD only): Megatron-core pads nothing; it cuts each row of length
  ``T`` into ``2*cp`` chunks (rank ``r`` keeps ``r`` and ``2*cp-1-r``) and, under sequence
  parallel, scatters the sequence dimension over TP. ``T`` is the batch maximum (or
  ``max_seqlen``) rounded up to the least length both accept:
  ``lcm(2*cp, cp*tp*pad_multiple)``. Its THD path partitions through Transformer
  Engine's CUDA ``thd_get_partitioned_indices`` and is not covered.
* ``verl`` (THD only: its router replay packs routes with ``preprocess_packed_seqs``
  whatever the data format): each sequence padded to ``tp`` (no CP) or ``2*tp*cp``,
  zig-zag per sequence, no total padding; ``cu_seqlens`` are the global padded
  boundaries; SP splits the CP-local rows evenly over TP.
* ``skyrl``: THD as verl (``get_packed_seq_align_size``); routes are TP-sliced whenever
  ``tp > 1``, so ``sequence_parallel`` must be on then. BSHD (no CP): rows padded to the
  batch maximum rounded up to ``tp``.
* ``slime`` and ``miles`` (THD): each sequence padded to ``2*cp`` and zig-zag cut, the
  CP-local packed length padded to ``tp * pad_multiple`` (``--data-pad-size-multiplier``,
  default 128) as a final ``cu_seqlens`` segment, ``cu_seqlens`` scaled by ``cp``.
  ``cp_mode="contiguous"`` is their ``--allgather-cp``: concatenate, pad the whole stream
  to ``cp * tp * pad_multiple``, each CP rank keeps one contiguous chunk. Miles BSHD:
  rows padded to ``max_seqlen`` (or the batch maximum) rounded up to
  ``tp * pad_multiple``, then to ``2*cp`` chunks; its SP split of BSHD routes (flattened
  batch-first) is not covered.
* ``nemo_rl`` (THD): each sequence padded to ``pad_multiple``
  (``make_sequence_length_divisible_by``; default its minimum ``2*cp`` (with CP) times
  ``tp`` (with SP)), zig-zag per sequence, ``cu_seqlens`` global padded boundaries. The
  FP8 / HybridEP and pipeline-parallel (``pad_packed_seq_to``) paddings are not covered.
* ``prime_rl`` (THD, ``tp_size == 1``: FSDP): sequences back to back, the total padded to
  ``pad_multiple`` (``pad_to_multiple_of``, set to ``cp`` by its config) with the padding
  added to the last sequence, each CP rank keeps one contiguous chunk of the stream
  (``cp_mode`` is not used: prime-rl has this one split).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from r3store.errors import LayoutOptionError

__all__ = ["FRAMEWORKS", "SOURCES", "check_framework", "default_pad_multiple", "framework_index"]

FRAMEWORKS = ("megatron", "verl", "slime", "miles", "nemo_rl", "skyrl", "prime_rl")
"""Values of ``LayoutOptions.framework``."""

SOURCES = {
    "megatron": ("NVIDIA/Megatron-LM", "d98e8a64ddf34856e74b24714e3bedb2f5a39553"),
    "verl": ("volcengine/verl", "b178a3cd56f58b2d502255daba591e92833930a7"),
    "slime": ("THUDM/slime", "624b824a898ab0ec1fcb4d373004c7f3852bf515"),
    "miles": ("radixark/miles", "31f1ca961a94cb860cec3b2dea34ec332bfa8f76"),
    "nemo_rl": ("NVIDIA-NeMo/RL", "7ea279abfbeb698b092856d0dab61e7cf39bc909"),
    "skyrl": ("NovaSky-AI/SkyRL", "a9564572eb8e91076be43c1bd5e4615e3de17265"),
    "prime_rl": ("PrimeIntellect-ai/prime-rl", "559b44772e471d1538537b8805cc77f3824a5e64"),
}
"""Repository and commit whose packing code each framework's rules follow."""

_LAYOUTS = {
    "megatron": ("bshd", "sbhd"),
    "verl": ("thd",),
    "slime": ("thd",),
    "miles": ("thd", "bshd"),
    "nemo_rl": ("thd",),
    "skyrl": ("thd", "bshd"),
    "prime_rl": ("thd",),
}


def _nemo_minimum(cp_size: int, tp_size: int, sequence_parallel: bool) -> int:
    """NeMo-RL's ``minimum_pad_factor`` (``_get_pack_sequence_parameters_for_megatron``)."""
    factor = 2 * cp_size if cp_size > 1 else 1
    return factor * (tp_size if tp_size > 1 and sequence_parallel else 1)


def default_pad_multiple(framework: str | None, cp_size: int, tp_size: int, sequence_parallel: bool) -> int:
    """``pad_multiple`` when it is not given: the framework's own default."""
    if framework in ("slime", "miles"):
        return 128  # --data-pad-size-multiplier's default (slime/Miles get_batch pad_multiplier=128)
    if framework == "nemo_rl":
        return _nemo_minimum(cp_size, tp_size, sequence_parallel)
    if framework == "prime_rl":
        return cp_size  # prime-rl's config sets orchestrator.pad_to_multiple_of = trainer.model.cp
    return 1


def check_framework(framework: str, *, layout: str, cp_size: int, cp_mode: str, tp_size: int,
                    sequence_parallel: bool, pad_multiple: int, max_seqlen: int | None) -> None:
    """Refuse options the framework's packing code has no counterpart for.

    Raises
    ------
    LayoutOptionError
        Naming the option and the framework rule it breaks.
    """
    def fault(option: str, value: Any, why: str) -> LayoutOptionError:
        return LayoutOptionError(option, value, f"with framework={framework!r}: {why}")

    if layout not in _LAYOUTS[framework]:
        why = {"verl": "verl's router replay packs routes THD (preprocess_packed_seqs) whatever the data format",
               "megatron": "Megatron-core partitions THD batches through Transformer Engine's "
                           "thd_get_partitioned_indices, which is not covered; use the framework that packs "
                           "your THD batch, or framework=None"}.get(framework, "this layout is not covered")
        raise fault("layout", layout, f"{why} (covered: {', '.join(_LAYOUTS[framework])})")
    if cp_mode == "contiguous" and framework not in ("slime", "miles", "prime_rl"):
        raise fault("cp_mode", cp_mode, "the framework cuts sequences zig-zag only")
    if framework in ("verl", "skyrl") and pad_multiple != 1:
        raise fault("pad_multiple", pad_multiple, "the framework pads each sequence to tp (2*tp*cp with CP) and has "
                                                  "no pad multiple")
    if framework == "skyrl" and tp_size > 1 and not sequence_parallel:
        raise fault("sequence_parallel", sequence_parallel, "SkyRL slices replayed routes over TP ranks whenever "
                                                            "tp_size > 1 (Megatron MoE with TP runs sequence parallel)")
    if layout != "thd" and framework in ("skyrl",) and cp_size > 1:
        raise fault("cp_size", cp_size, "SkyRL's unpacked (BSHD) path has no context parallel")
    if framework == "skyrl" and max_seqlen is not None:
        raise fault("max_seqlen", max_seqlen, "SkyRL pads rows to the batch maximum")
    if framework == "miles" and layout == "bshd":
        if sequence_parallel and tp_size > 1:
            raise fault("sequence_parallel", sequence_parallel, "Miles flattens BSHD routes batch-first before its "
                                                                "SP split (fill_replay_data); not covered")
        if cp_mode == "contiguous":
            raise fault("cp_mode", cp_mode, "Miles' BSHD all-gather CP is not covered")
    if framework == "nemo_rl":
        minimum = _nemo_minimum(cp_size, tp_size, sequence_parallel)
        if pad_multiple % minimum:
            raise fault("pad_multiple", pad_multiple, f"make_sequence_length_divisible_by must be a multiple of "
                                                      f"{minimum} (2*cp with CP, times tp with SP)")
    if framework == "prime_rl":
        if tp_size != 1:
            raise fault("tp_size", tp_size, "prime-rl trains with FSDP (no tensor parallel)")
        if pad_multiple % cp_size:
            raise fault("pad_multiple", pad_multiple, f"pad_to_multiple_of must divide by cp_size={cp_size} "
                                                      f"(shard_for_cp needs equal chunks)")


@dataclass(frozen=True)
class _Thd:
    """One framework's THD rule."""

    seq_unit: int
    """Each sequence is padded to a multiple of this (global, before the CP cut)."""
    split: Literal["zigzag", "stream"]
    """``zigzag``: ``2*cp`` chunks per sequence; ``stream``: one contiguous chunk of the packed stream."""
    total: Literal["none", "local_segment", "global_segment", "global_last"]
    """Where the packed total is padded: not at all; the CP-local stream as a final segment; the
    global stream as a final segment; the global stream, added to the last sequence."""
    total_unit: int = 1


def _thd_rule(opts: Any) -> _Thd:
    fw, cp, tp, pm = opts.framework, opts.cp_size, opts.tp_size, opts.pad_multiple
    if fw in ("verl", "skyrl"):
        return _Thd(tp * 2 * cp if cp > 1 else tp, "zigzag", "none")
    if fw in ("slime", "miles"):
        if opts.cp_mode == "contiguous":
            return _Thd(1, "stream", "global_segment", cp * tp * pm)
        return _Thd(2 * cp if cp > 1 else 1, "zigzag", "local_segment", tp * pm)
    if fw == "nemo_rl":
        return _Thd(pm, "zigzag", "none")
    if fw == "prime_rl":
        return _Thd(1, "stream", "global_last", pm)
    raise AssertionError(fw)  # check_framework refused the rest


def _round_up(n: Any, unit: int) -> Any:
    return -(-n // unit) * unit


def _zigzag(offset: int, n: int, padded: int, cp: int, r: int) -> np.ndarray:
    """Positions (``offset + t``, ``-1`` past ``n``) rank ``r`` keeps of one sequence padded to ``padded``
    (only the rank's ``padded // cp`` positions are built: the checked local length bounds the memory)."""
    if cp > 1:
        chunk = padded // (2 * cp)
        first = np.arange(r * chunk, (r + 1) * chunk, dtype=np.int64)
        pos = np.concatenate((first, first + (2 * cp - 1 - 2 * r) * chunk))
    else:
        pos = np.arange(padded, dtype=np.int64)
    return np.where(pos < n, offset + pos, -1)


def _thd(seqlens: np.ndarray, offsets: np.ndarray, opts: Any) -> tuple[np.ndarray, np.ndarray]:
    rule = _thd_rule(opts)
    cp, r = opts.cp_size, opts.cp_rank
    padded = _round_up(seqlens, rule.seq_unit)
    if rule.total == "global_last":
        total = int(padded.sum())
        padded[-1] += int(_round_up(total, rule.total_unit)) - total
    if rule.split == "zigzag":
        index = np.concatenate([_zigzag(int(o), int(n), int(p), cp, r)
                                for o, n, p in zip(offsets, seqlens, padded, strict=True)])
        cu = np.concatenate(([0], np.cumsum(padded // cp)))
        if rule.total == "local_segment":
            extra = int(_round_up(len(index), rule.total_unit)) - len(index)
            if extra:
                index = np.concatenate((index, np.full(extra, -1, np.int64)))
                cu = np.append(cu, len(index))
        return index, (cu * cp).astype(np.int32)
    # one contiguous chunk of the packed stream: only this rank's part of it is built (the checked
    # local length bounds the memory, not cp_size times it)
    cu = np.concatenate(([0], np.cumsum(padded))).astype(np.int64)
    total = int(cu[-1])
    if rule.total == "global_segment":
        extra = int(_round_up(total, rule.total_unit)) - total
        if extra:
            cu = np.append(cu, total + extra)
    part = int(cu[-1]) // cp
    g = np.arange(r * part, (r + 1) * part, dtype=np.int64)
    seq = np.minimum(np.searchsorted(cu[1 : len(seqlens) + 1], g, side="right"), len(seqlens) - 1)
    t = g - cu[seq]
    inside = (g < total) & (t < np.asarray(seqlens, np.int64)[seq])
    index = np.where(inside, np.asarray(offsets, np.int64)[seq] + t, -1)
    return index, cu.astype(np.int32)


def _bshd_length(seqlens: np.ndarray, opts: Any) -> int:
    """Global row length ``T`` (before the CP cut) of a BSHD/SBHD framework layout."""
    fw, cp, tp, pm = opts.framework, opts.cp_size, opts.tp_size, opts.pad_multiple
    longest = int(seqlens.max())
    if opts.max_seqlen is not None:
        if longest > opts.max_seqlen:
            i = int(np.argmax(seqlens > opts.max_seqlen))
            fault = f"sample {i} has {int(seqlens[i])} tokens, more than max_seqlen={opts.max_seqlen}"
            raise LayoutOptionError("max_seqlen", opts.max_seqlen, fault)
        longest = opts.max_seqlen
    if fw == "skyrl":
        return int(_round_up(longest, tp))
    if fw == "miles":
        length = int(_round_up(longest, tp * pm))
        return int(_round_up(length, 2 * cp)) if cp > 1 else length
    # megatron: the least length its per-sequence CP cut and SP scatter accept
    return int(_round_up(longest, math.lcm(2 * cp if cp > 1 else 1, cp * tp * pm)))


def _bshd(seqlens: np.ndarray, offsets: np.ndarray, opts: Any) -> tuple[np.ndarray, np.ndarray]:
    length = _bshd_length(seqlens, opts)
    rows = np.stack([_zigzag(int(o), int(n), length, opts.cp_size, opts.cp_rank)
                     for o, n in zip(offsets, seqlens, strict=True)])
    cu = np.arange(len(rows) + 1, dtype=np.int64) * rows.shape[1]
    return rows, cu.astype(np.int32)


def local_length(seqlens: np.ndarray, opts: Any) -> tuple[int, int]:
    """``(rows, width)`` of one rank's index before the SP split, computed without building it."""
    if opts.layout != "thd":
        return len(seqlens), _bshd_length(seqlens, opts) // opts.cp_size
    rule = _thd_rule(opts)
    total = int(_round_up(seqlens, rule.seq_unit).sum())
    if rule.split == "zigzag":
        local = total // opts.cp_size
        return 1, int(_round_up(local, rule.total_unit)) if rule.total == "local_segment" else local
    return 1, int(_round_up(total, rule.total_unit)) // opts.cp_size


def framework_index(seqlens: np.ndarray, offsets: np.ndarray, opts: Any) -> tuple[np.ndarray, np.ndarray]:
    """The index (before the SP split) and ``cu_seqlens`` of ``opts.framework``'s layout.

    Returns
    -------
    index : numpy.ndarray of int64
        THD ``(T,)`` or BSHD ``(B, T)``: CP-local positions in the concatenated token
        order, ``-1`` for padding.
    cu_seqlens : numpy.ndarray of int32
        What the framework hands its attention: THD the global (padded) sequence
        boundaries the framework builds; BSHD ``arange(B + 1) * T``.

    Raises
    ------
    LayoutOptionError
        Under sequence parallel, the length is not divisible by ``tp_size`` (a rule the
        framework asserts).
    """
    build = _thd if opts.layout == "thd" else _bshd
    index, cu = build(seqlens, offsets, opts)
    if opts.sequence_parallel and index.shape[-1] % opts.tp_size:
        raise LayoutOptionError("tp_size", opts.tp_size,
                                f"with framework={opts.framework!r}: the CP-local length {index.shape[-1]} does not "
                                f"divide over the TP ranks (the framework asserts it does); raise pad_multiple")
    return index, cu
