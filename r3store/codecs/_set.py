"""``r3store.set``: each row of ``top_k`` expert ids coded as a set, near ``log2 C(E, k)`` bits.

The order of a token's top-k ids matters neither to replay (the routing weights are
gathered again from the live router scores and the expert outputs summed) nor to any
audit (flip rates compare sets), so a row of ``k`` distinct ids of ``E`` experts needs
only ``log2 C(E, k)`` bits, not ``k * ceil(log2 E)``: 6.07 bits per id instead of 8 for
DeepSeek-V3 (E = 256, k = 8). How rows become digits and digits bits is told in
:mod:`r3store.codecs._set_numpy` (the reference implementation).

Frame layout (all integers little-endian; byte offsets), frame version 1::

    0   4  magic      b"R3ST"
    4   1  version    1
    5   1  top_k      k, 1..16
    6   2  experts    E, k..1024
    8   4  n_total    ids in the chunk
    12  4  n_rows     rows coded; full rows n_rows .. n_total // k - 1 are all zero
    16  4  n_except   exception rows among them (stored verbatim)
    20  1  block_rows digits per block (m), fixed by (E, k)
    21  1  block_bits bits of a full block, bit_length(R**m - 1)
    22  2  reserved   0
    24  4  tag        position tag (as r3store.bitpack version 2); 0 = unbound
    28  4  crc32c     CRC-32C of bytes [0, 28) followed by the payload
    32  .  payload    digit blocks | exception rows | verbatim ids

The payload holds, each part starting on a byte boundary: the ``n_rows - n_except``
digits, in blocks of ``m`` (the last block may be shorter: ``bit_length(R**j - 1)``
bits for ``j`` digits), one little-endian bit stream (as ``r3store.bitpack``'s);
``n_except`` uint32 row indices, strictly increasing; then ``n_except * k + n_total % k``
ids (the exception rows, then the ids after the last full row) bit-packed at
``max(1, ceil(log2 E))`` bits as in ``r3store.bitpack``. Unused bits are 0.
"""

from __future__ import annotations

from typing import ClassVar

import google_crc32c
import numpy as np
import numpy.typing as npt

from r3store._checks import parse_int
from r3store.codecs import kernels
from r3store.codecs._abc import Codec
from r3store.codecs._set_numpy import (
    MAX_EXPERTS,
    MAX_TOP_K,
    SET_HEADER,
    SET_MAGIC,
    SetCheck,
    SetParams,
    check_set_frame_numpy,
    decode_set_frame_numpy,
    encode_set_frame_numpy,
    set_params,
)
from r3store.errors import ChecksumError, CodecError, FormatError

__all__ = ["MAX_DECODE_IDS", "SetCodec"]

MAX_DECODE_IDS = 1 << 26
"""Most ids :meth:`SetCodec.decode` allocates on its own (as :data:`r3store.codecs.BitpackCodec`)."""
_FRAME = "r3store.set frame"
_PAYLOAD_FAULTS = {
    8: "a digit block is out of range, or the digit stream's padding bits are set",
    9: "exception row indices are not strictly increasing below n_rows",
    10: "unused high bits of the last verbatim-id byte are set",
}


def _codec_error(name: str, value: object, fault: str) -> CodecError:
    return CodecError(SetCodec.codec_id, f"{name} {fault}, got {value!r}")


class SetCodec(Codec):
    """Code each row of ``top_k`` expert ids as a set of ``num_experts``, with a CRC-32C per frame.

    A frame holds ids in C order; consecutive runs of ``top_k`` ids are rows. A row of
    ``top_k`` distinct ids below ``num_experts`` decodes **ascending** (the set, in
    canonical order); an all-zero row decodes as zeros; any other row (an id repeated,
    or in ``[num_experts, 2**bits)``) and the ids after the last full row decode exactly
    as given. Rows cost ``log2(C(E, k) + 1)`` bits rounded up per block of rows (within
    1.5%), about 24-28% below bit-packing for 64 to 384 experts at top-8.

    Parameters
    ----------
    num_experts : int
        Experts ``E``, 1 to 1024.
    top_k : int
        Ids per row ``k``, 1 to ``min(16, num_experts)``.

    Raises
    ------
    r3store.errors.CodecError
        A parameter is out of range.

    Notes
    -----
    The byte layout is given in this module's docstring and in ``schema/FORMAT.md``
    (section 5.2). Ids accepted: ``[0, 2**bits)``, ``bits = max(1, ceil(log2 E))``, as
    :class:`r3store.codecs.BitpackCodec` of that width accepts. Frames can be bound to
    their position (:class:`r3store.codecs.SupportsBinding`), tell their size
    (:class:`r3store.codecs.SupportsFrameSize`), and a run of them decodes into a caller's
    buffer in one call (:class:`r3store.codecs.SupportsBatchDecode`, :meth:`decode_frames`:
    readers use it). Encoding and decoding run the C kernel
    when it is built, else the numpy reference (:mod:`r3store.codecs._set_numpy`); both
    give the same bytes.

    Examples
    --------
    >>> codec = SetCodec(num_experts=64, top_k=4)
    >>> buf = codec.encode(np.array([[9, 3, 63, 0], [5, 6, 7, 8]]))
    >>> codec.decode(buf).reshape(2, 4).tolist()
    [[0, 3, 9, 63], [5, 6, 7, 8]]
    >>> len(buf) - 32  # payload bytes: two rows of log2(C(64, 4) + 1) = 19.3 bits, one block
    5
    """

    codec_id: ClassVar[str] = "r3store.set"
    MAX_EXPERTS: ClassVar[int] = MAX_EXPERTS
    """Most experts a set codec takes (1024)."""
    MAX_TOP_K: ClassVar[int] = MAX_TOP_K
    """Most ids per row (16)."""

    def __init__(self, num_experts: int, top_k: int) -> None:
        self.num_experts = parse_int("num_experts", num_experts, minimum=1, maximum=MAX_EXPERTS, error=_codec_error)
        self.top_k = parse_int("top_k", top_k, minimum=1, maximum=min(MAX_TOP_K, self.num_experts),
                               error=_codec_error)
        self.params: SetParams = set_params(self.num_experts, self.top_k)

    @property
    def bits(self) -> int:
        """Bits per verbatim id: ``max(1, ceil(log2(num_experts)))``; ids must lie below ``2**bits``."""
        return self.params.bits

    def get_config(self) -> dict[str, object]:
        return {"id": self.codec_id, "num_experts": self.num_experts, "top_k": self.top_k}

    def encode(self, ids: npt.ArrayLike, *, tag: int = 0) -> bytes:
        """Encode ``ids`` as one frame (see :meth:`Codec.encode`).

        Parameters
        ----------
        ids : array_like of integer dtype, any shape
            Read in C order, ``top_k`` ids to a row.
        tag : int
            Position tag, ``[0, 2**32)``; 0 leaves the frame unbound.

        Raises
        ------
        r3store.errors.CodecError
            An id lies outside ``[0, 2**bits)``, ``ids`` is not integer or holds ``2**32``
            ids or more, or ``tag`` is out of range.
        """
        native = kernels.native_module()
        if native is not None and type(ids) is np.ndarray and ids.dtype.kind in "iu" and ids.dtype.isnative \
                and type(tag) is int and 0 <= tag < 1 << 32 and ids.size < 1 << 32:
            fast: bytes | None = native.set_encode(ids, self.num_experts, self.top_k, self.params.block_rows, tag)
            if fast is not None:  # the hot path (writers); None: an id out of range, named below
                return fast
        arr = np.asarray(ids)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise CodecError(self.codec_id, f"ids must be integers, got dtype {arr.dtype}")
        if isinstance(tag, bool) or not isinstance(tag, int | np.integer) or not 0 <= int(tag) < 1 << 32:
            raise CodecError(self.codec_id, f"tag must be an int in [0, 2**32), got {tag!r}")
        if arr.size >= 1 << 32:
            raise CodecError(self.codec_id, f"a frame holds fewer than 2**32 ids, got {arr.size}")
        frame: bytes | None
        if native is not None and hasattr(native, "set_encode") and arr.dtype.kind in "iu" and arr.dtype.isnative:
            frame = native.set_encode(arr, self.num_experts, self.top_k, self.params.block_rows, int(tag))
        else:
            frame = encode_set_frame_numpy(arr, self.params, int(tag))
        if frame is None:
            flat = arr.reshape(-1)
            raise CodecError(self.codec_id, f"ids must lie in [0, {1 << self.bits}) for {self.num_experts} experts, "
                                            f"got range [{int(flat.min())}, {int(flat.max())}]")
        return frame

    def decode(self, buf: bytes | memoryview | np.ndarray, out: np.ndarray | None = None, *,
               tag: int | None = None) -> np.ndarray:
        """Decode one frame (see :meth:`Codec.decode`): set rows ascending, other rows as stored.

        Parameters
        ----------
        buf : bytes-like
        out : ndarray of integer dtype, optional
            Destination of exactly the frame's ``n_total`` ids (checked before anything
            is written), filled in C order. Without it at most :data:`MAX_DECODE_IDS` ids
            are allocated.
        tag : int, optional
            The position tag the frame must carry; None: not checked.

        Returns
        -------
        ndarray of int32, shape (n_total,), or ``out``

        Raises
        ------
        r3store.errors.ChecksumError
            The CRC-32C does not match, or the frame is bound to another position.
        r3store.errors.FormatError
            Not a valid frame of this codec; ``out`` has the wrong size or is not a
            writable integer array; or, without ``out``, the frame declares more than
            :data:`MAX_DECODE_IDS` ids.
        """
        native = kernels.native_module()
        if native is not None and type(out) is np.ndarray and out.dtype.kind in "iu" and out.flags.writeable \
                and out.dtype.isnative and (tag is None or (type(tag) is int and 0 <= tag < 1 << 32)) \
                and type(buf) is bytes:
            # the hot path (readers, the loader): one kernel call checks everything (CRC-32C,
            # header, sizes, tag, payload) and decodes; a frame failing it is checked again
            # below, which names the fault
            p = self.params
            if not native.set_decode(buf, p.num_experts, p.top_k, p.block_rows, out, -1 if tag is None else tag):
                return out
        data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) \
            else buf.view(np.uint8).reshape(-1)
        if out is not None and (not isinstance(out, np.ndarray) or out.dtype.kind not in "iu"
                                or not out.flags.writeable):
            raise FormatError(_FRAME, f"out must be a writable integer array, got {getattr(out, 'dtype', out)!r}")
        native = native if native is not None and hasattr(native, "set_decode_frames") else None
        p = self.params
        if native is not None and (out is None or out.dtype.isnative) and \
                (tag is None or (isinstance(tag, int | np.integer) and 0 <= tag < 1 << 32)):
            # one call checks everything (CRC, sizes, tag, payload) and decodes; a frame that
            # fails is checked again below, which names its fault
            n = int(data[8:12].view("<u4")[0]) if data.size >= SET_HEADER.size else 0
            if out is not None or n <= MAX_DECODE_IDS:
                dest = out if out is not None else np.empty(n, dtype=np.int32)
                if not native.set_decode(data, p.num_experts, p.top_k, p.block_rows, dest,
                                         -1 if tag is None else int(tag)):
                    return dest
        if native is not None:
            check = SetCheck(*native.set_check(data, p.num_experts, p.top_k, p.block_rows))
        else:
            check = check_set_frame_numpy(data, p)
        if check.status:
            self._name_fault(data)
            raise FormatError(_FRAME, f"invalid frame (check {check.status})")
        if tag is not None and check.tag != tag:
            bound = f"tag {check.tag:#010x}" if check.tag else "no tag (an unbound frame)"
            raise ChecksumError(_FRAME, (), f"frame carries {bound}, not the {tag:#010x} of its position")
        if out is None:
            if check.n_total > MAX_DECODE_IDS:
                raise FormatError(_FRAME, f"header declares {check.n_total:,} ids, more than the "
                                          f"{MAX_DECODE_IDS:,} decode allocates without out")
            out = np.empty(check.n_total, dtype=np.int32)
        elif out.size != check.n_total:
            raise FormatError(_FRAME, f"out holds {out.size} ids, the frame {check.n_total}")
        if native is not None and out.dtype.isnative:
            status = native.set_decode(data, p.num_experts, p.top_k, p.block_rows, out)
        else:
            status = decode_set_frame_numpy(data, p, check, out)
        if status:
            raise FormatError(_FRAME, _PAYLOAD_FAULTS.get(status, f"invalid payload (check {status})"))
        return out

    def decode_frames(self, blob: bytes | memoryview | np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                      out: np.ndarray, rows: np.ndarray, layers: np.ndarray, *, chunk_rows: int,
                      layers_per_chunk: int, tag_prefix: str | None = None, row_chunks: np.ndarray | None = None,
                      layer_chunks: np.ndarray | None = None, row_first: np.ndarray | None = None,
                      row_count: np.ndarray | None = None) -> int:
        """Check and decode a run of frames into their places in ``out``
        (:class:`r3store.codecs.SupportsBatchDecode`; the arguments are told there).

        ``row_first``, ``row_count`` (int64, shape ``(n,)``, given together, as
        :func:`r3store.codecs.kernels.decode_frames` takes them): only rows
        ``[row_first[f], row_first[f] + row_count[f])`` of frame ``f``'s chunk are written,
        to ``out[rows[f] : rows[f] + row_count[f], ...]`` (a CP rank's pieces, decoded in
        place); the whole frame is still checked, and the kernels skip the digits of the
        rows before the range by whole blocks instead of unranking them.

        One C call (GIL released) where the kernels are built and ``out`` is in native byte
        order, else frame by frame with :meth:`decode`; each frame gets every check
        :meth:`decode` makes (CRC-32C, header, sizes, payload, and with ``tag_prefix`` its
        position tag). Set rows land ascending, as :meth:`decode` returns them.

        Returns
        -------
        int
            -1 when every frame decoded, else the index of the first frame that failed a
            check or lies outside ``blob`` or ``out`` (the frames before it are decoded, the
            others untouched): :meth:`decode` of that frame names the fault.

        Raises
        ------
        r3store.errors.CodecError
            Arguments of the wrong type, dtype or shape, or a chunk of other than 1 to
            ``2**26`` ids.
        """
        data = np.frombuffer(blob, dtype=np.uint8) if not isinstance(blob, np.ndarray) \
            else blob.view(np.uint8).reshape(-1)
        cols = [np.ascontiguousarray(a, dtype=np.int64) for a in (starts, lengths, rows, layers)]
        n = cols[0].size
        if (row_first is None) != (row_count is None):
            raise CodecError(self.codec_id, "decode_frames needs row_first and row_count together, or neither")
        ranges = None if row_first is None or row_count is None else \
            [np.ascontiguousarray(a, dtype=np.int64) for a in (row_first, row_count)]
        if ranges is not None and not all(a.size == n for a in ranges):
            raise CodecError(self.codec_id, "decode_frames needs row_first and row_count of one length with starts")
        check = tag_prefix is not None
        rc = np.ascontiguousarray(row_chunks if row_chunks is not None else np.zeros(n), dtype=np.int64)
        lc = np.ascontiguousarray(layer_chunks if layer_chunks is not None else np.zeros(n), dtype=np.int64)
        if not (isinstance(out, np.ndarray) and out.ndim == 3 and out.dtype.kind in "iu" and out.dtype.itemsize <= 4
                and out.flags.c_contiguous and out.flags.writeable and all(a.size == n for a in (*cols, rc, lc))
                and (not check or (row_chunks is not None and layer_chunks is not None))):
            raise CodecError(self.codec_id, "decode_frames needs a writable C-contiguous 3-D out of 1-, 2- or 4-byte "
                                            "integers and int64 arrays of one length")
        ints = all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in (chunk_rows, layers_per_chunk))
        if not ints or not 1 <= int(layers_per_chunk) <= out.shape[1] or not \
                1 <= int(chunk_rows) * int(layers_per_chunk) * out.shape[2] <= kernels.MAX_CHUNK_IDS:
            raise CodecError(self.codec_id, f"decode_frames needs int chunk_rows and layers_per_chunk (at most the "
                                            f"out's layers) whose chunk holds 1 to 2**26 ids, got chunk_rows="
                                            f"{chunk_rows!r}, layers_per_chunk={layers_per_chunk!r}")
        cr, lpc = int(chunk_rows), int(layers_per_chunk)
        native = kernels.native_module()
        p = self.params
        if native is not None and hasattr(native, "set_decode_frames") and out.dtype.isnative:
            prefix_crc = int(google_crc32c.value(f"{tag_prefix}/".encode())) if check else 0
            return int(native.set_decode_frames(data, cols[0], cols[1], p.num_experts, p.top_k, p.block_rows, out,
                                                cols[2], cols[3], cr, lpc, prefix_crc, rc, lc, check, *(ranges or ())))
        return self._decode_frames_each(data, cols, out, cr, lpc, tag_prefix, rc, lc, ranges)

    def _decode_frames_each(self, data: np.ndarray, cols: list[np.ndarray], out: np.ndarray, cr: int, lpc: int,
                            tag_prefix: str | None, rc: np.ndarray, lc: np.ndarray,
                            ranges: list[np.ndarray] | None = None) -> int:
        """:meth:`decode_frames` one :meth:`decode` at a time (no kernels, or a byte-swapped ``out``)."""
        n_rows, n_layers, k = out.shape
        stage = np.empty(cr * lpc * k, dtype=np.int32)
        for f, (start, size, row, layer) in enumerate(zip(*(c.tolist() for c in cols), strict=True)):
            r0, nr = (0, cr) if ranges is None else (int(ranges[0][f]), int(ranges[1][f]))
            if start < 0 or size < 0 or start + size > data.size or r0 < 0 or nr < 0 or r0 > cr - nr \
                    or not 0 <= row <= n_rows - nr or not 0 <= layer <= n_layers - lpc:
                return f
            tag = None if tag_prefix is None else \
                int(google_crc32c.value(f"{tag_prefix}/{int(rc[f])}/{int(lc[f])}".encode()))  # the position tag
            try:
                self.decode(data[start : start + size], out=stage, tag=tag)
            except FormatError:
                return f
            out[row : row + nr, layer : layer + lpc] = stage.reshape(cr, lpc, k)[r0 : r0 + nr]
        return -1

    @staticmethod
    def frame_size(buf: bytes | memoryview | np.ndarray) -> int:
        """Number of ids a frame decodes to (``n_total``), read from its header without checks."""
        return int(_head(buf)[8:12].view("<u4")[0])

    @staticmethod
    def frame_tag(buf: bytes | memoryview | np.ndarray) -> int:
        """The position tag of a frame, read from its header without checks (0: unbound)."""
        return int(_head(buf)[24:28].view("<u4")[0])

    def bits_per_row(self) -> float:
        """Bits a full block spends per set row (``block_bits / block_rows``)."""
        return self.params.block_bits / self.params.block_rows

    def _name_fault(self, data: np.ndarray) -> None:
        """Raise the error naming the first fault of a frame's header (the kernels only number it)."""
        size = SET_HEADER.size
        if data.size < size:
            raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {size}-byte header")
        magic, version, top_k, experts, n_total, n_rows, n_except, m, w, reserved, _, crc = \
            SET_HEADER.unpack(data[:size].tobytes())
        if magic != SET_MAGIC:
            raise FormatError(_FRAME, f"bad magic {magic!r} (expected {SET_MAGIC!r})")
        computed = google_crc32c.extend(google_crc32c.value(data[: size - 4].tobytes()),
                                        np.ascontiguousarray(data[size:]))
        if computed != crc:
            raise ChecksumError(_FRAME, (), f"CRC-32C mismatch: stored {crc:#010x}, computed {computed:#010x}")
        p = self.params
        if version != 1:
            raise FormatError(_FRAME, f"unsupported frame version {version}")
        if (top_k, experts) != (p.top_k, p.num_experts):
            raise FormatError(_FRAME, f"frame of top_k={top_k}, num_experts={experts}; codec has "
                                      f"top_k={p.top_k}, num_experts={p.num_experts}")
        if (m, w) != (p.block_rows, p.block_bits):
            raise FormatError(_FRAME, f"blocks of {m} rows in {w} bits; the codec's are {p.block_rows} rows "
                                      f"in {p.block_bits} bits")
        if n_rows > n_total // p.top_k or n_except > n_rows:
            raise FormatError(_FRAME, f"header counts disagree: {n_total} ids, {n_rows} rows coded, "
                                      f"{n_except} exceptions")
        check = check_set_frame_numpy(data, p)
        if check.status == 6:
            raise FormatError(_FRAME, f"payload is {data.size - size} bytes, not the size its header implies")
        if reserved:
            raise FormatError(_FRAME, f"reserved header bytes are {reserved:#06x}, not 0")


def _head(buf: bytes | memoryview | np.ndarray) -> np.ndarray:
    """The 32 header bytes of a frame, or FormatError when shorter."""
    data = np.frombuffer(buf, dtype=np.uint8, count=min(len(buf), SET_HEADER.size)) \
        if not isinstance(buf, np.ndarray) else buf.view(np.uint8).reshape(-1)[: SET_HEADER.size]
    if data.size < SET_HEADER.size:
        raise FormatError(_FRAME, f"{data.size} bytes is shorter than the {SET_HEADER.size}-byte header")
    return data
