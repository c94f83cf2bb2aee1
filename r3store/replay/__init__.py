"""Routing replay in the training forward of PyTorch MoE models (R3's last step).

Needs only torch; ``import r3store`` does not import this package::

    from r3store.replay import RoutingReplay

    rr = RoutingReplay(model)                       # finds every MoE router
    rr.check_spec(store)                            # store.spec.moe_layers == rr.moe_layers, ...
    with rr.replay(batch):                          # store.assemble(...) / RouteDataset batch
        loss = loss_fn(model(tokens, position_ids=pos, use_cache=False))
        loss.backward()
    rr.clear()                                      # after the step: forget routes kept for recompute

    with torch.no_grad(), rr.capture_generate() as cap:   # a rollout by model.generate() (KV cache on)
        out = model.generate(prompt_ids, attention_mask=prompt_mask, do_sample=True)
    cap.routes                                      # per returned sequence: prompt rows, then one per decode step

Selection comes from the record, weights from the router's live scores at the recorded
ids (:mod:`r3store.replay._families` lists the formula of each family). Routers of
Hugging Face transformers 5.x are found by class name (:data:`ROUTER_FAMILIES`); any
other router whose forward returns ``(logits, weights, ids)`` is named with
``RoutingReplay(model, routers={RouterClass: RouterSpec(weight_fn)})``.
"""

try:
    import torch as _torch  # noqa: F401 - fail here, with the install hint, when the extra is missing
except ImportError as exc:
    raise ImportError("r3store.replay needs PyTorch: pip install 'r3store[torch]' ('r3store[hf]' for the "
                      "transformers MoE models it replays in)") from exc

from r3store.replay._capture import Capture
from r3store.replay._discover import FoundRouter, find_routers
from r3store.replay._families import (
    ROUTER_FAMILIES,
    RouterSpec,
    WeightFn,
    gpt_oss_weights,
    sigmoid_weights,
    softmax_renorm_weights,
    softmax_weights,
)
from r3store.replay._generate import GenerationCapture
from r3store.replay._replay import RoutingReplay

__all__ = [
    "Capture",
    "FoundRouter",
    "GenerationCapture",
    "ROUTER_FAMILIES",
    "RouterSpec",
    "RoutingReplay",
    "WeightFn",
    "find_routers",
    "gpt_oss_weights",
    "sigmoid_weights",
    "softmax_renorm_weights",
    "softmax_weights",
]

for _obj in (Capture, FoundRouter, GenerationCapture, RouterSpec, RoutingReplay, find_routers, gpt_oss_weights,
             sigmoid_weights, softmax_renorm_weights, softmax_weights):
    _obj.__module__ = "r3store.replay"
del _obj
