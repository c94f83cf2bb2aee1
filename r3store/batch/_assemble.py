"""``assemble``: one trainer micro-batch of routes (numpy), laid out like the trainer's tokens."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from r3store._checks import check_id_sequence, resolve_config
from r3store._format import token_hash
from r3store._validate import as_numpy
from r3store.codecs import kernels
from r3store.codecs.kernels import gather_rows
from r3store.errors import AlignmentError, LayoutOptionError, OptionError
from r3store.layout import (
    ROUTE_DTYPES,
    LayoutOptions,
    LayoutOptionsDict,
    LayoutPlan,
    apply_plan,
    check_pad_args,
    pad_ids,
    pad_routes,
    plan_layout,
    route_index,
)
from r3store.reader import RouteReader

__all__ = ["BATCH_KEYS", "PadPolicy", "ROUTE_DTYPES", "RouteDType", "assemble", "packed_bits", "route_dtype"]

BATCH_KEYS = ("routes", "replay_mask", "cu_seqlens", "num_tokens", "sample_ids", "layers", "sp_range", "layout")
"""Keys of every batch (``tokens`` is added when token ids are given, ``policy_version`` when asked for)."""

PadPolicy = Literal["spread", "fill"]
RouteDType = Literal["int32", "int16", "uint8", "auto"] | np.dtype[Any] | type[np.integer[Any]]
_LOOSE = ("pad_policy", "fill_value", "dtype", "packed")
"""Keywords of :func:`assemble` that became fields of ``options`` (deprecated, removed in 0.4.0)."""


def route_dtype(dtype: Any, num_experts: int, *, pad_policy: PadPolicy = "spread", fill_value: int = -1) -> np.dtype:
    """The numpy dtype of assembled routes, checked against the ids it must hold.

    Parameters
    ----------
    dtype : {"int32", "int16", "uint8", "auto"} or numpy dtype
        ``"auto"``: the narrowest of uint8, int16, int32 holding ``0 .. num_experts - 1``
        and, with ``pad_policy="fill"``, ``fill_value`` (spread pad ids are expert ids).
    num_experts : int
    pad_policy : {"spread", "fill"}
    fill_value : int

    Returns
    -------
    numpy.dtype

    Raises
    ------
    r3store.errors.OptionError
        ``dtype`` is not one of :data:`ROUTE_DTYPES` or ``"auto"``, or cannot hold expert
        id ``num_experts - 1``.
    r3store.errors.LayoutOptionError
        ``pad_policy="fill"`` and ``fill_value`` does not fit ``dtype``.

    Examples
    --------
    >>> route_dtype("auto", 128), route_dtype("auto", 128, pad_policy="fill", fill_value=-1)
    (dtype('uint8'), dtype('int16'))
    """
    def holds(dt: np.dtype, value: int) -> bool:
        info = np.iinfo(dt)
        return int(info.min) <= value <= int(info.max)

    def fits(dt: np.dtype) -> bool:
        return holds(dt, num_experts - 1) and (pad_policy != "fill" or holds(dt, fill_value))

    if isinstance(dtype, str) and dtype == "auto":
        for name in ("uint8", "int16", "int32"):
            narrow: np.dtype = np.dtype(name)
            if fits(narrow):
                return narrow
    dt: np.dtype[Any] | None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.name not in ROUTE_DTYPES:
        raise OptionError("dtype", dtype, f"must be one of {', '.join(ROUTE_DTYPES)} or 'auto'")
    if not holds(dt, num_experts - 1):
        raise OptionError("dtype", dtype, f"cannot hold expert id {num_experts - 1} (num_experts={num_experts})")
    if not fits(dt):
        raise LayoutOptionError("fill_value", fill_value, f"pad id does not fit the routes dtype {dt.name}")
    return dt


def packed_bits(bits_per_id: int, pad_policy: PadPolicy = "spread", fill_value: int = -1) -> int:
    """Bits per id of ``assemble(..., packed=True)``: the store's, widened for a fill value.

    Raises
    ------
    r3store.errors.LayoutOptionError
        ``pad_policy="fill"`` with a negative ``fill_value`` (not packable) or one of more
        than 16 bits.
    """
    if pad_policy != "fill":
        return bits_per_id
    if not 0 <= fill_value < 1 << 16:
        raise LayoutOptionError("fill_value", fill_value, "must lie in [0, 2**16) with packed=True (ids are packed "
                                                          "as unsigned bit fields)")
    return max(bits_per_id, int(fill_value).bit_length())


@functools.lru_cache(maxsize=64, typed=True)
def _batch_form(num_experts: int, top_k: int, bits_per_id: int, pad_policy: Any, fill_value: Any, dtype: Any,
                packed: bool, ep_size: int | None) -> tuple[np.dtype, int]:
    """The routes' dtype and packed bits of a batch, after the pad and dtype checks (memoised
    per store shape and options: the checks depend on nothing else, and a failing one is not
    remembered, so it raises again on every call)."""
    check_pad_args(num_experts, pad_policy, fill_value)
    out_dtype = route_dtype("auto" if packed else dtype, num_experts, pad_policy=pad_policy, fill_value=fill_value)
    bits = packed_bits(bits_per_id, pad_policy, fill_value) if packed else 0
    if pad_policy == "spread":  # top_k <= num_experts and ep_size divides num_experts, before any work
        pad_routes(0, 0, top_k, num_experts, ep_size=ep_size)
    return out_dtype, bits


def _check_tokens(reader: RouteReader, sample_ids: Sequence[str], tokens: Sequence[Any]) -> np.ndarray:
    if len(tokens) != len(sample_ids):
        entries = f"{len(tokens)} {'entry' if len(tokens) == 1 else 'entries'}"
        raise AlignmentError(None, f"tokens has {entries} for {len(sample_ids)} sample(s) in sample_ids: give one "
                                   "token-id sequence per sample, in sample_ids order")
    parts = []
    for sid, toks in zip(sample_ids, tokens, strict=True):
        arr = as_numpy(sid, "tokens", toks)
        if arr.ndim == 0 or arr.dtype.kind not in "iu":
            raise AlignmentError(sid, f"tokens must be a sequence of integer token ids, got "
                                      f"{'a scalar' if arr.ndim == 0 else 'dtype ' + str(arr.dtype)} "
                                      f"({type(toks).__name__})")
        arr = arr.reshape(-1)
        row = reader.row(sid)
        if len(arr) - 1 != row["num_rows"]:
            raise AlignmentError(sid, f"len(tokens) - 1 = {len(arr) - 1} but the sample has {row['num_rows']} "
                                      f"route rows (recorded for num_tokens = {row['num_tokens']})")
        stored = row["token_hash"]
        if stored is not None and token_hash(arr) != stored:
            raise AlignmentError(sid, f"token ids do not match the tokens the routes were recorded for "
                                      f"(hash {token_hash(arr)} != stored {stored})")
        parts.append(arr.astype(np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def assemble(
    reader: RouteReader,
    sample_ids: Sequence[str],
    options: LayoutOptions | LayoutOptionsDict | Mapping[str, Any] | None = None,
    *,
    layers: Sequence[int] | None = None,
    tokens: Sequence[Any] | None = None,
    return_policy_version: bool = False,
    allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
    **deprecated: Any,
) -> dict[str, Any]:
    """Read and lay out the routes of ``sample_ids`` as one micro-batch (numpy arrays).

    For trainers that choose their own micro-batches (Miles, verl); the torch layer
    (:class:`r3store.RouteDataset`, ``r3store.dataset.batch_to_tensors``) turns the
    result into tensors.

    Parameters
    ----------
    reader : RouteReader
        The store (a :class:`r3store.RouteStore` is one).
    sample_ids : sequence of str
        The samples, in batch order (not a single str). An id may appear more than once:
        oversampling is legitimate, so a repeat is neither refused nor merged; each
        occurrence is laid out as a sequence of its own holding the sample's routes (and
        ``tokens``, ``policy_version``, missing rows), exactly as a second sample committed
        with the same routes would be, with its own ``cu_seqlens`` entry and ``sample_ids``
        slot. Callers that must not train on a sample twice deduplicate before calling.
    options : LayoutOptions or LayoutOptionsDict, optional
        The layout and the batch's form, passed whole (default ``LayoutOptions()``): how
        the trainer lays out tokens (THD/BSHD/SBHD, CP, TP/SP), the pad rows
        (``pad_policy``, ``fill_value``), the routes' ``dtype`` and whether they are
        ``packed``; see below and :class:`r3store.layout.LayoutOptions`.
    layers : sequence of int, optional
        Global decoder layers to keep (a pipeline stage's MoE layers), each at most once.
    tokens : sequence of int sequences, optional
        Each sample's token ids (one entry per entry of ``sample_ids``, repeats included):
        checked against the stored token hash and ``len(tokens) - 1 == rows``, and laid out
        as ``batch["tokens"]``.
    return_policy_version : bool
        Add ``policy_version``: per row, the policy (weight) version that produced it
        (:meth:`r3store.RouteReader.policy_spans`), laid out like the routes.
    allocate : callable, optional
        ``allocate(shape, dtype)`` returns the writable, C-contiguous, uninitialised
        array ``routes`` is built in (default: the reader's
        :attr:`~r3store.RouteReader.buffer_pool`, memory of released outputs reused, see
        ``ReaderOptions.output_pool_bytes``): e.g. shared memory, so a
        DataLoader worker hands the batch over without copying it (RouteDataset does).
        ``routes`` is then a view of it. Not used with ``options.packed`` (the packed
        bytes are a new array).
    **deprecated
        ``pad_policy``, ``fill_value``, ``dtype``, ``packed``: fields of ``options``
        given as keywords; they warn (:class:`r3store.errors.R3StoreDeprecationWarning`)
        and are removed in r3store 0.4.0.

    ``options.dtype`` is the dtype of ``routes`` (see :func:`route_dtype`): int32
    (default), int16 (verl), uint8, or ``"auto"``, the narrowest of uint8/int16/int32
    holding every expert id and pad id.

    With ``options.packed``, ``routes`` is bit-packed for the trip to the device: uint8
        ``(ceil(n * bits / 8),)``, the ids of the laid-out routes (C order) at ``bits``
        bits each in the stream of the ``r3store.bitpack`` payload (FORMAT.md 5.1), plus
        ``routes_bits`` (``spec.bits_per_id``, more if a fill value needs it) and
        ``routes_shape``; :func:`r3store.dataset.unpack_routes` restores them on any
        device. Host-to-device bytes are ``bits / 32`` of int32's. ``fill_value`` must
        then be >= 0.

    Only this rank's rows are read: the plan names the rows its output positions hold
    (CP and SP slices), and only the frames holding those rows and ``layers`` are fetched
    and decoded (:meth:`r3store.RouteReader.get_runs`); memory is the output plus a
    compact buffer of the rank's rows (same dtype) and one storage object's packed frames.

    Returns
    -------
    dict
        ``routes`` of ``dtype`` ``(T, n_layers, top_k)`` (THD), ``(B, T, n_layers, top_k)``
        (BSHD) or ``(T, B, n_layers, top_k)`` (SBHD); ``replay_mask`` bool ``(T,)`` /
        ``(B, T)`` / ``(T, B)`` (False on pad rows and on rows the engine could not
        capture, which hold pad-row ids); ``cu_seqlens`` int32;
        ``num_tokens`` int32 ``(B,)``; ``sample_ids`` list of str; ``layers`` list of
        global decoder-layer indices; ``sp_range`` (start, end); ``layout`` str,
        ``options.layout`` (``"thd"``, ``"bshd"`` or ``"sbhd"``: how ``routes`` is
        laid out, so a consumer never guesses it from shapes); ``tokens`` int64 laid
        out the same way when ``tokens`` is given (pad positions 0); ``policy_version``
        int64 ``(T,)`` / ``(B, T)`` with ``return_policy_version`` (-1 on pad rows and in
        samples written without a version). See :func:`r3store.layout.plan_layout` for
        ``cu_seqlens`` under CP/TP.

    Raises
    ------
    TypeError
        A plain ``TypeError``, before anything is read: ``reader`` is no
        :class:`~r3store.RouteReader`; ``sample_ids`` is a set (no order), a single str or
        not iterable, or an id is not a str; ``layers`` is not a sequence or holds other
        than ints; a keyword is neither a parameter nor a deprecated field.
    r3store.errors.AlignmentError
        ``tokens`` given and a sample's ``len(tokens) - 1`` differs from its route rows,
        its token hash differs from the stored one, or its ids are not integers; or
        ``tokens`` has another length than ``sample_ids`` (``sample_id`` None).
    r3store.errors.LayoutOptionError
        ``options`` is neither a LayoutOptions, a dict of its fields nor None; an option,
        ``pad_policy`` or ``fill_value`` is invalid, or ``fill_value`` does not fit
        ``dtype`` (an :class:`~r3store.errors.OptionError`); a sample has more tokens than
        ``max_seqlen`` (names it). A name that is no field raises its subclass
        :class:`~r3store.errors.UnknownLayoutOptionError` (also a ``TypeError``).
    r3store.errors.OptionError
        ``sample_ids`` is empty; ``dtype`` is not one of the choices, or cannot hold every expert id; or
        ``allocate`` returned anything but a writable C-contiguous array of the shape
        and dtype asked for.
    r3store.errors.SampleNotFoundError
        (a KeyError) an id is no committed sample (quarantined ones included).
    r3store.errors.LayerError
        (an IndexError) a layer is not an MoE layer of the spec, or is asked for twice.
    r3store.errors.ChecksumError, r3store.errors.FormatError
        A chunk fails its CRC-32C or position tag; a route array document, frame or object
        index is malformed (as :meth:`r3store.RouteReader.get`).
    r3store.errors.UnknownCodecError, r3store.errors.StorageError
        An array's codec is not registered; reading an object failed.
    """
    if not isinstance(reader, RouteReader):
        raise TypeError(f"reader must be a RouteReader (r3store.open_store), got {type(reader).__name__}")
    check_id_sequence(sample_ids)
    opts = resolve_config(LayoutOptions, "assemble", "options", options, deprecated, _LOOSE)
    pad_policy, fill_value, packed = opts.pad_policy, opts.fill_value, opts.packed
    spec = reader.spec
    form = (spec.num_experts, spec.top_k, spec.bits_per_id, pad_policy, fill_value, opts.dtype, packed, opts.ep_size)
    try:
        out_dtype, bits = _batch_form(*form)
    except TypeError as exc:  # an unhashable option: checked without the memo (which raises what it finds)
        if "unhashable" not in str(exc):
            raise
        out_dtype, bits = _batch_form.__wrapped__(*form)
    sample_ids = list(sample_ids)
    if not sample_ids:
        raise OptionError("sample_ids", sample_ids, "is empty: assemble needs at least one sample id")
    positions = tuple(range(spec.num_moe_layers)) if layers is None else spec.layer_positions(layers)
    flat_tokens = _check_tokens(reader, sample_ids, tokens) if tokens is not None else None
    num_tokens = [reader.num_tokens(s) for s in sample_ids]
    if opts.max_seqlen is not None:  # name the sample (the plan only knows batch positions)
        for sid, n in zip(sample_ids, num_tokens, strict=True):
            if n > opts.max_seqlen:
                raise LayoutOptionError("max_seqlen", opts.max_seqlen,
                                        f"sample {sid!r} has {n} tokens, more than max_seqlen={opts.max_seqlen}")
    offsets = np.concatenate([[0], np.cumsum([n - 1 for n in num_tokens])]).astype(np.int64)
    plan = plan_layout(num_tokens, opts)
    missing = [(lo + a, lo + b) for sid, lo in zip(sample_ids, offsets[:-1], strict=True)
               for a, b in reader.missing_rows(sid)]
    pads: dict[str, Any] = {"num_experts": spec.num_experts if pad_policy == "spread" else None,
                            "fill_value": fill_value, "allocate": None if packed else allocate, "ep_size": opts.ep_size}
    planned = _plan_runs(plan) if not missing and opts.layout != "sbhd" else None
    if planned is not None:  # THD, BSHD: the plan's runs of rows, found in C, read straight into place
        replay_mask, runs = planned
        out = _read_runs(reader, sample_ids, runs, replay_mask, list(positions), layers, out_dtype, **pads)
    else:
        ridx = route_index(plan)
        if missing:  # rows the engine could not capture are laid out as pad rows
            dropped = np.zeros(int(offsets[-1]), bool)
            for a, b in missing:
                dropped[a:b] = True
            ridx = np.where((ridx >= 0) & dropped[np.maximum(ridx, 0)], -1, ridx)
        out = _read_rank_rows(reader, sample_ids, offsets, ridx, list(positions), layers, out_dtype, **pads)
        replay_mask = ridx >= 0
    batch: dict[str, Any] = {
        "routes": kernels.pack_bits(out, bits) if packed else out,
        "replay_mask": replay_mask,
        "cu_seqlens": np.array(plan.cu_seqlens, dtype=np.int32),
        "num_tokens": np.array(plan.seqlens, dtype=np.int32),
        "sample_ids": sample_ids,
        "layers": [spec.moe_layers[p] for p in positions],
        "sp_range": tuple(int(v) for v in plan.sp_range),
        "layout": opts.layout,
    }
    if packed:
        batch["routes_bits"], batch["routes_shape"] = bits, tuple(out.shape)
    if flat_tokens is not None:
        batch["tokens"] = apply_plan(plan, flat_tokens, fill_value=0)
    if return_policy_version:
        batch["policy_version"] = _policy_versions(reader, sample_ids, offsets, plan)
    return batch


MAX_RUNS_PER_SAMPLE = 8
"""Runs of rows per sample above which a plan is read through the general path (THD and
BSHD plans have one or two per sample: the CP chunks; SBHD interleaves samples)."""


def _plan_runs(plan: LayoutPlan) -> tuple[np.ndarray, np.ndarray] | None:
    """The replay mask (bool, the plan's shape) and the runs of route rows the plan's positions
    hold (int64 ``(m, 4)``: sample, first row, stop row, first position in C order), in one
    pass of the compiled kernels (:func:`r3store.layout.route_index`, as runs); None without
    the kernels or when the plan cuts its samples into more than a few runs each."""
    native = kernels.native_module()
    if native is None:
        return None
    index = np.ascontiguousarray(plan.index, dtype=np.int64).reshape(-1)
    mask = np.empty(plan.index.shape, dtype=bool)
    runs = np.empty((MAX_RUNS_PER_SAMPLE * plan.num_samples, 4), dtype=np.int64)
    m = native.route_runs(index, plan.token_offsets, mask.reshape(-1), runs)
    return None if m < 0 else (mask, runs[:m])


def _read_runs(reader: RouteReader, sample_ids: list[str], runs: np.ndarray, replay_mask: np.ndarray,
               positions: list[int], layers: Sequence[int] | None, dtype: np.dtype, *, num_experts: int | None,
               fill_value: int, allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
               ep_size: int | None = None) -> np.ndarray:
    """The routes of a plan whose runs (:func:`_plan_runs`) land on runs of output positions:
    each run read in place (:meth:`RouteReader.get_runs`), then the pad rows written."""
    flat = replay_mask.reshape(-1)
    shape = (len(flat), len(positions), reader.spec.top_k)
    out = reader.buffer_pool.empty(shape, dtype) if allocate is None else _allocated(allocate, shape, dtype)
    if len(runs):
        table = runs.tolist()
        reader.get_runs([(sample_ids[s], a, b) for s, a, b, _ in table], layers, out=out, at=[r[3] for r in table])
    pad = np.flatnonzero(~flat)
    if num_experts is None:
        out[pad] = fill_value
    else:
        _write_pads(out, pad, num_experts, ep_size)
    return out.reshape((*replay_mask.shape, len(positions), reader.spec.top_k))


def _read_rank_rows(reader: RouteReader, sample_ids: list[str], offsets: np.ndarray, ridx: np.ndarray,
                    positions: list[int], layers: Sequence[int] | None, dtype: np.dtype,
                    *, num_experts: int | None, fill_value: int,
                    allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray] | None = None,
                    ep_size: int | None = None) -> np.ndarray:
    """The routes of this rank's output positions: only the rows ``ridx`` names are read.

    ``ridx``: per output position a row of the concatenated routes, or -1 (a pad row).
    The rows are cut into runs within one sample (:meth:`RouteReader.get_runs`: only
    their frames are fetched and decoded). When the runs land on runs of output positions
    (THD, BSHD) they are read straight into the output and the pad rows written after;
    otherwise (SBHD: a sample's rows are ``B`` positions apart) into a compact buffer of
    the rank's rows that the row-gather kernel lays out with the pad rows.
    """
    flat = ridx.reshape(-1)
    n_layers, top_k = len(positions), reader.spec.top_k
    where = np.flatnonzero(flat >= 0)
    rows = flat[where]
    if len(rows) > 1 and (rows[1:] < rows[:-1]).any():  # THD and BSHD hand them sorted already
        order = np.argsort(rows, kind="stable")
        rows, where = rows[order], where[order]
    shape = (len(flat), n_layers, top_k)
    out = reader.buffer_pool.empty(shape, dtype) if allocate is None else _allocated(allocate, shape, dtype)
    if len(rows):
        starts_here = np.zeros(int(offsets[-1]) + 1, bool)  # a sample's first row: a run ends before it
        starts_here[offsets[:-1]] = True
        breaks = (np.diff(rows) != 1) | starts_here[rows[1:]]
        direct = (breaks | (np.diff(where) != 1))
        if int(direct.sum()) <= 2 * int(breaks.sum()) + 2:  # output positions follow the rows: read in place
            breaks = direct
        cut = np.flatnonzero(breaks) + 1
        firsts, lasts = np.concatenate(([0], cut)), np.concatenate((cut - 1, [len(rows) - 1]))
        sample = np.searchsorted(offsets, rows[firsts], side="right") - 1
        runs = [(sample_ids[s], int(rows[f]) - int(offsets[s]), int(rows[la]) + 1 - int(offsets[s]))
                for f, la, s in zip(firsts.tolist(), lasts.tolist(), sample.tolist(), strict=True)]
        if breaks is direct:
            reader.get_runs(runs, layers, out=out, at=where[firsts].tolist())
        else:
            compact = reader.buffer_pool.empty((len(rows), n_layers, top_k), dtype)
            reader.get_runs(runs, layers, out=compact)
            local = np.full(len(flat), -1, dtype=np.int64)
            local[where] = np.arange(len(rows))
            if num_experts is not None and ep_size is not None:  # the kernel spreads over experts, not EP ranks
                gather_rows(compact, local, out, fill_value=0)
                _write_pads(out, np.flatnonzero(flat < 0), num_experts, ep_size)
            else:
                gather_rows(compact, local, out, fill_value=fill_value, num_experts=num_experts)
            return out.reshape((*ridx.shape, n_layers, top_k))
    pad = np.flatnonzero(flat < 0)
    if num_experts is None:
        out[pad] = fill_value
    else:
        _write_pads(out, pad, num_experts, ep_size)
    return out.reshape((*ridx.shape, n_layers, top_k))


def _write_pads(out: np.ndarray, pad: np.ndarray, num_experts: int, ep_size: int | None) -> None:
    """Write pad_routes' ids at rows ``pad`` of ``out``, numbered in output order; the same row in every layer."""
    if len(pad):
        out[pad] = pad_ids(len(pad), out.shape[2], num_experts, ep_size)[:, None, :].astype(out.dtype)


def _allocated(allocate: Callable[[tuple[int, ...], np.dtype], np.ndarray], shape: tuple[int, ...],
               dtype: np.dtype) -> np.ndarray:
    """``allocate(shape, dtype)``, checked: it must be a writable C-contiguous array of that shape and dtype."""
    out = allocate(shape, dtype)
    if (not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype
            or not out.flags.c_contiguous or not out.flags.writeable):
        got = f"{out.dtype}{out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
        raise OptionError("allocate", got,
                          f"must return a writable C-contiguous {np.dtype(dtype)} array of shape {shape}")
    return out


def _policy_versions(reader: RouteReader, sample_ids: list[str], offsets: np.ndarray,
                     plan: LayoutPlan) -> np.ndarray:
    """Per output row, the policy version of the route there (-1: a pad row, or no version)."""
    versions = np.full(int(offsets[-1]), -1, dtype=np.int64)
    for sid, lo in zip(sample_ids, offsets[:-1], strict=True):
        for a, b, v in reader.policy_spans(sid):
            versions[lo + a : lo + b] = v
    ridx = route_index(plan)
    return np.where(ridx >= 0, versions[np.maximum(ridx, 0)] if len(versions) else -1, -1)
