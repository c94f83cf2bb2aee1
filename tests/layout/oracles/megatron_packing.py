# ruff: noqa
# Copied from NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553
# (https://github.com/NVIDIA/Megatron-LM), file megatron/core/utils.py, function
# _get_batch_on_this_cp_rank_per_sequence_balancing (what get_batch_on_this_cp_rank runs for
# batches without cu_seqlens, i.e. BSHD). Megatron-core's sequence-parallel split then
# scatters the [S, B, H] embedding output along S (scatter_to_sequence_parallel_region:
# r3store.testing.layout.sp_slice).
# Edit, marked "r3store edit": torch.distributed.get_world_size/get_rank(cp_group) become the
# arguments cp_size, cp_rank. The partitioning lines are unchanged.
#
# Copyright (c) 2023, NVIDIA CORPORATION. All rights reserved.
# Redistribution and use in source and binary forms, with or without modification, are
# permitted provided that the following conditions are met:
#  * Redistributions of source code must retain the above copyright notice, this list of
#    conditions and the following disclaimer.
#  * Redistributions in binary form must reproduce the above copyright notice, this list of
#    conditions and the following disclaimer in the documentation and/or other materials
#    provided with the distribution.
#  * Neither the name of NVIDIA CORPORATION nor the names of its contributors may be used to
#    endorse or promote products derived from this software without specific prior written
#    permission.
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS" AND ANY EXPRESS
# OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES OF
# MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT SHALL THE
# COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL,
# EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE
# GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER CAUSED
# AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING
# NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED
# OF THE POSSIBILITY OF SUCH DAMAGE.

"""Oracle: Megatron-core's per-sequence (BSHD) context-parallel partition, copied."""

import torch


def _get_batch_on_this_cp_rank_per_sequence_balancing(
    batch: dict[str, torch.Tensor], *, cp_size: int, cp_rank: int  # r3store edit: was cp_group
):
    """Partition a batch across CP ranks with per-sequence zigzag load balancing.

    Applies zigzag load-balanced chunking across the entire sequence. The
    sequence is split into ``2 * cp_size`` equal chunks and assigned in a
    zigzag pattern: for CP=2, the 4 chunks are assigned as
    (chunk_0, chunk_3) -> GPU 0 and (chunk_1, chunk_2) -> GPU 1, balancing
    compute for causal attention where later tokens attend to more
    predecessors. The sequence length must be divisible by
    ``2 * cp_size``. All tensor-valued entries in the batch are
    partitioned along their sequence dimension; metadata keys
    (cu_seqlens, cu_seqlens_padded, max_seqlen, etc.) and None-valued
    entries are left unchanged.

    Args:
        batch (dict[str, torch.Tensor]): Batch dict with tensors of shape
            ``[micro_batch_size, seq_length, ...]``.
        cp_group (torch.distributed.ProcessGroup): The context-parallel
            process group.

    Returns:
        dict[str, torch.Tensor]: The batch with sequence-dimension tensors
        partitioned to this CP rank.
    """

    # r3store edit: cp_size, cp_rank are arguments (were torch.distributed.get_world_size/get_rank(cp_group))

    # HybridCP metadata is not partitioned along the sequence dim — skip by key.
    # Intermediate PP stages set non-metadata keys to None, so still skip those.
    METADATA_KEYS = (
        'cu_seqlens',
        'cu_seqlens_padded',
        'max_seqlen',
        'local_cp_size',
        'hybrid_cp_group',
    )

    if cp_size > 1:
        for key, val in batch.items():
            if key in METADATA_KEYS or val is None:
                continue
            seq_dim = 2 if key == 'attention_mask' else 1
            val = val.view(
                *val.shape[0:seq_dim],
                2 * cp_size,
                val.shape[seq_dim] // (2 * cp_size),
                *val.shape[(seq_dim + 1) :],
            )
            index = torch.zeros(2, dtype=torch.int64, device=val.device)
            index[0].fill_(cp_rank)
            index[1].fill_(2 * cp_size - cp_rank - 1)
            val = val.index_select(seq_dim, index)
            val = val.view(*val.shape[0:seq_dim], -1, *val.shape[(seq_dim + 2) :])
            batch[key] = val

    return batch
