"""Layout options: how a trainer packs, pads and splits one micro-batch, and what the batch holds.

:class:`LayoutOptions` is a frozen value object (with :class:`LayoutOptionsDict`, its dict
form: zarr's ``ArrayConfig`` / ``ArrayConfigParams`` pattern) passed whole to
:func:`r3store.batch.assemble`, :meth:`r3store.RouteStore.assemble` and
:class:`r3store.RouteDataset`; every field is checked in
``__post_init__`` by a small ``_parse_*`` function, so an invalid combination can
never reach :func:`r3store.layout.plan_layout`. Bad values raise
:class:`LayoutOptionError`, which is both an :class:`r3store.errors.R3StoreError`
and a :class:`ValueError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypedDict, cast

import numpy as np

from r3store._checks import (
    MAX_ROWS,
    config_from_dict,
    merge_config,
    parse_bool,
    parse_choice,
    parse_int,
    strict_fields,
)
from r3store.errors import LayoutOptionError, UnknownLayoutOptionError
from r3store.layout._frameworks import FRAMEWORKS, check_framework, default_pad_multiple

__all__ = ["PAD_POLICIES", "ROUTE_DTYPES", "LayoutOptionError", "LayoutOptions", "LayoutOptionsDict"]

LAYOUTS = ("thd", "bshd", "sbhd")
CP_MODES = ("zigzag", "contiguous")
PAD_POLICIES = ("spread", "fill")
"""Pad-row policies: distinct in-range ids spread over all experts, or one fill value."""
ROUTE_DTYPES = ("int32", "int16", "uint8")
"""dtypes ``routes`` can be assembled in (trainers take int32, verl int16, NeMo-RL/SkyRL/prime-rl uint8);
``"auto"`` picks the narrowest holding every id (:func:`r3store.batch.route_dtype`)."""
_INT32 = np.iinfo(np.int32)


MAX_SIZE = 1 << 31
"""Largest ``cp_size``, ``tp_size`` and ``pad_multiple`` accepted."""


def _parse_int(name: str, value: Any, minimum: int, maximum: int = MAX_SIZE) -> int:
    return parse_int(name, value, minimum=minimum, maximum=maximum, error=LayoutOptionError)


def _parse_rank(name: str, value: Any, size: int, size_name: str) -> int:
    """Return ``value`` as a rank in ``[0, size)``."""
    rank = _parse_int(name, value, 0)
    if rank >= size:
        raise LayoutOptionError(name, value, f"must be < {size_name}={size}")
    return rank


def _parse_max_seqlen(value: Any, layout: str) -> int | None:
    """Return ``value`` as ``None`` or a length ``>= 1``; only BSHD accepts a length."""
    if value is None:
        return None
    length = _parse_int("max_seqlen", value, 1, MAX_ROWS)
    if layout == "thd":
        raise LayoutOptionError("max_seqlen", value, "applies to layout='bshd' or 'sbhd' only")
    return length


def _parse_dtype(value: Any) -> str:
    """``"auto"`` or the name of one of :data:`ROUTE_DTYPES` (a numpy dtype or type accepted)."""
    if isinstance(value, str) and value == "auto":
        return "auto"
    name: str | None
    try:
        name = str(np.dtype(value).name)
    except TypeError:
        name = None
    if name is None or name not in ROUTE_DTYPES:
        raise LayoutOptionError("dtype", value, f"must be one of {', '.join(ROUTE_DTYPES)} or 'auto'")
    return name


def _parse_framework(value: Any) -> str | None:
    """Return ``value`` as ``None`` or one of :data:`FRAMEWORKS`."""
    if value is None:
        return None
    return parse_choice("framework", value, FRAMEWORKS, error=LayoutOptionError)


def _parse_ep_size(value: Any) -> int | None:
    """Return ``value`` as ``None`` or an expert-parallel size ``>= 1``."""
    if value is None:
        return None
    return _parse_int("ep_size", value, 1)


class LayoutOptionsDict(TypedDict, total=False):
    """Dict form of :class:`LayoutOptions` (every key optional; missing keys take defaults)."""

    layout: Literal["thd", "bshd", "sbhd"]
    cp_size: int
    cp_rank: int
    cp_mode: Literal["zigzag", "contiguous"]
    tp_size: int
    tp_rank: int
    pad_multiple: int | None
    sequence_parallel: bool
    max_seqlen: int | None
    pad_policy: Literal["spread", "fill"]
    fill_value: int
    dtype: str
    packed: bool
    framework: Literal["megatron", "verl", "slime", "miles", "nemo_rl", "skyrl", "prime_rl"] | None
    ep_size: int | None


@strict_fields
@dataclass(frozen=True, kw_only=True)
class LayoutOptions:
    """How a trainer lays one micro-batch out (Miles' per-micro-batch route layout).

    Parameters
    ----------
    layout : {"thd", "bshd", "sbhd"}
        ``"thd"`` packs the sequences back to back (``cu_seqlens`` marks them);
        ``"bshd"`` pads every sequence to one common length, batch first ``(B, T)``;
        ``"sbhd"`` is the same padded batch sequence first, ``(T, B)``: the order
        Megatron's router flattens tokens in (``hidden_states.view(-1, h)`` of an
        ``[S, B, h]`` tensor), with the SP split along the sequence.
    cp_size, cp_rank : int
        Context-parallel group size (``>= 1``) and this rank (``0 <= cp_rank < cp_size``).
    cp_mode : {"zigzag", "contiguous"}
        ``"zigzag"`` (Megatron / Miles load-balanced CP): rank ``r`` keeps chunks
        ``r`` and ``2*cp_size-1-r`` of ``2*cp_size``. ``"contiguous"`` (all-gather
        CP): rank ``r`` keeps chunk ``r`` of ``cp_size``.
    tp_size, tp_rank : int
        Tensor-parallel group size (``>= 1``) and this rank (``0 <= tp_rank < tp_size``).
    pad_multiple : int or None
        The packed token dimension is padded to a multiple of ``tp_size * pad_multiple``.
        ``None`` (default) resolves to 1, or with ``framework`` to that framework's own
        default (slime/Miles ``--data-pad-size-multiplier`` 128, NeMo-RL its minimum
        ``make_sequence_length_divisible_by``, prime-rl ``cp_size``); what the multiple
        pads under a framework is that framework's rule (see ``framework``). A default is
        left out of :meth:`to_dict` (``None``), so options rebuilt with other sizes or
        another framework (:meth:`resolve`) take it anew.
    sequence_parallel : bool
        When true, a TP rank holds only its contiguous ``1/tp_size`` of the token dimension.
    max_seqlen : int or None
        BSHD/SBHD only: pad every sequence to this length instead of the batch maximum.
    pad_policy : {"spread", "fill"}
        Pad rows (each sample's last token, CP/TP/BSHD padding, rows the engine could
        not capture) hold distinct in-range ids spread over all experts, so no expert
        gets more than ``ceil(pad_rows * top_k / num_experts) + 1`` pad tokens per layer
        (``"spread"``), or ``fill_value`` (``"fill"``).
    fill_value : int
        Pad id with ``pad_policy="fill"`` (an int32; ``[0, 2**16)`` with ``packed``).
    dtype : {"int32", "int16", "uint8", "auto"} or numpy dtype
        dtype of the assembled ``routes``: int32 (default), int16 (verl), uint8, or
        ``"auto"``, the narrowest holding every expert id and pad id (checked against
        the store's ``num_experts`` by :func:`r3store.batch.route_dtype`). Stored as its
        name (``np.int16`` -> ``"int16"``).
    packed : bool
        ``routes`` bit-packed (uint8, with ``routes_bits`` and ``routes_shape``) for the
        trip to the device, unpacked there by :func:`r3store.dataset.unpack_routes`.
    framework : {"megatron", "verl", "slime", "miles", "nemo_rl", "skyrl", "prime_rl"} or None
        Follow that framework's own packing code (per-sequence padding, CP cut, SP split
        and ``cu_seqlens``) instead of the rules above; ``None`` keeps them. The rules,
        the code and the commit read are listed in :mod:`r3store.layout._frameworks`
        and in the README ("Which options for my framework").
    ep_size : int or None
        Expert-parallel size: pad rows (``pad_policy="spread"``) spread their ids over the
        EP ranks (expert ``e`` on rank ``e // (num_experts // ep_size)``), so over one
        batch's pad rows the pad-id counts of the EP ranks differ by at most 1 in every
        MoE layer. ``None`` keeps ids ``(p*top_k + j) % num_experts``. Must divide
        ``num_experts`` (checked where the model is known).

    Raises
    ------
    LayoutOptionError
        If a field has the wrong type or is out of range (sizes and ``pad_multiple``
        at most ``2**31``, ``max_seqlen`` at most ``2**40``, ``fill_value`` an int32,
        in ``[0, 2**16)`` with ``packed``); the message names the field.
    UnknownLayoutOptionError
        (a ``LayoutOptionError`` and a ``TypeError``) a keyword is no field: names the
        closest fields (``LayoutOptions(cp=2)``: "did you mean 'cp_size' or 'cp_rank'?").
    """

    layout: Literal["thd", "bshd", "sbhd"] = "thd"
    cp_size: int = 1
    cp_rank: int = 0
    cp_mode: Literal["zigzag", "contiguous"] = "zigzag"
    tp_size: int = 1
    tp_rank: int = 0
    pad_multiple: int | None = None
    sequence_parallel: bool = False
    max_seqlen: int | None = None
    pad_policy: Literal["spread", "fill"] = "spread"
    fill_value: int = -1
    dtype: str = "int32"
    packed: bool = False
    framework: Literal["megatron", "verl", "slime", "miles", "nemo_rl", "skyrl", "prime_rl"] | None = None
    ep_size: int | None = None

    UNKNOWN_ERROR: ClassVar[type[UnknownLayoutOptionError]] = UnknownLayoutOptionError
    """Raised for a name that is no field (keyword or dict key)."""

    LOOSE_KEYWORDS: ClassVar[tuple[str, ...]] = (
        "layout", "cp_size", "cp_rank", "cp_mode", "tp_size", "tp_rank", "pad_multiple", "sequence_parallel",
        "max_seqlen", "pad_policy", "fill_value", "dtype", "packed")
    """Fields that ``RouteStore.assemble`` and ``RouteDataset`` took as loose keywords before
    (deprecated aliases, removed in r3store 0.4.0; new fields are never loose keywords)."""

    def __post_init__(self) -> None:
        layout = parse_choice("layout", self.layout, LAYOUTS, error=LayoutOptionError)
        cp_size = _parse_int("cp_size", self.cp_size, 1)
        tp_size = _parse_int("tp_size", self.tp_size, 1)
        framework = _parse_framework(self.framework)
        self_pad_multiple = self.pad_multiple
        sequence_parallel = parse_bool("sequence_parallel", self.sequence_parallel, error=LayoutOptionError)
        pad_multiple = (default_pad_multiple(framework, cp_size, tp_size, sequence_parallel)
                        if self.pad_multiple is None else _parse_int("pad_multiple", self.pad_multiple, 1))
        fill_value = _parse_int("fill_value", self.fill_value, int(_INT32.min), int(_INT32.max))
        packed = parse_bool("packed", self.packed, error=LayoutOptionError)
        parsed = {
            "layout": layout,
            "cp_size": cp_size,
            "cp_rank": _parse_rank("cp_rank", self.cp_rank, cp_size, "cp_size"),
            "cp_mode": parse_choice("cp_mode", self.cp_mode, CP_MODES, error=LayoutOptionError),
            "tp_size": tp_size,
            "tp_rank": _parse_rank("tp_rank", self.tp_rank, tp_size, "tp_size"),
            "pad_multiple": pad_multiple,
            "sequence_parallel": sequence_parallel,
            "max_seqlen": _parse_max_seqlen(self.max_seqlen, layout),
            "framework": framework,
            "ep_size": _parse_ep_size(self.ep_size),
            "pad_policy": parse_choice("pad_policy", self.pad_policy, PAD_POLICIES, error=LayoutOptionError),
            "fill_value": fill_value,
            "dtype": _parse_dtype(self.dtype),
            "packed": packed,
        }
        if framework is not None:
            check_framework(framework, layout=layout, cp_size=cp_size, cp_mode=str(parsed["cp_mode"]),
                            tp_size=tp_size, sequence_parallel=sequence_parallel, pad_multiple=pad_multiple,
                            max_seqlen=_parse_max_seqlen(self.max_seqlen, layout))
        dtype = str(parsed["dtype"])
        if parsed["pad_policy"] == "fill" and dtype != "auto" and not (
                np.iinfo(dtype).min <= fill_value <= np.iinfo(dtype).max):  # "auto" is chosen per batch
            raise LayoutOptionError("fill_value", self.fill_value, f"pad id does not fit the routes dtype {dtype}")
        if packed and parsed["pad_policy"] == "fill" and not 0 <= fill_value < 1 << 16:
            raise LayoutOptionError("fill_value", self.fill_value, "must lie in [0, 2**16) with packed=True (ids are "
                                                                   "packed as unsigned bit fields)")
        for name, value in parsed.items():
            object.__setattr__(self, name, value)
        # a framework's default pad_multiple depends on the sizes: to_dict leaves a default out
        # (None), so options rebuilt with other sizes (resolve, from_dict) take it anew
        object.__setattr__(self, "_pad_multiple_default", self_pad_multiple is None)

    @property
    def cp_unit(self) -> int:
        """Each CP-cut sequence is padded to a multiple of this (1 without CP)."""
        if self.cp_size == 1:
            return 1
        return 2 * self.cp_size if self.cp_mode == "zigzag" else self.cp_size

    @property
    def tp_unit(self) -> int:
        """The packed token dimension is padded to a multiple of this."""
        return self.tp_size * cast(int, self.pad_multiple)  # resolved to an int in __post_init__

    def to_dict(self) -> LayoutOptionsDict:
        """Return the options as a JSON-ready ``dict`` (field name -> value)."""
        d = dataclasses.asdict(self)
        if getattr(self, "_pad_multiple_default", False):
            d["pad_multiple"] = None  # the framework's default, taken anew from the sizes on the way back
        return cast(LayoutOptionsDict, d)

    @classmethod
    def from_dict(cls, d: LayoutOptionsDict | Mapping[str, Any]) -> LayoutOptions:
        """Build options from a mapping such as :meth:`to_dict` returns.

        Missing fields take their defaults.

        Raises
        ------
        LayoutOptionError
            If ``d`` is not a mapping, holds an unknown key (``UnknownLayoutOptionError``,
            naming the closest fields), or a value is invalid.
        """
        return config_from_dict(cls, d, name="options", unknown="is not a layout option", error=LayoutOptionError)

    @classmethod
    def resolve(cls, options: LayoutOptions | LayoutOptionsDict | Mapping[str, Any] | None = None,
                **fields: Any) -> LayoutOptions:
        """One :class:`LayoutOptions` from ``options`` and per-field keywords.

        Keywords whose value is ``None`` count as not given (``None`` is no field's value
        except ``max_seqlen``'s default). The others are merged into ``options``. Entry
        points call it with the deprecated loose keywords they still accept.

        Parameters
        ----------
        options : LayoutOptions, LayoutOptionsDict or None
            The options passed whole (a dict form is checked by :meth:`from_dict`).
        **fields
            Option fields given as keywords (``cp_size=2``, ...).

        Raises
        ------
        LayoutOptionError
            ``options`` is neither a LayoutOptions nor a mapping; a keyword is not a
            layout option; a field is given both ways with different values; or a value
            is invalid.

        Examples
        --------
        >>> opts = LayoutOptions.resolve({"cp_size": 2}, cp_rank=1, tp_size=None)
        >>> opts.cp_size, opts.cp_rank, opts.tp_size
        (2, 1, 1)
        """
        return merge_config(cls, options, fields, from_dict=cls.from_dict, name="options", error=LayoutOptionError)
