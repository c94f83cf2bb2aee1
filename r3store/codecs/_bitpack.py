"""``r3store.bitpack``: expert ids packed in ``ceil(log2(num_experts))`` bits, with a checksum.

Frame layout (all integers little-endian; byte offsets). Version 2 (format v2 stores)::

    0   4  magic      b"R3BP"
    4   1  version    2
    5   1  bits       bits per id, 1..16
    6   2  reserved   0
    8   4  n_total    number of ids in the chunk
    12  4  n_encoded  number of ids in the payload (trailing zero ids are trimmed)
    16  4  tag        position tag: CRC-32C of "<commit>/<row_chunk>/<layer_chunk>"; 0 = unbound
    20  4  crc32c     CRC-32C (Castagnoli) of bytes [0, 20) followed by the payload
    24  .  payload    ceil(n_encoded * bits / 8) bytes

Version 1 (format v1 stores) has no tag: the CRC-32C sits at offset 16 (over bytes
``[0, 16)`` and the payload) and the payload starts at 20.

Id ``i`` of the payload occupies stream bits ``[i * bits, (i + 1) * bits)``, least
significant bit first; stream bit ``j`` is bit ``j % 8`` of payload byte ``j // 8``.
Ids ``n_encoded .. n_total - 1`` decode to 0. The reserved bytes and the unused high bits
of the last payload byte are 0 (decoding checks both). The trim makes the zero fill that zarr's
regular grid puts past the end of an array (and all-zero chunks) cost nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, ClassVar

import google_crc32c
import numpy as np
import numpy.typing as npt

from r3store._checks import is_int, parse_int
from r3store.codecs import kernels
from r3store.codecs._abc import Codec
from r3store.errors import ChecksumError, CodecError, FormatError

__all__ = [
    "BitpackCodec",
    "MAX_DECODE_IDS",
    "MAX_ZERO_TAIL_IDS",
    "check_zero_tail",
    "pack_bits",
    "pack_bits_reference",
    "unpack_bits",
    "unpack_bits_reference",
]

MAGIC = b"R3BP"
VERSIONS = (1, 2)
HEADER = struct.Struct("<4sBBHIII")
HEADER_V2 = struct.Struct("<4sBBHIIII")
HEADER_SIZES = {1: HEADER.size, 2: HEADER_V2.size}
_SIZES = struct.Struct("<II")  # n_total, n_encoded at offset 8
MAX_BITS = 16
MAX_DECODE_IDS = 1 << 26
"""Most ids :meth:`BitpackCodec.decode` allocates on its own (a frame of more decodes only
into an ``out`` of its size): a forged header cannot ask for more memory (256 MiB of int32)."""
MAX_ZERO_TAIL_IDS = 1 << 18
"""Most zero ids past its payload (``n_total - n_encoded``) a frame may declare when
:meth:`BitpackCodec.decode` allocates (no ``out``) and through the zarr entry point. With
``n_encoded <= 8 * len(frame)`` this bounds the allocation by its input: at most
``4 * (8 * len(frame) + MAX_ZERO_TAIL_IDS)`` bytes (32 bytes per frame byte plus 1 MiB),
so a 24-byte frame cannot ask for 256 MiB. Writers trim trailing zero ids only in the last
chunk of an array, whose zero tail is shorter than one chunk (128 x 4 x 8 = 4,096 ids by
default; 131,072 at r3store 0.2's 4,096-row chunks); store reads decode into ``out``
buffers sized from the checked array geometry and are not limited by it."""
_FRAME = "r3store.bitpack frame"


def check_zero_tail(n_total: int, n_encoded: int, nbytes: int) -> None:
    """Refuse a frame of ``nbytes`` whose ids past the payload exceed :data:`MAX_ZERO_TAIL_IDS`
    (what bounds decoding by its input).

    Raises
    ------
    r3store.errors.FormatError
    """
    if n_total - n_encoded > MAX_ZERO_TAIL_IDS:
        raise FormatError(_FRAME, f"a frame of {nbytes:,} bytes declares {n_total:,} ids, {n_total - n_encoded:,} of "
                                  f"them zeros past its payload: more than the {MAX_ZERO_TAIL_IDS:,} decode allocates "
                                  "for a frame on its own (pass out= of the chunk's size)")


def _codec_error(name: str, value: object, fault: str) -> CodecError:
    return CodecError(BitpackCodec.codec_id, f"{name} {fault}, got {value!r}")


def _check_bits(bits: object) -> int:
    return parse_int("bits", bits, minimum=1, maximum=MAX_BITS, error=_codec_error)



def pack_bits(ids: np.ndarray, bits: int) -> np.ndarray:
    """Pack non-negative ids below ``2**bits`` into a little-endian bit stream.

    Parameters
    ----------
    ids : ndarray of integer dtype, shape (n,)
        Values in ``[0, 2**bits)``; not checked here.
    bits : int
        Bits per id, 1 to 16.

    Returns
    -------
    ndarray of uint8, shape (ceil(n * bits / 8),)

    Notes
    -----
    Runs :func:`r3store.codecs.kernels.pack_bits` (compiled, or its numpy twin).
    """
    return kernels.pack_bits(ids, bits)


def unpack_bits(payload: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`.

    Parameters
    ----------
    payload : ndarray of uint8, shape (ceil(n * bits / 8),)
    n : int
        Number of ids to read.
    bits : int

    Returns
    -------
    ndarray of int32, shape (n,)

    Notes
    -----
    Runs :func:`r3store.codecs.kernels.unpack_bits` (compiled, or its numpy twin); that
    function also writes int16, uint16 and uint8.
    """
    return kernels.unpack_bits(payload, n, bits)


def pack_bits_reference(ids: npt.ArrayLike, bits: int) -> bytes:
    """Plain reference twin of :func:`pack_bits` (Python integers; slow, obviously right)."""
    acc = 0
    values = [int(v) for v in np.asarray(ids).reshape(-1)]
    for i, v in enumerate(values):
        acc |= v << (i * bits)
    return acc.to_bytes((len(values) * bits + 7) // 8, "little")


def unpack_bits_reference(payload: bytes, n: int, bits: int) -> np.ndarray:
    """Plain reference twin of :func:`unpack_bits`."""
    acc = int.from_bytes(bytes(payload), "little")
    mask = (1 << bits) - 1
    return np.array([(acc >> (i * bits)) & mask for i in range(n)], dtype=np.int32)


class BitpackCodec(Codec):
    """Bit-pack expert ids in ``bits`` bits each, with a CRC-32C per frame.

    Parameters
    ----------
    bits : int
        Bits per id, 1 to 16; r3store uses ``max(1, ceil(log2(num_experts)))``
        (6 for 64 experts, 9 for 512).
    frame_version : {1, 2}
        Version of the frames :meth:`encode` writes: 1 (format v1 stores) or 2 (a 24-byte
        header with a position tag; format v2 stores). :meth:`decode` reads both.

    Raises
    ------
    r3store.errors.CodecError
        ``bits`` or ``frame_version`` is out of range.

    Notes
    -----
    The byte layout is given in this module's docstring and in ``schema/FORMAT.md``.
    CRC-32C is the checksum zarr's ``crc32c`` codec uses. The codec supports position
    binding (:class:`r3store.codecs.SupportsBinding`): ``encode(ids, tag=t)`` writes a
    version-2 frame bound to ``t``, ``decode(buf, tag=t)`` refuses a frame bound elsewhere;
    and batch decoding and encoding (:class:`r3store.codecs.SupportsBatchDecode`,
    :class:`r3store.codecs.SupportsBatchEncode`): :meth:`decode_frames`, :meth:`encode_chunks`.

    Examples
    --------
    >>> codec = BitpackCodec(bits=6)
    >>> buf = codec.encode(np.array([3, 63, 0, 17]))
    >>> len(buf)  # 20-byte header + 4 ids * 6 bits
    23
    >>> codec.decode(buf).tolist()
    [3, 63, 0, 17]
    >>> bound = BitpackCodec(bits=6, frame_version=2).encode([3, 63, 0, 17], tag=0x1234)
    >>> len(bound), BitpackCodec(bits=6).frame_tag(bound) == 0x1234
    (27, True)
    """

    codec_id: ClassVar[str] = "r3store.bitpack"

    def __init__(self, bits: int, frame_version: int = 1) -> None:
        self.bits = _check_bits(bits)
        self.frame_version = parse_int("frame_version", frame_version, minimum=1, maximum=2, error=_codec_error)

    def get_config(self) -> dict[str, object]:
        config: dict[str, object] = {"id": self.codec_id, "bits": self.bits}
        if self.frame_version != 1:  # version-1 configs stay as format v1 wrote them
            config["frame_version"] = self.frame_version
        return config

    def encode(self, ids: npt.ArrayLike, *, tag: int = 0) -> bytes:
        """Encode ``ids`` as one frame (see :meth:`Codec.encode`).

        Parameters
        ----------
        ids : array_like of integer dtype, any shape
        tag : int
            Position tag, ``[0, 2**32)``: 0 leaves the frame unbound; any other value
            needs ``frame_version=2``.

        Raises
        ------
        r3store.errors.CodecError
            An id lies outside ``[0, 2**bits)``, ``ids`` is not integer, or ``tag`` is
            out of range or given to a version-1 codec.
        """
        arr = np.asarray(ids)
        if arr.size and arr.dtype.kind not in "iu":  # (np.issubdtype costs more than the encode of a chunk)
            raise CodecError(self.codec_id, f"ids must be integers, got dtype {arr.dtype}")
        if not is_int(tag) or not 0 <= int(tag) < 1 << 32:
            raise CodecError(self.codec_id, f"tag must be an int in [0, 2**32), got {tag!r}")
        if tag and self.frame_version == 1:
            raise CodecError(self.codec_id, "version-1 frames carry no position tag (use frame_version=2)")
        native = kernels.native_module()
        frame: bytes | None
        if native is not None and arr.dtype.kind in "iu" and arr.dtype.isnative and arr.size < 1 << 32:
            frame = native.encode_frame(arr, self.bits, self.frame_version, int(tag))  # any layout: no copy
        else:
            frame = kernels.encode_frame(arr, self.bits, version=self.frame_version, tag=int(tag))
        if frame is None:
            flat = arr.reshape(-1)
            raise CodecError(
                self.codec_id,
                f"ids must lie in [0, {1 << self.bits}) for {self.bits} bits, "
                f"got range [{int(flat.min())}, {int(flat.max())}]",
            )
        return frame

    def decode(self, buf: bytes | memoryview | np.ndarray, out: np.ndarray | None = None, *,
               tag: int | None = None) -> np.ndarray:
        """Decode one frame of version 1 or 2 (see :meth:`Codec.decode`).

        Parameters
        ----------
        buf : bytes-like
        out : ndarray of integer dtype, optional
            Destination of exactly the frame's ``n_total`` ids (checked before anything
            is written). Without it at most :data:`MAX_DECODE_IDS` ids are allocated.
        tag : int, optional
            The position tag the frame must carry (a version-1 frame carries none, read
            as 0); None: not checked.

        Notes
        -----
        With the C kernels the payload is decoded into ``out`` while its CRC-32C is
        computed (each byte read once), as streaming decoders with an end checksum do
        (zstd's content checksum). The header and size checks come first: when they fail
        (or ``out`` has the wrong size) ``out`` is untouched. When the CRC-32C or the
        position tag fails, every element of ``out`` is set to the missing marker (all
        bits set: -1 in signed dtypes, the maximum in unsigned ones) before the error is
        raised, so ``out`` never holds unchecked ids. Outputs of 8-byte integers, and
        outputs that are not C-contiguous in native byte order, are checked first and
        left untouched on failure.

        Raises
        ------
        r3store.errors.ChecksumError
            The CRC-32C does not match, or the frame is bound to another position than
            ``tag``.
        r3store.errors.FormatError
            Not a valid frame; ``out`` has the wrong size; or, without ``out``, the frame
            declares more than :data:`MAX_DECODE_IDS` ids or more than
            :data:`MAX_ZERO_TAIL_IDS` zero ids past its payload (decoding allocates at most
            32 bytes per frame byte plus 1 MiB; pass ``out`` for larger zero tails).
        """
        data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)
        if out is not None and (not isinstance(out, np.ndarray) or out.dtype.kind not in "iu"
                                or not out.flags.writeable):
            raise FormatError(_FRAME, f"out must be a writable integer array, got {getattr(out, 'dtype', out)!r}")
        native = kernels.native_module()  # called directly: per-frame overhead matters for small chunks
        if native is not None and (tag is None or (is_int(tag) and 0 <= tag < 1 << 32)):
            # fused: the payload decoded while its CRC-32C is computed (one read of each byte)
            target = out
            if target is None and data.size >= HEADER.size:
                n_total, n_encoded = _SIZES.unpack_from(data.data, 8)
                if n_total <= MAX_DECODE_IDS and n_total - n_encoded <= MAX_ZERO_TAIL_IDS:
                    target = np.empty(n_total, dtype=np.int32)
            if target is not None:
                status = native.decode_frame(data, self.bits, target, -1 if tag is None else tag)
                if not status:
                    return target
                if status > 0:  # -1: an out the fused decode does not write (8-byte, strided)
                    self._decode_checked(data, out, tag, native)  # names the fault (target holds no unchecked id)
                    raise FormatError(_FRAME, f"invalid frame (check {status})")
        return self._decode_checked(data, out, tag, native)

    def _decode_checked(self, data: np.ndarray, out: np.ndarray | None, tag: int | None, native: Any) -> np.ndarray:
        """:meth:`decode` by a check of the whole frame, then the unpack (``out`` untouched on
        failure): without the C kernels, for outputs the fused decode does not write, and to
        name a fault."""
        check = native.check_frame(data, self.bits) if native is not None else kernels.check_frame(data, self.bits)
        status, n_total, n_encoded, header, found = check
        if status:
            self._check_frame(data)  # names the fault
            raise FormatError(_FRAME, f"invalid frame (check {status})")
        if tag is not None and found != tag:
            bound = f"tag {found:#010x}" if found else "no tag (an unbound frame)"
            raise ChecksumError(_FRAME, (), f"frame carries {bound}, not the {tag:#010x} of its position")
        if out is None:
            if n_total > MAX_DECODE_IDS:
                raise FormatError(_FRAME, f"header declares {n_total:,} ids, more than the "
                                          f"{MAX_DECODE_IDS:,} decode allocates without out")
            check_zero_tail(n_total, n_encoded, len(data))
            out = np.empty(n_total, dtype=np.int32)
        elif out.size != n_total:
            raise FormatError(_FRAME, f"out holds {out.size} ids, the frame {n_total}")
        if native is not None and out.dtype.isnative:
            native.unpack(data, header, n_encoded, self.bits, out)  # zeros after n_encoded
        else:
            kernels.unpack_into(data[header:], n_encoded, self.bits, out)
        return out

    def encode_chunks(self, block: np.ndarray, layers_per_chunk: int,
                      tags: Sequence[int]) -> tuple[bytes | memoryview, list[int]]:
        """The frames of a row block, one per layer chunk, in one call
        (:class:`r3store.codecs.SupportsBatchEncode`): byte for byte ``encode(block[:, chunk b],
        tag=tags[b])`` for each ``b``, back to back, and their sizes.

        Raises
        ------
        r3store.errors.CodecError
            As :meth:`encode`.
        """
        arr = np.asarray(block)
        lpc = layers_per_chunk
        if arr.ndim != 3 or arr.shape[1] != len(tags) * lpc:
            raise CodecError(self.codec_id, f"block of shape {arr.shape} is not {len(tags)} layer chunks of {lpc}")
        native = kernels.native_module()
        ok_tags = all(isinstance(t, int | np.integer) and not isinstance(t, bool) and 0 <= int(t) < 1 << 32
                      and (self.frame_version == 2 or not t) for t in tags)
        if native is not None and ok_tags and arr.dtype.kind in "iu" and arr.dtype.isnative and arr.size:
            n = arr.shape[0] * lpc * arr.shape[2]
            header = HEADER_V2.size if self.frame_version == 2 else HEADER.size
            out = np.empty(len(tags) * (header + (n * self.bits + 7) // 8), dtype=np.uint8)
            sizes = np.empty(len(tags), dtype=np.int64)
            total = native.encode_frames(arr, self.bits, self.frame_version, lpc, np.asarray(tags, dtype=np.int64),
                                         out, sizes)
            if total >= 0:
                return out[:total].data, sizes.tolist()
        # the general path (and the error of an id out of range or a bad tag): frame by frame
        frames = [self.encode(arr[:, b * lpc : (b + 1) * lpc], tag=t) for b, t in enumerate(tags)]
        return b"".join(frames), [len(f) for f in frames]

    def frame_bound(self, ids: int) -> int:
        """The most bytes a frame of ``ids`` ids takes (header and untrimmed payload)."""
        header = HEADER_V2.size if self.frame_version == 2 else HEADER.size
        return header + (ids * self.bits + 7) // 8

    def encode_rows_into(self, span: np.ndarray, chunk_rows: int, layers_per_chunk: int, out: np.ndarray,
                         sizes: np.ndarray, *, prefix_crc: int | None = None, first_row_chunk: int = 0) -> int:
        """The frames of whole row blocks, written into ``out`` in one C call; what
        :meth:`encode_chunks` gives block by block, without a buffer per block.

        Parameters
        ----------
        span : ndarray of integer dtype, shape (m * chunk_rows, layers, top_k)
            ``m`` whole row blocks; ``layers`` a multiple of ``layers_per_chunk``; any
            strides; ids below ``2**bits``.
        chunk_rows, layers_per_chunk : int
            Rows and layers of one frame.
        out : ndarray of uint8, C-contiguous, writable
            Room for ``m * layers / layers_per_chunk`` frames of :meth:`frame_bound` bytes.
        sizes : ndarray of int64, C-contiguous, shape (m * layers / layers_per_chunk,)
            Receives each frame's size, in C order of (row block, layer chunk).
        prefix_crc : int, optional
            Bind the frames (``frame_version=2``): frame ``(a, b)`` carries the position tag
            ``crc32c(prefix + f"{first_row_chunk + a}/{b}")`` given ``prefix_crc =
            crc32c(prefix)`` (:func:`r3store._format.position_tag`'s text). None: unbound.
        first_row_chunk : int
            Row-block index of the span's first block in its array.

        Returns
        -------
        int
            Bytes written, or -1 when the C kernels are not in use or an id lies outside
            ``[0, 2**bits)`` (the caller then encodes block by block, which names it).
        """
        native = kernels.native_module()
        arr = np.asarray(span)
        if native is None or arr.ndim != 3 or arr.dtype.kind not in "iu" or not arr.dtype.isnative or not arr.size \
                or (prefix_crc is not None and self.frame_version != 2):
            return -1
        tags = None if prefix_crc is not None else np.zeros(len(sizes), dtype=np.int64)
        return int(native.encode_frames(arr, self.bits, self.frame_version, layers_per_chunk, tags, out, sizes,
                                        chunk_rows, -1 if prefix_crc is None else prefix_crc, first_row_chunk))

    def decode_frames(self, blob: bytes | memoryview | np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                      out: np.ndarray, rows: np.ndarray, layers: np.ndarray, *, chunk_rows: int,
                      layers_per_chunk: int, tag_prefix: str | None = None, row_chunks: np.ndarray | None = None,
                      layer_chunks: np.ndarray | None = None, row_first: np.ndarray | None = None,
                      row_count: np.ndarray | None = None) -> int:
        """Check and decode a run of frames into their places in ``out``
        (:class:`r3store.codecs.SupportsBatchDecode`): one :func:`r3store.codecs.kernels.decode_frames`
        call (C, GIL released, where the kernels are built), frames of version 1 or 2.
        ``row_first``/``row_count`` (beyond the protocol; the readers use them with this codec):
        only those rows of each frame's chunk are written, to ``out`` rows from ``rows[f]``.

        Returns -1 when every frame decoded, else the index of the first that failed a
        check (:meth:`decode` of that frame names the fault): the frames before it are
        decoded, the later frames' places untouched. A frame whose place is one run of
        ``out`` (``layers_per_chunk`` covering every layer, whole chunks) is decoded while
        its CRC-32C is computed, and a failed CRC or tag leaves its place all missing marker
        (every bit set); other frames are checked before they are written (side by side
        frames of 8 KiB are bound by the copy, not by the CRC-32C), so their place is
        untouched.
        """
        return kernels.decode_frames(blob, starts, lengths, self.bits, out, rows, layers, chunk_rows=chunk_rows,
                                     layers_per_chunk=layers_per_chunk, tag_prefix=tag_prefix,
                                     row_chunks=row_chunks, layer_chunks=layer_chunks, row_first=row_first,
                                     row_count=row_count)

    @staticmethod
    def frame_size(buf: bytes | memoryview | np.ndarray) -> int:
        """Number of ids a frame decodes to (``n_total``), read from its header without checks."""
        data = _head(buf)
        return int(data[8:12].view("<u4")[0])

    @staticmethod
    def frame_tag(buf: bytes | memoryview | np.ndarray) -> int:
        """The position tag of a frame, read from its header without checks (0: version 1 or unbound)."""
        data = _head(buf)
        if int(data[4]) != 2:
            return 0
        if data.size < HEADER_V2.size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {HEADER_V2.size}-byte header "
                                      "of a version-2 frame")
        return int(data[16:20].view("<u4")[0])

    def _check_frame(self, data: np.ndarray) -> tuple[int, int]:
        """Name the first fault of a frame (the kernels only number it)."""
        if data.size < HEADER.size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {HEADER.size}-byte header")
        magic, version, bits, reserved, n_total, n_encoded, _ = HEADER.unpack(data[: HEADER.size].tobytes())
        if magic != MAGIC:
            raise FormatError(_FRAME, f"bad magic {magic!r} (expected {MAGIC!r})")
        if version not in VERSIONS:
            raise FormatError(_FRAME, f"unsupported frame version {version}")
        size = HEADER_SIZES[version]
        if data.size < size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {size}-byte header "
                                      f"of a version-{version} frame")
        crc = int(data[size - 4 : size].view("<u4")[0])
        payload = data[size:]
        computed = google_crc32c.extend(google_crc32c.value(data[: size - 4].tobytes()), np.ascontiguousarray(payload))
        if computed != crc:
            raise ChecksumError(_FRAME, (), f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}")
        if bits != self.bits or n_encoded > n_total:
            raise FormatError(_FRAME, f"header says {bits} bits, {n_encoded}/{n_total} ids; codec has {self.bits} bits")
        if payload.size != (n_encoded * bits + 7) // 8:
            raise FormatError(_FRAME, f"payload is {payload.size} bytes, expected {(n_encoded * bits + 7) // 8}")
        if reserved:
            raise FormatError(_FRAME, f"reserved header bytes are {reserved:#06x}, not 0")
        used = n_encoded * bits % 8
        if used and int(payload[-1]) >> used:
            raise FormatError(_FRAME, f"unused high bits of the last payload byte are set ({int(payload[-1]):#04x})")
        return n_total, n_encoded


def _head(buf: bytes | memoryview | np.ndarray) -> np.ndarray:
    """The first bytes of a frame (up to a version-2 header), or FormatError when fewer than 20."""
    data = np.frombuffer(buf, dtype=np.uint8, count=min(len(buf), HEADER_V2.size)) \
        if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)[: HEADER_V2.size]
    if data.size < HEADER.size:
        raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {HEADER.size}-byte header")
    return data
