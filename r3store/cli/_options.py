"""Options and error handling shared by every ``r3store`` command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.text import Text

from r3store.errors import R3StoreError

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "error_line", "exit_on_error", "handle_errors", "make_console",
           "parse_storage_options", "storage_option_flag", "styled"]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``key=value`` pairs to fsspec storage options (values parsed as JSON when they parse).

    ``endpoint_url`` and ``region_name`` go into s3fs's ``client_kwargs``.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint="--storage-option")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key in ("endpoint_url", "region_name"):
            options.setdefault("client_kwargs", {})[key] = value
        else:
            options[key] = value
    return options


def storage_option_flag(func: F) -> F:
    """Add ``--storage-option/-o key=value`` (repeatable) to a command."""
    return click.option(
        "--storage-option", "-o", "storage_options", multiple=True, metavar="KEY=VALUE",
        help="fsspec/s3fs option, repeatable (e.g. -o endpoint_url=http://127.0.0.1:9000 -o anon=false). "
             "AWS_* environment variables are honoured by s3fs.",
    )(func)


def make_console(*, stderr: bool = False) -> Console:
    """A rich console that never reads markup in what it prints.

    Sample ids, URLs, commit names, reasons and exception texts (botocore's contain
    ``[/:]``) are data: printed verbatim, never as rich markup (``[bold]x`` stays
    ``[bold]x``, ``[/]`` cannot raise ``MarkupError``). Styles are given as
    :class:`rich.text.Text` spans (:func:`styled`) instead.
    """
    return Console(stderr=stderr, markup=False, highlight=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and ``(text, style)`` pairs; no markup is read in either."""
    return Text.assemble(*parts)


def error_line(exc: BaseException) -> str:
    """``"<ErrorType>: <message>"`` on one line (line breaks in the message become spaces)."""
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {message}"


def exit_on_error(exc: R3StoreError) -> NoReturn:
    """Print an r3store error as one line on stderr, verbatim, and exit 2 (``EXIT_ERROR``)."""
    make_console(stderr=True).print(styled(("error:", "bold red"), " ", error_line(exc)), soft_wrap=True)
    sys.exit(EXIT_ERROR)


def handle_errors(func: F) -> F:
    """Print r3store errors as one line on stderr and exit 2 (see :func:`exit_on_error`)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except R3StoreError as exc:
            exit_on_error(exc)

    return wrapper  # type: ignore[return-value]
