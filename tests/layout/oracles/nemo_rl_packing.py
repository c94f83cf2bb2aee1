# ruff: noqa
# Copied from NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909
# (https://github.com/NVIDIA-NeMo/RL), licensed under the Apache License, Version 2.0
# (Copyright (c) 2025-2026, NVIDIA CORPORATION. All rights reserved.):
# - nemo_rl/models/megatron/common.py: _round_up_to_multiple;
# - nemo_rl/distributed/model_utils.py: _get_tokens_on_this_cp_rank;
# - nemo_rl/models/megatron/data.py: _pack_sequences_for_megatron, _shard_routed_experts_for_cp,
#   _get_pack_sequence_parameters_for_megatron;
# - nemo_rl/models/megatron/router_replay.py: _split_for_sequence_parallel.
# Edits, all marked "r3store edit": megatron's PackedSeqParams becomes a dict of its fields;
# _split_for_sequence_parallel takes sequence_parallel/tp_size/tp_rank as arguments instead of
# the model config and megatron.core.parallel_state. The packing lines are unchanged.

"""Oracle: NeMo-RL's THD packing of tokens and routed experts for Megatron, copied."""

from typing import Any, Optional

import torch


def PackedSeqParams(**fields):  # r3store edit: megatron.core.packed_seq_params.PackedSeqParams
    return fields


def _round_up_to_multiple(value: int, multiple: int) -> int:
    return (
        ((value + multiple - 1) // multiple * multiple)
        if value % multiple != 0
        else value
    )


def _get_tokens_on_this_cp_rank(
    input_ids: torch.Tensor,
    cp_rank: int,
    cp_size: int,
    seq_dim: int = 1,
) -> torch.Tensor:
    """Get tokens on this context parallelism rank.

    Assumes that input_ids are already padded to a multiple of cp_size * 2 or cp_size == 1.

    Args:
        input_ids: Input token IDs [seq_length, ]
        cp_rank: Context parallelism rank
        cp_size: Context parallelism size

    Returns:
        Tokens on this context parallelism rank [1, seq_length // cp_size]
    """
    if cp_size == 1:
        return input_ids

    # load balance for causal attention
    shard_size = input_ids.shape[seq_dim] // (cp_size * 2)
    shard_inds = (cp_rank, (cp_size * 2) - cp_rank - 1)

    # Create slices for each dimension
    slices = [slice(None)] * input_ids.dim()
    ids_chunks = []

    for ind in shard_inds:
        slices[seq_dim] = slice(ind * shard_size, (ind + 1) * shard_size)
        ids_chunks.append(input_ids[tuple(slices)])

    ids = torch.cat(ids_chunks, dim=seq_dim)
    return ids


def _pack_sequences_for_megatron(
    input_ids: torch.Tensor,
    seq_lengths: torch.Tensor,
    pad_individual_seqs_to_multiple_of: int = 1,
    pad_packed_seq_to_multiple_of: int = 1,
    pad_packed_seq_to: Optional[int] = None,
    cp_rank: int = 0,
    cp_size: int = 1,
) -> tuple[torch.Tensor, PackedSeqParams, torch.Tensor, Optional[torch.Tensor]]:
    """Pack sequences for Megatron model processing with optional context parallelism.

    Args:
        input_ids: Input token IDs [batch_size, seq_length]
        seq_lengths: Actual sequence lengths for each sample [batch_size]
        pad_individual_seqs_to_multiple_of: Pad individual sequences to a multiple of this value
        pad_packed_seq_to_multiple_of: Pad packed sequences to a multiple of this value
        pad_packed_seq_to: Pad packed sequences to this value (before CP)
            - The three parameters above can be calculated using _get_pack_sequence_parameters_for_megatron, we do not recommend users to set these parameters manually.
        cp_size: Context parallelism size

    Returns:
        Tuple of:
        - packed_input_ids: Packed input tensor [1, T]
        - input_ids_cp_sharded: Sharded input tensor [cp_size, T // cp_size]
        - packed_seq_params: PackedSeqParams object
        - cu_seqlens: Cumulative sequence lengths
        - cu_seqlens_padded: Padded cumulative sequence lengths
    """
    batch_size = input_ids.shape[0]

    # Build cumulative sequence lengths (cu_seqlens) and extract valid tokens
    needs_padding = (
        pad_individual_seqs_to_multiple_of > 1
        or pad_packed_seq_to_multiple_of > 1
        or pad_packed_seq_to is not None
    )

    cu_seqlens = [0]
    cu_seqlens_padded = [0] if needs_padding else None
    valid_tokens = []

    if pad_packed_seq_to is not None:
        assert pad_packed_seq_to % pad_packed_seq_to_multiple_of == 0, (
            f"pad_packed_seq_to ({pad_packed_seq_to}) is not a multiple of pad_packed_seq_to_multiple_of ({pad_packed_seq_to_multiple_of})."
        )

    pad_factor = pad_individual_seqs_to_multiple_of

    for b in range(batch_size):
        seq_len = (
            seq_lengths[b].item() if torch.is_tensor(seq_lengths[b]) else seq_lengths[b]
        )

        # Extract valid tokens for this sequence
        valid_tokens.append(input_ids[b, :seq_len])

        # Update cumulative sequence lengths
        cu_seqlens.append(cu_seqlens[-1] + seq_len)

        # For context parallelism, track padded sequence lengths
        if needs_padding:
            # Pad sequence length to multiple of (cp_size * 2)
            padded_seq_len = _round_up_to_multiple(seq_len, pad_factor)
            cu_seqlens_padded.append(cu_seqlens_padded[-1] + padded_seq_len)

    # Convert to tensors
    cu_seqlens = torch.tensor(cu_seqlens, dtype=torch.int32, device=input_ids.device)
    if needs_padding:
        cu_seqlens_padded = torch.tensor(
            cu_seqlens_padded, dtype=torch.int32, device=input_ids.device
        )
        if pad_packed_seq_to is not None:
            cu_seqlens_padded[-1] = pad_packed_seq_to
        elif pad_packed_seq_to_multiple_of > 1:
            cu_seqlens_padded[-1] = _round_up_to_multiple(
                cu_seqlens_padded[-1], pad_packed_seq_to_multiple_of
            )

    # Calculate max sequence length (padded if using CP)
    if needs_padding:
        seq_lens_padded = cu_seqlens_padded[1:] - cu_seqlens_padded[:-1]
        max_seqlen = seq_lens_padded.max().item()
    else:
        seq_lens = cu_seqlens[1:] - cu_seqlens[:-1]
        max_seqlen = seq_lens.max().item()

    # Concatenate all valid tokens
    # If using individual padding, we need to pad individual sequences
    # CP will always need padding (of at least cp_size * 2)
    running_seq_len = 0
    if pad_factor > 1:
        all_input_ids = []
        padded_tokens = []
        for b in range(batch_size):
            seq_len = (
                seq_lengths[b].item()
                if torch.is_tensor(seq_lengths[b])
                else seq_lengths[b]
            )
            # if last element, pad to the max sequence length
            if b == batch_size - 1 and needs_padding:
                if pad_packed_seq_to is not None:
                    padded_seq_len = pad_packed_seq_to - running_seq_len
                elif pad_packed_seq_to_multiple_of > 1:
                    padded_seq_len = _round_up_to_multiple(seq_len, pad_factor)
                    padded_seq_len = (
                        _round_up_to_multiple(
                            running_seq_len + padded_seq_len,
                            pad_packed_seq_to_multiple_of,
                        )
                        - running_seq_len
                    )
                else:
                    padded_seq_len = _round_up_to_multiple(seq_len, pad_factor)
            else:
                padded_seq_len = _round_up_to_multiple(seq_len, pad_factor)

            running_seq_len += padded_seq_len

            # Pad this sequence to the required length
            seq_tokens = input_ids[b, :seq_len]
            if padded_seq_len > seq_len:
                # Pad with zeros (or use a padding token if available)
                seq_tokens = torch.nn.functional.pad(
                    seq_tokens, (0, padded_seq_len - seq_len), value=0
                )
            all_input_ids.append(seq_tokens)

            if cp_size > 1:
                seq_tokens = _get_tokens_on_this_cp_rank(
                    seq_tokens, cp_rank, cp_size, seq_dim=0
                )

            padded_tokens.append(seq_tokens)

        # Concatenate all padded tokens
        # For 'thd' format, the shape should be [1, T] where T is total tokens
        packed_input_ids = torch.cat(padded_tokens, dim=0).unsqueeze(0)
        all_input_ids = torch.cat(all_input_ids, dim=0).unsqueeze(0)
    else:
        # No individual padding, just concatenate valid tokens
        # For 'thd' format, the shape should be [1, T] where T is total tokens
        packed_input_ids = torch.cat(valid_tokens, dim=0).unsqueeze(0)
        all_input_ids = packed_input_ids
        if needs_padding:
            if pad_packed_seq_to is not None:
                pad_len = pad_packed_seq_to - packed_input_ids.shape[1]
            elif pad_packed_seq_to_multiple_of > 1:
                current_seq_len = packed_input_ids.shape[1]
                pad_this_seq_to = _round_up_to_multiple(
                    current_seq_len, pad_packed_seq_to_multiple_of
                )
                pad_len = pad_this_seq_to - current_seq_len
            else:
                pad_len = 0
            if pad_len > 0:
                packed_input_ids = torch.nn.functional.pad(
                    packed_input_ids, (0, pad_len), value=0
                )
                all_input_ids = torch.nn.functional.pad(
                    all_input_ids, (0, pad_len), value=0
                )

    if cu_seqlens_padded is None:
        cu_seqlens_padded = cu_seqlens.clone()

    # total_tokens is required for PackedSeqParams.__post_init__ to build
    # seq_idx, which Mamba uses to reset SSM state at sample boundaries.
    packed_seq_params = PackedSeqParams(
        cu_seqlens_q=cu_seqlens_padded,
        cu_seqlens_kv=cu_seqlens_padded,
        cu_seqlens_q_padded=cu_seqlens_padded,
        cu_seqlens_kv_padded=cu_seqlens_padded,
        max_seqlen_q=int(max_seqlen),
        max_seqlen_kv=int(max_seqlen),
        qkv_format="thd",
        total_tokens=packed_input_ids.shape[1],
    )

    return (
        all_input_ids.contiguous(),
        packed_input_ids.contiguous(),
        packed_seq_params,
        cu_seqlens,
        cu_seqlens_padded,
    )


def _shard_routed_experts_for_cp(
    routed_experts: Optional[torch.Tensor],  # [B, S, L, K] or None
    token_identity: Optional[
        torch.Tensor
    ],  # [B, S, 3] or None (R3 forward verifier, debug)
    seq_lengths: torch.Tensor,  # [B]
    cu_seqlens: torch.Tensor,  # [B+1] valid cumulative (from _pack_sequences_for_megatron)
    cu_seqlens_padded: Optional[
        torch.Tensor
    ],  # [B+1] padded cumulative (None when no padding)
    cp_rank: int,
    cp_size: int,
) -> tuple[
    Optional[torch.Tensor],
    Optional[torch.Tensor],
    Optional[torch.Tensor],
    Optional[torch.Tensor],
]:
    """CP-shard routed_experts / token_identity onto main's per-seq packed layout.

    Mirrors _pack_sequences_for_megatron's per-sequence zigzag for input_ids: each
    sequence is padded to its padded length (from cu_seqlens_padded, so boundaries are
    IDENTICAL to input_ids) then sharded with _get_tokens_on_this_cp_rank(seq_dim=0).
    routed_experts pad rows use arange(topk) (a valid top-k route; mcore
    _validate_replay_tensor rejects 0/dup/-1). token_identity pads with 0 (verifier skips).
    No roll (these are per-token, not next-token targets).
    Returns (routed_packed, routed_cp_sharded, identity_packed, identity_cp_sharded),
    each [1, T(/cp), ...] or None.

    This additive helper is the only routed_experts-specific CP code path.
    """
    batch_size = seq_lengths.shape[0]

    all_routed = [] if routed_experts is not None else None
    cp_routed = [] if routed_experts is not None else None
    all_identity = [] if token_identity is not None else None
    cp_identity = [] if token_identity is not None else None
    topk = routed_experts.shape[-1] if routed_experts is not None else None

    for b in range(batch_size):
        seq_len = int(seq_lengths[b])
        if cu_seqlens_padded is not None:
            padded_len = int(cu_seqlens_padded[b + 1] - cu_seqlens_padded[b])
        else:
            padded_len = int(cu_seqlens[b + 1] - cu_seqlens[b])

        if routed_experts is not None:
            # [seq_len, num_moe_layers, topk] padded to the SAME padded_len boundary as
            # input_ids so the routes ride the same per-seq zigzag.
            re = routed_experts[b, :seq_len]
            if padded_len > seq_len:
                # mcore _validate_replay_tensor rejects zero/duplicate/-1 routes,
                # so pad each row with a valid top-k route arange(topk).
                default_route = torch.arange(
                    topk,
                    dtype=re.dtype,
                    device=re.device,
                ).view(1, 1, topk)
                pad_rows = default_route.expand(
                    padded_len - seq_len,
                    re.shape[1],
                    topk,
                )
                re = torch.cat((re, pad_rows), dim=0)
            all_routed.append(re)
            re_cp = (
                _get_tokens_on_this_cp_rank(re, cp_rank, cp_size, seq_dim=0)
                if cp_size > 1
                else re
            )
            cp_routed.append(re_cp)

        if token_identity is not None:
            # [seq_len, 3] padded to the SAME padded_len boundary
            id = token_identity[b, :seq_len]
            if padded_len > seq_len:
                # pad rows with valid=0 so the verifier skips them
                id = torch.nn.functional.pad(
                    id,
                    (0, 0, 0, padded_len - seq_len),
                    value=0,
                )
            all_identity.append(id)
            id_cp = (
                _get_tokens_on_this_cp_rank(id, cp_rank, cp_size, seq_dim=0)
                if cp_size > 1
                else id
            )
            cp_identity.append(id_cp)

    routed_packed = (
        torch.cat(all_routed, dim=0).unsqueeze(0)
        if routed_experts is not None
        else None
    )
    routed_cp_sharded = (
        torch.cat(cp_routed, dim=0).unsqueeze(0) if routed_experts is not None else None
    )
    identity_packed = (
        torch.cat(all_identity, dim=0).unsqueeze(0)
        if token_identity is not None
        else None
    )
    identity_cp_sharded = (
        torch.cat(cp_identity, dim=0).unsqueeze(0)
        if token_identity is not None
        else None
    )
    return routed_packed, routed_cp_sharded, identity_packed, identity_cp_sharded


def _get_pack_sequence_parameters_for_megatron(
    megatron_cfg: dict,
    pad_individual_seqs_to_multiple_of: int,
    max_seq_len_in_batch: int,
):
    """Get pack sequence parameters for Megatron model processing with optional context parallelism.

    Args:
        megatron_cfg: Megatron configuration
        pad_individual_seqs_to_multiple_of: Pad individual sequences to a multiple of this value
        max_seq_len_in_batch: Maximum sequence length in batch

    Returns:
        Tuple of:
        - pad_individual_seqs_to_multiple_of: Pad individual sequences to a multiple of this value
        - pad_packed_seq_to_multiple_of: Pad packed sequences to a multiple of this value
        - pad_packed_seq_to: Pad packed sequences to this value (before CP)
    """
    tp_size = megatron_cfg["tensor_model_parallel_size"]
    sp = megatron_cfg["sequence_parallel"]
    pp_size = megatron_cfg["pipeline_model_parallel_size"]
    cp_size = megatron_cfg["context_parallel_size"]
    fp8_cfg = megatron_cfg.get("fp8_cfg", None) or {}
    use_fp8 = fp8_cfg.get("enabled", False)

    # individual sequence needs to be splitted to CP domain, and to TP domain when SP is enabled.
    minimum_pad_factor = 1
    if cp_size > 1:
        minimum_pad_factor *= cp_size * 2
    if tp_size > 1 and sp:
        minimum_pad_factor *= tp_size
    assert pad_individual_seqs_to_multiple_of % minimum_pad_factor == 0, (
        f"make_sequence_length_divisible_by ({pad_individual_seqs_to_multiple_of}) is not a multiple of minimum_pad_factor ({minimum_pad_factor}).\n"
        f"Please set policy.make_sequence_length_divisible_by to a multiple of {minimum_pad_factor}.\n"
        f"    - If CP is enabled, the minimum pad factor is `cp_size * 2`.\n"
        f"    - If TP+SP is enabled, the minimum pad factor is `tp_size`.\n"
        f"    - If both are enabled, the minimum pad factor is `cp_size * 2 * tp_size`."
    )

    # packed sequence length, after sharding to TP and CP domains, needs to be divisible
    # by a recipe-dependent divisor:
    #   blockwise FP8 : 128  (cublas block size)
    #   MXFP8         :  32  (MXFP8 block size)
    #   other FP8     :  16
    #   HybridEP+flex : 128  (MAX_NUM_OF_TOKENS_PER_RANK must be divisible by
    #                         NUM_OF_TOKENS_PER_CHUNK=128 in deep_ep JIT kernels)
    # When multiple constraints apply, take the max (128 is a multiple of 32/16).
    divisor = 1
    if use_fp8:
        if fp8_cfg["fp8_recipe"] == "blockwise":
            divisor = max(divisor, 128)
        elif fp8_cfg["fp8_recipe"] == "mxfp8":
            divisor = max(divisor, 32)
        else:
            divisor = max(divisor, 16)
    if (
        megatron_cfg.get("moe_token_dispatcher_type") == "flex"
        and megatron_cfg.get("moe_flex_dispatcher_backend") == "hybridep"
    ):
        divisor = max(divisor, 128)
    if divisor > 1:
        pad_packed_seq_to_multiple_of = divisor
        if cp_size > 1:
            pad_packed_seq_to_multiple_of *= cp_size * 2
        if tp_size > 1 and sp:
            pad_packed_seq_to_multiple_of *= tp_size
    else:
        pad_packed_seq_to_multiple_of = 1

    # when PP is used, all sequences must have the same length, so we need to pad the packed sequence to the max sequence length in the batch.
    if pp_size > 1:
        pad_packed_seq_to = max_seq_len_in_batch
    else:
        pad_packed_seq_to = None

    # make sure the pad_packed_seq_to is a multiple of the pad_packed_seq_to_multiple_of
    if pad_packed_seq_to is not None:
        pad_packed_seq_to = _round_up_to_multiple(
            pad_packed_seq_to, pad_packed_seq_to_multiple_of
        )

    return (
        pad_individual_seqs_to_multiple_of,
        pad_packed_seq_to_multiple_of,
        pad_packed_seq_to,
    )


def _split_for_sequence_parallel(routed_experts, *, sequence_parallel, tp_size, tp_rank):  # r3store edit
    # r3store edit: was getattr(model_config, "sequence_parallel", False) and parallel_state reads
    if not sequence_parallel:
        return routed_experts

    if tp_size == 1:
        return routed_experts
    if routed_experts.shape[0] % tp_size != 0:
        raise ValueError(
            "routed_experts token axis must be divisible by tensor parallel size "
            "when sequence_parallel is enabled: "
            f"tokens={routed_experts.shape[0]}, tp_size={tp_size}"
        )

    # r3store edit: tp_rank is an argument (was _get_tensor_model_parallel_rank())
    token_chunk = routed_experts.shape[0] // tp_size
    token_start = tp_rank * token_chunk
    token_end = token_start + token_chunk
    return routed_experts[token_start:token_end].contiguous()
