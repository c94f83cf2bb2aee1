"""``r3store validate``."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.audit import ValidationReport
from r3store.audit import validate as run_validate
from r3store.cli._options import (
    EXIT_FINDINGS,
    EXIT_OK,
    handle_errors,
    make_console,
    parse_storage_options,
    storage_option_flag,
    styled,
)
from r3store.cli._scan import echo_json, on_ray, progress_bar, scan_options
from r3store.reader import open_reader

__all__ = ["render_report", "validate"]

_STYLE = {"error": "bold red", "warning": "yellow"}


def render_report(report: ValidationReport, console: Console) -> None:
    """Print a :class:`r3store.audit.ValidationReport` as a table and a summary line."""
    if report.findings:
        table = Table(title=Text(f"r3store validate {report.url}"), title_justify="left")
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
    scope = f"{report.samples_checked:,} samples, {report.rows_checked:,} rows, {report.frames_checked:,} chunks " \
            f"in {report.arrays_checked:,} route arrays"
    if report.ok:
        console.print(styled(("clean", "bold green"), f": {scope}; every checksum matches, no capture faults"))
        return
    kinds = ", ".join(f"{n} {k}" for k, n in report.counts.items())
    more = f" (first {len(report.findings):,} listed)" if report.truncated else ""
    console.print(styled((f"{report.num_errors:,} error(s)", "bold red"), ", ",
                         (f"{report.num_warnings:,} warning(s)", "yellow"), f"{more}: {kinds}; scanned {scope}"))


@click.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema/cli-validate.schema.json).")
@scan_options
@storage_option_flag
@handle_errors
def validate(url: str, as_json: bool, sample_filter: str | None, limit: int | None, workers: int | None,
             ray_address: str | None, storage_options: tuple[str, ...]) -> None:
    """Check every chunk checksum and look for capture faults in the store at URL.

    Decodes every frame of every committed route array and reports, per sample, MoE
    layer and rows: all-zero layers, repeated ids within a row, ids >= num_experts,
    physical-looking (EP-remapped) id distributions, row counts other than
    num_tokens - 1, duplicate sample ids, quarantined samples and uncommitted leftovers.

    Exit status: 0 clean, 1 findings, 2 usage or I/O error.
    """
    options = parse_storage_options(storage_options)
    if ray_address is not None:
        report = on_ray(ray_address, "validate", not as_json, lambda on_cluster, progress: on_cluster.validate(
            url, storage_options=options, sample_filter=sample_filter, limit=limit, workers=workers,
            progress=progress))
    else:
        store = open_reader(url, storage_options=options, on_duplicate="report")
        with progress_bar("validate", enabled=not as_json) as progress:
            report = run_validate(store, sample_filter=sample_filter, limit=limit, workers=workers, progress=progress)
    if as_json:
        echo_json(report.to_dict())
    else:
        render_report(report, make_console())
    click.get_current_context().exit(EXIT_OK if report.ok else EXIT_FINDINGS)
