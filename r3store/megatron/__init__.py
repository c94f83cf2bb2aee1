"""Megatron-core routing replay fed from r3store batches (torch only; megatron-core imported on first call).

``import r3store`` does not import this package::

    from r3store.megatron import clear_replay_routes, moe_layers, set_replay_routes

    layers = moe_layers(model)                        # this stage's MoE decoder layers (0-based)
    batch = store.assemble(ids, layout="thd", cp_size=cp, cp_rank=cp_rank, layers=layers, dtype="auto")
    set_replay_routes(model, batch)                   # before the micro-batch's forward
    ...                                               # forward / backward (recompute replays too)
    clear_replay_routes(model)                        # after the step's last backward

Each ``TopKRouter`` (built with ``moe_enable_routing_replay=True``) gets its layer's
routes through Megatron-core's own ``RouterReplay``.
"""

from r3store.megatron._replay import RouteLayout, clear_replay_routes, moe_layers, set_replay_routes

__all__ = ["RouteLayout", "clear_replay_routes", "moe_layers", "set_replay_routes"]

for _obj in (clear_replay_routes, moe_layers, set_replay_routes):
    _obj.__module__ = "r3store.megatron"
del _obj
