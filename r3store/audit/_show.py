"""`show`: the expert ids of one sample, as plain data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from r3store._validate import repeated_ids
from r3store.errors import OptionError, RangeError
from r3store.reader import RouteReader, describe_rows, sample_rows

__all__ = ["parse_layers", "parse_rows", "show"]


MAX_LAYERS = 100_000
"""Most layers :func:`parse_layers` accepts (models have a few hundred at most)."""


def parse_layers(text: str) -> list[int]:
    """``"2,3,10-12"`` to ``[2, 3, 10, 11, 12]`` (inclusive ranges, in the order given).

    Raises
    ------
    r3store.errors.OptionError
        (a ValueError) a part is not an int or an ``a-b`` range with ``a <= b``, a layer is listed
        twice, or the list names more than :data:`MAX_LAYERS` layers.

    Examples
    --------
    >>> parse_layers("2,3,10-12")
    [2, 3, 10, 11, 12]
    """
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi if sep else lo)
        except ValueError:
            raise OptionError("layers", text, "expected layers like '2,3,10-12'") from None
        if b < a:
            raise OptionError("layers", text, f"layer range {part!r} is empty")
        if b - a + 1 + len(out) > MAX_LAYERS:
            raise OptionError("layers", text, f"names more than {MAX_LAYERS:,} layers")
        out.extend(range(a, b + 1))
    seen: set[int] = set()
    for layer in out:
        if layer in seen:
            raise OptionError("layers", text, f"layer {layer} is listed twice")
        seen.add(layer)
    return out


def parse_rows(text: str) -> slice:
    """``"a:b"`` (either end optional) or ``"a"`` (one row) to a slice.

    Rows are counted from the sample's first row; negative numbers are rejected (they
    do not count from the end).

    Raises
    ------
    r3store.errors.OptionError
        (a ValueError) not ``a:b`` or ``a`` with non-negative ints, or ``b <= a``.

    Examples
    --------
    >>> parse_rows("10:20"), parse_rows(":5"), parse_rows("7")
    (slice(10, 20, None), slice(None, 5, None), slice(7, 8, None))
    """
    lo, sep, hi = text.partition(":")
    try:
        start = int(lo) if lo.strip() else None
        stop = int(hi) if hi.strip() else None
    except ValueError:
        raise OptionError("rows", text, "expected rows like 'a:b'") from None
    if min(v for v in (start, stop, 0) if v is not None) < 0:
        raise OptionError("rows", text, "rows are counted from 0 (no negative numbers)")
    if not sep:
        if start is None:
            raise OptionError("rows", text, "expected rows like 'a:b'")
        return slice(start, start + 1)
    if start is not None and stop is not None and stop <= start:
        raise OptionError("rows", text, "empty row range: the end must be greater than the start")
    return slice(start, stop)


def show(store: RouteReader, sample_id: str, layers: Sequence[int] | None = None,
         rows: slice | None = None) -> dict[str, Any]:
    """The expert ids of one sample (quarantined samples included).

    Parameters
    ----------
    store : RouteReader
    sample_id : str
    layers : sequence of int, optional
        Global decoder layers (MoE layers only); default every MoE layer.
    rows : slice, optional
        Rows within the sample (step 1); default all. Only these rows are read.

    Returns
    -------
    dict
        JSON-ready (``schema/cli-show.schema.json``): ``sample_id``, ``num_tokens``,
        ``num_rows``, ``quarantined``, ``reason``, ``layers``, ``row_start`` /
        ``row_stop`` (half-open, within the sample), ``top_k``, ``num_experts``,
        ``routes`` (nested lists, shape (rows, layers, top_k): row ``t`` holds the
        experts chosen for input position ``row_start + t``; -1 in every slot of a row
        the engine could not capture), ``out_of_range`` and ``repeated`` (``[row,
        layer]`` cells with ids >= num_experts or a repeated id), ``missing_rows``
        (``[start, stop)`` of the sample's rows not captured), ``policy_spans``
        (``[start, stop, version]``, empty when no version was recorded) and
        ``mixed_policy`` (rows from more than one policy version).

    Raises
    ------
    r3store.errors.SampleNotFoundError
    r3store.errors.LayerError
        A layer is not a stored MoE layer.
    r3store.errors.RangeError
        (an OptionError) ``rows`` has a step other than 1, reaches past either end of the
        sample (:func:`r3store.reader.sample_rows`: never clipped), or selects no row of a
        sample that has rows.

    Examples
    --------
    >>> import numpy as np, r3store, tempfile
    >>> spec = r3store.ModelSpec(num_layers=2, num_experts=8, top_k=2)
    >>> path = tempfile.mkdtemp()
    >>> with r3store.RouteWriter(path, spec) as w:
    ...     w.append("s0", np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]))
    >>> show(r3store.open_store(path), "s0", layers=[1], rows=slice(1, 2))["routes"]
    [[[6, 7]]]
    """
    row = store.row(sample_id, include_quarantined=True)
    spec = store.spec
    chosen = list(spec.moe_layers) if layers is None else [int(v) for v in layers]
    n = int(row["num_rows"])
    start, stop = sample_rows(sample_id, rows, n)  # the readers' rule: past either end is refused, never clipped
    if rows is not None and stop == start and n:
        raise RangeError(sample_id, "rows", rows, describe_rows(n), "selects no row")
    ids = store.get(sample_id, chosen, rows=slice(start, stop), include_quarantined=True)
    missing = store.missing_rows(sample_id, include_quarantined=True)
    spans = store.policy_spans(sample_id, include_quarantined=True)
    repeated = repeated_ids(ids) & (ids[..., 0] >= 0)  # a missing row holds -1 everywhere: not a repeat
    out_of_range = (ids >= spec.num_experts).any(axis=-1)
    return {
        "url": store.url,
        "sample_id": sample_id,
        "num_tokens": int(row["num_tokens"]),
        "num_rows": int(row["num_rows"]),
        "quarantined": bool(row["quarantined"]),
        "reason": row["reason"],
        "num_experts": spec.num_experts,
        "top_k": spec.top_k,
        "layers": chosen,
        "row_start": start,
        "row_stop": stop,
        "routes": ids.tolist(),
        "out_of_range": [[start + int(t), chosen[int(j)]] for t, j in np.argwhere(out_of_range)],
        "repeated": [[start + int(t), chosen[int(j)]] for t, j in np.argwhere(repeated)],
        "missing_rows": [[a, b] for a, b in missing],
        "policy_spans": [[a, b, v] for a, b, v in spans],
        "mixed_policy": len({v for _, _, v in spans}) > 1,
    }
