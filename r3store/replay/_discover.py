"""Find the MoE routers of a model and the decoder layer each belongs to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from torch import nn

from r3store._checks import is_int
from r3store.errors import ReplayError
from r3store.replay._families import ROUTER_FAMILIES, RouterSpec, WeightFn

__all__ = ["FoundRouter", "RouterChoice", "find_routers"]

RouterChoice: TypeAlias = "RouterSpec | WeightFn | None"
"""What ``routers=`` maps a module name or class to: a spec, a bare weight function, or
``None`` to leave that router alone."""


@dataclass(frozen=True, eq=False)
class FoundRouter:
    """One router of the model."""

    name: str
    """Qualified module name (``model.layers.3.mlp.gate``)."""
    module: nn.Module
    """The router module."""
    layer: int
    """Decoder-layer index."""
    spec: RouterSpec
    """How to replay it."""
    num_experts: int
    """Routed experts."""
    top_k: int
    """Experts per token."""


def _as_spec(choice: Any, where: str) -> RouterSpec | None:
    if choice is None or isinstance(choice, RouterSpec):
        return choice
    if callable(choice):
        return RouterSpec(weight_fn=choice, family=getattr(choice, "__name__", "custom"))
    raise ReplayError(f"routers[{where}] must be a RouterSpec, a weight function or None, got {type(choice).__name__}")


def _layer_of(name: str) -> tuple[int, str] | None:
    """The decoder-layer index in a module path (its first integer component) and the path before it."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return int(part), ".".join(parts[:i])
    return None


def _int_attr(router: nn.Module, override: int | None, attr: str, name: str) -> int:
    value = override if override is not None else getattr(router, attr, None)
    if not is_int(value) or value < 1:
        raise ReplayError(f"router {name} ({type(router).__name__}) has no usable {attr!r} attribute "
                          f"(got {value!r}); pass RouterSpec(..., {attr}=...) in routers=")
    return int(value)


def _choose(name: str, module: nn.Module, routers: Mapping[Any, Any], used: set[Any]) -> RouterSpec | None:
    if name in routers:
        used.add(name)
        return _as_spec(routers[name], repr(name))
    for cls in type(module).__mro__:
        if cls in routers:
            used.add(cls)
            return _as_spec(routers[cls], cls.__name__)
    return ROUTER_FAMILIES.get(type(module).__name__)


def _num_layers(model: nn.Module, prefix: str, layers: list[int]) -> int:
    try:
        container = model.get_submodule(prefix) if prefix else model
    except AttributeError:
        container = None
    if isinstance(container, nn.ModuleList | nn.Sequential):
        return len(container)
    config = getattr(model, "config", None)
    configured = getattr(getattr(config, "get_text_config", lambda: config)(), "num_hidden_layers", None)
    if is_int(configured) and configured > max(layers):
        return configured
    return max(layers) + 1


def _no_router_error(model: nn.Module) -> ReplayError:
    lookalikes = sorted({type(m).__name__ for _, m in model.named_modules() if "router" in type(m).__name__.lower()})
    seen = f"; router-like modules found but not known: {', '.join(lookalikes)}" if lookalikes else ""
    return ReplayError(
        f"no MoE router found in {type(model).__name__}{seen}. Known router classes: "
        f"{', '.join(sorted(ROUTER_FAMILIES))}. Name yours with "
        "RoutingReplay(model, routers={RouterClass: weight_fn}) or {'model.layers.0.mlp.gate': RouterSpec(...)}"
    )


def find_routers(model: nn.Module, routers: Mapping[Any, Any] | None = None) -> tuple[list[FoundRouter], int]:
    """Every router of ``model`` in decoder-layer order, and the number of decoder layers.

    Parameters
    ----------
    model : torch.nn.Module
    routers : mapping, optional
        Module name (str) or module class -> :class:`RouterSpec`, weight function, or
        ``None`` (skip). Overrides :data:`ROUTER_FAMILIES`; names are matched before classes.

    Returns
    -------
    routers : list of FoundRouter
        Sorted by decoder layer.
    num_layers : int
        Decoder layers, dense ones included (length of the module list holding the
        routers' decoder layers, else ``config.num_hidden_layers``).

    Raises
    ------
    r3store.errors.ReplayError
        No router found, a named module does not exist, a router's path holds no layer
        index, two routers share a decoder layer, or routers disagree on
        ``num_experts`` / ``top_k``.
    """
    routers = dict(routers or {})
    used: set[Any] = set()
    found: list[FoundRouter] = []
    prefixes: set[str] = set()
    for name, module in model.named_modules():
        spec = _choose(name, module, routers, used)
        if spec is None:
            continue
        where = _layer_of(name)
        if where is None:
            raise ReplayError(f"router {name!r} ({type(module).__name__}) has no decoder-layer index in its module "
                              "path (expected a path like 'model.layers.<i>.mlp.gate')")
        prefixes.add(where[1])
        found.append(FoundRouter(name, module, where[0], spec,
                                 _int_attr(module, spec.num_experts, "num_experts", name),
                                 _int_attr(module, spec.top_k, "top_k", name)))
    missing = [k for k in routers if isinstance(k, str) and k not in used]
    if missing:
        raise ReplayError(f"routers= names modules that do not exist in {type(model).__name__}: {missing}")
    if not found:
        raise _no_router_error(model)
    return _checked(found, prefixes, model)


def _checked(found: list[FoundRouter], prefixes: set[str], model: nn.Module) -> tuple[list[FoundRouter], int]:
    found.sort(key=lambda r: r.layer)
    layers = [r.layer for r in found]
    if len(set(layers)) != len(layers) or len(prefixes) != 1:
        names = ", ".join(r.name for r in found)
        raise ReplayError(f"routers found in more than one decoder stack or several per decoder layer ({names}); "
                          "pass the language model's submodule, or name the routers with routers=")
    geometry = {(r.num_experts, r.top_k) for r in found}
    if len(geometry) != 1:
        raise ReplayError(f"routers disagree on (num_experts, top_k): {sorted(geometry)}")
    return found, _num_layers(model, prefixes.pop(), layers)

