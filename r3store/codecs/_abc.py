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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

__all__ = ["Codec"]

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
        return type(other) is type(self) and other.get_config() == self.get_config()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.get_config().items())))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"
