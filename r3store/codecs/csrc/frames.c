/*
 * frames.c: r3store.bitpack frames (schema/FORMAT.md 5.1), header and CRC-32C:
 * encode_frame(), check_frame(), decode_frames().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * r3store.bitpack frames
 * --------------------------------------------------------------------------------- */

#define FRAME_HEADER 20    /* version 1: magic, version, bits, reserved, n_total, n_encoded, crc32c */
#define FRAME_HEADER_V2 24 /* version 2: ... n_encoded, tag, crc32c */

/* decode_frames' groups of frames side by side: at most this many, of at most this many
   payload bytes (they stay in a core's L2 cache between their check and their copy) */
#define GROUP_FRAMES 64
#define GROUP_BYTES (256 * 1024)

static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static int frame_header_size(int version) { return version == 2 ? FRAME_HEADER_V2 : FRAME_HEADER; }

/*
 * 0 if valid; else the first failed check (the Python code then names the fault):
 * 1 shorter than the header, 2 magic, 3 CRC-32C, 4 unknown version, 5 bits or n_encoded >
 * n_total, 6 payload length, 7 reserved bytes, 8 unused high bits. Version 2 frames carry a
 * position tag (returned; 0 for version 1) and their CRC at offset 20, over bytes [0, 20)
 * and the payload.
 */
static int frame_status(const uint8_t *d, Py_ssize_t len, int bits, uint32_t *n_total, uint32_t *n_enc,
                        int *header, uint32_t *tag) {
    if (len < FRAME_HEADER) return 1;
    if (memcmp(d, "R3BP", 4) != 0) return 2;
    if (d[4] != 1 && d[4] != 2) return 4;
    const int hdr = frame_header_size(d[4]);
    if (len < hdr) return 1;
    *header = hdr;
    const uint8_t *payload = d + hdr;
    const Py_ssize_t plen = len - hdr;
    uint32_t crc = crc32c_extend(crc32c_extend(0, d, (size_t)hdr - 4), payload, (size_t)plen);
    if (crc != get_u32(d + hdr - 4)) return 3;
    *n_total = get_u32(d + 8);
    *n_enc = get_u32(d + 12);
    *tag = hdr == FRAME_HEADER_V2 ? get_u32(d + 16) : 0;
    if (d[5] != bits || *n_enc > *n_total) return 5;
    if (plen != packed_nbytes(*n_enc, bits)) return 6;
    if (d[6] || d[7]) return 7;
    const unsigned used = (unsigned)(((uint64_t)*n_enc * (uint64_t)bits) % 8u);
    if (used && (payload[plen - 1] >> used)) return 8;
    return 0;
}


/*
 * The checks of frame_status that need no CRC (status 1, 2, 4, 5, 6, 7, 8), made before a
 * fused decode writes anything: the header, the payload length it implies, the padding bits
 * of the last payload byte. The CRC (status 3) is then computed while the payload is decoded.
 */
static int frame_head(const uint8_t *d, Py_ssize_t len, int bits, uint32_t *n_total, uint32_t *n_enc, int *header,
                      uint32_t *tag) {
    if (len < FRAME_HEADER) return 1;
    if (memcmp(d, "R3BP", 4) != 0) return 2;
    if (d[4] != 1 && d[4] != 2) return 4;
    const int hdr = frame_header_size(d[4]);
    if (len < hdr) return 1;
    *header = hdr;
    const Py_ssize_t plen = len - hdr;
    *n_total = get_u32(d + 8);
    *n_enc = get_u32(d + 12);
    *tag = hdr == FRAME_HEADER_V2 ? get_u32(d + 16) : 0;
    if (d[5] != bits || *n_enc > *n_total) return 5;
    if (plen != packed_nbytes(*n_enc, bits)) return 6;
    if (d[6] || d[7]) return 7;
    const unsigned used = (unsigned)(((uint64_t)*n_enc * (uint64_t)bits) % 8u);
    if (used && (d[len - 1] >> used)) return 8;
    return 0;
}

/*
 * How a decode meets its frame's CRC-32C (set_fused): FUSED_OFF, the whole payload's CRC
 * first, then the unpack (the kernels before fusion); FUSED_BLOCKS, blocks of FUSED_BLOCK_IDS
 * ids, each's CRC then its unpack while the block is in the L1 cache (any width, any CRC
 * path); FUSED_AVX512, 8- and 16-bit ids copied or widened by the very 512-bit loads the
 * CRC folding reads (crc32c_widen; other widths and truncating outputs by blocks from
 * FUSED_BLOCKS_MIN payload bytes into outputs not streamed, the others as FUSED_OFF).
 */
enum { FUSED_OFF, FUSED_BLOCKS, FUSED_AVX512, FUSED_COUNT };
static const char *const fused_names[FUSED_COUNT] = {"off", "blocks", "avx512"};
static int fused_mode = -1; /* -1: the best this CPU has, decided at the first use */
#define FUSED_BLOCK_IDS 8192 /* a multiple of 8: whole bytes; bits KiB of payload */
/* in the 'avx512' mode, bit-packed payloads shorter than this, and those of streamed
   outputs, are checked whole, then unpacked (short ones stay in the L2 cache between the
   two; measured on the EPYC, one thread: blocks cost up to 1.1x there; on 7-9 MiB payloads
   they take 0.65-0.8x the time into 1- and 2-byte words, 1.0-1.05x into streamed int32) */
#define FUSED_BLOCKS_MIN (256 * 1024)

static int fused_best(void) { return crc_avx512_cpu() ? FUSED_AVX512 : FUSED_BLOCKS; }

/*
 * Decode the payload p (plen bytes: packed_nbytes(n, bits)) into n osize-byte words at out
 * (contiguous; values truncated like a cast) and return the CRC-32C of the payload extending
 * crc, each payload byte read from memory once (but with set_fused("off")). stream:
 * non-temporal stores.
 */
static uint32_t decode_payload(uint32_t crc, const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out,
                               int osize, int stream) {
    if (fused_mode < 0) {
        fused_mode = fused_best();
    }
    if (fused_mode == FUSED_AVX512 && (bits == 8 || bits == 16) && osize >= bits / 8 && crc_widen_supported()) {
        return crc32c_widen(crc, p, (size_t)n, bits / 8, out, osize, stream);
    }
    if (fused_mode == FUSED_OFF || (fused_mode == FUSED_AVX512 && (plen < FUSED_BLOCKS_MIN || stream))) {
        crc = crc32c_extend(crc, p, (size_t)plen);
        unpack_contig_as(p, plen, n, bits, out, osize, stream);
        return crc;
    }
    Py_ssize_t done = 0;
    while (done < n) {
        const Py_ssize_t m = n - done < FUSED_BLOCK_IDS ? n - done : FUSED_BLOCK_IDS;
        const Py_ssize_t at = done / 8 * bits, len = done + m == n ? plen - at : m / 8 * bits;
        crc = crc32c_extend(crc, p + at, (size_t)len);
        unpack_contig_as(p + at, plen - at, m, bits, out + done * osize, osize, stream);
        done += m;
    }
    return crc;
}

/*
 * Check and decode one frame into out (n_total osize-byte words, contiguous), or fill it with
 * the missing marker. 0: decoded; else the failed check: frame_status's numbers (nothing
 * written for all but 3), 9 the tag is not want_tag (want_tag >= 0), 10 out does not hold
 * n_total words (nothing written). After 3 or 9 every word of out has all bits set.
 * stream: non-temporal stores.
 */
static int decode_one(const uint8_t *d, Py_ssize_t len, int bits, char *out, Py_ssize_t out_words, int osize,
                      long long want_tag, int stream, uint32_t *n_total, uint32_t *n_enc) {
    int hdr = 0;
    uint32_t tag = 0;
    int status = frame_head(d, len, bits, n_total, n_enc, &hdr, &tag);
    if (status) return status;
    if ((Py_ssize_t)*n_total != out_words) return 10;
    const Py_ssize_t ne = (Py_ssize_t)*n_enc, nbytes = out_words * osize;
    uint32_t crc = decode_payload(crc32c_extend(0, d, (size_t)hdr - 4), d + hdr, len - hdr, ne, bits, out, osize,
                                  stream);
    if (crc != get_u32(d + hdr - 4)) {
        status = 3;
    } else if (want_tag >= 0 && (uint32_t)want_tag != tag) {
        status = 9;
    }
    if (status) {
        memset(out, 0xFF, (size_t)nbytes); /* no unchecked id stays */
        return status;
    }
    memset(out + ne * osize, 0, (size_t)((out_words - ne) * osize));
    return 0;
}

R3_DOC(decode_frame_doc, "decode_frame(buf, bits, out, tag=-1) -> status\n\n"
"Check and decode one r3store.bitpack frame (version 1 or 2) into out, a writable array\n"
"holding exactly the frame's n_total ids (ids past n_encoded are 0; values truncated like\n"
"a cast). The payload is decoded while its CRC-32C is computed (set_fused). status -1:\n"
"out is not a C-contiguous array of 1-, 2- or 4-byte native integers (nothing done);\n"
"0: decoded; 1-8: check_frame's numbers, 9: the\n"
"position tag is not tag (tag >= 0), 10: out does not hold n_total ids. The header and size\n"
"checks (1, 2, 4-8, 10) come first: out is then untouched. After 3 (CRC-32C) or 9 every\n"
"element of out has all bits set (-1 signed, the maximum unsigned: the missing marker), so\n"
"out never holds unchecked ids. The caller names the fault (check_frame).");

PyObject *py_decode_frame(PyObject *self, PyObject *args) {
    PyObject *obj, *out_obj;
    int bits, status;
    long long want = -1;
    Py_buffer b, out;
    uint32_t n_total = 0, n_enc = 0;
    if (!PyArg_ParseTuple(args, "OiO|L", &obj, &bits, &out_obj, &want) || check_bits(bits) < 0) {
        return NULL;
    }
    if (want < -1 || want > 0xFFFFFFFFll) {
        PyErr_Format(PyExc_ValueError, "decode_frame: tag must be a u32 or -1, got %lld", want);
        return NULL;
    }
    if (get_bytes_buffer(obj, &b) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_RECORDS) < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    const int otype = buffer_type(&out);
    if (otype < 0 || type_size[otype] > 4 || !is_c_contiguous(&out)) {
        PyBuffer_Release(&b);
        PyBuffer_Release(&out);
        return PyLong_FromLong(-1); /* not an out this decode writes: the caller decodes otherwise */
    }
    const int osize = type_size[otype];
    Py_BEGIN_ALLOW_THREADS
    status = decode_one((const uint8_t *)b.buf, b.len, bits, (char *)out.buf, out.len / osize, osize, want,
                        out.len >= stream_from(), &n_total, &n_enc);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    return PyLong_FromLong(status);
}

R3_DOC(set_fused_doc, "set_fused(mode) -> str\n\n"
"How decodes meet their CRC-32C: 'avx512' (8- and 16-bit ids copied or widened by the\n"
"loads the 512-bit CRC folding reads; other widths as 'blocks' from 256 KiB of payload\n"
"into outputs not streamed, else as 'off'), 'blocks' (the CRC of each\n"
"block of 8,192 ids, then its unpack while it is in the L1 cache), 'off' (the whole\n"
"payload's CRC, then the unpack: each byte read twice) or 'best' (the first this CPU runs).\n"
"Returns the previous mode. ValueError for 'avx512' without VPCLMULQDQ and AVX-512 BW.\n"
"For tests and benchmarks: every mode computes the same output and the same failures.");

PyObject *py_set_fused(PyObject *self, PyObject *args) {
    const char *name;
    int mode;
    if (!PyArg_ParseTuple(args, "s", &name)) {
        return NULL;
    }
    if (fused_mode < 0) {
        fused_mode = fused_best();
    }
    const int prev = fused_mode;
    if (strcmp(name, "best") == 0) {
        mode = fused_best();
    } else {
        for (mode = 0; mode < FUSED_COUNT && strcmp(name, fused_names[mode]) != 0; mode++) {
        }
        if (mode == FUSED_COUNT) {
            PyErr_Format(PyExc_ValueError, "set_fused: mode must be 'avx512', 'blocks', 'off' or 'best', got '%s'",
                         name);
            return NULL;
        }
        if (mode == FUSED_AVX512 && !crc_avx512_cpu()) {
            PyErr_SetString(PyExc_ValueError, "this CPU cannot run the 'avx512' fused decode");
            return NULL;
        }
    }
    fused_mode = mode;
    return PyUnicode_FromString(fused_names[prev]);
}

R3_DOC(encode_frame_doc, "encode_frame(src, bits, version=1, tag=0) -> bytes | None\n\n"
"One r3store.bitpack frame of the ids of src (any shape and strides, C order): header,\n"
"CRC-32C, payload with the trailing zero ids trimmed. version 2 frames carry tag (the\n"
"position tag, 32 bits) in their 24-byte header. None when an id lies outside\n"
"[0, 2**bits) (the caller reports which).");

PyObject *py_encode_frame(PyObject *self, PyObject *args) {
    PyObject *src_obj;
    int bits, version = 1;
    unsigned long tag = 0;
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "Oi|ik", &src_obj, &bits, &version, &tag) || check_bits(bits) < 0) {
        return NULL;
    }
    if ((version != 1 && version != 2) || tag > 0xFFFFFFFFul || (version == 1 && tag != 0)) {
        PyErr_Format(PyExc_ValueError, "encode_frame: version must be 1 or 2 and tag a u32 (0 for version 1), "
                     "got version %d, tag %lu", version, tag);
        return NULL;
    }
    if (get_int_buffer(src_obj, &src, 0, "ids") < 0) {
        return NULL;
    }
    cursor_t c;
    cursor_init(&c, &src);
    if ((uint64_t)c.total > 0xFFFFFFFFu) {
        PyBuffer_Release(&src);
        PyErr_SetString(PyExc_OverflowError, "a frame holds fewer than 2**32 ids");
        return NULL;
    }
    const int hdr = frame_header_size(version);
    const Py_ssize_t n = c.total, full = packed_nbytes(n, bits);
    PyObject *frame = PyBytes_FromStringAndSize(NULL, hdr + full);
    if (!frame) {
        PyBuffer_Release(&src);
        return NULL;
    }
    uint8_t *d = (uint8_t *)PyBytes_AsString(frame);
    uint64_t acc;
    Py_ssize_t used;
    int type = buffer_type(&src);
    Py_BEGIN_ALLOW_THREADS
    acc = pack_buffer(&src, type, bits, d + hdr, &used);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (!fits(acc, bits)) {
        Py_DECREF(frame);
        Py_RETURN_NONE;
    }
    const Py_ssize_t plen = packed_nbytes(used, bits);
    if (plen < full) { /* trailing zero ids are trimmed: a shorter copy */
        PyObject *trimmed = PyBytes_FromStringAndSize((const char *)d, hdr + plen);
        Py_DECREF(frame);
        if (!trimmed) return NULL;
        frame = trimmed;
        d = (uint8_t *)PyBytes_AsString(frame);
    }
    memcpy(d, "R3BP", 4);
    d[4] = (uint8_t)version;
    d[5] = (uint8_t)bits;
    d[6] = d[7] = 0;
    put_u32(d + 8, (uint32_t)n);
    put_u32(d + 12, (uint32_t)used);
    if (version == 2) put_u32(d + 16, (uint32_t)tag);
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32c_extend(crc32c_extend(0, d, (size_t)hdr - 4), d + hdr, (size_t)plen);
    Py_END_ALLOW_THREADS
    put_u32(d + hdr - 4, crc);
    return frame;
}

R3_DOC(encode_frames_doc, "encode_frames(src, bits, version, layers_per_chunk, tags, out, lengths) -> int\n\n"
"The frames of one row block of a route array in one call: src (rows, layers, top_k), any\n"
"integer type and strides, layers a multiple of layers_per_chunk; frame b holds layers\n"
"[b * layers_per_chunk, (b + 1) * layers_per_chunk) and is what encode_frame(src[:, those\n"
"layers], bits, version, tags[b]) returns. tags: C-contiguous int64, one per frame (0 for\n"
"version 1). The frames are written back to back into the writable bytes out (room for\n"
"each frame untrimmed) and their sizes into lengths (C-contiguous int64, one per frame).\n"
"Returns the bytes written, or -1 when an id lies outside [0, 2**bits) (the caller\n"
"encodes frame by frame to report which).\n\n"
"Optional chunk_rows > 0: src holds rows / chunk_rows whole row blocks (rows a multiple of\n"
"chunk_rows), encoded in C order of (row block, layer chunk); tags then hold one per frame\n"
"in that order. Optional prefix_crc >= 0 (a u32, the CRC-32C of '<prefix>/'): the tags are\n"
"computed here instead, frame (a, b) tagged crc32c('<prefix>/<first_row_chunk + a>/<b>')\n"
"(the position tag, FORMAT.md 5.1), and tags is ignored (may be None).");

PyObject *py_encode_frames(PyObject *self, PyObject *args) {
    PyObject *src_obj, *tags_obj, *out_obj, *len_obj;
    int bits, version;
    Py_ssize_t lpc, chunk_rows = 0, first_row_chunk = 0;
    long long prefix_crc = -1;
    Py_buffer src, tags, out, lens;
    if (!PyArg_ParseTuple(args, "OiinOOO|nLn", &src_obj, &bits, &version, &lpc, &tags_obj, &out_obj, &len_obj,
                          &chunk_rows, &prefix_crc, &first_row_chunk)
        || check_bits(bits) < 0) {
        return NULL;
    }
    const int own_tags = prefix_crc >= 0;
    if (prefix_crc > 0xFFFFFFFFll || chunk_rows < 0 || first_row_chunk < 0 || (own_tags && version != 2)) {
        PyErr_SetString(PyExc_ValueError, "encode_frames: chunk_rows and first_row_chunk must be >= 0, prefix_crc "
                                          "a u32 (or -1) and only for version 2");
        return NULL;
    }
    if (own_tags) {
        tags_obj = Py_None;
    }
    if (version != 1 && version != 2) {
        PyErr_Format(PyExc_ValueError, "encode_frames: version must be 1 or 2, got %d", version);
        return NULL;
    }
    if (get_int_buffer(src_obj, &src, 0, "src") < 0) {
        return NULL;
    }
    if (own_tags) {
        memset(&tags, 0, sizeof tags); /* no buffer: nothing to release */
    } else if (get_i64_array(tags_obj, &tags, "tags") < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&tags);
        return NULL;
    }
    if (PyObject_GetBuffer(len_obj, &lens, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&tags);
        PyBuffer_Release(&out);
        return NULL;
    }
    const int hdr = frame_header_size(version);
    const char *fault = NULL;
    Py_ssize_t n = 0, f, total = 0, cr = 0, ncol = 0, nf = 0;
    const int64_t *tg = (const int64_t *)tags.buf;
    if (src.ndim == 3 && lpc >= 1) {
        cr = chunk_rows ? chunk_rows : src.shape[0];
        ncol = src.shape[1] / lpc;
        nf = cr ? (src.shape[0] / cr) * ncol : 0;
    }
    if (src.ndim != 3 || lpc < 1 || src.shape[1] % lpc || cr < 1 || src.shape[0] % cr
        || (!own_tags && tags.len / 8 != nf) || buffer_type(&lens) != T_I64 || lens.len != nf * 8) {
        fault = "encode_frames: src must be (rows, layers, top_k) with rows a multiple of chunk_rows and layers "
                "of layers_per_chunk, tags (unless prefix_crc) and lengths int64 arrays of one per frame";
    } else {
        n = cr * lpc * src.shape[2];
        if ((uint64_t)n > 0xFFFFFFFFu || out.len < nf * (hdr + packed_nbytes(n, bits))) {
            fault = "encode_frames: out has no room for every frame (or a frame of 2**32 ids or more)";
        }
        for (f = 0; !fault && !own_tags && f < nf; f++) {
            if (tg[f] < 0 || tg[f] > 0xFFFFFFFFll || (version == 1 && tg[f])) {
                fault = "encode_frames: tags must be u32 (0 for version 1)";
            }
        }
    }
    if (fault) {
        PyErr_SetString(PyExc_ValueError, fault);
        PyBuffer_Release(&src);
        PyBuffer_Release(&tags);
        PyBuffer_Release(&out);
        PyBuffer_Release(&lens);
        return NULL;
    }
    const int type = buffer_type(&src);
    int64_t *ln = (int64_t *)lens.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (f = 0; f < nf && !bad; f++) {
        Py_ssize_t shape[3] = {cr, lpc, src.shape[2]}, used;
        Py_buffer view = src;
        const Py_ssize_t a = f / ncol, b = f % ncol;
        uint32_t tag = 0;
        if (own_tags) { /* position tag: crc32c('<prefix>/<row chunk>/<layer chunk>'); two int64s always fit */
            (void)position_tag((uint32_t)prefix_crc, (long long)(first_row_chunk + a), (long long)b, &tag);
        } else {
            tag = (uint32_t)tg[f];
        }
        view.buf = (char *)src.buf + a * cr * src.strides[0] + b * lpc * src.strides[1];
        view.shape = shape;
        view.len = n * src.itemsize;
        uint8_t *d = (uint8_t *)out.buf + total;
        const uint64_t acc = pack_buffer(&view, type, bits, d + hdr, &used);
        if (!fits(acc, bits)) {
            bad = 1;
            break;
        }
        const Py_ssize_t plen = packed_nbytes(used, bits); /* trailing zero ids trimmed */
        memcpy(d, "R3BP", 4);
        d[4] = (uint8_t)version;
        d[5] = (uint8_t)bits;
        d[6] = d[7] = 0;
        put_u32(d + 8, (uint32_t)n);
        put_u32(d + 12, (uint32_t)used);
        if (version == 2) put_u32(d + 16, tag);
        put_u32(d + hdr - 4, crc32c_extend(crc32c_extend(0, d, (size_t)hdr - 4), d + hdr, (size_t)plen));
        ln[f] = hdr + plen;
        total += hdr + plen;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    if (!own_tags) PyBuffer_Release(&tags);
    PyBuffer_Release(&out);
    PyBuffer_Release(&lens);
    return PyLong_FromSsize_t(bad ? -1 : total);
}

R3_DOC(check_frame_doc, "check_frame(buf, bits) -> (status, n_total, n_encoded, header, tag)\n\n"
"Verify an r3store.bitpack frame of version 1 or 2 (magic, version, CRC-32C, bits, sizes,\n"
"reserved and padding bits). status 0: valid; otherwise the number of the first failed\n"
"check. header: the header size (20 or 24; the payload starts there); tag: the position\n"
"tag of a version-2 frame (0 for version 1).");

PyObject *py_check_frame(PyObject *self, PyObject *args) {
    PyObject *obj;
    int bits, status, header = 0;
    Py_buffer b;
    uint32_t n_total = 0, n_enc = 0, tag = 0;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &bits) || check_bits(bits) < 0 || get_bytes_buffer(obj, &b) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = frame_status((const uint8_t *)b.buf, b.len, bits, &n_total, &n_enc, &header, &tag);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return Py_BuildValue("(ikkik)", status, (unsigned long)n_total, (unsigned long)n_enc, header,
                         (unsigned long)tag);
}

R3_DOC(decode_frames_doc, "decode_frames(blob, starts, lengths, bits, out, rows, layers, chunk_rows,\n"
"layers_per_chunk, prefix_crc, row_chunks, layer_chunks, check_tags, row_first=None,\n"
"row_count=None) -> int\n\n"
"Check and decode many r3store.bitpack frames of one storage object straight into their\n"
"places in out, a C-contiguous integer array (n, L, K) of 1-, 2- or 4-byte words. Frame f\n"
"is blob[starts[f] : starts[f] + lengths[f]]; it must hold chunk_rows * layers_per_chunk * K\n"
"ids and lands in out[rows[f] : rows[f] + chunk_rows, layers[f] : layers[f] + layers_per_chunk]\n"
"(ids past its n_encoded are 0). With check_tags its position tag must be the CRC-32C of\n"
"the text '<prefix>/<row_chunks[f]>/<layer_chunks[f]>', given prefix_crc = crc32c(prefix +\n"
"'/'). row_first, row_count (None, or int64 arrays like starts): only the chunk's rows\n"
"[row_first[f], row_first[f] + row_count[f]) are written, to out rows [rows[f], rows[f] +\n"
"row_count[f]) (default: every row); the whole frame is still checked.\n"
"starts ... layer_chunks: C-contiguous int64 arrays of one length. Returns -1 when\n"
"every frame decoded, else the index of the first frame that failed a check or lies\n"
"outside blob or out (frames before it are decoded, the later ones untouched; the\n"
"caller names the fault). A frame whose place is one run of out (layers_per_chunk\n"
"covering every layer, whole chunks) is decoded while its CRC-32C is computed: when\n"
"its CRC or tag fails, its place is all bits set (the missing marker); any other\n"
"failed frame's place is untouched (checked before it is written).");


PyObject *py_decode_frames(PyObject *self, PyObject *args) {
    PyObject *blob_obj, *out_obj, *arr_obj[8] = {NULL, NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
    const char *names[8] = {"starts", "lengths", "rows", "layers", "row_chunks", "layer_chunks", "row_first",
                            "row_count"};
    int bits, check_tags, i, ok = 1;
    Py_ssize_t chunk_rows, lpc, f, failed = -1;
    unsigned long prefix_crc;
    Py_buffer blob, out, arr[8];
    if (!PyArg_ParseTuple(args, "OOOiOOOnnkOOp|OO", &blob_obj, &arr_obj[0], &arr_obj[1], &bits, &out_obj, &arr_obj[2],
                          &arr_obj[3], &chunk_rows, &lpc, &prefix_crc, &arr_obj[4], &arr_obj[5], &check_tags,
                          &arr_obj[6], &arr_obj[7])
        || check_bits(bits) < 0) {
        return NULL;
    }
    /* the row ranges come together or not at all */
    const int narr = arr_obj[6] != Py_None || arr_obj[7] != Py_None ? 8 : 6;
    if (narr == 8 && (arr_obj[6] == Py_None || arr_obj[7] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "decode_frames: give both row_first and row_count, or neither");
        return NULL;
    }
    if (get_bytes_buffer(blob_obj, &blob) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&blob);
        return NULL;
    }
    if (get_i64_arrays(arr_obj, arr, names, narr) < 0) {
        PyBuffer_Release(&blob);
        PyBuffer_Release(&out);
        return NULL;
    }
    const int otype = buffer_type(&out);
    const Py_ssize_t n_total = batch_chunk_ids("decode_frames", &out, otype, chunk_rows, lpc);
    ok = n_total > 0;
    const Py_ssize_t N = ok ? out.shape[0] : 0, L = ok ? out.shape[1] : 0, K = ok ? out.shape[2] : 0;
    const Py_ssize_t width = lpc * K, n = arr[0].len / 8;
    uint32_t *stage = NULL;
    if (ok && !(stage = (uint32_t *)malloc((size_t)n_total * 4))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const int64_t *st = (const int64_t *)arr[0].buf, *ln = (const int64_t *)arr[1].buf;
        const int64_t *rw = (const int64_t *)arr[2].buf, *ly = (const int64_t *)arr[3].buf;
        const int64_t *rc = (const int64_t *)arr[4].buf, *lc = (const int64_t *)arr[5].buf;
        const int64_t *rf = narr == 8 ? (const int64_t *)arr[6].buf : NULL;
        const int64_t *rn = narr == 8 ? (const int64_t *)arr[7].buf : NULL;
        const int osize = type_size[otype];
        const conv_fn conv = conv_table[T_U32][otype];
        const int stream = out.len >= stream_from();
        char *base = (char *)out.buf;
        /* a group: checked frames not yet written whose chunks sit side by side in out (the
           same out rows, consecutive layer chunks) and whose rows are byte-aligned, written
           together row by row (unpack_rows) while their payloads are still in cache */
        const uint8_t *gp[GROUP_FRAMES];
        Py_ssize_t gl[GROUP_FRAMES], g_bytes = 0, g_rows = 0, g_row = -1, g_layer = -1;
        int gn = 0;
        char *g_out = NULL;
#define FLUSH_GROUP()                                                                           \
    if (gn) {                                                                                   \
        unpack_rows(gp, gl, gn, g_rows, width / 8, bits, g_out, L * K * osize, osize, out.len); \
        gn = 0;                                                                                 \
        g_bytes = 0;                                                                            \
    }
        Py_BEGIN_ALLOW_THREADS
        for (f = 0; f < n; f++) {
            uint32_t nt = 0, ne = 0, tag = 0;
            int hdr = 0;
            const Py_ssize_t r0 = rf ? (Py_ssize_t)rf[f] : 0, nr = rn ? (Py_ssize_t)rn[f] : chunk_rows;
            if (st[f] < 0 || ln[f] < 0 || st[f] > blob.len - ln[f] || r0 < 0 || nr < 0 || r0 > chunk_rows - nr
                || rw[f] < 0 || rw[f] > N - nr || ly[f] < 0 || ly[f] > L - lpc) {
                failed = f;
                break;
            }
            const uint8_t *d = (const uint8_t *)blob.buf + st[f];
            uint32_t want = 0;
            if (width == L * K && r0 == 0 && nr == chunk_rows) {
                /* the chunk's place is one run of out (a layer chunk of every layer): decoded
                   while its CRC-32C is computed (decode_one: all missing marker on a failed
                   CRC or tag) */
                FLUSH_GROUP()
                if (check_tags) {
                    (void)position_tag((uint32_t)prefix_crc, (long long)rc[f], (long long)lc[f], &want);
                }
                if (decode_one(d, (Py_ssize_t)ln[f], bits, base + rw[f] * L * K * osize, n_total, osize,
                               check_tags ? (long long)want : -1, stream, &nt, &ne)) {
                    failed = f;
                    break;
                }
                continue;
            }
            if (frame_status(d, (Py_ssize_t)ln[f], bits, &nt, &ne, &hdr, &tag) || (Py_ssize_t)nt != n_total) {
                failed = f;
                break;
            }
            if (check_tags && (position_tag((uint32_t)prefix_crc, (long long)rc[f], (long long)lc[f], &want) < 0
                               || want != tag)) {
                failed = f;
                break;
            }
            if (width % 8 == 0 && (Py_ssize_t)ne == n_total) {
                /* every row of the chunk is byte-aligned in the payload: unpacked straight into out */
                const Py_ssize_t row_bytes = width / 8 * bits, plen = (Py_ssize_t)ln[f] - hdr - r0 * row_bytes;
                if (gn && (gn == GROUP_FRAMES || rw[f] != g_row || nr != g_rows || ly[f] != g_layer
                           || g_bytes + plen > GROUP_BYTES)) {
                    FLUSH_GROUP()
                }
                if (!gn) {
                    g_out = base + ((rw[f] * L + ly[f]) * K) * osize;
                    g_row = rw[f];
                    g_rows = nr;
                }
                gp[gn] = d + hdr + r0 * row_bytes; /* chunk row r0 onwards */
                gl[gn++] = plen;
                g_bytes += plen;
                g_layer = ly[f] + lpc;
                continue;
            }
            FLUSH_GROUP()
            unpack_contig(d + hdr, (Py_ssize_t)ln[f] - hdr, (Py_ssize_t)ne, bits, (char *)stage, 4);
            memset(stage + ne, 0, (size_t)(n_total - (Py_ssize_t)ne) * 4);
            for (Py_ssize_t r = 0; r < nr; r++) {
                conv((const char *)(stage + (r0 + r) * width), 4, base + (((rw[f] + r) * L + ly[f]) * K) * osize, width);
            }
        }
        FLUSH_GROUP() /* the frames before a failed one are decoded */
#undef FLUSH_GROUP
        Py_END_ALLOW_THREADS
        free(stage);
    }
    for (i = 0; i < narr; i++) {
        PyBuffer_Release(&arr[i]);
    }
    PyBuffer_Release(&blob);
    PyBuffer_Release(&out);
    if (!ok) {
        return NULL;
    }
    return PyLong_FromSsize_t(failed);
}
