"""Trainer micro-batches of routes, laid out like the trainer's tokens (numpy only).

:func:`assemble` reads the routes of given samples through an :class:`r3store.reader.RouteReader`
and lays them out with :mod:`r3store.layout`; tensors are the torch layer's job
(:mod:`r3store.dataset`).
"""

from r3store.batch._assemble import (
    BATCH_KEYS,
    ROUTE_DTYPES,
    PadPolicy,
    RouteDType,
    assemble,
    packed_bits,
    route_dtype,
)

__all__ = ["BATCH_KEYS", "PadPolicy", "ROUTE_DTYPES", "RouteDType", "assemble", "packed_bits", "route_dtype"]
