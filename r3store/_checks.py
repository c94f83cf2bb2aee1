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
import difflib
import functools
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeGuard, TypeVar, cast

import numpy as np

from r3store._deprecated import loose_fields
from r3store.errors import OptionError, UnknownOptionError

__all__ = [
    "MAX_ROWS",
    "ErrorFactory",
    "check_field_names",
    "check_id_sequence",
    "closest_names",
    "config_fields",
    "config_from_dict",
    "is_int",
    "merge_config",
    "parse_bool",
    "parse_choice",
    "parse_int",
    "parse_optional_int",
    "resolve_config",
    "same_value",
    "strict_fields",
]

MAX_ROWS = 1 << 40
"""The one bound on sample lengths: ``num_tokens`` and a layout's ``max_seqlen`` are at most
this; route arrays, a sample's route rows and row offsets are below it (readers reject more)."""

ErrorFactory = Callable[[str, Any, str], Exception]
"""Builds the error to raise from ``(name, value, fault)``."""

T = TypeVar("T", bound=str)


class _Config(Protocol):
    """A frozen dataclass of settings with a dict form (LayoutOptions, WriterConfig)."""

    def to_dict(self) -> Any: ...

    @classmethod
    def resolve(cls, config: Any = None, /, **fields: Any) -> Any: ...


C = TypeVar("C", bound=_Config)
D = TypeVar("D")


def resolve_config(cls: type[C], func: str, param: str, config: C | Mapping[str, Any] | None,
                   deprecated: Mapping[str, Any], aliases: Sequence[str] | None = None) -> C:
    """The settings object of an entry point: ``config`` (its ``param=``) merged with the
    deprecated loose keywords the entry point still takes in ``**deprecated``.

    Parameters
    ----------
    cls : type
        The settings class (``LayoutOptions``, ``ReaderOptions``, ``WriterConfig``).
    func : str
        The entry point as users write it (for messages).
    param : str
        The parameter the object is passed as (``"options"``, ``"reader"``, ``"config"``).
    config : cls, its dict form, or None
    deprecated : mapping
        The entry point's ``**deprecated`` keywords.
    aliases : sequence of str, optional
        The fields ``func`` used to take as loose keywords (default: ``cls.LOOSE_KEYWORDS``; each warns with
        :class:`r3store.errors.R3StoreDeprecationWarning`, pointing at the caller of ``func``).

    Raises
    ------
    TypeError
        A keyword is not one of ``aliases`` (Python's words; when it is close to a field of
        ``cls``, "did you mean <param>={'<field>': ...}?").
    r3store.errors.OptionError
        As ``cls.resolve`` (a field given both ways with different values, a bad value).
    """
    names = getattr(cls, "LOOSE_KEYWORDS", ()) if aliases is None else aliases
    for key in deprecated:
        if key not in names:
            close = closest_names(key, [f.name for f in dataclasses.fields(cast(Any, cls)) if f.init], n=1)
            hint = f"; did you mean {param}={{{close[0]!r}: ...}}?" if close else ""
            raise TypeError(f"{func}() got an unexpected keyword argument {key!r}{hint}")
    loose = loose_fields(func, deprecated, {name: f"{param}.{name}" for name in names}, stacklevel=5)
    return cast(C, cls.resolve(config, **loose.get(param, {})))


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
    if not given and isinstance(config, cls):  # the common call: a whole settings object, nothing loose
        return config
    if isinstance(config, Mapping):
        base, explicit = from_dict(config), dict(config)
    elif isinstance(config, cls):
        default = cls().to_dict()
        base = config
        explicit = {k: v for k, v in config.to_dict().items() if not same_value(v, default[k])}
    else:
        raise error(name, config, f"must be a {cls.__name__}, a dict of its fields, or None")
    if not given:
        return base
    for field, value in given.items():
        if field in explicit and not same_value(explicit[field], value):
            raise error(field, value, f"given as a keyword and as {explicit[field]!r} in {name}")
    return from_dict({**base.to_dict(), **given})


def same_value(a: Any, b: Any) -> bool:
    """``a == b`` for settings values; values whose ``==`` builds an expression (a pyarrow
    ``Expression``) compare with their ``equals`` method."""
    if a is b:
        return True
    equals = getattr(a, "equals", None)
    if callable(equals) and type(a) is type(b):
        return bool(equals(b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def config_fields(cls: type) -> frozenset[str]:
    """Field names of a dataclass (those its ``__init__`` takes)."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.init)


def closest_names(name: object, valid: Sequence[str], *, n: int = 2) -> tuple[str, ...]:
    """The names of ``valid`` closest to ``name``, best first, at most ``n``; empty when none is close.

    ``difflib.get_close_matches`` (cutoff 0.6) first; when it finds none, the names that
    ``name`` is a prefix of (or that are a prefix of it), in the order of ``valid`` (a short
    prefix such as ``"cp"`` scores low against ``"cp_size"``).

    Examples
    --------
    >>> closest_names("cp_sise", ["layout", "cp_size", "cp_rank", "tp_size"])
    ('cp_size', 'tp_size')
    >>> closest_names("cp", ["layout", "cp_size", "cp_rank", "tp_size"])
    ('cp_size', 'cp_rank')
    >>> closest_names("xyz", ["cp_size"])
    ()
    """
    text = str(name)
    found = difflib.get_close_matches(text, list(valid), n=n, cutoff=0.6)
    if not found and len(text) >= 2:
        found = [v for v in valid if v.startswith(text) or text.startswith(v)][:n]
    return tuple(found)


def check_field_names(cls: type, names: Mapping[str, Any], *, unknown: str | None = None) -> None:
    """Refuse a name of ``names`` that is not a field of the settings dataclass ``cls``: the
    one check behind every settings object's keyword construction and ``from_dict``.

    Parameters
    ----------
    cls : type
        The settings dataclass (its error class is ``cls.UNKNOWN_ERROR`` when it has one,
        else :class:`r3store.errors.UnknownOptionError`).
    names : mapping
        Name -> value as given.
    unknown : str, optional
        For the dict form: the fault said of an unknown key (``"is not a reader option"``);
        without it the names are keywords and the message reads as Python's own.

    Raises
    ------
    r3store.errors.UnknownOptionError
        (a ``TypeError`` and a ``ValueError``) naming ``cls``, the first unknown name and
        the closest valid names ("did you mean 'cp_size'?"), or every field when none is close.
    """
    fields = config_fields(cls)
    for key, value in names.items():
        if key not in fields:
            error: type[UnknownOptionError] = getattr(cls, "UNKNOWN_ERROR", UnknownOptionError)
            ordered = [f.name for f in dataclasses.fields(cls) if f.init]  # declaration order: main fields first
            raise error(cls.__name__, str(key), value, closest_names(key, ordered), tuple(sorted(fields)),
                        unknown=unknown)


S = TypeVar("S", bound=type)


def strict_fields(cls: S) -> S:
    """Class decorator (applied over ``@dataclass``): keyword construction with a name that is
    no field raises :class:`r3store.errors.UnknownOptionError` (via :func:`check_field_names`)
    instead of Python's bare ``TypeError``; everything else is the dataclass's ``__init__``."""
    init: Callable[..., None] = vars(cls)["__init__"]  # the one @dataclass wrote

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        check_field_names(cls, kwargs)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def config_from_dict(cls: type[D], d: Any, *, name: str, unknown: str, error: ErrorFactory = OptionError) -> D:
    """A settings object ``cls(**d)`` from a mapping (missing keys: defaults): the one
    ``from_dict`` of LayoutOptions, ReaderOptions, WriterConfig and RouteColumns.

    ``name`` is the parameter ``d`` stands for and ``unknown`` the fault said of a key that is
    not a field of ``cls`` (for messages); ``error`` builds the error for a ``d`` that is no mapping.

    Raises
    ------
    r3store.errors.OptionError
        ``d`` is not a mapping, or a value is invalid (``cls``'s checks).
    r3store.errors.UnknownOptionError
        ``d`` holds a key that is no field of ``cls`` (names the closest fields).
    """
    if not isinstance(d, Mapping):
        raise error(name, d, "must be a mapping")
    data: dict[str, Any] = dict(d)
    check_field_names(cls, data, unknown=unknown)
    make: Callable[..., D] = cls
    return make(**data)


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an integer: a Python int or a numpy integer (any ``numbers.Integral``),
    never a bool (``True`` is not a count). The one rule behind every int check of r3store.

    Examples
    --------
    >>> is_int(3), is_int(np.uint8(3)), is_int(True), is_int(3.0)
    (True, True, False, False)
    """
    return type(value) is int or (isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_))


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
    if not is_int(value):
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


def check_id_sequence(sample_ids: object) -> None:
    """Refuse, with a plain ``TypeError``, sample ids given as one str or bytes (they would be
    iterated character by character, each looked up as an id) or as a set (no order: the
    results would follow no order the caller knows). A dict's keys keep their order: taken."""
    if isinstance(sample_ids, str):
        raise TypeError(f"sample_ids must be a sequence of ids, got the str {sample_ids!r}; use [{sample_ids!r}]")
    if isinstance(sample_ids, bytes | bytearray | memoryview):
        raise TypeError(f"sample_ids must be a sequence of str ids, got the bytes {bytes(sample_ids)!r}")
    if isinstance(sample_ids, set | frozenset):
        raise TypeError(f"sample_ids must be an ordered sequence of ids, got a {type(sample_ids).__name__}; "
                        "use sorted(...) or list(...)")
