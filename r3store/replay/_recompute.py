"""Match an activation recompute to the forward whose routes it must replay.

Gradient checkpointing (reentrant or not) runs a layer's forward again during
backward. The recomputed router must get exactly the ids of the original forward, also
when backward visits micro-batches in another order than forward did (a summed loss
over two micro-batches recomputes the later one first), so a FIFO with forward and
backward cursors (Megatron's ``RouterReplay``) pairs the wrong micro-batch there.

Checkpointing restores the RNG and autocast state, so a recompute's router input is
bitwise equal to the original's. Every forward router call under replay therefore
keeps a *fingerprint* of its input, a float32 vector of one fixed random projection per
token, and the token plan it replayed; a recompute computes the same fingerprint and
looks it up. Equal inputs give equal fingerprints; different micro-batches differ in at
least one token's projection unless their router inputs are identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from r3store.errors import ReplayError
from r3store.replay._layout import TokenPlan

__all__ = ["Kept", "fingerprint", "in_recompute"]

_PROBES: dict[tuple[int, torch.device], Tensor] = {}


def in_recompute() -> bool:
    """True inside the autograd engine (a checkpointed layer's forward re-run during backward)."""
    return torch._C._current_graph_task_id() != -1


def fingerprint(hidden: Tensor) -> Tensor:
    """float32 ``(N,)``: each token's router input projected on one fixed random unit vector.

    Parameters
    ----------
    hidden : Tensor, shape (..., hidden)
        The router input (flattened to ``(N, hidden)``).
    """
    width = hidden.shape[-1]
    key = (width, hidden.device)
    probe = _PROBES.get(key)
    if probe is None:
        gen = torch.Generator().manual_seed(0x52335354 + width)
        probe = torch.randn(width, generator=gen, dtype=torch.float32)
        probe = (probe / probe.norm()).to(hidden.device)
        _PROBES[key] = probe
    with torch.no_grad():
        return hidden.detach().reshape(-1, width).float() @ probe


@dataclass(eq=False)
class Entry:
    """One forward router call kept for recompute."""

    fp: Tensor
    """Fingerprint of the router input."""
    plan: TokenPlan | None
    """The plan it replayed, or ``None`` for a live forward."""


class Kept:
    """Forward router calls kept for recompute, per MoE layer, until :meth:`clear`."""

    def __init__(self, num_layers: int) -> None:
        self._entries: list[list[Entry]] = [[] for _ in range(num_layers)]
        self.armed = False
        """True once a replayed forward was kept: from then on live forwards are kept too, so that
        a recompute that matches nothing (its forward was cleared) raises instead of routing live."""

    def __len__(self) -> int:
        return sum(len(e) for e in self._entries)

    def add(self, j: int, fp: Tensor, plan: TokenPlan | None) -> None:
        """Keep a forward call of MoE layer ``j``."""
        self._entries[j].append(Entry(fp, plan))
        self.armed = self.armed or plan is not None

    def clear(self) -> None:
        """Forget every kept call (:attr:`armed` stays set)."""
        for entries in self._entries:
            entries.clear()

    def match(self, j: int, fp: Tensor, layer: int) -> TokenPlan | None:
        """The plan of the kept forward call of layer ``j`` whose input matches ``fp``.

        Raises
        ------
        r3store.errors.ReplayError
            No kept call matches, or several match with different plans.
        """
        same = [e for e in self._entries[j] if e.fp.shape == fp.shape]
        hits: list[Entry] = []
        if same:
            stacked = torch.stack([e.fp for e in same])
            found = (stacked == fp).all(dim=1).nonzero().reshape(-1).tolist()
            hits = [same[i] for i in found]
        if not hits:
            raise ReplayError(
                f"activation recompute of {fp.shape[0]} tokens matches none of the {len(self._entries[j])} forward "
                "calls kept for this router (the recomputed router input differs bitwise from every kept forward, "
                "or rr.clear() ran between forward and backward)", layer=layer)
        if any(not _same_plan(hits[0].plan, e.plan) for e in hits[1:]):
            raise ReplayError(
                f"activation recompute matches {len(hits)} kept forward calls with bitwise-identical router inputs "
                "but different routes; replay identical micro-batches with identical routes, or call rr.clear() "
                "between them", layer=layer)
        return hits[0].plan


def _same_plan(a: TokenPlan | None, b: TokenPlan | None) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return False
    return (a.ids.shape == b.ids.shape and a.ids.device == b.ids.device and torch.equal(a.has_route, b.has_route)
            and torch.equal(torch.where(a.has_route[..., None], a.ids.long(), -1),
                        torch.where(b.has_route[..., None], b.ids.long(), -1)))
