"""The ``r3store`` command group: commands are imported when they run (``--help`` imports none)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from r3store.cli._options import colour_flag

__all__ = ["COMMANDS", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("r3store.cli._inspect",
                "Summarise the store at URL: samples, tokens, spec, bytes, bits per expert id, commits."),
    "validate": ("r3store.cli._validate",
                 "Check every chunk checksum and look for capture faults in the store at URL."),
    "stats": ("r3store.cli._stats", "Expert load per MoE layer and sequence lengths of the store at URL."),
    "diff": ("r3store.cli._diff",
             "R3 routing mismatch between the stores at URL_A and URL_B (e.g. rollout vs. trainer routes)."),
    "show": ("r3store.cli._show",
             "Show the expert ids of SAMPLE_ID in the store at URL: rows x layers, each cell the top-k ids."),
    "demo": ("r3store.cli._demo", "Run the main job on the bundled real FLAME-MoE-290M trace."),
    "gc": ("r3store.cli._gc", "List (or --delete) uncommitted leftovers of crashed writers."),
    "compact": ("r3store.cli._compact",
                "Write a checkpoint of every commit so far, so the store at URL opens from one file."),
}
"""Command name -> (module defining a click command of that name, its short help)."""


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (their short help is kept here).

    Every r3store error that reaches it (from a command, an option callback or the
    command's import) is printed as one line on stderr, verbatim, with exit status 2; so is
    every bad option value and missing extra (:func:`r3store.cli._options.is_one_line_usage`),
    instead of click's three-line usage block. A reader that closes the output early
    (``r3store stats s | head -3``) ends the command quietly with exit status 0.
    """

    def invoke(self, ctx: click.Context) -> Any:
        from r3store.errors import R3StoreError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # click.echo's writes (rich consoles handle theirs: SafeConsole.on_broken_pipe)
            from r3store.cli._options import EXIT_OK, quiet_stdout

            quiet_stdout()
            sys.exit(EXIT_OK)
        except R3StoreError as exc:
            from r3store.cli._options import exit_on_error

            exit_on_error(exc)
        except click.ClickException as exc:
            from r3store.cli._options import exit_on_usage, is_one_line_usage

            if not is_one_line_usage(exc):
                raise
            exit_on_usage(exc)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        command = getattr(importlib.import_module(COMMANDS[cmd_name][0]), cmd_name)
        if not isinstance(command, click.Command):
            raise TypeError(f"{COMMANDS[cmd_name][0]}.{cmd_name} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in COMMANDS.items()])


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the release and which codec kernels run (imported only when asked)."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import version

    from r3store.codecs.kernels import IMPLEMENTATION

    click.echo(f"{ctx.find_root().info_name} {version('r3store')} (kernels: {IMPLEMENTATION})")
    ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version (and which codec kernels run) and exit.")
@colour_flag
def main() -> None:
    """r3store: routing traces for Rollout Routing Replay (R3)."""
