"""``RouteStore``: the user-facing store, a :class:`r3store.reader.RouteReader` that also assembles batches.

The top of the read path (like the CLI): it may import :mod:`r3store.batch`, and the
torch layer lazily for ``return_tensors="pt"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

from r3store._checks import parse_choice, resolve_config
from r3store._deprecated import renamed_property, warn
from r3store._format import ArrayGeometry
from r3store.batch import assemble
from r3store.layout import LayoutOptions, LayoutOptionsDict
from r3store.reader import ReaderOptions, ReaderOptionsDict, RouteReader
from r3store.storage import Backend, refuse_local_options

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
        layers: Sequence[int] | None = None,
        tokens: Sequence[Any] | None = None,
        return_tensors: Literal["np", "pt"] = "np",
        return_policy_version: bool = False,
        **deprecated: Any,
    ) -> dict[str, Any]:
        """The batch for exactly ``sample_ids``, in that order, laid out like the trainer's tokens.

        For trainers that choose their own micro-batches (Miles, verl). Keys match
        :class:`r3store.RouteDataset` batches; see :func:`r3store.batch.assemble`.

        Parameters
        ----------
        sample_ids : sequence of str
            In batch order (not a single str). A repeated id is allowed (oversampling): each
            occurrence is laid out as its own sequence holding the sample's routes, as a
            second sample with the same routes would be (see :func:`r3store.batch.assemble`).
        options : LayoutOptions or LayoutOptionsDict, optional
            The layout and the batch's form passed whole (see
            :class:`r3store.layout.LayoutOptions`): ``layout`` (THD packed with
            ``cu_seqlens``; BSHD/SBHD padded to ``max_seqlen`` or the batch maximum, batch
            first or sequence first, ``(T, B, n_layers, top_k)``, the order Megatron's
            router flattens ``[S, B, h]`` hidden states in), the context-parallel split
            (``cp_size``, ``cp_rank``, ``cp_mode``: Megatron zig-zag or contiguous), TP
            padding and the SP slice (``tp_size``, ``tp_rank``, ``pad_multiple``,
            ``sequence_parallel``), the pad rows (``pad_policy``: distinct in-range ids
            spread over all experts, or ``fill_value``), the routes' ``dtype`` (int32,
            int16, uint8, or ``"auto"``: the narrowest holding every expert and pad id;
            see :func:`r3store.batch.route_dtype`) and ``packed`` (``routes`` bit-packed
            uint8 plus ``routes_bits`` and ``routes_shape``, unpacked on the device by
            :func:`r3store.dataset.unpack_routes`).
        layers : sequence of int, optional
            Global decoder layers to keep (a pipeline stage's MoE layers).
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
        **deprecated
            ``layout``, ``cp_size``, ``cp_rank``, ``cp_mode``, ``tp_size``, ``tp_rank``,
            ``pad_multiple``, ``sequence_parallel``, ``max_seqlen``, ``pad_policy``,
            ``fill_value``, ``dtype``, ``packed``: fields of ``options`` given one by one
            (``None``: not given), merged into it; each warns
            (:class:`r3store.errors.R3StoreDeprecationWarning`) and is removed in 0.4.0.

        Only this rank's rows (CP/SP slice) and ``layers`` are fetched and decoded, and
        only its output is allocated (see :func:`r3store.batch.assemble`).

        Returns
        -------
        dict
            ``routes`` int32 ``(T, n_layers, top_k)`` or ``(B, T, n_layers, top_k)``,
            ``replay_mask`` bool (False on pad rows and on rows the engine could not
            capture), ``cu_seqlens`` int32, ``num_tokens`` int32 ``(B,)``,
            ``sample_ids``, ``layers``, ``sp_range``, ``layout`` (``"thd"``, ``"bshd"`` or
            ``"sbhd"``) (and ``tokens``, ``policy_version``).

        Raises
        ------
        TypeError
            A plain ``TypeError``: ``sample_ids`` is a single str or not iterable, or an id
            is not a str; ``layers`` is not a sequence of ints; a keyword is neither a
            parameter nor a deprecated layout field.
        r3store.errors.AlignmentError
            A sample's tokens do not match its routes (hash, or row count off by one).
        r3store.errors.LayoutOptionError
            A layout option is invalid (a name that is no field:
            :class:`~r3store.errors.UnknownLayoutOptionError`, also a ``TypeError``), given
            both in ``options`` and as a keyword with different values, or a sample has more
            tokens than ``max_seqlen``.
        r3store.errors.OptionError
            ``sample_ids`` is empty; ``return_tensors`` is not ``"np"`` or ``"pt"``; ``dtype``
            cannot hold every expert id; ``fill_value`` does not fit ``dtype``.
        r3store.errors.SampleNotFoundError, r3store.errors.LayerError
            An id is no committed sample; a layer is not an MoE layer or is asked for twice.
        r3store.errors.ChecksumError, r3store.errors.FormatError, r3store.errors.StorageError
            As :meth:`r3store.RouteReader.get`: a corrupted chunk, a malformed array, a failed read.
        ImportError
            ``return_tensors="pt"`` without torch.
        """
        parse_choice("return_tensors", return_tensors, ("np", "pt"))
        opts = resolve_config(LayoutOptions, "RouteStore.assemble", "options", options, deprecated)
        self.prefetch(sample_ids)
        batch = assemble(self, sample_ids, opts, layers=layers, tokens=tokens,
                         return_policy_version=return_policy_version)
        if return_tensors == "np":
            return batch
        from r3store.dataset import batch_to_tensors

        return batch_to_tensors(batch)

    # -- deprecated names -------------------------------------------------------------

    @classmethod
    def open(cls, url: str | os.PathLike[str] | Backend, *,
             reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
             storage_options: Mapping[str, Any] | None = None, **deprecated: Any) -> Self:
        """Deprecated (removed in r3store 0.4.0): use :func:`r3store.open_store`, the same parameters."""
        warn("RouteStore.open", "r3store.open_store(url, reader=...)")
        options = resolve_config(ReaderOptions, "RouteStore.open", "reader", reader, deprecated)
        refuse_local_options(url, storage_options)
        return cls._open(url, options, storage_options)

    shards = renamed_property("shards", "commits")
    committed_shards = renamed_property("committed_shards", "commits")

    def layout_of(self, array: str, *, partial: bool = False) -> ArrayGeometry:
        """Deprecated alias of :meth:`geometry_of`."""
        warn("RouteStore.layout_of", "RouteStore.geometry_of")
        return self.geometry_of(array, partial=partial)


def open_store(
    url: str | os.PathLike[str] | Backend,
    *,
    reader: ReaderOptions | ReaderOptionsDict | Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **deprecated: Any,
) -> RouteStore:
    """Open a store for reading: the one documented way (``r3store.open_reader`` and
    ``RouteStore.open`` are deprecated aliases; :meth:`r3store.reader.RouteReader.open` is
    the read core's constructor, for the layers below this facade).

    Parameters
    ----------
    url : str, os.PathLike or Backend
        Local folder or fsspec URL (``memory://``, ``s3://bucket/prefix``).
    reader : ReaderOptions or ReaderOptionsDict, optional
        How to open it, passed whole (:class:`r3store.ReaderOptions`; a dict of its fields
        is checked the same way): ``on_duplicate`` (a sample id committed by two commits:
        ``"raise"``, keep the earliest with ``"first"``, or keep it and list every
        duplicate in :attr:`RouteStore.duplicates` with ``"report"``), ``cache_bytes``
        (decoded chunks kept in memory), ``cache_dir`` (a local read-through cache of a
        remote store's route objects and sample tables), ``max_sample_rows`` (refuse
        longer samples at open; default: the store's ``limits.max_sample_rows``),
        ``commits`` (read only these commits), ``filter`` (a pyarrow compute expression
        over sample-table columns, e.g. ``pc.field("step") == 7``, pushed down into
        every table read) and ``use_checkpoint`` (start from the newest valid
        checkpoint written by :func:`r3store.compact`; False reads every sample table).
    storage_options : mapping, optional
        Passed to fsspec (``endpoint_url``, ``key``, ``secret``, ``profile``, ...); kept
        out of ``reader`` so credentials never appear in an options object's repr.
    **deprecated
        The fields of ``reader`` given one by one (``on_duplicate=``, ``cache_bytes=``,
        ``cache_dir=``, ``max_sample_rows=``, ``commits=``, ``filter=``,
        ``use_checkpoint=``): merged into it; each warns
        (:class:`r3store.errors.R3StoreDeprecationWarning`) and is removed in 0.4.0.

    Returns
    -------
    RouteStore

    Raises
    ------
    r3store.errors.NotAStoreError
        No ``r3store.json`` at ``url``.
    r3store.errors.FormatError
        The manifest or a sample table is malformed (FormatVersionError: unknown version):
        a table over the size caps, named other than ``index/<bucket>/<commit>.parquet``
        (``index/<commit>.parquet`` in format v1) with a valid commit name, or with a row
        that breaks the rules of ``schema/FORMAT.md`` section 6. Its subclasses:
        ChecksumError (the manifest's CRC-32C, a sample table's page CRCs or digest),
        SpecConflictError (a sample table's spec differs from the manifest's),
        SampleTooLargeError (a sample over the cap).
    r3store.errors.DuplicateSampleError
        With ``on_duplicate="raise"``: names the id and both commits.
    r3store.errors.OptionError
        A reader option is invalid (or given both ways with different values), or
        ``commits`` holds a string that is not a commit name.
    r3store.errors.ObjectNotFoundError
        A commit of ``commits`` has no sample table.
    r3store.errors.StorageError
    TypeError
        A keyword is neither a parameter nor a deprecated reader option.

    Warns
    -----
    r3store.errors.CheckpointWarning
        A checkpoint was damaged, partial or of another spec, and was skipped.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=1, num_experts=4, top_k=1)
    >>> path = tempfile.mkdtemp()
    >>> for step in range(2):
    ...     with r3store.RouteWriter(path, spec, {"writer_id": f"step{step}"}) as w:
    ...         w.append(f"s{step}", np.zeros((3, 1, 1), np.int64))
    >>> r3store.open_store(path).commits
    ['step0-00000', 'step1-00000']
    >>> r3store.open_store(path, reader={"commits": ["step1-00000"]}).sample_ids
    ['s1']
    """
    options = resolve_config(ReaderOptions, "open_store", "reader", reader, deprecated)
    refuse_local_options(url, storage_options)
    return RouteStore._open(url, options, storage_options)
