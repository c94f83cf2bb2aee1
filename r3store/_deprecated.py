"""Deprecated names, kept for one release: each use warns with ``DeprecationWarning``.

Three shapes of alias, one helper each:

* a renamed module attribute (class or function): :func:`module_getattr`, assigned to a
  module's ``__getattr__`` (so the old name warns when it is looked up, not on import);
* a renamed keyword argument: :func:`renamed_keyword`, called by the function that
  still accepts the old keyword;
* a renamed attribute or property: :func:`renamed_property`.

Deprecated names are never listed in ``__all__``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

__all__ = ["module_getattr", "renamed_keyword", "renamed_property", "warn"]

T = TypeVar("T")


def warn(old: str, new: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (removed in the next release)."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}",
                  DeprecationWarning, stacklevel=stacklevel)


def module_getattr(module: str, aliases: Mapping[str, tuple[str, Callable[[], Any]]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving deprecated names.

    Parameters
    ----------
    module : str
        The module's ``__name__`` (for messages).
    aliases : mapping of str to (str, callable)
        Old name -> (the new name, as users should write it; a function returning the
        object, called on each lookup so the module is imported lazily).
    """

    def __getattr__(name: str) -> Any:
        if name not in aliases:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new, get = aliases[name]
        warn(f"{module}.{name}", new)
        return get()

    return __getattr__


def renamed_keyword(func: str, old: str, new: str, old_value: T | None, new_value: T | None) -> T | None:
    """The value of a keyword renamed from ``old`` to ``new`` (warns when ``old`` is used).

    Raises
    ------
    TypeError
        Both keywords are given.
    """
    if old_value is None:
        return new_value
    if new_value is not None:
        raise TypeError(f"{func}() got both {old}= (deprecated) and {new}=; pass {new}= only")
    warn(f"{func}({old}=...)", f"{new}=", stacklevel=4)
    return old_value


def renamed_property(old: str, new: str) -> property:
    """A read-only property ``old`` returning attribute ``new`` (a dotted path such as
    ``config.buffer_bytes`` too); warns on each read."""
    get = operator.attrgetter(new)

    def getter(self: Any) -> Any:
        warn(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new}")
        return get(self)

    return property(getter, doc=f"Deprecated alias of :attr:`{new}`.")
