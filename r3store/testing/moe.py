"""Tiny MoE language models of six Hugging Face transformers families, built from configs.

Random init, nothing downloaded (needs ``transformers``, the ``r3store[hf]`` extra).
Four decoder layers, hidden size 128, each family with its own router: the test
suite, ``r3store demo`` and ``benchmarks/bench_replay.py`` replay routes in them.
The ``initializer_range`` of 0.1 (transformers' default is 0.02) makes the expert
outputs a visible part of the residual stream, so routing differences show in the
log-probs.

Examples
--------
>>> from r3store.testing.moe import FAMILIES, tiny_moe
>>> engine, trainer = tiny_moe("qwen3_moe", engine_dtype="bfloat16")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "FAMILIES",
    "VOCAB_SIZE",
    "decision_flips",
    "one_thread",
    "pack",
    "random_batch",
    "tiny_config",
    "tiny_moe",
    "tiny_tokenizer",
    "token_logprobs",
]

VOCAB_SIZE = 512
"""Vocabulary of every tiny model (token ids ``[3, 512)`` are ordinary tokens; 0-2 special)."""

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 512, "initializer_range": 0.1,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
}

_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe": ("Qwen3MoeConfig", {
        "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 128, "num_experts_per_tok": 8,
        "head_dim": 32, "norm_topk_prob": True}),
    "qwen2_moe": ("Qwen2MoeConfig", {
        "intermediate_size": 256, "moe_intermediate_size": 32, "num_experts": 60, "num_experts_per_tok": 4,
        "shared_expert_intermediate_size": 64, "norm_topk_prob": False}),
    "olmoe": ("OlmoeConfig", {
        "intermediate_size": 32, "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False}),
    "mixtral": ("MixtralConfig", {
        "intermediate_size": 64, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 32}),
    "deepseek_v3": ("DeepseekV3Config", {
        "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 32, "n_routed_experts": 64,
        "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 1,
        "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "kv_lora_rank": 32,
        "q_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 32}),
    "gpt_oss": ("GptOssConfig", {
        "intermediate_size": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "head_dim": 32,
        "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
}

FAMILIES: tuple[str, ...] = tuple(_FAMILIES)
"""Model types with a tiny config: Qwen3-MoE (128 experts, top-8), Qwen2-MoE (60, top-4,
shared expert), OLMoE (64, top-8), Mixtral (8, top-2), DeepSeek-V3 (64, top-8, decoder
layer 0 dense), gpt-oss (32, top-4)."""


def tiny_config(family: str, **overrides: Any) -> Any:
    """The transformers config of a tiny model of ``family`` (see :data:`FAMILIES`)."""
    import transformers

    if family not in _FAMILIES:
        raise KeyError(f"no tiny config for {family!r}; known: {', '.join(FAMILIES)}")
    cls_name, extra = _FAMILIES[family]
    return getattr(transformers, cls_name)(**{**_COMMON, **extra, **overrides})


def tiny_moe(family: str, *, seed: int = 0, engine_dtype: str | torch.dtype | None = None,
             **overrides: Any) -> Any:
    """A randomly initialised tiny causal LM of ``family`` in float32, in eval mode.

    Parameters
    ----------
    family : str
        One of :data:`FAMILIES`.
    seed : int
        ``torch.manual_seed`` for the initialisation (the global RNG is restored after).
    engine_dtype : str or torch.dtype, optional
        Also return a copy with the same weights cast to this dtype (the "rollout
        engine"), as ``(engine, trainer)``.
    **overrides
        Config fields to change.

    Returns
    -------
    transformers.PreTrainedModel, or (engine, trainer)
    """
    import transformers

    config = tiny_config(family, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()  # type: ignore[no-untyped-call]
    if engine_dtype is None:
        return model
    dtype = getattr(torch, engine_dtype) if isinstance(engine_dtype, str) else engine_dtype
    return copy.deepcopy(model).to(dtype), model


def tiny_tokenizer(words: int = 64) -> Any:
    """A word-level tokenizer built locally for the tiny models (nothing downloaded).

    Ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>`` (the tiny configs' pad, bos and eos
    ids), then ``<unk>`` and the words ``w0 .. w{words-1}``; text is split on
    whitespace. Returns a ``transformers.PreTrainedTokenizerFast`` (padding side left,
    as generation wants).
    """
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    if not 1 <= words <= VOCAB_SIZE - 4:
        raise ValueError(f"words must be in [1, {VOCAB_SIZE - 4}], got {words}")
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{f"w{i}": i + 4 for i in range(words)}}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast
    return fast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",  # type: ignore[no-untyped-call]
                eos_token="<eos>", unk_token="<unk>", padding_side="left")


def random_batch(batch_size: int, seqlen: int, *, seed: int = 0,
                 padding: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and an attention mask for a padded batch.

    Sequence 0 has ``seqlen`` tokens, the others between ``seqlen // 2`` and ``seqlen``.

    Returns
    -------
    input_ids : Tensor of int64, shape (batch_size, seqlen)
        Ordinary tokens ``[3, VOCAB_SIZE)``; 0 (the pad id) at padding.
    attention_mask : Tensor of int64, shape (batch_size, seqlen)
        1 on real tokens (at the end with ``padding="left"``).
    """
    if padding not in ("right", "left"):
        raise ValueError(f"padding must be 'right' or 'left', got {padding!r}")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seqlen // 2, seqlen + 1, (batch_size,), generator=gen)
    lengths[0] = seqlen
    pos = torch.arange(seqlen)[None]
    mask = pos < lengths[:, None] if padding == "right" else pos >= seqlen - lengths[:, None]
    ids = torch.randint(3, VOCAB_SIZE, (batch_size, seqlen), generator=gen)
    return ids * mask, mask.long()


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """The real tokens of a padded batch packed into one row (THD), with restarting position ids.

    Returns
    -------
    dict
        ``input_ids`` and ``position_ids`` int64 ``(1, T)``, ``cu_seqlens`` int32 ``(B + 1,)``.
    """
    keep = attention_mask.bool()
    lengths = keep.sum(dim=1)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    pos = torch.cat([torch.arange(int(n)) for n in lengths])
    return {"input_ids": input_ids[keep][None], "position_ids": pos[None], "cu_seqlens": cu.int()}


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """float32 ``(R,)``: log p(next token) at every position that has a next real token."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    keep = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return logp[keep]


def decision_flips(a: list[Any], b: list[Any]) -> tuple[int, int, int, int]:
    """Compare two lists of routes ``(rows, layers, top_k)`` as expert *sets*.

    Returns
    -------
    tuple of int
        ``(differing decisions, decisions, tokens with a differing layer, tokens)``.
    """
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"{len(a)} vs {len(b)} sequences")
    differ = [(np.sort(np.asarray(x), -1) != np.sort(np.asarray(y), -1)).any(-1) for x, y in zip(a, b, strict=True)]
    d = np.concatenate(differ) if differ else np.zeros((0, 0), bool)
    return int(d.sum()), int(d.size), int(d.any(axis=1).sum()), int(d.shape[0])


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block (tiny models on a shared, busy CPU are
    many times faster without OpenMP threads competing for cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
