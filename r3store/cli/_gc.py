"""``r3store gc``."""

from __future__ import annotations

import json
import re

import click
from rich.table import Table
from rich.text import Text

from r3store.audit import collect_garbage
from r3store.cli._options import handle_errors, make_console, parse_storage_options, storage_option_flag

__all__ = ["gc", "parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``"90s"``, ``"15m"``, ``"1h"``, ``"2d"`` or a bare number of seconds, to seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise click.BadParameter(f"expected a duration like 90s, 15m, 1h or 2d, got {text!r}",
                                 param_hint="--older-than")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


@click.command()
@click.argument("url")
@click.option("--older-than", default="1h", show_default=True, help="Only leftovers at least this old (s/m/h/d).")
@click.option("--delete", is_flag=True, help="Remove the leftovers (default: only list them).")
@click.option("--json", "as_json", is_flag=True, help="Print the leftovers as JSON.")
@storage_option_flag
@handle_errors
def gc(url: str, older_than: str, delete: bool, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """List (or --delete) uncommitted leftovers of crashed writers. Committed data is never touched."""
    found = collect_garbage(url, older_than_s=parse_duration(older_than), delete=delete,
                            storage_options=parse_storage_options(storage_options))
    if as_json:
        click.echo(json.dumps({"deleted": delete, "leftovers": [f.to_dict() for f in found]}, indent=2))
        return
    table = Table(title=f"uncommitted leftovers older than {older_than}" + (" (deleted)" if delete else ""))
    for column in ("commit", "objects", "bytes", "age"):
        table.add_column(column)
    for item in found:
        table.add_row(Text(item.commit), str(len(item.keys)), f"{item.nbytes:,}", f"{item.age_s / 3600:.1f} h")
    make_console().print(table if found else "no uncommitted leftovers")
