"""JSON documents of a store (``r3store.json``, ``zarr.json``, table metadata), parsed safely.

Python's :func:`json.loads` accepts what no r3store writer produces and fails on some
input with errors that are not r3store's: integers of more than 4,300 digits raise a
bare ``ValueError`` (the int-string conversion limit), ``NaN``/``Infinity`` parse to
floats, a key given twice silently keeps the last value, and deep nesting recurses.
:func:`loads_document` refuses all of these with a :class:`r3store.errors.FormatError`
naming the object, and :func:`canonical_json` gives the byte form checksums are taken of.
"""

from __future__ import annotations

import json
import math
from typing import Any

from r3store.errors import FormatError

__all__ = ["MAX_INT_DIGITS", "canonical_json", "loads_document"]

MAX_INT_DIGITS = 19
"""Digits an integer of a store document may have (int64 needs at most 19)."""


class _Refused(ValueError):
    """A value the store format does not allow (raised inside the JSON hooks)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is not finite in float64")
    return value


def _parse_constant(name: str) -> Any:
    raise _Refused(f"{name} (not JSON)")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(f"the key {key!r} is given twice in one object")
        out[key] = value
    return out


def loads_document(raw: bytes | bytearray | memoryview | str, path: str) -> dict[str, Any]:
    """Parse a store's JSON document; its root must be an object.

    Parameters
    ----------
    raw : bytes-like or str
        UTF-8 JSON.
    path : str
        The object's location, for messages.

    Returns
    -------
    dict

    Raises
    ------
    r3store.errors.FormatError
        Not UTF-8, not JSON, nested too deeply, a root other than an object, an integer of
        more than :data:`MAX_INT_DIGITS` digits, a number that is not finite in float64,
        ``NaN``/``Infinity``, or a key given twice in one object.

    Examples
    --------
    >>> loads_document(b'{"a": [1, 2.5]}', "x.json")
    {'a': [1, 2.5]}
    >>> loads_document(b'{"a": 1, "a": 2}', "x.json")
    Traceback (most recent call last):
    ...
    r3store.errors.FormatError: x.json: not a valid store document: the key 'a' is given twice in one object
    """
    try:
        text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
        doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                         object_pairs_hook=_object)
    except _Refused as exc:
        raise FormatError(path, f"not a valid store document: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(path, f"not valid JSON: {exc}") from exc
    except RecursionError:
        raise FormatError(path, "not valid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise FormatError(path, f"a store document is a JSON object, found {type(doc).__name__}")
    return doc


def canonical_json(doc: Any) -> bytes:
    """The canonical bytes of a document (sorted keys, no spaces, ASCII; what checksums cover).

    Examples
    --------
    >>> canonical_json({"b": [1, 2], "a": "é"})
    b'{"a":"\\\\u00e9","b":[1,2]}'
    """
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
