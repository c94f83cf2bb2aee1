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

/* decode_frames' frame table, and what the checks of one frame found */
typedef struct {
    const uint8_t *blob;
    Py_ssize_t blob_len;
    const int64_t *st, *ln, *rw, *ly, *rc, *lc, *rf, *rn;
    Py_ssize_t chunk_rows, N, L, K, lpc;
    int bits;
    Py_ssize_t n_total;
    int check_tags;
    uint32_t prefix_crc;
} batch_t;

typedef struct {
    const uint8_t *payload;
    Py_ssize_t plen;
    uint32_t ne;
} frame_t;

/* most frames unpacked together (the layer chunks of one row chunk), and the rows of each
   unpacked before the next frame's: out is then written a block of whole rows at a time */
#define GROUP_MAX 64
#define ROW_BLOCK 16

/* Frame f of a decode_frames table: inside blob and out, a valid frame of n_total ids (the
   checks of frame_status), bound to its place when tags are checked. 0, or -1 if not. */
static int check_batch_frame(const batch_t *t, Py_ssize_t f, frame_t *fr) {
    const Py_ssize_t r0 = t->rf ? (Py_ssize_t)t->rf[f] : 0, nr = t->rn ? (Py_ssize_t)t->rn[f] : t->chunk_rows;
    if (t->st[f] < 0 || t->ln[f] < 0 || t->st[f] > t->blob_len - t->ln[f] || r0 < 0 || nr < 0
        || r0 > t->chunk_rows - nr || t->rw[f] < 0 || t->rw[f] > t->N - nr || t->ly[f] < 0
        || t->ly[f] > t->L - t->lpc) {
        return -1;
    }
    const uint8_t *d = t->blob + t->st[f];
    uint32_t nt = 0, ne = 0, tag = 0, want = 0;
    int hdr = 0;
    if (frame_status(d, (Py_ssize_t)t->ln[f], t->bits, &nt, &ne, &hdr, &tag) || (Py_ssize_t)nt != t->n_total) {
        return -1;
    }
    if (t->check_tags && (position_tag(t->prefix_crc, (long long)t->rc[f], (long long)t->lc[f], &want) < 0
                          || want != tag)) {
        return -1;
    }
    fr->payload = d + hdr;
    fr->plen = (Py_ssize_t)t->ln[f] - hdr;
    fr->ne = ne;
    return 0;
}

/* frames f and g write the same output rows (the same chunk rows, to the same out rows) */
static int same_rows(const batch_t *t, Py_ssize_t f, Py_ssize_t g) {
    return t->rw[f] == t->rw[g] && (!t->rf || (t->rf[f] == t->rf[g] && t->rn[f] == t->rn[g]));
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
"outside blob or out (frames before it are decoded; the caller names the fault).");


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
        char *base = (char *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        batch_t bt = {(const uint8_t *)blob.buf, blob.len, st, ln, rw, ly, rc, lc, rf, rn, chunk_rows, N, L, K, lpc,
                      bits, n_total, check_tags, (uint32_t)prefix_crc};
        const int rows4 = osize == 4 && width % 8 == 0; /* rows byte-aligned in the payload, 4-byte output */
        frame_t cur, next;
        int have_next = 0;
        f = 0;
        while (f < n) {
            if (have_next) {
                cur = next;
                have_next = 0;
            } else if (check_batch_frame(&bt, f, &cur) < 0) {
                failed = f;
                break;
            }
            if (!rows4 || (Py_ssize_t)cur.ne != n_total) {
                const Py_ssize_t r0 = rf ? (Py_ssize_t)rf[f] : 0, nr = rn ? (Py_ssize_t)rn[f] : chunk_rows;
                unpack_contig(cur.payload, cur.plen, (Py_ssize_t)cur.ne, bits, (char *)stage, 4);
                memset(stage + cur.ne, 0, (size_t)(n_total - (Py_ssize_t)cur.ne) * 4);
                for (Py_ssize_t r = 0; r < nr; r++) {
                    conv((const char *)(stage + (r0 + r) * width), 4, base + (((rw[f] + r) * L + ly[f]) * K) * osize,
                         width);
                }
                f++;
                continue;
            }
            /* a group: this frame and the next ones that continue its output rows to the right
               (the layer chunks of one row chunk), every one checked before any is written, then
               unpacked a block of rows at a time across the group, so that out fills row after row */
            const uint8_t *pl[GROUP_MAX];
            Py_ssize_t g = 1;
            pl[0] = cur.payload;
            while (f + g < n && g < GROUP_MAX && same_rows(&bt, f, f + g) && ly[f + g] == ly[f + g - 1] + lpc) {
                if (check_batch_frame(&bt, f + g, &next) < 0) {
                    failed = f + g;
                    break;
                }
                if ((Py_ssize_t)next.ne != n_total) {
                    have_next = 1; /* checked already: decoded alone next */
                    break;
                }
                pl[g++] = next.payload;
            }
            const Py_ssize_t r0 = rf ? (Py_ssize_t)rf[f] : 0, nr = rn ? (Py_ssize_t)rn[f] : chunk_rows;
            const Py_ssize_t row_bytes = width / 8 * bits, plen = n_total / 8 * bits - r0 * row_bytes;
            uint32_t *o0 = (uint32_t *)(base + ((rw[f] * L + ly[f]) * K) * osize);
            for (Py_ssize_t b0 = 0; b0 < nr; b0 += ROW_BLOCK) {
                const Py_ssize_t nb = nr - b0 < ROW_BLOCK ? nr - b0 : ROW_BLOCK;
                for (Py_ssize_t i = 0; i < g; i++) {
                    const uint8_t *p = pl[i] + (r0 + b0) * row_bytes; /* chunk row r0 + b0 onwards */
                    uint32_t *o = o0 + b0 * L * K + i * width;
                    Py_ssize_t r = unpack_rows4(p, plen - b0 * row_bytes, nb, width / 8, bits, o, L * K);
                    for (; r < nb; r++) {
                        unpack_contig(p + r * row_bytes, plen - (b0 + r) * row_bytes, width, bits,
                                      (char *)(o + r * L * K), 4);
                    }
                }
            }
            if (failed >= 0) {
                break;
            }
            f += g;
        }
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
