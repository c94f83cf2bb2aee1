"""Codecs: expert ids to bytes and back.

The contract lives in :class:`Codec`; codecs are looked up by id with :func:`get_codec`.
"""

from r3store.codecs._abc import Codec
from r3store.codecs._bitpack import (
    BitpackCodec,
    pack_bits,
    pack_bits_reference,
    unpack_bits,
    unpack_bits_reference,
)
from r3store.codecs._registry import get_codec, register_codec, registry

register_codec(BitpackCodec)

__all__ = [
    "BitpackCodec",
    "Codec",
    "get_codec",
    "pack_bits",
    "pack_bits_reference",
    "register_codec",
    "registry",
    "unpack_bits",
    "unpack_bits_reference",
]
