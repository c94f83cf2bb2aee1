"""`RoutingReplay`: forward hooks on a model's MoE routers for capture and replay."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Self

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from r3store._spec import ModelSpec
from r3store.errors import ReplayError
from r3store.replay._capture import Capture
from r3store.replay._discover import FoundRouter, find_routers
from r3store.replay._generate import GenerationCapture
from r3store.replay._layout import TokenPlan, plan_from_batch, plan_from_routes
from r3store.replay._recompute import Kept, fingerprint, in_recompute

__all__ = ["RoutingReplay"]

_CHECK_TOL = {torch.float32: 1e-5, torch.float64: 1e-10, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


class RoutingReplay:
    """Capture and replay the expert selection of every MoE router of a model.

    Attaches one forward hook per router (``register_forward_hook``); the hooks do
    nothing outside :meth:`capture` / :meth:`replay` blocks and :meth:`remove` detaches
    them. No class or module attribute is edited.

    Inside ``replay(...)`` each router's own top-k is replaced by the recorded expert
    ids, and the routing weights are the router's *live* scores gathered at those ids
    with the family's normalisation (see :mod:`r3store.replay`), so gradients reach the
    router weights. Positions without a route keep the router's own choice and weights:
    padding, each sequence's last token, ``replay_mask`` False rows, rows of all ``-1``.

    Parameters
    ----------
    model : torch.nn.Module
        Any module; routers are found by class (:data:`r3store.replay.ROUTER_FAMILIES`)
        or named in ``routers``.
    routers : mapping, optional
        Module name (``"model.layers.3.mlp.gate"``) or module class -> a
        :class:`r3store.replay.RouterSpec`, a weight function
        ``fn(router, logits, ids) -> weights``, or ``None`` to leave a router alone.
        Extends and overrides the built-in table.
    check_weights : bool
        On each router's first replayed call, check that its weight function
        reproduces the router's own weights at the router's own ids (one extra gather;
        a mismatch raises instead of replaying with wrong weights).

    Attributes
    ----------
    moe_layers : tuple of int
        Decoder-layer index of each router found, increasing: the layer axis of routes.
    num_experts, top_k : int
        From the routers found.
    spec : r3store.ModelSpec
        ``ModelSpec(num_layers=<decoder layers>, num_experts, top_k, moe_layers)``: the
        spec a store of this model's routes has.
    router_names : tuple of str
        Qualified module name of each router, in ``moe_layers`` order.

    Raises
    ------
    r3store.errors.ReplayError
        No router is found, or the routers found are inconsistent (see
        :func:`r3store.replay.find_routers`).

    Notes
    -----
    Activation recompute: every forward router call under replay that runs inside
    activation checkpointing (non-reentrant: saved-tensor hooks are active; reentrant:
    grad mode is off in a forward entered with it on) keeps a fingerprint of its input
    and its routes until :meth:`clear` (calls outside checkpointing are never
    recomputed, so they keep nothing and cost no fingerprint), and a recomputed router call (one made
    inside the autograd engine) replays the routes of the forward with the bitwise
    equal input; one that matches no kept call raises. Once a replay ran, live forward
    calls are kept too (their recomputes stay live). A forward that autograd can never
    recompute, because the model was entered with grad mode off (``torch.no_grad()``,
    ``torch.inference_mode()``), is never kept, in train mode too: old / reference
    log-probs computed under ``no_grad`` before the replayed policy forward on the
    same tokens do not take part in recompute matching. (Grad mode is read where the
    model given to ``RoutingReplay`` is entered, so reentrant checkpointing, which
    runs its layers under ``no_grad``, still keeps them.) Call :meth:`clear` once
    per training step, after the last backward.

    Under ``torch.compile`` the hooks run eagerly (``torch.compiler.disable``): their
    state never guards a compiled graph, so blocks, kept calls and captures cause no
    recompiles; each router is a graph break.
    Not thread-safe: one forward at a time per model.

    Examples
    --------
    >>> import torch
    >>> from r3store.testing.moe import random_batch, tiny_moe
    >>> model = tiny_moe("mixtral")                       # 4 decoder layers, 8 experts, top-2
    >>> rr = RoutingReplay(model)
    >>> rr.spec
    ModelSpec(num_layers=4, num_experts=8, top_k=2, moe_layers=(0, 1, 2, 3))
    >>> ids, mask = random_batch(2, 8, seed=0)
    >>> mask[1, 6:] = 0                                    # sequence 1 has 6 tokens
    >>> with torch.no_grad(), rr.capture(attention_mask=mask) as cap:
    ...     _ = model(ids, attention_mask=mask, use_cache=False)
    >>> [r.shape for r in cap.routes]                     # (n_i - 1, MoE layers, top_k)
    [(7, 4, 2), (5, 4, 2)]
    >>> routes = [r[:, :, ::-1].copy() for r in cap.routes]  # any valid ids: here the same, top-k reversed
    >>> with rr.replay(routes, attention_mask=mask), rr.capture(attention_mask=mask) as replayed:
    ...     model(ids, attention_mask=mask, use_cache=False).logits.sum().backward()
    >>> all((a == b).all() for a, b in zip(replayed.routes, routes))
    True
    >>> rr.remove()
    """

    def __init__(self, model: nn.Module, routers: Mapping[Any, Any] | None = None, *,
                 check_weights: bool = True) -> None:
        found, num_layers = find_routers(model, routers)
        self._found: list[FoundRouter] = found
        self.moe_layers: tuple[int, ...] = tuple(r.layer for r in found)
        self.num_experts: int = found[0].num_experts
        self.top_k: int = found[0].top_k
        self.spec = ModelSpec(num_layers=num_layers, num_experts=self.num_experts, top_k=self.top_k,
                              moe_layers=self.moe_layers)
        self.router_names: tuple[str, ...] = tuple(r.name for r in found)
        self._model = model
        self._model_name = type(model).__name__
        self._check_weights = check_weights
        self._checked: set[int] = set()
        self._plan: TokenPlan | None = None
        self._capture: Capture | None = None
        self._kept = Kept(len(found))
        self._generation: GenerationCapture | None = None
        self._grad_at_entry: list[bool] = []
        self._key = next(_KEYS)
        _LIVE[self._key] = self
        hook = self._hook
        self._handles: list[RemovableHandle] = [
            r.module.register_forward_hook(partial(hook, j), with_kwargs=True) for j, r in enumerate(found)
        ]
        self._handles += [model.register_forward_pre_hook(_eager(self._enter), with_kwargs=True),
                          model.register_forward_hook(_eager(self._leave), always_call=True)]

    def __repr__(self) -> str:
        families = sorted({r.spec.family for r in self._found})
        state = "removed" if not self._handles else f"{len(self._kept)} forward calls kept"
        return (f"RoutingReplay({self._model_name}: {len(self._found)} routers ({', '.join(families)}) in decoder "
                f"layers {list(self.moe_layers)} of {self.spec.num_layers}, {self.num_experts} experts, "
                f"top-{self.top_k}; {state})")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- public blocks ----------------------------------------------------------------

    @contextmanager
    def capture(self, *, attention_mask: Any = None, cu_seqlens: Any = None) -> Iterator[Capture]:
        """Record the expert ids the routers use in one forward.

        Parameters
        ----------
        attention_mask : array of int or bool, shape (batch, seq), optional
            Padded batch (left or right): a sequence's tokens are its nonzero entries.
        cu_seqlens : array of int, shape (num_sequences + 1,), optional
            Packed sequences in a ``(1, total)`` batch (on a ``(batch, seq)`` input with
            ``batch > 1``, each sequence must fill one row). Without either, every
            position is a token: a ``(batch, seq)`` input (read from the model call's
            ``input_ids`` or ``inputs_embeds``, else from a router's ``(batch, seq,
            hidden)`` input) gives ``batch`` sequences of ``seq`` tokens each.

        Yields
        ------
        Capture
            ``cap.routes`` (one int32 ``(n_i - 1, len(moe_layers), top_k)`` array per
            sequence) and ``cap.flat`` are filled when the block exits. Inside a
            :meth:`replay` block the replayed ids are captured.

        Raises
        ------
        r3store.errors.ReplayError
            A router ran twice or not at all in the block, capture blocks are nested, the
            layout does not fit the routers' token count or the model input's
            ``(batch, seq)`` (an ``attention_mask`` of another shape; packed sequences
            that do not each fill one row of a multi-row input), neither is given and the
            input's ``(batch, seq)`` cannot be read (a model called without
            ``input_ids`` / ``inputs_embeds`` and flat router inputs: pass
            ``attention_mask`` or ``cu_seqlens``), or the hooks were removed.
        """
        self._check_attached()
        if self._capture is not None or self._generation is not None:
            raise ReplayError("capture blocks do not nest")
        cap = Capture(self.moe_layers, attention_mask=attention_mask, cu_seqlens=cu_seqlens)
        self._capture = cap
        try:
            yield cap
        finally:
            self._capture = None
        cap.finish()

    @contextmanager
    def capture_generate(self, *, eos_token_id: int | Sequence[int] | None = None) -> Iterator[GenerationCapture]:
        """Record the routes of every sequence ``model.generate()`` returns (KV cache on).

        Open the block around one ``generate()`` call of the model given to this
        ``RoutingReplay`` (greedy search or sampling, any ``num_return_sequences``, a
        left-padded prompt batch, dynamic or static cache, chunked prefill)::

            with torch.no_grad(), rr.capture_generate() as cap:
                out = model.generate(prompt_ids, attention_mask=prompt_mask, do_sample=True)
            cap.routes[i]   # (prompt_len_i + new_len_i - 1, MoE layers, top_k): prefill rows, then one per step

        ``rr.replay(cap.routes, attention_mask=full_mask)`` then replays them in a
        training forward over ``out`` (``full_mask``: the prompt mask, then 1 up to and
        including each sequence's first EOS).

        Parameters
        ----------
        eos_token_id : int or sequence of int, optional
            Token ids that end a sequence: rows after a sequence's first one are dropped.
            Default: the model's ``generation_config.eos_token_id`` (else
            ``config.eos_token_id``); pass ``()`` for none. Pass the id ``generate`` was
            given when it differs.

        Yields
        ------
        GenerationCapture
            ``cap.routes`` (one int32 array per returned sequence), ``cap.lengths``,
            ``cap.prompt_lengths``, ``cap.steps``, filled when the block exits;
            ``cap.check(out)`` checks the record against the returned sequences.

        Raises
        ------
        r3store.errors.ReplayError
            Inside a ``capture`` or another ``capture_generate`` block; in the block:
            beam search, assisted/speculative decoding or another decoding method than
            transformers' ``_sample`` loop, a model call without ``input_ids``, more
            than one new position per decode step, a router that did not run in a call.
        """
        self._check_attached()
        if self._capture is not None or self._generation is not None:
            raise ReplayError("capture blocks do not nest")
        if eos_token_id is None:
            eos_token_id = _model_eos(self._model)
        gen = self._generation = GenerationCapture(self.moe_layers, eos_token_id)
        try:
            yield gen
        finally:
            self._generation = None
        gen.finish()

    @contextmanager
    def replay(self, routes: Sequence[Any] | Mapping[str, Any], *, attention_mask: Any = None,
               cu_seqlens: Any = None) -> Iterator[None]:
        """Replay recorded routes in every forward inside the block (and in their recomputes).

        Parameters
        ----------
        routes : list or batch dict
            Either one array (numpy or torch, integer) per sequence, shape
            ``(n_i - 1, len(moe_layers), top_k)`` as ``store.get`` returns them (``None``
            for a sequence without routes), laid out by ``attention_mask`` /
            ``cu_seqlens`` (neither: sequences back to back, e.g. an unpadded
            ``(batch, seq)`` input, where each sequence must then fill one row); or a
            batch of ``store.assemble`` / ``RouteDataset`` (keys ``routes``,
            ``replay_mask``, ``layers``, ``layout``, ...), THD for a ``(1, T)`` input or
            BSHD for ``(B, T)``, on any device. SBHD batches (``layout="sbhd"``,
            routes ``(T, B, L, K)``, sequence first) are refused: the routers of a
            ``(B, T)`` input flatten it batch first (Hugging Face models), so assemble
            with ``{"layout": "bshd"}``; a 4-d batch without ``layout`` is BSHD.
        attention_mask : array, shape (batch, seq), optional
            Padded input (left or right), as passed to the model: the model input must
            have this shape.
        cu_seqlens : array, shape (num_sequences + 1,), optional
            Packed input: boundaries in the ``(1, total)`` token tensor.

        Each model call in the block (of the model given to ``RoutingReplay``) is
        checked against the layout before it runs, by the ``(batch, seq)`` of its
        ``input_ids`` or ``inputs_embeds``: a BSHD batch or ``attention_mask`` needs
        exactly that shape (a transposed one is named as SBHD), and sequences laid back
        to back (THD ``cu_seqlens``, a list without mask) on an input of several rows
        must each fill one row, so no route lands on another token silently.

        Raises
        ------
        r3store.errors.ReplayError
            Layer count, top-k or row count do not fit the model or the layout, ids out
            of range or repeated in a row, ``batch["layers"]`` differs from
            :attr:`moe_layers`, an SBHD batch, replay blocks are nested, or the hooks were
            removed. When the model is called: its input's ``(batch, seq)`` does not fit
            the layout (see above). In the forward: the router sees a different number
            of tokens than the routes are laid out for; a weight function does not reproduce its router's weights.
            When the block exits, a router that did not run in it. In backward: a
            recompute matches no kept forward call.
        """
        self._check_attached()
        if self._plan is not None:
            raise ReplayError("replay blocks do not nest")
        plan = self._plan = self._make_plan(routes, attention_mask, cu_seqlens)
        try:
            yield
        finally:
            self._plan = None
        idle = [layer for j, layer in enumerate(self.moe_layers) if j not in plan.applied]
        if idle:
            raise ReplayError(
                f"the routers of decoder layers {idle} did not run inside the replay block, so nothing was replayed "
                "there (run the forward inside the block; kernels that replace the whole MoE forward, such as "
                "hub MegaBlocks kernels for gpt-oss, bypass the router)")

    def check_spec(self, spec: ModelSpec | Any) -> None:
        """Check that a store (or its ``ModelSpec``) holds routes for this model's routers.

        Parameters
        ----------
        spec : r3store.ModelSpec or an object with ``.spec`` (a store)

        Raises
        ------
        r3store.errors.ReplayError
            ``moe_layers``, ``num_experts``, ``top_k`` or ``num_layers`` differ.
        """
        other = getattr(spec, "spec", spec)
        if not isinstance(other, ModelSpec):
            raise ReplayError(f"check_spec takes a ModelSpec or a store, got {type(spec).__name__}")
        diffs = [f"{name}: {getattr(other, name)!r} in the store, {getattr(self.spec, name)!r} in the model"
                 for name in ("moe_layers", "num_experts", "top_k", "num_layers")
                 if getattr(other, name) != getattr(self.spec, name)]
        if diffs:
            raise ReplayError("the store's routes do not fit this model's routers: " + "; ".join(diffs))

    def clear(self) -> None:
        """Forget the forward calls kept for activation recompute (call after each training step)."""
        self._kept.clear()

    def remove(self) -> None:
        """Detach every hook; the model behaves exactly as before. Idempotent."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._kept.clear()
        self._plan = None
        self._capture = None
        self._generation = None
        self._grad_at_entry.clear()

    # -- hooks ------------------------------------------------------------------------

    def _check_attached(self) -> None:
        if not self._handles:
            raise ReplayError("this RoutingReplay was removed; create a new one")

    def _make_plan(self, routes: Any, attention_mask: Any, cu_seqlens: Any) -> TokenPlan:
        if isinstance(routes, Mapping):
            if attention_mask is not None or cu_seqlens is not None:
                raise ReplayError("a batch dict carries its own layout; do not pass attention_mask or cu_seqlens")
            return plan_from_batch(routes, moe_layers=self.moe_layers, num_experts=self.num_experts,
                                   top_k=self.top_k)
        return plan_from_routes(routes, attention_mask=attention_mask, cu_seqlens=cu_seqlens,
                                moe_layers=self.moe_layers, num_experts=self.num_experts, top_k=self.top_k)

    def _enter(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._grad_at_entry and (self._plan is not None or self._capture is not None):
            shape = _input_shape(args, kwargs)
            if shape is not None:
                if self._plan is not None:
                    self._plan.check_input(shape)
                if self._capture is not None:
                    self._capture.note_input(shape)
        self._grad_at_entry.append(torch.is_grad_enabled())
        if self._generation is not None and len(self._grad_at_entry) == 1:
            self._generation.begin(args, kwargs)

    def _leave(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._grad_at_entry:
            self._grad_at_entry.pop()

    def _recomputable(self) -> bool:
        """Can autograd ever recompute the running forward? Only when grad mode was on where the model was
        entered (a reentrant checkpoint runs its layers under no_grad inside a grad-enabled forward)."""
        return self._grad_at_entry[0] if self._grad_at_entry else torch.is_grad_enabled()

    def _hook(self, j: int, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> Any:
        if _compiling():
            return self._traced(j, args, kwargs, output)
        if self._plan is None and self._capture is None and self._generation is None and not self._kept.armed:
            return None
        hidden = args[0] if args else next(iter(kwargs.values()))
        recompute = in_recompute()
        plan = self._plan_for(j, hidden, recompute)
        new = None if plan is None else self._apply(j, output, plan)
        if not recompute:
            if self._capture is not None and isinstance(hidden, Tensor) and hidden.ndim == 3:
                self._capture.note_input((int(hidden.shape[0]), int(hidden.shape[1])), exact=False)
            self._record(j, (new if new is not None else output)[self._found[j].spec.ids_index])
        return new

    def _plan_for(self, j: int, hidden: Tensor, recompute: bool) -> TokenPlan | None:
        """The plan a router call replays (None: live); keeps a forward call for its recompute."""
        if recompute:
            return self._kept.match(j, fingerprint(hidden), self.moe_layers[j]) if self._kept.armed else None
        plan = self._plan
        if (plan is not None or self._kept.armed) and self._recomputable() and _checkpointed():
            self._kept.add(j, fingerprint(hidden), plan)  # a no_grad / inference-mode forward is never recomputed
        return plan

    def _record(self, j: int, ids: Tensor) -> None:
        if self._capture is not None:
            self._capture.record(j, ids)
        elif self._generation is not None:
            self._generation.record(j, ids)

    def _recorded(self, j: int, plan: TokenPlan, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if n != plan.num_positions:
            raise ReplayError(f"the router sees {n} token positions; the routes are laid out for "
                              f"{plan.num_positions} ({plan.source})", layer=self.moe_layers[j])
        plan.applied.add(j)
        return plan.layer(j, device)

    def _route(self, j: int, hidden: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The compiled path's opaque step (``r3store::route``): int64 ids ``(N, K)`` to use, bool ``(N,)`` replayed."""
        recompute = in_recompute()
        plan = self._plan_for(j, hidden, recompute)
        own = ids.long()
        if plan is None:
            new, has = own.clone(), torch.zeros(own.shape[0], dtype=torch.bool, device=own.device)
        else:
            recorded, has = self._recorded(j, plan, own.shape[0], own.device)
            new = torch.where(has[:, None], recorded, own)
        if not recompute:
            self._record(j, new)
        return new, has

    def _traced(self, j: int, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        """The hook as torch.compile traces it: no Python state is read (nothing to guard on); the blocks'
        state is consulted at run time inside the ``r3store::route`` op, the weights are traced."""
        router = self._found[j]
        spec = router.spec
        hidden = args[0] if args else next(iter(kwargs.values()))
        logits, weights, ids = output[spec.logits_index], output[spec.weights_index], output[spec.ids_index]
        flat_logits = logits.reshape(-1, logits.shape[-1])
        n = flat_logits.shape[0]
        new_ids, has = torch.ops.r3store.route(hidden.detach(), ids.detach().reshape(n, -1), self._key, j)
        new_weights = spec.weight_fn(router.module, flat_logits, new_ids).to(weights.dtype)
        new_weights = torch.where(has[:, None], new_weights, weights.reshape(n, -1))
        out = list(output)
        out[spec.weights_index] = new_weights.reshape(weights.shape)
        out[spec.ids_index] = new_ids.to(ids.dtype).reshape(ids.shape)
        return out if isinstance(output, list) else tuple(out)

    def _apply(self, j: int, output: Any, plan: TokenPlan) -> Any:
        router = self._found[j]
        spec = router.spec
        logits, weights, ids = output[spec.logits_index], output[spec.weights_index], output[spec.ids_index]
        flat_logits = logits.reshape(-1, logits.shape[-1])
        n = flat_logits.shape[0]
        recorded, has = self._recorded(j, plan, n, flat_logits.device)
        own_ids = ids.reshape(n, -1)
        own_weights = weights.reshape(n, -1)
        if self._check_weights and j not in self._checked:
            self._verify(j, flat_logits, own_ids, own_weights)
        new_ids = torch.where(has[:, None], recorded, own_ids)
        new_weights = router.spec.weight_fn(router.module, flat_logits, new_ids).to(weights.dtype)
        new_weights = torch.where(has[:, None], new_weights, own_weights)
        out = list(output)
        out[spec.weights_index] = new_weights.reshape(weights.shape)
        out[spec.ids_index] = new_ids.to(ids.dtype).reshape(ids.shape)
        if isinstance(output, list):
            return out
        return output._make(out) if hasattr(output, "_make") else type(output)(out)

    def _verify(self, j: int, logits: Tensor, ids: Tensor, weights: Tensor) -> None:
        router = self._found[j]
        with torch.no_grad():
            mine = router.spec.weight_fn(router.module, logits, ids).to(weights.dtype)
            tol = _CHECK_TOL.get(weights.dtype, 1e-3)
            if mine.shape != weights.shape or not torch.allclose(mine.float(), weights.float(), rtol=tol, atol=tol):
                gap = (mine.float() - weights.float()).abs().max().item() if mine.shape == weights.shape else "n/a"
                raise ReplayError(
                    f"the {router.spec.family} weight function does not reproduce the weights of router "
                    f"{router.name} ({type(router.module).__name__}) at its own ids (max abs difference {gap}); "
                    "its code differs from what r3store.replay knows: pass routers={RouterClass: RouterSpec(...)}",
                    layer=router.layer)
        self._checked.add(j)


_KEYS = itertools.count()
_LIVE: weakref.WeakValueDictionary[int, RoutingReplay] = weakref.WeakValueDictionary()
"""The RoutingReplay objects the compiled path's op reaches by key."""


_saved_tensor_hooks = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def _checkpointed() -> bool:
    """Can this router call be recomputed in backward? Only inside activation checkpointing: non-reentrant
    checkpointing installs saved-tensor hooks, reentrant checkpointing runs its layers with grad mode off (in a
    forward entered with it on). Without the private probe, every call counts."""
    if not torch.is_grad_enabled() or _saved_tensor_hooks is None:
        return True
    return _saved_tensor_hooks(False) is not None


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


@torch.library.custom_op("r3store::route", mutates_args=())
def _route_op(hidden: Tensor, ids: Tensor, key: int, j: int) -> tuple[Tensor, Tensor]:
    """Opaque to torch.compile: the expert ids router ``j`` of RoutingReplay ``key`` uses, and where replayed."""
    rr = _LIVE.get(key)
    if rr is None:
        raise ReplayError("a compiled model calls the hooks of a RoutingReplay that no longer exists")
    return rr._route(j, hidden, ids)


@_route_op.register_fake
def _route_fake(hidden: Tensor, ids: Tensor, key: int, j: int) -> tuple[Tensor, Tensor]:
    return torch.empty_like(ids, dtype=torch.long), ids.new_empty((ids.shape[0],), dtype=torch.bool)


def _eager(fn: Any) -> Any:
    """``fn`` run eagerly under ``torch.compile``: a hook's Python state (blocks, kept calls) is never traced,
    so it never guards a compiled graph (no recompiles from it) and never graph-breaks inside the hook."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return fn if disable is None else disable(fn)


def _input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """``(batch, seq)`` of a model call: its integer ``input_ids`` (first positional argument or keyword)
    or ``inputs_embeds``; None when neither is a tensor of that form."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if isinstance(ids, Tensor) and ids.ndim == 2 and not ids.is_floating_point():
        return int(ids.shape[0]), int(ids.shape[1])
    embeds = kwargs.get("inputs_embeds")
    if ids is None and isinstance(embeds, Tensor) and embeds.ndim == 3:
        return int(embeds.shape[0]), int(embeds.shape[1])
    return None


def _model_eos(model: nn.Module) -> Any:
    for owner in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(owner, "eos_token_id", None)
        if eos is not None:
            return eos
    return None
