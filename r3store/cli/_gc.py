"""``r3store gc``."""

from __future__ import annotations

import re

import click
from rich.table import Table
from rich.text import Text

from r3store.cli._options import (
    BadValue,
    colour_flag,
    echo_json,
    handle_errors,
    make_console,
    parse_storage_options,
    storage_option_flag,
)

__all__ = ["gc", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str = "--older-than") -> float:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"`` or a bare number of seconds, to seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise BadValue(option, text, "expected a duration like 90s, 15m, 1h or 2d")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


@click.command()
@click.argument("url")
@click.option("--older-than", default="1h", show_default=True, help="Only leftovers at least this old (s/m/h/d).")
@click.option("--delete", is_flag=True, help="Remove the leftovers (default: only list them).")
@click.option("--json", "as_json", is_flag=True, help="Print the leftovers as JSON.")
@storage_option_flag
@colour_flag
@handle_errors
def gc(url: str, older_than: str, delete: bool, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """List (or --delete) uncommitted leftovers of crashed writers. Committed data is never touched.

    Leftovers younger than --older-than are kept (a running writer may still be
    committing them) and counted.

    Routes with no sample table may also be a committed sample whose table was lost
    (deleted, or left out of a copy or sync): --delete would then lose it for good. A
    commit that a checkpoint lists (index/*.checkpoint, written by r3store compact) is
    such a sample: it is listed as a lost table and never deleted. Without a checkpoint,
    a later commit of the same writer (commit names are <writer_id>-<seq>) or routes much
    older than the writer's last commit point to a lost table: r3store validate says which;
    look for the table in the store's source before --delete.
    """
    from r3store.audit import collect_garbage

    threshold = parse_duration(older_than)
    options = parse_storage_options(storage_options, url)
    everything = collect_garbage(url, older_than_s=0.0, storage_options=options)
    younger = [item for item in everything if item.age_s < threshold]
    if delete:
        found = collect_garbage(url, older_than_s=threshold, delete=True, storage_options=options)
    else:
        found = [item for item in everything if item.age_s >= threshold]
    if as_json:
        echo_json({"deleted": delete, "leftovers": [f.to_dict() for f in found], "kept_younger": len(younger)})
        return
    console = make_console()
    if found:
        table = Table(title=f"uncommitted leftovers older than {older_than}" + (" (deleted)" if delete else ""))
        for column in ("commit", "objects", "bytes", "age"):
            table.add_column(column, no_wrap=column != "commit")
        for item in found:
            table.add_row(Text(item.commit), str(len(item.keys)), f"{item.nbytes:,}", _age(item.age_s))
        console.print(table)
        for item in found:
            if item.listed_by is not None:
                console.print(f"{item.commit}: checkpoint {item.listed_by} lists it as committed: its sample table "
                              "was lost, not a crashed writer's; its routes are kept"
                              + (" (not deleted)" if delete else "") + "; restore the table from the store's source",
                              soft_wrap=True, highlight=False)
    else:
        console.print(f"no uncommitted leftovers older than {older_than}")
    if younger:
        console.print(f"kept {len(younger)} younger leftover(s) (under {older_than} old; the oldest "
                      f"{_age(max(item.age_s for item in younger))}): a running writer may still be committing "
                      "them; --older-than 0s lists them")


def _age(seconds: float) -> str:
    """``"42 s"``, ``"7.5 min"``, ``"3.2 h"`` or ``"unknown"`` (the backend reports no times)."""
    if seconds == float("inf"):
        return "unknown"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
