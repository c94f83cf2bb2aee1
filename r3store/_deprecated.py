"""Deprecated names, kept for one release: each use warns with
:class:`r3store.errors.R3StoreDeprecationWarning` (a ``DeprecationWarning``) naming the
release that removes it (:data:`REMOVED_IN`).

Four shapes of alias, one helper each:

* a renamed module attribute (class or function): :func:`module_getattr`, assigned to a
  module's ``__getattr__`` (so the old name warns when it is looked up, not on import);
* a renamed keyword argument: :func:`renamed_keyword`, called by the function that
  still accepts the old keyword;
* a renamed attribute or property: :func:`renamed_property`;
* loose keywords that became fields of a settings object (``cp_size=2`` ->
  ``options=LayoutOptions(cp_size=2)``): the entry point takes ``**deprecated`` and
  calls :func:`loose_fields`, which warns and returns the fields to merge.

Deprecated names are never listed in ``__all__``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from r3store.errors import R3StoreDeprecationWarning

__all__ = ["REMOVED_IN", "loose_fields", "module_getattr", "renamed_keyword", "renamed_property", "warn"]

T = TypeVar("T")

REMOVED_IN = "0.4.0"
"""The release that removes every alias deprecated in 0.3 (named in each warning)."""


def warn(old: str, new: str, *, stacklevel: int = 3, removed_in: str = REMOVED_IN) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` and removed in release ``removed_in``.

    Warns
    -----
    r3store.errors.R3StoreDeprecationWarning
        ``"<old> is deprecated and will be removed in r3store <removed_in>; use <new>"``.
    """
    warnings.warn(f"{old} is deprecated and will be removed in r3store {removed_in}; use {new}",
                  R3StoreDeprecationWarning, stacklevel=stacklevel)


def loose_fields(func: str, given: Mapping[str, Any], aliases: Mapping[str, str], *,
                 stacklevel: int = 4) -> dict[str, dict[str, Any]]:
    """Sort the deprecated loose keywords ``given`` to a function into the objects they now belong to.

    Parameters
    ----------
    func : str
        The function, as users write it (``"RouteDataset"``, ``"RouteStore.assemble"``).
    given : mapping
        The function's ``**deprecated`` keywords.
    aliases : mapping of str to str
        Old keyword -> ``"<parameter>.<field>"`` (``"cp_size": "options.cp_size"``): the
        settings parameter and field that replace it.

    Returns
    -------
    dict
        Parameter -> {field: value} of the keywords given (``None`` values count as not
        given, as they always did). One warning names every keyword given and its place.

    Raises
    ------
    TypeError
        A keyword is not one of ``aliases`` (as Python raises for an unknown keyword).
    """
    out: dict[str, dict[str, Any]] = {}
    for name in given:
        if name not in aliases:
            raise TypeError(f"{func}() got an unexpected keyword argument {name!r}")
    if not given:
        return out
    places: dict[str, list[str]] = {}
    for name, value in given.items():
        param, _, field = aliases[name].partition(".")
        places.setdefault(param, []).append(f"{field!r}: ...")
        if value is not None:
            out.setdefault(param, {})[field] = value
    old = ", ".join(f"{name}=..." for name in given)
    new = " and ".join(f"{param}={{{', '.join(fields)}}}" for param, fields in places.items())
    warn(f"{func}({old})", f"{new} (the settings object or its dict)", stacklevel=stacklevel)
    return out


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
