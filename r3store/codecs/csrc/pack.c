/*
 * pack.c: bit packing of r3store.bitpack payloads (widths 1..16): pack().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * bit packing: 8 ids of `bits` bits fill exactly `bits` bytes of the stream
 * --------------------------------------------------------------------------------- */

/* groups of 8 ids of type T -> out; returns the OR of the ids (the range check) */
typedef uint64_t (*pack_fn)(const void *v, Py_ssize_t groups, uint8_t *out);

#define DEF_PACK(B, TN, T)                                                                \
    static uint64_t pack_w##B##_##TN(const void *vv, Py_ssize_t groups, uint8_t *out) {   \
        const uint64_t mask = (1u << B) - 1u;                                             \
        const T *v = (const T *)vv;                                                       \
        uint64_t acc = 0;                                                                 \
        Py_ssize_t g;                                                                     \
        int j;                                                                            \
        for (g = 0; g < groups; g++, v += 8, out += B) {                                  \
            uint64_t lo = 0, hi = 0;                                                      \
            T w[8];                                                                       \
            memcpy(w, v, sizeof w);                                                       \
            for (j = 0; j < 8; j++) {                                                     \
                const int s = j * B;                                                      \
                const uint64_t x = (uint64_t)w[j] & mask;                                 \
                acc |= (uint64_t)w[j];                                                    \
                if (s >= 64) {                                                            \
                    hi |= x << (s >= 64 ? s - 64 : 0);                                    \
                } else {                                                                  \
                    lo |= x << s;                                                         \
                    if (s + B > 64) {                                                     \
                        hi |= x >> (s + B > 64 ? 64 - s : 0);                             \
                    }                                                                     \
                }                                                                         \
            }                                                                             \
            memcpy(out, &lo, B < 8 ? B : 8);                                              \
            if (B > 8) {                                                                  \
                memcpy(out + 8, &hi, B > 8 ? B - 8 : 0);                                  \
            }                                                                             \
        }                                                                                 \
        return acc;                                                                       \
    }

#define DEF_PACK_BOTH(B) DEF_PACK(B, u8, uint8_t) DEF_PACK(B, u16, uint16_t)
DEF_PACK_BOTH(1) DEF_PACK_BOTH(2) DEF_PACK_BOTH(3) DEF_PACK_BOTH(4)
DEF_PACK_BOTH(5) DEF_PACK_BOTH(6) DEF_PACK_BOTH(7) DEF_PACK_BOTH(8)
DEF_PACK_BOTH(9) DEF_PACK_BOTH(10) DEF_PACK_BOTH(11) DEF_PACK_BOTH(12)
DEF_PACK_BOTH(13) DEF_PACK_BOTH(14) DEF_PACK_BOTH(15) DEF_PACK_BOTH(16)

#define PACK_ROW(B) {pack_w##B##_u8, pack_w##B##_u16}
static const pack_fn pack_table[17][2] = {
    {NULL, NULL}, PACK_ROW(1), PACK_ROW(2), PACK_ROW(3), PACK_ROW(4), PACK_ROW(5), PACK_ROW(6),
    PACK_ROW(7), PACK_ROW(8), PACK_ROW(9), PACK_ROW(10), PACK_ROW(11), PACK_ROW(12), PACK_ROW(13),
    PACK_ROW(14), PACK_ROW(15), PACK_ROW(16),
};

#ifdef R3_X86
/*
 * Two groups (one per 128-bit half) per step, for bits <= 14: 16-bit ids are merged in
 * pairs by a multiply-add (a + b << bits in 32 bits), then pairs of 32-bit and of 64-bit
 * lanes by shifts, leaving each group's `bits` bytes at the start of its half. Halves are
 * stored 16 bytes wide and overlap: the next store overwrites the zero tail. Returns the
 * groups done (the caller packs the rest) and ORs the ids into *acc.
 */
R3_TARGET_AVX2 static Py_ssize_t pack_avx2(const void *src, int in_size, Py_ssize_t groups, uint8_t *out,
                                           int bits, uint64_t *acc) {
    const __m256i mul = _mm256_set1_epi32(1 | (1 << (bits + 16)));
    const __m256i lo32 = _mm256_set1_epi64x(0xFFFFFFFF);
    const __m256i keep_lo = _mm256_setr_epi64x(-1, 0, -1, 0), keep_hi = _mm256_setr_epi64x(0, -1, 0, -1);
    const __m128i sh2 = _mm_cvtsi32_si128(2 * bits), sh4 = _mm_cvtsi32_si128(4 * bits);
    const __m128i sh4r = _mm_cvtsi32_si128(64 - 4 * bits);
    const uint8_t *s = (const uint8_t *)src;
    __m256i ors = _mm256_setzero_si256();
    Py_ssize_t g = 0;
    const Py_ssize_t stop = groups - 2 - (16 + bits - 1) / bits; /* the last stores stay inside out */
#define R3_PACK_STEP(LOAD)                                                                          \
    for (; g <= stop; g += 2) {                                                                     \
        __m256i x = LOAD;                                                                           \
        ors = _mm256_or_si256(ors, x);                                                              \
        x = _mm256_madd_epi16(x, mul);                                                              \
        x = _mm256_or_si256(_mm256_and_si256(x, lo32), _mm256_sll_epi64(_mm256_srli_epi64(x, 32), sh2)); \
        const __m256i t1 = _mm256_bsrli_epi128(_mm256_sll_epi64(x, sh4), 8);                       \
        const __m256i t2 = _mm256_and_si256(_mm256_srl_epi64(x, sh4r), keep_hi);                    \
        x = _mm256_or_si256(_mm256_and_si256(x, keep_lo), _mm256_or_si256(t1, t2));                 \
        _mm_storeu_si128((__m128i *)(out + g * bits), _mm256_castsi256_si128(x));                   \
        _mm_storeu_si128((__m128i *)(out + (g + 1) * bits), _mm256_extracti128_si256(x, 1));        \
    }
    if (in_size == 1) {
        R3_PACK_STEP(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(s + g * 8))))
    } else {
        R3_PACK_STEP(_mm256_loadu_si256((const __m256i *)(s + g * 16)))
    }
#undef R3_PACK_STEP
    uint16_t lanes[16];
    int i;
    _mm256_storeu_si256((__m256i *)lanes, ors);
    for (i = 0; i < 16; i++) {
        *acc |= lanes[i];
    }
    return g < 0 ? 0 : g;
}
#endif

/* Pack n ids of a contiguous uint8 or uint16 array; returns the OR of the ids. */
static uint64_t pack_contig(const void *src, int in_size, Py_ssize_t n, int bits, uint8_t *out) {
    const int slot = in_size == 1 ? 0 : 1;
    const Py_ssize_t full = n / 8, rem = n % 8;
    uint64_t acc = 0;
    Py_ssize_t g = 0;
#ifdef R3_X86
    if (use_avx2 && bits <= 14) {
        g = pack_avx2(src, in_size, full, out, bits, &acc);
    }
#endif
    acc |= pack_table[bits][slot]((const uint8_t *)src + g * 8 * in_size, full - g, out + g * bits);
    if (rem) {
        uint8_t win[16] = {0}, tmp[16];
        memcpy(win, (const uint8_t *)src + full * 8 * in_size, (size_t)(rem * in_size));
        acc |= pack_table[bits][slot](win, 1, tmp);
        memcpy(out + full * bits, tmp, (size_t)packed_nbytes(rem, bits));
    }
    return acc;
}

/* ---------------------------------------------------------------------------------
 * staging for pack: any integer source -> uint16, ORing the ids (sign-extended)
 * --------------------------------------------------------------------------------- */

typedef uint64_t (*stage_fn)(const char *p, Py_ssize_t n, Py_ssize_t s, uint16_t *dst);

#define DEF_STAGE(TN, T, WIDE)                                                                  \
    static uint64_t stage_##TN(const char *p, Py_ssize_t n, Py_ssize_t s, uint16_t *dst) {      \
        uint64_t acc = 0;                                                                       \
        Py_ssize_t i;                                                                           \
        T x;                                                                                    \
        if (s == (Py_ssize_t)sizeof(T)) { /* a contiguous run: a loop the compiler vectorises */ \
            for (i = 0; i < n; i++) {                                                           \
                memcpy(&x, p + i * (Py_ssize_t)sizeof(T), sizeof(T));                           \
                acc |= (uint64_t)(WIDE)x;                                                       \
                dst[i] = (uint16_t)x;                                                           \
            }                                                                                   \
            return acc;                                                                         \
        }                                                                                       \
        for (i = 0; i < n; i++) {                                                               \
            memcpy(&x, p + i * s, sizeof(T));                                                   \
            acc |= (uint64_t)(WIDE)x;                                                           \
            dst[i] = (uint16_t)x;                                                               \
        }                                                                                       \
        return acc;                                                                             \
    }

DEF_STAGE(u8, uint8_t, uint64_t)
DEF_STAGE(i8, int8_t, int64_t)
DEF_STAGE(u16, uint16_t, uint64_t)
DEF_STAGE(i16, int16_t, int64_t)
DEF_STAGE(u32, uint32_t, uint64_t)
DEF_STAGE(i32, int32_t, int64_t)
DEF_STAGE(u64, uint64_t, uint64_t)
DEF_STAGE(i64, int64_t, int64_t)

static const stage_fn stage_table[T_COUNT] = {stage_u8, stage_i8, stage_u16, stage_i16,
                                              stage_u32, stage_i32, stage_u64, stage_i64};

/* Index after the last non-zero element of a contiguous array (bytes compared). */
static Py_ssize_t last_nonzero(const uint8_t *p, Py_ssize_t n, int size) {
    Py_ssize_t i = n * size;
    while (i >= 8) {
        uint64_t w;
        memcpy(&w, p + i - 8, 8);
        if (w) {
            break;
        }
        i -= 8;
    }
    while (i > 0 && !p[i - 1]) {
        i--;
    }
    return (i + size - 1) / size;
}

/*
 * Pack every id of src (C order) into out[0 : packed_nbytes(total)]. Returns the OR of
 * the ids, sign-extended to 64 bits (all ids lie in [0, 2**bits) iff it is below
 * 2**bits), and in *n_used the index after the last non-zero id.
 */
uint64_t pack_buffer(const Py_buffer *src, int type, int bits, uint8_t *out, Py_ssize_t *n_used) {
    cursor_t c;
    cursor_init(&c, src);
    const Py_ssize_t n = c.total;
    if ((type == T_U8 || type == T_U16) && is_c_contiguous(src)) {
        *n_used = last_nonzero((const uint8_t *)src->buf, n, type_size[type]);
        return pack_contig(src->buf, type_size[type], n, bits, out);
    }
    if ((type == T_U8 || type == T_U16) && src->ndim >= 2 && n > 0) {
        /* rows contiguous in themselves, strided between (a frame's layer chunk of a row
         * block): rows copied into a stage with memcpy, packed a stage at a time */
        const Py_ssize_t isz = type_size[type];
        Py_ssize_t expect = isz, d, rows_per;
        int ok = 1;
        for (d = src->ndim - 1; d >= 1; d--) {
            if (src->shape[d] > 1 && src->strides && src->strides[d] != expect) ok = 0;
            expect *= src->shape[d];
        }
        const Py_ssize_t row = expect / isz, rstride = src->strides ? src->strides[0] : expect;
        rows_per = row > 0 ? R3_CHUNK / row : 0;
        if (row % 8) rows_per &= ~(Py_ssize_t)7; /* every stage but the last a multiple of 8 ids */
        if (ok && rows_per > 0) {
            uint16_t stage[R3_CHUNK + 8];
            uint64_t acc = 0;
            Py_ssize_t r0, used = 0;
            const Py_ssize_t nrows = src->shape[0];
            for (r0 = 0; r0 < nrows; r0 += rows_per) {
                const Py_ssize_t nr = nrows - r0 < rows_per ? nrows - r0 : rows_per, m = nr * row, start = r0 * row;
                Py_ssize_t r, last;
                for (r = 0; r < nr; r++) {
                    memcpy((uint8_t *)stage + r * row * isz, (const char *)src->buf + (r0 + r) * rstride,
                           (size_t)(row * isz));
                }
                last = last_nonzero((const uint8_t *)stage, m, (int)isz);
                if (last) {
                    used = start + last;
                }
                acc |= pack_contig(stage, (int)isz, m, bits, out + (start / 8) * bits);
            }
            *n_used = used;
            return acc;
        }
    }
    uint16_t stage[R3_CHUNK + 8];
    uint64_t acc = 0;
    Py_ssize_t start, used = 0;
    for (start = 0; start < n; start += R3_CHUNK) {
        Py_ssize_t m = n - start < R3_CHUNK ? n - start : R3_CHUNK, got = 0, last;
        while (got < m) {
            char *p;
            Py_ssize_t stride, take = cursor_take(&c, m - got, &p, &stride);
            acc |= stage_table[type](p, take, stride, stage + got);
            got += take;
        }
        last = last_nonzero((const uint8_t *)stage, m, 2);
        if (last) {
            used = start + last;
        }
        pack_contig(stage, 2, m, bits, out + (start / 8) * bits);
    }
    *n_used = used;
    return acc;
}


R3_DOC(pack_doc, "pack(src, bits, dst) -> (ored, n_used)\n\n"
"Pack every id of the integer array src (any shape and strides, C order) in bits bits\n"
"into the writable bytes dst (at least ceil(size * bits / 8) bytes). ored is the OR of\n"
"the ids sign-extended to 64 bits (every id lies in [0, 2**bits) iff ored < 2**bits);\n"
"n_used is the index after the last non-zero id.");

PyObject *py_pack(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int bits;
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "OiO", &src_obj, &bits, &dst_obj) || check_bits(bits) < 0) {
        return NULL;
    }
    if (get_int_buffer(src_obj, &src, 0, "src") < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    cursor_t c;
    cursor_init(&c, &src);
    if (dst.len < packed_nbytes(c.total, bits)) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, %zd ids of %d bits need %zd", dst.len, c.total,
                     bits, packed_nbytes(c.total, bits));
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    uint64_t acc;
    Py_ssize_t used;
    int type = buffer_type(&src);
    Py_BEGIN_ALLOW_THREADS
    acc = pack_buffer(&src, type, bits, (uint8_t *)dst.buf, &used);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return Py_BuildValue("(Kn)", (unsigned long long)acc, used);
}
