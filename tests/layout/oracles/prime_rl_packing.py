# ruff: noqa
# Copied from PrimeIntellect-ai/prime-rl at commit 559b44772e471d1538537b8805cc77f3824a5e64
# (https://github.com/PrimeIntellect-ai/prime-rl), licensed under the Apache License, Version 2.0:
# - src/prime_rl/transports/rollouts/types.py: the fields of RoutedExperts and MicroBatch;
# - src/prime_rl/trainer/batch.py: STREAM_FILL, _routed_experts_row_size, _pad_routed_experts,
#   pad_micro_batch;
# - src/prime_rl/utils/sequence.py: get_cu_seqlens_from_seq_lens;
# - src/prime_rl/utils/cp.py: shard_for_cp.
# prime-rl's trainer (src/prime_rl/trainer/rl/train.py) shards input_ids and routed_experts
# with shard_for_cp after pad_micro_batch; cu_seqlens come from the padded sequence_lengths.
# Edits, all marked "r3store edit": RoutedExperts and MicroBatch are dataclasses with the same
# fields (they were msgspec Structs). The functions are unchanged.

"""Oracle: prime-rl's micro-batch padding and context-parallel sharding, copied."""

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class RoutedExperts:  # r3store edit: was a msgspec.Struct
    data: bytes
    shape: list[int]  # [seq_len, layers, topk]
    dtype: str


@dataclass
class MicroBatch:  # r3store edit: was a msgspec.Struct
    """A micro batch of data for training."""

    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    sequence_lengths: list[int]
    temperatures: list[float]  # Per-token temperatures used during generation
    env_names: list[str]
    seq_lens: list[int]
    ref_logprobs: list[float] | None = None
    routed_experts: RoutedExperts | None = None
    mm_kwargs: dict | None = None  # r3store edit: dict[str, EncodedTensor]
    mm_token_type_ids: list[int] | None = None
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None


def micro_batch(input_ids, sequence_lengths, routed_experts=None):  # r3store edit: a packed micro batch
    """What ``_materialize_bin`` builds for text samples: the per-token lists concatenated."""
    n = len(input_ids)
    routed = None
    if routed_experts is not None:
        routed = RoutedExperts(data=routed_experts.tobytes(), shape=list(routed_experts.shape),
                               dtype=routed_experts.dtype.name)
    return MicroBatch(input_ids=list(input_ids), loss_mask=[True] * n, advantages=[0.0] * n,
                      inference_logprobs=[0.0] * n, position_ids=list(range(n)),
                      sequence_lengths=list(sequence_lengths), temperatures=[1.0] * n, env_names=[""] * n,
                      seq_lens=list(sequence_lengths), routed_experts=routed)


def routed_array(micro_batch):  # r3store edit: decode RoutedExperts as prime-rl's trainer does
    r = micro_batch.routed_experts
    return np.frombuffer(r.data, dtype=r.dtype).reshape(r.shape)


STREAM_FILL = {"rl_weights": 1.0, "ce_weights": 0.0, "ref_kl_weights": 0.0}


def _routed_experts_row_size(routed_experts: RoutedExperts) -> int:
    return routed_experts.shape[1] * routed_experts.shape[2] * np.dtype(routed_experts.dtype).itemsize


def _pad_routed_experts(micro_batch: MicroBatch, padding_size: int) -> None:
    routed_experts = micro_batch.routed_experts
    assert routed_experts is not None
    row_size = _routed_experts_row_size(routed_experts)
    routed_experts.data += b"\0" * (padding_size * row_size)
    routed_experts.shape[0] += padding_size


def pad_micro_batch(micro_batch: MicroBatch, pad_to_multiple_of: int) -> MicroBatch:
    """
    Pad a micro batch with the given padding size sample
    Return the padded micro batch.
    Args:
        micro_batch: The micro batch to pad.
        padding_size: The number of padding tokens to add.
    Returns:
        The padded micro batch.
    """

    padding_size = (pad_to_multiple_of - (len(micro_batch.input_ids) % pad_to_multiple_of)) % pad_to_multiple_of

    if len(micro_batch.env_names) != len(micro_batch.input_ids):
        raise ValueError(
            f"MicroBatch.env_names must match input_ids length before padding: "
            f"env_names={len(micro_batch.env_names)}, input_ids={len(micro_batch.input_ids)}"
        )

    if not (pad_to_multiple_of > 1 and padding_size > 0):
        return micro_batch

    micro_batch.input_ids.extend([1] * padding_size)
    micro_batch.advantages.extend([0.0] * padding_size)
    micro_batch.loss_mask.extend([False] * padding_size)
    micro_batch.position_ids.extend(list(range(padding_size)))
    micro_batch.sequence_lengths[-1] += padding_size
    micro_batch.seq_lens[-1] += padding_size
    micro_batch.inference_logprobs.extend([0.0] * padding_size)
    # Use temperature 1.0 for padding tokens (doesn't matter since loss_mask is False)
    micro_batch.temperatures.extend([1.0] * padding_size)
    if micro_batch.ref_logprobs is not None:
        micro_batch.ref_logprobs.extend([0.0] * padding_size)
    # Padding is loss-masked, so no component trains it; fill every stream
    # with 0.0 (not the pack-boundary defaults) so a padded pure-ce batch
    # still reads as rl-empty in token export, which keys off nonzero weights.
    for stream_name in STREAM_FILL:
        stream = getattr(micro_batch, stream_name)
        if stream is not None:
            stream.extend([0.0] * padding_size)
    if micro_batch.mm_token_type_ids is not None:
        micro_batch.mm_token_type_ids.extend([0] * padding_size)
    if micro_batch.routed_experts is not None:
        _pad_routed_experts(micro_batch, padding_size)
    micro_batch.env_names.extend([""] * padding_size)

    return micro_batch


def get_cu_seqlens_from_seq_lens(seq_lens: torch.Tensor, total_tokens: int | None = None) -> tuple[torch.Tensor, int]:
    if seq_lens.ndim != 1:
        raise ValueError(f"seq_lens must be 1D, got shape={tuple(seq_lens.shape)}")
    if seq_lens.numel() == 0:
        raise ValueError("seq_lens must not be empty")
    if bool((seq_lens <= 0).any().item()):
        raise ValueError(f"seq_lens must be positive, got {seq_lens.tolist()}")
    if total_tokens is not None and int(seq_lens.sum().item()) != total_tokens:
        raise ValueError(f"seq_lens sum must equal sequence length: {seq_lens.tolist()} vs {total_tokens}")

    seq_lens = seq_lens.to(dtype=torch.int32)
    cu_seqlens = torch.empty(seq_lens.numel() + 1, dtype=torch.int32, device=seq_lens.device)
    cu_seqlens[0] = 0
    cu_seqlens[1:] = seq_lens.cumsum(dim=0, dtype=torch.int32)
    return cu_seqlens, int(seq_lens.max().item())


def shard_for_cp(t: torch.Tensor, cp_rank: int, cp_world_size: int, seq_dim: int = 1) -> torch.Tensor:
    """
    Shard a tensor for context parallelism.
    Args:
        t: The tensor to shard.
        cp_rank: The rank of the current process.
        cp_world_size: The number of processes in the context parallel group.
    Returns:
        The shard of the tensor for the current rank.
    """

    if seq_dim == 1 and t.shape[0] != 1:
        raise ValueError(f"For CP, tensor must have batch dimension 1, got shape={tuple(t.shape)}")
    if t.shape[seq_dim] % cp_world_size != 0:
        raise ValueError(
            f"CP requires sequence dimension {seq_dim} to be divisible by cp size: "
            f"shape={tuple(t.shape)}, cp_size={cp_world_size}; "
            "uneven shards deadlock CP collectives (e.g. ulysses all-to-all)"
        )

    chunked_t = torch.chunk(t, cp_world_size, dim=seq_dim)

    return chunked_t[cp_rank]
