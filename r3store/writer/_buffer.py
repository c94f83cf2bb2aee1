"""The sample buffer: validates appended samples, quarantines bad ones, joins multi-turn parts.

Nothing reaches the buffer unchecked (``r3store/_validate.py``): a sample is buffered whole
or not at all. Samples wait here, as uint16 MoE-layer ids, until the writer commits them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from r3store._format import token_hash
from r3store._spec import ModelSpec
from r3store._validate import as_numpy, check_metadata, check_routes, check_row_count, check_sample_id, check_tokens
from r3store.errors import ContinuationError, DuplicateSampleError, RouteValidationError

__all__ = ["MAX_TOKENS", "Sample", "SampleBuffer"]

MAX_TOKENS = 2**40
"""Upper bound on a sample's token count (a forged or garbage value would overflow int64 math)."""


@dataclass
class Sample:
    """One sample on its way to a commit."""

    sample_id: str
    parts: list[np.ndarray] = field(default_factory=list)
    """Its routes, uint16 ``(rows, num_moe_layers, top_k)``, one array per turn."""
    rows: int = 0
    """Rows of all parts."""
    num_tokens: int = 0
    token_hash: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    """Why the sample is quarantined (None: it passed every check)."""


class SampleBuffer:
    """Completed samples waiting for a commit, and open multi-turn samples.

    Parameters
    ----------
    spec : ModelSpec
    on_invalid : {"raise", "quarantine"}
        What to do with a sample that fails a check.
    """

    def __init__(self, spec: ModelSpec, *, on_invalid: Literal["raise", "quarantine"] = "raise") -> None:
        self.spec = spec
        self.on_invalid = on_invalid
        self.done: list[Sample] = []
        """Completed samples, in append order (the next commit takes a prefix of them)."""
        self.open: dict[str, Sample] = {}
        """Multi-turn samples still waiting for their final turn."""
        self.nbytes = 0
        """Bytes of buffered routes (2 per id), completed and open samples."""
        self.meta_types: dict[str, tuple[type, int]] = {}
        """Type of each metadata column so far (and its largest int magnitude)."""
        self._ids: set[str] = set()

    # -- appending --------------------------------------------------------------------

    def append(self, sample_id: str, routes: Any, *, num_tokens: int | None = None, tokens: Any = None,
               metadata: Mapping[str, Any] | None = None, start: int = 0, final: bool = True) -> None:
        """Validate and buffer the routes of one sample (or one turn of it); see
        :meth:`r3store.RouteWriter.append` for the parameters and errors."""
        check_sample_id(sample_id)
        arr = as_numpy(sample_id, "routes", routes)
        sample = self._sample_for(sample_id, start, len(arr) if arr.ndim else 0)
        types = dict(self.meta_types)  # adopted only if every check passes
        try:
            moe = check_routes(sample_id, arr, self.spec)
            toks = check_tokens(sample_id, tokens) if final else None
            meta = check_metadata(sample_id, metadata, types)
            total = check_row_count(sample_id, sample.rows + len(moe), num_tokens, toks) if final else 0
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            self._quarantine(sample, arr, exc, num_tokens, tokens, metadata, final)
            return
        self.meta_types = types
        self._add_part(sample, moe)
        sample.metadata.update(meta)  # metadata of every turn is kept
        if final:
            sample.num_tokens = total
            sample.token_hash = token_hash(toks) if toks is not None else None
            self._finish(sample)

    def append_decoded(self, sample_id: str, decode: Callable[[], np.ndarray], *, num_tokens: int | None = None,
                       tokens: Any = None, metadata: Mapping[str, Any] | None = None, start: int = 0,
                       final: bool = True) -> None:
        """:meth:`append` the routes ``decode()`` returns (an engine payload); a payload that
        cannot be decoded is a bad sample like any other (raised, or quarantined)."""
        check_sample_id(sample_id)
        try:
            routes = decode()
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            self._quarantine(self._sample_for(sample_id, start), None, exc, num_tokens, tokens, metadata, final)
            return
        self.append(sample_id, routes, num_tokens=num_tokens, tokens=tokens, metadata=metadata, start=start,
                    final=final)

    def _sample_for(self, sample_id: str, start: int, rows: int = 0) -> Sample:
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise RouteValidationError(sample_id, "start", f"must be an int >= 0, got {start!r}")
        sample = self.open.get(sample_id)
        if sample is None:
            if sample_id in self._ids:
                raise DuplicateSampleError(sample_id, detail="already appended by this writer")
            if start != 0:
                raise ContinuationError(sample_id, (0, 0), (start, start + rows))
            return Sample(sample_id)
        if start != sample.rows and sample.reason is None:  # a quarantined sample's rows may be unknown
            raise ContinuationError(sample_id, (0, sample.rows), (start, start + rows))
        return sample

    def _add_part(self, sample: Sample, moe: np.ndarray) -> None:
        sample.parts.append(moe)
        sample.rows += len(moe)
        self.open[sample.sample_id] = sample
        self.nbytes += moe.nbytes

    def _finish(self, sample: Sample) -> None:
        self.open.pop(sample.sample_id, None)  # absent for a quarantined first call
        self._ids.add(sample.sample_id)
        self.done.append(sample)

    def _quarantine(self, sample: Sample, arr: np.ndarray | None, exc: RouteValidationError,
                    num_tokens: Any, tokens: Any, metadata: Any, final: bool = True) -> None:
        """Keep a failing sample as received (where it can be bit-packed), flagged.

        A failing turn of a multi-turn sample flags the sample and keeps it open, so its
        later turns append as usual; it is committed, flagged, with its final turn.
        """
        moe = _storable(arr, self.spec)
        stored = "" if moe is not None else " (routes not storable; none kept)"
        if not final:
            if moe is not None:
                self._add_part(sample, moe)
            else:
                self.open[sample.sample_id] = sample
            sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
            return
        self.open.pop(sample.sample_id, None)
        sample.parts = [] if moe is None else [*sample.parts, moe]
        sample.rows = sum(len(p) for p in sample.parts)
        self.nbytes += 0 if moe is None else moe.nbytes
        sample.num_tokens = _quarantined_num_tokens(num_tokens, tokens, sample.rows)
        with contextlib.suppress(RouteValidationError):
            sample.metadata.update(check_metadata(sample.sample_id, metadata, self.meta_types))
        sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
        self._finish(sample)

    # -- handing samples to a commit ----------------------------------------------------

    def drop(self, count: int) -> None:
        """Forget the oldest ``count`` completed samples (they are committed)."""
        del self.done[:count]
        self.nbytes = sum(p.nbytes for s in (*self.done, *self.open.values()) for p in s.parts)

    def discard_open(self) -> list[str]:
        """Drop the open multi-turn samples; return their ids (sorted)."""
        ids = sorted(self.open)
        self.open.clear()
        return ids


def _quarantined_num_tokens(num_tokens: Any, tokens: Any, rows: int) -> int:
    """The token count to record for a quarantined sample: as given when plausible."""
    valid = isinstance(num_tokens, int | np.integer) and not isinstance(num_tokens, bool)
    nt = int(num_tokens) if valid and 1 <= num_tokens <= MAX_TOKENS else None
    if nt is None and tokens is not None:
        try:
            nt = len(tokens)
        except TypeError:
            nt = None
    return max(1, nt if nt is not None else rows + 1)


def _storable(arr: np.ndarray | None, spec: ModelSpec) -> np.ndarray | None:
    """Routes of a quarantined sample, when they fit the store's array geometry."""
    if arr is None or arr.ndim != 3 or arr.shape[2] != spec.top_k or not np.issubdtype(arr.dtype, np.integer):
        return None
    if arr.shape[1] == spec.num_layers and spec.num_layers != spec.num_moe_layers:
        arr = arr[:, list(spec.moe_layers)]
    if arr.shape[1] != spec.num_moe_layers:
        return None
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << spec.bits_per_id):
        return None
    return arr.astype(np.uint16)
