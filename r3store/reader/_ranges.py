"""Row ranges of one sample: the one check behind ``get(rows=)``, ``get_runs`` and ``r3store show --rows``.

A range that reaches past the sample is refused, never clipped as numpy slicing clips:
silently fewer rows than asked for is the off-by-one R3 exists to stop. The rules:

- ``rows=None`` is every row of the sample;
- ``slice(start, stop)`` with step ``None`` or 1 (reads are contiguous: other steps are refused);
- a missing end is the sample's own end (``slice(5, None)``: from row 5 to the last);
- a negative index counts from the sample's end, as in Python (``slice(-3, None)``: the last
  3 rows), but the range it names must still lie within the sample (``slice(-10, None)`` of a
  9-row sample is refused, not clipped to 9 rows);
- ``start <= stop`` after that; ``start == stop`` is an empty range (0 rows), ``start > stop``
  is refused.

The command line (``r3store show --rows a:b``) applies the same rule and the same words, and
refuses negative numbers and empty ranges besides (see :func:`r3store.audit.parse_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from r3store._checks import is_int
from r3store._spec import ModelSpec
from r3store.errors import LayerError, RangeError

__all__ = ["describe_rows", "sample_layers", "sample_rows", "sample_span"]


def describe_rows(num_rows: int) -> str:
    """The rows of a sample of ``num_rows`` rows, in words: ``"9 rows (0 to 8)"``, ``"no rows"``.

    Examples
    --------
    >>> describe_rows(9), describe_rows(1), describe_rows(0)
    ('9 rows (0 to 8)', '1 row (0)', 'no rows')
    """
    if num_rows == 0:
        return "no rows"
    if num_rows == 1:
        return "1 row (0)"
    return f"{num_rows:,} rows (0 to {num_rows - 1:,})"


def _index(sample_id: str, rows: Any, which: str, value: Any, num_rows: int) -> int | None:
    if value is None:
        return None
    if not is_int(value):
        raise RangeError(sample_id, "rows", rows, describe_rows(num_rows),
                         f"the {which} must be an int, not {type(value).__name__}")
    number = int(value)
    return number + num_rows if number < 0 else number


def sample_rows(sample_id: str, rows: slice | None, num_rows: int) -> tuple[int, int]:
    """``[start, stop)`` within a sample of ``num_rows`` rows of the row range ``rows``.

    Parameters
    ----------
    sample_id : str
        The sample (for messages).
    rows : slice or None
        The rows asked for (see the module's rules); ``None``: all.
    num_rows : int
        The sample's rows (``num_tokens - 1``).

    Returns
    -------
    (int, int)
        ``0 <= start <= stop <= num_rows``.

    Raises
    ------
    r3store.errors.RangeError
        (an ``OptionError`` and an ``IndexError``) a step other than 1, an end that is no
        int, a range reaching past either end of the sample, or one that ends before it
        starts; the message names the sample, ``rows`` and the sample's rows.
    TypeError
        ``rows`` is not a slice (a tuple ``(a, b)`` is told to write ``slice(a, b)``).

    Examples
    --------
    >>> sample_rows("s", slice(2, 5), 9), sample_rows("s", slice(-3, None), 9), sample_rows("s", None, 9)
    ((2, 5), (6, 9), (0, 9))
    >>> try:
    ...     sample_rows("s", slice(0, 10), 9)
    ... except IndexError as e:  # a RangeError
    ...     print(e)
    rows=slice(0, 10, None): reaches past the end of the sample (stop 10 > 9); sample 's' has 9 rows (0 to 8)
    """
    if rows is None:
        return 0, num_rows
    if not isinstance(rows, slice):
        hint = f"; use slice{tuple(rows)!r}" if isinstance(rows, tuple) and len(rows) == 2 else ""
        raise TypeError(f"rows must be a slice such as slice(0, 1024), got {type(rows).__name__}{hint}")
    bounds = describe_rows(num_rows)
    if rows.step is not None and not (is_int(rows.step) and rows.step == 1):
        raise RangeError(sample_id, "rows", rows, bounds, "must have step 1 (rows are read as one contiguous range)")
    start = _index(sample_id, rows, "start", rows.start, num_rows)
    stop = _index(sample_id, rows, "stop", rows.stop, num_rows)
    start = 0 if start is None else start
    stop = num_rows if stop is None else stop
    return sample_span(sample_id, "rows", rows, start, stop, num_rows)


def sample_span(sample_id: str, option: str, value: Any, start: int, stop: int, num_rows: int) -> tuple[int, int]:
    """``(start, stop)`` if ``0 <= start <= stop <= num_rows``, else a :class:`RangeError`
    naming the sample, ``option`` (as given: ``value``) and the sample's rows.

    Examples
    --------
    >>> sample_span("s", "runs", ("s", 0, 4), 0, 4, 9)
    (0, 4)
    """
    bounds = describe_rows(num_rows)
    if start < 0:
        raise RangeError(sample_id, option, value, bounds,
                         f"starts {-start:,} row{'s' if start != -1 else ''} before the sample's first row")
    if start > num_rows:
        raise RangeError(sample_id, option, value, bounds,
                         f"starts past the end of the sample (start {start:,} > {num_rows:,})")
    if stop > num_rows:
        raise RangeError(sample_id, option, value, bounds,
                         f"reaches past the end of the sample (stop {stop:,} > {num_rows:,})")
    if stop < start:
        raise RangeError(sample_id, option, value, bounds, f"ends before it starts (stop {stop:,} < start {start:,})")
    return start, stop


def sample_layers(spec: ModelSpec, sample_id: str, layers: Sequence[int] | None) -> tuple[int, ...]:
    """Positions on the stored layer axis of ``layers`` (global decoder layers), as
    :meth:`r3store.ModelSpec.layer_positions`, for a read of ``sample_id``.

    Raises
    ------
    r3store.errors.LayerError
        (an IndexError) a layer is not an MoE layer (dense, negative, past the last) or is
        asked twice; the message names the sample, ``layers`` and the MoE layers.
    TypeError
        ``layers`` is an int or a str, or holds a value that is not an int.
    """
    try:
        return spec.layer_positions(layers)
    except LayerError as exc:
        raise LayerError(exc.layer, exc.moe_layers, exc.fault, sample_id=sample_id, layers=layers) from None
