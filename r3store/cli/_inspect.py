"""``r3store inspect``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.cli._options import (
    EXIT_FINDINGS,
    colour_flag,
    echo_json,
    handle_errors,
    make_console,
    open_for_audit,
    parse_storage_options,
    plural,
    print_header,
    report_damaged,
    storage_option_flag,
)

__all__ = ["inspect", "render_summary"]


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _vs(bits: float, bound: float) -> str:
    """``bits`` against the set bound, as a ratio."""
    return f"{bits / bound:.3f}x" if bound > 0 else "-"


def _codecs(summary: dict[str, Any]) -> str:
    """Every codec of the committed route arrays; with several, how many arrays each."""
    codecs: dict[str, int] = summary["codecs"]
    if len(codecs) < 2:
        return next(iter(codecs), "-")
    return ", ".join(f"{codec} ({plural(n, 'array')})" for codec, n in codecs.items())


def _bits(summary: dict[str, Any]) -> str:
    """Bits per expert id against the bit-packed width (the ideal for bitpack; a set coder
    spends fewer, so no "ideal" then) and the set bound; ``-`` without ids."""
    if not summary["expert_ids"]:
        return "-"
    width = "ideal" if set(summary["codecs"]) <= {"r3store.bitpack"} else "bit-packed width"
    return (f"{summary['bits_per_id']:.4f} ({width} {summary['ideal_bits_per_id']}, {summary['overhead_pct']:+.3f}%; "
            f"set bound {summary['set_bound_bits_per_id']:.4f}, "
            f"{_vs(summary['bits_per_id'], summary['set_bound_bits_per_id'])})")


def render_summary(summary: dict[str, Any], console: Console) -> None:
    """Print a :func:`r3store.audit.summarize` result as a table."""
    spec = summary["spec"]
    quarantined = summary["quarantined"]
    moe = spec["moe_layers"]
    span = f"{moe[0]}..{moe[-1]}" if moe == list(range(moe[0], moe[-1] + 1)) else ", ".join(map(str, moe))
    print_header(console, "r3store", summary["url"])
    table = Table(show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("format version", str(summary["format_version"])),
        ("spec", f"{spec['num_layers']} decoder layers (MoE: {span}), {spec['num_experts']} experts, "
                 f"top-{spec['top_k']}"),
        ("samples", f"{summary['samples']:,}" + (f" (+{quarantined} quarantined)" if quarantined else "")),
        ("tokens", f"{summary['tokens']:,}"),
        ("route rows", f"{summary['route_rows']:,}"),
        ("expert ids", f"{summary['expert_ids']:,}"),
        ("stored route bytes", _bytes(summary["route_bytes"])),
        ("sample index bytes", _bytes(summary["index_bytes"])),
        ("codec" if len(summary["codecs"]) < 2 else "codecs", _codecs(summary)),
        ("bits per expert id", _bits(summary)),
        ("size vs int32", f"{summary['size_vs_int32'] * 100:.2f}% ({_bytes(summary['int32_bytes'])} as int32)"
                          if summary["expert_ids"] else "-"),
        ("commits", f"{summary['commits']:,}"),
        ("writers", f"{summary['writers']:,}"),
        ("committed", f"{summary['first_commit']} .. {summary['last_commit']}" if summary["first_commit"] else "-"),
        ("metadata columns", ", ".join(summary["metadata_columns"]) or "-"),
    ]
    if summary["duplicates"]:
        rows.append(("duplicate ids", f"{len(summary['duplicates'])}"))
    if summary.get("damaged_tables"):
        rows.append(("damaged sample tables", f"{len(summary['damaged_tables'])} (their commits' samples left out)"))
    if summary["uncommitted_commits"]:
        rows.append(("uncommitted leftovers", f"{plural(len(summary['uncommitted_commits']), 'commit')}, "
                                              f"{_bytes(summary['uncommitted_bytes'])} (see r3store gc)"))
    for name, value in rows:
        table.add_row(name, Text(value))
    console.print(table)


@click.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Read remote route and index objects through a local copy in this folder.")
@storage_option_flag
@colour_flag
@handle_errors
def inspect(url: str, as_json: bool, cache_dir: str | None, storage_options: tuple[str, ...]) -> None:
    """Summarise the store at URL: samples, tokens, spec, bytes, bits per expert id, commits."""
    from r3store.audit import summarize

    store = open_for_audit(url, parse_storage_options(storage_options, url),
                           {"on_duplicate": "report", "cache_dir": cache_dir})
    damaged = report_damaged(store)
    summary = summarize(store)
    if as_json:
        echo_json(summary)
    else:
        render_summary(summary, make_console())
    if damaged:
        click.get_current_context().exit(EXIT_FINDINGS)
