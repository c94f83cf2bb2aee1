"""`validate`: checksum every chunk and look for the known capture faults.

What is checked (capture faults reported against SGLang, Miles and verl; each check yields :class:`Finding` s of one
kind, see :data:`r3store.audit.KINDS`):

* every frame of every committed route array is decoded: CRC-32C mismatches
  (``checksum``), undecodable frames or object indexes (``malformed_chunk``) and missing
  objects (``missing_object``) become findings naming the array and chunk;
* per sample and MoE layer: all rows zero (``zero_layer``), rows repeating an id
  (``repeated_ids``), rows with ids ``>= num_experts`` (``id_out_of_range``);
* per MoE layer, over all audited rows: the physical-id test (``physical_ids``, see
  :func:`r3store.audit.physical_id_test`);
* per sample, from the sample table: ``num_rows != num_tokens - 1`` (``row_count``),
  quarantined samples with their reason (``quarantined``), rows the engine could not
  capture (``missing_rows``; they are stored as zeros and left out of every route check),
  rows past the array end (``table_mismatch``);
* per store: ids committed by two commits (``duplicate_sample``), route arrays with no
  sample table (``uncommitted``), and sample tables that fail their checks
  (``damaged_table``: open the store with ``on_damaged_table="skip"`` so the other commits
  are audited; a commit a valid checkpoint covers is still audited from the checkpoint's rows).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from r3store._checks import parse_int
from r3store._format import INDEX_PREFIX, ArrayGeometry, array_key, parse_ranges, parse_table_key
from r3store._spec import ModelSpec
from r3store.audit._findings import KINDS, Finding, RowRuns, ValidationReport, format_rows, make_finding
from r3store.audit._gc import checkpoint_listed, later_commit_of_writer
from r3store.audit._physical import ALPHA, physical_id_test
from r3store.audit._scan import (
    ProgressCallback,
    ScanPlan,
    ScanUnit,
    aligned_ranges,
    row_blocks,
    run_plan,
    select_samples,
)
from r3store.codecs.kernels import route_stats, route_stats_pieces
from r3store.errors import ChecksumError, FormatError, ObjectNotFoundError, UnknownCodecError
from r3store.reader import (
    RouteReader,
    checkpoint_keys,
    committed_commits,
    load_checkpoint,
    read_all_rows,
    table_keys,
)

__all__ = ["plan_validate", "validate"]

BLOCK_IDS = 1 << 22
"""Ids decoded per row block (times 4 bytes for int32, plus sort scratch): about 16 MiB."""

_CHUNK_PREFIX = re.compile(r"^chunk \([\d, ]*\): ")

LOAD_BOUND = 8.0
"""Highest per-layer max/mean expert load of real traces (published routing statistics of
Mixtral, OLMoE, DeepSeek-V3 and FLAME-MoE)."""


@dataclass
class _Sample:
    """Running checks of one sample while its rows stream by."""

    sample_id: str
    start: int
    num_rows: int
    num_layers: int
    valid: np.ndarray = field(init=False)
    nonzero: np.ndarray = field(init=False)
    max_id: np.ndarray = field(init=False)
    repeated: dict[int, RowRuns] = field(default_factory=dict)
    out_of_range: dict[int, RowRuns] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.valid = np.zeros(self.num_layers, np.int64)
        self.nonzero = np.zeros(self.num_layers, np.int64)
        self.max_id = np.full(self.num_layers, -1, np.int64)

    @property
    def stop(self) -> int:
        return self.start + self.num_rows


@dataclass
class _Problem:
    """A chunk that could not be read, merged over the rows it covers."""

    kind: str
    chunk: tuple[int, int, int] | None
    layers: set[int]
    message: str
    rows: RowRuns = field(default_factory=lambda: RowRuns(cap=64))
    unread: int = 0
    """Chunks not read at all (their object is missing): not counted as checked."""


@dataclass
class _Result:
    """What one unit (one route array) found: the partial result the merge folds."""

    hist: np.ndarray
    findings: list[Finding] = field(default_factory=list)
    counts: dict[str, int] | None = None
    """Findings per kind when :attr:`findings` was cut to the report's cap (None: not cut)."""
    samples: int = 0
    rows: int = 0
    """Rows of the samples scanned."""
    decoded: int = 0
    """Route-array rows decoded (whole chunks: rows of other samples, or of none, too);
    a row with a corrupt or missing chunk in any layer is not counted."""
    frames: int = 0
    """Frames whose checks ran (those that failed them included; not those of missing objects)."""
    on_quarantined: dict[str, int] = field(default_factory=dict)
    """Findings per kind on quarantined samples (warnings, see :func:`_on_quarantined`)."""


@dataclass(frozen=True)
class _Unit:
    array: str
    samples: tuple[tuple[str, int, int], ...]
    """(sample_id, row_start, num_rows) of the audited samples in the array."""
    full: bool
    """Decode every row of the array (not only the samples' rows)."""
    missing: tuple[tuple[int, int], ...] = ()
    """Rows of the array the engine could not capture (half-open; left out of the checks)."""


def zero_layer_min_rows(num_experts: int, top_k: int) -> int | None:
    """Rows from which an all-zero layer cannot be chance.

    With ``top_k >= 2`` an all-zero row repeats id 0: one row is enough. With top-1,
    routing every row to expert 0 is legal; with a per-layer max/mean load of at most
    :data:`LOAD_BOUND` (published routing statistics of Mixtral, OLMoE, DeepSeek-V3 and
    FLAME-MoE) it happens by chance with probability at most ``(8 / num_experts) ** rows``,
    which must fall below the audit's 1e-3. None: never (top-1 with 8 experts or fewer).
    """
    if top_k >= 2:
        return 1
    p0 = LOAD_BOUND / num_experts
    if p0 >= 1:
        return None
    return math.ceil(math.log(ALPHA) / math.log(p0) + 1e-9)


def validate(store: RouteReader, *, sample_filter: str | None = None, limit: int | None = None,
             workers: int | None = None, progress: ProgressCallback | None = None,
             max_findings: int = 10_000) -> ValidationReport:
    """Checksum every chunk and look for capture faults (see the module docstring).

    Parameters
    ----------
    store : RouteReader
        Open it with ``on_duplicate="report"`` (or ``"first"``) so duplicates are listed, and
        ``on_damaged_table="skip"`` so a damaged sample table is a ``damaged_table`` finding
        instead of an error at open (``r3store validate`` does both).
    sample_filter : str, optional
        ``fnmatch`` glob on sample ids: audit only matching samples (quarantined ones
        included). With a filter or a limit only the chunks of the selected samples are
        decoded, and uncommitted leftovers are not looked for.
    limit : int, optional
        Audit the first ``limit`` (matching) samples, in store order.
    workers : int, optional
        Threads reading route arrays concurrently (one array per task); default 1 on
        local disk, 8 on remote backends. Each thread reads through its own RouteReader.
    progress : callable, optional
        ``progress(rows_done, rows_total)``, called as row blocks are decoded.
    max_findings : int
        Findings kept in the report (the per-kind counts stay exact).

    Returns
    -------
    ValidationReport

    Raises
    ------
    r3store.errors.StorageError
        The backend failed (a missing object is a finding, not an error).
    ValueError
        ``limit`` or ``workers`` is invalid.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    >>> path = tempfile.mkdtemp()
    >>> with r3store.RouteWriter(path, spec, {"on_invalid": "quarantine"}) as w:
    ...     w.append("ok", np.array([[[0, 1], [2, 3]]] * 4), num_tokens=5)
    ...     w.append("bad", np.array([[[5, 5], [2, 3]]] * 4), num_tokens=5)
    >>> report = validate(r3store.open_store(path))
    >>> [str(f) for f in report.findings if f.kind == "repeated_ids"]  # doctest: +ELLIPSIS +NORMALIZE_WHITESPACE
    ["warning repeated_ids: sample 'bad', decoder layer 0, rows 0-3, routes/...:
      4 of 4 rows hold an expert id more than once (quarantined sample: hidden from readers)"]
    >>> report.ok, report.strict_ok, report.num_errors  # a quarantined sample is a warning
    (True, False, 0)
    """
    plan = plan_validate(store, sample_filter=sample_filter, limit=limit, max_findings=max_findings)
    return run_plan(plan, [store], workers=workers, progress=progress)


def plan_validate(store: RouteReader, *, sample_filter: str | None = None, limit: int | None = None,
                  max_findings: int = 10_000) -> ScanPlan[ValidationReport]:
    """:func:`validate` as a :class:`r3store.audit.ScanPlan`: one unit per route array.

    The sample-table checks (row counts, quarantined samples), duplicate ids and
    uncommitted leftovers are found here, from the catalogue; each unit decodes one
    route array (any reader of its commit will do) and the merge adds the per-layer
    physical-id tests. ``run_plan(plan_validate(store, ...), [store])`` is
    :func:`validate`; ``r3store.ray`` runs the units as Ray tasks.

    Parameters are as for :func:`validate`.

    Raises
    ------
    r3store.errors.OptionError
        ``limit`` or ``max_findings`` is invalid.
    r3store.errors.StorageError
        Listing the store for leftovers failed.
    """
    max_findings = parse_int("max_findings", max_findings, minimum=0)
    spec = store.spec
    table = select_samples(store.samples, sample_filter, limit)
    subset = sample_filter is not None or limit is not None
    head = _table_findings(table) + _duplicate_findings(store, table, subset)
    damaged = store.skipped_commits
    if not subset:
        head += _leftover_findings(store)
        if not store.is_partial:
            found, damaged_too = _checkpoint_findings(store)
            head += found
            damaged = {**damaged_too, **damaged}
    head += _damaged_findings(store, damaged)
    flags = table.column("quarantined").to_pylist()
    quarantined = frozenset(sid for sid, q in zip(table.column("sample_id").to_pylist(), flags, strict=True) if q)
    commit_of = {array_key(commit): commit for commit in store.commits}
    units = tuple(ScanUnit(i, sum(n for _, _, n in u.samples), ((commit_of[u.array],),), u)
                  for i, u in enumerate(_units(store, table, full=not subset)))
    merge = functools.partial(_merge, url=store.url, spec=spec, head=tuple(head), arrays=len(units),
                              max_findings=max_findings, sample_filter=sample_filter, limit=limit)
    return ScanPlan("validate", units, functools.partial(_scan_unit, max_findings=max_findings,
                                                         quarantined=quarantined), merge,
                    on_duplicate="report")


def _scan_unit(stores: Sequence[RouteReader], unit: ScanUnit, advance: Callable[[int], None], *,
               max_findings: int, quarantined: frozenset[str] = frozenset()) -> _Result:
    """The mapper: scan one route array; keep its first ``max_findings`` findings (all counted).

    Findings on ``quarantined`` samples are warnings (the writer kept them aside, as
    ``on_invalid="quarantine"`` promised), counted per kind in ``_Result.on_quarantined``."""
    res = _scan_array(stores[0], unit.work, advance)
    if quarantined:
        res.findings = [_on_quarantined(f, res.on_quarantined) if f.sample_id in quarantined else f
                        for f in res.findings]
    if len(res.findings) > max_findings:
        kept = _Kept(max_findings)
        kept.add(res.findings)
        res.findings, res.counts = list(kept.result()), kept.counts
    return res


def _merge(partials: Iterable[_Result], *, url: str, spec: ModelSpec, head: tuple[Finding, ...], arrays: int,
           max_findings: int, sample_filter: str | None, limit: int | None) -> ValidationReport:
    """The merge: add up the units' results (any order) and test each layer's id histogram."""
    findings = _Kept(max_findings)
    findings.add(list(head))
    hist = np.zeros((spec.num_moe_layers, 1 << spec.bits_per_id), np.int64)
    samples = rows = decoded = frames = 0
    on_quarantined: dict[str, int] = {}
    for res in partials:
        hist += res.hist
        for kind, n in res.on_quarantined.items():
            on_quarantined[kind] = on_quarantined.get(kind, 0) + n
        findings.add(res.findings, res.counts)
        samples, rows, frames = samples + res.samples, rows + res.rows, frames + res.frames
        decoded += res.decoded
    tests = []
    for pos, layer in enumerate(spec.moe_layers):
        test = {"layer": layer, **physical_id_test(hist[pos], spec.num_experts)}
        tests.append(test)
        if test["physical"]:
            findings.add([make_finding("physical_ids", layer=layer, detail=test["reason"])])
    kept = findings.result()
    return ValidationReport(
        url=url, spec=dict(spec.to_dict()), findings=kept, counts=findings.counts,
        samples_checked=samples, rows_checked=rows, rows_decoded=decoded, frames_checked=frames, arrays_checked=arrays,
        layer_tests=tuple(tests), truncated=findings.truncated, sample_filter=sample_filter, limit=limit,
        on_quarantined={k: on_quarantined[k] for k in KINDS if k in on_quarantined},
    )


def _on_quarantined(finding: Finding, counts: dict[str, int]) -> Finding:
    """``finding`` (of a quarantined sample) as a warning; counted in ``counts`` by kind."""
    counts[finding.kind] = counts.get(finding.kind, 0) + 1
    return dataclasses.replace(finding, severity="warning",
                               detail=f"{finding.detail} (quarantined sample: hidden from readers)")


class _Kept:
    """The first ``cap`` findings in sort order (a total order), whatever order they arrive
    in (bounded memory, same result with any number of threads or tasks); counts every
    finding by kind."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.items: list[Finding] = []
        self.counts: dict[str, int] = {}
        self.total = 0

    def add(self, findings: list[Finding], counts: dict[str, int] | None = None) -> None:
        """Add findings; ``counts``: how many of each kind they stand for (when they were cut)."""
        if counts is None:
            counts = {}
            for f in findings:
                counts[f.kind] = counts.get(f.kind, 0) + 1
        for kind, n in counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + n
        self.total += sum(counts.values())
        self.items += findings
        if len(self.items) > 2 * self.cap + 1024:
            self._trim()

    def _trim(self) -> None:
        self.items.sort(key=Finding.sort_key)
        del self.items[self.cap :]

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def result(self) -> tuple[Finding, ...]:
        self._trim()
        self.counts = {k: self.counts[k] for k in KINDS if k in self.counts}
        return tuple(self.items)


# -- sample-table and store-level checks ----------------------------------------------


def _table_findings(table: pa.Table) -> list[Finding]:
    cols = table.select(["sample_id", "array", "num_rows", "num_tokens", "quarantined", "reason",
                         "missing_rows"]).to_pydict()
    out = []
    for sid, array, rows, tokens, quarantined, reason, missing in zip(*cols.values(), strict=True):
        if quarantined:
            out.append(make_finding("quarantined", sample_id=sid, array=array, detail=reason or "no reason recorded"))
        if missing is not None:
            ranges = parse_ranges(missing, rows)
            count = sum(b - a for a, b in ranges)
            out.append(make_finding("missing_rows", sample_id=sid, array=array,
                                    rows=tuple((a, b - 1) for a, b in ranges[:32]),
                                    detail=f"{count:,} of {rows:,} rows were not captured by the engine "
                                           "(appended with allow_missing=True)"))
        if rows != tokens - 1 and (rows or not quarantined):
            extra = " (a row for the last token too)" if rows == tokens else ""
            span = ((0, rows - 1),) if rows else ()
            detail = f"{rows} rows for {tokens} tokens; expected num_tokens - 1 = {tokens - 1}{extra}"
            out.append(make_finding("row_count", sample_id=sid, array=array, rows=span, detail=detail))
    return out


def _duplicate_findings(store: RouteReader, table: pa.Table, subset: bool) -> list[Finding]:
    wanted = set(table.column("sample_id").to_pylist()) if subset else None
    return [make_finding("duplicate_sample", sample_id=sid,
                         detail=f"committed by commits {', '.join(commits)}; open_store refuses the store "
                                "(DuplicateSampleError) unless the reader option on_duplicate is 'first' or "
                                "'report' (both read one copy: the earliest commit's, unless it is quarantined "
                                "and a later one is not)")
            for sid, commits in store.duplicates.items() if wanted is None or sid in wanted]


def _leftover_findings(store: RouteReader) -> list[Finding]:
    """Route arrays with no sample table: a crashed or running writer's, or a committed sample whose
    table was lost; the detail says which evidence there is (a checkpoint listing the commit, a
    later commit of the same writer)."""
    uncommitted = store.storage_usage().uncommitted
    if not uncommitted:
        return []
    listed = checkpoint_listed(store.backend, store.manifest)
    committed = committed_commits(store.backend)
    out = []
    for commit, nbytes in uncommitted.items():
        later = later_commit_of_writer(commit, committed)
        if commit in listed:
            why = (f"checkpoint {listed[commit]} lists this commit as committed: its sample table was lost "
                   "(deleted, or left out of a copy or sync), not a crashed writer's; restore the table from where "
                   "the store came from (r3store gc --delete refuses these routes)")
        elif later is not None:
            why = (f"a crashed or still-running writer's, or a committed sample whose table was lost: the same writer "
                   f"committed {later!r} later, which points to a lost table (restore it: r3store gc --delete "
                   "would delete these routes for good)")
        else:
            why = ("a crashed or still-running writer's (r3store gc deletes old leftovers), or a committed sample "
                   "whose table was lost (a partial copy or sync): check that no copy of the store has "
                   f"index/<bucket>/{commit}.parquet before r3store gc --delete deletes these routes for good")
        out.append(make_finding("uncommitted", array=array_key(commit), detail=f"{nbytes:,} bytes, no sample table: "
                                                                               f"{why}"))
    return out


def _damaged_findings(store: RouteReader, damaged: dict[str, str]) -> list[Finding]:
    """One ``damaged_table`` finding per commit whose sample table fails its checks (``damaged``:
    commit -> ``"<table path>: <fault>"``)."""
    out = []
    for commit, fault in sorted(damaged.items()):
        if commit in store.commits:  # a checkpoint covers it: its rows (and routes) were read from there
            effect = ("a checkpoint covers this commit: readers using it still read its samples, and its routes "
                      "were checked; readers without it (use_checkpoint=False) refuse the store")
        else:
            effect = ("readers refuse the store (open_store raises) unless opened with on_damaged_table='skip', "
                      "which leaves this commit's samples out; its routes were not checked")
        out.append(make_finding("damaged_table", array=array_key(commit),
                                detail=f"sample table of commit {commit!r} fails its checks: {fault}; {effect}"))
    return out


def _checkpoint_findings(store: RouteReader) -> tuple[list[Finding], dict[str, str]]:
    """Each checkpoint passes its checks and holds exactly the rows of the sample tables of the
    commits it covers (every covered commit still has its table; one whose table is damaged is
    left out of the comparison). Returns the findings and the damaged tables met (commit -> fault)."""
    keys = checkpoint_keys(store.backend)
    if not keys:
        return [], {}
    damaged: dict[str, str] = {}  # each damaged table becomes a finding of its own
    tables = read_all_rows(store.backend, store.manifest, damaged=damaged)  # from the sample tables, not a checkpoint
    by_commit = tables.sort_by([("commit", "ascending"), ("row_start", "ascending")])
    commits = set(by_commit.column("commit").to_pylist())
    newest_bucket = {commit: max((parse_table_key(k) or (None, ""))[0] or "" for k in found)
                     for commit, found in table_keys(store.backend.list_prefix(INDEX_PREFIX), store.manifest.version,
                                                     store.backend.path_of).items()}
    out = []
    for key in keys:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded = load_checkpoint(store.backend, store.manifest, keys=[key])
        if loaded is None:
            why = str(caught[0].message) if caught else "fails its checks"
            out.append(make_finding("checkpoint", array=key, detail=why))
            continue
        absent = sorted(loaded.info.commits - commits - set(damaged))
        if absent:
            out.append(make_finding("checkpoint", array=key, detail=f"covers {len(absent)} commit(s) with no sample "
                                                                   f"table, e.g. {absent[0]!r}"))
            continue
        hidden = sorted(c for c, bucket in newest_bucket.items()
                        if c not in loaded.info.commits and bucket < loaded.info.watermark)
        if hidden:
            out.append(make_finding("checkpoint", array=key, detail=(
                f"{len(hidden)} committed commit(s) lie only in buckets older than its watermark "
                f"{loaded.info.watermark} and are not covered, e.g. {hidden[0]!r}: readers using it do not see "
                "them (a writer whose clock was behind the store's, FORMAT.md section 12.2)")))
            continue
        mine = loaded.table.sort_by([("commit", "ascending"), ("row_start", "ascending")])
        if damaged:  # no table to compare these commits' rows with
            mine = mine.filter(pc.invert(pc.is_in(mine.column("commit"), value_set=pa.array(sorted(damaged),
                                                                                              pa.string()))))
        theirs = by_commit.filter(pc.is_in(by_commit.column("commit"),
                                           value_set=pa.array(sorted(loaded.info.commits), pa.string())))
        fault = _rows_differ(mine, theirs)
        if fault is not None:
            out.append(make_finding("checkpoint", array=key, detail=f"disagrees with the sample tables: {fault}"))
    return out, damaged


def _rows_differ(mine: pa.Table, theirs: pa.Table) -> str | None:
    """Why two sets of sample rows (same order) differ, or None: every column of either, compared
    as values (a metadata column a commit lacks is null; clashing types compared as text)."""
    if mine.num_rows != theirs.num_rows:
        return f"{mine.num_rows} rows, the tables of its commits hold {theirs.num_rows}"
    for name in dict.fromkeys(mine.column_names + theirs.column_names):
        a = mine.column(name) if name in mine.column_names else pa.nulls(mine.num_rows)
        b = theirs.column(name) if name in theirs.column_names else pa.nulls(theirs.num_rows)
        if a.type != b.type and not (pa.types.is_null(a.type) or pa.types.is_null(b.type)):
            a, b = pc.cast(a, pa.string()), pc.cast(b, pa.string())
        if a.to_pylist() != b.to_pylist():
            i = next(j for j, (x, y) in enumerate(zip(a.to_pylist(), b.to_pylist(), strict=True)) if x != y)
            return f"column {name!r}, row of sample {mine.column('sample_id')[i].as_py()!r}"
    return None


def _units(store: RouteReader, table: pa.Table, full: bool) -> list[_Unit]:
    cols = table.select(["sample_id", "array", "row_start", "num_rows", "missing_rows"]).to_pydict()
    by_array: dict[str, list[tuple[str, int, int]]] = {}
    missing: dict[str, list[tuple[int, int]]] = {}
    if full:
        for commit in store.commits:
            by_array[array_key(commit)] = []
    for sid, array, start, rows, gaps in zip(*cols.values(), strict=True):
        by_array.setdefault(array, []).append((sid, start, rows))
        if gaps is not None:
            missing.setdefault(array, []).extend((start + a, start + b) for a, b in parse_ranges(gaps, rows))
    return [_Unit(array, tuple(sorted(samples, key=lambda s: s[1])), full, tuple(sorted(missing.get(array, []))))
            for array, samples in by_array.items()]


# -- scanning one route array ------------------------------------------------------------


def _scan_array(rs: RouteReader, unit: _Unit, advance: Callable[[int], None]) -> _Result:
    spec = rs.spec
    res = _Result(np.zeros((spec.num_moe_layers, 1 << spec.bits_per_id), np.int64))
    try:
        geometry = rs.geometry_of(unit.array, partial=True)
    except ObjectNotFoundError as exc:
        res.findings.append(make_finding("missing_object", array=unit.array, detail=f"{exc}"))
        return res
    except (FormatError, UnknownCodecError) as exc:  # an unknown codec: its chunks cannot be decoded here
        res.findings.append(make_finding("malformed_chunk", array=unit.array, detail=f"{exc}"))
        return res
    samples = []
    for sid, start, rows in unit.samples:
        if start + rows > geometry.rows:
            res.findings.append(make_finding(
                "table_mismatch", sample_id=sid, array=unit.array,
                detail=f"rows [{start}, {start + rows}) of the array, which has {geometry.rows} rows"))
        else:
            samples.append(_Sample(sid, start, rows, spec.num_moe_layers))
    res.samples = len(samples)
    res.rows = sum(s.num_rows for s in samples)
    wanted = [(0, geometry.rows)] if unit.full else [(s.start, s.stop) for s in samples]
    ranges = aligned_ranges(wanted, geometry.chunk_rows, geometry.rows)
    block_rows = max(1, BLOCK_IDS // (spec.num_moe_layers * spec.top_k) // geometry.chunk_rows) * geometry.chunk_rows
    problems: dict[tuple[str, str], _Problem] = {}
    scanner = _SampleScanner(samples, spec, res, unit.array, unit.missing)
    for lo, hi in row_blocks(ranges, block_rows):
        unread = sum(p.unread for p in problems.values())
        x, valid = _read_block(rs, unit.array, geometry, lo, hi, problems, spec.moe_layers)
        unread = sum(p.unread for p in problems.values()) - unread  # chunks of missing objects: not checked
        res.decoded += hi - lo if valid is None else int(valid.all(axis=1).sum())
        res.frames += (-(-hi // geometry.chunk_rows) - lo // geometry.chunk_rows) * geometry.layer_chunks - unread
        scanner.feed(lo, x, valid)
        advance(hi - lo)
    scanner.finish()
    res.findings += _problem_findings(unit.array, problems, samples)
    rs.clear_cache()
    return res


def _read_block(rs: RouteReader, array: str, geometry: ArrayGeometry, lo: int, hi: int,
                problems: dict[tuple[str, str], _Problem],
                moe_layers: Sequence[int]) -> tuple[np.ndarray, np.ndarray | None]:
    """Rows ``[lo, hi)`` of all layers; on a failure, chunk by chunk, recording each bad one.

    Returns the ids and a bool (rows, layers) mask of readable cells (None: all readable).
    """
    positions = list(range(geometry.num_moe_layers))
    try:
        return rs.read_rows(array, lo, hi, positions), None
    except (FormatError, ObjectNotFoundError):
        pass
    x = np.zeros((hi - lo, geometry.num_moe_layers, geometry.top_k), np.int32)
    valid = np.ones((hi - lo, geometry.num_moe_layers), bool)
    lpc, cr = geometry.layers_per_chunk, geometry.chunk_rows
    for c in range(lo // cr, -(-hi // cr)):
        r0, r1 = max(lo, c * cr), min(hi, (c + 1) * cr)
        for b in range(geometry.layer_chunks):
            pos = positions[b * lpc : (b + 1) * lpc]
            err: Exception
            try:
                x[r0 - lo : r1 - lo, pos] = rs.read_rows(array, r0, r1, pos)
                continue
            except ChecksumError as exc:
                kind, chunk, err, what = "checksum", exc.chunk if len(exc.chunk) == 3 else (c, b, 0), exc, exc.fault
            except FormatError as exc:
                kind, chunk, err, what = "malformed_chunk", (c, b, 0), exc, exc.fault
            except ObjectNotFoundError as exc:
                kind, chunk, err, what = "missing_object", None, exc, str(exc)
            valid[r0 - lo : r1 - lo, pos] = False
            what = _CHUNK_PREFIX.sub("", what)  # the chunk has its own field
            problem = problems.setdefault((kind, str(err)), _Problem(kind, chunk, set(), what))
            problem.layers.update(moe_layers[p] for p in pos)
            problem.rows.add_range(r0, r1)
            problem.unread += kind == "missing_object"
    return x, valid


def _problem_findings(array: str, problems: dict[tuple[str, str], _Problem], samples: list[_Sample]) -> list[Finding]:
    starts = [s.start for s in samples]
    out = []
    for p in problems.values():
        layers = sorted(p.layers)
        hit: list[str] = []
        for a, b in p.rows.runs:
            i = max(0, bisect.bisect_right(starts, a) - 1)
            while i < len(samples) and samples[i].start < b:
                if samples[i].stop > a and samples[i].sample_id not in hit:
                    hit.append(samples[i].sample_id)
                i += 1
        affects = f"; affects samples {', '.join(map(repr, hit[:5]))}{' ...' if len(hit) > 5 else ''}" if hit else ""
        span = f"; decoder layers {format_rows(_runs(layers))}" if len(layers) > 1 else ""
        out.append(make_finding(p.kind, array=array, layer=layers[0] if len(layers) == 1 else None,
                                rows=p.rows.inclusive(), chunk=p.chunk,
                                detail=f"{p.message}{span}{affects}{p.rows.note()}"))
    return out


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


class _SampleScanner:
    """Feeds row blocks (in increasing row order) to the samples they overlap."""

    def __init__(self, samples: list[_Sample], spec: Any, res: _Result, array: str,
                 missing: tuple[tuple[int, int], ...] = ()) -> None:
        self.samples = samples
        self.missing = missing
        self.missing_ends = [b for _, b in missing]
        self.spec = spec
        self.res = res
        self.array = array
        self.next = 0
        self.min_zero_rows = zero_layer_min_rows(spec.num_experts, spec.top_k)

    def feed(self, lo: int, x: np.ndarray, valid: np.ndarray | None) -> None:
        """Check rows ``[lo, lo + len(x))``; ``valid`` masks unreadable (row, layer) cells."""
        hi = lo + len(x)
        if self.next >= len(self.samples) or self.samples[self.next].start >= hi:
            return
        ok = None if valid is None else valid.copy()  # None: every cell counts
        i = bisect.bisect_right(self.missing_ends, lo)  # rows the engine did not capture hold zeros: skip them
        while i < len(self.missing) and self.missing[i][0] < hi:
            a, b = self.missing[i]
            if ok is None:
                ok = np.ones((len(x), x.shape[1]), bool)
            ok[max(a, lo) - lo : min(b, hi) - lo] = False
            i += 1
        in_sample = np.zeros(len(x), bool)
        i = self.next
        while i < len(self.samples) and self.samples[i].start < hi:
            s = self.samples[i]
            in_sample[max(lo, s.start) - lo : min(hi, s.stop) - lo] = True
            i += 1
        if ok is None and in_sample.all():
            counted = None
        else:
            counted = (np.ones((len(x), x.shape[1]), bool) if ok is None else ok) & in_sample[:, None]
        if ok is None and self._feed_pieces(lo, hi, x, counted):  # the common case: per-sample sums
            return
        # one pass in C: per (row, layer) the top id (ids are >= 0, so top == 0 means all zeros) and
        # whether an id repeats; the ids of the counted cells go to the histogram
        top, repeated = route_stats(x, self.res.hist, counted)
        i = self.next
        while i < len(self.samples) and self.samples[i].start < hi:
            s = self.samples[i]
            a, b = max(lo, s.start), min(hi, s.stop)
            sl = slice(a - lo, b - lo)
            self._update(s, a - s.start, top[sl], repeated[sl], None if ok is None else ok[sl],
                         self.spec.num_experts)
            if s.stop <= hi:
                self._finish(s)
                if i == self.next:
                    self.next += 1
            i += 1

    def _feed_pieces(self, lo: int, hi: int, x: np.ndarray, counted: np.ndarray | None) -> bool:
        """Rows ``[lo, hi)`` when every cell is readable and captured: one pass in C sums
        each sample's piece per layer (top id, a repeat, cells not all zeros) and counts the
        ids of the samples' rows in the histogram; only a piece with a repeated or out of
        range id is looked at cell by cell (which rows). False, having done nothing, when the
        samples' pieces overlap (then :meth:`feed` goes cell by cell)."""
        touched: list[tuple[_Sample, int, int]] = []  # sample, first and stop row of its piece (block rows)
        i = self.next
        while i < len(self.samples) and self.samples[i].start < hi:
            s = self.samples[i]
            touched.append((s, max(lo, s.start) - lo, min(hi, s.stop) - lo))
            i += 1
        cuts = sorted({0, len(x), *(a for _, a, _ in touched), *(b for _, _, b in touched)})
        where = {a: p for p, a in enumerate(cuts[:-1])}
        if any(b > a and cuts[where[a] + 1] != b for _, a, b in touched):
            return False
        top, repeated, nonzero = route_stats_pieces(x, cuts, self.res.hist, counted)
        num_experts = self.spec.num_experts
        for s, a, b in touched:
            if b > a:
                p = where[a]
                s.valid += b - a
                s.nonzero += nonzero[p]
                s.max_id = np.maximum(s.max_id, top[p])
                if repeated[p].any() or (top[p] >= num_experts).any():  # which rows: cell by cell
                    cell_top, cell_repeated = route_stats(x[a:b])
                    self._faults(s, lo + a - s.start, cell_repeated, cell_top >= num_experts)
            if s.stop <= hi:
                self._finish(s)
        while self.next < len(self.samples) and self.samples[self.next].stop <= hi:
            self.next += 1
        return True

    @staticmethod
    def _faults(s: _Sample, row0: int, repeated: np.ndarray, out_of_range: np.ndarray) -> None:
        """Record the rows ``row0 + [0, len(repeated))`` of ``s`` whose cells repeat an id or hold
        one out of range, per layer (``repeated``, ``out_of_range``: bool (rows, layers))."""
        for pos in np.flatnonzero(repeated.any(axis=0)):
            s.repeated.setdefault(int(pos), RowRuns()).add_mask(repeated[:, pos], row0)
        for pos in np.flatnonzero(out_of_range.any(axis=0)):
            s.out_of_range.setdefault(int(pos), RowRuns()).add_mask(out_of_range[:, pos], row0)

    @classmethod
    def _update(cls, s: _Sample, row0: int, top: np.ndarray, repeated: np.ndarray, ok: np.ndarray | None,
                num_experts: int) -> None:
        """Add rows ``row0 + [0, len(top))`` of ``s``: ``top``/``repeated`` per (row, layer) from
        :func:`route_stats`; ``ok``: the cells that count (None: all of them, the common case,
        which needs only per-layer reductions)."""
        if ok is None:
            s.valid += len(top)
            s.nonzero += np.count_nonzero(top, axis=0)
            layer_max = top.max(axis=0, initial=-1)
            s.max_id = np.maximum(s.max_id, layer_max)
            if repeated.any() or (layer_max >= num_experts).any():  # the per-cell masks only then
                cls._faults(s, row0, repeated, top >= num_experts)
            return
        s.valid += ok.sum(axis=0)
        s.nonzero += ((top != 0) & ok).sum(axis=0)
        s.max_id = np.maximum(s.max_id, np.where(ok, top, -1).max(axis=0, initial=-1))
        cls._faults(s, row0, repeated & ok, (top >= num_experts) & ok)

    def _finish(self, s: _Sample) -> None:
        spec, out = self.spec, self.res.findings
        where = {"sample_id": s.sample_id, "array": self.array}
        for pos, layer in enumerate(spec.moe_layers):
            rows = int(s.valid[pos])
            if rows and s.nonzero[pos] == 0 and self.min_zero_rows is not None and rows >= self.min_zero_rows:
                out.append(make_finding("zero_layer", layer=layer, rows=((0, s.num_rows - 1),), **where,
                                        detail=f"all {rows:,} rows are zeros: the layer was not captured"))
                self.res.hist[pos, 0] -= rows * spec.top_k  # no evidence about the ids in use
            elif pos in s.repeated:
                runs = s.repeated[pos]
                out.append(make_finding("repeated_ids", layer=layer, rows=runs.inclusive(), **where,
                                        detail=f"{runs.total:,} of {s.num_rows:,} rows hold an expert id more "
                                               f"than once{runs.note()}"))
            if pos in s.out_of_range:
                runs = s.out_of_range[pos]
                out.append(make_finding("id_out_of_range", layer=layer, rows=runs.inclusive(), **where,
                                        detail=f"{runs.total:,} of {s.num_rows:,} rows hold ids >= num_experts "
                                               f"({spec.num_experts}); max id {int(s.max_id[pos])}{runs.note()}"))

    def finish(self) -> None:
        """Close the samples no block reached (samples without rows)."""
        for s in self.samples[self.next :]:
            if s.num_rows == 0:
                self._finish(s)
