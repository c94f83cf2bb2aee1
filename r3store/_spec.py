"""`ModelSpec`: the routing geometry of one MoE model."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from r3store._checks import is_int, parse_int
from r3store.errors import LayerError, SpecError

__all__ = ["ModelSpec", "ModelSpecDict", "layer_positions"]

MAX_EXPERTS = 1 << 16
MAX_LAYERS = 1 << 16
"""Sanity bound on decoder layers (a forged manifest must not drive huge allocations)."""


class ModelSpecDict(TypedDict):
    """Dict form of :class:`ModelSpec` (as stored in ``r3store.json``)."""

    num_layers: int
    num_experts: int
    top_k: int
    moe_layers: list[int]


def _spec_error(name: str, value: Any, fault: str) -> SpecError:
    return SpecError(f"ModelSpec.{name} {fault}, got {value!r}")


def parse_moe_layers(value: Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    if value is None:
        return tuple(range(num_layers))
    layers = tuple(int(v) for v in value)
    if not layers:
        raise SpecError("ModelSpec.moe_layers must name at least one layer (None = all)")
    if list(layers) != sorted(set(layers)):
        raise SpecError(f"ModelSpec.moe_layers must be sorted and unique, got {list(layers)}")
    if layers[0] < 0 or layers[-1] >= num_layers:
        raise SpecError(
            f"ModelSpec.moe_layers must lie in [0, num_layers={num_layers}), got {list(layers)}"
        )
    return layers


@dataclass(frozen=True)
class ModelSpec:
    """Routing geometry of an MoE model: what every route array of a store has in common.

    Parameters
    ----------
    num_layers : int
        Decoder layers of the model, dense layers included (SGLang's
        ``num_hidden_layers``; the layer axis of SGLang's ``routed_experts``).
    num_experts : int
        Routed experts per MoE layer (shared experts excluded), 1 to 65536.
    top_k : int
        Experts chosen per token per MoE layer, 1 to ``num_experts``.
    moe_layers : sequence of int or None
        Sorted, unique global decoder-layer indices of the MoE layers. ``None``
        means every layer is an MoE layer. Only MoE layers are stored.

    Raises
    ------
    r3store.errors.SpecError
        A field is out of range or of the wrong type.

    Examples
    --------
    >>> spec = ModelSpec(num_layers=61, num_experts=256, top_k=8, moe_layers=range(3, 61))
    >>> spec.num_moe_layers, spec.bits_per_id
    (58, 8)
    """

    num_layers: int
    """Decoder layers, dense layers included."""
    num_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts chosen per token per MoE layer."""
    moe_layers: tuple[int, ...] = ()
    """Global decoder-layer indices of the MoE layers, sorted."""

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        top_k: int,
        moe_layers: Sequence[int] | None = None,
    ) -> None:
        num_layers = parse_int("num_layers", num_layers, minimum=1, maximum=MAX_LAYERS, error=_spec_error)
        num_experts = parse_int("num_experts", num_experts, minimum=1, maximum=MAX_EXPERTS, error=_spec_error)
        top_k = parse_int("top_k", top_k, minimum=1, maximum=num_experts, error=_spec_error)
        object.__setattr__(self, "num_layers", num_layers)
        object.__setattr__(self, "num_experts", num_experts)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "moe_layers", parse_moe_layers(moe_layers, num_layers))

    @property
    def num_moe_layers(self) -> int:
        """Number of MoE layers (the stored layer axis)."""
        return len(self.moe_layers)

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Decoder layers that are not MoE layers (present as zero rows in SGLang output)."""
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    @property
    def bits_per_id(self) -> int:
        """Bits one stored expert id takes: ``max(1, ceil(log2(num_experts)))``."""
        return max(1, math.ceil(math.log2(self.num_experts)))

    def layer_positions(self, layers: Sequence[int] | None) -> tuple[int, ...]:
        """Positions on the stored (MoE-layer) axis of global decoder layers.

        Parameters
        ----------
        layers : sequence of int or None
            Global decoder-layer indices; ``None`` selects every MoE layer.

        Returns
        -------
        tuple of int
            Index into the stored layer axis, in the order requested.

        Raises
        ------
        r3store.errors.LayerError
            A layer is not an MoE layer of this spec (dense, negative or too large),
            or is requested twice.
        TypeError
            ``layers`` is an int or a str, or holds a value that is not an int.
        """
        return layer_positions(self.moe_layers, layers)

    def to_dict(self) -> ModelSpecDict:
        """Return the JSON-ready dict form."""
        return {
            "num_layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "moe_layers": list(self.moe_layers),
        }

    @classmethod
    def from_dict(cls, data: ModelSpecDict | dict[str, Any]) -> ModelSpec:
        """Build a spec from :meth:`to_dict` output.

        Raises
        ------
        r3store.errors.SpecError
            A key is missing or unknown, or a value is invalid.
        """
        keys = {"num_layers", "num_experts", "top_k", "moe_layers"}
        if not isinstance(data, dict) or set(data) - keys or not {"num_layers", "num_experts", "top_k"} <= set(data):
            raise SpecError(f"ModelSpec dict must have keys {sorted(keys)}, got {data!r}")
        return cls(
            num_layers=data["num_layers"],
            num_experts=data["num_experts"],
            top_k=data["top_k"],
            moe_layers=data.get("moe_layers"),
        )


def layer_positions(moe_layers: Sequence[int], layers: Sequence[int] | None) -> tuple[int, ...]:
    """Positions of global decoder layers on a stored MoE-layer axis (the one mapping).

    Parameters
    ----------
    moe_layers : sequence of int, shape (L,)
        Global decoder-layer index of each entry of the stored layer axis.
    layers : sequence of int or None
        Global decoder-layer indices wanted, in the order wanted; ``None`` selects every
        entry of ``moe_layers``.

    Returns
    -------
    tuple of int
        Index into the stored layer axis of each requested layer.

    Raises
    ------
    r3store.errors.LayerError
        (an IndexError) a layer is not in ``moe_layers`` (a dense layer, negative or too
        large), or is requested twice; or ``moe_layers`` lists a layer twice.
    TypeError
        ``layers`` is an int or a str, or ``layers`` / ``moe_layers`` holds a value that
        is not an int.

    Examples
    --------
    >>> layer_positions([1, 2, 3, 5], [5, 1])
    (3, 0)
    """
    stored = tuple(_layer_int(layer) for layer in moe_layers)
    where = {layer: i for i, layer in enumerate(stored)}
    if len(where) != len(stored):
        twice = next(layer for i, layer in enumerate(stored) if where[layer] != i)
        raise LayerError(twice, stored, fault="is listed twice in moe_layers")
    if layers is None:
        return tuple(range(len(stored)))
    if isinstance(layers, numbers.Integral):
        raise TypeError(f"layers must be a sequence of decoder-layer indices, got the int {layers}; use [{layers}]")
    if isinstance(layers, str | bytes):
        raise TypeError(f"layers must be a sequence of decoder-layer indices, got the str {layers!r}")
    out: list[int] = []
    for layer in map(_layer_int, layers):
        pos = where.get(layer)
        if pos is None:
            raise LayerError(layer, stored)
        if pos in out:
            raise LayerError(layer, stored, fault="is requested twice")
        out.append(pos)
    return tuple(out)


def _layer_int(layer: object) -> int:
    if type(layer) is int:  # the common case, without the slow ABC check (runs per layer per batch)
        return layer
    if not is_int(layer):
        raise TypeError(f"layers must hold ints (decoder-layer indices), got {layer!r}")
    return int(layer)
