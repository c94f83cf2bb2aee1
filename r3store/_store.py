"""``RouteStore``: the user-facing store, a :class:`r3store.reader.RouteReader` that also assembles batches.

The top of the read path (like the CLI): it may import :mod:`r3store.batch`, and the
torch layer lazily for ``return_tensors="pt"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import pyarrow.compute as pc

from r3store._checks import parse_choice
from r3store._deprecated import renamed_property, warn
from r3store._format import ArrayGeometry
from r3store.batch import PadPolicy, RouteDType, assemble
from r3store.layout import LayoutOptions, LayoutOptionsDict
from r3store.reader import OnDuplicate, RouteReader
from r3store.storage import Backend

__all__ = ["RouteStore", "open_store"]


class RouteStore(RouteReader):
    """A committed store, opened for reading (see :func:`r3store.open_store`).

    Everything of :class:`r3store.reader.RouteReader` (``get``, ``samples``,
    ``sample_ids``, ``commits``, ``row``, ``num_tokens``, ``read_rows``, ...), plus
    :meth:`assemble`, the batch of given samples laid out like the trainer's tokens.
    """

    def assemble(
        self,
        sample_ids: Sequence[str],
        options: LayoutOptions | LayoutOptionsDict | Mapping[str, Any] | None = None,
        *,
        layout: Literal["thd", "bshd", "sbhd"] | None = None,
        layers: Sequence[int] | None = None,
        cp_size: int | None = None,
        cp_rank: int | None = None,
        cp_mode: Literal["zigzag", "contiguous"] | None = None,
        tp_size: int | None = None,
        pad_multiple: int | None = None,
        sequence_parallel: bool | None = None,
        tp_rank: int | None = None,
        max_seqlen: int | None = None,
        pad_policy: PadPolicy = "spread",
        fill_value: int = -1,
        tokens: Sequence[Any] | None = None,
        return_tensors: Literal["np", "pt"] = "np",
        return_policy_version: bool = False,
        dtype: RouteDType = "int32",
        packed: bool = False,
    ) -> dict[str, Any]:
        """The batch for exactly ``sample_ids``, in that order, laid out like the trainer's tokens.

        For trainers that choose their own micro-batches (Miles, verl). Keys match
        :class:`r3store.RouteDataset` batches; see :func:`r3store.batch.assemble`.

        Parameters
        ----------
        sample_ids : sequence of str
        options : LayoutOptions or LayoutOptionsDict, optional
            The layout passed whole. The layout keywords below (``layout``, ``cp_*``,
            ``tp_*``, ``pad_multiple``, ``sequence_parallel``, ``max_seqlen``) are its
            fields given one by one and are merged into it; ``None`` means not given.
        layout : {"thd", "bshd", "sbhd"}, optional
            Packed with ``cu_seqlens``, or padded to ``max_seqlen`` / the batch maximum,
            batch first (BSHD) or sequence first (SBHD: ``(T, B, n_layers, top_k)``, the
            order Megatron's router flattens ``[S, B, h]`` hidden states in).
        layers : sequence of int, optional
            Global decoder layers to keep (a pipeline stage's MoE layers).
        cp_size, cp_rank, cp_mode : optional
            Context parallel split (Megatron zig-zag, or contiguous all-gather).
        tp_size, tp_rank, pad_multiple, sequence_parallel : optional
            Pad the packed length to a multiple of ``tp_size * pad_multiple``; with
            sequence parallel keep only ``tp_rank``'s contiguous part.
        max_seqlen : int, optional
            BSHD only.
        pad_policy : {"spread", "fill"}
            Pad rows get distinct in-range ids spread over all experts, or ``fill_value``.
        fill_value : int
        tokens : sequence of int sequences, optional
            Each sample's token ids: checked against the stored token hash and
            ``len(tokens) - 1 == rows``, and laid out as ``batch["tokens"]``.
        return_tensors : {"np", "pt"}
            numpy arrays (default), or CPU torch tensors (converted by the torch layer,
            :func:`r3store.dataset.batch_to_tensors`; needs torch).
        return_policy_version : bool
            Add ``policy_version``, int64 per row laid out like the routes: the policy
            (weight) version that produced the row (``append(..., policy_version=)``), -1
            on pad rows and for samples written without a version.
        dtype : {"int32", "int16", "uint8", "auto"}
            dtype of ``routes``: int32 (default), int16, uint8, or the narrowest holding
            every expert and pad id (see :func:`r3store.batch.route_dtype`).
        packed : bool
            ``routes`` bit-packed (uint8) plus ``routes_bits`` and ``routes_shape``, to be
            unpacked on the device by :func:`r3store.dataset.unpack_routes`.

        Only this rank's rows (CP/SP slice) and ``layers`` are fetched and decoded, and
        only its output is allocated (see :func:`r3store.batch.assemble`).

        Returns
        -------
        dict
            ``routes`` int32 ``(T, n_layers, top_k)`` or ``(B, T, n_layers, top_k)``,
            ``replay_mask`` bool (False on pad rows and on rows the engine could not
            capture), ``cu_seqlens`` int32, ``num_tokens`` int32 ``(B,)``,
            ``sample_ids``, ``layers``, ``sp_range`` (and ``tokens``, ``policy_version``).

        Raises
        ------
        r3store.errors.AlignmentError
            A sample's tokens do not match its routes (hash, or row count off by one).
        r3store.errors.LayoutOptionError
            A layout option is invalid, or given both in ``options`` and as a keyword
            with different values.
        r3store.errors.OptionError
            ``return_tensors`` is not ``"np"`` or ``"pt"``; ``dtype`` is not a choice or
            cannot hold every expert id; ``fill_value`` does not fit ``dtype``.
        r3store.errors.SampleNotFoundError, r3store.errors.LayerError
        """
        parse_choice("return_tensors", return_tensors, ("np", "pt"))
        opts = LayoutOptions.resolve(options, layout=layout, cp_size=cp_size, cp_rank=cp_rank, cp_mode=cp_mode,
                                     tp_size=tp_size, tp_rank=tp_rank, pad_multiple=pad_multiple,
                                     sequence_parallel=sequence_parallel, max_seqlen=max_seqlen)
        self.prefetch(sample_ids)
        batch = assemble(self, sample_ids, opts, layers=layers, pad_policy=pad_policy, fill_value=fill_value,
                         tokens=tokens, return_policy_version=return_policy_version, dtype=dtype, packed=packed)
        if return_tensors == "np":
            return batch
        from r3store.dataset import batch_to_tensors

        return batch_to_tensors(batch)

    # -- deprecated names -------------------------------------------------------------

    shards = renamed_property("shards", "commits")
    committed_shards = renamed_property("committed_shards", "commits")

    def layout_of(self, array: str, *, partial: bool = False) -> ArrayGeometry:
        """Deprecated alias of :meth:`geometry_of`."""
        warn("RouteStore.layout_of", "RouteStore.geometry_of")
        return self.geometry_of(array, partial=partial)


def open_store(
    url: str | os.PathLike[str] | Backend,
    *,
    storage_options: Mapping[str, Any] | None = None,
    on_duplicate: OnDuplicate = "raise",
    cache_bytes: int = 64 << 20,
    cache_dir: str | os.PathLike[str] | None = None,
    max_sample_rows: int | None = None,
    filter: pc.Expression | None = None,
    use_checkpoint: bool = True,
) -> RouteStore:
    """Open a store for reading (see :func:`r3store.reader.open_reader` for every parameter).

    Parameters
    ----------
    url : str, os.PathLike or Backend
        Local folder or fsspec URL (``memory://``, ``s3://bucket/prefix``).
    storage_options : mapping, optional
        Passed to fsspec (``endpoint_url``, ``key``, ``secret``, ``profile``, ...).
    on_duplicate : {"raise", "first", "report"}
        A sample id committed by two commits: raise, keep the earliest commit, or keep the
        earliest and list every duplicate in :attr:`RouteStore.duplicates` (for audits).
    cache_bytes : int
        Budget for decoded chunks kept in memory.
    cache_dir : str or os.PathLike, optional
        Local read-through cache of a remote store's route objects and sample tables.
    max_sample_rows : int, optional
        Cap on rows per sample, checked at open before anything is allocated (default:
        the store's ``limits.max_sample_rows``; see :func:`r3store.reader.open_reader`).
    filter : pyarrow.compute.Expression, optional
        Open only the samples it selects, e.g. one RL step's: ``pc.field("step") == 7``
        (sample-table columns; pushed down, see :func:`r3store.reader.open_reader`).
    use_checkpoint : bool
        Start from the newest valid checkpoint (:func:`r3store.compact`); False reads
        every sample table.

    Returns
    -------
    RouteStore

    Raises
    ------
    r3store.errors.NotAStoreError, r3store.errors.FormatError, r3store.errors.DuplicateSampleError,
    r3store.errors.OptionError, r3store.errors.StorageError
        As :func:`r3store.reader.open_reader` (FormatError subclasses: ChecksumError,
        SpecConflictError, SampleTooLargeError).
    """
    return RouteStore.open(url, storage_options=storage_options, on_duplicate=on_duplicate,
                           cache_bytes=cache_bytes, cache_dir=cache_dir, max_sample_rows=max_sample_rows,
                           filter=filter, use_checkpoint=use_checkpoint)
