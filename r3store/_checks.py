"""Shared validators of settings and arguments: one place for "an int in [lo, hi]" and friends.

Each ``parse_*`` function returns the value in its canonical Python type or raises the
error built by ``error(name, value, fault)`` (default :class:`r3store.errors.OptionError`,
which is also a ``ValueError``). Modules with their own error class pass a factory, e.g.
:class:`r3store.errors.LayoutOptionError` for layout options, or a function wrapping
:class:`r3store.errors.SpecError` for model specs. Faults are phrased to follow the
name and value (``"cp_size=0: must be >= 1"``).

Bad sample or route *input* is not checked here: it raises
:class:`r3store.errors.RouteValidationError` (see ``r3store/_validate.py``).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from r3store.errors import OptionError

__all__ = [
    "ErrorFactory",
    "config_fields",
    "merge_config",
    "parse_bool",
    "parse_choice",
    "parse_int",
    "parse_optional_int",
]

ErrorFactory = Callable[[str, Any, str], Exception]
"""Builds the error to raise from ``(name, value, fault)``."""

T = TypeVar("T", bound=str)


class _Config(Protocol):
    """A frozen dataclass of settings with a dict form (LayoutOptions, WriterConfig)."""

    def to_dict(self) -> Any: ...


C = TypeVar("C", bound=_Config)


def merge_config(cls: type[C], config: C | Mapping[str, Any] | None, fields: Mapping[str, Any], *,
                 from_dict: Callable[[Mapping[str, Any]], C], name: str = "config",
                 error: ErrorFactory = OptionError) -> C:
    """One settings object from a whole ``config`` and fields given one by one.

    Fields whose value is ``None`` count as not given. A field given both ways must have
    the same value: ``config`` as a mapping sets exactly its keys; ``config`` as an object
    sets its fields that differ from the defaults. ``name`` is the parameter ``config``
    was passed as (for messages).

    Raises
    ------
    r3store.errors.OptionError
        (or what ``error`` builds) ``config`` is neither a ``cls`` nor a mapping, or a
        field is given both ways with different values; ``from_dict``'s errors.
    """
    given = {name: value for name, value in fields.items() if value is not None}
    if config is None:
        return from_dict(given)
    if isinstance(config, Mapping):
        base, explicit = from_dict(config), dict(config)
    elif isinstance(config, cls):
        default = cls().to_dict()
        base = config
        explicit = {k: v for k, v in config.to_dict().items() if v != default[k]}
    else:
        raise error(name, config, f"must be a {cls.__name__}, a dict of its fields, or None")
    if not given:
        return base
    for field, value in given.items():
        if field in explicit and explicit[field] != value:
            raise error(field, value, f"given as a keyword and as {explicit[field]!r} in {name}")
    return from_dict({**base.to_dict(), **given})


def config_fields(cls: type) -> frozenset[str]:
    """Field names of a dataclass."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def parse_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              error: ErrorFactory = OptionError) -> int:
    """``value`` as a Python int in ``[minimum, maximum]`` (numpy ints accepted, bools not).

    Raises
    ------
    r3store.errors.OptionError
        (or what ``error`` builds) naming ``name``, the value and the fault.

    Examples
    --------
    >>> parse_int("cp_size", np.int64(2), minimum=1)
    2
    >>> parse_int("cp_size", 0, minimum=1)
    Traceback (most recent call last):
    ...
    r3store.errors.OptionError: cp_size=0: must be >= 1
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise error(name, value, f"must be an int, not {type(value).__name__}")
    number = int(value)
    if minimum is not None and maximum is not None and not minimum <= number <= maximum:
        raise error(name, value, f"must be in [{minimum}, {maximum}]")
    if minimum is not None and number < minimum:
        raise error(name, value, f"must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise error(name, value, f"must be <= {maximum}")
    return number


def parse_optional_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
                       error: ErrorFactory = OptionError) -> int | None:
    """``None``, or ``value`` checked by :func:`parse_int`."""
    if value is None:
        return None
    return parse_int(name, value, minimum=minimum, maximum=maximum, error=error)


def parse_choice(name: str, value: Any, choices: Sequence[T], *, error: ErrorFactory = OptionError) -> T:
    """``value`` if it is one of ``choices`` (strings).

    Examples
    --------
    >>> parse_choice("layout", "thd", ("thd", "bshd"))
    'thd'
    """
    for choice in choices:
        if isinstance(value, str) and value == choice:
            return choice
    raise error(name, value, f"must be one of {', '.join(map(repr, choices))}")


def parse_bool(name: str, value: Any, *, error: ErrorFactory = OptionError) -> bool:
    """``value`` if it is a bool (``numpy.bool_`` included), as a Python bool."""
    if not isinstance(value, bool | np.bool_):
        raise error(name, value, "must be a bool")
    return bool(value)
