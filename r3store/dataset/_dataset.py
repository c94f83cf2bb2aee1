"""`RouteDataset`: stream laid-out route batches to a training loop (the torch layer)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import IterableDataset, get_worker_info

from r3store._checks import is_int, parse_int, resolve_config
from r3store._deprecated import renamed_keyword, renamed_property
from r3store.batch import assemble, packed_bits, route_dtype
from r3store.dataset._batches import plan_batches, sample_fingerprint
from r3store.dataset._tensors import SharedAllocator, batch_to_tensors
from r3store.dataset._topology import Topology
from r3store.errors import OptionError, ResumeError
from r3store.layout import LayoutOptions, LayoutOptionsDict, check_pad_args
from r3store.reader import ReaderOptions, ReaderOptionsDict, RouteReader
from r3store.storage import Backend

__all__ = ["RouteDataset"]

_READER_LOOSE = ("cache_dir", "on_duplicate", "filter")
"""Reader keywords ``RouteDataset`` took before ``reader=`` (deprecated, removed in 0.4.0)."""
STATE_FORMAT = "r3store.RouteDataset"
STATE_VERSION = 2
"""Version 2 names the DP rank and size ``dp_rank``/``dp_size`` (version 1: ``rank``/``world_size``).
States may carry ``commits`` (the epoch's sample set, :func:`commit_marks`) and ``finished``."""
_SEQ = re.compile(r"(.+)-(\d+)")


def commit_marks(commits: Sequence[str]) -> dict[str, Any]:
    """A compact, exact description of a set of commits: for names ``<writer_id>-<seq>``, each
    writer's highest ``seq`` (a writer commits its ``seq`` in order, so the set is every commit of
    that writer up to it); other names listed.

    Examples
    --------
    >>> commit_marks(["w1-00000", "w1-00001", "w2-00000", "odd"])
    {'writers': {'w1': 1, 'w2': 0}, 'others': ['odd']}
    """
    writers: dict[str, int] = {}
    others = []
    for name in commits:
        match = _SEQ.fullmatch(name)
        if match is None:
            others.append(name)
        else:
            writers[match.group(1)] = max(writers.get(match.group(1), -1), int(match.group(2)))
    return {"writers": dict(sorted(writers.items())), "others": sorted(others)}


def _marked(commits: Sequence[str], marks: Mapping[str, Any]) -> list[str]:
    """The commits of ``commits`` that ``marks`` (:func:`commit_marks`) includes."""
    writers, others = marks["writers"], set(marks["others"])
    out = []
    for name in commits:
        match = _SEQ.fullmatch(name)
        if (match is None and name in others) or \
                (match is not None and int(match.group(2)) <= writers.get(match.group(1), -1)):
            out.append(name)
    return out


class RouteDataset(IterableDataset[dict[str, Any]]):
    """Stream packed route batches laid out exactly like the trainer's tokens.

    Yields one batch per step (use ``DataLoader(ds, batch_size=None, ...)``): a dict with
    ``routes`` int32 tensor ``(total_tokens, n_layers, top_k)`` (THD) or
    ``(B, T, n_layers, top_k)`` (BSHD), ``cu_seqlens`` int32 ``(B + 1,)`` (``B + 2`` when
    TP padding adds a final padding segment), ``replay_mask`` bool (False on pad rows:
    each sample's last token, CP and TP padding, and rows the engine could not capture,
    which hold pad-row ids), ``num_tokens`` int32 ``(B,)``,
    ``sample_ids`` list of str, ``layers`` (global decoder-layer indices) and
    ``sp_range``. Each sample contributes ``num_tokens`` rows: its ``num_tokens - 1``
    recorded rows plus one pad row. Pad rows hold distinct, in-range ids spread over all
    experts (``pad_policy="spread"``) so no expert gets more than
    ``ceil(pad_rows * top_k / num_experts) + 1`` pad tokens per layer.

    Batches are formed over the whole store (greedy token budget, in store order or a
    ``(seed, epoch)`` shuffle; batches are split until their count is a multiple of
    ``dp_size``, so every rank steps the same number of times), then dealt round-robin:
    global batch ``j`` goes to data-parallel rank ``j % dp_size``; within a rank,
    DataLoader worker ``w`` of ``W``
    builds the rank's batches ``w, w + W, ...``, which the DataLoader yields in order. So
    every sample is yielded exactly once per epoch across ranks and workers (no batch holds
    an id twice; to oversample, pass repeated ids to :meth:`r3store.RouteStore.assemble`), and
    the sequence a rank sees does not depend on the number of workers.

    Parameters
    ----------
    url : str, os.PathLike, Backend or RouteReader
        The store (a :class:`r3store.RouteStore` is a RouteReader).
    max_tokens_per_batch : int
        Token budget per batch (see :func:`plan_batches`).
    layers : sequence of int, optional
        Global decoder layers to stream (a pipeline stage's MoE layers).
    shuffle : bool
    seed : int
    dp_rank, dp_size : int, optional
        Data-parallel rank and size. ``None`` reads them from ``torch.distributed`` when
        it is initialised (global rank/world: pass the DP rank and size explicitly when
        TP/CP/PP ranks must receive the same batches), else 0 and 1 (see
        :class:`r3store.dataset.Topology`).
    options : LayoutOptions or LayoutOptionsDict, optional
        The trainer's layout and the batches' form passed whole (see
        :class:`r3store.layout.LayoutOptions` and :meth:`r3store.RouteStore.assemble`):
        THD/BSHD/SBHD, CP and TP/SP splits, the pad rows (``pad_policy``,
        ``fill_value``), the routes' ``dtype`` (int32, int16, uint8 or ``"auto"``: checked
        against the store's expert count here) and ``packed`` (``routes`` bit-packed uint8
        with ``routes_bits`` and ``routes_shape``, restored on the device by
        :func:`r3store.dataset.unpack_routes`). Each batch reads and allocates only this
        rank's rows (CP/SP slice) and ``layers``.
    reader : ReaderOptions or ReaderOptionsDict, optional
        How the dataset opens the store from a URL (see :func:`r3store.open_store`), e.g.
        ``cache_dir`` (a local read-through cache: the first epoch downloads each object
        once, later epochs read the local copies; DataLoader workers may share it),
        ``on_duplicate="first"`` (stream the earliest valid commit of a sample id
        committed twice), ``filter`` (stream only the samples it selects, e.g.
        ``pc.field("step") == 7``). Only with a URL (an opened reader has its options).
    storage_options : mapping, optional
        Passed to fsspec (only with a URL).
    return_policy_version : bool
        Add ``policy_version`` to every batch: int64 per row, laid out like the routes,
        the policy (weight) version that produced it (-1 on pad rows and for samples
        written without one); see :meth:`r3store.RouteStore.assemble`.
    refresh_on_epoch : bool
        :meth:`set_epoch` first picks up the commits made since (:meth:`refresh`), so a
        growing store's new samples join each new epoch.
    **deprecated
        Loose keywords kept for one release, each warning with
        :class:`r3store.errors.R3StoreDeprecationWarning` (removed in 0.4.0): the fields
        of ``options`` (``layout``, ``cp_size``, ..., ``pad_policy``, ``fill_value``,
        ``dtype``, ``packed``) and of ``reader`` (``cache_dir``, ``on_duplicate``,
        ``filter``) given one by one and merged into them (``None``: not given), and
        ``rank``/``world_size``, the old names of ``dp_rank``/``dp_size``.

    Raises
    ------
    r3store.errors.NotAStoreError, r3store.errors.LayerError
    r3store.errors.LayoutOptionError
        A layout option, ``pad_policy`` or ``fill_value`` is invalid, or a layout field
        is given in ``options`` and as a keyword with different values.
    r3store.errors.OptionError
        ``max_tokens_per_batch`` < 1, ``seed`` < 0 (or not an int),
        ``dp_rank``/``dp_size`` out of range, ``dtype`` too narrow for the expert ids
        or ``fill_value``, a reader option invalid, or ``reader``/``storage_options``
        given with an opened reader.
    TypeError
        A keyword is neither a parameter nor a deprecated alias.

    Notes
    -----
    Resumable: :meth:`state_dict` / :meth:`load_state_dict` hold only JSON values and
    satisfy torchdata's ``Stateful`` protocol, so ``StatefulDataLoader`` resumes exactly at
    the first batch not yet consumed.

    Growing stores: each epoch's sample set is fixed when the epoch starts (at
    construction and at :meth:`set_epoch`): the samples of the commits the reader knew
    then. :meth:`refresh` (or ``refresh_on_epoch=True``) picks up new commits, which join
    at the next :meth:`set_epoch`. The state records the epoch's commits compactly (each
    writer's last commit, :func:`commit_marks`), so a run resumed after writers added
    samples yields exactly the remaining batches of the interrupted epoch. A state taken
    at the very end of an epoch holds no progress: loading it keeps the epoch chosen with
    :meth:`set_epoch` and starts it at its first batch (as with ``num_workers > 0``).

    With ``num_workers > 0`` the progress lives in the worker processes: use
    ``StatefulDataLoader.state_dict()``; the dataset object in the main process only
    knows its own (0-worker) iteration.

    In a DataLoader worker, ``routes`` is built in torch shared memory (torch's sharing
    strategy), so the batch reaches the main process without the copy torch makes of a
    tensor in private memory; the batches are the same as with 0 workers.

    Batches carry routes, not tokens: the trainer takes its token ids for
    ``batch["sample_ids"]`` and lays them out with the same options (or calls
    :func:`r3store.dataset.apply_plan_tensor`); :meth:`r3store.RouteStore.assemble`
    (or :func:`r3store.batch.assemble`) with ``tokens=`` also checks them against the
    stored token hash.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Backend | RouteReader,
        max_tokens_per_batch: int = 65536,
        layers: Sequence[int] | None = None,
        shuffle: bool = False,
        seed: int = 0,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        *,
        options: LayoutOptions | LayoutOptionsDict | Mapping[str, Any] | None = None,
        reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | None = None,
        return_policy_version: bool = False,
        refresh_on_epoch: bool = False,
        **deprecated: Any,
    ) -> None:
        super().__init__()
        rank, world_size = deprecated.pop("rank", None), deprecated.pop("world_size", None)
        loose_layout = {k: deprecated.pop(k) for k in LayoutOptions.LOOSE_KEYWORDS if k in deprecated}
        loose_reader = {k: deprecated.pop(k) for k in _READER_LOOSE if k in deprecated}
        if deprecated:
            raise TypeError(f"RouteDataset() got an unexpected keyword argument {next(iter(deprecated))!r}")
        self.options = resolve_config(LayoutOptions, "RouteDataset", "options", options, loose_layout)
        opened = resolve_config(ReaderOptions, "RouteDataset", "reader", reader, loose_reader, _READER_LOOSE)
        self.max_tokens_per_batch = parse_int("max_tokens_per_batch", max_tokens_per_batch, minimum=1)
        if isinstance(url, RouteReader):
            if reader is not None or any(v is not None for v in loose_reader.values()) or storage_options is not None:
                raise OptionError("reader", opened, "applies when the dataset opens the store: pass a URL, or "
                                                    "open the store with it (r3store.open_store(url, reader=...))")
            self.reader = url
        else:
            self.reader = RouteReader.open(url, reader=opened, storage_options=storage_options)
        self.refresh_on_epoch = bool(refresh_on_epoch)
        self.reader.spec.layer_positions(layers)  # fail early on a bad layer
        self.layers = None if layers is None else [int(v) for v in layers]
        opts = self.options
        check_pad_args(self.reader.spec.num_experts, opts.pad_policy, opts.fill_value)
        self.dtype = route_dtype(opts.dtype, self.reader.spec.num_experts, pad_policy=opts.pad_policy,
                                 fill_value=opts.fill_value)
        if opts.packed:
            packed_bits(self.reader.spec.bits_per_id, opts.pad_policy, opts.fill_value)  # fail early
        self.shuffle = bool(shuffle)
        self.seed = parse_int("seed", seed, minimum=0)
        self.return_policy_version = bool(return_policy_version)
        self._dp_rank = renamed_keyword("RouteDataset", "rank", "dp_rank", rank, dp_rank)
        self._dp_size = renamed_keyword("RouteDataset", "world_size", "dp_size", world_size, dp_size)
        if self._dp_rank is not None or self._dp_size is not None:
            self.topology()
        self.epoch = 0
        self._resume_at = 0
        self._yielded = 0
        self._epoch_batches: int | None = None
        self._fix_epoch_set(commit_marks(self.reader.commits))

    store = renamed_property("store", "reader")

    @property
    def packed(self) -> bool:
        """Whether batches carry ``routes`` bit-packed (``options.packed``)."""
        return self.options.packed

    @property
    def pad_policy(self) -> str:
        """``options.pad_policy``."""
        return self.options.pad_policy

    @property
    def fill_value(self) -> int:
        """``options.fill_value``."""
        return self.options.fill_value

    @property
    def _batch_options(self) -> LayoutOptions:
        """``options`` with ``dtype`` resolved against the store (``"auto"``: the narrowest)."""
        return dataclasses.replace(self.options, dtype=self.dtype.name)

    def topology(self) -> Topology:
        """This process's data-parallel rank and size and DataLoader worker, detected now.

        Raises
        ------
        r3store.errors.OptionError
            See :meth:`Topology.detect`.
        """
        return Topology.detect(self._dp_rank, self._dp_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (the shuffle order) for the next iteration; restarts it.

        Raises
        ------
        r3store.errors.OptionError
            ``epoch`` is not an int >= 0.
        """
        self.epoch = parse_int("epoch", epoch, minimum=0)
        self._resume_at = 0
        self._yielded = 0
        self._epoch_batches = None
        if self.refresh_on_epoch:
            self.reader.refresh()
        self._fix_epoch_set(commit_marks(self.reader.commits))

    def refresh(self) -> int:
        """Pick up the commits made since the store was opened (:meth:`r3store.RouteReader.refresh`);
        their samples join at the next :meth:`set_epoch` (the current epoch's set stays fixed).

        Returns
        -------
        int
            Samples added to the store (not yet to the current epoch).
        """
        return self.reader.refresh()

    def _fix_epoch_set(self, marks: Mapping[str, Any]) -> None:
        """Fix the epoch's samples: those of the commits ``marks`` includes, in store order."""
        commits = _marked(self.reader.commits, marks)
        samples = self.reader.samples.select(["sample_id", "commit", "quarantined", "num_tokens"])
        keep = pc.and_(pc.invert(samples.column("quarantined")),
                       pc.is_in(samples.column("commit"), value_set=pa.array(commits, pa.string())))
        chosen = samples.filter(keep)
        self._marks = dict(marks)
        self.sample_ids: list[str] = chosen.column("sample_id").to_pylist()
        self._num_tokens = np.asarray(chosen.column("num_tokens").to_numpy(), dtype=np.int64)
        self._fingerprint = sample_fingerprint(self.sample_ids)

    def rank_batches(self, topology: Topology | None = None) -> list[np.ndarray]:
        """Sample positions of the batches this data-parallel rank gets this epoch."""
        top = topology or self.topology()
        batches = plan_batches(self._num_tokens, self.max_tokens_per_batch, shuffle=self.shuffle,
                               seed=self.seed, epoch=self.epoch, dp_size=top.dp_size)
        return batches[top.dp_rank :: top.dp_size]

    def __len__(self) -> int:
        """Batches this rank yields per epoch (over all DataLoader workers)."""
        return len(self.rank_batches())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        top = self.topology()
        mine = self.rank_batches(top)[top.worker :: top.num_workers]
        start = self._resume_at
        self._resume_at = 0
        self._yielded = start
        self._epoch_batches = len(mine)
        shared = get_worker_info() is not None  # a DataLoader worker: build routes in shared memory
        for positions in mine[start:]:
            ids = [self.sample_ids[i] for i in positions]
            self.reader.prefetch(ids)  # the batch's commits' metadata in one concurrent round
            allocate = SharedAllocator() if shared and not self.options.packed else None
            batch = assemble(self.reader, ids, self._batch_options, layers=self.layers,
                             return_policy_version=self.return_policy_version, allocate=allocate)
            tensors = batch_to_tensors(batch)
            routes = allocate.tensor_of(batch["routes"]) if allocate is not None else None
            if routes is not None:
                tensors["routes"] = routes
            self._yielded += 1
            yield tensors

    def state_dict(self) -> dict[str, Any]:
        """Resumption state (JSON values only): epoch, batches yielded (and whether that was the
        whole epoch), seed, DP topology, the epoch's commits (:func:`commit_marks`: one entry per
        writer) and its sample ids (count and fingerprint)."""
        top = self.topology()
        finished = self._epoch_batches is not None and self._yielded >= self._epoch_batches
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch, "yielded": self._yielded,
                "finished": finished, "seed": self.seed, "shuffle": self.shuffle, "dp_rank": top.dp_rank,
                "dp_size": top.dp_size, "max_tokens_per_batch": self.max_tokens_per_batch,
                "num_samples": len(self.sample_ids), "samples": self._fingerprint, "commits": self._marks}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume: the next iteration skips the batches already yielded.

        The epoch's sample set is restored from the state's ``commits`` (the store may have
        grown since: the samples of later commits wait for the next epoch; the reader is
        refreshed once if it does not know a commit of the state yet). A state taken at
        the very end of an epoch (``finished``) restores no progress: the epoch chosen with
        :meth:`set_epoch` starts at its first batch. States of version 1 (``rank``/``world_size``
        for the DP rank and size) and states without ``commits`` (the whole store) load too.

        Raises
        ------
        r3store.errors.ResumeError
            The state is of another format/version; was saved under another topology,
            seed, batch budget or store (sample count, or sample ids: states saved before
            the ``samples`` fingerprint existed are checked by count only); or its
            ``epoch`` or ``yielded`` is not an int >= 0.
        """
        version = state_dict.get("version")
        if state_dict.get("format") != STATE_FORMAT or version not in (1, STATE_VERSION):
            raise ResumeError("format", state_dict.get("format"), f"{STATE_FORMAT} v{STATE_VERSION}")
        state = dict(state_dict)
        if version == 1:
            state["dp_rank"], state["dp_size"] = state.pop("rank", None), state.pop("world_size", None)
        now = self.state_dict()
        for key in ("seed", "shuffle", "dp_rank", "dp_size", "max_tokens_per_batch"):
            if state.get(key) != now[key]:
                raise ResumeError(key, state.get(key), now[key])
        for key in ("epoch", "yielded"):
            value = state.get(key)
            if not is_int(value) or value < 0:
                raise ResumeError(key, value, "an int >= 0")
        if state.get("finished") is True:
            self._resume_at = self._yielded = 0  # nothing left of that epoch: keep this one, from its start
            self._epoch_batches = None
            return
        marks = self._marks_of(state.get("commits"))
        previous = self._marks, self.sample_ids, self._num_tokens, self._fingerprint
        self._fix_epoch_set(marks)
        got = {"num_samples": len(self.sample_ids), "samples": self._fingerprint}
        for key in ["num_samples"] + (["samples"] if "samples" in state else []):
            if state.get(key) != got[key]:
                self._marks, self.sample_ids, self._num_tokens, self._fingerprint = previous
                raise ResumeError(key, state.get(key), got[key])
        self.epoch = state["epoch"]
        self._resume_at = self._yielded = state["yielded"]
        self._epoch_batches = None

    def _marks_of(self, saved: Any) -> Mapping[str, Any]:
        """The epoch's commits from a state (None: the whole store now); refresh the reader once
        when the state names a commit it does not know yet."""
        if saved is None:
            return commit_marks(self.reader.commits)
        if not isinstance(saved, Mapping) or not isinstance(saved.get("writers"), Mapping) or \
                not isinstance(saved.get("others"), list):
            raise ResumeError("commits", saved, "{'writers': {writer_id: last seq}, 'others': [names]}")
        writers = saved["writers"]
        if any(not is_int(v) for v in writers.values()):
            raise ResumeError("commits", saved, "{'writers': {writer_id: last seq}, 'others': [names]}")

        def behind(marks: Mapping[str, Any]) -> bool:
            return any(marks["writers"].get(w, -1) < seq for w, seq in writers.items()) or \
                bool(set(saved["others"]) - set(marks["others"]))

        known = commit_marks(self.reader.commits)
        if behind(known) and not self.reader.is_partial:
            self.reader.refresh()
            known = commit_marks(self.reader.commits)
        if behind(known):
            raise ResumeError("commits", "the samples of commits this store does not have (another store?)",
                              f"{len(self.reader.commits)} commits")
        return saved


RouteDataset.__module__ = "r3store"  # the public path, in reprs and tracebacks
