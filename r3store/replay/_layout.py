"""Where each route row goes in the flattened token dimension a router sees.

HF MoE blocks flatten ``(batch, seq, hidden)`` to ``(batch * seq, hidden)`` before the
router, so a router sees ``N`` token positions in row-major order. A *token plan*
holds, for every one of those positions and every MoE layer, the recorded expert ids
and whether the position has a route at all (padding, each sequence's last token,
``replay_mask`` False rows and rows recorded as all ``-1`` keep live routing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from r3store.errors import ReplayError

__all__ = ["Positions", "TokenPlan", "as_tensor", "plan_from_batch", "plan_from_routes", "positions"]


_WIDE_UNSIGNED = tuple(getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))
"""Unsigned dtypes torch's CPU comparisons do not implement: integer inputs of these become int64."""


def as_tensor(value: Any, name: str, *, integer: bool = True) -> Tensor:
    """A numpy array, torch tensor or nested sequence as a tensor (numpy arrays are not copied).

    With ``integer``, unsigned integers wider than 8 bits are converted to int64 (torch does
    not compare them); a value past the int64 range is refused.
    """
    try:
        if isinstance(value, Tensor):
            t = value
        elif isinstance(value, np.ndarray):
            t = torch.from_numpy(np.ascontiguousarray(value))
        else:
            t = torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"{name} must be an array or tensor of numbers, got {type(value).__name__} "
                          f"{getattr(value, 'dtype', '')}".rstrip()) from exc
    if integer and (t.dtype == torch.bool or t.is_floating_point() or t.is_complex()):
        raise ReplayError(f"{name} must hold integers, got dtype {t.dtype}")
    if integer and t.dtype in _WIDE_UNSIGNED:
        values = t.detach().cpu().numpy()
        if values.size and int(values.max()) > np.iinfo(np.int64).max:
            raise ReplayError(f"{name} holds {int(values.max())}, past the int64 range")
        t = t.to(torch.int64)
    return t


@dataclass(frozen=True)
class Positions:
    """Routed token positions of a batch, in the flattened order a router sees."""

    num_positions: int
    """``N``: positions the router sees (``batch * seq``, or the packed length)."""
    routed: Tensor
    """int64 ``(R,)``: flat positions that have a route row, sequence by sequence, in order."""
    rows: list[int]
    """Route rows of each sequence (``n_i - 1``, 0 for an empty sequence)."""
    source: str
    """How the layout was given, for messages."""
    shape: tuple[int, int] | None = None
    """The attention mask's ``(batch, seq)``; None for sequences laid back to back."""
    lengths: list[int] | None = None
    """Token counts of the sequences laid back to back; None for a mask."""


def _from_mask(mask: Any) -> Positions:
    m = as_tensor(mask, "attention_mask").to("cpu")
    if m.ndim != 2:
        raise ReplayError(f"attention_mask must be 2-D (batch, seq), got shape {tuple(m.shape)}")
    m = m != 0
    n = m.sum(dim=1)
    rank = m.cumsum(dim=1) - 1
    routed = m & (rank < (n - 1)[:, None])
    rows = (n - 1).clamp(min=0).tolist()
    return Positions(m.numel(), routed.reshape(-1).nonzero().reshape(-1), rows,
                     f"attention_mask of shape {tuple(m.shape)}", shape=(int(m.shape[0]), int(m.shape[1])))


def _cu_tensor(cu_seqlens: Any, name: str = "cu_seqlens") -> Tensor:
    """Checked packed-sequence boundaries as int64 ``(num_sequences + 1,)``."""
    cu = as_tensor(cu_seqlens, name).to("cpu", torch.int64).reshape(-1)
    if cu.numel() < 2 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise ReplayError(f"{name} must start at 0 and not decrease, got {cu.tolist()[:8]}")
    return cu


def _from_cu(cu_seqlens: Any, source: str) -> Positions:
    cu = _cu_tensor(cu_seqlens)
    total = int(cu[-1])
    pos = torch.arange(total)
    seq = torch.searchsorted(cu[1:], pos, right=True)
    routed = pos < cu[1:][seq] - 1
    rows = (cu[1:] - cu[:-1] - 1).clamp(min=0).tolist()
    return Positions(total, pos[routed], rows, source, lengths=(cu[1:] - cu[:-1]).tolist())


def positions(*, attention_mask: Any = None, cu_seqlens: Any = None,
              rows: Sequence[int] | None = None) -> Positions:
    """Routed positions from an attention mask, packed boundaries, or back-to-back sequences.

    Parameters
    ----------
    attention_mask : array of int or bool, shape (batch, seq), optional
        Left- or right-padded batch; a sequence's real tokens are its nonzero entries.
    cu_seqlens : array of int, shape (num_sequences + 1,), optional
        Boundaries of packed sequences in the flattened token dimension.
    rows : sequence of int, optional
        Without mask and boundaries: route rows per sequence, the sequences laid back
        to back (an unpadded ``(batch, seq)`` batch or one packed row).

    Raises
    ------
    r3store.errors.ReplayError
        Both ``attention_mask`` and ``cu_seqlens`` given, or a malformed one.
    """
    if attention_mask is not None and cu_seqlens is not None:
        raise ReplayError("give attention_mask (padded batch) or cu_seqlens (packed batch), not both")
    if attention_mask is not None:
        return _from_mask(attention_mask)
    if cu_seqlens is not None:
        return _from_cu(cu_seqlens, "cu_seqlens")
    lengths = [r + 1 for r in (rows or [])]
    return _from_cu(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), "sequences laid back to back")


def check_input_shape(shape: tuple[int, int], *, source: str, want_shape: tuple[int, int] | None = None,
                      lengths: Sequence[int] | None = None, what: str = "routes") -> None:
    """Check that a ``(batch, seq)`` model input fits a layout, so that no position shifts silently.

    The routers of a Hugging Face model flatten their ``(batch, seq, hidden)`` input batch
    first: flat position ``b * seq + t`` is token ``t`` of row ``b``.

    Parameters
    ----------
    shape : (int, int)
        The model input's ``(batch, seq)`` (``input_ids`` or ``inputs_embeds.shape[:2]``).
    source : str
        How the layout was given, for messages.
    want_shape : (int, int), optional
        The exact input shape the layout is for (an attention mask's shape, BSHD routes'
        leading ``(B, T)``).
    lengths : sequence of int, optional
        Token counts of sequences laid back to back (packed boundaries, unpadded list):
        on an input with ``batch > 1`` each must fill exactly one row of ``seq`` tokens.
    what : str
        What is laid out (``"routes"``, ``"captured sequences"``), for messages.

    Raises
    ------
    r3store.errors.ReplayError
        The shapes differ (naming both, and SBHD when they are transposed), or a
        sequence does not fill one row of a multi-row input.
    """
    b, w = shape
    if want_shape is not None and tuple(want_shape) != (b, w):
        hint = ""
        if tuple(want_shape) == (w, b):
            hint = (" (transposed: sequence first, as the SBHD layout lays them out; the model's routers see "
                    "(batch, seq) batch first: assemble with {'layout': 'bshd'})")
        raise ReplayError(f"the model input has shape (batch, seq) = {(b, w)}; the {what} are laid out for "
                          f"{tuple(want_shape)} by the {source}{hint}")
    if lengths is not None and b > 1:
        lengths = [int(n) for n in lengths]
        if len(lengths) != b or any(n != w for n in lengths):
            raise ReplayError(f"the model input has shape (batch, seq) = {(b, w)}; the {what} are laid out by the "
                              f"{source} as {len(lengths)} sequences of {lengths[:8]} tokens back to back: on a "
                              f"batch of several rows each sequence must fill one row of {w} tokens; pass "
                              "attention_mask for a padded batch")


@dataclass(eq=False)
class TokenPlan:
    """Recorded ids for every flat position and MoE layer of one batch."""

    ids: Tensor
    """Integer ``(N, L, K)``: recorded ids; anything where ``has_route`` is False."""
    has_route: Tensor
    """bool ``(N, L)``: the position has a recorded route in that MoE layer."""
    source: str
    """How the layout was given, for messages."""
    want_shape: tuple[int, int] | None = None
    """The ``(batch, seq)`` model input the plan is laid out for (mask shape, BSHD ``(B, T)``)."""
    lengths: list[int] | None = None
    """Token counts of sequences laid back to back (packed or unpadded), when known."""
    applied: set[int] = field(default_factory=set)
    """MoE-layer positions whose router replayed this plan."""
    _on: dict[torch.device, tuple[Tensor, Tensor]] = field(default_factory=dict)

    def check_input(self, shape: tuple[int, int]) -> None:
        """Raise :class:`~r3store.errors.ReplayError` unless a ``(batch, seq)`` model input fits this plan."""
        check_input_shape(shape, source=self.source, want_shape=self.want_shape, lengths=self.lengths)

    @property
    def num_positions(self) -> int:
        """``N``, the flat token positions the router must see."""
        return int(self.ids.shape[0])

    def layer(self, j: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """int64 ids ``(N, K)`` and bool ``has_route`` ``(N,)`` of MoE layer ``j`` on ``device``."""
        if device not in self._on:
            ids = self.ids.to(device, torch.long, non_blocking=True).permute(1, 0, 2).contiguous()
            self._on[device] = (ids, self.has_route.to(device, non_blocking=True).t().contiguous())
        ids, has = self._on[device]
        return ids[j], has[j]


def check_ids(ids: Tensor, ignore: Tensor, num_experts: int, where: Any) -> Tensor:
    """Validate recorded ids; return ``has_route`` (rows that are not all ``-1`` and not masked out).

    Parameters
    ----------
    ids : integer Tensor, shape (R, L, K)
    ignore : bool Tensor, shape (R,)
        Rows to ignore (pad rows of a batch): no checks, no route.
    num_experts : int
    where : callable
        ``where(row, layer_pos) -> str`` naming a row for messages.

    Raises
    ------
    r3store.errors.ReplayError
        An id outside ``[0, num_experts)`` (other than a row of all ``-1``), or an id
        repeated within a row.
    """
    missing = (ids == -1).all(dim=-1)
    has = ~missing & ~ignore[:, None]
    bad = ((ids < 0) | (ids >= num_experts)) & has[..., None]
    if bool(bad.any()):
        r, j, k = (int(v) for v in bad.nonzero()[0])
        raise ReplayError(f"{where(r, j)}: expert id {int(ids[r, j, k])} outside [0, {num_experts}) "
                          "(a row of all -1 means 'no route')")
    if ids.shape[-1] > 1:
        s = ids.sort(dim=-1).values
        dup = (s[..., 1:] == s[..., :-1]).any(dim=-1) & has
        if bool(dup.any()):
            r, j = (int(v) for v in dup.nonzero()[0])
            raise ReplayError(f"{where(r, j)}: expert id repeated within the row {ids[r, j].tolist()}")
    return has


def _check_shape(t: Tensor, name: str, num_layers: int, top_k: int, lead: int = 1) -> None:
    if t.ndim != lead + 2 or t.shape[-2] != num_layers or t.shape[-1] != top_k:
        want = "(" + ", ".join(["rows"] * lead) + f", {num_layers}, {top_k})"
        raise ReplayError(f"{name} has shape {tuple(t.shape)}; expected {want} = (..., MoE layers, top_k) "
                          "for this model (routes hold MoE layers only, in decoder-layer order)")


def plan_from_routes(routes: Sequence[Any], *, moe_layers: Sequence[int], num_experts: int, top_k: int,
                     attention_mask: Any = None, cu_seqlens: Any = None) -> TokenPlan:
    """A token plan from one route array per sequence (as ``store.get`` returns them).

    Parameters
    ----------
    routes : sequence of (array of int, shape (n_i - 1, L_moe, top_k)) or None
        ``None`` keeps live routing for that whole sequence.
    moe_layers : sequence of int
        The model's MoE decoder layers (the routes' layer axis).
    num_experts, top_k : int
    attention_mask, cu_seqlens : optional
        See :func:`positions`.

    Raises
    ------
    r3store.errors.ReplayError
        Wrong number of sequences, a sequence's row count is not ``n_i - 1``, wrong
        layer count or top-k, or bad ids (see :func:`check_ids`).
    """
    if isinstance(routes, np.ndarray | Tensor) or not isinstance(routes, Sequence):
        raise ReplayError("routes must be a list with one (n_i - 1, MoE layers, top_k) array per sequence "
                          "(or a batch dict from store.assemble / RouteDataset)")
    arrays = [None if r is None else as_tensor(r, f"routes[{i}]") for i, r in enumerate(routes)]
    for i, r in enumerate(arrays):
        if r is not None:
            _check_shape(r, f"routes[{i}]", len(moe_layers), top_k)
    rows = [0 if r is None else int(r.shape[0]) for r in arrays]
    if cu_seqlens is not None and attention_mask is None:  # before positions() allocates cu_seqlens[-1] of them
        cu = _cu_tensor(cu_seqlens)
        _check_rows(Positions(0, torch.zeros(0, dtype=torch.int64), (cu[1:] - cu[:-1] - 1).clamp(min=0).tolist(),
                              "cu_seqlens"), rows, arrays)
    pos = positions(attention_mask=attention_mask, cu_seqlens=cu_seqlens, rows=rows)
    _check_rows(pos, rows, arrays)
    keep = torch.cat([torch.full((n,), r is not None) for n, r in zip(pos.rows, arrays, strict=True)])
    given = [(i, r.to("cpu")) for i, r in enumerate(arrays) if r is not None and r.shape[0]]
    cat = (torch.cat([r for _, r in given]) if given
           else torch.zeros((0, len(moe_layers), top_k), dtype=torch.int32))
    seq_of = np.repeat([i for i, _ in given], [len(r) for _, r in given]).astype(np.int64)
    row_of = np.concatenate([np.arange(len(r), dtype=np.int64) for _, r in given] or [np.zeros(0, np.int64)])

    def where(r: int, j: int) -> str:
        return f"routes[{seq_of[r]}] row {row_of[r]}, decoder layer {moe_layers[j]}"

    has = check_ids(cat, torch.zeros(cat.shape[0], dtype=torch.bool), num_experts, where)
    ids = torch.full((pos.num_positions, len(moe_layers), top_k), -1, dtype=cat.dtype)
    has_route = torch.zeros((pos.num_positions, len(moe_layers)), dtype=torch.bool)
    dest = pos.routed[keep]
    ids[dest] = cat
    has_route[dest] = has
    return TokenPlan(ids, has_route, pos.source, want_shape=pos.shape, lengths=pos.lengths)


def _check_rows(pos: Positions, rows: list[int], arrays: list[Tensor | None]) -> None:
    if len(pos.rows) != len(arrays):
        raise ReplayError(f"{len(arrays)} route arrays for {len(pos.rows)} sequences in the {pos.source}")
    for i, (want, got, r) in enumerate(zip(pos.rows, rows, arrays, strict=True)):
        if r is not None and want != got:
            raise ReplayError(f"routes[{i}] has {got} rows; the sequence has {want + 1} tokens in the {pos.source}, "
                              f"so it needs num_tokens - 1 = {want} rows (no row for the last token)")


def plan_from_batch(batch: Mapping[str, Any], *, moe_layers: Sequence[int], num_experts: int,
                    top_k: int) -> TokenPlan:
    """A token plan from a batch of ``store.assemble`` or ``RouteDataset`` (THD or BSHD).

    Positions are taken as laid out: THD ``routes`` ``(T, L, K)`` for a ``(1, T)`` token
    tensor, BSHD ``(B, T, L, K)`` for ``(B, T)``. ``replay_mask`` False rows keep live routing.
    ``batch["layout"]`` (``store.assemble`` sets it) names the layout; SBHD
    ``(T, B, L, K)`` is refused, since the routers of a ``(B, T)`` input flatten it batch
    first (a 4-d batch without the key is taken as BSHD, and the model input's shape
    must then be ``routes.shape[:2]``: see :meth:`TokenPlan.check_input`).

    Raises
    ------
    r3store.errors.ReplayError
        A key is missing, ``batch["layout"]`` is ``"sbhd"`` or does not fit the routes'
        rank, ``batch["layers"]`` differs from the model's MoE layers, a shape does not
        fit, or bad ids on a replayed row.
    """
    for key in ("routes", "replay_mask"):
        if key not in batch:
            raise ReplayError(f"batch has no {key!r} key (expected a batch from store.assemble or RouteDataset)")
    layers = batch.get("layers")
    if layers is not None and [int(v) for v in layers] != list(moe_layers):
        raise ReplayError(f"batch holds routes of decoder layers {list(layers)}, the model's routers sit in "
                          f"decoder layers {list(moe_layers)}; assemble with layers=None (all MoE layers) or "
                          "check that the store was written for this model")
    routes = as_tensor(batch["routes"], "batch['routes']")
    mask = as_tensor(batch["replay_mask"], "batch['replay_mask']", integer=False)
    if mask.is_floating_point() or mask.is_complex():
        raise ReplayError(f"batch['replay_mask'] must be bool (True: replay the row), got dtype {mask.dtype}")
    lead = routes.ndim - 2
    layout = batch.get("layout")
    if layout is not None and layout not in ("thd", "bshd", "sbhd"):
        raise ReplayError(f"batch['layout'] is {layout!r}; expected 'thd', 'bshd' or 'sbhd'")
    if layout == "sbhd":
        raise ReplayError(f"this batch is SBHD: routes of shape {tuple(routes.shape)} = (seq, batch, MoE layers, "
                          "top_k), sequence first; the routers of a (batch, seq) model input see the tokens batch "
                          "first, so SBHD routes would replay transposed: assemble with {'layout': 'bshd'} for a "
                          "(batch, seq) input or {'layout': 'thd'} for a packed (1, total) input")
    if layout is not None and (lead == 2) != (layout == "bshd"):
        raise ReplayError(f"batch['layout'] is {layout!r}, but batch['routes'] has shape {tuple(routes.shape)}")
    _check_shape(routes, "batch['routes']", len(moe_layers), top_k, lead=max(lead, 1))
    if tuple(mask.shape) != tuple(routes.shape[:lead]):
        raise ReplayError(f"batch['replay_mask'] has shape {tuple(mask.shape)}, routes {tuple(routes.shape)}")
    flat = routes.reshape(-1, len(moe_layers), top_k)
    flat_mask = mask.reshape(-1).to(torch.bool)
    width = routes.shape[1] if lead == 2 else None
    sample_ids = list(batch.get("sample_ids") or [])
    cu = batch.get("cu_seqlens")
    bounds = None if cu is None else _cu_tensor(cu, "batch['cu_seqlens']")

    def where(r: int, j: int) -> str:
        return f"{_batch_row(r, width, cu, sample_ids)}, decoder layer {moe_layers[j]}"

    has = check_ids(flat, ~flat_mask.to(flat.device), num_experts, where)
    kind = "BSHD" if lead == 2 else "THD"
    source = f"{kind} batch of {flat.shape[0]} positions"
    if lead == 2:
        return TokenPlan(flat, has, source, want_shape=(int(routes.shape[0]), int(routes.shape[1])))
    lengths = None
    if bounds is not None and int(bounds[-1]) == flat.shape[0]:
        lengths = (bounds[1:] - bounds[:-1]).tolist()
    return TokenPlan(flat, has, source, lengths=lengths)


def _batch_row(r: int, width: int | None, cu: Any, sample_ids: list[str]) -> str:
    if width is not None:
        b = r // width
        name = f" (sample {sample_ids[b]!r})" if b < len(sample_ids) else ""
        return f"batch row {b}{name}, position {r % width}"
    if cu is not None:
        bounds = as_tensor(cu, "cu_seqlens").to("cpu", torch.int64).reshape(-1)
        s = int(torch.searchsorted(bounds[1:], torch.tensor(r), right=True))
        if s < len(sample_ids):
            return f"position {r} (sample {sample_ids[s]!r}, row {r - int(bounds[s])})"
    return f"position {r}"
