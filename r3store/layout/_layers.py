"""Pipeline parallel: pick a stage's layers out of the stored MoE-layer axis."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from r3store._spec import layer_positions

__all__ = ["select_layers"]


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
        If a requested layer is not in ``moe_layers`` (e.g. a dense layer) or is
        requested twice, or ``moe_layers`` lists a layer twice. ``LayerError`` is an
        ``IndexError``.
    TypeError
        If ``layers`` is an int or a str, or ``moe_layers`` or ``layers`` holds a
        non-integer.

    Notes
    -----
    The mapping is :meth:`r3store.ModelSpec.layer_positions`' (one mapping, one error
    policy). SGLang indexes the layer axis by decoder layer number, newer vLLM by MoE-layer
    ordinal (SGLang ``meta_info['routed_experts']``, vLLM ``CompletionOutput.routed_experts``);
    pipeline stages address layers by global decoder-layer index (as Miles does).

    Examples
    --------
    >>> select_layers([1, 2, 3, 5], [3, 5])
    array([2, 3])
    """
    return np.array(layer_positions(moe_layers, layers), dtype=np.int64)
