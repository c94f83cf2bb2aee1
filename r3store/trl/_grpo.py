"""`R3GRPOTrainer`: TRL's GRPOTrainer with Rollout Routing Replay for generation by transformers.

TRL (``trl/trainer/grpo_trainer.py``, 1.16) generates with ``unwrapped_model.generate``
inside ``GRPOTrainer._generate_single_turn`` when ``use_vllm=False``, then computes the
old, reference and policy log-probs with full forwards over prompt + completion in
``_get_per_token_logps_and_entropies`` (the first two from
``_generate_and_score_completions`` under ``no_grad``, the policy one from
``_compute_loss``). This subclass wraps exactly those four methods:

* ``_generate_single_turn``: the generate call runs inside
  :meth:`r3store.replay.RoutingReplay.capture_generate`; each completion's routes
  (prompt rows + one per decode step, up to its EOS) are written to the store at
  ``routes_url`` (one commit per generation batch, token ids hashed) and read back;
* ``_get_per_token_logps_and_entropies``: every chunk's forward runs inside
  ``rr.replay(routes, attention_mask=...)``;
* ``_generate_and_score_completions``: the routes travel with the batch (key
  ``r3_routes``, a list, which TRL shuffles and splits with the tensors);
* ``_compute_loss``: the policy forward replays the batch's routes; ``training_step``
  calls ``rr.clear()`` after its backward.
"""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import trl
from packaging.version import Version
from trl.trainer.grpo_trainer import GRPOTrainer

from r3store.reader import RouteReader
from r3store.replay import RoutingReplay
from r3store.writer import RouteWriter

__all__ = ["SUPPORTED_TRL", "R3GRPOTrainer"]

SUPPORTED_TRL = (Version("1.16"), Version("1.17"))
"""TRL versions ``[low, high)`` whose GRPOTrainer internals this subclass wraps (and is tested with)."""

if not SUPPORTED_TRL[0] <= Version(trl.__version__) < SUPPORTED_TRL[1]:
    raise ImportError(f"r3store.trl supports trl>={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]} (it wraps GRPOTrainer "
                      f"internals); trl {trl.__version__} is installed: pip install 'r3store[trl]'")


def _decision_flips(got: Sequence[np.ndarray], want: Sequence[np.ndarray | None]) -> tuple[int, int]:
    """(differing decisions, decisions): (token, MoE layer) pairs whose expert *sets* differ (None: skipped)."""
    differ = total = 0
    for a, b in zip(got, want, strict=True):
        if b is None:
            continue
        d = (np.sort(a, axis=-1) != np.sort(b, axis=-1)).any(axis=-1)
        differ += int(d.sum())
        total += int(d.size)
    return differ, total


class R3GRPOTrainer(GRPOTrainer):
    """``trl.GRPOTrainer`` whose log-prob forwards replay the routes the rollout used.

    Drop-in: the same arguments as ``GRPOTrainer`` plus ``routes_url``. Generation by
    transformers (``use_vllm=False``, the default) of a text MoE model whose routers
    :class:`r3store.replay.RoutingReplay` finds.

    Parameters
    ----------
    *args, **kwargs
        Passed to ``trl.GRPOTrainer``.
    routes_url : str, optional
        Where the rollout routes are written (any r3store URL: a folder, ``s3://...``).
        Default: ``<args.output_dir>/r3-routes``. Sample ids are
        ``<run>-g<generation>-r<process>-<row>``; each sample's token ids (prompt +
        completion) are hashed in the store, ``metadata`` holds the global step.

    Attributes
    ----------
    routing_replay : RoutingReplay
        On the policy model; ``ref_routing_replay`` on the reference model (or None).
    flips_sample_every : int
        Measure ``r3/flips_without_replay`` on every n-th training batch (one extra
        no-grad forward of the current policy without replay); default 4, the first
        batch included.

    Logged metrics: ``r3/flips`` (share of (token, MoE layer) decisions whose expert set
    differs from the rollout's, in the replayed forwards: 0 when replay works) and
    ``r3/flips_without_replay`` (the same for the trainer's own routing: the policy has
    moved since the rollout when ``steps_per_generation`` or ``num_iterations`` > 1, and
    rollout and training kernels differ).

    Raises
    ------
    ValueError
        ``use_vllm=True`` (the vLLM server's routes reach replay through
        ``RouteWriter.append_vllm``; see the README), continuous batching, tools or
        environments (multi-turn), ``rollout_func``, or ``use_liger_kernel``.
    r3store.errors.ReplayError
        No MoE router in the model, or routes that do not fit (see ``RoutingReplay``).
    """

    flips_sample_every = 4

    @property
    def _parent(self) -> Any:
        """``super()``, untyped (TRL's methods carry no annotations)."""
        return super()

    def __init__(self, *args: Any, routes_url: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        refused = {"use_vllm=True": self.use_vllm,
                   "use_transformers_continuous_batching=True": self.use_transformers_continuous_batching,
                   "tools / environment_factory (multi-turn)": bool(self.tools),
                   "rollout_func": self.rollout_func is not None,
                   "use_liger_kernel=True": bool(getattr(self, "use_liger_kernel", False))}
        bad = [name for name, on in refused.items() if on]
        if bad:
            raise ValueError(f"R3GRPOTrainer replays routes captured from transformers' generate(); not with {bad}")
        self.routing_replay = RoutingReplay(self.accelerator.unwrap_model(self.model))
        self.ref_routing_replay = None if self.ref_model is None else RoutingReplay(
            self.accelerator.unwrap_model(self.ref_model))
        self.routes_url = routes_url or os.path.join(str(self.args.output_dir), "r3-routes")
        self._r3_writer = RouteWriter(self.routes_url, self.routing_replay.spec)
        self._r3_reader: Any = None
        self._r3_run = uuid.uuid4().hex[:8]
        self._r3_generation = 0
        self._r3_losses = 0
        self._r3_routes: list[np.ndarray] | None = None
        self._r3_counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    # -- generation: capture, store, read back --------------------------------------------

    def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                              num_generations: int, has_tool_images: bool = False) -> Any:
        rr = self.routing_replay
        with rr.capture_generate(eos_token_id=self.eos_token_ids) as cap:
            completion_ids, logprobs = self._parent._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                                     num_generations, has_tool_images)
        want = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]
        if cap.lengths != want:
            raise ValueError(f"captured routes cover {cap.lengths[:8]} tokens per sequence, prompt + completion "
                             f"have {want[:8]}")
        rank, step = self.accelerator.process_index, int(self.state.global_step)
        ids = [f"{self._r3_run}-g{self._r3_generation:06d}-r{rank}-{i:05d}" for i in range(len(want))]
        for sid, routes, prompt, completion in zip(ids, cap.routes, prompt_ids, completion_ids, strict=True):
            self._r3_writer.append(sid, routes, tokens=list(prompt) + list(completion), metadata={"step": step})
        self._r3_writer.flush()
        if self._r3_reader is None:
            self._r3_reader = RouteReader.open(self.routes_url)
        else:
            self._r3_reader.refresh()
        self._r3_routes = self._r3_reader.get_many(ids)
        self._r3_generation += 1
        return completion_ids, logprobs

    # -- log-prob forwards: replay ----------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            output: dict[str, Any] = self._parent._generate_and_score_completions(inputs)
            output["r3_routes"] = self._r3_routes
        finally:
            self._r3_routes = None
        return output

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        self._r3_routes = inputs.get("r3_routes")
        if self._r3_routes is not None and self._r3_losses % max(1, int(self.flips_sample_every)) == 0:
            self._flips_without_replay(model, inputs, self._r3_routes)
        self._r3_losses += 1
        try:
            return self._parent._compute_loss(model, inputs)
        finally:
            self._r3_routes = None

    def _flips_without_replay(self, model: Any, inputs: dict[str, Any], routes: list[np.ndarray]) -> None:
        """One no-grad forward of the policy with its own routing over the batch, compared with the rollout's."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        rr = self._replay_for(model)
        with torch.no_grad(), rr.capture(attention_mask=mask) as live:
            model(input_ids=ids, attention_mask=mask, use_cache=False)
        differ, decisions = _decision_flips(live.routes, self._fit(routes, mask))
        mode = self._mode()
        self._metrics[mode]["r3/flips_without_replay"].append(differ / max(decisions, 1))

    def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> Any:
        try:
            return self._parent.training_step(model, inputs, num_items_in_batch)
        finally:
            self.routing_replay.clear()  # forget the forwards kept for activation recompute

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                           logits_to_keep: int, batch_size: int | None = None,
                                           **kwargs: Any) -> Any:
        routes = self._r3_routes
        if routes is None:
            return self._parent._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, **kwargs)
        if any(v is not None for k, v in kwargs.items() if k not in ("compute_entropy", "compute_aux_loss")):
            raise ValueError("R3GRPOTrainer replays text-only batches; multimodal inputs are not supported")
        rr = self._replay_for(model)
        if len(routes) != input_ids.shape[0]:
            raise ValueError(f"{len(routes)} route arrays for a batch of {input_ids.shape[0]} sequences")
        step = batch_size or input_ids.shape[0]
        parts = []
        differ = decisions = 0
        for start in range(0, input_ids.shape[0], step):
            end = min(start + step, input_ids.shape[0])
            mask = attention_mask[start:end]
            chunk = self._fit(routes[start:end], mask)
            with rr.replay(chunk, attention_mask=mask), rr.capture(attention_mask=mask) as used:
                parts.append(self._parent._get_per_token_logps_and_entropies(
                    model, input_ids[start:end], mask, logits_to_keep, None, **kwargs))
            d, n = _decision_flips(used.routes, chunk)
            differ += d
            decisions += n
        mode = self._mode()
        self._metrics[mode]["r3/flips"].append(differ / max(decisions, 1))
        logps = torch.cat([p[0] for p in parts], dim=0)
        entropies = torch.cat([p[1] for p in parts], dim=0) if parts[0][1] is not None else None
        aux = torch.stack([p[2] for p in parts]).mean() if parts[0][2] is not None else None
        return logps, entropies, aux

    def _mode(self) -> str:
        return "train" if getattr(self.model, "training", False) else "eval"

    def _fit(self, routes: Sequence[np.ndarray], mask: torch.Tensor) -> list[np.ndarray | None]:
        """The routes of each row; None (live routing) for a row whose completion ``mask_truncated_completions``
        took out of the attention mask (it carries no loss)."""
        tokens = mask.sum(dim=1).tolist()
        out: list[np.ndarray | None] = []
        for i, (r, n) in enumerate(zip(routes, tokens, strict=True)):
            if len(r) + 1 != n and not (self.mask_truncated_completions and n < len(r) + 1):
                raise ValueError(f"row {i}: routes for {len(r) + 1} tokens, the attention mask has {n}")
            out.append(r if len(r) + 1 == n else None)
        return out

    def _replay_for(self, model: Any) -> RoutingReplay:
        unwrapped = self.accelerator.unwrap_model(model)
        if unwrapped is self.accelerator.unwrap_model(self.model):
            return self.routing_replay
        if self.ref_routing_replay is not None and unwrapped is self.accelerator.unwrap_model(self.ref_model):
            return self.ref_routing_replay
        raise ValueError(f"log-probs asked of a model ({type(unwrapped).__name__}) that is neither the policy nor "
                         "the reference model; its routers have no RoutingReplay")
