"""`RouteDataset`: stream laid-out route batches to a training loop (the torch layer)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from r3store._batch import build_batch
from r3store._reader import RouteStore, open_store
from r3store._checks import parse_int
from r3store.errors import AlignmentError, OptionError, ResumeError
from r3store.layout import LayoutOptions, LayoutPlan, check_pad_args
from r3store.storage import Backend

__all__ = ["RouteDataset", "apply_plan_tensor", "batch_to_tensors", "plan_batches", "to_device"]

STATE_FORMAT = "r3store.RouteDataset"
STATE_VERSION = 1


def batch_to_tensors(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Convert a numpy batch to CPU torch tensors (zero-copy where possible).

    ``routes`` int32, ``replay_mask`` bool, ``cu_seqlens`` int32, ``num_tokens`` int32
    and ``tokens`` int64 become tensors; ``sample_ids``, ``layers`` and ``sp_range``
    stay Python lists/tuples.
    """
    return {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def apply_plan_tensor(plan: LayoutPlan, values: torch.Tensor, *, fill_value: float | int | bool = 0) -> torch.Tensor:
    """Lay out a per-token tensor by ``plan``, on the tensor's own device (CPU or GPU).

    The torch twin of :func:`r3store.layout.apply_plan`, so token ids, position ids and
    loss masks already on the GPU land exactly where the routes of the same plan do.

    Parameters
    ----------
    plan : r3store.layout.LayoutPlan
    values : torch.Tensor, shape (sum(num_tokens), ...)
        One entry per token, samples concatenated in plan order.
    fill_value : scalar
        Value at padding positions.

    Returns
    -------
    torch.Tensor, shape (T_local, ...) (THD) or (B, T_local, ...) (BSHD), same dtype and device

    Raises
    ------
    r3store.errors.AlignmentError
        ``values`` does not have one entry per token of the plan.
    """
    if values.dim() == 0 or values.shape[0] != plan.total_tokens:
        got = values.shape[0] if values.dim() else "a scalar"
        raise AlignmentError("<batch>", f"values have {got} rows but the plan covers {plan.total_tokens} tokens")
    index = torch.as_tensor(np.array(plan.index), device=values.device)  # plan arrays are read-only
    keep = index >= 0
    out = values.new_full(tuple(index.shape) + tuple(values.shape[1:]), fill_value)
    out[keep] = values[index[keep]]
    return out


def to_device(batch: Mapping[str, Any], device: torch.device | str, *, non_blocking: bool = True) -> dict[str, Any]:
    """Move every tensor of a batch to ``device`` (``non_blocking`` copies from pinned memory).

    Use with ``DataLoader(..., pin_memory=True)`` so host-to-device copies overlap compute.
    """
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def plan_batches(num_tokens: Sequence[int] | np.ndarray, max_tokens_per_batch: int, *,
                 shuffle: bool, seed: int, epoch: int, num_replicas: int = 1) -> list[np.ndarray]:
    """Greedy token-budget batches over the store's samples, as many per replica.

    Parameters
    ----------
    num_tokens : sequence of int, shape (num_samples,)
        Tokens per sample, in store order.
    max_tokens_per_batch : int
        Budget on the sum of ``num_tokens`` in a batch (before CP/TP padding). A sample
        longer than the budget forms a batch of its own; none is split or dropped.
    shuffle, seed, epoch
        With ``shuffle``, samples are permuted by ``numpy.random.default_rng([seed, epoch])``.
    num_replicas : int
        Data-parallel ranks the batches are dealt to (batch ``j`` to rank
        ``j % num_replicas``). While the batch count is not a multiple of it, the batch
        with the most tokens among those holding two or more samples is cut in two, so
        every rank gets the same number of batches (synchronous DP would hang otherwise)
        and still every sample exactly once. Splitting stops at one sample per batch: if
        the store holds fewer samples than the next multiple of ``num_replicas``, the last
        ranks get one batch fewer (each rank's ``len(dataset)`` says how many).

    Returns
    -------
    list of ndarray of int64
        Sample positions of each batch, in global batch order.
    """
    n = len(num_tokens)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    batches: list[np.ndarray] = []
    current: list[int] = []
    used = 0
    for i in order:
        size = int(num_tokens[i])
        if current and used + size > max_tokens_per_batch:
            batches.append(np.array(current, dtype=np.int64))
            current, used = [], 0
        current.append(int(i))
        used += size
    if current:
        batches.append(np.array(current, dtype=np.int64))
    return _even_out(batches, np.asarray(num_tokens), num_replicas)


def _even_out(batches: list[np.ndarray], num_tokens: np.ndarray, num_replicas: int) -> list[np.ndarray]:
    """Split batches until their count is a multiple of ``num_replicas`` (when samples allow)."""
    while len(batches) % num_replicas:
        splittable = [j for j, b in enumerate(batches) if len(b) > 1]
        if not splittable:
            break
        j = max(splittable, key=lambda k: (int(num_tokens[batches[k]].sum()), -k))
        batch = batches[j]
        cut = int(np.searchsorted(np.cumsum(num_tokens[batch]), num_tokens[batch].sum() / 2))
        cut = min(max(cut, 1), len(batch) - 1)
        batches[j : j + 1] = [batch[:cut], batch[cut:]]
    return batches


class RouteDataset(IterableDataset[dict[str, Any]]):
    """Stream packed route batches laid out exactly like the trainer's tokens.

    Yields one batch per step (use ``DataLoader(ds, batch_size=None, ...)``): a dict with
    ``routes`` int32 tensor ``(total_tokens, n_layers, top_k)`` (THD) or
    ``(B, T, n_layers, top_k)`` (BSHD), ``cu_seqlens`` int32 ``(B + 1,)`` (``B + 2`` when
    TP padding adds a final padding segment), ``replay_mask`` bool (False on pad rows:
    each sample's last token, CP and TP padding), ``num_tokens`` int32 ``(B,)``,
    ``sample_ids`` list of str, ``layers`` (global decoder-layer indices) and
    ``sp_range``. Each sample contributes ``num_tokens`` rows: its ``num_tokens - 1``
    recorded rows plus one pad row. Pad rows hold distinct, in-range ids spread over all
    experts (``pad_policy="spread"``) so no expert gets more than
    ``ceil(pad_rows * top_k / num_experts) + 1`` pad tokens per layer.

    Batches are formed over the whole store (greedy token budget, in store order or a
    ``(seed, epoch)`` shuffle; batches are split until their count is a multiple of
    ``world_size``, so every rank steps the same number of times), then dealt
    round-robin: global batch ``j`` goes to data parallel rank ``j % world_size``; within a rank, DataLoader worker ``w`` of ``W``
    builds the rank's batches ``w, w + W, ...``, which the DataLoader yields in order. So
    every sample is yielded exactly once per epoch across ranks and workers, and the
    sequence a rank sees does not depend on the number of workers.

    Parameters
    ----------
    url : str, os.PathLike, Backend or RouteStore
        The store.
    max_tokens_per_batch : int
        Token budget per batch (see :func:`plan_batches`).
    layers : sequence of int, optional
        Global decoder layers to stream (a pipeline stage's MoE layers).
    shuffle : bool
    seed : int
    rank, world_size : int, optional
        Data-parallel rank and size. ``None`` reads them from ``torch.distributed`` when
        it is initialised (global rank/world: pass the DP rank and size explicitly when
        TP/CP/PP ranks must receive the same batches), else 0 and 1.
    storage_options : mapping, optional
        Passed to fsspec.
    cache_dir : str or os.PathLike, optional
        Local read-through cache of a remote store's route and index objects: the first
        epoch downloads each object once, later epochs read the local copies (see
        :class:`r3store.storage.CachingBackend`). DataLoader workers may share it.
    on_duplicate : {"raise", "first"}
        A sample id committed twice (e.g. a retried rollout written by two workers):
        raise, or stream the earliest valid commit (see :func:`r3store.open_store`).
    layout, cp_size, cp_rank, cp_mode, tp_size, tp_rank, pad_multiple, sequence_parallel, max_seqlen
        Trainer layout, see :meth:`r3store.RouteStore.assemble`.
    pad_policy : {"spread", "fill"}
    fill_value : int
        Pad id with ``pad_policy="fill"``.

    Raises
    ------
    r3store.errors.NotAStoreError, r3store.errors.LayerError
    r3store.errors.LayoutOptionError
        A layout option, ``pad_policy`` or ``fill_value`` is invalid.
    ValueError
        ``max_tokens_per_batch`` < 1, ``seed`` < 0 (or not an int), or
        ``rank``/``world_size`` out of range.

    Notes
    -----
    Resumable: :meth:`state_dict` / :meth:`load_state_dict` hold only JSON values and
    satisfy torchdata's ``Stateful`` protocol, so ``StatefulDataLoader`` resumes exactly at
    the first batch not yet consumed. With ``num_workers > 0`` the progress lives in the
    worker processes: use ``StatefulDataLoader.state_dict()``; the dataset object in the
    main process only knows its own (0-worker) iteration.

    Batches carry routes, not tokens: the trainer takes its token ids for
    ``batch["sample_ids"]`` and lays them out with the same options (or calls
    :func:`r3store.dataset.apply_plan_tensor`); :meth:`r3store.RouteStore.assemble`
    with ``tokens=`` also checks them against the stored token hash.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Backend | RouteStore,
        max_tokens_per_batch: int = 65536,
        layers: Sequence[int] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        on_duplicate: Literal["raise", "first"] = "raise",
        layout: Literal["thd", "bshd"] = "thd",
        cp_size: int = 1,
        cp_rank: int = 0,
        cp_mode: Literal["zigzag", "contiguous"] = "zigzag",
        tp_size: int = 1,
        tp_rank: int = 0,
        pad_multiple: int = 1,
        sequence_parallel: bool = False,
        max_seqlen: int | None = None,
        pad_policy: Literal["spread", "fill"] = "spread",
        fill_value: int = -1,
    ) -> None:
        super().__init__()
        max_tokens_per_batch = parse_int("max_tokens_per_batch", max_tokens_per_batch, minimum=1)
        self.store = url if isinstance(url, RouteStore) else open_store(
            url, storage_options=storage_options, cache_dir=cache_dir, on_duplicate=on_duplicate)
        self.store.spec.layer_positions(layers)  # fail early on a bad layer
        self.layers = None if layers is None else [int(v) for v in layers]
        self.options = LayoutOptions(layout=layout, cp_size=cp_size, cp_rank=cp_rank, cp_mode=cp_mode,
                                     tp_size=tp_size, tp_rank=tp_rank, pad_multiple=pad_multiple,
                                     sequence_parallel=sequence_parallel, max_seqlen=max_seqlen)
        check_pad_args(self.store.spec.num_experts, pad_policy, fill_value)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.shuffle = bool(shuffle)
        self.seed = _non_negative("seed", seed)
        self.pad_policy = pad_policy
        self.fill_value = fill_value
        self._rank, self._world_size = rank, world_size
        if world_size is not None or rank is not None:
            self._topology()
        self.sample_ids = self.store.sample_ids
        self._num_tokens = np.array([self.store.num_tokens(s) for s in self.sample_ids], dtype=np.int64)
        self._fingerprint = sample_fingerprint(self.sample_ids)
        self.epoch = 0
        self._resume_at = 0
        self._yielded = 0

    def _topology(self) -> tuple[int, int]:
        rank, world = self._rank, self._world_size
        if rank is None and world is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if rank is None and world is not None and world > 1:
            raise OptionError("world_size", world, "needs an explicit rank (torch.distributed is not initialised)")
        rank = 0 if rank is None else rank
        world = 1 if world is None else world
        world = parse_int("world_size", world, minimum=1)
        rank = parse_int("rank", rank, minimum=0, maximum=world - 1)
        return rank, world

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the shuffle order) for the next iteration; restarts it.

        Raises
        ------
        ValueError
            ``epoch`` is not an int >= 0.
        """
        self.epoch = _non_negative("epoch", epoch)
        self._resume_at = 0
        self._yielded = 0

    def rank_batches(self) -> list[np.ndarray]:
        """Sample positions of the batches this data-parallel rank gets this epoch."""
        rank, world = self._topology()
        batches = plan_batches(self._num_tokens, self.max_tokens_per_batch, shuffle=self.shuffle,
                               seed=self.seed, epoch=self.epoch, num_replicas=world)
        return batches[rank::world]

    def __len__(self) -> int:
        """Batches this rank yields per epoch (over all DataLoader workers)."""
        return len(self.rank_batches())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = self.rank_batches()[worker::num_workers]
        start = self._resume_at
        self._resume_at = 0
        self._yielded = start
        for positions in mine[start:]:
            ids = [self.sample_ids[i] for i in positions]
            batch = build_batch(self.store, ids, self.options, layers=self.layers,
                                pad_policy=self.pad_policy, fill_value=self.fill_value)
            self._yielded += 1
            yield batch_to_tensors(batch)

    def state_dict(self) -> dict[str, Any]:
        """Resumption state (JSON values only): epoch, batches yielded, seed, topology, and
        the store's sample ids (count and :func:`sample_fingerprint`)."""
        rank, world = self._topology()
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch, "yielded": self._yielded,
                "seed": self.seed, "shuffle": self.shuffle, "rank": rank, "world_size": world,
                "max_tokens_per_batch": self.max_tokens_per_batch, "num_samples": len(self.sample_ids),
                "samples": self._fingerprint}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume: the next iteration skips the batches already yielded.

        Raises
        ------
        r3store.errors.ResumeError
            The state is of another format/version; was saved under another topology,
            seed, batch budget or store (sample count, or sample ids: states saved before
            the ``samples`` fingerprint existed are checked by count only); or its
            ``epoch`` or ``yielded`` is not an int >= 0.
        """
        if state_dict.get("format") != STATE_FORMAT or state_dict.get("version") != STATE_VERSION:
            raise ResumeError("format", state_dict.get("format"), f"{STATE_FORMAT} v{STATE_VERSION}")
        now = self.state_dict()
        keys = ["seed", "shuffle", "rank", "world_size", "max_tokens_per_batch", "num_samples"]
        for key in keys + (["samples"] if "samples" in state_dict else []):
            if state_dict.get(key) != now[key]:
                raise ResumeError(key, state_dict.get(key), now[key])
        for key in ("epoch", "yielded"):
            value = state_dict.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ResumeError(key, value, "an int >= 0")
        self.epoch = state_dict["epoch"]
        self._resume_at = self._yielded = state_dict["yielded"]


def sample_fingerprint(sample_ids: Sequence[str]) -> str:
    """Hex BLAKE2b-128 of the sample ids joined by NUL: tells two stores of equal size apart."""
    joined = "\0".join(sample_ids).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(joined, digest_size=16).hexdigest()


def _non_negative(name: str, value: Any) -> int:
    """``value`` as an int >= 0 (numpy ints too, not bools), or OptionError."""
    return parse_int(name, value, minimum=0)
