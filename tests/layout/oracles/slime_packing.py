# ruff: noqa
# Copied from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515
# (https://github.com/THUDM/slime), licensed under the Apache License, Version 2.0:
# - slime/backends/megatron_utils/cp_utils.py: slice_with_cp, _pad_routed_experts,
#   prepare_routed_experts_for_routing_replay;
# - slime/backends/megatron_utils/data.py, get_batch: the token packing and cu_seqlens lines
#   (from `tokens = batch["tokens"]` to the cu_seqlens tensor), as get_batch_tokens.
# Edits, all marked "r3store edit": `from megatron.core import mpu` and slime.utils.accelerator
# are replaced by the stand-ins below (set_ranks() sets what mpu returns); get_batch_tokens
# takes the token list instead of a data iterator (the unconcat_tokens line dropped) and
# returns (tokens.unsqueeze(0), cu_seqlens). The copied functions are otherwise unchanged.

"""Oracle: slime's THD packing of tokens and of routed experts, copied."""

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


class _Mpu:  # r3store edit: stands in for megatron.core.mpu
    tp_size, tp_rank, cp_size, cp_rank = 1, 0, 1, 0

    def get_tensor_model_parallel_world_size(self):
        return self.tp_size

    def get_tensor_model_parallel_rank(self):
        return self.tp_rank

    def get_context_parallel_world_size(self):
        return self.cp_size

    def get_context_parallel_rank(self):
        return self.cp_rank


class accelerator:  # r3store edit: stands in for slime.utils.accelerator
    device = current_device = staticmethod(lambda: "cpu")


mpu = _Mpu()


def set_ranks(*, tp_size, tp_rank, cp_size, cp_rank):  # r3store edit: what mpu returns
    mpu.tp_size, mpu.tp_rank, mpu.cp_size, mpu.cp_rank = tp_size, tp_rank, cp_size, cp_rank


def slice_with_cp(
    tokens: torch.Tensor,
    pad_value: tuple[int, float, Callable],
) -> torch.Tensor:
    cp_rank = mpu.get_context_parallel_rank()
    cp_size = mpu.get_context_parallel_world_size()

    def pad_tokens(tokens, pad):
        if isinstance(pad_value, Callable):
            pad_func = pad_value
            tokens = pad_func(tokens, pad)
        else:
            # pad on the first dimension
            pad_tuple = (0, 0) * (tokens.dim() - 1) + (0, pad)
            tokens = F.pad(tokens, pad_tuple, value=pad_value)
        return tokens

    if cp_size == 1:
        return tokens

    token_len = len(tokens)
    chunk_size = (token_len + 2 * cp_size - 1) // (2 * cp_size)

    # pad
    pad = 2 * cp_size * chunk_size - token_len
    tokens = pad_tokens(tokens, pad)

    # get 2 chunk for thd cp
    start_1, end_1 = chunk_size * cp_rank, chunk_size * (cp_rank + 1)
    start_2, end_2 = chunk_size * (2 * cp_size - cp_rank - 1), chunk_size * (2 * cp_size - cp_rank)
    return torch.cat([tokens[start_1:end_1], tokens[start_2:end_2]])


def get_batch_tokens(tokens, pad_multiplier=128, allgather_cp=False):  # r3store edit: get_batch's token lines
    # use 0 as the pad token id should be fine?
    pad_token_id = 0
    pad_size = mpu.get_tensor_model_parallel_world_size() * pad_multiplier

    # for cp, we need all tokens to calculate logprob
    # r3store edit: dropped `batch["unconcat_tokens"] = tokens`

    cp_size = mpu.get_context_parallel_world_size()
    cp_rank = mpu.get_context_parallel_rank()

    if allgather_cp:
        # DSA mode: concatenate all sequences first, then slice once with CP.
        # We also pad the *global* concatenated stream to make per-rank chunks equal.
        cu_seqlens_list: list[int] = [0]
        for t in tokens:
            cu_seqlens_list.append(cu_seqlens_list[-1] + t.size(0))

        tokens = torch.cat(tokens, dim=0)

        # Pad global stream so (1) divisible by cp_size (equal chunks),
        # (2) divisible by pad_size (reduce fragmentation).
        global_pad_size = cp_size * pad_size
        pad = (global_pad_size - tokens.size(0) % global_pad_size) % global_pad_size
        if pad != 0:
            tokens = F.pad(tokens, (0, pad), value=pad_token_id)
            cu_seqlens_list.append(cu_seqlens_list[-1] + pad)

        cu_seqlens = torch.tensor(cu_seqlens_list, dtype=torch.int, device=accelerator.current_device())
        tokens = tokens.chunk(cp_size, dim=0)[cp_rank]
    else:
        tokens = [slice_with_cp(t, pad_token_id) for t in tokens]

        cu_seqlens = [0]
        for t in tokens:
            cu_seqlens.append(cu_seqlens[-1] + t.size(0))

        tokens = torch.cat(tokens)

        # Always pad to reduce memory fragmentation and maybe make the computation faster
        pad = (pad_size - tokens.size(0) % pad_size) % pad_size
        if pad != 0:
            tokens = F.pad(tokens, (0, pad), value=pad_token_id)
            cu_seqlens.append(cu_seqlens[-1] + pad)

        # thd requires the cu_seqlens to be of the origin length
        cu_seqlens = torch.tensor(cu_seqlens, dtype=torch.int, device=accelerator.device()) * cp_size
    return tokens.unsqueeze(0), cu_seqlens  # r3store edit


def _pad_routed_experts(experts: torch.Tensor, pad: int, num_experts: int) -> torch.Tensor:
    if pad == 0:
        return experts
    _, num_layers, topk = experts.shape
    pad_experts = (
        torch.arange(
            pad * num_layers * topk,
            device=experts.device,
            dtype=experts.dtype,
        ).reshape((pad, num_layers, topk))
        % num_experts
    )
    return torch.cat([experts, pad_experts], dim=0)


def prepare_routed_experts_for_routing_replay(
    rollout_routed_experts: Sequence[torch.Tensor],
    tokens: Sequence[torch.Tensor],
    *,
    num_experts: int,
    data_pad_size_multiplier: int,
    sequence_parallel: bool,
    allgather_cp: bool,
) -> torch.Tensor:
    """Align rollout routed-experts metadata with the training token layout."""
    assert len(rollout_routed_experts) == len(tokens)
    for experts, token_ids in zip(rollout_routed_experts, tokens, strict=False):
        assert experts.shape[0] == token_ids.shape[0] - 1, f"{experts.shape}, {token_ids.shape}"

    padded_experts = [_pad_routed_experts(experts, 1, num_experts) for experts in rollout_routed_experts]
    pad_size = mpu.get_tensor_model_parallel_world_size() * data_pad_size_multiplier

    if allgather_cp:
        routed_experts = torch.cat(padded_experts, dim=0)
        cp_size = mpu.get_context_parallel_world_size()
        cp_rank = mpu.get_context_parallel_rank()
        global_pad_size = cp_size * pad_size
        pad = (global_pad_size - routed_experts.size(0) % global_pad_size) % global_pad_size
        routed_experts = _pad_routed_experts(routed_experts, pad, num_experts)
        routed_experts = routed_experts.chunk(cp_size, dim=0)[cp_rank]
    else:
        routed_experts = [
            slice_with_cp(experts, lambda x, pad: _pad_routed_experts(x, pad, num_experts))
            for experts in padded_experts
        ]
        routed_experts = torch.cat(routed_experts, dim=0)
        pad = (pad_size - routed_experts.size(0) % pad_size) % pad_size
        routed_experts = _pad_routed_experts(routed_experts, pad, num_experts)

    if sequence_parallel:
        tp_rank = mpu.get_tensor_model_parallel_rank()
        tp_size = mpu.get_tensor_model_parallel_world_size()
        seqlen = routed_experts.size(0)
        assert seqlen % tp_size == 0
        start = seqlen // tp_size * tp_rank
        end = seqlen // tp_size * (tp_rank + 1)
        routed_experts = routed_experts[start:end]

    return routed_experts
