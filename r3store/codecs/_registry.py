"""Codec registry: look codecs up by id, with an entry-point fallback."""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from r3store.codecs._abc import Codec
from r3store.codecs._bitpack import BitpackCodec
from r3store.codecs._set import SetCodec
from r3store.errors import CodecError, UnknownCodecError

__all__ = ["ENTRY_POINT_GROUP", "get_codec", "register_codec", "registry"]

ENTRY_POINT_GROUP = "r3store.codecs"
"""Entry-point group searched for codec ids that are not registered (plugins)."""

_registry: dict[str, type[Codec]] = {}
registry: Mapping[str, type[Codec]] = MappingProxyType(_registry)
"""Read-only view of the registered codec classes, by id."""


def register_codec(cls: type[Codec], codec_id: str | None = None, *, clobber: bool = False) -> None:
    """Register a codec class under ``codec_id`` (default: ``cls.codec_id``).

    Raises
    ------
    r3store.errors.CodecError
        The id is already taken by another class and ``clobber`` is false.
    """
    codec_id = codec_id or cls.codec_id
    taken = _registry.get(codec_id)
    if taken is not None and taken is not cls and not clobber:
        raise CodecError(codec_id, f"id already registered to {taken.__qualname__}; pass clobber=True")
    _registry[codec_id] = cls


def _load_entry_point(codec_id: str) -> type[Codec] | None:
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=codec_id):
        cls: type[Codec] = ep.load()
        register_codec(cls, codec_id)
        return cls
    return None


def get_codec(config: Mapping[str, Any]) -> Codec:
    """Build a codec from its JSON config ``{"id": ..., **params}``.

    Looks the id up in :data:`registry`, then in the ``r3store.codecs`` entry-point group.

    Raises
    ------
    r3store.errors.UnknownCodecError
        No codec is registered under the id (the message says how to install one).
    r3store.errors.CodecError
        The config is not a mapping with an ``"id"``, or its parameters are invalid.
    """
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise CodecError(str(config), "a codec config is a mapping with a string 'id'")
    codec_id = config["id"]
    cls = _registry.get(codec_id) or _load_entry_point(codec_id)
    if cls is None:
        raise UnknownCodecError(codec_id, hint=f"install the package that provides it (it registers under the "
                                               f"{ENTRY_POINT_GROUP!r} entry-point group) or call "
                                               "r3store.codecs.register_codec")
    try:
        return cls.from_config(dict(config))
    except TypeError as exc:
        raise CodecError(codec_id, f"invalid config {dict(config)!r}: {exc}") from exc


register_codec(BitpackCodec)
register_codec(SetCodec)
