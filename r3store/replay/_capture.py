"""`Capture`: the expert ids a model's routers chose in one forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from r3store.errors import ReplayError
from r3store.replay._layout import positions

__all__ = ["Capture"]


class Capture:
    """Routes recorded by :meth:`RoutingReplay.capture`, filled when the block exits.

    Attributes
    ----------
    routes : list of numpy.ndarray of int32
        One array per sequence, shape ``(n_i - 1, len(moe_layers), top_k)`` (``n_i`` =
        the sequence's real tokens; no row for its last token), in the layout r3store
        stores: pass them to ``RouteWriter.append`` as they are.
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
        if layout["attention_mask"] is None and layout["cu_seqlens"] is None:
            layout = {"cu_seqlens": np.array([0, n])}
        pos = positions(**layout)
        if pos.num_positions != n:
            raise ReplayError(f"the routers saw {n} token positions, the {pos.source} describes {pos.num_positions}")
        rows = flat[pos.routed.numpy()]
        cuts = np.cumsum(pos.rows)[:-1]
        self.flat = flat
        self.routes = [np.ascontiguousarray(part) for part in np.split(rows, cuts)]
        self._ids = [None] * len(self.moe_layers)
