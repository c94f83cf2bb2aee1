"""`GenerationCapture`: the expert ids the routers chose during ``model.generate()``.

``generate()`` (transformers' ``_sample`` loop: greedy search and multinomial sampling)
calls the model once for the prompt (*prefill*: every prompt position of every row,
left padding included; several calls with ``prefill_chunk_size``) and then once per new
token (*decode step*: one position per row, the token sampled at the previous step,
read from the KV cache). With ``num_return_sequences > 1`` the batch is repeated before
prefill, so every returned sequence has its own rows.

A returned sequence of ``P_i`` real prompt tokens and ``G_i`` generated ones (its first
EOS included, nothing after it) has ``P_i + G_i`` tokens and so ``P_i + G_i - 1`` route
rows (no row for its last token, the layout of ``store.get``): its prompt rows from the
prefill, then the rows of decode steps ``1 .. G_i - 1`` (the step that *reads* the EOS,
and later ones, route pad tokens: dropped).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import Tensor

from r3store.errors import ReplayError
from r3store.replay._layout import as_tensor

__all__ = ["GenerationCapture"]

_REFUSED = {
    "_beam_search": "beam search (num_beams > 1) reorders the rows between steps",
    "_assisted_decoding": "assisted / speculative decoding verifies several candidate tokens per call and crops the "
                          "KV cache after rejections",
}
_FRAMES = 48
"""How far up the stack a model call looks for transformers' decoding method."""


def _decoding_frames() -> tuple[bool, bool]:
    """``(inside transformers' _prefill, inside transformers' generate)`` for the running model call.

    Raises
    ------
    r3store.errors.ReplayError
        The call comes from a decoding method whose rows cannot be followed (beam search,
        assisted decoding) or from a ``generate`` that is not the ``_sample`` loop.
    """
    frame: FrameType | None = sys._getframe(2)
    prefill = sample = False
    for _ in range(_FRAMES):
        if frame is None:
            break
        code = frame.f_code
        if "transformers" in code.co_filename:
            name = code.co_name
            if name in _REFUSED:
                raise ReplayError(f"capture_generate covers greedy search and sampling; {_REFUSED[name]}, so the "
                                  "routes of a returned sequence cannot be followed (generate with num_beams=1 and "
                                  "no assistant_model / prompt_lookup_num_tokens)")
            prefill = prefill or name == "_prefill"
            sample = sample or name == "_sample"
            if name == "generate":
                if not sample:
                    raise ReplayError("capture_generate covers transformers' greedy search and sampling (the _sample "
                                      "loop); this generate() decodes another way (a custom_generate method from the "
                                      "hub, DoLa, contrastive or group beam search)")
                return prefill, True
        frame = frame.f_back
    return prefill, False


class GenerationCapture:
    """Routes recorded by :meth:`RoutingReplay.capture_generate`, filled when the block exits.

    Attributes
    ----------
    routes : list of numpy.ndarray of int32
        One array per row of the generation batch (= per returned sequence, in the order
        of ``generate``'s output), shape ``(P_i + G_i - 1, len(moe_layers), top_k)``:
        ``P_i`` real prompt tokens (left padding has no row), ``G_i`` generated tokens up
        to and including the first EOS; pass them to ``RouteWriter.append`` or
        ``rr.replay(routes, attention_mask=...)`` over prompt + completion.
    lengths : list of int
        ``P_i + G_i``: the tokens of each sequence the routes cover (``len(routes[i]) + 1``).
    prompt_lengths : list of int
        ``P_i``.
    steps : int
        Decode steps run (model calls after the prefill).
    moe_layers : tuple of int
        Decoder layer of each entry of the layer axis.
    """

    def __init__(self, moe_layers: Sequence[int], eos_token_id: int | Sequence[int] | None) -> None:
        self.moe_layers = tuple(moe_layers)
        self.routes: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.prompt_lengths: list[int] = []
        self.steps = 0
        if eos_token_id is None:
            eos: list[int] = []
        elif isinstance(eos_token_id, int | np.integer):
            eos = [int(eos_token_id)]
        else:
            eos = [int(v) for v in as_tensor(eos_token_id, "eos_token_id").reshape(-1).tolist()]
        self._eos = torch.tensor(eos, dtype=torch.long)
        self._prompt_ids: list[Tensor] = []      # prefill calls' input ids (R, T_c), on CPU
        self._prompt_mask: list[Tensor] = []     # per prefill call: (R, T_c) bool, real prompt tokens
        self._fed: list[Tensor] = []             # decode steps' input ids (R,)
        self._calls: list[list[Tensor | None]] = []
        self._rows = -1

    def __repr__(self) -> str:
        return (f"GenerationCapture({len(self.routes)} sequences, {self.steps} decode steps, "
                f"MoE layers {self.moe_layers})")

    def begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A model call starts (from the model's forward pre-hook): note its tokens."""
        prefill, in_generate = _decoding_frames()
        self._check_last_call()
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if not isinstance(input_ids, Tensor) or input_ids.ndim != 2:
            raise ReplayError("capture_generate needs the model called with input_ids of shape (batch, seq) "
                              "(generation from inputs_embeds is not supported)")
        rows, width = int(input_ids.shape[0]), int(input_ids.shape[1])
        if self._rows not in (-1, rows):
            raise ReplayError(f"a model call inside capture_generate has {rows} rows, the generation so far "
                              f"{self._rows} (one generate() per capture_generate block)")
        self._rows = rows
        is_prefill = prefill if in_generate else not self._fed and (not self._calls or width > 1)
        if is_prefill:
            if self._fed:
                raise ReplayError("a second prefill inside one capture_generate block (one generate() per block)")
            start = sum(int(t.shape[1]) for t in self._prompt_ids)
            self._prompt_ids.append(input_ids.detach().to("cpu", torch.long))
            mask = kwargs.get("attention_mask")
            self._prompt_mask.append(torch.ones((rows, width), dtype=torch.bool) if mask is None
                                     else _prompt_mask(mask, rows, start, width))
        else:
            if not self._calls:
                raise ReplayError("the first model call inside capture_generate is not a prefill (open the block "
                                  "around the whole generate() call)")
            if width != 1:
                raise ReplayError(f"decode step {len(self._fed) + 1} feeds {width} positions per row; capture_generate "
                                  "covers one new token per step (assisted / speculative decoding is not supported)")
            self._fed.append(input_ids.detach().reshape(-1).to("cpu", torch.long))
        self._calls.append([None] * len(self.moe_layers))

    def record(self, j: int, ids: Tensor) -> None:
        """Keep the ids ``(N, top_k)`` the router of MoE layer ``j`` used in the current model call."""
        if not self._calls:
            raise ReplayError("a router ran inside capture_generate outside a call of the model given to "
                              "RoutingReplay (generate() must call that model)", layer=self.moe_layers[j])
        call = self._calls[-1]
        if call[j] is not None:
            raise ReplayError("a router ran twice in one model call inside capture_generate",
                              layer=self.moe_layers[j])
        call[j] = ids.detach().reshape(-1, ids.shape[-1])

    def _check_last_call(self) -> None:
        if self._calls:
            missing = [layer for layer, ids in zip(self.moe_layers, self._calls[-1], strict=True) if ids is None]
            if missing:
                raise ReplayError(f"the routers of decoder layers {missing} did not run in model call "
                                  f"{len(self._calls)} inside capture_generate")

    def finish(self) -> None:
        """Assemble :attr:`routes` from the prefill and decode calls."""
        if not self._calls:
            raise ReplayError("the model was not called inside the capture_generate block")
        self._check_last_call()
        per_call = [torch.stack([t for t in call if t is not None], dim=1).to("cpu", torch.int32)
                    for call in self._calls]
        rows = self._rows
        num_prefill = len(self._prompt_ids)
        prompt_ids = torch.cat(self._prompt_ids, dim=1)
        width = int(prompt_ids.shape[1])
        lk = per_call[0].shape[1:]
        prefill = torch.cat([c.reshape(rows, -1, *lk) for c in per_call[:num_prefill]], dim=1)
        if prefill.shape[1] != width:
            raise ReplayError(f"the routers saw {prefill.shape[1]} prompt positions per row, the prefill fed {width}")
        mask = torch.cat(self._prompt_mask, dim=1)
        steps = len(self._fed)
        for step, c in enumerate(per_call[num_prefill:], start=1):
            if c.shape[0] != rows:
                raise ReplayError(f"the routers saw {c.shape[0]} token positions in decode step {step}; its "
                                  f"input_ids have {rows} rows of one token")
        decode = (torch.stack([c.reshape(rows, *lk) for c in per_call[num_prefill:]], dim=1) if steps
                  else torch.zeros((rows, 0, *lk), dtype=torch.int32))
        fed = torch.stack(self._fed, dim=1) if steps else torch.zeros((rows, 0), dtype=torch.long)
        ended = torch.isin(fed, self._eos)
        # decode rows kept: the steps before the first step that reads an EOS
        kept = torch.where(ended.any(dim=1), ended.int().argmax(dim=1), steps).tolist()
        self.routes = [np.ascontiguousarray(torch.cat([prefill[i][mask[i]], decode[i, :kept[i]]]).numpy())
                       for i in range(rows)]
        self.prompt_lengths = mask.sum(dim=1).tolist()
        self.lengths = [len(r) + 1 for r in self.routes]
        self.steps = steps
        self._prompt_tokens, self._fed_tokens, self._mask = prompt_ids, fed, mask
        self._calls = []

    def check(self, sequences: Any) -> None:
        """Check that the calls recorded are those that produced ``sequences``.

        Parameters
        ----------
        sequences : array of int, shape (rows, prompt_width + new_tokens)
            ``generate()``'s output (``.sequences`` of a ``GenerateOutput``).

        Raises
        ------
        r3store.errors.ReplayError
            Another number of rows, or a row whose prompt or fed tokens differ from the
            sequence (the calls came from another generate(), or a decoding method that
            reorders rows, such as beam search).
        """
        if not self.routes:
            raise ReplayError("check() runs after the capture_generate block exits")
        seq = as_tensor(getattr(sequences, "sequences", sequences), "sequences").to("cpu", torch.long)
        prompt, fed, mask = self._prompt_tokens, self._fed_tokens, self._mask
        width, steps = prompt.shape[1], fed.shape[1]
        if seq.ndim != 2 or seq.shape[0] != prompt.shape[0] or seq.shape[1] < width + steps:
            raise ReplayError(f"sequences of shape {tuple(seq.shape)} do not continue the {prompt.shape[0]} prompts of "
                              f"width {width} fed in {steps} decode steps")
        same_prompt = ((seq[:, :width] == prompt) | ~mask).all(dim=1)
        same_fed = (seq[:, width:width + steps] == fed).all(dim=1)
        bad = (~(same_prompt & same_fed)).nonzero().reshape(-1).tolist()
        if bad:
            raise ReplayError(f"sequences {bad[:8]} differ from the tokens the model was fed during the capture "
                              "(another generate() call, or a decoding method that reorders rows)")


def _prompt_mask(mask: Any, rows: int, start: int, width: int) -> Tensor:
    """bool ``(rows, width)`` on CPU: the real tokens among prompt positions ``[start, start + width)``.

    ``mask`` is the call's 2-D attention mask ``(rows, >= start + width)``, or the 4-D
    ``(rows, 1, width, cache length)`` one a static cache passes (a position is real when
    it attends to itself).
    """
    m = as_tensor(mask, "attention_mask", integer=False).detach().to("cpu")
    if m.ndim == 2 and m.shape[0] == rows and m.shape[1] >= start + width:
        return m[:, start:start + width] != 0
    if m.ndim == 4 and m.shape[0] == rows and m.shape[2] == width and m.shape[3] >= start + width:
        t = torch.arange(width)
        return m[:, 0, t, start + t] != 0 if m.dtype == torch.bool else m[:, 0, t, start + t] == 0
    raise ReplayError(f"the prefill's attention_mask has shape {tuple(m.shape)}, its input_ids {(rows, width)} "
                      f"at prompt position {start}")
