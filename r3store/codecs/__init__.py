"""Codecs: expert ids to bytes and back.

The contract lives in :class:`Codec` (optional abilities: :class:`SupportsFrameSize`,
:class:`SupportsBinding`, :class:`SupportsBatchDecode`, :class:`SupportsBatchEncode`);
codecs are looked up by id with :func:`get_codec` (built-in ``r3store.bitpack`` and
``r3store.set``, then the
``r3store.codecs`` entry-point group).
"""

from r3store.codecs._abc import (
    Codec,
    SupportsBatchDecode,
    SupportsBatchEncode,
    SupportsBinding,
    SupportsFrameSize,
)
from r3store.codecs._bitpack import (
    BitpackCodec,
    pack_bits,
    pack_bits_reference,
    unpack_bits,
    unpack_bits_reference,
)
from r3store.codecs._registry import ENTRY_POINT_GROUP, get_codec, register_codec, registry
from r3store.codecs._set import SetCodec

__all__ = [
    "BitpackCodec",
    "Codec",
    "ENTRY_POINT_GROUP",
    "SetCodec",
    "SupportsBatchDecode",
    "SupportsBatchEncode",
    "SupportsBinding",
    "SupportsFrameSize",
    "get_codec",
    "pack_bits",
    "pack_bits_reference",
    "register_codec",
    "registry",
    "unpack_bits",
    "unpack_bits_reference",
]
