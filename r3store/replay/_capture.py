"""`Capture`: the expert ids a model's routers chose in one forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from r3store.errors import ReplayError
from r3store.replay._layout import check_input_shape, positions

__all__ = ["Capture"]


class Capture:
    """Routes recorded by :meth:`RoutingReplay.capture`, filled when the block exits.

    Attributes
    ----------
    routes : list of numpy.ndarray of int32
        One array per sequence, shape ``(n_i - 1, len(moe_layers), top_k)`` (``n_i`` =
        the sequence's real tokens; no row for its last token), in the layout r3store
        stores: pass them to ``RouteWriter.append`` as they are. The sequences are those
        of the block's ``attention_mask`` / ``cu_seqlens``, else one per row of the
        forward's ``(batch, seq)`` input.
    flat : numpy.ndarray of int32
        Shape ``(N, len(moe_layers), top_k)``: the ids of every flattened token position
        the routers saw (``batch * seq`` or the packed length), padding included.
    moe_layers : tuple of int
        Decoder layer of each entry of the layer axis.
    """

    def __init__(self, moe_layers: Sequence[int], *, attention_mask: Any = None, cu_seqlens: Any = None) -> None:
        self.moe_layers = tuple(moe_layers)
        self.routes: list[np.ndarray] = []
        self.flat = np.zeros((0, len(self.moe_layers), 0), dtype=np.int32)
        self._layout = {"attention_mask": attention_mask, "cu_seqlens": cu_seqlens}
        self._ids: list[Tensor | None] = [None] * len(self.moe_layers)
        self._input: tuple[int, int] | None = None
        self._exact = False

    def note_input(self, shape: tuple[int, int], *, exact: bool = True) -> None:
        """Note the forward's ``(batch, seq)``: from the model's input (``exact``), else from a router's
        ``(batch, seq, hidden)`` input; the first exact one wins."""
        if self._input is None or (exact and not self._exact):
            self._input, self._exact = (int(shape[0]), int(shape[1])), exact

    def __repr__(self) -> str:
        return f"Capture({len(self.routes)} sequences, {self.flat.shape[0]} positions, MoE layers {self.moe_layers})"

    def record(self, j: int, ids: Tensor) -> None:
        """Keep the ids ``(N, top_k)`` the router of MoE layer ``j`` used."""
        if self._ids[j] is not None:
            raise ReplayError("a capture block records one forward; this router ran a second time inside it "
                              "(open one capture block per forward)", layer=self.moe_layers[j])
        self._ids[j] = ids.detach().reshape(-1, ids.shape[-1])

    def finish(self) -> None:
        """Assemble :attr:`routes` and :attr:`flat` from the recorded calls."""
        missing = [layer for layer, ids in zip(self.moe_layers, self._ids, strict=True) if ids is None]
        if len(missing) == len(self.moe_layers):
            raise ReplayError("the model's routers did not run inside the capture block")
        if missing:
            raise ReplayError(f"the routers of decoder layers {missing} did not run inside the capture block")
        ids = torch.stack([t for t in self._ids if t is not None], dim=1)
        flat = ids.to("cpu", torch.int32).numpy()
        n = flat.shape[0]
        layout = self._layout
        shape = self._input
        if layout["attention_mask"] is None and layout["cu_seqlens"] is None:
            if shape is None:
                if n > 0:
                    raise ReplayError(f"the routers saw {n} token positions and the batch shape of the forward is "
                                      "unknown (the model given to RoutingReplay was not called with input_ids or "
                                      "inputs_embeds): pass attention_mask (or cu_seqlens for a packed row) to "
                                      "capture()")
                shape = (1, 0)
            if shape[0] * shape[1] != n:
                raise ReplayError(f"the routers saw {n} token positions, the model input of shape (batch, seq) = "
                                  f"{shape} holds {shape[0] * shape[1]}: pass attention_mask to capture()")
            # without a mask every position is a token: one sequence per row of the input
            layout = {"cu_seqlens": np.arange(shape[0] + 1, dtype=np.int64) * shape[1]}
            source = f"unpadded model input of shape (batch, seq) = {shape}"
        else:
            source = ""
        pos = positions(**layout)
        if pos.num_positions != n:
            raise ReplayError(f"the routers saw {n} token positions, the {source or pos.source} describes "
                              f"{pos.num_positions}")
        if shape is not None and not source:
            check_input_shape(shape, source=pos.source, want_shape=pos.shape, lengths=pos.lengths,
                              what="captured sequences")
        rows = flat[pos.routed.numpy()]
        cuts = np.cumsum(pos.rows)[:-1]
        self.flat = flat
        self.routes = [np.ascontiguousarray(part) for part in np.split(rows, cuts)]
        self._ids = [None] * len(self.moe_layers)
