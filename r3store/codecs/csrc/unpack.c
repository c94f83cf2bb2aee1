/*
 * unpack.c: bit unpacking into 1-, 2- or 4-byte words: unpack().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * bit unpacking into uint8 / uint16 / uint32 words
 * --------------------------------------------------------------------------------- */

typedef void (*unpack_fn)(const uint8_t *p, Py_ssize_t groups, void *out);

/* groups: each reads 16 bytes at p (the caller guarantees they exist) */
#define DEF_UNPACK(B, ON, OT)                                                         \
    static void unpack_w##B##_##ON(const uint8_t *p, Py_ssize_t groups, void *vout) { \
        const uint64_t mask = (1u << B) - 1u;                                         \
        OT *out = (OT *)vout;                                                         \
        Py_ssize_t g;                                                                 \
        int j;                                                                        \
        for (g = 0; g < groups; g++, p += B, out += 8) {                              \
            uint64_t lo, hi;                                                          \
            memcpy(&lo, p, 8);                                                        \
            memcpy(&hi, p + 8, 8);                                                    \
            for (j = 0; j < 8; j++) {                                                 \
                const int s = j * B;                                                  \
                uint64_t x;                                                           \
                if (s >= 64) {                                                        \
                    x = hi >> (s >= 64 ? s - 64 : 0);                                 \
                } else if (s + B > 64) {                                              \
                    x = (lo >> s) | (hi << (s + B > 64 ? 64 - s : 0));                \
                } else {                                                              \
                    x = lo >> s;                                                      \
                }                                                                     \
                out[j] = (OT)(x & mask);                                              \
            }                                                                         \
        }                                                                             \
    }

#define DEF_UNPACK_ALL(B) DEF_UNPACK(B, 1, uint8_t) DEF_UNPACK(B, 2, uint16_t) DEF_UNPACK(B, 4, uint32_t)
DEF_UNPACK_ALL(1) DEF_UNPACK_ALL(2) DEF_UNPACK_ALL(3) DEF_UNPACK_ALL(4)
DEF_UNPACK_ALL(5) DEF_UNPACK_ALL(6) DEF_UNPACK_ALL(7) DEF_UNPACK_ALL(8)
DEF_UNPACK_ALL(9) DEF_UNPACK_ALL(10) DEF_UNPACK_ALL(11) DEF_UNPACK_ALL(12)
DEF_UNPACK_ALL(13) DEF_UNPACK_ALL(14) DEF_UNPACK_ALL(15) DEF_UNPACK_ALL(16)

#define UNPACK_ROW(B) {unpack_w##B##_1, unpack_w##B##_2, unpack_w##B##_4}
static const unpack_fn unpack_table[17][3] = {
    {NULL, NULL, NULL}, UNPACK_ROW(1), UNPACK_ROW(2), UNPACK_ROW(3), UNPACK_ROW(4),
    UNPACK_ROW(5), UNPACK_ROW(6), UNPACK_ROW(7), UNPACK_ROW(8), UNPACK_ROW(9),
    UNPACK_ROW(10), UNPACK_ROW(11), UNPACK_ROW(12), UNPACK_ROW(13), UNPACK_ROW(14),
    UNPACK_ROW(15), UNPACK_ROW(16),
};

static int size_slot(int size) { return size == 1 ? 0 : size == 2 ? 1 : 2; }

#ifdef R3_X86
/*
 * 8 ids per 16-byte window: each 32-bit lane gathers the 4 bytes holding its id
 * (vpshufb on the window broadcast to both halves), shifts it down (vpsrlvd) and masks.
 * Returns the groups done; the caller finishes the rest. Each group reads 16 bytes.
 */
R3_TARGET_AVX2 static Py_ssize_t unpack_avx2(const uint8_t *p, Py_ssize_t groups, int bits, void *vout, int osize) {
    int8_t shuf[32];
    int32_t shifts[8];
    int i, k;
    for (i = 0; i < 8; i++) {
        const int first = (i * bits) >> 3;
        shifts[i] = (i * bits) & 7;
        for (k = 0; k < 4; k++) {
            const int b = first + k;
            shuf[(i / 4) * 16 + (i % 4) * 4 + k] = (int8_t)(b < 16 ? b : 0x80);
        }
    }
    const __m256i vshuf = _mm256_loadu_si256((const __m256i *)shuf);
    const __m256i vshift = _mm256_loadu_si256((const __m256i *)shifts);
    /* bytes keep the low 8 bits of a wider id (a cast), not the saturated value packus would give */
    const __m256i mask = _mm256_set1_epi32(((1 << bits) - 1) & (osize == 1 ? 0xFF : 0xFFFF));
    const __m256i order8 = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    Py_ssize_t g = 0;
#define R3_GROUP(q) \
    _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(q))), vshuf), vshift), mask)
    if (osize == 4) {
        uint32_t *out = (uint32_t *)vout;
        for (; g + 2 <= groups; g += 2, p += 2 * bits, out += 16) {
            _mm256_storeu_si256((__m256i *)out, R3_GROUP(p));
            _mm256_storeu_si256((__m256i *)(out + 8), R3_GROUP(p + bits));
        }
        for (; g < groups; g++, p += bits, out += 8) {
            _mm256_storeu_si256((__m256i *)out, R3_GROUP(p));
        }
    } else if (osize == 2) {
        uint16_t *out = (uint16_t *)vout;
        for (; g + 2 <= groups; g += 2, p += 2 * bits, out += 16) {
            __m256i ab = _mm256_packus_epi32(R3_GROUP(p), R3_GROUP(p + bits));
            _mm256_storeu_si256((__m256i *)out, _mm256_permute4x64_epi64(ab, 0xD8));
        }
    } else {
        uint8_t *out = (uint8_t *)vout;
        for (; g + 4 <= groups; g += 4, p += 4 * bits, out += 32) {
            __m256i ab = _mm256_packus_epi32(R3_GROUP(p), R3_GROUP(p + bits));
            __m256i cd = _mm256_packus_epi32(R3_GROUP(p + 2 * bits), R3_GROUP(p + 3 * bits));
            __m256i abcd = _mm256_packus_epi16(ab, cd);
            _mm256_storeu_si256((__m256i *)out, _mm256_permutevar8x32_epi32(abcd, order8));
        }
    }
#undef R3_GROUP
    return g;
}
#endif

#ifdef R3_X86
/* unpack_rows4 with AVX2: the shuffle set up once, then gpr groups per row. */
R3_TARGET_AVX2 static Py_ssize_t unpack_rows4_avx2(const uint8_t *p, Py_ssize_t plen, Py_ssize_t rows, Py_ssize_t gpr,
                                                   int bits, uint32_t *out, Py_ssize_t stride) {
    int8_t shuf[32];
    int32_t shifts[8];
    int i, k;
    for (i = 0; i < 8; i++) {
        const int first = (i * bits) >> 3;
        shifts[i] = (i * bits) & 7;
        for (k = 0; k < 4; k++) {
            const int b = first + k;
            shuf[(i / 4) * 16 + (i % 4) * 4 + k] = (int8_t)(b < 16 ? b : 0x80);
        }
    }
    const __m256i vshuf = _mm256_loadu_si256((const __m256i *)shuf);
    const __m256i vshift = _mm256_loadu_si256((const __m256i *)shifts);
    const __m256i mask = _mm256_set1_epi32((1 << bits) - 1);
    const Py_ssize_t row_bytes = gpr * bits;
    Py_ssize_t r, g;
    for (r = 0; r < rows; r++) {
        const uint8_t *q = p + r * row_bytes;
        if ((r + 1) * row_bytes - bits + 16 > plen) { /* the row's last 16-byte read would leave the payload */
            break;
        }
        uint32_t *o = out + r * stride;
        for (g = 0; g < gpr; g++, q += bits, o += 8) {
            const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
            _mm256_storeu_si256((__m256i *)o, _mm256_and_si256(_mm256_srlv_epi32(_mm256_shuffle_epi8(x, vshuf), vshift),
                                                               mask));
        }
    }
    return r;
}
#endif

/*
 * Unpack `rows` rows of gpr * 8 ids each (byte-aligned: each row is gpr * bits bytes) from p
 * (plen bytes) into 4-byte words, row r at out + r * stride. Returns the rows done: all of
 * them, or fewer near the payload's end or without AVX2 (the caller unpacks the rest with
 * unpack_contig, row by row).
 */
Py_ssize_t unpack_rows4(const uint8_t *p, Py_ssize_t plen, Py_ssize_t rows, Py_ssize_t gpr, int bits, uint32_t *out,
                        Py_ssize_t stride) {
#ifdef R3_X86
    if (use_avx2) {
        return unpack_rows4_avx2(p, plen, rows, gpr, bits, out, stride);
    }
#endif
    (void)p; (void)plen; (void)rows; (void)gpr; (void)bits; (void)out; (void)stride;
    return 0;
}

/* Byte-aligned widths (8, 16 bits): the ids are whole bytes or words, so decoding is a
   straight copy or a widen (one pass at memory speed, vectorised by the compiler). */
#define R3_WIDEN_BODY                                                                      \
    Py_ssize_t i;                                                                          \
    if (bytes == 1 && osize == 1) {                                                        \
        memcpy(out, p, (size_t)n);                                                         \
    } else if (bytes == 1 && osize == 2) {                                                 \
        uint16_t *restrict o = (uint16_t *)out;                                            \
        for (i = 0; i < n; i++) o[i] = p[i];                                               \
    } else if (bytes == 1) {                                                               \
        uint32_t *restrict o = (uint32_t *)out;                                            \
        for (i = 0; i < n; i++) o[i] = p[i];                                               \
    } else if (osize == 2) {                                                               \
        memcpy(out, p, (size_t)n * 2);                                                     \
    } else if (osize == 4) {                                                               \
        const uint16_t *restrict q = (const uint16_t *)(const void *)p;                   \
        uint32_t *restrict o = (uint32_t *)out;                                            \
        for (i = 0; i < n; i++) { uint16_t v; memcpy(&v, q + i, 2); o[i] = v; }            \
    } else {                                                                               \
        for (i = 0; i < n; i++) out[i] = (char)p[2 * i];                                   \
    }

static void widen_scalar(const uint8_t *restrict p, Py_ssize_t n, int bytes, char *restrict out, int osize) {
    R3_WIDEN_BODY
}

#ifdef R3_X86
R3_TARGET_AVX2 static void widen_avx2(const uint8_t *restrict p, Py_ssize_t n, int bytes, char *restrict out,
                                      int osize) {
    R3_WIDEN_BODY
}
#endif
#undef R3_WIDEN_BODY

/*
 * Unpack n ids from p (plen bytes, at least packed_nbytes(n, bits)) into out, a
 * contiguous array of 1-, 2- or 4-byte words (values are truncated to the word).
 */
void unpack_contig(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize) {
    if (bits == 8 || bits == 16) {
#ifdef R3_X86
        if (use_avx2) {
            widen_avx2(p, n, bits / 8, out, osize);
            return;
        }
#endif
        widen_scalar(p, n, bits / 8, out, osize);
        return;
    }
    const int slot = size_slot(osize);
    const Py_ssize_t full = n / 8, rem = n % 8;
    /* groups whose 16-byte read stays inside the payload */
    Py_ssize_t safe = plen >= 16 ? (plen - 16) / bits + 1 : 0, g = 0;
    if (safe > full) {
        safe = full;
    }
#ifdef R3_X86
    if (use_avx2) {
        g = unpack_avx2(p, safe, bits, out, osize);
    }
#endif
    if (safe > g) {
        unpack_table[bits][slot](p + g * bits, safe - g, out + g * 8 * osize);
        g = safe;
    }
    for (; g < full + (rem ? 1 : 0); g++) { /* tail: copy the last bytes into a padded window */
        uint8_t win[16] = {0};
        uint32_t vals[8];
        Py_ssize_t have = plen - g * bits, count = g < full ? 8 : rem;
        memcpy(win, p + g * bits, (size_t)(have < 16 ? have : 16));
        unpack_table[bits][2](win, 1, vals);
        conv_table[T_U32][osize == 1 ? T_U8 : osize == 2 ? T_U16 : T_U32]((const char *)vals, 4, out + g * 8 * osize, count);
    }
}

/* Unpack n ids into any integer buffer (cursor), zeros after them. */
void unpack_to_buffer(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, Py_buffer *out, int otype) {
    const int osize = type_size[otype];
    if (is_c_contiguous(out) && osize <= 4) {
        unpack_contig(p, plen, n, bits, (char *)out->buf, osize);
        memset((char *)out->buf + n * osize, 0, (size_t)((out->len / osize - n) * osize));
        return;
    }
    cursor_t c;
    uint32_t stage[R3_CHUNK];
    Py_ssize_t start;
    cursor_init(&c, out);
    for (start = 0; start < n; start += R3_CHUNK) { /* R3_CHUNK ids = R3_CHUNK * bits / 8 bytes */
        Py_ssize_t m = n - start < R3_CHUNK ? n - start : R3_CHUNK;
        const uint8_t *q = p + (start / 8) * bits;
        unpack_contig(q, plen - (q - p), m, bits, (char *)stage, 4);
        cursor_scatter(&c, otype, (const char *)stage, T_U32, m);
    }
    cursor_zero(&c, otype, c.total - n);
}


R3_DOC(unpack_doc, "unpack(buf, offset, n, bits, out)\n\n"
"Unpack n ids of bits bits from the bytes buf[offset:] into the integer array out\n"
"(any shape and strides, C order, at least n elements); the elements after the\n"
"first n are set to 0.");

PyObject *py_unpack(PyObject *self, PyObject *args) {
    PyObject *obj, *out_obj;
    Py_ssize_t offset, n;
    int bits;
    Py_buffer b, out;
    if (!PyArg_ParseTuple(args, "OnniO", &obj, &offset, &n, &bits, &out_obj) || check_bits(bits) < 0) {
        return NULL;
    }
    if (get_bytes_buffer(obj, &b) < 0) {
        return NULL;
    }
    if (get_int_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&b);
        return NULL;
    }
    cursor_t c;
    cursor_init(&c, &out);
    if (n < 0 || offset < 0 || offset > b.len || b.len - offset < packed_nbytes(n, bits) || c.total < n) {
        PyErr_Format(PyExc_ValueError, "unpack: %zd ids of %d bits need %zd bytes after offset %zd of %zd and "
                     "room in out (%zd elements)", n, bits, packed_nbytes(n, bits), offset, b.len, c.total);
        PyBuffer_Release(&b);
        PyBuffer_Release(&out);
        return NULL;
    }
    int otype = buffer_type(&out);
    Py_BEGIN_ALLOW_THREADS
    unpack_to_buffer((const uint8_t *)b.buf + offset, b.len - offset, n, bits, &out, otype);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}
