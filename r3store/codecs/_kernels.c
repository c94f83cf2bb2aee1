/*
 * r3store.codecs._kernels: compiled kernels behind r3store.codecs.kernels.
 *
 * - bit-pack / unpack of r3store.bitpack payloads (widths 1..16, schema/FORMAT.md 5.1),
 *   whole frames included (header, CRC-32C);
 * - route validation for writers (ids in [0, num_experts), no id twice in a row,
 *   dense layers all zero), fused with the conversion to the writer's uint16 buffer;
 * - a row gather (rows of a (rows, layers, top_k) array by an int64 index, -1 = pad row)
 *   with dtype conversion;
 * - a strict base64 decoder (the canonical subset of RFC 4648; anything else is left
 *   to binascii).
 *
 * Arrays arrive through the buffer protocol (any integer format, any strides); no numpy
 * headers are needed, and the module uses the stable ABI (Python >= 3.11). Every kernel
 * runs with the GIL released. The build targets the baseline ISA; AVX2/BMI2/SSE4.2 code
 * lives in functions with target attributes and runs only when the CPU reports those
 * features at import (__builtin_cpu_supports). The numpy code in
 * r3store/codecs/_kernels_numpy.py is the reference: the test suite checks both agree.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "r3store's kernels assume a little-endian machine (the numpy code is used elsewhere)"
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(R3_PORTABLE_ONLY)
#define R3_X86 1
#include <immintrin.h>
#define R3_TARGET_AVX2 __attribute__((target("avx2,bmi,bmi2,popcnt,sse4.2")))
#define R3_TARGET_SSE42 __attribute__((target("sse4.2")))
#endif

#define R3_MAXDIM 64
#define R3_CHUNK 4096 /* ids staged at a time (a multiple of 8: byte-aligned in the stream) */

static int use_avx2 = 0;  /* AVX2 + BMI2 kernels */
static int use_sse42 = 0; /* hardware CRC-32C */

/* ---------------------------------------------------------------------------------
 * element types
 * --------------------------------------------------------------------------------- */

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64, T_COUNT };

static const int type_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8};

/* Integer type of a buffer from its format and itemsize; -1 if not a native integer. */
static int buffer_type(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') {
        f++;
    }
    if (!f[0] || f[1]) {
        return -1;
    }
    int is_signed;
    switch (f[0]) {
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': is_signed = 1; break;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': is_signed = 0; break;
    default: return -1;
    }
    switch (v->itemsize) {
    case 1: return is_signed ? T_I8 : T_U8;
    case 2: return is_signed ? T_I16 : T_U16;
    case 4: return is_signed ? T_I32 : T_U32;
    case 8: return is_signed ? T_I64 : T_U64;
    default: return -1;
    }
}

static int get_int_buffer(PyObject *obj, Py_buffer *v, int writable, const char *what) {
    int flags = writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO;
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        return -1;
    }
    if (buffer_type(v) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must hold native-endian integers (buffer format '%s')", what,
                     v->format ? v->format : "B");
        PyBuffer_Release(v);
        return -1;
    }
    if (v->ndim > R3_MAXDIM) {
        PyErr_Format(PyExc_ValueError, "%s has more than %d dimensions", what, R3_MAXDIM);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static int get_bytes_buffer(PyObject *obj, Py_buffer *v) {
    return PyObject_GetBuffer(obj, v, PyBUF_SIMPLE);
}

static Py_ssize_t packed_nbytes(Py_ssize_t n, int bits) {
    return (Py_ssize_t)(((uint64_t)n * (uint64_t)bits + 7u) / 8u);
}

/* ---------------------------------------------------------------------------------
 * strided cursor: walks any N-d buffer in C order as runs along its innermost dim
 * --------------------------------------------------------------------------------- */

typedef struct {
    int nd; /* outer dims */
    Py_ssize_t shape[R3_MAXDIM], strides[R3_MAXDIM], idx[R3_MAXDIM];
    Py_ssize_t inner_n, inner_s; /* elements and byte stride of the innermost dim */
    Py_ssize_t total;
    char *run; /* start of the current run */
    Py_ssize_t pos; /* elements of the current run already consumed */
} cursor_t;

static void cursor_init(cursor_t *c, const Py_buffer *v) {
    Py_ssize_t shp[R3_MAXDIM], str[R3_MAXDIM], cstr = v->itemsize;
    int nd = 0, i;
    c->total = 1;
    for (i = v->ndim - 1; i >= 0; i--) { /* C strides when the exporter gives none */
        str[i] = v->strides ? v->strides[i] : cstr;
        cstr *= v->shape[i];
    }
    for (i = 0; i < v->ndim; i++) {
        c->total *= v->shape[i];
        if (v->shape[i] == 1) {
            continue;
        }
        if (nd > 0 && str[nd - 1] == str[i] * v->shape[i]) { /* merge with the previous dim */
            shp[nd - 1] *= v->shape[i];
            str[nd - 1] = str[i];
        } else {
            shp[nd] = v->shape[i];
            str[nd] = str[i];
            nd++;
        }
    }
    if (nd == 0) {
        c->inner_n = 1;
        c->inner_s = v->itemsize;
    } else {
        c->inner_n = shp[nd - 1];
        c->inner_s = str[nd - 1];
        nd--;
    }
    c->nd = nd;
    for (i = 0; i < nd; i++) {
        c->shape[i] = shp[i];
        c->strides[i] = str[i];
        c->idx[i] = 0;
    }
    c->run = (char *)v->buf;
    c->pos = 0;
}

static int is_c_contiguous(const Py_buffer *v) {
    cursor_t c;
    cursor_init(&c, v);
    return c.total <= 1 || (c.nd == 0 && c.inner_s == v->itemsize);
}

/* Next stretch of at most `want` elements: pointer, count, byte stride. */
static Py_ssize_t cursor_take(cursor_t *c, Py_ssize_t want, char **p, Py_ssize_t *stride) {
    if (c->pos == c->inner_n) {
        int d;
        for (d = c->nd - 1; d >= 0; d--) {
            c->run += c->strides[d];
            if (++c->idx[d] < c->shape[d]) {
                break;
            }
            c->run -= c->strides[d] * c->shape[d];
            c->idx[d] = 0;
        }
        c->pos = 0;
    }
    Py_ssize_t take = c->inner_n - c->pos;
    if (take > want) {
        take = want;
    }
    *p = c->run + c->pos * c->inner_s;
    *stride = c->inner_s;
    c->pos += take;
    return take;
}

/* ---------------------------------------------------------------------------------
 * conversions: strided source of type S -> contiguous destination of type D
 * --------------------------------------------------------------------------------- */

typedef void (*conv_fn)(const char *src, Py_ssize_t sstride, char *dst, Py_ssize_t n);

#define DEF_CONV(SN, S, DN, D)                                                               \
    static void conv_##SN##_##DN(const char *src, Py_ssize_t sstride, char *dst, Py_ssize_t n) { \
        Py_ssize_t i;                                                                        \
        S x;                                                                                 \
        D y;                                                                                 \
        if (sstride == (Py_ssize_t)sizeof(S)) {                                              \
            for (i = 0; i < n; i++) {                                                        \
                memcpy(&x, src + i * (Py_ssize_t)sizeof(S), sizeof(S));                      \
                y = (D)x;                                                                    \
                memcpy(dst + i * (Py_ssize_t)sizeof(D), &y, sizeof(D));                      \
            }                                                                                \
        } else {                                                                             \
            for (i = 0; i < n; i++) {                                                        \
                memcpy(&x, src + i * sstride, sizeof(S));                                    \
                y = (D)x;                                                                    \
                memcpy(dst + i * (Py_ssize_t)sizeof(D), &y, sizeof(D));                      \
            }                                                                                \
        }                                                                                    \
    }

#define DEF_CONV_ROW(SN, S)          \
    DEF_CONV(SN, S, u8, uint8_t)     \
    DEF_CONV(SN, S, i8, int8_t)      \
    DEF_CONV(SN, S, u16, uint16_t)   \
    DEF_CONV(SN, S, i16, int16_t)    \
    DEF_CONV(SN, S, u32, uint32_t)   \
    DEF_CONV(SN, S, i32, int32_t)    \
    DEF_CONV(SN, S, u64, uint64_t)   \
    DEF_CONV(SN, S, i64, int64_t)

DEF_CONV_ROW(u8, uint8_t)
DEF_CONV_ROW(i8, int8_t)
DEF_CONV_ROW(u16, uint16_t)
DEF_CONV_ROW(i16, int16_t)
DEF_CONV_ROW(u32, uint32_t)
DEF_CONV_ROW(i32, int32_t)
DEF_CONV_ROW(u64, uint64_t)
DEF_CONV_ROW(i64, int64_t)

#define CONV_ROW(SN) \
    {conv_##SN##_u8, conv_##SN##_i8, conv_##SN##_u16, conv_##SN##_i16, conv_##SN##_u32, conv_##SN##_i32, conv_##SN##_u64, conv_##SN##_i64}

static const conv_fn conv_table[T_COUNT][T_COUNT] = {
    CONV_ROW(u8), CONV_ROW(i8), CONV_ROW(u16), CONV_ROW(i16),
    CONV_ROW(u32), CONV_ROW(i32), CONV_ROW(u64), CONV_ROW(i64),
};

/* Write n elements from a contiguous source of type st through a cursor. */
static void cursor_scatter(cursor_t *c, int dt, const char *src, int st, Py_ssize_t n) {
    /* conv_table converts into contiguous memory; a strided run goes element by element */
    while (n > 0) {
        char *p;
        Py_ssize_t stride, take = cursor_take(c, n, &p, &stride), i;
        if (stride == type_size[dt]) {
            conv_table[st][dt](src, type_size[st], p, take);
        } else {
            for (i = 0; i < take; i++) {
                conv_table[st][dt](src + i * type_size[st], type_size[st], p + i * stride, 1);
            }
        }
        src += take * type_size[st];
        n -= take;
    }
}

static void cursor_zero(cursor_t *c, int dt, Py_ssize_t n) {
    static const uint64_t zeros[64] = {0};
    while (n > 0) {
        Py_ssize_t step = n < 64 ? n : 64;
        cursor_scatter(c, dt, (const char *)zeros, T_U64, step);
        n -= step;
    }
}

/* ---------------------------------------------------------------------------------
 * CRC-32C (Castagnoli, reflected 0x82F63B78)
 * --------------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    uint32_t i, j, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++) {
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        }
        crc_table[0][i] = c;
    }
    for (i = 0; i < 256; i++) {
        c = crc_table[0][i];
        for (j = 1; j < 8; j++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[j][i] = c;
        }
    }
}

/* crc is the raw register (already inverted) */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^ crc_table[5][(w >> 16) & 0xFF] ^
              crc_table[4][(w >> 24) & 0xFF] ^ crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return crc;
}

#ifdef R3_X86
R3_TARGET_SSE42 static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--) {
        crc = _mm_crc32_u8(crc, *p++);
    }
    return crc;
}
#endif

static uint32_t crc32c_extend(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t crc = ~value;
#ifdef R3_X86
    if (use_sse42) {
        return ~crc_hw(crc, p, n);
    }
#endif
    return ~crc_sw(crc, p, n);
}

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
static uint64_t pack_buffer(const Py_buffer *src, int type, int bits, uint8_t *out, Py_ssize_t *n_used) {
    cursor_t c;
    cursor_init(&c, src);
    const Py_ssize_t n = c.total;
    if ((type == T_U8 || type == T_U16) && is_c_contiguous(src)) {
        *n_used = last_nonzero((const uint8_t *)src->buf, n, type_size[type]);
        return pack_contig(src->buf, type_size[type], n, bits, out);
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

static int fits(uint64_t acc, int bits) { return (acc >> bits) == 0; }

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

/*
 * Unpack n ids from p (plen bytes, at least packed_nbytes(n, bits)) into out, a
 * contiguous array of 1-, 2- or 4-byte words (values are truncated to the word).
 */
static void unpack_contig(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize) {
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
static void unpack_to_buffer(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, Py_buffer *out, int otype) {
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

/* ---------------------------------------------------------------------------------
 * route validation (writers)
 * --------------------------------------------------------------------------------- */

typedef struct {
    int dense, range, repeat; /* found? */
    Py_ssize_t dense_pos[3], range_pos[3], repeat_pos[3];
} faults_t;

typedef int (*check_fn)(const char *base, const Py_ssize_t *shape, const Py_ssize_t *strides,
                        const uint8_t *kind, int has_dense, uint64_t num_experts, uint16_t *out,
                        uint64_t *bitmap, faults_t *f);

/*
 * One pass in C order over (row, layer). Records the first fault of each kind; a dense
 * fault ends the scan (it is reported first), a range fault ends the MoE checks.
 */
#define DEF_CHECK(TN, T, WIDE)                                                                  \
    static int check_##TN(const char *base, const Py_ssize_t *shape, const Py_ssize_t *strides, \
                          const uint8_t *kind, int has_dense, uint64_t num_experts, uint16_t *out, \
                          uint64_t *bitmap, faults_t *f) {                                      \
        const Py_ssize_t R = shape[0], L = shape[1], K = shape[2];                              \
        const Py_ssize_t s0 = strides[0], s1 = strides[1], s2 = strides[2];                     \
        Py_ssize_t r, l, k;                                                                     \
        T x;                                                                                    \
        for (r = 0; r < R; r++) {                                                               \
            for (l = 0; l < L; l++) {                                                           \
                const char *p = base + r * s0 + l * s1;                                         \
                if (!kind[l]) {                                                                 \
                    for (k = 0; k < K; k++) {                                                   \
                        memcpy(&x, p + k * s2, sizeof(T));                                      \
                        if (x) {                                                                \
                            f->dense = 1;                                                       \
                            f->dense_pos[0] = r; f->dense_pos[1] = l; f->dense_pos[2] = k;      \
                            return 0;                                                           \
                        }                                                                       \
                    }                                                                           \
                    continue;                                                                   \
                }                                                                               \
                if (f->range) {                                                                 \
                    continue;                                                                   \
                }                                                                               \
                uint64_t dup = 0;                                                               \
                for (k = 0; k < K; k++) {                                                       \
                    memcpy(&x, p + k * s2, sizeof(T));                                          \
                    const uint64_t v = (uint64_t)(WIDE)x;                                       \
                    if (v >= num_experts) {                                                     \
                        f->range = 1;                                                           \
                        f->range_pos[0] = r; f->range_pos[1] = l; f->range_pos[2] = k;          \
                        break;                                                                  \
                    }                                                                           \
                    const uint64_t bit = (uint64_t)1 << (v & 63), word = bitmap[v >> 6];        \
                    dup |= word & bit;                                                          \
                    bitmap[v >> 6] = word | bit;                                                \
                    if (out) {                                                                  \
                        *out++ = (uint16_t)v;                                                   \
                    }                                                                           \
                }                                                                               \
                const Py_ssize_t done = k;                                                      \
                for (k = 0; k < done; k++) {                                                    \
                    memcpy(&x, p + k * s2, sizeof(T));                                          \
                    bitmap[(uint64_t)(WIDE)x >> 6] = 0;                                         \
                }                                                                               \
                if (f->range) {                                                                 \
                    if (!has_dense) {                                                           \
                        return 0;                                                               \
                    }                                                                           \
                    continue;                                                                   \
                }                                                                               \
                if (dup && !f->repeat) {                                                        \
                    f->repeat = 1;                                                              \
                    f->repeat_pos[0] = r; f->repeat_pos[1] = l; f->repeat_pos[2] = 0;          \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        return 0;                                                                               \
    }

DEF_CHECK(u8, uint8_t, uint64_t)
DEF_CHECK(i8, int8_t, int64_t)
DEF_CHECK(u16, uint16_t, uint64_t)
DEF_CHECK(i16, int16_t, int64_t)
DEF_CHECK(u32, uint32_t, uint64_t)
DEF_CHECK(i32, int32_t, int64_t)
DEF_CHECK(u64, uint64_t, uint64_t)
DEF_CHECK(i64, int64_t, int64_t)

static const check_fn check_table[T_COUNT] = {check_u8, check_i8, check_u16, check_i16,
                                              check_u32, check_i32, check_u64, check_i64};

#ifdef R3_X86
/*
 * The common case in one vector per (row, layer): 32-bit ids, top_k = 8, each row's
 * (layers, 8) block contiguous. Range: unsigned max against num_experts - 1 (a negative
 * id is a huge unsigned one); repeats: compares against the 4 rotations that pair every
 * two slots. Returns 1 when every check passed (out filled), 0 at the first fault (the
 * caller reruns the scalar checker, which locates it).
 */
R3_TARGET_AVX2 static int check_i32_k8_avx2(const char *base, Py_ssize_t R, Py_ssize_t L, Py_ssize_t s0,
                                            const uint8_t *kind, uint64_t num_experts, uint16_t *out) {
    const __m256i lim = _mm256_set1_epi32((int32_t)(uint32_t)(num_experts - 1));
    const __m256i rot1 = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
    const __m256i rot2 = _mm256_setr_epi32(2, 3, 4, 5, 6, 7, 0, 1);
    const __m256i rot3 = _mm256_setr_epi32(3, 4, 5, 6, 7, 0, 1, 2);
    const __m256i rot4 = _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3);
    Py_ssize_t r, l;
    for (r = 0; r < R; r++) {
        const char *row = base + r * s0;
        __m256i bad = _mm256_setzero_si256();
        for (l = 0; l < L; l++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(row + l * 32));
            if (!kind[l]) {
                bad = _mm256_or_si256(bad, x);
                continue;
            }
            const __m256i in = _mm256_cmpeq_epi32(_mm256_max_epu32(x, lim), lim);
            __m256i eq = _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot1));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot2)));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot3)));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot4)));
            bad = _mm256_or_si256(bad, _mm256_or_si256(eq, _mm256_xor_si256(in, _mm256_set1_epi32(-1))));
            if (out) {
                const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0x08);
                _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(w));
                out += 8;
            }
        }
        if (!_mm256_testz_si256(bad, bad)) {
            return 0;
        }
    }
    return 1;
}
#endif

/* ---------------------------------------------------------------------------------
 * base64 (RFC 4648 alphabet, canonical padding only)
 * --------------------------------------------------------------------------------- */

static int8_t b64_value[256];

static void b64_init(void) {
    int i;
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (i = 0; i < 256; i++) {
        b64_value[i] = -1;
    }
    for (i = 0; i < 64; i++) {
        b64_value[(unsigned char)alphabet[i]] = (int8_t)i;
    }
}

/* Whole quanta of 4 characters (no padding); returns quanta decoded before a bad one. */
static Py_ssize_t b64_quanta_sw(const uint8_t *s, Py_ssize_t quanta, uint8_t *o) {
    Py_ssize_t q;
    for (q = 0; q < quanta; q++, s += 4, o += 3) {
        const int32_t a = b64_value[s[0]], b = b64_value[s[1]], c = b64_value[s[2]], d = b64_value[s[3]];
        if ((a | b | c | d) < 0) {
            return q;
        }
        const uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | (uint32_t)d;
        o[0] = (uint8_t)(v >> 16);
        o[1] = (uint8_t)(v >> 8);
        o[2] = (uint8_t)v;
    }
    return q;
}

#ifdef R3_X86
/*
 * 32 characters -> 24 bytes per step: classify each byte by range (A-Z, a-z, 0-9, '+',
 * '/'), add the class's offset to get its 6-bit value, then merge 4 values into 3 bytes
 * with two multiply-adds and a byte shuffle (W. Mula and D. Lemire, "Faster Base64
 * Encoding and Decoding Using AVX2 Instructions", ACM TOW 2018). Stops before a block
 * with any other byte. Each step stores 32 bytes, so out must have 8 bytes to spare.
 */
R3_TARGET_AVX2 static Py_ssize_t b64_blocks_avx2(const uint8_t *s, Py_ssize_t blocks, uint8_t *o) {
#define R3_RANGE(x, lo, hi) \
    _mm256_and_si256(_mm256_cmpgt_epi8(x, _mm256_set1_epi8((char)((lo) - 1))), _mm256_cmpgt_epi8(_mm256_set1_epi8((char)((hi) + 1)), x))
    const __m256i pack1 = _mm256_set1_epi32(0x01400140);
    const __m256i pack2 = _mm256_set1_epi32(0x00011000);
    const __m256i order = _mm256_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
                                           2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    Py_ssize_t i;
    for (i = 0; i < blocks; i++, s += 32, o += 24) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)s);
        const __m256i upper = R3_RANGE(x, 'A', 'Z');
        const __m256i lower = R3_RANGE(x, 'a', 'z');
        const __m256i digit = R3_RANGE(x, '0', '9');
        const __m256i plus = _mm256_cmpeq_epi8(x, _mm256_set1_epi8('+'));
        const __m256i slash = _mm256_cmpeq_epi8(x, _mm256_set1_epi8('/'));
        const __m256i valid = _mm256_or_si256(_mm256_or_si256(upper, lower), _mm256_or_si256(digit, _mm256_or_si256(plus, slash)));
        if (_mm256_movemask_epi8(valid) != -1) {
            break;
        }
        __m256i shift = _mm256_and_si256(upper, _mm256_set1_epi8(-65));
        shift = _mm256_or_si256(shift, _mm256_and_si256(lower, _mm256_set1_epi8(-71)));
        shift = _mm256_or_si256(shift, _mm256_and_si256(digit, _mm256_set1_epi8(4)));
        shift = _mm256_or_si256(shift, _mm256_and_si256(plus, _mm256_set1_epi8(19)));
        shift = _mm256_or_si256(shift, _mm256_and_si256(slash, _mm256_set1_epi8(16)));
        const __m256i v = _mm256_add_epi8(x, shift);              /* 6-bit values a b c d */
        const __m256i ab = _mm256_maddubs_epi16(v, pack1);         /* a << 6 | b, c << 6 | d */
        const __m256i abcd = _mm256_madd_epi16(ab, pack2);         /* 24 bits per 32-bit lane */
        const __m256i bytes = _mm256_shuffle_epi8(abcd, order);    /* big-endian 3 bytes per lane */
        _mm256_storeu_si256((__m256i *)o, _mm256_permutevar8x32_epi32(bytes, lanes));
    }
#undef R3_RANGE
    return i;
}
#endif

/* Bytes the canonical text decodes to, or -1 if it is not canonical base64. */
static Py_ssize_t b64_decoded_size(const uint8_t *s, Py_ssize_t n) {
    if (n % 4) {
        return -1;
    }
    if (n == 0) {
        return 0;
    }
    Py_ssize_t pad = s[n - 1] == '=' ? (s[n - 2] == '=' ? 2 : 1) : 0;
    return n / 4 * 3 - pad;
}

/* Decode canonical base64; returns bytes written or -1 at the first non-canonical byte. */
static Py_ssize_t b64_decode(const uint8_t *s, Py_ssize_t n, uint8_t *o, Py_ssize_t olen) {
    Py_ssize_t size = b64_decoded_size(s, n), done = 0, q;
    if (size < 0 || size > olen) {
        return -1;
    }
    if (n == 0) {
        return 0;
    }
    Py_ssize_t quanta = n / 4 - 1; /* the last quantum may hold padding */
#ifdef R3_X86
    if (use_avx2 && quanta >= 16) {
        Py_ssize_t blocks = (quanta - 3) / 8; /* 3 spare quanta cover the 8-byte overstore */
        done = b64_blocks_avx2(s, blocks, o) * 8;
    }
#endif
    q = b64_quanta_sw(s + done * 4, quanta - done, o + done * 3);
    if (done + q < quanta) {
        return -1;
    }
    const uint8_t *t = s + quanta * 4;
    uint8_t *u = o + quanta * 3;
    int32_t a = b64_value[t[0]], b = b64_value[t[1]], c = b64_value[t[2]], d = b64_value[t[3]];
    if (a < 0 || b < 0) {
        return -1;
    }
    if (t[2] == '=' && t[3] == '=') {
        u[0] = (uint8_t)((a << 2) | (b >> 4));
    } else if (t[3] == '=') {
        if (c < 0) return -1;
        u[0] = (uint8_t)((a << 2) | (b >> 4));
        u[1] = (uint8_t)(((b & 15) << 4) | (c >> 2));
    } else {
        if ((c | d) < 0) return -1;
        const uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6) | (uint32_t)d;
        u[0] = (uint8_t)(v >> 16);
        u[1] = (uint8_t)(v >> 8);
        u[2] = (uint8_t)v;
    }
    return size;
}

/* ---------------------------------------------------------------------------------
 * Python functions
 * --------------------------------------------------------------------------------- */

static int check_bits(int bits) {
    if (bits < 1 || bits > 16) {
        PyErr_Format(PyExc_ValueError, "bits must be in [1, 16], got %d", bits);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(pack_doc, "pack(src, bits, dst) -> (ored, n_used)\n\n"
"Pack every id of the integer array src (any shape and strides, C order) in bits bits\n"
"into the writable bytes dst (at least ceil(size * bits / 8) bytes). ored is the OR of\n"
"the ids sign-extended to 64 bits (every id lies in [0, 2**bits) iff ored < 2**bits);\n"
"n_used is the index after the last non-zero id.");

static PyObject *py_pack(PyObject *self, PyObject *args) {
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

PyDoc_STRVAR(encode_frame_doc, "encode_frame(src, bits, version=1, tag=0) -> bytes | None\n\n"
"One r3store.bitpack frame of the ids of src (any shape and strides, C order): header,\n"
"CRC-32C, payload with the trailing zero ids trimmed. version 2 frames carry tag (the\n"
"position tag, 32 bits) in their 24-byte header. None when an id lies outside\n"
"[0, 2**bits) (the caller reports which).");

static PyObject *py_encode_frame(PyObject *self, PyObject *args) {
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

PyDoc_STRVAR(check_frame_doc, "check_frame(buf, bits) -> (status, n_total, n_encoded, header, tag)\n\n"
"Verify an r3store.bitpack frame of version 1 or 2 (magic, version, CRC-32C, bits, sizes,\n"
"reserved and padding bits). status 0: valid; otherwise the number of the first failed\n"
"check. header: the header size (20 or 24; the payload starts there); tag: the position\n"
"tag of a version-2 frame (0 for version 1).");

static PyObject *py_check_frame(PyObject *self, PyObject *args) {
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

PyDoc_STRVAR(unpack_doc, "unpack(buf, offset, n, bits, out)\n\n"
"Unpack n ids of bits bits from the bytes buf[offset:] into the integer array out\n"
"(any shape and strides, C order, at least n elements); the elements after the\n"
"first n are set to 0.");

static PyObject *py_unpack(PyObject *self, PyObject *args) {
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

PyDoc_STRVAR(decode_frames_doc, "decode_frames(blob, starts, lengths, bits, out, rows, layers, chunk_rows,\n"
"layers_per_chunk, prefix_crc, row_chunks, layer_chunks, check_tags) -> int\n\n"
"Check and decode many r3store.bitpack frames of one storage object straight into their\n"
"places in out, a C-contiguous integer array (n, L, K) of 1-, 2- or 4-byte words. Frame f\n"
"is blob[starts[f] : starts[f] + lengths[f]]; it must hold chunk_rows * layers_per_chunk * K\n"
"ids and lands in out[rows[f] : rows[f] + chunk_rows, layers[f] : layers[f] + layers_per_chunk]\n"
"(ids past its n_encoded are 0). With check_tags its position tag must be the CRC-32C of\n"
"the text '<prefix>/<row_chunks[f]>/<layer_chunks[f]>', given prefix_crc = crc32c(prefix +\n"
"'/'). starts ... layer_chunks: C-contiguous int64 arrays of one length. Returns -1 when\n"
"every frame decoded, else the index of the first frame that failed a check or lies\n"
"outside blob or out (frames before it are decoded; the caller names the fault).");

static int get_i64_array(PyObject *obj, Py_buffer *v, const char *what) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (v->itemsize != 8 || buffer_type(v) != T_I64) {
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous int64 array", what);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *py_decode_frames(PyObject *self, PyObject *args) {
    PyObject *blob_obj, *out_obj, *arr_obj[6];
    const char *names[6] = {"starts", "lengths", "rows", "layers", "row_chunks", "layer_chunks"};
    int bits, check_tags, i, ok = 1;
    Py_ssize_t chunk_rows, lpc, f, failed = -1;
    unsigned long prefix_crc;
    Py_buffer blob, out, arr[6];
    if (!PyArg_ParseTuple(args, "OOOiOOOnnkOOp", &blob_obj, &arr_obj[0], &arr_obj[1], &bits, &out_obj, &arr_obj[2],
                          &arr_obj[3], &chunk_rows, &lpc, &prefix_crc, &arr_obj[4], &arr_obj[5], &check_tags)
        || check_bits(bits) < 0) {
        return NULL;
    }
    if (get_bytes_buffer(blob_obj, &blob) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&blob);
        return NULL;
    }
    for (i = 0; i < 6 && ok; i++) {
        if (get_i64_array(arr_obj[i], &arr[i], names[i]) < 0) {
            ok = 0;
            break;
        }
        if (arr[i].len != arr[0].len) {
            PyErr_Format(PyExc_ValueError, "%s has another length than starts", names[i]);
            PyBuffer_Release(&arr[i]);
            ok = 0;
            break;
        }
    }
    if (!ok) {
        while (--i >= 0) {
            PyBuffer_Release(&arr[i]);
        }
        PyBuffer_Release(&blob);
        PyBuffer_Release(&out);
        return NULL;
    }
    const int otype = buffer_type(&out);
    if (out.ndim != 3 || otype < 0 || type_size[otype] > 4 || chunk_rows < 1 || lpc < 1 || lpc > out.shape[1]) {
        PyErr_SetString(PyExc_ValueError, "decode_frames: out must be a 3-D array of 1-, 2- or 4-byte integers "
                                          "and 1 <= layers_per_chunk <= its layers");
        ok = 0;
    }
    const Py_ssize_t N = ok ? out.shape[0] : 0, L = ok ? out.shape[1] : 0, K = ok ? out.shape[2] : 0;
    const Py_ssize_t n_total = chunk_rows * lpc * K, width = lpc * K, n = arr[0].len / 8;
    uint32_t *stage = NULL;
    if (ok && (n_total <= 0 || n_total > ((Py_ssize_t)1 << 26))) {
        PyErr_SetString(PyExc_ValueError, "decode_frames: chunk of more than 2**26 ids");
        ok = 0;
    }
    if (ok && !(stage = (uint32_t *)malloc((size_t)n_total * 4))) {
        PyErr_NoMemory();
        ok = 0;
    }
    if (ok) {
        const int64_t *st = (const int64_t *)arr[0].buf, *ln = (const int64_t *)arr[1].buf;
        const int64_t *rw = (const int64_t *)arr[2].buf, *ly = (const int64_t *)arr[3].buf;
        const int64_t *rc = (const int64_t *)arr[4].buf, *lc = (const int64_t *)arr[5].buf;
        const int osize = type_size[otype];
        const conv_fn conv = conv_table[T_U32][otype];
        char *base = (char *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (f = 0; f < n; f++) {
            uint32_t nt = 0, ne = 0, tag = 0;
            int hdr = 0;
            if (st[f] < 0 || ln[f] < 0 || st[f] > blob.len - ln[f] || rw[f] < 0 || rw[f] > N - chunk_rows
                || ly[f] < 0 || ly[f] > L - lpc) {
                failed = f;
                break;
            }
            const uint8_t *d = (const uint8_t *)blob.buf + st[f];
            if (frame_status(d, (Py_ssize_t)ln[f], bits, &nt, &ne, &hdr, &tag) || (Py_ssize_t)nt != n_total) {
                failed = f;
                break;
            }
            if (check_tags) {
                char text[48];
                int k = snprintf(text, sizeof text, "%lld/%lld", (long long)rc[f], (long long)lc[f]);
                if (k <= 0 || k >= (int)sizeof text
                    || crc32c_extend((uint32_t)prefix_crc, (const uint8_t *)text, (size_t)k) != tag) {
                    failed = f;
                    break;
                }
            }
            unpack_contig(d + hdr, (Py_ssize_t)ln[f] - hdr, (Py_ssize_t)ne, bits, (char *)stage, 4);
            memset(stage + ne, 0, (size_t)(n_total - (Py_ssize_t)ne) * 4);
            for (Py_ssize_t r = 0; r < chunk_rows; r++) {
                conv((const char *)(stage + r * width), 4, base + (((rw[f] + r) * L + ly[f]) * K) * osize, width);
            }
        }
        Py_END_ALLOW_THREADS
        free(stage);
    }
    for (i = 0; i < 6; i++) {
        PyBuffer_Release(&arr[i]);
    }
    PyBuffer_Release(&blob);
    PyBuffer_Release(&out);
    if (!ok) {
        return NULL;
    }
    return PyLong_FromSsize_t(failed);
}

PyDoc_STRVAR(check_routes_doc, "check_routes(routes, kinds, num_experts, out) -> None | (fault, row, layer, slot)\n\n"
"Validate routes (rows, layers, top_k) of any integer type and strides. kinds: bytes, one\n"
"per layer, 0 for a dense layer (all ids must be 0), 1 for an MoE layer (ids in\n"
"[0, num_experts), none twice in a row). out: None or a C-contiguous uint16 array\n"
"(rows, MoE layers, top_k) that receives the MoE ids. Returns None, or the first fault\n"
"in the order dense, range, repeat: 1 dense id not 0, 2 id out of range, 3 id repeated\n"
"(slot 0), each at its first position in C order.");

static PyObject *py_check_routes(PyObject *self, PyObject *args) {
    PyObject *routes_obj, *kinds_obj, *out_obj;
    unsigned long long num_experts;
    Py_buffer routes, kinds, out;
    int has_out, has_dense = 0;
    Py_ssize_t i, n_moe = 0;
    if (!PyArg_ParseTuple(args, "OOKO", &routes_obj, &kinds_obj, &num_experts, &out_obj)) {
        return NULL;
    }
    if (get_int_buffer(routes_obj, &routes, 0, "routes") < 0) {
        return NULL;
    }
    if (routes.ndim != 3) {
        PyBuffer_Release(&routes);
        PyErr_SetString(PyExc_ValueError, "routes must have 3 dimensions");
        return NULL;
    }
    if (get_bytes_buffer(kinds_obj, &kinds) < 0) {
        PyBuffer_Release(&routes);
        return NULL;
    }
    const uint8_t *kind = (const uint8_t *)kinds.buf;
    for (i = 0; i < kinds.len; i++) {
        n_moe += kind[i] != 0;
        has_dense |= kind[i] == 0;
    }
    has_out = out_obj != Py_None;
    if (has_out && PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&routes);
        PyBuffer_Release(&kinds);
        return NULL;
    }
    if (kinds.len != routes.shape[1] || num_experts == 0 ||
        (has_out && (buffer_type(&out) != T_U16 ||
                     out.len != (Py_ssize_t)sizeof(uint16_t) * routes.shape[0] * n_moe * routes.shape[2]))) {
        PyErr_SetString(PyExc_ValueError, "check_routes: kinds must have one byte per layer, num_experts >= 1, "
                        "out a C-contiguous uint16 array (rows, MoE layers, top_k)");
        PyBuffer_Release(&routes);
        PyBuffer_Release(&kinds);
        if (has_out) PyBuffer_Release(&out);
        return NULL;
    }
    uint64_t *bitmap = calloc((size_t)((num_experts + 63) / 64), sizeof(uint64_t));
    if (!bitmap) {
        PyBuffer_Release(&routes);
        PyBuffer_Release(&kinds);
        if (has_out) PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    faults_t f;
    memset(&f, 0, sizeof f);
    Py_ssize_t strides[3];
    for (i = 0; i < 3; i++) {
        strides[i] = routes.strides ? routes.strides[i] : 0;
    }
    if (!routes.strides) {
        strides[2] = routes.itemsize;
        strides[1] = strides[2] * routes.shape[2];
        strides[0] = strides[1] * routes.shape[1];
    }
    int type = buffer_type(&routes), done = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef R3_X86
    if (use_avx2 && (type == T_I32 || type == T_U32) && routes.shape[2] == 8 && strides[2] == 4 &&
        strides[1] == 32 && num_experts <= 0x80000000u) {
        done = check_i32_k8_avx2((const char *)routes.buf, routes.shape[0], routes.shape[1], strides[0], kind,
                                 (uint64_t)num_experts, has_out ? (uint16_t *)out.buf : NULL);
    }
#endif
    if (!done) {
        check_table[type]((const char *)routes.buf, routes.shape, strides, kind, has_dense, (uint64_t)num_experts,
                          has_out ? (uint16_t *)out.buf : NULL, bitmap, &f);
    }
    Py_END_ALLOW_THREADS
    free(bitmap);
    PyBuffer_Release(&routes);
    PyBuffer_Release(&kinds);
    if (has_out) PyBuffer_Release(&out);
    if (f.dense) return Py_BuildValue("(innn)", 1, f.dense_pos[0], f.dense_pos[1], f.dense_pos[2]);
    if (f.range) return Py_BuildValue("(innn)", 2, f.range_pos[0], f.range_pos[1], f.range_pos[2]);
    if (f.repeat) return Py_BuildValue("(innn)", 3, f.repeat_pos[0], f.repeat_pos[1], f.repeat_pos[2]);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(gather_rows_doc, "gather_rows(src, index, out, fill_value, num_experts, pad_start) -> pad_rows\n\n"
"out[i] = src[index[i]] for index[i] >= 0, converted to out's integer type. src: (rows,\n"
"layers, top_k), any integer type and strides; index: C-contiguous int64; out:\n"
"C-contiguous (len(index), layers, top_k). A row with index -1 is a pad row: every id is\n"
"fill_value when num_experts is 0, else pad row p (counted from pad_start) holds\n"
"(p * top_k + j) % num_experts in slot j of every layer. Returns the pad rows written.");

static PyObject *py_gather_rows(PyObject *self, PyObject *args) {
    PyObject *src_obj, *index_obj, *out_obj;
    long long fill;
    unsigned long long num_experts, pad_start;
    Py_buffer src, index, out;
    if (!PyArg_ParseTuple(args, "OOOLKK", &src_obj, &index_obj, &out_obj, &fill, &num_experts, &pad_start)) {
        return NULL;
    }
    if (get_int_buffer(src_obj, &src, 0, "src") < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(index_obj, &index, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&index);
        return NULL;
    }
    const Py_ssize_t n = index.len / 8;
    int otype = buffer_type(&out);
    const char *fault = NULL;
    if (src.ndim != 3 || buffer_type(&index) != T_I64) {
        fault = "src must be 3-D and index int64";
    } else if (otype < 0 || out.len != n * src.shape[1] * src.shape[2] * out.itemsize) {
        fault = "out must be an integer array of shape (len(index), layers, top_k)";
    }
    const int64_t *idx = (const int64_t *)index.buf;
    Py_ssize_t i;
    for (i = 0; !fault && i < n; i++) {
        if (idx[i] < -1 || idx[i] >= src.shape[0]) {
            fault = "index holds a row outside [-1, rows)";
        }
    }
    if (fault) {
        PyErr_SetString(PyExc_IndexError, fault);
        PyBuffer_Release(&src);
        PyBuffer_Release(&index);
        PyBuffer_Release(&out);
        return NULL;
    }
    const Py_ssize_t L = src.shape[1], K = src.shape[2], osz = out.itemsize;
    const Py_ssize_t s0 = src.strides[0], s1 = src.strides[1], s2 = src.strides[2];
    const int stype = buffer_type(&src);
    const int row_contig = s2 == src.itemsize && s1 == K * src.itemsize;
    uint64_t pads = 0;
    char *o = (char *)out.buf;
    int64_t *padrow = NULL;
    if (num_experts && !(padrow = malloc((size_t)(K ? K : 1) * sizeof(int64_t)))) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&index);
        PyBuffer_Release(&out);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < n; i++, o += L * K * osz) {
        if (idx[i] >= 0) {
            const char *s = (const char *)src.buf + idx[i] * s0;
            if (row_contig && stype == otype) {
                memcpy(o, s, (size_t)(L * K * osz));
            } else if (row_contig) {
                conv_table[stype][otype](s, src.itemsize, o, L * K);
            } else {
                Py_ssize_t l;
                for (l = 0; l < L; l++) {
                    conv_table[stype][otype](s + l * s1, s2, o + l * K * osz, K);
                }
            }
            continue;
        }
        Py_ssize_t l, j;
        if (padrow) {
            const uint64_t p = pad_start + pads;
            for (j = 0; j < K; j++) {
                padrow[j] = (int64_t)((p * (uint64_t)K + (uint64_t)j) % num_experts);
            }
            for (l = 0; l < L; l++) {
                conv_table[T_I64][otype]((const char *)padrow, 8, o + l * K * osz, K);
            }
        } else {
            for (j = 0; j < L * K; j++) {
                conv_table[T_I64][otype]((const char *)&fill, 8, o + j * osz, 1);
            }
        }
        pads++;
    }
    free(padrow);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&index);
    PyBuffer_Release(&out);
    return PyLong_FromUnsignedLongLong(pads);
}

PyDoc_STRVAR(b64decode_doc, "b64decode(text, out) -> int\n\n"
"Decode canonical base64 (str or bytes-like; RFC 4648 alphabet, length a multiple of 4,\n"
"'=' padding only at the end) into the writable bytes out. Returns the bytes written,\n"
"or -1 if the text is not canonical base64 or out is too small (nothing is raised:\n"
"the caller asks binascii for the exact verdict).");

static PyObject *py_b64decode(PyObject *self, PyObject *args) {
    PyObject *text, *out_obj;
    Py_buffer in, out;
    const uint8_t *s;
    Py_ssize_t n, got;
    int have_in = 0;
    if (!PyArg_ParseTuple(args, "OO", &text, &out_obj)) {
        return NULL;
    }
    if (PyUnicode_Check(text)) {
        s = (const uint8_t *)PyUnicode_AsUTF8AndSize(text, &n);
        if (!s) {
            return NULL;
        }
    } else {
        if (get_bytes_buffer(text, &in) < 0) {
            return NULL;
        }
        have_in = 1;
        s = (const uint8_t *)in.buf;
        n = in.len;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        if (have_in) PyBuffer_Release(&in);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    got = b64_decode(s, n, (uint8_t *)out.buf, out.len);
    Py_END_ALLOW_THREADS
    if (have_in) PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(got);
}

PyDoc_STRVAR(b64size_doc, "b64_decoded_size(text) -> int\n\n"
"Bytes that canonical base64 text decodes to (from its length and padding), or -1.");

static PyObject *py_b64size(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_buffer in;
    const uint8_t *s;
    Py_ssize_t n, size;
    if (!PyArg_ParseTuple(args, "O", &text)) {
        return NULL;
    }
    if (PyUnicode_Check(text)) {
        s = (const uint8_t *)PyUnicode_AsUTF8AndSize(text, &n);
        if (!s) {
            PyErr_Clear();
            return PyLong_FromLong(-1);
        }
        return PyLong_FromSsize_t(b64_decoded_size(s, n));
    }
    if (get_bytes_buffer(text, &in) < 0) {
        return NULL;
    }
    size = b64_decoded_size((const uint8_t *)in.buf, in.len);
    PyBuffer_Release(&in);
    return PyLong_FromSsize_t(size);
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, value=0) -> int\n\nCRC-32C of data, extending value.");

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    PyObject *obj;
    unsigned long value = 0;
    Py_buffer b;
    uint32_t crc;
    if (!PyArg_ParseTuple(args, "O|k", &obj, &value) || get_bytes_buffer(obj, &b) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    crc = crc32c_extend((uint32_t)value, (const uint8_t *)b.buf, (size_t)b.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(simd_doc, "simd() -> str\n\n'avx2' when the AVX2/BMI2 kernels run, else 'scalar'.");

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(use_avx2 ? "avx2" : "scalar");
}

PyDoc_STRVAR(cpu_doc, "cpu_features() -> dict\n\nWhat the CPU reports (x86: avx2, bmi2, sse4.2).");

static PyObject *py_cpu_features(PyObject *self, PyObject *unused) {
    int avx2 = 0, bmi2 = 0, sse42 = 0;
#ifdef R3_X86
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") != 0;
    bmi2 = __builtin_cpu_supports("bmi2") != 0;
    sse42 = __builtin_cpu_supports("sse4.2") != 0;
#endif
    return Py_BuildValue("{s:O,s:O,s:O}", "avx2", avx2 ? Py_True : Py_False, "bmi2", bmi2 ? Py_True : Py_False,
                         "sse4.2", sse42 ? Py_True : Py_False);
}

PyDoc_STRVAR(set_simd_doc, "set_simd(level) -> str\n\n"
"Use 'avx2' (only where the CPU has it; with SSE4.2 CRC-32C) or 'scalar' kernels (the\n"
"portable C, table CRC-32C included); returns the previous level.\n"
"For tests and benchmarks: both levels compute the same function.");

static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    const char *level;
    int prev = use_avx2;
    if (!PyArg_ParseTuple(args, "s", &level)) {
        return NULL;
    }
    if (strcmp(level, "scalar") == 0) {
        use_avx2 = 0;
        use_sse42 = 0; /* the table CRC-32C too: "scalar" is the portable code, all of it */
    } else if (strcmp(level, "avx2") == 0) {
        int ok = 0;
#ifdef R3_X86
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
#endif
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "this CPU has no AVX2/BMI2");
            return NULL;
        }
        use_avx2 = 1;
#ifdef R3_X86
        use_sse42 = __builtin_cpu_supports("sse4.2") != 0;
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "level must be 'avx2' or 'scalar', got '%s'", level);
        return NULL;
    }
    return PyUnicode_FromString(prev ? "avx2" : "scalar");
}

static PyMethodDef methods[] = {
    {"pack", py_pack, METH_VARARGS, pack_doc},
    {"unpack", py_unpack, METH_VARARGS, unpack_doc},
    {"encode_frame", py_encode_frame, METH_VARARGS, encode_frame_doc},
    {"check_frame", py_check_frame, METH_VARARGS, check_frame_doc},
    {"check_routes", py_check_routes, METH_VARARGS, check_routes_doc},
    {"gather_rows", py_gather_rows, METH_VARARGS, gather_rows_doc},
    {"decode_frames", py_decode_frames, METH_VARARGS, decode_frames_doc},
    {"b64decode", py_b64decode, METH_VARARGS, b64decode_doc},
    {"b64_decoded_size", py_b64size, METH_VARARGS, b64size_doc},
    {"crc32c", py_crc32c, METH_VARARGS, crc32c_doc},
    {"simd", py_simd, METH_NOARGS, simd_doc},
    {"set_simd", py_set_simd, METH_VARARGS, set_simd_doc},
    {"cpu_features", py_cpu_features, METH_NOARGS, cpu_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Compiled kernels of r3store (bit-packing, frames, route checks, row gather, base64).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    crc_init_tables();
    b64_init();
#ifdef R3_X86
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
    use_sse42 = __builtin_cpu_supports("sse4.2") != 0;
#endif
    return PyModule_Create(&module);
}
