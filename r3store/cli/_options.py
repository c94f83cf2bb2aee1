"""Options and error handling shared by every ``r3store`` command."""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from r3store.errors import R3StoreError

__all__ = ["EXIT_ERROR", "EXIT_FINDINGS", "EXIT_OK", "BadValue", "MissingExtra", "SafeConsole", "colour_flag",
           "echo_json", "error_line", "exit_on_error", "exit_on_usage", "handle_errors", "header_lines",
           "is_local_url", "is_one_line_usage", "json_text", "make_console", "open_for_audit",
           "parse_storage_options", "plural", "print_header", "printable", "quiet_stdout", "report_damaged",
           "storage_option_flag", "styled", "uses_colour",
           "warn_duplicates"]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def printable(text: str, *, keep: str = "") -> str:
    """The one escaping rule for user data the CLI prints (ids, metadata, reasons, messages).

    Every character that Python does not call printable (``str.isprintable``: C0 and C1
    control characters such as ESC ``\\x1b`` and CSI ``\\x9b``, DEL, line and paragraph
    separators, format characters such as the bidirectional override ``\\u202e``) is
    written as its Python escape (``\\x1b``, ``\\u202e``, ``\\n``), as ``repr`` writes
    it; every other character is kept. Characters in ``keep`` (the layout's own line
    breaks) are kept too. No byte of user data can then move the cursor, retitle or clear a
    terminal, or reorder what follows it.

    Examples
    --------
    >>> printable("ok\\x1b]0;pwned\\x07 \\u202eevil")
    'ok\\\\x1b]0;pwned\\\\x07 \\\\u202eevil'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def plural(n: int, noun: str) -> str:
    """``n`` (with thousands separators) and ``noun``, with an ``s`` unless ``n`` is 1.

    Examples
    --------
    >>> plural(1, "commit"), plural(0, "sample"), plural(12345, "sample row")
    ('1 commit', '0 samples', '12,345 sample rows')
    """
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def json_text(doc: Any) -> str:
    """``doc`` as indented JSON with every non-ASCII and control character escaped (``\\uXXXX``):
    what every ``--json`` prints (DEL, which JSON leaves raw, is escaped too)."""
    return json.dumps(doc, indent=2, ensure_ascii=True).replace("\x7f", "\\u007f")


def echo_json(doc: Any) -> None:
    """Print ``doc`` as JSON (:func:`json_text`)."""
    click.echo(json_text(doc))


def quiet_stdout() -> None:
    """Point stdout at the null device, so that no later write or the flush at exit fails on
    a closed pipe (what Python's documentation advises for ``SIGPIPE``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (an in-process runner)
        pass


class SafeConsole(Console):
    """A rich console that applies :func:`printable` to every text it renders (not to the
    style codes rich adds itself), so no command can print a raw control character of user
    data, whichever string or table it builds."""

    def on_broken_pipe(self) -> None:
        """The reader closed the output early (``r3store stats s | head -3``): stop quietly with
        exit status 0, as ``head`` wanted no more (rich's own handler exits 1)."""
        self.quiet = True
        quiet_stdout()
        raise SystemExit(EXIT_OK)

    def _render_buffer(self, buffer: Any) -> str:
        safe = (s if s.control else Segment(printable(s.text, keep="\n"), s.style, s.control) for s in buffer)
        return super()._render_buffer(safe)


def is_local_url(url: str) -> bool:
    """Whether ``url`` names a store on local disk (a path or ``file://``), which r3store reads
    and writes itself: no fsspec filesystem, so no storage option has any effect on it."""
    return url.lower().startswith("file://") or ("://" not in url and "::" not in url)


def parse_storage_options(pairs: tuple[str, ...], *urls: str) -> dict[str, Any]:
    """``key=value`` pairs to fsspec storage options (values parsed as JSON when they parse).

    ``endpoint_url`` and ``region_name`` go into s3fs's ``client_kwargs``. ``urls``: the
    stores the options are for; when every one is local (:func:`is_local_url`), any
    option is refused, since a local store takes none (it would be silently ignored).
    Option names of ``s3://`` stores are checked when the store opens
    (:func:`r3store.storage.open_backend`).

    Raises
    ------
    BadValue
        A pair is not ``key=value``, or options were given for local stores only (exit 2).
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise BadValue("--storage-option", pair, "expected key=value")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key in ("endpoint_url", "region_name"):
            options.setdefault("client_kwargs", {})[key] = value
        else:
            options[key] = value
    if pairs and urls and all(is_local_url(url) for url in urls):
        from r3store.storage import local_options_fault

        key = pairs[0].partition("=")[0]
        where = "a local store" if len(urls) == 1 else "local stores"
        raise BadValue("--storage-option", pairs[0], local_options_fault(key, f"{where} ({', '.join(urls)})"))
    return options


def storage_option_flag(func: F) -> F:
    """Add ``--storage-option/-o key=value`` (repeatable) to a command."""
    return click.option(
        "--storage-option", "-o", "storage_options", multiple=True, metavar="KEY=VALUE",
        help="fsspec/s3fs option, repeatable (e.g. -o endpoint_url=http://127.0.0.1:9000 -o anon=false). "
             "AWS_* environment variables are honoured by s3fs.",
    )(func)


NO_COLOR_META = "r3store.no_color"
"""Key of ``click.Context.meta`` set by ``--no-color`` (the meta dict is shared by the group and its command)."""


def _set_no_color(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[NO_COLOR_META] = True


def colour_flag(func: F) -> F:
    """Add ``--no-color`` to a command (the group takes it too: ``r3store --no-color show ...``)."""
    return click.option(
        "--no-color", is_flag=True, expose_value=False, callback=_set_no_color,
        help="No colours or styles, as with NO_COLOR=1 or output that is no terminal (show then marks "
             "faulty cells with ! and * instead of red and yellow).",
    )(func)


def make_console(*, stderr: bool = False) -> Console:
    """A rich console that never reads markup in what it prints, and escapes control characters.

    Sample ids, URLs, commit names, reasons and exception texts (botocore's contain
    ``[/:]``) are data: printed verbatim, never as rich markup (``[bold]x`` stays
    ``[bold]x``, ``[/]`` cannot raise ``MarkupError``). Styles are given as
    :class:`rich.text.Text` spans (:func:`styled`) instead. Control characters are
    escaped (:class:`SafeConsole`, :func:`printable`). Colours follow rich's rules (none
    when the output is no terminal); ``--no-color`` or a non-empty ``NO_COLOR`` (no-color.org)
    turns off every style, bold included. Output that is no terminal is :data:`PIPE_WIDTH`
    wide unless ``COLUMNS`` says otherwise. Whatever a colour says is also said in words when
    colours are off (:func:`uses_colour`).
    """
    ctx = click.get_current_context(silent=True)
    if (ctx is not None and ctx.meta.get(NO_COLOR_META)) or os.environ.get("NO_COLOR"):
        console = SafeConsole(stderr=stderr, markup=False, highlight=False, color_system=None, no_color=True)
    else:
        console = SafeConsole(stderr=stderr, markup=False, highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH  # a file or pipe: one line per finding, row or message (grep-able logs)
    return console


PIPE_WIDTH = 4096
"""Console width when the output is no terminal and ``COLUMNS`` is not set: lines are not
wrapped at 80 columns (rich's default), so a finding, a message or a ``show`` cell stays on
one line of a log (set ``COLUMNS`` to wrap at another width)."""


def uses_colour(console: Console) -> bool:
    """Whether ``console`` shows colours: a terminal (or ``FORCE_COLOR``), no ``NO_COLOR``, no ``--no-color``."""
    return console.color_system is not None and not console.no_color


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and ``(text, style)`` pairs; no markup is read in either."""
    return Text.assemble(*parts)


def header_lines(title: str, urls: Sequence[str], width: int) -> list[str]:
    """The lines of a command's header naming the store(s) at ``urls``, readable at ``width`` columns.

    One store: ``"<title> <url>"`` when it fits, else the title and then the URL on a line
    of its own. Two stores (``diff``): the title, then ``"  A <url_a>"`` and ``"  B <url_b>"``;
    when either line is wider than ``width`` and the URLs share leading folders, those
    folders get a line of their own (``"  in <folders>/"``) and A and B name the rest. A URL
    is never cut, folded or shortened with an ellipsis: a line still wider than ``width`` is
    left whole for the terminal to wrap (it stays one line to copy).

    Examples
    --------
    >>> header_lines("r3store stats", ["/data/run-7"], 80)
    ['r3store stats /data/run-7']
    >>> header_lines("r3store stats", ["/data/run-7"], 20)
    ['r3store stats', '/data/run-7']
    >>> header_lines("r3store diff", ["/data/runs/step-7/rollout", "/data/runs/step-7/trainer"], 80)
    ['r3store diff', '  A /data/runs/step-7/rollout', '  B /data/runs/step-7/trainer']
    >>> header_lines("r3store diff", ["/data/runs/step-7/rollout", "/data/runs/step-7/trainer"], 24)
    ['r3store diff', '  in /data/runs/step-7/', '  A rollout', '  B trainer']
    """
    if len(urls) == 1:
        line = f"{title} {urls[0]}"
        return [line] if len(line) <= width else [title, urls[0]]
    a, b = urls
    lines = [f"  A {a}", f"  B {b}"]
    if max(map(len, lines)) > width:
        prefix = _shared_folders(a, b)
        if prefix:
            lines = [f"  in {prefix}", f"  A {a[len(prefix):]}", f"  B {b[len(prefix):]}"]
    return [title, *lines]


def _shared_folders(a: str, b: str) -> str:
    """The leading folders ``a`` and ``b`` share, up to and including a ``/`` (``""``: none worth a line
    of its own: nothing, the root or a bare ``s3://``), leaving each a name.

    Examples
    --------
    >>> _shared_folders("s3://b/run/x", "s3://b/run/y"), _shared_folders("s3://b1/x", "s3://b2/x")
    ('s3://b/run/', '')
    """
    parts_a, parts_b = a.split("/"), b.split("/")
    shared = 0
    while shared < min(len(parts_a), len(parts_b)) - 1 and parts_a[shared] == parts_b[shared]:
        shared += 1
    prefix = "/".join(parts_a[:shared]) + "/" if shared else ""
    return "" if prefix == "/" or prefix.endswith("://") else prefix


def print_header(console: Console, title: str, *urls: str) -> None:
    """Print :func:`header_lines` at ``console``'s width, each line whole (never folded by rich)."""
    for line in header_lines(title, urls, console.width):
        console.print(Text(line), soft_wrap=True)


def error_line(exc: BaseException) -> str:
    """``"<ErrorType>: <message>"`` on one line (line breaks in the message become spaces)."""
    message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {message}"


class MissingExtra(click.ClickException):
    """An optional dependency is not installed (one line with the pip command, exit 2)."""

    exit_code = EXIT_ERROR


class BadValue(click.BadParameter):
    """A bad option or argument value: printed as the one line ``error: --rows '5:2': <fault>``,
    exit 2 (:func:`exit_on_usage`).

    Parameters
    ----------
    option : str
        The option or argument as the user typed it (``"--rows"``, ``"DIRECTORY"``).
    value : object
        The rejected value (shown with ``repr``).
    fault : str
        What is wrong with it, in words.
    """

    def __init__(self, option: str, value: Any, fault: str) -> None:
        super().__init__(fault, param_hint=option)
        self.option, self.value, self.fault = option, value, fault

    def format_message(self) -> str:
        return f"{self.option} {self.value!r}: {self.fault}"


def is_one_line_usage(exc: click.ClickException) -> bool:
    """Whether ``exc`` is printed as one line (:func:`exit_on_usage`) instead of click's usage block.

    Bad values (:class:`click.BadParameter`: a bad ``--rows``, a ``--limit`` out of range,
    a ``--plot`` folder that does not exist) and missing extras are; a missing argument, an
    unknown option or command keep click's usage block, which shows what was expected.
    """
    if isinstance(exc, click.MissingParameter):
        return False
    return isinstance(exc, click.BadParameter) or not isinstance(exc, click.UsageError)


def exit_on_usage(exc: click.ClickException) -> NoReturn:
    """Print a bad value (or missing extra) as one line on stderr, ``error: <option> <value>: <fault>``
    (click's own checks: ``error: Invalid value for '--limit': -1 is not in the range x>=0.``),
    and exit with its exit status (2, as click's usage errors: ``EXIT_ERROR``)."""
    message = " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())
    make_console(stderr=True).print(styled(("error:", "bold red"), " ", message), soft_wrap=True)
    sys.exit(exc.exit_code)


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


def warn_duplicates(store: Any, *, only: str | None = None, shown: int = 3) -> None:
    """Print one warning line on stderr when ``store`` (a :class:`r3store.RouteReader` opened
    with ``on_duplicate="first"``) holds sample ids committed more than once.

    The line names the ids (the first ``shown`` of them, and how many more), their commits,
    and the copy the command reads: the reader's choice (the earliest commit's, unless that
    copy is quarantined and a later one is not). ``open_store`` with default options refuses
    such a store (:class:`r3store.errors.DuplicateSampleError`); ``r3store validate`` lists
    every duplicate. ``only``: warn about this id alone (``show``), if it is duplicated.
    """
    dupes: dict[str, list[str]] = store.duplicates
    if only is not None:
        dupes = {only: dupes[only]} if only in dupes else {}
    if not dupes:
        return
    ids = list(dupes)[:shown]
    table = store.samples
    chosen = dict(zip(table.column("sample_id").to_pylist(), table.column("commit").to_pylist(), strict=True))
    why = "open_store refuses such a store with DuplicateSampleError; r3store validate lists every duplicate"
    if only is not None:
        text = (f"sample {only!r} of {store.url} is committed by commits {', '.join(dupes[only])}; showing the copy "
                f"of {chosen.get(only, dupes[only][0])} ({why})")
    else:
        parts = [f"{sid!r} (commits {', '.join(dupes[sid])}; read: {chosen.get(sid, dupes[sid][0])})" for sid in ids]
        more = f" and {len(dupes) - len(ids):,} more" if len(dupes) > len(ids) else ""
        count = len(dupes)
        text = (f"{count:,} sample id{' is' if count == 1 else 's are'} committed more than once in {store.url}: "
                f"{'; '.join(parts)}{more}; one copy of each is read ({why})")
    make_console(stderr=True).print(styled(("warning:", "yellow"), " ", text), soft_wrap=True)


def open_for_audit(url: str, storage_options: dict[str, Any], reader: dict[str, Any]) -> Any:
    """Open ``url`` for an audit command (``RouteReader.open`` with ``reader`` and
    ``on_damaged_table="skip"``): a damaged sample table costs only its own commit, which the
    command reports (:func:`report_damaged`, or a ``damaged_table`` finding), without the
    reader's Python warning on top."""
    import warnings

    from r3store.errors import DamagedTableWarning
    from r3store.reader import RouteReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DamagedTableWarning)
        return RouteReader.open(url, storage_options=storage_options, reader={**reader, "on_damaged_table": "skip"})


def report_damaged(store: Any) -> bool:
    """Print one ``error:`` line on stderr per commit that ``store`` (opened with
    :func:`open_for_audit`) left out because its sample table is damaged; whether there was any
    (the command then exits 1: a finding, as ``r3store validate`` reports it)."""
    skipped: dict[str, str] = store.skipped_commits
    console = make_console(stderr=True)
    for commit, fault in skipped.items():
        console.print(styled(("error:", "bold red"), " ", f"damaged_table: sample table of commit {commit!r} fails "
                                                          f"its checks ({fault}); its samples are left out of what "
                                                          "is shown here (r3store validate checks the rest)"),
                      soft_wrap=True)
    return bool(skipped)
