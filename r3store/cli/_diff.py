"""``r3store diff``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.cli._options import (
    colour_flag,
    handle_errors,
    parse_storage_options,
    plural,
    print_header,
    storage_option_flag,
    warn_duplicates,
)
from r3store.cli._scan import (
    NothingSelected,
    emit,
    on_ray,
    parse_size,
    plot_canvas,
    plot_format,
    plot_options,
    progress_bar,
    scan_options,
)

__all__ = ["diff", "plot_diff", "render_diff", "require_shared"]


def render_diff(result: dict[str, Any], console: Console) -> None:
    """Print a :func:`r3store.audit.diff` result as tables."""
    print_header(console, "r3store diff", result["store_a"], result["store_b"])
    table = Table(show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("samples compared", f"{result['samples_compared']:,}"),
        ("only in A / only in B", f"{result['only_in_a']:,} / {result['only_in_b']:,}"),
        ("tokens compared", f"{result['tokens']:,}"),
        ("MoE layers compared", f"{len(result['layers'])}"),
        ("routing decisions (token x layer)", f"{result['decisions']:,}"),
        ("decisions whose expert sets differ",
         f"{result['decision_flip_rate']:.4%} ({result['differing_decisions']:,})"),
        ("tokens with >= 1 differing layer", f"{result['token_flip_rate']:.4%} ({result['tokens_with_diff']:,})"),
        ("mean differing layers per token", f"{result['mean_differing_layers_per_token']:.4f}"),
        (f"set overlap |A&B|/top_k (top-{result['top_k']})", f"{result['set_overlap']:.4f}"),
    ]
    if result["row_mismatch"]:
        rows.append(("samples with different row counts", f"{result['row_mismatch']:,} (leading rows compared)"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    layers = Table(title="flip rate per MoE layer", title_justify="left")
    layers.add_column("layer", justify="right")
    layers.add_column("flip rate", justify="right")
    layers.add_column("differing decisions", justify="right")
    for lay in result["per_layer"]:
        layers.add_row(str(lay["layer"]), f"{lay['flip_rate']:.4%}", f"{lay['differing']:,}")
    console.print(layers)
    for side in ("a", "b"):
        if result[f"only_in_{side}"]:
            ids = ", ".join(result[f"only_in_{side}_examples"][:5])
            count = result[f"only_in_{side}"]
            console.print(Text(f"only in {side.upper()}: {plural(count, 'sample')} (e.g. {ids})"))


def require_shared(result: dict[str, Any], url_a: str, url_b: str, *, sample_filter: str | None,
                   limit: int | None) -> None:
    """Raise :class:`r3store.cli._scan.NothingSelected` when the diff compared no sample (the
    stores share no id, or none that ``--sample-filter`` / ``--limit`` selects): "0% differ"
    over nothing is no result (exit 2, one line naming what each store holds)."""
    if result["samples_compared"]:
        return
    if limit == 0:
        raise NothingSelected(f"--limit 0 selects no sample of {url_a} and {url_b}: nothing was compared")
    sides = []
    for side, url in (("a", url_a), ("b", url_b)):
        count, examples = result[f"only_in_{side}"], result[f"only_in_{side}_examples"][:3]
        shown = f" (e.g. {', '.join(repr(e) for e in examples)})" if examples else ""
        sides.append(f"{url} {plural(count, 'sample')}{shown}")
    which = "" if sample_filter is None else f" matching --sample-filter {sample_filter!r}"
    raise NothingSelected(f"the stores share no sample id{which}, so nothing was compared: "
                          f"only in A: {sides[0]}; only in B: {sides[1]}")


def plot_diff(result: dict[str, Any], path: str, size: tuple[int, int]) -> None:
    """Draw the per-layer flip rates as a bar chart into ``path`` (format from its suffix: PNG, JPEG, SVG, PDF)."""
    fig = plot_canvas(*size)
    ax = fig.subplots()
    layers = [lay["layer"] for lay in result["per_layer"]]
    ax.bar(range(len(layers)), [lay["flip_rate"] for lay in result["per_layer"]])
    step = max(1, len(layers) // 24)
    ax.set_xticks(range(0, len(layers), step), [str(v) for v in layers[::step]])
    ax.axhline(result["decision_flip_rate"], color="black", linestyle="--", linewidth=1,
               label=f"all layers: {result['decision_flip_rate']:.2%}")
    ax.set_xlabel("decoder layer")
    ax.set_ylabel("fraction of tokens whose expert set differs")
    ax.set_title(f"R3 routing mismatch, {result['samples_compared']:,} samples, {result['tokens']:,} tokens")
    ax.legend()
    fig.savefig(path, format=plot_format(path))


@click.command()
@click.argument("url_a")
@click.argument("url_b")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON (schema/cli-diff.schema.json).")
@plot_options
@scan_options
@storage_option_flag
@colour_flag
@handle_errors
def diff(url_a: str, url_b: str, as_json: bool, plot_path: str | None, plot_size: str, sample_filter: str | None,
         limit: int | None, workers: int | None, ray_address: str | None, storage_options: tuple[str, ...]) -> None:
    """R3 routing mismatch between the stores at URL_A and URL_B (e.g. rollout vs. trainer routes).

    For the samples present in both: the fraction of (token, layer) routing decisions
    whose top-k expert sets differ, the fraction of tokens with at least one differing
    layer, mean differing layers per token, per-layer flip rates and the mean set
    overlap. Both stores need the same num_experts and top_k; the MoE layers they share
    are compared. Storage options apply to both URLs (a local store takes none: they are
    refused when both stores are local).
    """
    from r3store.audit import diff as run_diff
    from r3store.reader import RouteReader

    size = parse_size(plot_size)
    options = parse_storage_options(storage_options, url_a, url_b)
    store_a = RouteReader.open(url_a, storage_options=options, reader={"on_duplicate": "first"})
    store_b = RouteReader.open(url_b, storage_options=options, reader={"on_duplicate": "first"})
    warn_duplicates(store_a)  # here, with --ray too: its output is the local scan's
    warn_duplicates(store_b)
    if ray_address is not None:
        result = on_ray(ray_address, "diff", not as_json, lambda on_cluster, progress: on_cluster.diff(
            url_a, url_b, storage_options=options, sample_filter=sample_filter, limit=limit, workers=workers,
            progress=progress))
    else:
        with progress_bar("diff", enabled=not as_json) as progress:
            result = run_diff(store_a, store_b, sample_filter=sample_filter, limit=limit, workers=workers,
                              progress=progress)
    require_shared(result, url_a, url_b, sample_filter=sample_filter, limit=limit)
    emit(result, as_json=as_json, render=render_diff, draw=plot_diff, plot_path=plot_path, size=size)
