"""The layout plan: one index over token positions, computed once per micro-batch.

The plan maps every output position of the trainer's token tensor to a position in
the concatenation of all samples' tokens (or ``-1`` for padding). Tokens, position
ids, loss masks and routes are all laid out through the same plan, so they cannot
drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from r3store._checks import MAX_ROWS
from r3store.layout import _frameworks
from r3store.layout._options import LayoutOptionError, LayoutOptions

__all__ = ["MAX_LOCAL_LENGTH", "LayoutPlan", "plan_layout", "route_index"]

MAX_LOCAL_LENGTH = 2**31 - 1
"""Most positions one rank's index may hold (before the SP split): ``cu_seqlens`` are int32."""


@dataclass(frozen=True, eq=False)
class LayoutPlan:
    """Where each output position of one trainer rank's token tensor comes from.

    Attributes
    ----------
    index : numpy.ndarray of int64
        THD: shape ``(T_local,)``; BSHD: shape ``(B, T_local)``; SBHD: shape
        ``(T_local, B)`` (the BSHD index transposed). Each value is a
        position in the concatenation of all samples' tokens (sample ``i`` owns
        ``num_tokens[i]`` positions), or ``-1`` for padding. ``T_local`` is the
        length after the sequence-parallel split.
    cu_seqlens : numpy.ndarray of int32
        THD: shape ``(B + 1,)`` boundaries of the sequences in the CP-local packed
        tensor before the SP split, or ``(B + 2,)`` when TP padding adds a final
        padding segment that belongs to no sample. BSHD: shape ``(B + 1,)``, the
        cumulative sum of the per-sample CP-local padded row lengths (TP padding
        included, SP split not applied). With ``options.framework`` set: the
        ``cu_seqlens`` that framework builds (THD: the global padded boundaries it hands
        ``PackedSeqParams``; see :mod:`r3store.layout._frameworks`).
    seqlens : numpy.ndarray of int32
        Shape ``(B,)``: per-sample token counts (unpadded, global).
    sp_range : tuple of int
        Half-open range ``[start, end)`` of this TP rank's slice along the token
        dimension of the CP-local, TP-padded tensor; ``(0, T)`` without SP.
    options : LayoutOptions
        The options the plan was made with.
    """

    index: np.ndarray
    cu_seqlens: np.ndarray
    seqlens: np.ndarray
    sp_range: tuple[int, int]
    options: LayoutOptions

    @property
    def num_samples(self) -> int:
        """Number of samples ``B`` in the micro-batch."""
        return int(self.seqlens.shape[0])

    @property
    def total_tokens(self) -> int:
        """Length of the concatenated token order, ``sum(num_tokens)``."""
        return int(self.seqlens.sum())

    @property
    def total_routes(self) -> int:
        """Rows of the concatenated routes, ``sum(num_tokens - 1)``."""
        return self.total_tokens - self.num_samples

    @property
    def local_length(self) -> int:
        """Length ``T_local`` of this rank's token dimension (the last axis of ``index``; the
        first in SBHD)."""
        return int(self.index.shape[0 if self.options.layout == "sbhd" else -1])

    @property
    def token_offsets(self) -> np.ndarray:
        """int64 ``(B + 1,)``: where each sample starts in the concatenated token order."""
        return np.concatenate(([0], np.cumsum(self.seqlens, dtype=np.int64)))


def _parse_num_tokens(num_tokens: Any) -> np.ndarray:
    """Return ``num_tokens`` as an int64 ``(B,)`` array of counts in ``[1, 2**40]``, ``B >= 1``."""
    arr = np.asarray(num_tokens)
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise LayoutOptionError("num_tokens", num_tokens, "must be a non-empty 1-D sequence")
    if arr.dtype.kind not in "iu":
        raise LayoutOptionError("num_tokens", num_tokens, "must hold integers")
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        i = int(bad[0])
        raise LayoutOptionError("num_tokens", num_tokens, f"sample {i} has {arr[i]} tokens; need >= 1")
    big = np.flatnonzero(arr > MAX_ROWS)
    if big.size:
        i = int(big[0])
        raise LayoutOptionError("num_tokens", num_tokens, f"sample {i} has {arr[i]} tokens; at most {MAX_ROWS}")
    return arr.astype(np.int64)


def _check_local_length(seqlens: np.ndarray, opts: LayoutOptions) -> None:
    """Reject a layout whose per-rank index (CP-local, TP-padded) would exceed
    :data:`MAX_LOCAL_LENGTH` positions, before anything of that size is allocated."""
    if opts.framework is not None:
        rows, width = _frameworks.local_length(seqlens, opts)
        padded = rows * width
    else:
        per_seq = _round_up(seqlens, opts.cp_unit) // opts.cp_size  # int64: each <= 2**41
        if opts.layout == "thd":
            rows, width = 1, int(per_seq.sum())
        else:
            rows, width = len(seqlens), _bshd_length(seqlens, opts) // opts.cp_size
        padded = rows * int(_round_up(width, opts.tp_unit))
    if padded <= MAX_LOCAL_LENGTH:
        return
    if rows * width > MAX_LOCAL_LENGTH:
        option, value = ("max_seqlen", opts.max_seqlen) if opts.max_seqlen else ("num_tokens", int(seqlens.sum()))
    else:
        option, value = "tp_size * pad_multiple", opts.tp_unit
    fault = (f"one rank's token dimension would hold {padded:,} positions; "
             f"at most {MAX_LOCAL_LENGTH:,} (int32 cu_seqlens)")
    raise LayoutOptionError(option, value, fault)


def _round_up(n: int | np.ndarray, unit: int) -> Any:
    """Round ``n`` up to a multiple of ``unit``."""
    return -(-n // unit) * unit


def _cp_positions(padded: int, opts: LayoutOptions) -> np.ndarray:
    """Sequence positions (int64) this CP rank keeps of a sequence padded to ``padded``.

    Zig-zag (Megatron ``get_batch_on_this_cp_rank``, Miles): ``2*cp`` chunks, rank
    ``r`` keeps chunks ``r`` then ``2*cp-1-r``. Contiguous: ``cp`` chunks, rank
    ``r`` keeps chunk ``r``. ``padded`` must be a multiple of ``opts.cp_unit``.
    """
    cp, r = opts.cp_size, opts.cp_rank
    if cp == 1:
        return np.arange(padded, dtype=np.int64)
    if opts.cp_mode == "contiguous":
        chunk = padded // cp
        return np.arange(r * chunk, (r + 1) * chunk, dtype=np.int64)
    chunk = padded // (2 * cp)
    first = np.arange(r * chunk, (r + 1) * chunk, dtype=np.int64)
    return np.concatenate((first, first + (2 * cp - 1 - 2 * r) * chunk))


def _sequence_index(offset: int, n: int, padded: int, opts: LayoutOptions) -> np.ndarray:
    """CP-local index (int64, ``(padded // cp_size,)``) of one sequence of ``n`` tokens."""
    pos = _cp_positions(padded, opts)
    return np.where(pos < n, offset + pos, -1)


def _bshd_length(seqlens: np.ndarray, opts: LayoutOptions) -> int:
    """Common global row length ``T`` before the CP cut (rounded up to ``cp_unit``)."""
    if opts.max_seqlen is None:
        return int(_round_up(int(seqlens.max()), opts.cp_unit))
    over = np.flatnonzero(seqlens > opts.max_seqlen)
    if over.size:
        i = int(over[0])
        fault = f"sample {i} has {int(seqlens[i])} tokens, more than max_seqlen={opts.max_seqlen}"
        raise LayoutOptionError("max_seqlen", opts.max_seqlen, fault)
    return int(_round_up(opts.max_seqlen, opts.cp_unit))


def _pad_last(index: np.ndarray, unit: int) -> np.ndarray:
    """Pad the last axis of ``index`` with ``-1`` to a multiple of ``unit`` (TP padding)."""
    extra = int(_round_up(index.shape[-1], unit)) - index.shape[-1]
    if extra == 0:
        return index
    widths = [(0, 0)] * (index.ndim - 1) + [(0, extra)]
    return np.pad(index, widths, constant_values=-1)


def _thd(seqlens: np.ndarray, offsets: np.ndarray, opts: LayoutOptions) -> tuple[np.ndarray, np.ndarray]:
    """Packed index (before SP) and ``cu_seqlens`` for the THD layout."""
    padded = _round_up(seqlens, opts.cp_unit)
    parts = [_sequence_index(int(o), int(n), int(p), opts) for o, n, p in zip(offsets, seqlens, padded, strict=True)]
    local = padded // opts.cp_size
    cu = np.concatenate(([0], np.cumsum(local)))
    index = _pad_last(np.concatenate(parts), opts.tp_unit)
    if index.shape[0] > cu[-1]:
        cu = np.append(cu, index.shape[0])
    return index, cu.astype(np.int32)


def _bshd(seqlens: np.ndarray, offsets: np.ndarray, opts: LayoutOptions) -> tuple[np.ndarray, np.ndarray]:
    """Padded ``(B, T)`` index (before SP) and ``cu_seqlens`` for the BSHD layout."""
    length = _bshd_length(seqlens, opts)
    rows = [_sequence_index(int(o), int(n), length, opts) for o, n in zip(offsets, seqlens, strict=True)]
    index = _pad_last(np.stack(rows), opts.tp_unit)
    cu = np.arange(len(rows) + 1, dtype=np.int64) * index.shape[1]
    return index, cu.astype(np.int32)


def _sp_range(length: int, opts: LayoutOptions) -> tuple[int, int]:
    """This TP rank's ``[start, end)`` of a token dimension of ``length`` (a multiple of tp_size)."""
    if not opts.sequence_parallel:
        return 0, length
    part = length // opts.tp_size
    return opts.tp_rank * part, (opts.tp_rank + 1) * part


def _resolve_options(options: LayoutOptions | None, kw: dict[str, Any]) -> LayoutOptions:
    """Merge ``options`` and keyword overrides into one :class:`LayoutOptions`."""
    if options is None:
        return LayoutOptions.from_dict(kw)
    if not isinstance(options, LayoutOptions):
        raise LayoutOptionError("options", options, "must be a LayoutOptions or None")
    if not kw:
        return options
    return LayoutOptions.from_dict({**options.to_dict(), **kw})


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def plan_layout(
    num_tokens: Sequence[int] | np.ndarray,
    options: LayoutOptions | None = None,
    **kw: Any,
) -> LayoutPlan:
    """Compute where each token of a micro-batch lands on one trainer rank.

    Parameters
    ----------
    num_tokens : sequence of int or numpy.ndarray, shape (B,)
        Token count of each sample (``>= 1``), in batch order. Sample ``i`` owns
        positions ``[sum(num_tokens[:i]), sum(num_tokens[:i+1]))`` of the
        concatenated token order.
    options : LayoutOptions, optional
        The layout; defaults to ``LayoutOptions()``.
    **kw
        Option fields (``cp_size=2``, ...) overriding those of ``options``.

    Returns
    -------
    LayoutPlan
        ``index`` is int64, shape ``(T_local,)`` (THD), ``(B, T_local)`` (BSHD) or
        ``(T_local, B)`` (SBHD).

    Raises
    ------
    LayoutOptionError
        If ``num_tokens`` is empty, not integer, or holds a count ``< 1`` or
        ``> 2**40``; if an option is invalid; if a BSHD sample is longer than
        ``max_seqlen``; or if one rank's padded token dimension (before the SP split)
        would exceed :data:`MAX_LOCAL_LENGTH` positions.

    Notes
    -----
    The steps follow Miles' per-micro-batch route layout, in order:

    1. every sample keeps all ``num_tokens`` positions (its last one has no
       recorded route; see :func:`route_index`);
    2. context parallel, per sequence: zig-zag pads each sequence to a multiple
       of ``2*cp_size``, cuts ``2*cp_size`` equal chunks, and rank ``r`` keeps
       chunks ``r`` and ``2*cp_size-1-r``; contiguous pads to a multiple of
       ``cp_size`` and rank ``r`` keeps chunk ``r``. BSHD pads every sequence to
       the common length ``T`` (rounded up likewise) *before* the cut;
    3. THD concatenates the CP-local sequences; BSHD stacks them;
    4. the token dimension is padded to a multiple of ``tp_size * pad_multiple``
       (a final ``cu_seqlens`` segment in THD);
    5. with ``sequence_parallel``, the plan keeps only ``tp_rank``'s contiguous
       ``1/tp_size`` of the token dimension (``sp_range``).

    With ``options.framework`` set, steps 2-4 and ``cu_seqlens`` follow that framework's
    own packing code instead (per-sequence padding, CP cut, total padding; read at the
    commits listed in :mod:`r3store.layout._frameworks`), and step 5 is the same split.

    Examples
    --------
    Two samples of 5 and 3 tokens, zig-zag CP over 2 ranks, rank 1, TP size 4:

    >>> plan = plan_layout([5, 3], cp_size=2, cp_rank=1, tp_size=4)
    >>> plan.index
    array([ 2,  3,  4, -1,  6,  7, -1, -1])
    >>> plan.cu_seqlens
    array([0, 4, 6, 8], dtype=int32)
    >>> route_index(plan)
    array([ 2,  3, -1, -1,  5, -1, -1, -1])
    """
    opts = _resolve_options(options, kw)
    seqlens = _parse_num_tokens(num_tokens)
    _check_local_length(seqlens, opts)
    offsets = np.concatenate(([0], np.cumsum(seqlens)[:-1]))
    if opts.framework is not None:
        full, cu = _frameworks.framework_index(seqlens, offsets, opts)
    else:
        build = _thd if opts.layout == "thd" else _bshd
        full, cu = build(seqlens, offsets, opts)
    start, end = _sp_range(full.shape[-1], opts)
    local = full[..., start:end]
    return LayoutPlan(
        index=_readonly(local.T if opts.layout == "sbhd" else local),
        cu_seqlens=_readonly(cu),
        seqlens=_readonly(seqlens.astype(np.int32)),
        sp_range=(start, end),
        options=opts,
    )


def route_index(plan: LayoutPlan) -> np.ndarray:
    """Map each output position to a row of the concatenated routes.

    Parameters
    ----------
    plan : LayoutPlan

    Returns
    -------
    numpy.ndarray of int64
        Same shape as ``plan.index`` (``(T_local,)`` or ``(B, T_local)``). Sample
        ``i`` owns routes rows ``[sum(num_tokens[:i] - 1), sum(num_tokens[:i+1] - 1))``;
        the value is ``-1`` where no route was recorded: at each sample's last
        token and at every padding position.
    """
    seqlens = plan.seqlens.astype(np.int64)
    sample = np.repeat(np.arange(seqlens.shape[0]), seqlens)
    token = np.arange(plan.total_tokens, dtype=np.int64)
    is_last = token == (plan.token_offsets[1:] - 1)[sample]
    table = np.where(is_last, -1, token - sample)
    idx = plan.index
    return np.where(idx >= 0, table[np.maximum(idx, 0)], -1)

