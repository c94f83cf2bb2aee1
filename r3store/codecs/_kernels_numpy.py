"""numpy twins of the compiled kernels: the reference, and the fallback where none is built.

Each function here computes exactly what its namesake in the C extension (``csrc/*.c``) computes; the
test suite checks both agree (and agree with the plain-Python references in
:mod:`r3store.codecs._bitpack`). :mod:`r3store.codecs.kernels` chooses between them.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import NamedTuple

import google_crc32c
import numpy as np

__all__ = [
    "FrameCheck",
    "RouteFault",
    "b64decode_numpy",
    "check_frame_numpy",
    "check_ids_numpy",
    "encode_frame_numpy",
    "first_repeat",
    "decode_frames_numpy",
    "gather_rows_numpy",
    "pack_bits_numpy",
    "repeated_ids",
    "route_stats_numpy",
    "route_stats_pieces_numpy",
    "unpack_bits_numpy",
    "unpack_into_numpy",
]


class RouteFault(NamedTuple):
    """The first fault :func:`r3store.codecs.kernels.check_ids` found in a routes array."""

    kind: str
    """``"dense"`` (a dense layer holds a non-zero id), ``"range"`` (an id outside
    ``[0, num_experts)``) or ``"repeat"`` (an id twice in one row of one layer)."""
    row: int
    """Row (token position) of the fault."""
    layer: int
    """Index along the routes' layer axis (not the decoder layer index)."""
    slot: int
    """Top-k slot of the offending id (0 for ``"repeat"``)."""


class FrameCheck(NamedTuple):
    """What :func:`r3store.codecs.kernels.check_frame` found in an ``r3store.bitpack`` frame."""

    status: int
    """0: valid; else the first failed check: 1 shorter than the header, 2 magic, 3 CRC-32C,
    4 unknown version, 5 bits differ or ``n_encoded > n_total``, 6 payload length, 7 reserved
    bytes, 8 unused high bits of the last payload byte."""
    n_total: int
    """Ids the frame decodes to (0 when ``status`` is 1, 2 or 4)."""
    n_encoded: int
    """Ids in the payload (the rest are zeros)."""
    header: int
    """Header size in bytes: 20 (version 1) or 24 (version 2); the payload starts there."""
    tag: int
    """Position tag of a version-2 frame; 0 for version 1 (unbound)."""


FRAME_MAGIC = b"R3BP"
FRAME_HEADERS = {1: 20, 2: 24}
"""Header size of each frame version (``schema/FORMAT.md`` 5.1)."""


def encode_frame_numpy(ids: np.ndarray, bits: int, version: int = 1, tag: int = 0) -> bytes | None:
    """numpy twin of :func:`r3store.codecs.kernels.encode_frame` (None: an id is out of range)."""
    flat = np.asarray(ids).reshape(-1)
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= 1 << bits):
        return None
    nonzero = np.flatnonzero(flat)
    n_encoded = int(nonzero[-1]) + 1 if nonzero.size else 0
    payload = pack_bits_numpy(flat[:n_encoded], bits).tobytes()
    head = struct.pack("<4sBBHII", FRAME_MAGIC, version, bits, 0, flat.size, n_encoded)
    if version == 2:
        head += struct.pack("<I", tag)
    crc = google_crc32c.extend(google_crc32c.value(head), payload)
    return head + struct.pack("<I", crc) + payload


def check_frame_numpy(data: np.ndarray, bits: int) -> FrameCheck:
    """numpy twin of :func:`r3store.codecs.kernels.check_frame`."""
    data = np.asarray(data).view(np.uint8).reshape(-1)
    if data.size < FRAME_HEADERS[1]:
        return FrameCheck(1, 0, 0, 0, 0)
    if data[:4].tobytes() != FRAME_MAGIC:
        return FrameCheck(2, 0, 0, 0, 0)
    version = int(data[4])
    if version not in FRAME_HEADERS:
        return FrameCheck(4, 0, 0, 0, 0)
    hdr = FRAME_HEADERS[version]
    if data.size < hdr:
        return FrameCheck(1, 0, 0, 0, 0)
    head = data[:hdr].tobytes()
    n_total, n_encoded = struct.unpack_from("<II", head, 8)
    tag = struct.unpack_from("<I", head, 16)[0] if version == 2 else 0
    payload = data[hdr:]
    crc = google_crc32c.extend(google_crc32c.value(head[: hdr - 4]), np.ascontiguousarray(payload))
    if crc != struct.unpack_from("<I", head, hdr - 4)[0]:
        return FrameCheck(3, 0, 0, hdr, 0)
    found = FrameCheck(0, n_total, n_encoded, hdr, tag)
    used = n_encoded * bits % 8
    if head[5] != bits or n_encoded > n_total:
        return found._replace(status=5)
    if payload.size != (n_encoded * bits + 7) // 8:
        return found._replace(status=6)
    if head[6:8] != b"\0\0":
        return found._replace(status=7)
    if used and int(payload[-1]) >> used:
        return found._replace(status=8)
    return found


def pack_bits_numpy(ids: np.ndarray, bits: int) -> np.ndarray:
    """numpy twin of :func:`r3store.codecs.kernels.pack_bits` (ids not range-checked)."""
    ids = np.asarray(ids).reshape(-1)
    n = ids.size
    nbytes = (n * bits + 7) // 8
    if bits == 8:
        return ids.astype(np.uint8)
    if bits == 16:
        return ids.astype("<u2").view(np.uint8)
    groups = (n + 7) // 8
    padded = np.zeros(groups * 8, dtype=np.uint64)
    padded[:n] = ids
    x = padded.reshape(groups, 8)
    words = np.zeros((groups, 2), dtype="<u8")
    lo, hi = words[:, 0], words[:, 1]
    for j in range(8):
        shift = j * bits
        col = x[:, j]
        if shift >= 64:
            hi |= col << np.uint64(shift - 64)
            continue
        lo |= col << np.uint64(shift)
        if shift + bits > 64:
            hi |= col >> np.uint64(64 - shift)
    return words.view(np.uint8).reshape(groups, 16)[:, :bits].reshape(-1)[:nbytes]


def unpack_bits_numpy(payload: np.ndarray, n: int, bits: int) -> np.ndarray:
    """numpy twin of :func:`r3store.codecs.kernels.unpack_bits` (int32 output)."""
    payload = np.asarray(payload).view(np.uint8).reshape(-1)
    if bits == 8:
        return payload[:n].astype(np.int32)
    if bits == 16:
        return payload[: 2 * n].view("<u2").astype(np.int32)
    groups = (n + 7) // 8
    raw = np.zeros((groups, 16), dtype=np.uint8)
    flat = payload[: groups * bits]
    full = flat.size // bits
    raw[:full, :bits] = flat[: full * bits].reshape(full, bits)
    if full < groups:
        tail = flat[full * bits :]
        raw[full, : tail.size] = tail
    words = raw.view("<u8")
    lo, hi = words[:, 0], words[:, 1]
    mask = np.uint64((1 << bits) - 1)
    out = np.empty((groups, 8), dtype=np.int32)
    for j in range(8):
        shift = j * bits
        if shift >= 64:
            col = hi >> np.uint64(shift - 64)
        elif shift + bits > 64:
            col = (lo >> np.uint64(shift)) | (hi << np.uint64(64 - shift))
        else:
            col = lo >> np.uint64(shift)
        out[:, j] = col & mask
    return out.reshape(-1)[:n]


def unpack_into_numpy(payload: np.ndarray, n: int, bits: int, out: np.ndarray) -> np.ndarray:
    """numpy twin of :func:`r3store.codecs.kernels.unpack_into`."""
    ids = unpack_bits_numpy(payload, n, bits)
    # reshape(-1) of a non-contiguous out is a copy: write through .flat instead
    flat = out.reshape(-1) if out.flags.c_contiguous else out.flat
    flat[:n] = ids
    flat[n:] = 0
    return out


def repeated_ids(routes: np.ndarray) -> np.ndarray:
    """Which rows hold an expert id more than once (the one "row repeats an id" check).

    Used by the writer's checks (:func:`first_repeat`, the numpy twin of the compiled route
    check) and by the audits (``validate``, ``show``).

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (..., top_k)

    Returns
    -------
    ndarray of bool, shape routes.shape[:-1]

    Examples
    --------
    >>> repeated_ids(np.array([[[1, 2], [3, 3]]])).tolist()
    [[False, True]]
    """
    top_k = routes.shape[-1]
    if top_k < 2:
        return np.zeros(routes.shape[:-1], dtype=bool)
    if top_k <= 16:  # pairwise compares beat a sort along a short axis
        bad = np.zeros(routes.shape[:-1], dtype=bool)
        for i in range(top_k - 1):
            for j in range(i + 1, top_k):
                bad |= routes[..., i] == routes[..., j]
        return bad
    ordered = np.sort(routes, axis=-1)
    repeats: np.ndarray = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)
    return repeats


def first_repeat(routes: np.ndarray) -> tuple[int, int] | None:
    """(row, layer position) of the first row holding an expert id twice, or None.

    Parameters
    ----------
    routes : ndarray of integer dtype, shape (rows, num_layers, top_k)
    """
    if routes.shape[-1] < 2 or routes.size == 0:
        return None
    hits = np.argwhere(repeated_ids(routes))
    return (int(hits[0][0]), int(hits[0][1])) if hits.size else None


def check_ids_numpy(routes: np.ndarray, num_experts: int, *, moe: Sequence[bool] | None = None,
                    out: np.ndarray | None = None) -> RouteFault | None:
    """numpy twin of :func:`r3store.codecs.kernels.check_ids`."""
    layers = routes.shape[1]
    moe_mask = np.ones(layers, dtype=bool) if moe is None else np.asarray(moe, dtype=bool)
    dense_pos = np.flatnonzero(~moe_mask)
    moe_pos = np.flatnonzero(moe_mask)
    if dense_pos.size:
        hits = np.argwhere(routes[:, dense_pos] != 0)
        if hits.size:
            row, pos, slot = (int(v) for v in hits[0])
            return RouteFault("dense", row, int(dense_pos[pos]), slot)
    ids = routes if dense_pos.size == 0 else routes[:, moe_pos]
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= num_experts:
            row, pos, slot = (int(v) for v in np.argwhere((ids < 0) | (ids >= num_experts))[0])
            return RouteFault("range", row, int(moe_pos[pos]), slot)
    repeat = first_repeat(ids)
    if repeat is not None:
        return RouteFault("repeat", repeat[0], int(moe_pos[repeat[1]]), 0)
    if out is not None:
        out[...] = ids
    return None


def gather_rows_numpy(src: np.ndarray, index: np.ndarray, out: np.ndarray, *, fill_value: int = 0,
                      num_experts: int | None = None, pad_start: int = 0) -> int:
    """numpy twin of :func:`r3store.codecs.kernels.gather_rows`."""
    if index.size and (int(index.min()) < -1 or int(index.max()) >= len(src)):
        raise IndexError("index holds a row outside [-1, rows)")
    pad = index < 0
    if len(src):
        out[...] = np.take(src, np.where(pad, 0, index), axis=0)
    num_pad = int(pad.sum())
    if not num_pad:
        return 0
    if num_experts is None:
        out[pad] = np.asarray(fill_value).astype(out.dtype)
        return num_pad
    top_k = src.shape[2]
    ids = (np.arange(pad_start * top_k, (pad_start + num_pad) * top_k, dtype=np.int64) % num_experts)
    out[pad] = ids.astype(out.dtype).reshape(num_pad, 1, top_k)
    return num_pad


def _head_ok(data: np.ndarray, bits: int, n_total: int) -> bool:
    """The checks the compiled decode of one frame makes before it writes: every check of
    :func:`check_frame_numpy` but the CRC-32C, and the id count."""
    if data.size < FRAME_HEADERS[1] or data[:4].tobytes() != FRAME_MAGIC or int(data[4]) not in FRAME_HEADERS:
        return False
    hdr = FRAME_HEADERS[int(data[4])]
    if data.size < hdr:
        return False
    head = data[:hdr].tobytes()
    total, n_encoded = struct.unpack_from("<II", head, 8)
    used = n_encoded * bits % 8
    return (head[5] == bits and n_encoded <= total == n_total and data.size - hdr == (n_encoded * bits + 7) // 8
            and head[6:8] == b"\0\0" and not (used and int(data[-1]) >> used))


def decode_frames_numpy(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray, bits: int, out: np.ndarray,
                        rows: np.ndarray, layers: np.ndarray, chunk_rows: int, layers_per_chunk: int,
                        prefix_crc: int, row_chunks: np.ndarray, layer_chunks: np.ndarray, check_tags: bool,
                        row_first: np.ndarray | None = None, row_count: np.ndarray | None = None) -> int:
    """numpy twin of :func:`r3store.codecs.kernels.decode_frames`."""
    n_total = chunk_rows * layers_per_chunk * out.shape[2]
    stage = np.empty(n_total, dtype=np.uint32)
    for f in range(len(starts)):
        s, n, r, la = int(starts[f]), int(lengths[f]), int(rows[f]), int(layers[f])
        r0 = 0 if row_first is None else int(row_first[f])
        nr = chunk_rows if row_count is None else int(row_count[f])
        if s < 0 or n < 0 or s + n > blob.size or r0 < 0 or nr < 0 or r0 + nr > chunk_rows or r < 0 or \
                r + nr > out.shape[0] or la < 0 or la + layers_per_chunk > out.shape[1]:
            return f
        frame = blob[s : s + n]
        check = check_frame_numpy(frame, bits)
        bad = bool(check.status) or check.n_total != n_total
        if not bad and check_tags:
            text = f"{int(row_chunks[f])}/{int(layer_chunks[f])}".encode()
            bad = google_crc32c.extend(prefix_crc, text) != check.tag
        if bad:
            if layers_per_chunk == out.shape[1] and r0 == 0 and nr == chunk_rows and _head_ok(frame, bits, n_total):
                # the compiled kernel decodes a chunk that is one run of out while it computes the
                # CRC-32C: a failed CRC or tag leaves it the missing marker (all bits set)
                out[r : r + nr] = np.array(-1).astype(out.dtype)
            return f
        unpack_into_numpy(frame[check.header :], check.n_encoded, bits, stage)
        out[r : r + nr, la : la + layers_per_chunk] = stage.reshape(chunk_rows, layers_per_chunk, -1)[r0 : r0 + nr]
    return -1


def route_stats_numpy(routes: np.ndarray, hist: np.ndarray | None,
                      mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """numpy twin of :func:`r3store.codecs.kernels.route_stats`."""
    wide = routes.astype(np.int64)
    top = wide.max(axis=-1) if routes.shape[-1] else np.zeros(routes.shape[:-1], np.int64)
    repeated = repeated_ids(wide)
    if hist is not None:
        nbins = hist.shape[1]
        keep = (wide >= 0) & (wide < nbins)
        if mask is not None:
            keep &= mask.astype(bool)[..., None]
        cells = (np.arange(routes.shape[1], dtype=np.int64)[None, :, None] * nbins + wide)[keep]
        hist += np.bincount(cells, minlength=hist.size).reshape(hist.shape)
    return top, repeated


def route_stats_pieces_numpy(routes: np.ndarray, cuts: np.ndarray, hist: np.ndarray | None,
                             mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy twin of :func:`r3store.codecs.kernels.route_stats_pieces`."""
    cell_top, cell_repeated = route_stats_numpy(routes, hist, mask)
    n, layers = len(cuts) - 1, routes.shape[1]
    top = np.full((n, layers), -1, np.int64)
    repeated = np.zeros((n, layers), np.bool_)
    nonzero = np.zeros((n, layers), np.int64)
    for p in range(n):
        a, b = int(cuts[p]), int(cuts[p + 1])
        if b > a:
            top[p] = cell_top[a:b].max(axis=0)
            repeated[p] = cell_repeated[a:b].any(axis=0)
            nonzero[p] = np.count_nonzero(cell_top[a:b], axis=0)
    return top, repeated, nonzero


def b64decode_numpy(text: str | bytes | bytearray | memoryview) -> np.ndarray:
    """numpy twin of :func:`r3store.codecs.kernels.b64decode` (``base64.b64decode(validate=True)``)."""
    return np.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=np.uint8)
