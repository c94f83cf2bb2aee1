"""Lay routes out exactly like a trainer lays out tokens (THD / BSHD, CP, TP, SP, PP).

The layout of a micro-batch is computed once, by :func:`plan_layout`, as an index
over token positions. :func:`apply_plan` then lays out any per-token array and
:func:`apply_routes` lays out the routes through the same plan, so tokens and
routes cannot drift apart. :func:`select_layers` picks a pipeline stage's layers.
Conventions follow Miles' per-micro-batch route layout (pad row, THD/BSHD, zig-zag CP,
TP padding, SP split, PP layers) and Megatron's context parallelism.
"""

from __future__ import annotations

from r3store.layout._apply import apply_plan, apply_routes, check_pad_args
from r3store.layout._layers import select_layers
from r3store.layout._options import PAD_POLICIES, ROUTE_DTYPES, LayoutOptionError, LayoutOptions, LayoutOptionsDict
from r3store.layout._pad import pad_ids, pad_routes
from r3store.layout._plan import LayoutPlan, plan_layout, route_index

__all__ = [
    "LayoutOptionError",
    "LayoutOptions",
    "LayoutOptionsDict",
    "LayoutPlan",
    "PAD_POLICIES",
    "ROUTE_DTYPES",
    "apply_plan",
    "apply_routes",
    "check_pad_args",
    "pad_ids",
    "pad_routes",
    "plan_layout",
    "route_index",
    "select_layers",
]
