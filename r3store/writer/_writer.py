"""``RouteWriter``: the rollout-worker side. Buffers checked samples and commits them."""

from __future__ import annotations

import dataclasses
import os
import uuid
import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from r3store._checks import resolve_config
from r3store._deprecated import renamed_property, warn
from r3store._spec import ModelSpec
from r3store.errors import DiscardedSampleWarning, IncompleteSampleError, RouteValidationError, WriterClosedError
from r3store.storage import Backend, LocalBackend, open_backend, refuse_local_options
from r3store.writer._buffer import SampleBuffer
from r3store.writer._commit import Committer, default_layers_per_chunk
from r3store.writer._config import WriterConfig, WriterConfigDict
from r3store.writer._ingest import decode_sglang, sglang_meta, sglang_num_tokens, sglang_start

__all__ = ["RouteWriter"]


class RouteWriter:
    """Write routing traces into a store; used inside rollout workers.

    Samples are validated on :meth:`append`, buffered in memory as uint16, and
    committed as one *commit* (a route array plus its Parquet sample table) on
    :meth:`flush`, when the buffer exceeds ``buffer_bytes``, and on :meth:`close` /
    context exit. A reader sees a commit only once its sample table (written last)
    exists. Every writer commits under its own unique names, so many writers can share a
    store without locks or a coordinator.

    Parameters
    ----------
    url : str, os.PathLike or Backend
        Store location: a local folder or any fsspec URL (``memory://``, ``s3://``).
        Created if absent. A non-empty folder that is not a store is refused.
    spec : ModelSpec
        Must equal the spec of an existing store.
    config : WriterConfig or WriterConfigDict, optional
        The writer's settings passed whole (see :class:`r3store.WriterConfig` for each):
        ``buffer_bytes``, ``chunk_rows``, ``layers_per_chunk``, ``object_bytes``,
        ``on_invalid`` (``"quarantine"`` keeps bad samples flagged), ``writer_id``,
        ``max_sample_rows``, ``spill_dir`` (where open multi-turn samples spill when they
        fill the buffer), ``clock``, ``codec``, ``direct_write_bytes`` (local stores: objects
        of at least this size written with ``O_DIRECT``, bypassing the page cache; ``None``:
        never).
    storage_options : mapping, optional
        Passed to fsspec (``endpoint_url``, ``key``, ``profile``, ...).
    **deprecated
        The fields of ``config`` given one by one (``buffer_bytes=``, ..., ``spill_dir=``;
        ``None``: not given; a field given both ways with different values is an error)
        and ``shard_bytes``, the old name of ``object_bytes``: each warns
        (:class:`r3store.errors.R3StoreDeprecationWarning`) and is removed in 0.4.0.

    Attributes
    ----------
    config : WriterConfig
        The settings in effect (``layers_per_chunk`` and ``writer_id`` resolved).
    commits : list of str
        Names of the commits this writer has made.

    Raises
    ------
    r3store.errors.OptionError
        A setting is invalid, or given both ways with different values.
    TypeError
        ``spec`` is not a ModelSpec, or a keyword is neither a parameter nor a deprecated alias.
    r3store.errors.SpecMismatchError
        The store exists with another spec (nothing is written).
    r3store.errors.FormatVersionError
        The store exists and is of format version 1 (written by r3store 0.1): this release
        reads such stores but writes only format v2, so write to a new store.
    r3store.errors.NotAStoreError
        The folder holds other files and no ``r3store.json``.
    r3store.errors.StorageError
        The storage backend failed.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    >>> path = tempfile.mkdtemp()
    >>> with r3store.RouteWriter(path, spec) as w:
    ...     w.append("s0", np.array([[[0, 1], [2, 3]]]), num_tokens=2)
    >>> r3store.open_store(path).get("s0").tolist()
    [[[0, 1], [2, 3]]]
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Backend,
        spec: ModelSpec,
        config: WriterConfig | WriterConfigDict | Mapping[str, Any] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        **deprecated: Any,
    ) -> None:
        if not isinstance(spec, ModelSpec):
            raise TypeError(f"spec must be an r3store.ModelSpec, got {type(spec).__name__}")
        shard_bytes = deprecated.pop("shard_bytes", None)
        if shard_bytes is not None:
            if "object_bytes" in deprecated:
                raise TypeError("RouteWriter() got both shard_bytes= (deprecated) and object_bytes=; "
                                "pass config={'object_bytes': ...} only")
            warn("RouteWriter(shard_bytes=...)", "config={'object_bytes': ...}")
        settings = resolve_config(WriterConfig, "RouteWriter", "config", config, deprecated)
        if shard_bytes is not None:
            settings = WriterConfig.resolve(settings, object_bytes=shard_bytes)
        self.config = dataclasses.replace(
            settings,
            layers_per_chunk=settings.layers_per_chunk or default_layers_per_chunk(spec, settings.chunk_rows,
                                                                                    settings.codec),
            writer_id=settings.writer_id or f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}")
        self.spec = spec
        self.writer_id: str = self.config.writer_id or ""
        refuse_local_options(url, storage_options)
        backend = open_backend(url, storage_options)
        if isinstance(backend, LocalBackend):  # the one backend that writes with O_DIRECT
            backend.direct_write_bytes = self.config.direct_write_bytes
        self._committer = Committer(backend, spec, writer_id=self.writer_id,
                                    chunk_rows=self.config.chunk_rows,
                                    layers_per_chunk=self.config.layers_per_chunk or 1,
                                    object_bytes=self.config.object_bytes,
                                    max_sample_rows=self.config.max_sample_rows, clock=self.config.clock,
                                    codec=self.config.codec)
        self.backend = self._committer.backend
        self._closed = False
        self.commits: list[str] = []
        """Names of the commits this writer has made (one route array + sample table each)."""
        self._committer.init_store()
        self._buffer = SampleBuffer(spec, on_invalid=self.config.on_invalid,
                                    max_sample_rows=self._committer.max_sample_rows,
                                    spill_dir=self.config.spill_dir)

    shards = renamed_property("shards", "commits")
    store = renamed_property("store", "backend")
    buffer_bytes = renamed_property("buffer_bytes", "config.buffer_bytes")
    chunk_rows = renamed_property("chunk_rows", "config.chunk_rows")
    layers_per_chunk = renamed_property("layers_per_chunk", "config.layers_per_chunk")
    shard_bytes = renamed_property("shard_bytes", "config.object_bytes")
    on_invalid = renamed_property("on_invalid", "config.on_invalid")

    def __repr__(self) -> str:
        return f"RouteWriter({self.backend.url!r}, writer_id={self.writer_id!r})"

    # -- appending ------------------------------------------------------------------

    def append(
        self,
        sample_id: str,
        routes: Any,
        *,
        num_tokens: int | None = None,
        tokens: Any = None,
        metadata: Mapping[str, Any] | None = None,
        start: int = 0,
        final: bool = True,
        allow_missing: bool = False,
        policy_version: int | None = None,
    ) -> None:
        """Validate and buffer the routes of one sample (or one turn of it).

        Parameters
        ----------
        sample_id : str
            Unique within the store.
        routes : ndarray or torch.Tensor of integer dtype
            Global expert ids, shape ``(rows, num_layers, top_k)`` (all decoder layers,
            dense layers as zero rows, as SGLang sends them) or ``(rows, num_moe_layers,
            top_k)``. Row ``t`` holds the experts chosen for input position ``start + t``.
            Only MoE layers are stored. A sample of 0 rows (all its calls gave none) is
            refused as "no routes", as :meth:`append_sglang` refuses an empty payload, unless
            ``num_tokens=1`` (or one token) says it is a 1-token sample.
        num_tokens : int, optional
            Tokens of the whole sample; the sample must have ``num_tokens - 1`` rows in
            all. Defaults to ``len(tokens)``, else rows + 1. Given with the final call.
        tokens : sequence of int, optional
            Token ids of the whole sample; a BLAKE2b hash is stored so trainers can check
            alignment (:meth:`r3store.RouteStore.assemble`).
        metadata : mapping of str to JSON scalar, optional
            User columns for the sample table (step, prompt id, reward, ...).
        start : int
            Multi-turn continuation: first row of these routes within the sample. The
            first call has ``start=0``; each continuation starts where the rows so far end
            (SGLang ``routed_experts_start_len``).
        final : bool
            Whether this call completes the sample. A sample is committed only once final.
        allow_missing : bool
            Accept rows the engine could not capture (prefix-cache hits, chunked prefill):
            rows whose ids are -1 in every MoE layer (NeMo-RL's marker; dense layers 0 or
            -1). They are stored as *missing rows*: :meth:`r3store.RouteStore.get` returns
            them as -1, batches give them ``replay_mask`` False (replay keeps live routing
            there), ``validate`` and ``stats`` count them. Without it such rows are an
            :class:`~r3store.errors.ExpertIdError`.
        policy_version : int, optional
            Version of the policy weights that produced these rows (``[0, 2**63)``; async
            RL can change weights between the turns of a sample). Give it with every part
            of a sample or with none; readers get it per row range
            (:meth:`r3store.RouteStore.policy_spans`).

        Raises
        ------
        r3store.errors.RouteValidationError
            (and subclasses RouteShapeError, ExpertIdError, RowCountError) the routes are
            malformed, the sample would exceed the store's ``max_sample_rows``, or
            ``policy_version`` is invalid or given for some parts only; the sample is not
            buffered (unless ``on_invalid="quarantine"``).
        r3store.errors.DuplicateSampleError
            ``sample_id`` was already appended by this writer.
        r3store.errors.ContinuationError
            ``start`` leaves a gap or overlap.
        r3store.errors.WriterClosedError
        """
        self._check_open()
        completed = len(self._buffer.done)
        self._buffer.append(sample_id, routes, num_tokens=num_tokens, tokens=tokens, metadata=metadata,
                            start=start, final=final, allow_missing=allow_missing, policy_version=policy_version)
        self._flush_if_full(completed)

    def append_sglang(
        self,
        sample_id: str,
        meta_info: Any,
        *,
        num_tokens: int | None = None,
        tokens: Any = None,
        metadata: Mapping[str, Any] | None = None,
        start: int | None = None,
        final: bool = True,
        allow_missing: bool = False,
        policy_version: int | None = None,
    ) -> None:
        """Append SGLang output: ``meta_info["routed_experts"]`` decoded, then :meth:`append`.

        Parameters
        ----------
        meta_info : mapping, str, bytes or array
            SGLang ``/generate`` ``meta_info`` (or the ``routed_experts`` value itself):
            base64 of little-endian int32 (or of ``meta_info["routed_experts_dtype"]``),
            flattened ``[rows, num_layers, top_k]``, no shape sent (see
            :func:`r3store.decode_sglang`).
        num_tokens : int, optional
            As for :meth:`append`. When neither it nor ``tokens`` is given, the final call
            takes ``meta_info["prompt_tokens"] + meta_info["completion_tokens"]`` (when both
            are present; otherwise rows + 1), so a payload one row short or long is an
            error, not a sample stored with a wrong token count.
        start : int, optional
            As for :meth:`append`; default ``meta_info["routed_experts_start_len"]`` when
            present, else 0.

        Other parameters are as for :meth:`append`.

        Raises
        ------
        r3store.errors.PayloadDecodeError
            ``routed_experts`` is missing, None or empty (the engine returned no routes);
            the payload is not base64, names an unknown ``routed_experts_dtype``, or does not
            divide into ``(rows, num_layers, top_k)`` (with a known token count: into the
            rows expected, else the likely wrong ``top_k`` is named).
        r3store.errors.RowCountError
            The payload holds another number of rows than the token count implies.
        r3store.errors.RouteValidationError
            ``start`` differs from ``meta_info["routed_experts_start_len"]``.
        """
        self._check_open()
        meta = sglang_meta(meta_info)
        start = self._sglang_start(sample_id, start, meta)
        if final and num_tokens is None and tokens is None:
            num_tokens = sglang_num_tokens(meta)
        completed = len(self._buffer.done)
        self._buffer.append_decoded(sample_id, lambda rows: decode_sglang(sample_id, meta_info, self.spec,
                                                                          num_rows=rows),
                                    num_tokens=num_tokens, tokens=tokens, metadata=metadata, start=start, final=final,
                                    allow_missing=allow_missing, policy_version=policy_version)
        self._flush_if_full(completed)

    @staticmethod
    def _sglang_start(sample_id: str, start: int | None, meta: Mapping[str, Any] | None) -> int:
        """``start``, else ``routed_experts_start_len``, else 0; both given must agree."""
        given = sglang_start(meta)
        if start is None:
            return 0 if given is None else given
        if given is not None and given != start:
            raise RouteValidationError(sample_id, "start", f"is {start} but meta_info routed_experts_start_len is "
                                                           f"{given}: give one, or the same value")
        return start

    def _flush_if_full(self, completed: int) -> None:
        """Keep memory bounded by ``buffer_bytes`` with few, full commits.

        Completed samples are committed once they hold ``buffer_bytes`` (so open multi-turn
        samples never shrink commits to one sample each). While the routes held in memory
        (completed and open samples) reach ``buffer_bytes``, the largest samples are spilled
        to the scratch folder until half of it is left.
        """
        del completed
        buffer, limit = self._buffer, self.config.buffer_bytes
        if buffer.done and buffer.done_bytes >= limit:
            self.flush()
        if buffer.nbytes >= limit:
            buffer.spill(limit // 2)

    # -- committing -----------------------------------------------------------------

    def flush(self) -> str | None:
        """Commit every completed, buffered sample as one commit.

        Returns
        -------
        str or None
            The new commit's name, or None when nothing was buffered.

        Raises
        ------
        r3store.errors.SpecMismatchError
            The store's manifest changed under this writer; nothing is committed.
        r3store.errors.StorageError
            A write failed; nothing is committed and the samples stay buffered.
        """
        self._check_open()
        return self._commit()

    def _commit(self) -> str | None:
        """Commit the completed samples (several commits when a retried one holds fewer)."""
        commit = None
        while self._buffer.done:
            commit, count = self._committer.commit(self._buffer.done, list(self._buffer.meta_types))
            self.commits.append(commit)
            self._buffer.drop(count)
        return commit

    # -- lifecycle ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WriterClosedError(f"{self!r} is closed")

    def close(self) -> None:
        """Commit buffered samples and close.

        Raises
        ------
        r3store.errors.StorageError
            The commit failed: the writer stays open with every sample buffered, so
            ``close()`` (or ``flush()``) can be called again.
        r3store.errors.IncompleteSampleError
            Multi-turn samples were still open (non-final); they are not stored, the
            completed samples are committed.
        """
        if self._closed:
            return
        self._commit()
        self._closed = True
        self.backend.close()
        open_ids = self._buffer.discard_open()
        self._buffer.cleanup()
        if open_ids:
            raise IncompleteSampleError(open_ids)

    def __enter__(self) -> RouteWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
            return
        discarded = self._buffer.discard_open()
        self.close()  # before warning: a warning filter set to "error" must not skip the commit
        if discarded:
            warnings.warn(DiscardedSampleWarning(f"discarded open samples {discarded}"), stacklevel=2)

