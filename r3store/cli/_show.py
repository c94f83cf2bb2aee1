"""``r3store show``."""

from __future__ import annotations

import re
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.cli._options import (
    BadValue,
    colour_flag,
    handle_errors,
    make_console,
    parse_storage_options,
    printable,
    storage_option_flag,
    styled,
    uses_colour,
    warn_duplicates,
)
from r3store.cli._scan import echo_json
from r3store.errors import OptionError, SampleNotFoundError

__all__ = ["DEFAULT_ROWS", "layers_that_fit", "render_show", "show"]

MAX_TABLE_LAYERS = 8
"""Layers shown in the table when --layers is not given and the terminal is wide enough for more
(wider tables are unreadable); fewer when fewer fit (:func:`layers_that_fit`)."""


def _span(start: int, stop: int) -> str:
    """Half-open rows ``[start, stop)`` as text: ``"4"`` or ``"0-4"``."""
    return f"{start}" if stop - start == 1 else f"{start}-{stop - 1}"


def _pack(text: str, width: int) -> str:
    """``text`` broken into lines of at most ``width`` characters after commas or spaces only
    (a line longer than that only when one id is), so no number is ever split."""
    lines, line = [], ""
    for token in re.findall(r"[^, ]+[, ]?", text):
        if line and len(line) + len(token.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += token
    return "\n".join([*lines, line.rstrip()])


def _cell_width(console: Console, num_layers: int, row_digits: int) -> int:
    """Characters per layer cell for the table to fit the console (at least 6: one id and a comma)."""
    borders = 1 + (row_digits + 3)  # the right border, the row column with its padding and left border
    return max(6, (console.width - borders) // max(1, num_layers) - 3)


DEFAULT_ROWS = 50
"""Rows ``show`` prints without ``--rows`` (``--json`` gives every row)."""

def layers_that_fit(width: int, *, num_experts: int, top_k: int, row_digits: int, marks: int = 0) -> int:
    """How many layer columns fit ``width`` characters with each cell's top-k ids on one line
    (at least 1, at most :data:`MAX_TABLE_LAYERS`); ``marks``: characters each cell keeps free
    for the text markers of a table without colours (``" !*"``: 3).

    Examples
    --------
    >>> layers_that_fit(80, num_experts=128, top_k=8, row_digits=3)  # "127,127,...": 31 characters a cell
    2
    >>> [layers_that_fit(w, num_experts=64, top_k=6, row_digits=4) for w in (80, 240)]
    [3, 8]
    """
    cell = max(6, top_k * (len(str(max(num_experts - 1, 0))) + 1) - 1) + marks
    borders = 1 + (row_digits + 3)
    return max(1, min(MAX_TABLE_LAYERS, (width - borders) // (cell + 3)))


def render_show(result: dict[str, Any], console: Console) -> None:
    """Print a :func:`r3store.audit.show` result: rows x layers, each cell the top-k ids.

    Cells break after commas to fit the console width; a number is never split. The sample
    id and the quarantine reason are escaped (:func:`r3store.cli._options.printable`).
    """
    flag = ", quarantined: " + printable(result["reason"] or "") if result["quarantined"] else ""
    title = (f"{printable(result['sample_id'])}: {result['num_tokens']:,} tokens, {result['num_rows']:,} rows{flag}; "
             f"rows {result['row_start']}-{result['row_stop'] - 1}, "
             f"top-{result['top_k']} of {result['num_experts']} experts")
    if result["missing_rows"]:
        title += "; not captured: rows " + ", ".join(_span(a, b) for a, b in result["missing_rows"][:8])
    spans = result["policy_spans"]
    if spans:
        kind = "mixed policy versions" if result["mixed_policy"] else "policy version"
        title += f"; {kind} " + ", ".join(f"{v} (rows {_span(a, b)})" for a, b, v in spans[:8])
    console.print(Text(title))  # above the table, not its title: a long quarantine reason wraps at the console's
    table = Table()             # width, not the (maybe narrow) table's
    table.add_column("row", justify="right", style="bold", no_wrap=True)
    width = _cell_width(console, len(result["layers"]), len(str(max(result["row_stop"] - 1, 0))))
    for layer in result["layers"]:
        table.add_column(f"L{layer}", justify="left", no_wrap=True)
    out_of_range = {tuple(c) for c in result["out_of_range"]}
    repeated = {tuple(c) for c in result["repeated"]}
    colour = uses_colour(console)
    for t, row in enumerate(result["routes"], start=result["row_start"]):
        cells = []
        for layer, ids in zip(result["layers"], row, strict=True):
            text = ",".join(map(str, ids)) if ids[0] >= 0 else "(not captured)"
            where = (t, layer)
            if colour:
                style = "red" if where in out_of_range else "yellow" if where in repeated else ""
                cells.append(Text(_pack(text, width), style=style))
            else:  # the same facts as text markers: a legend of colours means nothing without them
                marks = ("!" if where in out_of_range else "") + ("*" if where in repeated else "")
                cells.append(Text(_pack(f"{text} {marks}" if marks else text, width)))
        table.add_row(str(t), *cells)
    console.print(table)
    n = result["num_experts"]
    if (out_of_range or repeated) and colour:
        console.print(styled(("red", "red"), f": a cell holding an id >= num_experts ({n}); ",
                             ("yellow", "yellow"), ": a cell holding an id twice"))
    elif out_of_range or repeated:
        console.print(f"!: a cell holding an id >= num_experts ({n}); *: a cell holding an id twice")


def _first_layers(result: dict[str, Any], k: int) -> dict[str, Any]:
    """A :func:`r3store.audit.show` result cut to its first ``k`` layers (cells, markers and all)."""
    keep = set(result["layers"][:k])
    return {**result, "layers": result["layers"][:k], "routes": [row[:k] for row in result["routes"]],
            "repeated": [c for c in result["repeated"] if c[1] in keep],
            "out_of_range": [c for c in result["out_of_range"] if c[1] in keep]}


def _parse(value: str | None, parser: Any, hint: str) -> Any:
    if value is None:
        return None
    try:
        return parser(value)
    except OptionError as exc:
        raise BadValue(hint, value, exc.fault) from exc


@click.command()
@click.argument("url")
@click.argument("sample_id")
@click.option("--layers", default=None, metavar="LIST",
              help=f"Decoder layers, e.g. '2,3,10-12' (default: as many of the first MoE layers as fit the "
                   f"terminal, up to {MAX_TABLE_LAYERS}, in the table; every MoE layer with --json).")
@click.option("--rows", default=None, metavar="A:B",
              help="Rows within the sample, counted from 0, e.g. '0:64' or '0:' for all (default: the first 50; "
                   "--json: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the ids as JSON (schema/cli-show.schema.json).")
@storage_option_flag
@colour_flag
@handle_errors
def show(url: str, sample_id: str, layers: str | None, rows: str | None, as_json: bool,
         storage_options: tuple[str, ...]) -> None:
    """Show the expert ids of SAMPLE_ID in the store at URL: rows x layers, each cell the top-k ids.

    The table shows as many of the first MoE layers as fit the terminal with each cell's
    ids on one line (up to 8) unless --layers names others (--json gives every MoE layer). Quarantined
    samples are shown too (one whose routes could not be stored has none to show: exit 2,
    with its reason). Cells with ids >= num_experts are red, cells repeating an id yellow;
    without colours (not a terminal, NO_COLOR, --no-color) they end in ! and * instead.
    """
    from r3store.audit import parse_layers, parse_rows
    from r3store.audit import show as run_show
    from r3store.reader import RouteReader

    chosen = _parse(layers, parse_layers, "--layers")
    window = _parse(rows, parse_rows, "--rows")
    store = RouteReader.open(url, storage_options=parse_storage_options(storage_options, url),
                             reader={"on_duplicate": "first"})
    warn_duplicates(store, only=sample_id)
    if window is None and not as_json:  # a 32K-token sample is 32K lines: its head, and how to see the rest
        window = slice(0, min(DEFAULT_ROWS, int(store.row(sample_id, include_quarantined=True)["num_rows"])))
    console = make_console()
    fit = layers_that_fit(console.width, num_experts=store.spec.num_experts, top_k=store.spec.top_k,
                          row_digits=6)  # rows up to 999,999
    note = None
    if chosen is None and not as_json and store.spec.num_moe_layers > fit:
        chosen = list(store.spec.moe_layers[:fit])
        note = (f"showing MoE layers {chosen[0]}..{chosen[-1]} of {store.spec.num_moe_layers}; "
                "pick others with --layers (--json shows all)")
    try:
        result = run_show(store, sample_id, chosen, window)
    except OptionError as exc:  # a RangeError: the library's words, with the option as typed
        if exc.option != "rows":
            raise
        raise BadValue("--rows", rows or "", exc.fault) from exc
    except SampleNotFoundError as exc:
        if exc.quarantined is None:
            raise
        # quarantined with no rows: say so plainly (the library's hint is a Python call)
        raise SampleNotFoundError(sample_id, store.url, quarantined=exc.quarantined,
                                  hint="its routes could not be stored (none were kept), so there are no routes "
                                       "to show") from exc
    if not as_json and layers is None and not uses_colour(console) and (result["repeated"] or result["out_of_range"]):
        # marked cells (" !*") need room too: fewer layers, so each cell stays on one line
        marked = layers_that_fit(console.width, num_experts=store.spec.num_experts, top_k=store.spec.top_k,
                                 row_digits=6, marks=3)
        if marked < len(result["layers"]):
            result = _first_layers(result, marked)
            shown = result["layers"]
            note = (f"showing MoE layers {shown[0]}..{shown[-1]} of {store.spec.num_moe_layers}; "
                    "pick others with --layers (--json shows all)")
    if as_json:
        echo_json(result)
    else:
        if note:  # once the rows are known good: a bad --rows is the one line on stderr
            console.print(note, highlight=False)
        render_show(result, console)
        if rows is None and result["num_rows"] > DEFAULT_ROWS:
            console.print(f"showing rows 0-{DEFAULT_ROWS - 1} of {result['num_rows']:,}: --rows a:b shows others, "
                          "--rows 0: all of them (--json gives every row)", highlight=False)
