"""The sample buffer: validates appended samples, quarantines bad ones, joins multi-turn parts.

Nothing reaches the buffer unchecked (``r3store/_validate.py``): a sample is buffered whole
or not at all. Samples wait here, as uint16 MoE-layer ids, until the writer commits them.
When the writer asks (open multi-turn samples filling the buffer), parts are spilled to
files in a scratch folder and read back one at a time when committed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from r3store._checks import is_int
from r3store._format import DEFAULT_MAX_SAMPLE_ROWS, format_ranges, format_spans, token_hash
from r3store._spec import ModelSpec
from r3store._validate import (
    as_numpy,
    check_metadata,
    check_policy_version,
    check_routes,
    check_row_count,
    check_sample_id,
    check_tokens,
    find_missing_rows,
)
from r3store.errors import (
    ContinuationError,
    DuplicateSampleError,
    RouteShapeError,
    RouteValidationError,
    RowCountError,
)
from r3store.writer._ingest import NO_ROUTES_HINT

__all__ = ["MAX_TOKENS", "Sample", "SampleBuffer", "SpilledPart", "materialize"]

MAX_TOKENS = 2**40
"""Upper bound on a sample's token count (a forged or garbage value would overflow int64 math)."""


@dataclass(frozen=True)
class SpilledPart:
    """Routes of one part moved to a scratch file (raw little-endian uint16, C order)."""

    path: Path
    shape: tuple[int, int, int]
    """``(rows, num_moe_layers, top_k)``."""

    @property
    def nbytes(self) -> int:
        """Bytes the part takes once read back."""
        return 2 * self.shape[0] * self.shape[1] * self.shape[2]

    def __len__(self) -> int:
        return self.shape[0]

    def load(self) -> np.ndarray:
        """The part, read back into memory."""
        return np.fromfile(self.path, dtype="<u2").reshape(self.shape)


def materialize(part: np.ndarray | SpilledPart) -> np.ndarray:
    """A part's routes in memory (a spilled part is read back)."""
    return part.load() if isinstance(part, SpilledPart) else part


def _in_memory(sample: Sample) -> int:
    return sum(p.nbytes for p in sample.parts if not isinstance(p, SpilledPart))


@dataclass
class Sample:
    """One sample on its way to a commit."""

    sample_id: str
    parts: list[np.ndarray | SpilledPart] = field(default_factory=list)
    """Its routes, uint16 ``(rows, num_moe_layers, top_k)``, one array per turn (or spilled to a file)."""
    rows: int = 0
    """Rows of all parts."""
    num_tokens: int = 0
    token_hash: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reason: str | None = None
    """Why the sample is quarantined (None: it passed every check)."""
    missing: list[tuple[int, int]] = field(default_factory=list)
    """Half-open ranges of rows the engine could not capture (stored as 0)."""
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    """``(start, stop, policy version)`` of each part, when versions are given."""
    versions: list[int] | None = None
    """Policy versions given to the parts (None: none given so far)."""

    @property
    def missing_rows(self) -> str | None:
        """The ``missing_rows`` column: ``"a:b,c:d"`` or None."""
        return format_ranges(self.missing)

    @property
    def policy_spans(self) -> str | None:
        """The ``policy_spans`` column: ``"start:stop=version;..."`` or None (no version given)."""
        return None if self.versions is None else format_spans(self.spans)

    @property
    def policy_version(self) -> int | None:
        """The ``policy_version`` column: the largest version given, or None."""
        return None if not self.versions else max(self.versions)

    def reset_parts(self) -> None:
        """Drop the routes kept so far (a quarantined sample whose routes cannot be stored)."""
        for part in self.parts:
            if isinstance(part, SpilledPart):
                part.path.unlink(missing_ok=True)
        self.parts, self.rows, self.missing, self.spans = [], 0, [], []


class SampleBuffer:
    """Completed samples waiting for a commit, and open multi-turn samples.

    Parameters
    ----------
    spec : ModelSpec
    on_invalid : {"raise", "quarantine"}
        What to do with a sample that fails a check.
    max_sample_rows : int
        Most rows one sample may have (the store's ``limits.max_sample_rows``).
    spill_dir : str or os.PathLike, optional
        Where to create the scratch folder for spilled parts (default: the system's
        temporary folder); created on the first spill, removed by :meth:`cleanup`.
    """

    def __init__(self, spec: ModelSpec, *, on_invalid: Literal["raise", "quarantine"] = "raise",
                 max_sample_rows: int = DEFAULT_MAX_SAMPLE_ROWS,
                 spill_dir: str | os.PathLike[str] | None = None) -> None:
        self.spec = spec
        self.on_invalid = on_invalid
        self.max_sample_rows = max_sample_rows
        self.done: list[Sample] = []
        """Completed samples, in append order (the next commit takes a prefix of them)."""
        self.open: dict[str, Sample] = {}
        """Multi-turn samples still waiting for their final turn."""
        self.nbytes = 0
        """Bytes of buffered routes held in memory (2 per id), completed and open samples."""
        self.done_bytes = 0
        """Bytes of the completed samples' routes, spilled ones included (the next commit's size)."""
        self.spilled_bytes = 0
        """Bytes of routes spilled to scratch files (completed and open samples)."""
        self._spill_parent = spill_dir
        self._spill_dir: Path | None = None
        self._spill_names = itertools.count()
        self.meta_types: dict[str, tuple[type, int]] = {}
        """Type of each metadata column so far (and its largest int magnitude)."""
        self._ids: set[str] = set()

    # -- appending --------------------------------------------------------------------

    def append(self, sample_id: str, routes: Any, *, num_tokens: int | None = None, tokens: Any = None,
               metadata: Mapping[str, Any] | None = None, start: int = 0, final: bool = True,
               allow_missing: bool = False, policy_version: int | None = None) -> None:
        """Validate and buffer the routes of one sample (or one turn of it); see
        :meth:`r3store.RouteWriter.append` for the parameters and errors."""
        check_sample_id(sample_id)
        if routes is None:
            raise RouteShapeError(sample_id, "routes", f"is None: {NO_ROUTES_HINT}")
        arr = as_numpy(sample_id, "routes", routes)
        sample = self._sample_for(sample_id, start, len(arr) if arr.ndim else 0)
        version = check_policy_version(sample_id, policy_version)
        types = dict(self.meta_types)  # adopted only if every check passes
        try:
            self._check_versioned(sample, version)
            missing = find_missing_rows(sample_id, arr, self.spec) if allow_missing else None
            if final and arr.ndim and not len(arr) and not sample.rows and num_tokens is None and tokens is None:
                raise RowCountError(sample_id, "routes", f"has 0 rows: no routes to store ({NO_ROUTES_HINT}); a "
                                                         "1-token sample has none: pass num_tokens=1 to store one")
            moe = check_routes(sample_id, arr, self.spec, missing=missing, allow_missing=allow_missing)
            self._check_cap(sample, len(moe))
            toks = check_tokens(sample_id, tokens) if final else None
            meta = check_metadata(sample_id, metadata, types)
            total = check_row_count(sample_id, sample.rows + len(moe), num_tokens, toks) if final else 0
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            self._quarantine(sample, arr, exc, num_tokens, tokens, metadata, final, version)
            return
        self.meta_types = types
        self._add_part(sample, moe, version, missing)
        sample.metadata.update(meta)  # metadata of every turn is kept
        if final:
            sample.num_tokens = total
            sample.token_hash = token_hash(toks) if toks is not None else None
            self._finish(sample)

    def append_decoded(self, sample_id: str, decode: Callable[[int | None], np.ndarray], *,
                       num_tokens: int | None = None, tokens: Any = None, metadata: Mapping[str, Any] | None = None,
                       start: int = 0, final: bool = True, allow_missing: bool = False,
                       policy_version: int | None = None) -> None:
        """:meth:`append` the routes ``decode(rows)`` returns (an engine payload); ``rows`` is
        the row count the payload must hold when the call completes a sample of known token
        count (else None). A payload that cannot be decoded is a bad sample like any other
        (raised, or quarantined)."""
        check_sample_id(sample_id)
        self._sample_for(sample_id, start)  # a continuation fault is named before the payload's size
        try:
            routes = decode(_expected_rows(num_tokens, tokens, start) if final else None)
        except RouteValidationError as exc:
            if self.on_invalid == "raise":
                raise
            version = check_policy_version(sample_id, policy_version)
            self._quarantine(self._sample_for(sample_id, start), None, exc, num_tokens, tokens, metadata, final,
                             version)
            return
        self.append(sample_id, routes, num_tokens=num_tokens, tokens=tokens, metadata=metadata, start=start,
                    final=final, allow_missing=allow_missing, policy_version=policy_version)

    @staticmethod
    def _check_versioned(sample: Sample, version: int | None) -> None:
        """Policy versions are given for every part of a sample or for none."""
        if (sample.parts or sample.versions is not None) and (version is None) != (sample.versions is None):
            given = "not given for this part but for earlier ones" if version is None else \
                "given for this part but not for earlier ones"
            raise RouteValidationError(sample.sample_id, "policy_version", f"{given}: give it with every part of a "
                                                                           "multi-turn sample or with none")

    def _check_cap(self, sample: Sample, rows: int) -> None:
        if sample.rows + rows > self.max_sample_rows:
            raise RowCountError(sample.sample_id, "routes",
                                f"{sample.rows + rows:,} rows, more than the store's cap of {self.max_sample_rows:,} "
                                "rows per sample (limits.max_sample_rows, set when the store is created: "
                                "RouteWriter(url, spec, {'max_sample_rows': ...}))")

    def _sample_for(self, sample_id: str, start: int, rows: int = 0) -> Sample:
        if not is_int(start) or start < 0:
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

    def _add_part(self, sample: Sample, moe: np.ndarray, version: int | None,
                  missing: np.ndarray | None = None) -> None:
        first = sample.rows
        if missing is not None:
            rows = np.flatnonzero(missing)
            breaks = np.flatnonzero(np.diff(rows) != 1)
            starts, stops = rows[np.r_[0, breaks + 1]], rows[np.r_[breaks, rows.size - 1]] + 1
            sample.missing += [(first + int(a), first + int(b)) for a, b in zip(starts, stops, strict=True)]
        if version is not None:
            sample.versions = [*(sample.versions or []), version]
            sample.spans.append((first, first + len(moe), version))
        sample.parts.append(moe)
        sample.rows += len(moe)
        self.open[sample.sample_id] = sample
        self.nbytes += moe.nbytes

    def _finish(self, sample: Sample) -> None:
        self.open.pop(sample.sample_id, None)  # absent for a quarantined first call
        self._ids.add(sample.sample_id)
        self.done.append(sample)
        self.done_bytes += sum(p.nbytes for p in sample.parts)

    def _quarantine(self, sample: Sample, arr: np.ndarray | None, exc: RouteValidationError,
                    num_tokens: Any, tokens: Any, metadata: Any, final: bool = True,
                    version: int | None = None) -> None:
        """Keep a failing sample as received (where it can be bit-packed), flagged.

        A failing turn of a multi-turn sample flags the sample and keeps it open, so its
        later turns append as usual; it is committed, flagged, with its final turn.
        """
        moe = _storable(arr, self.spec)
        if moe is not None and sample.rows + len(moe) > self.max_sample_rows:
            moe = None  # readers would refuse the whole table
        if (version is None) != (sample.versions is None) and (sample.parts or sample.versions is not None):
            sample.versions, sample.spans, version = None, [], None  # versions given for some parts only: none kept
        stored = "" if moe is not None else " (routes not storable; none kept)"
        if not final:
            if moe is not None:
                self._add_part(sample, moe, version)
            else:
                self.open[sample.sample_id] = sample
            sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
            return
        self.open.pop(sample.sample_id, None)
        given = sample.rows + (len(arr) if arr is not None and arr.ndim else 0)  # rows received, stored or not
        if moe is None:
            sample.reset_parts()
        else:
            self._add_part(sample, moe, version)
        sample.num_tokens = _quarantined_num_tokens(num_tokens, tokens, given)
        with contextlib.suppress(RouteValidationError):
            sample.metadata.update(check_metadata(sample.sample_id, metadata, self.meta_types))
        sample.reason = sample.reason or f"{exc.field}: {exc.fault}{stored}"
        self._finish(sample)

    # -- handing samples to a commit ----------------------------------------------------

    def drop(self, count: int) -> None:
        """Forget the oldest ``count`` completed samples (they are committed)."""
        for sample in self.done[:count]:
            self._unlink(sample)
        del self.done[:count]
        self._recount()

    def discard_open(self) -> list[str]:
        """Drop the open multi-turn samples; return their ids (sorted)."""
        ids = sorted(self.open)
        for sample in self.open.values():
            self._unlink(sample)
        self.open.clear()
        self._recount()
        return ids

    def _recount(self) -> None:
        everyone = (*self.done, *self.open.values())
        self.nbytes = sum(_in_memory(s) for s in everyone)
        self.done_bytes = sum(p.nbytes for s in self.done for p in s.parts)
        self.spilled_bytes = sum(p.nbytes for s in everyone for p in s.parts if isinstance(p, SpilledPart))

    def spill(self, target: int) -> int:
        """Move parts to scratch files, largest samples first, until at most ``target`` bytes of
        routes stay in memory; return the bytes spilled.

        Raises
        ------
        OSError
            The scratch folder cannot be created or written (nothing of the failing part
            is lost: it stays in memory).
        """
        moved = 0
        while self.nbytes > target:
            sample = max((*self.done, *self.open.values()), key=_in_memory)
            if not _in_memory(sample):
                break
            for i, part in enumerate(sample.parts):
                if isinstance(part, SpilledPart):
                    continue
                path = self._scratch() / f"{next(self._spill_names)}.u16"
                np.ascontiguousarray(part, dtype="<u2").tofile(path)
                sample.parts[i] = SpilledPart(path, (int(part.shape[0]), int(part.shape[1]), int(part.shape[2])))
                self.nbytes -= part.nbytes
                self.spilled_bytes += part.nbytes
                moved += part.nbytes
        return moved

    def _scratch(self) -> Path:
        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="r3store-spill-", dir=self._spill_parent))
        return self._spill_dir

    @staticmethod
    def _unlink(sample: Sample) -> None:
        for part in sample.parts:
            if isinstance(part, SpilledPart):
                part.path.unlink(missing_ok=True)

    def cleanup(self) -> None:
        """Remove the scratch folder (after the last commit)."""
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None


def _quarantined_num_tokens(num_tokens: Any, tokens: Any, rows: int) -> int:
    """The token count to record for a quarantined sample: as given when plausible."""
    nt = int(num_tokens) if is_int(num_tokens) and 1 <= num_tokens <= MAX_TOKENS else None
    if nt is None and tokens is not None:
        try:
            nt = len(tokens)
        except TypeError:
            nt = None
    return max(1, nt if nt is not None else rows + 1)


def _storable(arr: np.ndarray | None, spec: ModelSpec) -> np.ndarray | None:
    """Routes of a quarantined sample, when they fit the store's array geometry."""
    if arr is None or arr.ndim != 3 or arr.shape[2] != spec.top_k or arr.dtype.kind not in "iu":
        return None
    if arr.shape[1] == spec.num_layers and spec.num_layers != spec.num_moe_layers:
        arr = arr[:, list(spec.moe_layers)]
    if arr.shape[1] != spec.num_moe_layers:
        return None
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= 1 << spec.bits_per_id):
        return None
    return arr.astype(np.uint16)


def _expected_rows(num_tokens: Any, tokens: Any, start: int) -> int | None:
    """Rows the final part of a sample (from row ``start``) must hold, when the token count is known."""
    if tokens is not None and num_tokens is None:
        try:
            num_tokens = len(tokens)
        except TypeError:
            return None  # the append names the fault
    if not is_int(num_tokens):
        return None
    rows = int(num_tokens) - 1 - start
    return rows if rows >= 0 else None
