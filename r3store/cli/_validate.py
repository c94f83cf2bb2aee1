"""``r3store validate``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.cli._gc import parse_duration
from r3store.cli._options import (
    EXIT_FINDINGS,
    EXIT_OK,
    colour_flag,
    handle_errors,
    make_console,
    open_for_audit,
    parse_storage_options,
    print_header,
    storage_option_flag,
    styled,
)
from r3store.cli._scan import echo_json, on_ray, progress_bar, require_selection, scan_options

if TYPE_CHECKING:
    from r3store.audit import ValidationReport

__all__ = ["render_report", "scope_text", "validate"]

_STYLE = {"error": "bold red", "warning": "yellow"}


WIDE_TABLE = 120
"""Console width below which findings are listed one per paragraph instead of as a table
(a seven-column table cannot hold commit names and details at 80 columns)."""


def render_report(report: ValidationReport, console: Console, *, strict: bool = False) -> None:
    """Print a :class:`r3store.audit.ValidationReport` as a table (or, on a console narrower
    than :data:`WIDE_TABLE`, one finding per paragraph) and a summary line, which agrees with
    the exit status (``strict``: quarantined samples count as faults, ``--strict``)."""
    if report.findings:
        print_header(console, "r3store validate", report.url)
    if report.findings and console.width < WIDE_TABLE:
        for f in report.findings:
            severity, rest = str(f).split(" ", 1)
            console.print(styled((severity, _STYLE[f.severity]), " ", rest))
    elif report.findings:
        table = Table()
        for name, wrap in (("severity", False), ("kind", False), ("sample", True), ("layer", False),
                           ("rows", True), ("commit / chunk", True), ("detail", True)):
            table.add_column(name, overflow="fold", no_wrap=not wrap)
        for f in report.findings:
            where = (f.array or "").removeprefix("routes/")
            if f.chunk is not None:
                where += f" chunk {tuple(f.chunk)}"
            table.add_row(Text(f.severity, style=_STYLE[f.severity]), f.kind, Text(f.sample_id or ""),
                          "" if f.layer is None else str(f.layer), f.rows_text, Text(where), Text(f.detail))
        console.print(table)
    scope = scope_text(report)
    if report.strict_ok:
        noted = "".join(f"; {n:,} {k} (informational: rows stored as missing on purpose)"
                        for k, n in report.counts.items() if n)
        console.print(styled(("clean", "bold green"), f": {scope}; every checksum matches, no capture faults{noted}"))
        return
    kinds = ", ".join(f"{n} {k}" for k, n in report.counts.items())
    more = f" (first {len(report.findings):,} listed)" if report.truncated else ""
    console.print(styled((f"{report.num_errors:,} error(s)", "bold red"), ", ",
                         (f"{report.num_warnings:,} warning(s)", "yellow"), f"{more}: {kinds}; scanned {scope}"))
    if report.ok and not strict:
        quarantined = report.counts.get("quarantined", 0)
        inside = sum(report.on_quarantined.values())
        found = f" and the faults in their routes ({inside:,})" if inside else ""
        console.print(styled(("ok", "bold green"), ": no errors; the warnings are quarantined samples "
                                                    f"({quarantined:,}){found}: the writer kept them aside as "
                                                    "on_invalid='quarantine' does, and readers hide them "
                                                    "(--strict fails on them)"))
    elif report.ok:
        console.print(styled(("--strict", "bold red"), ": quarantined samples count as faults (exit status 1)"))


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def scope_text(report: ValidationReport) -> str:
    """What a report covered: samples and their rows (what ``--limit`` and ``--sample-filter``
    select), then what was decoded for them (whole chunks: rows of neighbouring samples too).

    Examples
    --------
    >>> from r3store.audit import ValidationReport
    >>> scope_text(ValidationReport("s", {}, (), samples_checked=2, rows_checked=60, rows_decoded=128,
    ...                             frames_checked=1, arrays_checked=1))
    '2 samples, 60 rows (decoded: 128 rows in 1 chunk of 1 route array)'
    """
    decoded = f"{_count(report.rows_decoded, 'row')} in {_count(report.frames_checked, 'chunk')} of " \
              f"{_count(report.arrays_checked, 'route array')}"
    return f"{_count(report.samples_checked, 'sample')}, {_count(report.rows_checked, 'row')} (decoded: {decoded})"


def young_leftovers(report: ValidationReport, url: str, options: dict[str, Any], grace_s: float, *,
                    strict: bool = False) -> list[str] | None:
    """The commits of a report whose only faults are uncommitted leftovers younger than
    ``grace_s`` (a writer still committing), or None when the report holds anything else
    (informational findings, and quarantined samples unless ``strict``, are not faults)."""
    from r3store.audit import ACCEPTED, INFORMATIONAL, collect_garbage

    passed = INFORMATIONAL if strict else INFORMATIONAL | ACCEPTED
    kinds = {kind for kind, n in report.counts.items()
             if n - (0 if strict else report.on_quarantined.get(kind, 0)) and kind not in passed}
    if kinds != {"uncommitted"} or report.truncated:
        return None
    ages = {item.commit: item.age_s for item in collect_garbage(url, older_than_s=0.0, storage_options=options)}
    commits = [(f.array or "").removeprefix("routes/") for f in report.findings if f.kind == "uncommitted"]
    if all(ages.get(commit, float("inf")) < grace_s for commit in commits):
        return commits
    return None


@click.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema/cli-validate.schema.json).")
@click.option("--grace", default="1h", show_default=True, metavar="DURATION",
              help="Uncommitted leftovers younger than this (s/m/h/d) are taken for a running writer's commit: "
                   "a warning, exit status 0 (r3store gc --older-than uses the same default).")
@click.option("--strict", is_flag=True,
              help="Quarantined samples (and the faults in their routes) are faults too: exit status 1.")
@scan_options
@storage_option_flag
@colour_flag
@handle_errors
def validate(url: str, as_json: bool, grace: str, strict: bool, sample_filter: str | None, limit: int | None,
             workers: int | None, ray_address: str | None, storage_options: tuple[str, ...]) -> None:
    """Check every chunk checksum and look for capture faults in the store at URL.

    Decodes every frame of every committed route array and reports, per sample, MoE
    layer and rows: all-zero layers, repeated ids within a row, ids >= num_experts,
    physical-looking (EP-remapped) id distributions, row counts other than
    num_tokens - 1, duplicate sample ids, quarantined samples, uncommitted leftovers,
    sample tables that fail their checks (damaged_table: every other commit is still
    checked; after r3store compact the commit's routes too, from the checkpoint)
    and missing rows (missing_rows: rows stored as missing with append(...,
    allow_missing=True); informational). Quarantined samples, and the faults in their
    routes, are warnings: the writer kept them aside as on_invalid="quarantine" promised
    (readers hide them); --strict counts them as faults.

    Exit status: 0 clean (or only missing rows, quarantined samples, or uncommitted
    leftovers younger than --grace: a writer still committing), 1 findings, 2 usage or
    I/O error, or a --sample-filter / --limit that selects no sample.
    """
    from r3store.audit import validate as run_validate

    grace_s = parse_duration(grace, "--grace")
    options = parse_storage_options(storage_options, url)
    if ray_address is not None:
        report = on_ray(ray_address, "validate", not as_json, lambda on_cluster, progress: on_cluster.validate(
            url, storage_options=options, sample_filter=sample_filter, limit=limit, workers=workers,
            progress=progress))
    else:
        store = open_for_audit(url, options, {"on_duplicate": "report"})
        with progress_bar("validate", enabled=not as_json) as progress:
            report = run_validate(store, sample_filter=sample_filter, limit=limit, workers=workers, progress=progress)
    require_selection(report.samples_checked, url, sample_filter=sample_filter, limit=limit,
                      total=None if ray_address is not None else len(store.samples))
    passed = report.strict_ok if strict else report.ok
    young = None if passed else young_leftovers(report, url, options, grace_s, strict=strict)
    passed = passed or young is not None
    if as_json:
        doc = report.to_dict(strict=strict)
        doc["ok"] = passed
        echo_json(doc)
    else:
        console = make_console()
        render_report(report, console, strict=strict)
        if young is not None:
            console.print(styled(("warning", "yellow"), f": {len(young)} uncommitted leftover(s) younger than {grace}: "
                                                        "a writer is probably still committing; not a fault (exit 0)"))
    click.get_current_context().exit(EXIT_OK if passed else EXIT_FINDINGS)
