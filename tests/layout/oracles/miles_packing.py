# ruff: noqa
# Copied from radixark/miles at commit 31f1ca961a94cb860cec3b2dea34ec332bfa8f76
# (https://github.com/radixark/miles), licensed under the Apache License, Version 2.0:
# - miles/backends/training_utils/cp_utils.py: slice_with_cp;
# - miles/backends/training_utils/data.py: get_rollout_data's BSHD max_seq_len block (as
#   rollout_max_seq_len) and get_batch's token packing (from `tokens = batch["tokens"]` to the
#   qkv_format branches' end, as get_batch_tokens);
# - miles/backends/training_utils/replay_data.py: fill_replay_data's setup and the body of its
#   per-micro-batch loop (as fill_replay_data_one_microbatch).
# Edits, all marked "r3store edit": get_parallel_state() is the stand-in below (set_ranks()
# sets it); the functions take the batch dict / args namespace instead of data iterators and
# return the packed tensors; .cuda() and torch.cuda.current_device() become CPU. The packing lines
# are otherwise unchanged.

"""Oracle: Miles' THD/BSHD packing of tokens and of replayed routes, copied."""

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

_STATE = SimpleNamespace(tp=SimpleNamespace(size=1, rank=0), cp=SimpleNamespace(size=1, rank=0))


def get_parallel_state():  # r3store edit: stands in for miles' parallel state
    return _STATE


def set_ranks(*, tp_size, tp_rank, cp_size, cp_rank):  # r3store edit: what get_parallel_state() returns
    _STATE.tp.size, _STATE.tp.rank, _STATE.cp.size, _STATE.cp.rank = tp_size, tp_rank, cp_size, cp_rank


def slice_with_cp(
    tokens: torch.Tensor,
    pad_value: tuple[int, float, Callable],
    qkv_format: str = "thd",
    max_seq_len: int | None = None,
    parallel_state: object | None = None,
) -> torch.Tensor:
    """
    Slice tokens into the local zigzag CP layout.
    """
    if parallel_state is None:
        parallel_state = get_parallel_state()
    cp_rank = parallel_state.cp.rank
    cp_size = parallel_state.cp.size

    if qkv_format == "bshd":
        assert max_seq_len is not None

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
        if qkv_format == "bshd":
            pad = max_seq_len - tokens.size(0)
            tokens = pad_tokens(tokens, pad)
        return tokens

    token_len = len(tokens)
    if qkv_format == "thd":
        chunk_size = (token_len + 2 * cp_size - 1) // (2 * cp_size)
    else:
        chunk_size = (max_seq_len + 2 * cp_size - 1) // (2 * cp_size)

    # pad
    pad = 2 * cp_size * chunk_size - token_len
    tokens = pad_tokens(tokens, pad)

    # get 2 chunk for thd cp
    start_1, end_1 = chunk_size * cp_rank, chunk_size * (cp_rank + 1)
    start_2, end_2 = chunk_size * (2 * cp_size - cp_rank - 1), chunk_size * (2 * cp_size - cp_rank)
    return torch.cat([tokens[start_1:end_1], tokens[start_2:end_2]])


def rollout_max_seq_len(rollout_data, args):  # r3store edit: get_rollout_data's BSHD block
    parallel_state = get_parallel_state()  # r3store edit
    if args.qkv_format == "bshd":
        # TODO: micro-batch wise dynamic, possibly move to @data.py:get_data_iterator
        max_seq_len = max(rollout_data["total_lengths"])

        # pad to reduce memory fragmentation and maybe make the computation faster
        pad_size = parallel_state.tp.size * args.data_pad_size_multiplier
        max_compress_ratio = max(args.compress_ratios) if args.compress_ratios else 0
        if max_compress_ratio:
            local_seqlen_multiple = max_compress_ratio * (2 if parallel_state.cp.size > 1 else 1)
            pad_size = max(pad_size, local_seqlen_multiple * parallel_state.cp.size)
        max_seq_len = (max_seq_len + pad_size - 1) // pad_size * pad_size

    return max_seq_len  # r3store edit


def get_batch_tokens(batch, pad_multiplier=128, qkv_format="thd", allgather_cp=False):  # r3store edit
    parallel_state = get_parallel_state()
    cu_seqlens = None  # r3store edit
    tokens = batch["tokens"]
    # use 0 as the pad token id should be fine?
    pad_token_id = 0
    pad_size = parallel_state.tp.size * pad_multiplier

    # for cp, we need all tokens to calculate logprob
    batch["unconcat_tokens"] = tokens

    cp_size = parallel_state.cp.size

    if qkv_format == "bshd":
        max_seqlen = batch["max_seq_lens"][0]
        assert max([t.size(0) for t in tokens]) <= max_seqlen

        if allgather_cp:
            assert batch.get("adapter_slots") is None, "allgather CP is currently not supported with multi-LoRA: "
            assert max_seqlen % cp_size == 0, f"max_seqlen {max_seqlen} not divisible by cp_size {cp_size}"
            local_len = max_seqlen // cp_size
            start = parallel_state.cp.rank * local_len
            tokens = [
                F.pad(t, (0, max_seqlen - t.size(0)), value=pad_token_id)[start : start + local_len] for t in tokens
            ]
        else:
            tokens = [slice_with_cp(t, pad_token_id, qkv_format, max_seqlen) for t in tokens]
        sample_token_lengths = [t.size(0) for t in tokens]
        tokens = torch.stack(tokens)

    elif qkv_format == "thd":
        cp_rank = parallel_state.cp.rank

        if allgather_cp:
            assert batch.get("adapter_slots") is None, "allgather CP is currently not supported with multi-LoRA: "
            # DSA mode: concatenate all sequences first, then slice once with CP.
            # We also pad the *global* concatenated stream to make per-rank batches equal.
            cu_seqlens_list: list[int] = [0]
            for t in tokens:
                cu_seqlens_list.append(cu_seqlens_list[-1] + t.size(0))

            tokens = torch.cat(tokens, dim=0)

            # Pad global stream so (1) divisible by cp_size (equal batches),
            # (2) divisible by pad_size (reduce fragmentation).
            global_pad_size = cp_size * pad_size
            pad = (global_pad_size - tokens.size(0) % global_pad_size) % global_pad_size
            if pad != 0:
                tokens = F.pad(tokens, (0, pad), value=pad_token_id)
                cu_seqlens_list.append(cu_seqlens_list[-1] + pad)

            cu_seqlens = torch.tensor(cu_seqlens_list, dtype=torch.int, device="cpu")
            tokens = tokens.chunk(cp_size, dim=0)[cp_rank]
        else:
            tokens = [slice_with_cp(t, pad_token_id, qkv_format) for t in tokens]
            sample_token_lengths = [t.size(0) for t in tokens]

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
            cu_seqlens = torch.tensor(cu_seqlens, dtype=torch.int) * cp_size  # r3store edit: was .cuda()

        max_seqlen = (cu_seqlens[1:] - cu_seqlens[:-1]).max().item()

        tokens = tokens.unsqueeze(0)

        batch["cu_seqlens"] = cu_seqlens
        batch["max_seqlen"] = max_seqlen
    else:
        raise ValueError(f"Unsupported qkv_format: {qkv_format}")
    return tokens, cu_seqlens  # r3store edit


def fill_replay_data_one_microbatch(batch, args, data_key="rollout_routed_experts", if_sp_region=True,
                                    indices_are_token_positions=False):  # r3store edit
    parallel_state = get_parallel_state()
    tp_rank = parallel_state.tp.rank
    tp_size = parallel_state.tp.size
    qkv_format = args.qkv_format

    def pad_func(data, pad):
        _, num_layers, topk = data.shape
        pad_tensor = torch.full(
            (pad, num_layers, topk),
            fill_value=-1,
            device=data.device,
            dtype=data.dtype,
        )
        return torch.cat([data, pad_tensor], dim=0)

    # r3store edit: one iteration of `for _ in range(sum(num_microbatches)):` on `batch`
    replay_data = batch[data_key]
    tokens = batch["tokens"]
    assert len(replay_data) == len(tokens)
    for a, b in zip(replay_data, tokens, strict=False):
        assert a.shape[0] == b.shape[0] - 1, f"{a.shape}, {b.shape}"

    # Pad replay data to align with the token batch's final token. The padded token is masked from loss.
    # TODO: fuse this padding with the following slice_with_cp to reduce memory copy.
    replay_data = [pad_func(r, 1) for r in replay_data]
    # TODO: maybe extract a common process function for here and get_batch?

    cp_size = parallel_state.cp.size
    cp_rank = parallel_state.cp.rank
    if qkv_format == "bshd":
        max_seqlen = batch["max_seq_lens"][0]
        if args.allgather_cp and cp_size > 1:
            assert max_seqlen % cp_size == 0, f"max_seqlen {max_seqlen} must be divisible by cp_size {cp_size}"
            local_len = max_seqlen // cp_size
            start = cp_rank * local_len
            replay_data = [pad_func(r, max_seqlen - r.size(0))[start : start + local_len] for r in replay_data]
        else:
            replay_data = [slice_with_cp(r, pad_func, qkv_format, max_seqlen) for r in replay_data]
        replay_data = torch.stack(replay_data, dim=0)
        batch_size, seqlen, num_layers, topk = replay_data.shape
        replay_data = replay_data.reshape(batch_size * seqlen, num_layers, topk)
    else:
        pad_size = parallel_state.tp.size * args.data_pad_size_multiplier
        if args.allgather_cp and cp_size > 1:
            replay_data = torch.cat(replay_data, dim=0)
            global_pad_size = cp_size * pad_size
            pad = (global_pad_size - replay_data.size(0) % global_pad_size) % global_pad_size
            if pad != 0:
                replay_data = pad_func(replay_data, pad)
            replay_data = replay_data.chunk(cp_size, dim=0)[cp_rank]
        else:
            replay_data = [slice_with_cp(r, pad_func, qkv_format) for r in replay_data]
            if indices_are_token_positions:
                # map indices to thd format
                offset = 0
                for i, r in enumerate(replay_data):
                    replay_data[i] = torch.where(r != -1, r + offset, r)
                    offset += r.shape[0]
            replay_data = torch.cat(replay_data, dim=0)
            pad = (pad_size - replay_data.size(0) % pad_size) % pad_size
            if pad != 0:
                replay_data = pad_func(replay_data, pad)

    # sequence_parallel is Megatron-only; FSDP has tp_size == 1 so the slice is a no-op there.
    if getattr(args, "sequence_parallel", False) and if_sp_region:
        seqlen = replay_data.size(0)
        assert seqlen % tp_size == 0
        start, end = seqlen // tp_size * tp_rank, seqlen // tp_size * (tp_rank + 1)
        replay_data = replay_data[start:end]
    return replay_data  # r3store edit
