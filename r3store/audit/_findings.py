"""`Finding` and `ValidationReport`: what :func:`r3store.audit.validate` returns.

A finding names *where* a fault is (sample, decoder layer, rows, route array, chunk) and
*what* it is (``kind``, one of :data:`KINDS`). Rows are given as inclusive ``(first,
last)`` ranges, compressed (``rows 0-63, 70``): within the sample when ``sample_id`` is
set, within the route array otherwise (chunk findings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

__all__ = ["ACCEPTED", "INFORMATIONAL", "KINDS", "Finding", "ValidationReport", "format_rows"]

Severity = Literal["error", "warning"]

#: Every finding kind: its severity and what it means.
KINDS: Mapping[str, tuple[Severity, str]] = {
    "checksum": ("error", "a frame or object index of a committed route array fails its CRC-32C"),
    "malformed_chunk": ("error", "a frame, object index or array document cannot be decoded"),
    "missing_object": ("error", "an object of a committed route array is missing"),
    "table_mismatch": ("error", "a sample table row points past the end of its route array"),
    "zero_layer": ("error", "every row of an MoE layer of a sample is all zeros (capture never ran)"),
    "repeated_ids": ("error", "rows holding one expert id more than once (a failed kernel path)"),
    "id_out_of_range": ("error", "rows holding ids >= num_experts"),
    "physical_ids": ("error", "a layer's id distribution looks like physical (EP-remapped) expert ids"),
    "row_count": ("error", "num_rows != num_tokens - 1"),
    "duplicate_sample": ("error", "a sample id committed by more than one commit"),
    "damaged_table": ("error", "a commit's sample table (index/<bucket>/<commit>.parquet) fails its checks: readers "
                               "refuse the store, or skip that commit with on_damaged_table='skip'"),
    "quarantined": ("warning", "a sample the writer quarantined (kept for audit, hidden from readers)"),
    "missing_rows": ("warning", "rows the engine could not capture, stored as missing (get returns -1 there, batches "
                                "give them replay_mask False)"),
    "uncommitted": ("warning", "a route array under routes/ with no sample table (index/<bucket>/<commit>.parquet)"),
    "checkpoint": ("error", "a checkpoint (index/*.checkpoint) fails its checks or disagrees with the sample tables "
                            "(readers skip a damaged one; r3store compact writes a new one)"),
}

#: Kinds that describe a supported state rather than a fault: reported, but a report holding
#: only these is :attr:`ValidationReport.ok` (``r3store validate`` exits 0). ``missing_rows``
#: are rows stored as missing on purpose (``append(..., allow_missing=True)``).
INFORMATIONAL: frozenset[str] = frozenset({"missing_rows"})

#: Kinds a report holding only these (and :data:`INFORMATIONAL` ones) is still
#: :attr:`ValidationReport.ok` with, but not :attr:`ValidationReport.strict_ok`:
#: ``quarantined`` samples, which the writer kept aside as ``on_invalid="quarantine"``
#: promised (readers hide them; ``r3store validate --strict`` fails on them). The faults
#: found in a quarantined sample's routes are warnings too (:attr:`ValidationReport.on_quarantined`).
ACCEPTED: frozenset[str] = frozenset({"quarantined"})

_SEVERITY_RANK = {"error": 0, "warning": 1}
_KIND_RANK = {kind: i for i, kind in enumerate(KINDS)}


def format_rows(rows: Iterable[tuple[int, int]]) -> str:
    """Inclusive row ranges as text.

    Examples
    --------
    >>> format_rows([(0, 63), (70, 70), (80, 81)])
    '0-63, 70, 80-81'
    """
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in rows)


@dataclass(frozen=True)
class Finding:
    """One fault found by :func:`r3store.audit.validate`.

    Examples
    --------
    >>> f = Finding("repeated_ids", "error", "s1", "routes/w-00000", 3, ((0, 63),), "64 rows")
    >>> str(f)
    "error repeated_ids: sample 's1', decoder layer 3, rows 0-63, routes/w-00000: 64 rows"
    """

    kind: str
    """One of :data:`KINDS`."""
    severity: Severity
    """``"error"`` (the data is wrong) or ``"warning"`` (kept aside, needs a look)."""
    sample_id: str | None = None
    """The sample at fault; None for array-, chunk- or layer-level findings."""
    array: str | None = None
    """The route array (``routes/<commit>``), when one is concerned."""
    layer: int | None = None
    """Global decoder-layer index, when one layer is concerned."""
    rows: tuple[tuple[int, int], ...] = ()
    """Inclusive ``(first, last)`` row ranges: within the sample if ``sample_id`` is set,
    else within ``array``."""
    detail: str = ""
    """What was found, in words (counts, ids, reasons)."""
    chunk: tuple[int, int, int] | None = None
    """Inner-chunk grid coordinates ``(row_chunk, layer_chunk, 0)`` of a chunk finding."""

    @property
    def rows_text(self) -> str:
        """:attr:`rows` compressed, e.g. ``"0-63, 70"``."""
        return format_rows(self.rows)

    def sort_key(self) -> tuple[Any, ...]:
        """Report order: errors first, then by kind, array, sample, layer, rows, detail, chunk.

        A total order (two findings with equal keys are equal), so a report does not depend
        on the order in which threads or tasks found its findings.
        """
        return (_SEVERITY_RANK.get(self.severity, 9), _KIND_RANK.get(self.kind, 99), self.array or "",
                self.sample_id or "", -1 if self.layer is None else self.layer, self.rows, self.detail,
                () if self.chunk is None else self.chunk, self.kind, self.severity)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``schema/cli-validate.schema.json``, ``findings`` items)."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "sample_id": self.sample_id,
            "array": self.array,
            "layer": self.layer,
            "rows": [[a, b] for a, b in self.rows],
            "rows_text": self.rows_text,
            "chunk": list(self.chunk) if self.chunk is not None else None,
            "detail": self.detail,
        }

    def __str__(self) -> str:
        where = []
        if self.sample_id is not None:
            where.append(f"sample {self.sample_id!r}")
        if self.layer is not None:
            where.append(f"decoder layer {self.layer}")
        if self.chunk is not None:
            where.append(f"chunk {self.chunk}")
        if self.rows:
            where.append(f"rows {self.rows_text}")
        if self.array is not None:
            where.append(self.array)
        return f"{self.severity} {self.kind}: {', '.join(where)}: {self.detail}"


def make_finding(kind: str, **fields: Any) -> Finding:
    """A :class:`Finding` with the severity of its kind."""
    return Finding(kind, KINDS[kind][0], **fields)


@dataclass(frozen=True)
class ValidationReport:
    """Result of :func:`r3store.audit.validate`."""

    url: str
    """The store audited."""
    spec: dict[str, Any]
    """Its ModelSpec, as a dict."""
    findings: tuple[Finding, ...]
    """Findings, sorted (errors first, then by kind, array, sample, layer); at most
    ``max_findings`` of them (see :attr:`truncated`)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Findings per kind, exact even when :attr:`findings` is truncated."""
    samples_checked: int = 0
    """Samples (quarantined ones included) whose routes were scanned."""
    rows_checked: int = 0
    """Rows of the samples scanned (what ``limit`` and ``sample_filter`` select)."""
    rows_decoded: int = 0
    """Route-array rows decoded: whole chunks, so rows of neighbouring samples that were not
    selected (with ``limit`` or ``sample_filter``) and, in a full audit, rows of no sample too."""
    frames_checked: int = 0
    """Inner chunks (bitpack frames) decoded and checksummed."""
    arrays_checked: int = 0
    """Route arrays scanned."""
    layer_tests: tuple[dict[str, Any], ...] = ()
    """Per MoE layer, the physical-id test statistics (see :func:`physical_id_test`)."""
    truncated: bool = False
    """More findings than ``max_findings`` were found; :attr:`counts` has them all."""
    sample_filter: str | None = None
    """The glob the samples were filtered with."""
    limit: int | None = None
    """The sample limit."""
    on_quarantined: dict[str, int] = field(default_factory=dict)
    """Of :attr:`counts`, the findings in the routes of quarantined samples, per kind: warnings
    whatever their kind (the ``quarantined`` finding gives the writer's reason; readers
    never return these routes)."""

    def _faults(self, accepted: frozenset[str]) -> int:
        return sum(n - self.on_quarantined.get(kind, 0) for kind, n in self.counts.items() if kind not in accepted)

    @property
    def ok(self) -> bool:
        """No findings other than :data:`INFORMATIONAL` ones (rows stored as missing on purpose),
        :data:`ACCEPTED` ones (quarantined samples) and those in quarantined samples' routes."""
        return not self._faults(INFORMATIONAL | ACCEPTED)

    @property
    def strict_ok(self) -> bool:
        """No findings other than :data:`INFORMATIONAL` ones: :attr:`ok`, and no sample
        quarantined (``r3store validate --strict``)."""
        return not self._faults(INFORMATIONAL) and not self.on_quarantined

    @property
    def num_errors(self) -> int:
        """Error findings (those in quarantined samples' routes are counted as warnings)."""
        return sum(n - self.on_quarantined.get(k, 0) for k, n in self.counts.items() if KINDS[k][0] == "error")

    @property
    def num_warnings(self) -> int:
        """Warning findings, those in quarantined samples' routes included."""
        return sum(n if KINDS[k][0] == "warning" else self.on_quarantined.get(k, 0) for k, n in self.counts.items())

    def to_dict(self, *, strict: bool = False) -> dict[str, Any]:
        """JSON-ready dict, validated by ``schema/cli-validate.schema.json``; its ``ok`` is
        :attr:`strict_ok` when ``strict`` (``r3store validate --strict``), else :attr:`ok`."""
        return {
            "url": self.url,
            "spec": self.spec,
            "ok": self.strict_ok if strict else self.ok,
            "strict": strict,
            "sample_filter": self.sample_filter,
            "limit": self.limit,
            "summary": {
                "samples_checked": self.samples_checked,
                "rows_checked": self.rows_checked,
                "rows_decoded": self.rows_decoded,
                "frames_checked": self.frames_checked,
                "arrays_checked": self.arrays_checked,
                "errors": self.num_errors,
                "warnings": self.num_warnings,
                "by_kind": {k: self.counts[k] for k in KINDS if self.counts.get(k)},
                "on_quarantined": dict(self.on_quarantined),
                "truncated": self.truncated,
            },
            "findings": [f.to_dict() for f in self.findings],
            "layer_tests": [dict(t) for t in self.layer_tests],
        }


class RowRuns:
    """Increasing row ranges, appended block by block, kept to at most ``cap`` ranges.

    Rows past the cap are still counted (:attr:`total`), so a finding can say how many
    rows it leaves out.
    """

    __slots__ = ("cap", "end", "runs", "total")

    def __init__(self, cap: int = 32) -> None:
        self.cap = cap
        self.runs: list[list[int]] = []  # half-open [start, stop)
        self.total = 0  # distinct rows added
        self.end = 0  # largest stop added

    def add_range(self, start: int, stop: int) -> None:
        """Add rows ``[start, stop)``; starts must not decrease from call to call (a range
        may repeat or overlap the previous ones: each row is counted once)."""
        if stop <= start:
            return
        self.total += max(0, stop - max(start, self.end))
        self.end = max(self.end, stop)
        if self.runs and start <= self.runs[-1][1]:
            self.runs[-1][1] = max(stop, self.runs[-1][1])
        elif len(self.runs) < self.cap:
            self.runs.append([start, stop])

    def add_mask(self, mask: np.ndarray, offset: int) -> None:
        """Add rows ``offset + i`` for every true ``mask[i]`` (mask: bool, shape (n,))."""
        idx = np.flatnonzero(mask)
        if not idx.size:
            return
        breaks = np.flatnonzero(np.diff(idx) != 1)
        starts = idx[np.r_[0, breaks + 1]]
        stops = idx[np.r_[breaks, idx.size - 1]] + 1
        for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
            self.add_range(offset + a, offset + b)

    @property
    def kept(self) -> int:
        return sum(b - a for a, b in self.runs)

    def inclusive(self) -> tuple[tuple[int, int], ...]:
        return tuple((a, b - 1) for a, b in self.runs)

    def note(self) -> str:
        """`` (+N more rows)`` when the cap dropped ranges."""
        more = self.total - self.kept
        return f" (+{more:,} more rows not listed)" if more else ""
