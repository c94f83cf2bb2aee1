# ruff: noqa
# Copied from NovaSky-AI/SkyRL at commit a9564572eb8e91076be43c1bd5e4615e3de17265
# (https://github.com/NovaSky-AI/SkyRL), licensed under the Apache License, Version 2.0:
# - skyrl/backends/skyrl_train/distributed/megatron/packing_utils.py: get_packed_seq_align_size,
#   get_unpacked_seq_align_size;
# - skyrl/backends/skyrl_train/distributed/megatron/token_metadata.py: _new_metadata_tensor,
#   TokenMetadataLayout, build_token_metadata_layout, align_token_metadata;
# - skyrl/backends/skyrl_train/utils/replay_utils.py, setup_per_microbatch_replay_forward: the
#   "TP splitting" block, as the function tp_slice.
# SkyRL's replay aligns the per-token routes [B, S, L, K] with align_token_metadata, then
# tp_slice; the tokens go through preprocess_packed_seqs (same layout, verl's rule).
# Edits, all marked "r3store edit": megatron.core.parallel_state reads become the arguments
# tp_size, cp_size, cp_rank (build_token_metadata_layout) and tp_size, tp_rank (tp_slice).

"""Oracle: SkyRL's token/route metadata layout for Megatron (packed and unpacked), copied."""

import math
from dataclasses import dataclass

import torch


def get_packed_seq_align_size(tp_size: int, cp_size: int, fp8_enabled: bool = False) -> int:
    """Return global per-subsequence padding needed for TP/CP layout."""
    if cp_size > 1:
        layout_align = tp_size * cp_size * 2
    else:
        layout_align = tp_size
    if not fp8_enabled:
        return layout_align
    return math.lcm(layout_align, 16 * cp_size)


def get_unpacked_seq_align_size(tp_size: int, fp8_enabled: bool = False) -> int:
    """Return sequence padding needed when removing microbatch padding without CP."""
    if not fp8_enabled:
        return tp_size
    return math.lcm(tp_size, 16)


def _new_metadata_tensor(
    source: torch.Tensor,
    shape: tuple[int, ...],
    padding_value: torch.Tensor | bool | int,
) -> torch.Tensor:
    output = torch.empty(shape, dtype=source.dtype, device=source.device)
    output[...] = padding_value
    return output


@dataclass(frozen=True)
class TokenMetadataLayout:
    """One shared description of Megatron's token padding and CP sharding."""

    attention_mask: torch.Tensor
    sequence_lengths: list[int]
    aligned_sequence_length: int
    padded_sequence_lengths: list[int] | None = None
    # Retained to reconstruct CP-sharded packed outputs in canonical batch order.
    cu_seqlens_padded: torch.Tensor | None = None
    context_parallel_size: int = 1
    context_parallel_rank: int = 0


def build_token_metadata_layout(
    attention_mask: torch.Tensor,
    device: torch.device,
    *,
    packed: bool,
    fp8_enabled: bool,
    tp_size: int,  # r3store edit: instead of mpu
    cp_size: int,
    cp_rank: int,
) -> TokenMetadataLayout:
    """Compute the shared layout once for all replayed token metadata."""
    aligned_attention_mask = attention_mask.to(device=device, dtype=torch.bool)
    sequence_lengths_tensor = aligned_attention_mask.sum(dim=1, dtype=torch.int32)
    sequence_lengths = sequence_lengths_tensor.tolist()
    # r3store edit: tp_size is an argument (was mpu.get_tensor_model_parallel_world_size())

    if not packed:
        align_size = get_unpacked_seq_align_size(tp_size, fp8_enabled=fp8_enabled)
        max_sequence_length = max(sequence_lengths)
        aligned_sequence_length = max_sequence_length + (-max_sequence_length % align_size)
        return TokenMetadataLayout(
            attention_mask=aligned_attention_mask,
            sequence_lengths=sequence_lengths,
            aligned_sequence_length=aligned_sequence_length,
        )

    # r3store edit: cp_size is an argument (was mpu.get_context_parallel_world_size())
    align_size = get_packed_seq_align_size(tp_size, cp_size, fp8_enabled=fp8_enabled)
    padded_sequence_lengths_tensor = sequence_lengths_tensor + (-sequence_lengths_tensor % align_size)
    padded_sequence_lengths = padded_sequence_lengths_tensor.tolist()
    cu_seqlens_padded = torch.cat(
        (
            torch.zeros(1, dtype=torch.int32, device=device),
            padded_sequence_lengths_tensor.cumsum(dim=0),
        )
    )
    return TokenMetadataLayout(
        attention_mask=aligned_attention_mask,
        sequence_lengths=sequence_lengths,
        aligned_sequence_length=sum(padded_sequence_lengths),
        padded_sequence_lengths=padded_sequence_lengths,
        cu_seqlens_padded=cu_seqlens_padded,
        context_parallel_size=cp_size,
        context_parallel_rank=cp_rank if cp_size > 1 else 0,  # r3store edit: was mpu.get_context_parallel_rank()
    )


def align_token_metadata(
    metadata: torch.Tensor,
    layout: TokenMetadataLayout,
    padding_value: torch.Tensor | bool | int,
    *,
    next_token: bool = False,
) -> torch.Tensor:
    """Apply padding, optional next-token shifting, and CP sharding."""
    if metadata.device != layout.attention_mask.device:
        raise ValueError("Token-aligned metadata and attention_mask must be on the same device")
    if metadata.shape[:2] != layout.attention_mask.shape:
        raise ValueError(
            f"Token-aligned metadata shape {metadata.shape[:2]} does not match "
            f"attention_mask shape {layout.attention_mask.shape}"
        )

    if layout.padded_sequence_lengths is None:
        if next_token:
            raise ValueError("next-token metadata alignment is only used for packed sequences")
        aligned = _new_metadata_tensor(
            metadata,
            (metadata.shape[0], layout.aligned_sequence_length, *metadata.shape[2:]),
            padding_value,
        )
        for row_index, sequence_length in enumerate(layout.sequence_lengths):
            aligned[row_index, :sequence_length] = metadata[row_index, layout.attention_mask[row_index]]
        return aligned

    packed = _new_metadata_tensor(
        metadata,
        (layout.aligned_sequence_length, *metadata.shape[2:]),
        padding_value,
    )
    offset = 0
    for row_index, (sequence_length, padded_length) in enumerate(
        zip(layout.sequence_lengths, layout.padded_sequence_lengths, strict=True)
    ):
        packed[offset : offset + sequence_length] = metadata[row_index, layout.attention_mask[row_index]]
        # Match Megatron's [seq0, pad0, seq1, pad1, ...] microbatch layout.
        offset += padded_length

    if next_token:
        # Each packed logit predicts the next token within its own padded sequence.
        shifted = _new_metadata_tensor(metadata, packed.shape, padding_value)
        offset = 0
        for padded_length in layout.padded_sequence_lengths:
            shifted[offset : offset + padded_length - 1] = packed[offset + 1 : offset + padded_length]
            offset += padded_length
        packed = shifted

    if layout.context_parallel_size > 1:
        out = _new_metadata_tensor(
            metadata,
            (packed.shape[0] // layout.context_parallel_size, *packed.shape[1:]),
            padding_value,
        )
        src_offset = 0
        dst_offset = 0
        for padded_length in layout.padded_sequence_lengths:
            # CP uses matching front/back chunks of each padded sequence.
            length_per_cp = padded_length // layout.context_parallel_size
            half = length_per_cp // 2
            front_start = src_offset + half * layout.context_parallel_rank
            back_start = src_offset + padded_length - half * (layout.context_parallel_rank + 1)
            out[dst_offset : dst_offset + half] = packed[front_start : front_start + half]
            out[dst_offset + half : dst_offset + length_per_cp] = packed[back_start : back_start + half]
            src_offset += padded_length
            dst_offset += length_per_cp
        packed = out

    return packed.unsqueeze(0)


def tp_slice(aligned_rollout_expert_indices, *, tp_size, tp_rank):  # r3store edit: the block as a function
    # r3store edit: tp_size, tp_rank are arguments (were mpu reads)
    if tp_size > 1:
        seq_len = aligned_rollout_expert_indices.shape[1]
        chunk_size = seq_len // tp_size
        aligned_rollout_expert_indices = aligned_rollout_expert_indices[
            :, tp_rank * chunk_size : (tp_rank + 1) * chunk_size  # r3store edit: was [:, s, :, :] (routes only)
        ]
    return aligned_rollout_expert_indices
