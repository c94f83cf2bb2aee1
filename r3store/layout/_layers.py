"""Pipeline parallel: pick a stage's layers out of the stored MoE-layer axis."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from r3store.errors import LayerError
from r3store.layout._options import LayoutOptionError

__all__ = ["select_layers"]


def _layer_list(name: str, layers: Sequence[int]) -> list[int]:
    """Return ``layers`` as a list of ints; duplicates raise :class:`LayoutOptionError`."""
    out = []
    for layer in layers:
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
            raise LayoutOptionError(name, layers, f"layer {layer!r} is not an integer")
        out.append(int(layer))
    seen: set[int] = set()
    for layer in out:
        if layer in seen:
            raise LayoutOptionError(name, tuple(out), f"decoder layer {layer} is listed twice")
        seen.add(layer)
    return out


def select_layers(moe_layers: Sequence[int], layers: Sequence[int] | None) -> np.ndarray:
    """Positions of global decoder layers on the stored (MoE-only) layer axis.

    Parameters
    ----------
    moe_layers : sequence of int, shape (L,)
        Global decoder-layer index of each entry of the stored layer axis.
    layers : sequence of int or None
        Global decoder-layer indices a pipeline stage needs, in the order wanted;
        ``None`` selects every stored layer.

    Returns
    -------
    numpy.ndarray of int64, shape (len(layers),)
        ``routes[:, select_layers(...)]`` keeps exactly the requested layers.

    Raises
    ------
    LayerError
        If a requested layer is not in ``moe_layers`` (e.g. a dense layer).
        ``LayerError`` is an ``IndexError``.
    LayoutOptionError
        If ``moe_layers`` or ``layers`` holds a non-integer or a duplicate.

    Notes
    -----
    SGLang indexes the layer axis by decoder layer number, newer vLLM by MoE-layer
    ordinal (SGLang ``meta_info['routed_experts']``, vLLM ``CompletionOutput.routed_experts``);
    pipeline stages address layers by global decoder-layer index (as Miles does).

    Examples
    --------
    >>> select_layers([1, 2, 3, 5], [3, 5])
    array([2, 3])
    """
    moe = _layer_list("moe_layers", moe_layers)
    if layers is None:
        return np.arange(len(moe), dtype=np.int64)
    position = {layer: i for i, layer in enumerate(moe)}
    wanted = _layer_list("layers", layers)
    for layer in wanted:
        if layer not in position:
            raise LayerError(layer, tuple(moe))
    return np.array([position[layer] for layer in wanted], dtype=np.int64)
