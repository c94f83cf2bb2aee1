"""Selecting samples with a pyarrow compute expression over the sample table.

The one code path for every reader that takes ``filter=``: :func:`r3store.ray.read_routes`
here, ``open_store`` when it grows the same option.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from r3store.errors import OptionError

__all__ = ["filter_samples"]


def filter_samples(samples: pa.Table, expression: pc.Expression | None) -> pa.Table:
    """Rows of a sample table for which ``expression`` is true, in their order.

    Parameters
    ----------
    samples : pyarrow.Table
        A sample table (``RouteReader.samples``: the columns of
        ``schema/sample_table.schema.json`` plus user metadata).
    expression : pyarrow.compute.Expression or None
        A boolean expression over its columns, e.g. ``(pc.field("step") >= 3) &
        ~pc.field("quarantined")``. Rows where it is null are dropped. None keeps
        every row.

    Returns
    -------
    pyarrow.Table
        The kept rows, same schema.

    Raises
    ------
    r3store.errors.OptionError
        ``expression`` is not a pyarrow compute expression, names a column the table
        does not have, or is not boolean; the message names the expression and the fault.

    Examples
    --------
    >>> import pyarrow as pa, pyarrow.compute as pc
    >>> t = pa.table({"sample_id": ["a", "b", "c"], "step": [1, 2, None]})
    >>> filter_samples(t, pc.field("step") >= 2).column("sample_id").to_pylist()
    ['b']
    >>> filter_samples(t, pc.field("reward") > 0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    r3store.errors.OptionError: filter=<pyarrow.compute.Expression (reward > 0)>: cannot be evaluated ...
    """
    if expression is None:
        return samples
    if not isinstance(expression, pc.Expression):
        raise OptionError("filter", expression, "must be a pyarrow.compute.Expression, e.g. pc.field('step') >= 3")
    try:
        return samples.filter(expression)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        columns = ", ".join(samples.column_names)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OptionError("filter", expression,
                          f"cannot be evaluated on the sample table (columns {columns}): {why}") from exc
