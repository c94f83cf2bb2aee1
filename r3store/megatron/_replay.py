"""Feed Megatron-core's own ``RouterReplay`` from r3store batches.

Megatron-core (0.16, ``megatron/core/transformer/moe/router_replay.py``) gives every
``TopKRouter`` built with ``moe_enable_routing_replay=True`` a ``RouterReplay``: an index
tensor ``[tokens, top_k]`` (int64) set per micro-batch, used by the router's top-k under
``REPLAY_FORWARD``, and appended to a FIFO that ``REPLAY_BACKWARD`` pops when activation
recompute runs the router again during backward. Selection comes from the record; the
weights are the router's live scores gathered at the recorded ids (Megatron's
``get_replay_topk``), so gradients still reach the router.

This module does the glue every user writes by hand: which routers a pipeline stage (and
each virtual-pipeline chunk) holds, by Megatron's own ``TransformerLayer.layer_number``
(1-based, pipeline offsets and dense layers included); one index tensor per router, cast
to int64 on the router's device; THD/BSHD/SBHD routes flattened to the router's token
order; and the switch between the forward entry and the backward FIFO.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from r3store.codecs import kernels
from r3store.errors import ReplayError

__all__ = ["RouteLayout", "clear_replay_routes", "moe_layers", "set_replay_routes"]

RouteLayout = Literal["thd", "bshd", "sbhd"]
"""How ``batch["routes"]`` is laid out: THD ``(T, L, K)``, BSHD ``(B, T, L, K)``, SBHD ``(T, B, L, K)``."""

_TORCH_INDEX_DTYPES = (np.uint8, np.int8, np.int16, np.int32, np.int64)
_HOOKS: weakref.WeakKeyDictionary[nn.Module, RemovableHandle] = weakref.WeakKeyDictionary()
_FOUND: weakref.WeakKeyDictionary[nn.Module, list[tuple[str, Any, int | None]]] = weakref.WeakKeyDictionary()
"""Per model chunk: (name, router, enclosing layer_number) of its routers (a chunk's modules hold no
reference back to it, so the entry goes with the chunk)."""


@dataclass(frozen=True)
class _Router:
    name: str
    module: Any
    """The ``TopKRouter`` (typed loosely: megatron-core ships no type information)."""
    layer: int
    """0-based global decoder layer: Megatron's ``TransformerLayer.layer_number - 1``."""


def _megatron() -> tuple[Any, Any, Any]:
    try:
        from megatron.core.transformer.moe.router import TopKRouter
        from megatron.core.transformer.moe.router_replay import RouterReplayAction
        from megatron.core.transformer.transformer_layer import BaseTransformerLayer
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("r3store.megatron needs megatron-core: pip install 'r3store[megatron]'") from exc
    return TopKRouter, BaseTransformerLayer, RouterReplayAction


def _chunks(model_chunks: nn.Module | Iterable[nn.Module]) -> list[nn.Module]:
    if isinstance(model_chunks, nn.Module):
        return [model_chunks]
    chunks = list(model_chunks)
    bad = [type(c).__name__ for c in chunks if not isinstance(c, nn.Module)]
    if bad:
        raise TypeError(f"model_chunks must be a torch.nn.Module or a sequence of them, got {', '.join(bad)}")
    return chunks


def _routers(model_chunks: nn.Module | Iterable[nn.Module]) -> list[_Router]:
    """Every ``TopKRouter`` of the chunks, in chunk order then construction order.

    A chunk is searched once (the result is kept while the chunk object lives); each call
    re-checks only that its routers can still replay.
    """
    found: list[_Router] = []
    for c, chunk in enumerate(_chunks(model_chunks)):
        routers = _FOUND.get(chunk)
        if routers is None:
            routers = _FOUND[chunk] = _search(chunk)
        found.extend(_check_router(f"chunk {c}: {name}", module, number) for name, module, number in routers)
    return found


def _search(chunk: nn.Module) -> list[tuple[str, Any, int | None]]:
    """Depth-first in registration order (as ``named_modules``), carrying the enclosing layer's number."""
    top_k_router, layer_class, _ = _megatron()
    found = []
    stack: list[tuple[str, Any, int | None]] = [("", chunk, None)]
    seen: set[int] = set()
    while stack:
        name, module, number = stack.pop()
        if id(module) in seen:  # a module registered twice is visited once, as named_modules does
            continue
        seen.add(id(module))
        if isinstance(module, layer_class) and isinstance(getattr(module, "layer_number", None), int):
            number = module.layer_number
        if isinstance(module, top_k_router):
            found.append((name, module, number))
            continue
        stack.extend((f"{name}.{n}" if name else n, child, number)
                     for n, child in reversed(list(module.named_children())))
    return found


def _check_router(where: str, module: Any, number: int | None) -> _Router:
    if number is None:
        raise ReplayError(f"the TopKRouter {where} is not inside a Megatron TransformerLayer, so it has no "
                          f"layer_number to find its routes by")
    layer = number - 1
    if module.router_replay is None:
        raise ReplayError(f"the TopKRouter {where} has no RouterReplay: build the model with "
                          f"moe_enable_routing_replay=True", layer)
    if getattr(module.config, "moe_router_fusion", False):
        raise ReplayError(f"the TopKRouter {where} uses the fused top-k (moe_router_fusion=True), which "
                          f"ignores RouterReplay: build the model with moe_router_fusion=False", layer)
    if getattr(module, "routing_type", None) == "sinkhorn":
        raise ReplayError(f"the TopKRouter {where} routes by sinkhorn, which ignores RouterReplay", layer)
    return _Router(where, module, layer)


def moe_layers(model_chunks: nn.Module | Iterable[nn.Module]) -> list[int]:
    """The global decoder layers (0-based) of the chunks' MoE routers, in router order.

    Pass them to ``store.assemble(..., layers=...)`` / ``RouteDataset(layers=...)`` so a
    pipeline stage reads only its own layers' routes.

    Parameters
    ----------
    model_chunks : torch.nn.Module or sequence of torch.nn.Module
        A Megatron model chunk (``GPTModel``, possibly wrapped in DDP / ``Float16Module``),
        or the list of virtual-pipeline chunks of one pipeline rank.

    Returns
    -------
    list of int
        ``TransformerLayer.layer_number - 1`` of each ``TopKRouter``; Megatron numbers
        layers globally from 1 (``get_transformer_layer_offset`` added), so dense layers
        (``moe_layer_freq``) and other stages' layers are simply absent.

    Raises
    ------
    r3store.errors.ReplayError
        A router is built without ``moe_enable_routing_replay=True``, with
        ``moe_router_fusion=True`` or sinkhorn routing (both bypass ``RouterReplay``), or
        lies outside any ``TransformerLayer``.
    ImportError
        megatron-core is not installed.
    """
    return [r.layer for r in _routers(model_chunks)]


def _as_tensor(routes: Any) -> Tensor:
    if isinstance(routes, Tensor):
        if routes.dtype.is_floating_point or routes.dtype.is_complex or routes.dtype == torch.bool:
            raise ReplayError(f"routes must hold integer expert ids, got a tensor of {routes.dtype}")
        return routes
    arr = np.asarray(routes)
    if arr.dtype.kind not in "iu":
        raise ReplayError(f"routes must hold integer expert ids, got an array of {arr.dtype}")
    if arr.dtype.type not in _TORCH_INDEX_DTYPES:
        arr = arr.astype(np.int64)
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


def _batch_routes(batch: Mapping[str, Any] | Any) -> tuple[Tensor, Any]:
    """``(routes, num_tokens)``: the batch's routes as a tensor (packed ones unpacked), B if known."""
    if not isinstance(batch, Mapping):
        return _as_tensor(batch), None
    if "routes" not in batch:
        raise ReplayError(f"the batch has no 'routes' (keys: {', '.join(map(str, batch))})")
    routes = batch["routes"]
    if "routes_bits" in batch:  # assemble(..., packed=True): unpack where the packed bytes are
        from r3store.dataset import unpack_routes

        routes = unpack_routes(_as_tensor(routes), int(batch["routes_bits"]), batch["routes_shape"],
                               dtype=torch.int32)
    return _as_tensor(routes), batch.get("num_tokens")


def _flatten(routes: Tensor, layout: RouteLayout | None, num_tokens: Any) -> Tensor:
    """``(N, L, K)`` in the order a Megatron router flattens its ``[s, b, h]`` input (sequence-major)."""
    if layout not in (None, "thd", "bshd", "sbhd"):
        raise ReplayError(f"layout must be 'thd', 'bshd', 'sbhd' or None, got {layout!r}")
    if routes.ndim == 3:
        if layout not in (None, "thd"):
            raise ReplayError(f"layout={layout!r} needs 4-d routes (B, T, L, K) / (T, B, L, K), got shape "
                              f"{tuple(routes.shape)}")
        return routes
    if routes.ndim != 4:
        raise ReplayError(f"routes must be THD (T, L, K), BSHD (B, T, L, K) or SBHD (T, B, L, K), got shape "
                          f"{tuple(routes.shape)}")
    if layout is None:
        batch_size = len(num_tokens) if num_tokens is not None else None
        first, second = routes.shape[0], routes.shape[1]
        if first == second == 1:
            layout = "sbhd"
        elif batch_size is not None and first == batch_size != second:
            layout = "bshd"
        elif batch_size is not None and second == batch_size != first:
            layout = "sbhd"
        else:
            raise ReplayError(f"cannot tell BSHD from SBHD routes of shape {tuple(routes.shape)} "
                              f"({'no num_tokens in the batch' if batch_size is None else f'{batch_size} samples'}): "
                              f"pass layout='bshd' or layout='sbhd'")
    if layout == "thd":
        raise ReplayError(f"layout='thd' needs 3-d routes (T, L, K), got shape {tuple(routes.shape)}")
    if layout == "bshd":  # Megatron's embedding turns [b, s] into [s, b, h]: token (s, b) is row s * B + b
        routes = routes.transpose(0, 1)
    return routes.reshape(-1, routes.shape[2], routes.shape[3])


def _check_ids(ids: Tensor, routers: list[_Router], experts: list[int]) -> None:
    """Every id in ``[0, num_experts)`` and distinct within its row; ``ids`` is ``(N, R, K)``.

    Host tensors with one expert count go through the compiled route check of
    :func:`r3store.codecs.kernels.check_ids` (the writer's), others through torch ops where
    they are.
    """
    if ids.device.type == "cpu" and len(set(experts)) == 1:
        fault = kernels.check_ids(ids.numpy(), experts[0])
        if fault is not None:
            _fault(ids, routers, experts, fault.kind, fault.row, fault.layer, fault.slot)
        return
    _check_ids_torch(ids, routers, experts)


def _check_ids_torch(ids: Tensor, routers: list[_Router], experts: list[int]) -> None:
    """:func:`_check_ids` in torch ops on ``ids``' device (one host sync per check)."""
    bound = torch.tensor(experts, device=ids.device).view(1, -1, 1)
    bad = (ids < 0) | (ids >= bound)
    if bool(bad.any()):
        row, r, slot = (int(v) for v in bad.nonzero()[0])
        _fault(ids, routers, experts, "range", row, r, slot)
    k = ids.shape[-1]
    for a in range(1, k):
        same = (ids[..., a:] == ids[..., :-a]).any(dim=-1)
        if bool(same.any()):
            row, r = (int(v) for v in same.nonzero()[0])
            _fault(ids, routers, experts, "repeat", row, r, 0)


def _fault(ids: Tensor, routers: list[_Router], experts: list[int], kind: str, row: int, r: int, slot: int) -> None:
    router = routers[r]
    if kind == "repeat":
        raise ReplayError(f"token row {row} repeats an expert id: {ids[row, r].tolist()} ({router.name})", router.layer)
    raise ReplayError(f"token row {row} holds expert id {int(ids[row, r, slot])}, outside [0, {experts[r]}) "
                      f"({router.name}; pad rows need pad_policy='spread', not a fill value)", router.layer)


def _router_device(router: nn.Module) -> torch.device:
    weight = getattr(router, "weight", None)
    if isinstance(weight, Tensor):
        return weight.device
    return next(iter(router.parameters()), torch.empty(0)).device


def _pre_hook(layer: int, name: str, actions: Any, module: nn.Module, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> None:
    """Before each router call: pick Megatron's forward entry or backward FIFO, check the token count."""
    replay: Any = getattr(module, "router_replay", None)
    if replay is None or replay.router_replay_action not in (actions.REPLAY_FORWARD, actions.REPLAY_BACKWARD):
        return
    hidden = args[0] if args else kwargs.get("input")
    if torch._C._current_graph_task_id() != -1:  # inside the autograd engine: an activation recompute
        if not replay.replay_backward_list:
            raise ReplayError(f"{name} is recomputed in backward but its replay FIFO is empty: every forward "
                              f"needs set_replay_routes before it, and clear_replay_routes only after the "
                              f"last backward", layer)
        target = replay.replay_backward_list[0]
        replay.set_router_replay_action(actions.REPLAY_BACKWARD)
    else:
        target = replay.target_topk_idx
        if target is None:
            raise ReplayError(f"{name} runs with routing replay on but no routes set", layer)
        replay.set_router_replay_action(actions.REPLAY_FORWARD)
    if isinstance(hidden, Tensor) and hidden.ndim >= 1:
        tokens = hidden.numel() // max(hidden.shape[-1], 1)
        if tokens != target.shape[0]:
            raise ReplayError(f"{name} sees {tokens} tokens, the batch's routes have {target.shape[0]} rows: "
                              f"lay the routes out like this rank's tokens (same layout, CP/TP/SP split)", layer)


def set_replay_routes(model_chunks: nn.Module | Iterable[nn.Module], batch: Mapping[str, Any] | Any, *,
                      layers: Sequence[int] | None = None, layout: RouteLayout | None = None,
                      check: bool = True) -> list[Tensor]:
    """Hand one micro-batch's routes to Megatron's ``RouterReplay`` of every router in the chunks.

    Call it right before the forward of the micro-batch on these chunks (inside Megatron's
    ``forward_step_func``, with the chunk it is given). Each router gets the column of its
    own decoder layer, as int64 on the router's device; its ``RouterReplay`` is switched to
    ``REPLAY_FORWARD``. When activation recompute (``recompute_granularity="full"`` or
    ``"selective"`` with ``"moe"``) runs a router again during backward, that call pops
    Megatron's backward FIFO (``REPLAY_BACKWARD``) instead, so it replays the routes of
    the micro-batch being recomputed: right whenever micro-batches are backpropagated in
    the order they were forwarded, as Megatron's pipeline schedules do. (A summed loss over
    micro-batches backpropagated in another order needs :class:`r3store.replay.RoutingReplay`
    instead.) Call :func:`clear_replay_routes` after the step's last backward. Called
    under ``torch.no_grad()`` (a forward-only pass: log-probs), it keeps no FIFO entry,
    since no backward will recompute that forward.

    Parameters
    ----------
    model_chunks : torch.nn.Module or sequence of torch.nn.Module
        Megatron model chunks (``GPTModel``, possibly wrapped): one pipeline stage, or
        the virtual-pipeline chunks of one pipeline rank. Routers are found by class
        (``TopKRouter``) and placed by their ``TransformerLayer.layer_number``; chunks
        without MoE layers (a stage of dense layers) get nothing.
    batch : mapping or array
        A batch of :func:`r3store.batch.assemble` / ``store.assemble`` /
        :class:`r3store.RouteDataset`: ``routes`` (numpy or torch, any integer dtype:
        uint8/int16/int32 of ``dtype="auto"`` included, or bit-packed with
        ``packed=True``), THD ``(T, L, K)``, BSHD ``(B, T, L, K)`` or SBHD
        ``(T, B, L, K)``, laid out for this rank's tokens (CP/TP/SP); ``layers`` names
        the global decoder layer (0-based) of each entry of the L axis. Or the routes
        array itself, with ``layers=``.
    layers : sequence of int, optional
        Overrides ``batch["layers"]``. The batch may hold more layers than the chunks
        (e.g. every MoE layer); it must hold each router's layer.
    layout : {"thd", "bshd", "sbhd"}, optional
        Default: the batch's ``layout`` (``store.assemble`` sets it); without one, THD
        for 3-d routes and for 4-d routes BSHD or SBHD as the batch's ``num_tokens``
        (one per sample) tells. Megatron's router sees its ``[s, b, h]``
        input flattened sequence-major, so BSHD routes are transposed first.
    check : bool
        Check every id in ``[0, num_experts)`` and the ``top_k`` ids of a row distinct
        before handing them over (a CUDA gather with an id out of range kills the
        process; a repeated id silently drops an expert). Host routes go through the
        writer's compiled route check (:func:`r3store.codecs.kernels.check_ids`), device
        routes through torch ops there. ``check=False`` skips it for batches r3store
        assembled with ``pad_policy="spread"`` (ids checked when written).

    Returns
    -------
    list of torch.Tensor
        The int64 ``(N, top_k)`` tensor given to each router, in router order
        (:func:`moe_layers`); ``N = T`` (THD) or ``B * T``.

    Raises
    ------
    r3store.errors.ReplayError
        The batch does not hold a router's layer, or holds a layer twice; ``top_k``
        differs from a router's; an id is out of range or repeated in a row (with
        ``check``); the routes are not integers or not 3-d/4-d, or BSHD cannot be told
        from SBHD, or ``layout`` differs from the batch's ``layout``; a router cannot
        replay (see :func:`moe_layers`). At the router's call: the router sees another
        number of tokens than the routes have rows (the batch is laid out for other
        tokens), or a recompute finds the backward FIFO empty.
        Each names the decoder layer.
    TypeError
        ``model_chunks`` is not a module or a sequence of modules.
    ImportError
        megatron-core is not installed.
    """
    _, _, actions = _megatron()
    routers = _routers(model_chunks)
    routes, num_tokens = _batch_routes(batch)
    if layers is None:
        if not isinstance(batch, Mapping) or batch.get("layers") is None:
            raise ReplayError("the batch names no layers: pass layers= (the global decoder layer of each entry "
                              "of the routes' layer axis)")
        layers = batch["layers"]
    names = [int(v) for v in layers]
    stated = batch.get("layout") if isinstance(batch, Mapping) else None  # store.assemble names its layout
    if stated is not None and layout is not None and stated != layout:
        raise ReplayError(f"layout={layout!r}, but the batch was assembled with layout {stated!r} "
                          f"(routes of shape {tuple(routes.shape)})")
    flat = _flatten(routes, layout if layout is not None else stated, num_tokens)
    if flat.shape[1] != len(names):
        raise ReplayError(f"the routes' layer axis has {flat.shape[1]} entries, layers names {len(names)}: {names}")
    position: dict[int, int] = {}
    for i, layer in enumerate(names):
        if layer in position:
            raise ReplayError("the batch lists this layer twice", layer)
        position[layer] = i
    if not routers:
        return []
    experts = []
    for r in routers:
        if r.layer not in position:
            held = ", ".join(map(str, names)) or "none"
            raise ReplayError(f"the batch holds decoder layers [{held}], not the layer of {r.name}: assemble the "
                              f"stage's layers (layers=r3store.megatron.moe_layers(model_chunks))", r.layer)
        top_k = int(r.module.topk)
        if flat.shape[2] != top_k:
            raise ReplayError(f"the routes have top_k={flat.shape[2]}, {r.name} routes to {top_k} experts", r.layer)
        experts.append(int(r.module.config.num_moe_experts))
    ids = flat[:, [position[r.layer] for r in routers]]  # (N, R, K), stored dtype
    if check:
        _check_ids(ids, routers, experts)
    by_device: dict[torch.device, Tensor] = {}
    given = []
    for i, r in enumerate(routers):
        device = _router_device(r.module)
        if device not in by_device:  # one narrow (R, N, K) copy per device, widened there
            by_device[device] = ids.permute(1, 0, 2).contiguous().to(device).to(torch.int64)
        target = by_device[device][i]
        replay: Any = r.module.router_replay
        replay.set_target_indices(target)  # Megatron's: the forward entry, also appended to the backward FIFO
        if not torch.is_grad_enabled():  # no backward will recompute this forward: keep no FIFO entry
            replay.replay_backward_list.pop()
        replay.set_router_replay_action(actions.REPLAY_FORWARD)
        if r.module not in _HOOKS:
            _HOOKS[r.module] = r.module.register_forward_pre_hook(
                partial(_pre_hook, r.layer, r.name, actions), with_kwargs=True)
        given.append(target)
    return given


def clear_replay_routes(model_chunks: nn.Module | Iterable[nn.Module]) -> None:
    """Forget the routes of every router in the chunks and switch replay off.

    Clears each ``RouterReplay``'s forward entry and backward FIFO
    (``clear_indices``), clears its action (the router routes by its own top-k again)
    and removes the hook :func:`set_replay_routes` added. Call it after the step's last
    backward (and after forward-only passes, whose FIFO entries no recompute pops).
    Other models' routers (Megatron's global ``RouterReplay`` list) are left alone.

    Raises
    ------
    r3store.errors.ReplayError, TypeError, ImportError
        As :func:`moe_layers`.
    """
    for r in _routers(model_chunks):
        replay: Any = r.module.router_replay
        replay.clear_indices()
        replay.clear_router_replay_action()
        handle = _HOOKS.pop(r.module, None)
        if handle is not None:
            handle.remove()
