"""Connecting to a cluster, unwrapping task errors, and measuring what crosses the object store."""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterator
from typing import Any

import ray

from r3store.errors import R3StoreError

__all__ = ["connect", "object_store_bytes", "r3store_errors"]


def connect(address: str | None = None, *, verbose: bool = False) -> None:
    """Connect this process to a Ray cluster, unless it already is.

    Parameters
    ----------
    address : str, optional
        ``ray.init`` address: ``"auto"``, ``"host:6379"``, ``"ray://host:10001"``.
        None or ``""``: ``ray.init()``'s own choice (``RAY_ADDRESS``, else the cluster
        last started by ``ray start`` on this machine, else a new local cluster with
        one worker per CPU).
    verbose : bool
        False (default): Ray starts quietly: its Python loggers print errors only
        (``logging_level=logging.ERROR``: no "Started a local Ray instance" or "Connecting
        to existing Ray cluster" INFO lines, no start-up warnings such as the token
        authentication notice), worker output is not forwarded to this process
        (``log_to_driver=False``) and no dashboard is started, so a command's output (its
        ``--json`` included) holds nothing of Ray's. True: Ray's INFO lines and the
        workers' output on stderr (``r3store validate --ray -v``). Ray's own log files
        (the ``logs`` folder of its session) are written either way.

    Notes
    -----
    A process already connected (``ray.is_initialized()``) keeps its connection and
    neither argument is looked at. Messages of Ray's C++ core (a failed connection's
    retries) are not Python logging and still reach stderr.
    """
    if ray.is_initialized():
        return
    ray.init(address=address or None, include_dashboard=False, log_to_driver=verbose,
             logging_level=logging.INFO if verbose else logging.ERROR)


@contextlib.contextmanager
def r3store_errors() -> Iterator[None]:
    """Re-raise an r3store error that a Ray task raised as itself (a ``ChecksumError``,
    ``FormatError``, ...), chained to Ray's wrapper, so callers catch it as in one process."""
    try:
        yield
    except R3StoreError as exc:
        if isinstance(exc, ray.exceptions.RayTaskError):  # Ray's dual class: the original, not the wrapper
            cause = _r3store_cause(exc)
            if cause is not None:
                raise cause from exc
        raise
    except Exception as exc:  # Ray Data may wrap the task's error in its own exceptions
        cause = _r3store_cause(exc)
        if cause is not None:
            raise cause from exc
        raise


def _r3store_cause(exc: BaseException) -> R3StoreError | None:
    """The r3store error a (possibly wrapped) Ray task error carries, if any: the ``cause`` of a
    ``RayTaskError`` (the exception the task raised, deserialized), searched along ``__cause__``."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if isinstance(cause, R3StoreError) and not isinstance(cause, ray.exceptions.RayTaskError):
            return cause
        if isinstance(cause, BaseException) and cause is not current:
            found = _r3store_cause(cause) if id(cause) not in seen else None
            if found is not None:
                return found
        current = current.__cause__
    return None


def object_store_bytes(value: Any) -> int:
    """Bytes Ray's serializer makes of ``value``: what ``ray.put(value)`` stores in the object
    store, and what passing it to a remote call or an actor method carries.

    Parameters
    ----------
    value : object
        Any value (numpy arrays are written out of band, as Ray does).

    Returns
    -------
    int
        Serialized size in bytes, metadata included.

    Notes
    -----
    Uses the connected worker's serialization context (Ray's own code path for
    ``ray.put``); without a connection, pickle protocol 5 with out-of-band buffers (the
    same layout, without Ray's few bytes of framing).
    """
    if ray.is_initialized():
        try:
            context = ray._private.worker.global_worker.get_serialization_context()  # type: ignore[no-untyped-call]
            return int(context.serialize(value).total_bytes)
        except AttributeError:  # the private API moved: fall back to the same pickle layout
            pass
    buffers: list[pickle.PickleBuffer] = []
    head = ray.cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)  # type: ignore[no-untyped-call]
    return len(head) + sum(memoryview(b).nbytes for b in buffers)
