"""Options and progress bars shared by the scanning commands (validate, stats, diff)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from rich.console import Console

from r3store.cli._options import EXIT_ERROR, BadValue, MissingExtra, make_console

__all__ = ["PLOT_FORMATS", "RAY_CONNECT_TIMEOUT_S", "RAY_VERBOSE_META", "MissingExtra", "NothingSelected",
           "echo_json", "on_ray", "parse_size", "plot_canvas", "plot_format", "plot_options", "probe",
           "progress_bar", "ray_endpoint", "ray_missing_text", "require_selection", "save_plot", "scan_options"]

F = TypeVar("F", bound=Callable[..., Any])


RAY_VERBOSE_META = "r3store.ray_verbose"
"""``ctx.meta`` key: ``-v``/``--verbose`` was given (Ray started with its own log lines)."""


def _set_ray_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[RAY_VERBOSE_META] = True


def scan_options(func: F) -> F:
    """Add ``--sample-filter``, ``--limit``, ``--workers``, ``--ray [ADDRESS]`` and ``-v``."""
    func = click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set_ray_verbose,
                        help="With --ray: show Ray's own log lines (INFO and up) and its workers' output on "
                             "stderr (without it Ray starts quietly: errors only).")(func)
    func = click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
                        help="Run the scan as Ray tasks over groups of commits, on the cluster at ADDRESS "
                             "('auto', 'host:6379', 'ray://host:10001'; without one: RAY_ADDRESS, else the cluster "
                             "started on this machine, else a new local one). Output is that of the local scan. "
                             "Needs pip install 'r3store[ray]'; put --ray after URL when giving no address.")(func)
    func = click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="Reader threads (default: 1 on local disk, 8 on remote stores; "
                             "with --ray: in each task).")(func)
    func = click.option("--limit", type=click.IntRange(min=0), default=None, metavar="N",
                        help="Audit only the first N (matching) samples, in store order.")(func)
    return click.option("--sample-filter", default=None, metavar="GLOB",
                        help="Audit only samples whose id matches this fnmatch glob (e.g. 'step-3-*').")(func)


class NothingSelected(click.ClickException):
    """A scan selected no sample (a ``--sample-filter`` matching no id, ``--limit 0``, two stores
    sharing no id): printed as one line on stderr, exit 2 (``EXIT_ERROR``), never as a clean
    result, so that a mistyped filter fails a CI job instead of passing it."""

    exit_code = EXIT_ERROR


def require_selection(selected: int, url: str, *, sample_filter: str | None, limit: int | None,
                      total: int | None = None, what: str = "sample") -> None:
    """Raise :class:`NothingSelected` when ``--sample-filter`` or ``--limit`` left no sample.

    ``selected``: samples the scan covered; ``total``: samples of the store, when known
    (named in the message). An empty store scanned without either option is not refused
    (there is nothing to select).

    Raises
    ------
    NothingSelected
        ``selected`` is 0 and a filter or limit was given.
    """
    if selected or (sample_filter is None and limit is None):
        return
    if limit == 0:
        raise NothingSelected(f"--limit 0 selects no sample of {url}: nothing was checked")
    of = f" (the store holds {total:,} {what}{'' if total == 1 else 's'})" if total is not None else ""
    raise NothingSelected(f"--sample-filter {sample_filter!r} matched no {what} id of {url}{of}: nothing was checked")


@contextmanager
def progress_bar(description: str, enabled: bool, unit: str = "rows") -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, fed with ``(done, total)`` (rows, or ``unit``).

    Yields None (no bar) when disabled or when stderr is not a terminal.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
               TimeRemainingColumn())
    with Progress(*columns, console=make_console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def on_ray(address: str, description: str, enabled: bool, scan: Callable[[Any, Any], Any]) -> Any:
    """Connect to the Ray cluster at ``address`` (see ``--ray``), then ``scan(r3store.ray, progress)``
    with a progress bar over its tasks. Ray starts quietly (:func:`r3store.ray.connect`: errors
    only, no worker output), so the command's output holds none of Ray's own lines, unless
    ``-v`` was given.

    Before ``ray.init`` (whose own retries wait for minutes on an address where no cluster
    runs), the cluster's first endpoint (:func:`ray_endpoint`) must accept a TCP connection
    within :data:`RAY_CONNECT_TIMEOUT_S`.

    Raises
    ------
    MissingExtra
        ray is not installed.
    BadValue
        The address is malformed, or nothing answers there (exit 2).
    """
    try:
        import r3store.ray as on_cluster
    except ImportError as exc:
        raise MissingExtra(ray_missing_text(exc)) from exc
    import ray

    shown = address or "the default address"
    try:
        if not ray.is_initialized():
            endpoint = ray_endpoint(address)
            if endpoint is not None:
                probe(endpoint, RAY_CONNECT_TIMEOUT_S)
        ctx = click.get_current_context(silent=True)
        on_cluster.connect(address, verbose=bool(ctx is not None and ctx.meta.get(RAY_VERBOSE_META)))
    except (ConnectionError, ValueError) as exc:  # what ray.init raises for a bad or unreachable address
        raise BadValue("--ray", shown, f"cannot connect to Ray: {exc}") from exc
    with progress_bar(description, enabled=enabled, unit="tasks") as progress:
        return scan(on_cluster, progress)


def ray_missing_text(exc: ImportError) -> str:
    """The one line for ``--ray`` without ray: the import failure (``r3store.ray``'s own
    ImportError carries the pip hint already; its cause is what failed), then the hint once.

    Examples
    --------
    >>> try:
    ...     raise ImportError("r3store.ray needs ray: pip install 'r3store[ray]'") from ModuleNotFoundError(
    ...         "No module named 'ray'")
    ... except ImportError as exc:
    ...     print(ray_missing_text(exc))
    --ray needs ray (No module named 'ray'): pip install 'r3store[ray]'
    """
    cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
    reason = str(cause).split(": pip install")[0]
    return f"--ray needs ray ({reason}): pip install 'r3store[ray]'"


RAY_CONNECT_TIMEOUT_S = 10.0
"""Seconds ``--ray`` waits for the cluster's address to accept a TCP connection (a closed port
fails at once; a host that drops packets, after this long)."""

RAY_CLIENT_PORT = 10001
"""Ray Client's default port (``ray://host`` without one)."""


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The ``(host, port)`` that ``ray.init(address)`` connects to first, or None when it starts
    a new local cluster (nothing to reach).

    ``ray://host[:port]``: the Ray Client server (port 10001 by default). Otherwise the
    address as Ray reads it (``ray._private.services.canonicalize_bootstrap_address``:
    ``RAY_ADDRESS``, ``"auto"``, the cluster last started on this machine, ``host:port``,
    localhost as this node's address).

    Raises
    ------
    ConnectionError
        ``"auto"`` and no cluster runs here (Ray's own error).
    ValueError
        Not ``host:port``.
    """
    if address.startswith("ray://"):
        hostport = address[len("ray://"):].split("/", 1)[0]
        if not hostport.rpartition("]")[2].count(":"):
            hostport += f":{RAY_CLIENT_PORT}"
    else:
        from ray._private.services import canonicalize_bootstrap_address

        canonical = canonicalize_bootstrap_address(address or None)  # type: ignore[arg-type]  # None is documented
        if canonical is None:
            return None
        hostport = canonical
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port, got {hostport!r}")
    return host.strip("[]"), int(port)


def probe(endpoint: tuple[str, int], timeout_s: float) -> None:
    """Open (and close) a TCP connection to ``endpoint`` within ``timeout_s`` seconds.

    Raises
    ------
    ConnectionError
        Refused, unreachable or timed out; says which address and why.
    """
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConnectionError(f"no Ray cluster answers at {host}:{port} ({why}, waited at most {timeout_s:g} s)") \
            from exc


def echo_json(doc: Any) -> None:
    """Print ``doc`` as JSON, control and non-ASCII characters escaped (the CLI's one rule)."""
    from r3store.cli._options import echo_json as echo

    echo(doc)


def plot_canvas(width_px: int, height_px: int, dpi: int = 100) -> Any:
    """A matplotlib Figure on the Agg canvas, ``width_px`` x ``height_px`` pixels when saved.

    matplotlib is imported here only (the plot path); pyplot and the global backend are
    not touched.

    Raises
    ------
    MissingExtra
        matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtra(f"--plot needs matplotlib ({exc}): pip install 'r3store[plot]'") from exc
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    return fig


def parse_size(text: str) -> tuple[int, int]:
    """``"1200x800"`` to ``(1200, 800)``."""
    w, sep, h = text.lower().partition("x")
    try:
        size = (int(w), int(h)) if sep else (0, 0)
    except ValueError:
        size = (0, 0)
    if min(size) < 50 or max(size) > 20000:
        raise BadValue("--plot-size", text, "expected WIDTHxHEIGHT in pixels (50..20000)")
    return size


PLOT_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".svg": "svg", ".pdf": "pdf"}
"""``--plot`` file suffix (lower case) -> matplotlib ``savefig`` format."""


def plot_format(path: str) -> str:
    """The image format of ``path``, from its suffix (:data:`PLOT_FORMATS`).

    Raises
    ------
    BadValue
        Another suffix (exit 2).
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in PLOT_FORMATS:
        names = ", ".join("*" + s for s in PLOT_FORMATS)
        raise BadValue("--plot", path, f"cannot tell the image format: name it {names}")
    return PLOT_FORMATS[suffix]


def _plot_folder_exists(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Fail before a long scan when the plot's folder does not exist, its suffix names no format
    or matplotlib is not installed."""
    if value is None:
        return None
    if not os.path.isdir(os.path.dirname(value) or "."):
        raise BadValue("--plot", value, "its folder does not exist")
    plot_format(value)
    plot_canvas(50, 50)  # imports matplotlib (only when --plot is given): MissingExtra now, not after the scan
    return value


def plot_options(func: F) -> F:
    """Add ``--plot FILE`` (.png, .jpg, .svg, .pdf) and ``--plot-size WIDTHxHEIGHT``."""
    func = click.option("--plot-size", default="1200x800", show_default=True, metavar="WxH",
                        help="Size of the --plot image in pixels.")(func)
    return click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), default=None,
                        callback=_plot_folder_exists, metavar="FILE",
                        help="Also draw the figure into FILE, as PNG, JPEG, SVG or PDF by its suffix "
                             "(.png, .jpg, .svg, .pdf; needs matplotlib: pip install 'r3store[plot]').")(func)


def save_plot(draw: Callable[[dict[str, Any], str, tuple[int, int]], None], result: dict[str, Any], path: str,
              size: tuple[int, int]) -> None:
    """``draw(result, path, size)``; a file that cannot be written is a usage error (exit 2)."""
    try:
        draw(result, path, size)
    except OSError as exc:
        raise BadValue("--plot", path, f"cannot write it: {exc.strerror or exc}") from exc


def emit(result: dict[str, Any], *, as_json: bool, render: Callable[[dict[str, Any], Console], None],
         draw: Callable[[dict[str, Any], str, tuple[int, int]], None], plot_path: str | None,
         size: tuple[int, int]) -> None:
    """Write the plot (when asked), then print ``result`` as JSON or through ``render``."""
    if plot_path is not None:
        save_plot(draw, result, plot_path, size)
    if as_json:
        echo_json(result)
        return
    console = make_console()
    render(result, console)
    if plot_path is not None:
        console.print(f"plot: {plot_path} ({size[0]}x{size[1]} px)", highlight=False)
