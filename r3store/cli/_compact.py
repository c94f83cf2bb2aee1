"""``r3store compact``."""

from __future__ import annotations

import click

from r3store.cli._options import (
    colour_flag,
    echo_json,
    handle_errors,
    parse_storage_options,
    plural,
    storage_option_flag,
)

__all__ = ["compact"]


@click.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (schema/cli-compact.schema.json).")
@storage_option_flag
@colour_flag
@handle_errors
def compact(url: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """Write a checkpoint of every commit so far, so the store at URL opens from one file.

    Readers then read the checkpoint plus the sample tables of commits made after it. Safe
    while writers commit and while other compactions run; sample tables are never touched.
    """
    from r3store.reader import compact as compact_store

    result = compact_store(url, storage_options=parse_storage_options(storage_options, url))
    if as_json:
        echo_json(result.to_dict())
    elif result.key is None:
        click.echo("no commits: nothing to compact")
    elif not result.written:
        click.echo(f"{result.key} already covers {'the' if result.commits == 1 else 'all'} "
                   f"{plural(result.commits, 'commit')}: nothing written")
    else:
        click.echo(f"wrote {result.key}: {plural(result.commits, 'commit')}, {plural(result.samples, 'sample row')}, "
                   f"{plural(result.nbytes, 'byte')} (tables of later commits are in buckets >= {result.watermark})")
