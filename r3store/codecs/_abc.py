"""The codec contract.

A codec turns a flat array of expert ids into bytes and back. Rules every codec obeys:

* ``codec_id`` is a class attribute; two classes may share an id only if each can
  decode the other's bytes.
* ``get_config()`` returns JSON values only, with the id under ``"id"``;
  ``from_config(get_config())`` rebuilds an equal codec.
* ``encode`` never modifies its input; ``decode`` writes into ``out`` only when
  ``out`` is given, and then returns ``out``.
* A failed ``decode`` (or the failed frame of ``decode_frames``) leaves no unchecked id in
  ``out``: its place is untouched, or every element of it is the missing marker (all bits
  set: -1 in signed dtypes, the maximum in unsigned ones), as a decoder that writes while it
  computes the checksum leaves it (zstd checks its content checksum at the end the same
  way). Header and size checks come first, so ``out`` is written only within its bounds.
* Malformed or corrupt input raises :class:`r3store.errors.FormatError` (a checksum
  mismatch raises its subclass :class:`r3store.errors.ChecksumError`); input a codec
  cannot represent raises :class:`r3store.errors.CodecError`.

Optional abilities are :class:`typing.Protocol` s checked at run time, never extra
abstract methods: :class:`SupportsFrameSize` (the id count of a frame, read from its
header, so a reader can reject a frame before decoding allocates for it),
:class:`SupportsBinding` (frames bound to their position in an array by a tag, so a frame
or storage object copied or swapped to another place is refused),
:class:`SupportsBatchDecode` (a run of frames checked and decoded into their places in a
caller's buffer by one call) and :class:`SupportsBatchEncode` (the frames of a row block, one
per layer chunk, by one call). Readers choose their paths by these abilities, never by a
codec's class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["Codec", "SupportsBatchDecode", "SupportsBatchEncode", "SupportsBinding", "SupportsFrameSize"]

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
            ``buf`` is not a valid frame, or ``out`` has the wrong size (``out`` then
            untouched).
        r3store.errors.ChecksumError
            The frame's checksum does not match its bytes. ``out`` then holds no
            unchecked id: it is untouched, or all missing marker (every bit set), as the
            module's rules say; a codec may write while it computes the checksum.
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


@runtime_checkable
class SupportsBatchDecode(Protocol):
    """A codec that checks and decodes a run of frames into their places in a caller's buffer.

    Readers (:meth:`r3store.RouteReader.get`, ``get_runs``, ``assemble``) hand it, per
    fetched byte range of a storage object, every frame that lands whole in the output:
    one call instead of one Python call per frame (a 32K-token sample of a 48-layer model
    is ~3,000 frames). Codecs without it are decoded frame by frame with
    :meth:`Codec.decode`; the result is the same.

    The call makes every check :meth:`Codec.decode` makes (checksum, sizes, and, with
    ``tag_prefix``, the position tag :class:`SupportsBinding`'s ``decode(tag=...)`` checks).
    It stops at the first frame failing one, or lying outside ``blob`` or ``out``, and
    returns its index; the reader then decodes that frame alone with
    :meth:`Codec.decode`, which names the fault. A faster path never skips a check.
    """

    def decode_frames(self, blob: bytes | memoryview | np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                      out: np.ndarray, rows: np.ndarray, layers: np.ndarray, *, chunk_rows: int,
                      layers_per_chunk: int, tag_prefix: str | None = None, row_chunks: np.ndarray | None = None,
                      layer_chunks: np.ndarray | None = None) -> int:
        """Check and decode frames ``blob[starts[f] : starts[f] + lengths[f]]`` into ``out``.

        Parameters
        ----------
        blob : bytes-like or ndarray of uint8
            Bytes of a storage object (a fetched range of it).
        starts, lengths, rows, layers : ndarray of int64, shape (n,)
            Per frame: its first byte in ``blob``, its size, and the output row and layer
            where its chunk lands: frame ``f`` holds ``chunk_rows * layers_per_chunk * top_k``
            ids, written to ``out[rows[f] : rows[f] + chunk_rows,
            layers[f] : layers[f] + layers_per_chunk]`` in C order.
        out : ndarray, shape (N, L, top_k)
            Writable, C-contiguous, an integer dtype of 1, 2 or 4 bytes (ids cast as numpy
            casts: the reader only passes a dtype holding every expert id).
        chunk_rows, layers_per_chunk : int
            The inner-chunk shape (``schema/FORMAT.md`` section 5).
        tag_prefix : str, optional
            Check each frame's position tag: frame ``f`` must carry
            ``r3store._format.position_tag(tag_prefix, row_chunks[f], layer_chunks[f])`` (the
            CRC-32C of ``f"{tag_prefix}/{row_chunks[f]}/{layer_chunks[f]}"``; the prefix is
            the commit). None: tags are not checked.
        row_chunks, layer_chunks : ndarray of int64, shape (n,), optional
            The frames' places in the array's chunk grid; needed with ``tag_prefix``.

        Returns
        -------
        int
            -1 when every frame decoded; else the index of the first frame that failed:
            the frames before it are decoded, its place is untouched or all missing
            marker (every bit set; never unchecked ids), the later frames' places are
            untouched.

        Raises
        ------
        r3store.errors.CodecError
            Arguments of the wrong type, dtype or shape (a caller's bug, not bad data).
        """
        ...


@runtime_checkable
class SupportsBatchEncode(Protocol):
    """A codec that encodes the frames of a row block, one per layer chunk, in one call.

    Writers hand it each block of ``chunk_rows`` rows of a storage object: one call
    instead of one :meth:`Codec.encode` per frame (a 32K-token sample of a 48-layer model
    is ~3,000 frames). The frames must be byte for byte what ``encode`` (with ``tag=``,
    :class:`SupportsBinding`) returns for each layer chunk. Codecs without it are called
    frame by frame.
    """

    def encode_chunks(self, block: np.ndarray, layers_per_chunk: int,
                      tags: Sequence[int]) -> tuple[bytes | memoryview, list[int]]:
        """Encode ``block[:, b * layers_per_chunk : (b + 1) * layers_per_chunk]`` for each ``b``.

        Parameters
        ----------
        block : ndarray of integer dtype, shape (rows, len(tags) * layers_per_chunk, top_k)
            Any memory layout; ids the codec can hold.
        layers_per_chunk : int
        tags : sequence of int
            Per frame, the position tag it is bound to (``[0, 2**32)``; 0: unbound).

        Returns
        -------
        frames : bytes-like
            The frames back to back.
        sizes : list of int
            The size of each frame, in order.

        Raises
        ------
        r3store.errors.CodecError
            As :meth:`Codec.encode`: an id the codec cannot hold, a bad tag.
        """
        ...
