"""How each MoE router family turns live router scores into routing weights.

A replayed forward takes the *selection* from the record and the *weights* from the
router's live scores gathered at the recorded ids, with the family's own
normalisation. Gathering from the router's zero-filled post-top-k probabilities
instead (a bug seen in the field) gives weight 0, and no gradient, to exactly the
recorded experts the trainer did not pick itself.

Every weight function has the signature ``fn(router, logits, ids) -> weights``:

router : torch.nn.Module
    The router module (its attributes, e.g. ``norm_topk_prob``, are read).
logits : Tensor, shape (num_tokens, num_experts)
    The router's first output, in the router's compute dtype, still attached to the
    autograd graph (gradients reach the router weights through it).
ids : Tensor of int64, shape (num_tokens, top_k)
    The expert ids to weight (recorded ones, or the router's own).

and returns weights of shape ``(num_tokens, top_k)``; the caller casts them to the
dtype of the router's own weights output.

The formulas follow the router classes of Hugging Face transformers 5.x
(``models/*/modeling_*.py``); :data:`ROUTER_FAMILIES` maps router class names to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor, nn

__all__ = [
    "ROUTER_FAMILIES",
    "RouterSpec",
    "WeightFn",
    "gpt_oss_weights",
    "sigmoid_weights",
    "softmax_renorm_weights",
    "softmax_weights",
]

WeightFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""``fn(router, logits (N, E), ids (N, K) int64) -> weights (N, K)``."""


def softmax_weights(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """Softmax over all experts in float32, gathered at ``ids``, renormalised if ``router.norm_topk_prob``.

    Qwen2-MoE, Qwen3-MoE, Qwen3-Next, OLMoE, FlexOlmo (transformers 5.x
    ``*TopKRouter.forward``: ``softmax(logits, dtype=float)`` -> top-k -> ``/= sum`` when
    ``norm_topk_prob``).
    """
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32).gather(1, ids)
    if getattr(router, "norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights


def softmax_renorm_weights(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """Softmax over all experts in float32, gathered at ``ids``, always renormalised.

    Mixtral, MiniMax, Qwen3-VL-MoE, Qwen3.5-MoE (their routers renormalise the top-k
    probabilities unconditionally).
    """
    weights = torch.softmax(logits.float(), dim=-1).gather(1, ids)
    return weights / weights.sum(dim=-1, keepdim=True)


def sigmoid_weights(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """Sigmoid scores gathered at ``ids``, ``/ (sum + 1e-20)`` if ``norm_topk_prob``, times ``routed_scaling_factor``.

    DeepSeek-V3 and the routers sharing its code (GLM-4.5 ``Glm4MoeTopkRouter``,
    GLM-4.7-Flash ``Glm4MoeLiteTopkRouter``, dots.llm1). The ``e_score_correction_bias``
    and the expert-group limit only steer the selection, which the record replaces;
    the weights use the bias-free sigmoid scores.
    """
    weights = logits.float().sigmoid().gather(1, ids)
    if getattr(router, "norm_topk_prob", False):
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * float(getattr(router, "routed_scaling_factor", 1.0))


def gpt_oss_weights(router: nn.Module, logits: Tensor, ids: Tensor) -> Tensor:
    """Softmax over the logits gathered at ``ids`` (router bias included), in the logits' dtype.

    gpt-oss (``GptOssTopKRouter``: top-k over the logits, then softmax over the k values).
    """
    return torch.softmax(logits.gather(1, ids), dim=1, dtype=logits.dtype)


@dataclass(frozen=True)
class RouterSpec:
    """How to replay one router: its weight function and where its outputs are.

    The router's forward must return a tuple (or list) holding the router logits, the
    routing weights and the selected expert ids (the transformers 5.x convention is
    ``(router_logits, routing_weights, expert_ids)``). Replay substitutes the weights
    and the ids in a copy of that tuple.

    Parameters
    ----------
    weight_fn : callable
        ``fn(router, logits, ids) -> weights``, see :mod:`r3store.replay` and the
        functions in this module.
    family : str
        A name for messages (``"qwen3_moe"``, ``"custom"``, ...).
    logits_index, weights_index, ids_index : int
        Positions of the logits, weights and ids in the router's output tuple.
    num_experts, top_k : int, optional
        Override the router's ``num_experts`` / ``top_k`` attributes (needed when the
        router module has none).
    """

    weight_fn: WeightFn
    """``fn(router, logits (N, E), ids (N, K) int64) -> weights (N, K)``."""
    family: str = "custom"
    """Name used in messages."""
    logits_index: int = 0
    """Position of the router logits in the router's output tuple."""
    weights_index: int = 1
    """Position of the routing weights."""
    ids_index: int = 2
    """Position of the selected expert ids."""
    num_experts: int | None = None
    """Routed experts (default: the router's ``num_experts`` attribute)."""
    top_k: int | None = None
    """Experts per token (default: the router's ``top_k`` attribute)."""


def _family(fn: WeightFn, name: str) -> RouterSpec:
    return RouterSpec(weight_fn=fn, family=name)


ROUTER_FAMILIES: Mapping[str, RouterSpec] = MappingProxyType({
    "Qwen3MoeTopKRouter": _family(softmax_weights, "qwen3_moe"),
    "Qwen2MoeTopKRouter": _family(softmax_weights, "qwen2_moe"),
    "OlmoeTopKRouter": _family(softmax_weights, "olmoe"),
    "FlexOlmoTopKRouter": _family(softmax_weights, "flex_olmo"),
    "Qwen3NextTopKRouter": _family(softmax_weights, "qwen3_next"),
    "MixtralTopKRouter": _family(softmax_renorm_weights, "mixtral"),
    "MiniMaxTopKRouter": _family(softmax_renorm_weights, "minimax"),
    "Qwen3VLMoeTextTopKRouter": _family(softmax_renorm_weights, "qwen3_vl_moe"),
    "Qwen3_5MoeTopKRouter": _family(softmax_renorm_weights, "qwen3_5_moe"),
    "DeepseekV3TopkRouter": _family(sigmoid_weights, "deepseek_v3"),
    "Glm4MoeTopkRouter": _family(sigmoid_weights, "glm4_moe"),
    "Glm4MoeLiteTopkRouter": _family(sigmoid_weights, "glm4_moe_lite"),
    "Dots1TopkRouter": _family(sigmoid_weights, "dots1"),
    "GptOssTopKRouter": _family(gpt_oss_weights, "gpt_oss"),
})
"""Router class name (transformers 5.x) -> :class:`RouterSpec`.

Matched by class name, so ``r3store.replay`` never imports transformers. The first
replayed call of every router checks that the family's weight function reproduces the
router's own weights at the router's own ids, so a class whose code changed raises
:class:`r3store.errors.ReplayError` instead of replaying with wrong weights.
"""
