"""``r3store stats``."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from r3store.cli._options import (
    EXIT_FINDINGS,
    colour_flag,
    handle_errors,
    open_for_audit,
    parse_storage_options,
    plural,
    print_header,
    report_damaged,
    storage_option_flag,
    warn_duplicates,
)
from r3store.cli._scan import (
    emit,
    on_ray,
    parse_size,
    plot_canvas,
    plot_format,
    plot_options,
    progress_bar,
    require_selection,
    scan_options,
)

__all__ = ["plot_stats", "render_stats", "stats"]


def render_stats(result: dict[str, Any], console: Console) -> None:
    """Print a :func:`r3store.audit.stats` result as tables."""
    spec = result["spec"]
    most = f"; entropy at most {result['layers'][0]['max_entropy_bits']:.3f} bits" if result["layers"] else ""
    # load: tokens routed to an expert; ids out of range: ids >= num_experts
    print_header(console, "r3store stats", result["url"])
    console.print(Text(f"{plural(result['samples'], 'sample')}, "
                       f"{plural(result['rows'], 'routed token')}, {spec['num_experts']} experts, "
                       f"top-{spec['top_k']}{most}"))
    table = Table()
    # headers broken by hand and numbers never wrapped: readable at 80 columns
    for name in ("layer", "mean\nload", "max\nload", "max/mean", "entropy\n(bits)"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("unused\nexperts", justify="right", min_width=7)
    for name in ("hottest\nexpert", "ids out\nof range"):
        table.add_column(name, justify="right", no_wrap=True)
    for lay in result["layers"]:
        unused = f"{lay['unused_experts']}"
        if lay["unused"]:
            listed = ", ".join(map(str, lay["unused"][:8]))
            unused += f" ({listed}{', ...' if lay['unused_experts'] > 8 else ''})"
        table.add_row(str(lay["layer"]), f"{lay['mean_load']:,.1f}", f"{lay['max_load']:,}",
                      f"{lay['max_over_mean']:.2f}", f"{lay['entropy_bits']:.3f}",
                      unused, str(lay["hottest_expert"]), f"{lay['ids_out_of_range']:,}")
    console.print(table)
    hot = Table(title="hottest experts", title_justify="left")
    for name in ("layer", "expert", "tokens", "share of layer", "load / mean"):
        hot.add_column(name, justify="right", no_wrap=True)
    for h in result["hottest"]:
        if not h["tokens"]:  # an empty store (or layer): no expert is hot
            continue
        hot.add_row(str(h["layer"]), str(h["expert"]), f"{h['tokens']:,}", f"{h['share']:.2%}",
                    f"{h['load_over_mean']:.2f}")
    if hot.row_count:
        console.print(hot)
    n = result["lengths"]
    if not n["samples"]:
        console.print("sequence length (tokens): no samples", highlight=False)
    else:
        console.print(f"sequence length (tokens): {plural(n['samples'], 'sample')}, min {n['min']:,}, "
                      f"p50 {n['p50']:,.0f}, mean {n['mean']:,.1f}, p90 {n['p90']:,.0f}, p99 {n['p99']:,.0f}, "
                      f"max {n['max']:,}", highlight=False)
    if result["missing_rows"]:
        console.print(f"missing rows (not captured by the engine, left out above): {result['missing_rows']:,} in "
                      f"{plural(result['samples_with_missing_rows'], 'sample')}", highlight=False)
    policy = result["policy"]
    if policy["samples_with_version"]:
        count, mixed = policy["samples_with_version"], policy["mixed_version_samples"]
        console.print(f"policy versions {policy['min_version']}..{policy['max_version']} on {count:,} "
                      f"sample{'' if count == 1 else 's'}; {mixed:,} {'sample mixes' if mixed == 1 else 'samples mix'} "
                      "versions", highlight=False)


def plot_stats(result: dict[str, Any], path: str, size: tuple[int, int]) -> Any:
    """Draw the layers x experts load heatmap and the length histogram into ``path`` (PNG, JPEG, SVG or
    PDF, by its suffix); returns the matplotlib Figure."""
    fig = plot_canvas(*size)
    heat, hist = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1]})
    layers = [lay["layer"] for lay in result["layers"]]
    load = [[v / lay["mean_load"] if lay["mean_load"] else 0.0 for v in row]
            for row, lay in zip(result["load"], result["layers"], strict=True)]
    image = heat.imshow(load, aspect="auto", interpolation="nearest", cmap="viridis")
    heat.set_xlabel("expert id")
    heat.set_ylabel("decoder layer")
    step = max(1, len(layers) // 16)
    heat.set_yticks(range(0, len(layers), step), [str(v) for v in layers[::step]])
    heat.set_title("expert load / mean load")
    fig.colorbar(image, ax=heat)
    lengths = result["lengths"]["histogram"]
    if lengths["counts"]:
        edges = lengths["edges"]
        hist.stairs(lengths["counts"], edges, fill=True)
    hist.set_xlabel("tokens per sample")
    hist.set_ylabel("samples")
    hist.yaxis.get_major_locator().set_params(integer=True)  # counts: no 1.25 samples
    hist.set_title("sequence lengths")
    fig.suptitle(f"{result['url']}: {result['samples']:,} samples")
    fig.savefig(path, format=plot_format(path))
    return fig


@click.command()
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON (schema/cli-stats.schema.json).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=0), help="Hottest experts to list.")
@plot_options
@scan_options
@storage_option_flag
@colour_flag
@handle_errors
def stats(url: str, as_json: bool, top: int, plot_path: str | None, plot_size: str, sample_filter: str | None,
          limit: int | None, workers: int | None, ray_address: str | None, storage_options: tuple[str, ...]) -> None:
    """Expert load per MoE layer and sequence lengths of the store at URL.

    Per layer: tokens per expert (mean and max), max/mean load, entropy of the load in
    bits, unused experts and the hottest expert; then the hottest experts overall and
    the sequence-length distribution. Quarantined samples are left out.
    """
    from r3store.audit import stats as run_stats

    size = parse_size(plot_size)
    options = parse_storage_options(storage_options, url)
    store = open_for_audit(url, options, {"on_duplicate": "first"})
    damaged = report_damaged(store)
    warn_duplicates(store)  # here, with --ray too: its output is the local scan's
    if ray_address is not None:
        result = on_ray(ray_address, "stats", not as_json, lambda on_cluster, progress: on_cluster.stats(
            url, storage_options=options, sample_filter=sample_filter, limit=limit, top=top, workers=workers,
            progress=progress))
    else:
        with progress_bar("stats", enabled=not as_json) as progress:
            result = run_stats(store, sample_filter=sample_filter, limit=limit, workers=workers, progress=progress,
                               top=top)
    require_selection(result["samples"], url, sample_filter=sample_filter, limit=limit, what="visible sample",
                      total=len(store.sample_ids))
    emit(result, as_json=as_json, render=render_stats, draw=plot_stats, plot_path=plot_path, size=size)
    if damaged:
        click.get_current_context().exit(EXIT_FINDINGS)
