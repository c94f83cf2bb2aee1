"""The codec contract.

A codec turns a flat array of expert ids into bytes and back. Rules every codec obeys:

* ``codec_id`` is a class attribute; two classes may share an id only if each can
  decode the other's bytes.
* ``get_config()`` returns JSON values only, with the id under ``"id"``;
  ``from_config(get_config())`` rebuilds an equal codec.
* ``encode`` never modifies its input; ``decode`` writes into ``out`` only when
  ``out`` is given, and then returns ``out``.
* Malformed or corrupt input raises :class:`r3store.errors.FormatError` (a checksum
  mismatch raises its subclass :class:`r3store.errors.ChecksumError`); input a codec
  cannot represent raises :class:`r3store.errors.CodecError`.

Optional abilities are :class:`typing.Protocol` s checked at run time, never extra
abstract methods: :class:`SupportsFrameSize` (the id count of a frame, read from its
header, so a reader can reject a frame before decoding allocates for it) and
:class:`SupportsBinding` (frames bound to their position in an array by a tag, so a frame
or storage object copied or swapped to another place is refused).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["Codec", "SupportsBinding", "SupportsFrameSize"]

JSON = Any


class Codec(ABC):
    """Abstract codec for flat integer arrays of expert ids."""

    codec_id: ClassVar[str]
    """Registry id, also the ``name`` of the codec in zarr metadata."""

    @abstractmethod
    def encode(self, ids: npt.ArrayLike) -> bytes:
        """Encode ``ids`` (any shape, integer dtype; read in C order) to bytes.

        Raises
        ------
        r3store.errors.CodecError
            An id cannot be represented by this codec.
        """

    @abstractmethod
    def decode(self, buf: bytes | memoryview | np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Decode bytes from :meth:`encode`.

        Parameters
        ----------
        buf : bytes-like
            One encoded frame.
        out : ndarray of integer dtype, optional
            C-contiguous destination with exactly as many elements as were encoded.

        Returns
        -------
        ndarray of int32, shape (n,)
            The ids (or ``out``, filled).

        Raises
        ------
        r3store.errors.FormatError
            ``buf`` is not a valid frame, or ``out`` has the wrong size.
        r3store.errors.ChecksumError
            The frame's checksum does not match its bytes.
        """

    @abstractmethod
    def get_config(self) -> dict[str, JSON]:
        """Return the JSON config, ``{"id": codec_id, ...}``."""

    @classmethod
    def from_config(cls, config: dict[str, JSON]) -> Codec:
        """Build a codec from :meth:`get_config` output (the ``"id"`` key is ignored)."""
        params = {k: v for k, v in config.items() if k != "id"}
        return cls(**params)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"


@runtime_checkable
class SupportsFrameSize(Protocol):
    """A codec that can tell how many ids a frame decodes to without decoding it.

    Readers use it to reject a frame whose header disagrees with the chunk it is stored
    for before :meth:`Codec.decode` allocates its output (a forged header must not drive
    a huge allocation). Codecs without it are decoded first and checked after.
    """

    def frame_size(self, buf: bytes | memoryview | np.ndarray) -> int:
        """Ids the frame ``buf`` decodes to, read from its header.

        Raises
        ------
        r3store.errors.FormatError
            ``buf`` is too short to hold a header.
        """
        ...


@runtime_checkable
class SupportsBinding(Protocol):
    """A codec whose frames can be bound to their position by a 32-bit tag.

    Such a codec's ``encode`` takes a keyword ``tag`` (``[0, 2**32)``, 0 = unbound) and
    its ``decode`` a keyword ``tag`` (the tag the frame must carry, or None: not
    checked), raising :class:`r3store.errors.ChecksumError` for a frame bound elsewhere.
    r3store's readers pass the tag of each chunk's place (``schema/FORMAT.md`` 5.1), so a
    frame or storage object swapped within an array, or copied from another commit, is an
    error instead of other routes. Codecs without it are read unbound.

    The protocol checks :meth:`frame_tag` at run time; ``encode``/``decode`` with ``tag``
    are part of the contract.
    """

    def frame_tag(self, buf: bytes | memoryview | np.ndarray) -> int:
        """The tag a frame carries, read from its header (0: unbound).

        Raises
        ------
        r3store.errors.FormatError
            ``buf`` is too short to hold a header.
        """
        ...
