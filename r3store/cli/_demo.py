"""``r3store demo``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import click

from r3store.cli._inspect import render_summary
from r3store.cli._options import BadValue, MissingExtra, colour_flag, handle_errors, make_console, styled

__all__ = ["demo"]


@click.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--writers", default=4, show_default=True, type=click.IntRange(1, 32),
              help="Rollout-worker processes writing the trace (1 to 32: one sample each at most).")
@click.option("--loader-workers", default=2, show_default=True, type=click.IntRange(min=0),
              help="DataLoader worker processes (0: load in the main process).")
@colour_flag
@handle_errors
def demo(directory: Path | None, writers: int, loader_workers: int) -> None:
    """Run the main job on the bundled real FLAME-MoE-290M trace.

    Several rollout-worker processes write 32 samples of 64 tokens (half through
    append_sglang with real base64 payloads) into DIRECTORY/rollout (default: a temporary
    folder, removed afterwards), a DataLoader streams packed batches back, every route is checked
    bit-identical to the source, and the inspect summary is printed. Then R3 on a tiny
    Qwen3-MoE (needs transformers): a bf16 rollout's routes are written, streamed and
    replayed in an fp32 trainer; flip rates and log-prob gaps with and without replay
    (stores DIRECTORY/replay-demo/engine, trainer-live and trainer-replay).
    """
    if directory is not None and directory.exists() and any(directory.iterdir()):
        raise BadValue("DIRECTORY", str(directory), "not empty (the demo writes into a new or empty folder)")
    try:
        import torch  # noqa: F401 - checked before any writer process starts

        from r3store.cli._demo_job import run_demo
    except ImportError as exc:
        raise MissingExtra(f"the demo needs PyTorch ({exc}): pip install 'r3store[torch]' "
                           "(or 'r3store[hf]' for its replay part too)") from exc
    console = make_console()
    target = directory / "rollout" if directory is not None else Path(tempfile.mkdtemp(prefix="r3store-demo-"))
    if directory is None:
        console.print(f"writing into the temporary folder {target}, removed on exit "
                      "(r3store demo DIR keeps the stores in DIR)", soft_wrap=True, highlight=False)
    try:
        report = run_demo(target, num_writers=writers, loader_workers=loader_workers,
                          log=lambda line: console.print(line, soft_wrap=True))
    finally:
        if directory is None:
            shutil.rmtree(target, ignore_errors=True)
    console.print(styled(
        ("ok", "bold green"),
        f": {report['samples']} samples, {report['tokens']:,} tokens in {report['batches']} batches; "
        "every route bit-identical to the source trace, every pad row masked and in range"))
    console.print(f"write: {report['write_s']:.2f} s (process start-up included)")
    console.print(f"read:  {report['read_s']:.2f} s, {report['tokens_per_s']:,.0f} tokens/s, "
                  f"{report['expert_ids_per_s']:,.0f} expert ids/s (DataLoader start-up included)")
    render_summary(report["summary"], console)
    from r3store.cli._demo_replay import replay_demo_cli

    replay_demo_cli(directory, console)
    if directory is not None:
        kept = ["rollout"] + [f"replay-demo/{p.name}" for p in sorted((directory / "replay-demo").glob("*"))]
        console.print(f"stores kept in {directory}: {', '.join(kept)}; e.g. r3store inspect {directory / 'rollout'}",
                      soft_wrap=True, highlight=False, markup=False)
