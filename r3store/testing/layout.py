"""``LayoutParity``: prove ``LayoutOptions(framework=...)`` against a framework's own packing code.

A framework's test module (r3store's own, or the framework's CI) subclasses
:class:`LayoutParity`, names the ``framework`` and implements :meth:`LayoutParity.pack`
by calling the framework's packing function (its real package, or a copy of it)::

    class TestVerl(LayoutParity):
        framework = "verl"

        def pack(self, values, options):
            ids, mask = right_padded(values)            # [B, S] + attention mask
            packed, params = preprocess_packed_seqs(ids, mask, tp_size=options.tp_size,
                                                    cp_size=options.cp_size, cp_rank=options.cp_rank)
            return Packed(sp_slice(packed[0].numpy(), options), params["cu_seqlens_q"].numpy())

The kit runs the grid TP {1, 2, 4} x CP {1, 2, 4} x sequence parallel on/off x every
``(cp_rank, tp_rank)`` x each of :attr:`LayoutParity.layouts`, over batches whose
sample lengths include 1, odd lengths and lengths below ``2 * cp * tp``, and checks:

* the plan (:func:`r3store.layout.plan_layout`): every output position holds the token
  the framework puts there, and ``cu_seqlens`` equal the framework's;
* routes (:func:`r3store.layout.apply_routes`): where ``replay_mask`` is true the route
  row equals the framework's route packing (:meth:`LayoutParity.pack_routes`), and it is
  true exactly at the tokens that have a recorded route;
* ``assemble`` on a real store: ``tokens``, ``routes``, ``replay_mask`` and
  ``cu_seqlens`` as above, read rank-locally.

Values handed to :meth:`LayoutParity.pack` are token positions plus 2 (int64), so any
small pad value a framework writes (0 or 1) reads as padding. Pad rows' ids are not
compared (frameworks fill them differently; r3store spreads them over experts): they
are checked in range and distinct within a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytest

from r3store.layout import LayoutOptions, apply_routes, plan_layout, route_index

__all__ = ["GRID", "LENGTHS", "LayoutParity", "Packed", "Unpackable", "sp_slice"]

GRID = [(tp, cp, sp) for tp in (1, 2, 4) for cp in (1, 2, 4) for sp in (False, True)]
"""``(tp_size, cp_size, sequence_parallel)`` cases; every rank of each is checked."""

LENGTHS = ((1,), (5, 3), (2, 7, 1, 16), (17, 1, 32, 9, 2, 8), (40, 33, 1, 15, 64, 3), (67, 99, 128, 45))
"""Batches of sample token counts: single tokens, odd lengths, lengths below ``2*cp*tp``, and
one batch of long sequences only (every framework's code packs it)."""

_OFFSET = 2
_SPEC: dict[str, Any] = {"num_layers": 3, "num_experts": 16, "top_k": 4}


class Unpackable(Exception):
    """Raised by :meth:`LayoutParity.pack` when the framework's own code fails on a batch.

    The batch is then not compared (r3store still lays it out); every case must compare
    at least one batch, so a framework that fails everywhere fails the kit.
    """


class Packed(NamedTuple):
    """What a framework's packing hands one rank."""

    values: np.ndarray
    """THD ``(T_local, *trail)``; BSHD ``(B, T_local, *trail)``; SBHD ``(T_local, B, *trail)``."""
    cu_seqlens: np.ndarray | None = None
    """The ``cu_seqlens`` the framework builds (``None``: it has none to compare)."""


def sp_slice(values: np.ndarray, options: LayoutOptions, axis: int = 0) -> np.ndarray:
    """Megatron's sequence-parallel scatter (``scatter_to_sequence_parallel_region``):
    TP rank ``r`` keeps the ``r``-th of ``tp_size`` equal parts along ``axis``; no-op
    without ``sequence_parallel``."""
    if not options.sequence_parallel or options.tp_size == 1:
        return values
    part = values.shape[axis] // options.tp_size
    return np.take(values, np.arange(options.tp_rank * part, (options.tp_rank + 1) * part), axis=axis)


def _tokens(lengths: Sequence[int]) -> list[np.ndarray]:
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return [np.arange(s, s + n, dtype=np.int64) + _OFFSET for s, n in zip(starts, lengths, strict=True)]


def _routes(lengths: Sequence[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    k, e = _SPEC["top_k"], _SPEC["num_experts"]
    out = []
    for n in lengths:
        keys = rng.random((n - 1, _SPEC["num_layers"], e))
        out.append(np.argsort(keys, axis=-1)[..., :k].astype(np.int64))
    return out


def _positions(packed: Packed) -> np.ndarray:
    return np.where(packed.values >= _OFFSET, packed.values - _OFFSET, -1)


class LayoutParity:
    """Conformance tests: ``framework=`` lays a micro-batch out as the framework does (not collected).

    Subclasses set :attr:`framework` and implement :meth:`pack`; they may override
    :meth:`pack_routes` (a framework with its own route packing), :meth:`supports`
    and :meth:`options`.
    """

    framework: ClassVar[str]
    """The ``LayoutOptions.framework`` value under test."""
    layouts: ClassVar[tuple[str, ...]] = ("thd",)
    """Layouts to check (``"thd"``, ``"bshd"``, ``"sbhd"``)."""
    lengths: ClassVar[tuple[tuple[int, ...], ...]] = LENGTHS

    # -- what a subclass provides ----------------------------------------------------

    def pack(self, values: list[np.ndarray], options: LayoutOptions) -> Packed:
        """Run the framework's token packing for the rank ``options`` names.

        Parameters
        ----------
        values : list of numpy.ndarray of int64
            One array per sample, shape ``(num_tokens_i,)``: the sample's token ids.
        options : LayoutOptions
            Layout, ``tp_size``/``tp_rank``, ``cp_size``/``cp_rank``,
            ``sequence_parallel`` and ``pad_multiple`` of the case.

        Returns
        -------
        Packed
            The tensor the framework hands this rank's model (after its CP cut and SP
            split), and its ``cu_seqlens``.
        """
        raise NotImplementedError

    def pack_routes(self, routes: list[np.ndarray], options: LayoutOptions) -> np.ndarray:
        """Run the framework's route packing (routes ``(num_tokens_i - 1, L, K)`` per sample).

        Default: routes follow the token packing (:meth:`pack` of the routes with one
        row appended per sample, so row ``t`` sits at token ``t``), as in frameworks
        that pack routes with their token function (verl).

        Returns
        -------
        numpy.ndarray
            This rank's routes, laid out like :meth:`pack`'s values, ``(..., L, K)``.
        """
        padded = [np.concatenate((r + _OFFSET, np.zeros((1, *r.shape[1:]), np.int64))) for r in routes]
        return self.pack(padded, options).values - _OFFSET

    def supports(self, layout: str, tp_size: int, cp_size: int, sequence_parallel: bool) -> bool:
        """Whether the framework runs this case (default: every case)."""
        return True

    def options(self, **fields: Any) -> LayoutOptions:
        """The options of one case (``layout``, sizes, ranks, ``sequence_parallel``)."""
        return LayoutOptions(framework=self.framework, **fields)  # type: ignore[arg-type]

    # -- the grid --------------------------------------------------------------------

    def _cases(self, tp: int, cp: int, sp: bool) -> list[LayoutOptions]:
        cases = [self.options(layout=layout, tp_size=tp, tp_rank=t, cp_size=cp, cp_rank=c, sequence_parallel=sp)
                 for layout in self.layouts if self.supports(layout, tp, cp, sp)
                 for c in range(cp) for t in range(tp)]
        if not cases:
            pytest.skip(f"{self.framework} does not run tp={tp} cp={cp} sequence_parallel={sp}")
        return cases

    @pytest.mark.parametrize(("tp", "cp", "sp"), GRID, ids=[f"tp{t}-cp{c}-sp{int(s)}" for t, c, s in GRID])
    def test_plan_equals_framework(self, tp: int, cp: int, sp: bool) -> None:
        for opts in self._cases(tp, cp, sp):
            compared = 0
            for lengths in self.lengths:
                plan = plan_layout(lengths, opts)
                try:
                    packed = self.pack(_tokens(lengths), opts)
                except Unpackable:
                    continue
                compared += 1
                where = f"{self._case(opts)} {lengths}"
                np.testing.assert_array_equal(plan.index, _positions(packed), err_msg=where)
                if packed.cu_seqlens is not None:
                    np.testing.assert_array_equal(plan.cu_seqlens, packed.cu_seqlens, err_msg=where)
            assert compared, f"{self.framework}'s packing failed on every batch ({opts})"

    @pytest.mark.parametrize(("tp", "cp", "sp"), GRID, ids=[f"tp{t}-cp{c}-sp{int(s)}" for t, c, s in GRID])
    def test_routes_equal_framework(self, tp: int, cp: int, sp: bool) -> None:
        for opts in self._cases(tp, cp, sp):
            compared = 0
            for seed, lengths in enumerate(self.lengths):
                routes = _routes(lengths, seed)
                plan = plan_layout(lengths, opts)
                got, mask = apply_routes(plan, np.concatenate(routes), num_experts=_SPEC["num_experts"])
                try:
                    want = self.pack_routes(routes, opts)
                except Unpackable:
                    continue
                compared += 1
                where = f"{self._case(opts)} {lengths}"
                np.testing.assert_array_equal(mask, route_index(plan) >= 0, err_msg=where)
                np.testing.assert_array_equal(got[mask], want[mask], err_msg=where)
                self._check_pads(got[~mask])
            assert compared, f"{self.framework}'s route packing failed on every batch ({opts})"

    def _case(self, o: LayoutOptions) -> str:
        return (f"{self.framework} {o.layout} tp={o.tp_size}/{o.tp_rank} cp={o.cp_size}/{o.cp_rank} "
                f"sp={o.sequence_parallel} pad_multiple={o.pad_multiple}")

    @staticmethod
    def _check_pads(pads: np.ndarray) -> None:
        assert ((pads >= 0) & (pads < _SPEC["num_experts"])).all()
        ordered = np.sort(pads, axis=-1)
        assert (np.diff(ordered, axis=-1) != 0).all(), "pad rows must hold distinct ids"

    @pytest.mark.parametrize(("tp", "cp", "sp"), GRID, ids=[f"tp{t}-cp{c}-sp{int(s)}" for t, c, s in GRID])
    def test_assemble_equals_framework(self, tp: int, cp: int, sp: bool, tmp_path: Any) -> None:
        import r3store
        from r3store.batch import assemble

        lengths = self.lengths[-1]
        routes = _routes(lengths, 7)
        tokens = [t - _OFFSET + 100 for t in _tokens(lengths)]  # any token ids; position p holds p + 100
        spec = r3store.ModelSpec(**_SPEC)
        ids = [f"s{i}" for i in range(len(lengths))]
        with r3store.RouteWriter(tmp_path / "store", spec, config={"chunk_rows": 8}) as writer:
            for sid, r, t in zip(ids, routes, tokens, strict=True):
                writer.append(sid, r.astype(np.int32), tokens=t)
        reader = r3store.open_store(tmp_path / "store")
        for opts in self._cases(tp, cp, sp):
            batch = assemble(reader, ids, opts, tokens=tokens)
            packed = self.pack(_tokens(lengths), opts)  # the last batch: long sequences only
            pos = _positions(packed)
            where = self._case(opts)
            np.testing.assert_array_equal(batch["tokens"], np.where(pos >= 0, pos + 100, 0), err_msg=where)
            plan = plan_layout(lengths, opts)
            np.testing.assert_array_equal(batch["replay_mask"], route_index(plan) >= 0, err_msg=where)
            mask = batch["replay_mask"]
            want = self.pack_routes(routes, opts)
            np.testing.assert_array_equal(batch["routes"][mask], want[mask], err_msg=where)
            self._check_pads(batch["routes"][~mask])
            if packed.cu_seqlens is not None:
                np.testing.assert_array_equal(batch["cu_seqlens"], packed.cu_seqlens, err_msg=where)
