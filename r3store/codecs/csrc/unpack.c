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

/*
 * AVX-512 (F, BW, VBMI): 16 ids a step from the 2 * bits bytes that hold them: a plain
 * 32-byte load where it stays inside the payload, else a masked load of exactly those
 * bytes (so every whole step runs here; the masked load alone ran 1.4x slower than AVX2
 * when the payload streamed from memory, the plain one is not slower). Each 32-bit lane
 * gathers the 4 bytes holding its id (vpermb), shifts it down (vpsrlvd) and masks; 2- and
 * 1-byte outputs truncate (vpmovdw/vpmovdb), as the cast of the other paths does. Widths
 * 1..15 (8 goes to the widen). Off unless the CPU has the three extensions and the AVX2
 * kernels are on; set_avx512() turns it off for tests and benchmarks.
 */
static int unpack512 = -1; /* -1: not decided yet (the first unpack asks the CPU) */

static int avx512_on(void) {
    if (unpack512 < 0) {
        int ok = 0;
#ifdef R3_X86
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
             && __builtin_cpu_supports("avx512vbmi");
#endif
        unpack512 = ok;
    }
    return unpack512 && use_avx2;
}

#ifdef R3_X86
#define R3_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vbmi,avx2,bmi,bmi2")))

typedef struct {
    __m512i idx, shift, mask;
    __mmask64 load;
} unpack512_t;

R3_TARGET_AVX512 static unpack512_t unpack512_setup(int bits, int osize) {
    uint8_t idx[64];
    uint32_t shifts[16];
    int i, k;
    for (i = 0; i < 16; i++) {
        const int first = (i * bits) >> 3;
        shifts[i] = (uint32_t)((i * bits) & 7);
        for (k = 0; k < 4; k++) {
            idx[i * 4 + k] = (uint8_t)(first + k < 2 * bits ? first + k : 0); /* bytes past the step: masked off */
        }
    }
    unpack512_t u;
    u.idx = _mm512_loadu_si512(idx);
    u.shift = _mm512_loadu_si512(shifts);
    u.mask = _mm512_set1_epi32(((1 << bits) - 1) & (osize == 1 ? 0xFF : 0xFFFF));
    u.load = (__mmask64)((1ull << (2 * bits)) - 1);
    return u;
}

R3_TARGET_AVX512 static inline __m512i unpack512_step(const unpack512_t *u, const uint8_t *p) {
    const __m512i x = _mm512_permutexvar_epi8(u->idx, _mm512_maskz_loadu_epi8(u->load, p));
    return _mm512_and_si512(_mm512_srlv_epi32(x, u->shift), u->mask);
}

/* the same from a plain 32-byte load (the caller knows 32 bytes at p exist; faster than the
   masked load when the payload streams from memory) */
R3_TARGET_AVX512 static inline __m512i unpack512_step32(const unpack512_t *u, const uint8_t *p) {
    const __m512i x = _mm512_permutexvar_epi8(u->idx, _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)));
    return _mm512_and_si512(_mm512_srlv_epi32(x, u->shift), u->mask);
}

/* a step's 16 ids (osize-byte words: 64, 32 or 16 bytes) stored at o, 16-byte aligned, with
   non-temporal 16-byte stores (write-combined into whole lines; o need not be 64-byte aligned) */
R3_TARGET_AVX512 static inline void stream_step(char *o, __m512i v, const int osize) {
    if (osize == 4) {
        _mm_stream_si128((__m128i *)(void *)o, _mm512_castsi512_si128(v));
        _mm_stream_si128((__m128i *)(void *)(o + 16), _mm512_extracti32x4_epi32(v, 1));
        _mm_stream_si128((__m128i *)(void *)(o + 32), _mm512_extracti32x4_epi32(v, 2));
        _mm_stream_si128((__m128i *)(void *)(o + 48), _mm512_extracti32x4_epi32(v, 3));
    } else if (osize == 2) {
        const __m256i w = _mm512_cvtepi32_epi16(v);
        _mm_stream_si128((__m128i *)(void *)o, _mm256_castsi256_si128(w));
        _mm_stream_si128((__m128i *)(void *)(o + 16), _mm256_extracti128_si256(w, 1));
    } else {
        _mm_stream_si128((__m128i *)(void *)o, _mm512_cvtepi32_epi8(v));
    }
}

/* the whole 16-id steps of n ids from p (plen bytes); returns the ids done (a multiple of 16);
   stream: non-temporal stores (out 16-byte aligned) */
R3_TARGET_AVX512 static Py_ssize_t unpack_avx512(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out,
                                                 int osize, int stream) {
    const unpack512_t u = unpack512_setup(bits, osize);
    const Py_ssize_t steps = n / 16;
    /* steps whose plain 32-byte load stays inside the payload */
    Py_ssize_t s, plain = plen >= 32 ? (plen - 32) / (2 * bits) + 1 : 0;
    if (plain > steps) {
        plain = steps;
    }
    if (stream) {
#define R3_STREAM_LOOP(N)                                                                                     \
    for (s = 0; s < plain; s++) stream_step(out + s * 16 * N, unpack512_step32(&u, p + s * 2 * bits), N);     \
    for (; s < steps; s++) stream_step(out + s * 16 * N, unpack512_step(&u, p + s * 2 * bits), N);
        if (osize == 4) {
            R3_STREAM_LOOP(4)
        } else if (osize == 2) {
            R3_STREAM_LOOP(2)
        } else {
            R3_STREAM_LOOP(1)
        }
#undef R3_STREAM_LOOP
        _mm_sfence();
    } else if (osize == 4) {
        for (s = 0; s < plain; s++) {
            _mm512_storeu_si512(out + s * 64, unpack512_step32(&u, p + s * 2 * bits));
        }
        for (; s < steps; s++) {
            _mm512_storeu_si512(out + s * 64, unpack512_step(&u, p + s * 2 * bits));
        }
    } else if (osize == 2) {
        for (s = 0; s < steps; s++) {
            _mm256_storeu_si256((__m256i *)(out + s * 32), _mm512_cvtepi32_epi16(unpack512_step(&u, p + s * 2 * bits)));
        }
    } else {
        for (s = 0; s < steps; s++) {
            _mm_storeu_si128((__m128i *)(out + s * 16), _mm512_cvtepi32_epi8(unpack512_step(&u, p + s * 2 * bits)));
        }
    }
    return steps * 16;
}

/*
 * unpack_rows with AVX-512: row by row, and in each row frame by frame (the frames of a
 * group sit side by side in out), whole rows of gpr groups of 8 ids; an odd last group is
 * a 16-id step with half its load masked off and half its result stored. 2- and 1-byte
 * words truncate (vpmovdw/vpmovdb). OSIZE is a constant where this is inlined.
 */
R3_TARGET_AVX512 static inline void rows_avx512(const uint8_t *const *p, const Py_ssize_t *plen, int count,
                                                Py_ssize_t rows, Py_ssize_t gpr, int bits, char *out,
                                                Py_ssize_t stride, const int osize, const int stream) {
    const unpack512_t u = unpack512_setup(bits, osize);
    unpack512_t half = u;
    half.load = (__mmask64)((1ull << bits) - 1);
    const Py_ssize_t row_bytes = gpr * bits, piece = gpr * 8 * osize;
    Py_ssize_t r, g;
    int j;
    for (r = 0; r < rows; r++) {
        for (j = 0; j < count; j++) {
            Py_ssize_t at = r * row_bytes; /* offset of the step in frame j's payload */
            char *o = out + r * stride + j * piece;
            for (g = 0; g + 2 <= gpr; g += 2, at += 2 * bits, o += 16 * osize) {
                /* a plain 32-byte load where it stays inside the payload */
                const __m512i v = at + 32 <= plen[j] ? unpack512_step32(&u, p[j] + at) : unpack512_step(&u, p[j] + at);
                if (stream) {
                    stream_step(o, v, osize);
                } else if (osize == 4) {
                    _mm512_storeu_si512(o, v);
                } else if (osize == 2) {
                    _mm256_storeu_si256((__m256i *)o, _mm512_cvtepi32_epi16(v));
                } else {
                    _mm_storeu_si128((__m128i *)o, _mm512_cvtepi32_epi8(v));
                }
            }
            if (g < gpr) {
                const __m512i v = unpack512_step(&half, p[j] + at);
                if (osize == 4) {
                    _mm512_mask_storeu_epi32(o, (__mmask16)0x00FF, v);
                } else if (osize == 2) {
                    _mm_storeu_si128((__m128i *)o, _mm256_castsi256_si128(_mm512_cvtepi32_epi16(v)));
                } else {
                    _mm_storel_epi64((__m128i *)o, _mm512_cvtepi32_epi8(v));
                }
            }
        }
    }
}

#define R3_ROWS_AVX512(N)                                                                                         \
    R3_TARGET_AVX512 static void rows_avx512_##N(const uint8_t *const *p, const Py_ssize_t *plen, int count,      \
                                                 Py_ssize_t rows, Py_ssize_t gpr, int bits, char *out,            \
                                                 Py_ssize_t stride, int stream) {                                 \
        if (stream) {                                                                                             \
            rows_avx512(p, plen, count, rows, gpr, bits, out, stride, N, 1);                                      \
            _mm_sfence();                                                                                         \
        } else {                                                                                                  \
            rows_avx512(p, plen, count, rows, gpr, bits, out, stride, N, 0);                                      \
        }                                                                                                         \
    }
R3_ROWS_AVX512(1) R3_ROWS_AVX512(2) R3_ROWS_AVX512(4)
#undef R3_ROWS_AVX512
#endif

R3_DOC(set_avx512_doc, "set_avx512(on) -> bool\n\n"
"Let the unpack kernels use AVX-512 (F, BW, VBMI) where the CPU has it (the default), or\n"
"not; returns the previous setting. It runs only while the AVX2 kernels are on (set_simd).\n"
"For tests and benchmarks: both compute the same function. ValueError when turning it on\n"
"without the CPU's support.");

PyObject *py_set_avx512(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) {
        return NULL;
    }
    (void)avx512_on(); /* decides the default */
    const int prev = unpack512;
    if (on) {
        int ok = 0;
#ifdef R3_X86
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
             && __builtin_cpu_supports("avx512vbmi");
#endif
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "this CPU has no AVX-512 F/BW/VBMI");
            return NULL;
        }
    }
    unpack512 = on;
    return PyBool_FromLong(prev);
}

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
 * Rows of 8- or 16-bit ids (each id a whole byte or word): a copy (same width) or a widen
 * or truncation per row piece, row by row and frame by frame within a row, so a group of
 * frames side by side fills each output row from left to right (the output's cache lines
 * are written once, in order, as by a memcpy, instead of a quarter of a line per frame). A
 * copied piece (n * osize bytes: a multiple of 8) is moved in fixed-size pieces, inlined:
 * a batch decode's rows are often 16 or 32 bytes.
 */
#define R3_ROWS_LOOP(BODY)                                                       \
    for (r = 0; r < rows; r++) {                                                 \
        const Py_ssize_t at = r * row_bytes;                                     \
        char *restrict o = out + r * stride;                                     \
        for (j = 0; j < count; j++, o += piece) {                                \
            const uint8_t *restrict q = p[j] + at;                               \
            BODY                                                                 \
        }                                                                        \
    }
#define R3_WIDEN_ROWS_BODY                                                                                       \
    const Py_ssize_t row_bytes = n * bytes, piece = n * osize;                                                  \
    Py_ssize_t r, i;                                                                                            \
    int j;                                                                                                      \
    if (bytes == osize && row_bytes == 16) { /* 2 layers x top-8 of uint8 */                                   \
        R3_ROWS_LOOP(memcpy(o, q, 16);)                                                                        \
    } else if (bytes == osize && row_bytes == 32) {                                                             \
        R3_ROWS_LOOP(memcpy(o, q, 32);)                                                                        \
    } else if (bytes == osize && row_bytes == 64) {                                                             \
        R3_ROWS_LOOP(memcpy(o, q, 64);)                                                                        \
    } else if (bytes == osize) {                                                                                \
        R3_ROWS_LOOP(for (i = 0; i + 32 <= row_bytes; i += 32) memcpy(o + i, q + i, 32);                        \
                     if (i + 16 <= row_bytes) { memcpy(o + i, q + i, 16); i += 16; }                           \
                     if (i + 8 <= row_bytes) { memcpy(o + i, q + i, 8); })                                     \
    } else if (bytes == 1 && osize == 2) {                                                                      \
        R3_ROWS_LOOP(uint16_t *restrict w = (uint16_t *)(void *)o; for (i = 0; i < n; i++) w[i] = q[i];)        \
    } else if (bytes == 1) {                                                                                    \
        R3_ROWS_LOOP(uint32_t *restrict w = (uint32_t *)(void *)o; for (i = 0; i < n; i++) w[i] = q[i];)        \
    } else if (osize == 4) {                                                                                    \
        R3_ROWS_LOOP(uint32_t *restrict w = (uint32_t *)(void *)o;                                              \
                     for (i = 0; i < n; i++) { uint16_t v; memcpy(&v, q + 2 * i, 2); w[i] = v; })              \
    } else {                                                                                                    \
        R3_ROWS_LOOP(for (i = 0; i < n; i++) o[i] = (char)q[2 * i];)                                           \
    }

static void widen_rows_scalar(const uint8_t *const *p, int count, Py_ssize_t rows, Py_ssize_t n, int bytes,
                              char *out, Py_ssize_t stride, int osize) {
    R3_WIDEN_ROWS_BODY
}

#ifdef R3_X86
R3_TARGET_AVX2 static void widen_rows_avx2_loops(const uint8_t *const *p, int count, Py_ssize_t rows, Py_ssize_t n,
                                                 int bytes, char *out, Py_ssize_t stride, int osize) {
    R3_WIDEN_ROWS_BODY
}

/* the widens with explicit zero-extensions, 8 ids (n is a multiple of 8) a step; the
   compiler's own vectorisation of the loops above shuffles more (measured 1.3x slower) */
R3_TARGET_AVX2 static void widen_rows_avx2(const uint8_t *const *p, int count, Py_ssize_t rows, Py_ssize_t n,
                                           int bytes, char *out, Py_ssize_t stride, int osize, int stream) {
    const Py_ssize_t row_bytes = n * bytes, piece = n * osize;
    Py_ssize_t r, i;
    int j;
    if (stream && bytes == osize && (uintptr_t)out % 16 == 0 && stride % 16 == 0 && row_bytes % 16 == 0) {
        /* copies with non-temporal 16-byte stores (a group's pieces fill each output line in
           order, so the write-combining buffers send whole lines) */
        R3_ROWS_LOOP(for (i = 0; i < row_bytes; i += 16) _mm_stream_si128((__m128i *)(void *)(o + i),
                                                                           _mm_loadu_si128((const __m128i *)(q + i)));)
        _mm_sfence();
    } else if (stream && bytes == 1 && osize == 2 && (uintptr_t)out % 16 == 0 && stride % 16 == 0) { /* piece: 2 n */
        R3_ROWS_LOOP(for (i = 0; i < n; i += 8) _mm_stream_si128((__m128i *)(void *)(o + 2 * i),
                                                                 _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + i))));)
        _mm_sfence();
    } else if (stream && bytes == 1 && osize == 4 && (uintptr_t)out % 32 == 0 && stride % 32 == 0) { /* piece: 32 n bytes */
        R3_ROWS_LOOP(for (i = 0; i < n; i += 8) _mm256_stream_si256((__m256i *)(void *)(o + 4 * i),
                                                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));)
        _mm_sfence();
    } else if (bytes == 1 && osize == 4) {
        R3_ROWS_LOOP(for (i = 0; i < n; i += 8) _mm256_storeu_si256((__m256i *)(void *)(o + 4 * i),
                                                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));)
    } else if (bytes == 1 && osize == 2) {
        R3_ROWS_LOOP(for (i = 0; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(void *)(o + 2 * i),
                                                                           _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(q + i))));
                     if (i < n) _mm_storeu_si128((__m128i *)(void *)(o + 2 * i),
                                                 _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(q + i))));)
    } else if (bytes == 2 && osize == 4) {
        R3_ROWS_LOOP(for (i = 0; i < n; i += 8) _mm256_storeu_si256((__m256i *)(void *)(o + 4 * i),
                                                                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(q + 2 * i))));)
    } else {
        widen_rows_avx2_loops(p, count, rows, n, bytes, out, stride, osize);
    }
}
#endif
#undef R3_WIDEN_ROWS_BODY
#undef R3_ROWS_LOOP

/*
 * Unpack the rows of count frames (a group side by side in out; out_bytes: the size of the
 * whole output, which chooses non-temporal stores as for unpack_contig): frame j's payload is
 * p[j] (plen[j] bytes), `rows` rows of gpr * 8 ids each (each row gpr * bits bytes, back to
 * back), and row r of frame j lands at out + r * stride + j * gpr * 8 * osize (stride in
 * bytes) as osize-byte words (1, 2 or 4; truncated like a cast). Widths 8 and 16 copy or
 * widen; the others run the AVX-512 kernel row by row across the frames, else AVX2 (4-byte
 * words) or unpack_contig frame by frame.
 */
void unpack_rows(const uint8_t *const *p, const Py_ssize_t *plen, int count, Py_ssize_t rows, Py_ssize_t gpr,
                 int bits, char *out, Py_ssize_t stride, int osize, Py_ssize_t out_bytes) {
    const int stream = out_bytes >= stream_from();
    if (bits == 8 || bits == 16) {
#ifdef R3_X86
        if (use_avx2) {
            widen_rows_avx2(p, count, rows, gpr * 8, bits / 8, out, stride, osize, stream);
            return;
        }
#endif
        widen_rows_scalar(p, count, rows, gpr * 8, bits / 8, out, stride, osize);
        return;
    }
#ifdef R3_X86
    if (avx512_on()) {
        /* non-temporal 16-byte stores need every piece 16-byte aligned (a piece is 8 gpr osize bytes) */
        const int aligned = (uintptr_t)out % 16 == 0 && stride % 16 == 0 && gpr * 8 * osize % 16 == 0;
        (osize == 4 ? rows_avx512_4 : osize == 2 ? rows_avx512_2 : rows_avx512_1)(p, plen, count, rows, gpr, bits, out,
                                                                                  stride, stream && aligned);
        return;
    }
#endif
    const Py_ssize_t row_bytes = gpr * bits, width = gpr * 8, piece = width * osize;
    int j;
    for (j = 0; j < count; j++) {
        Py_ssize_t r = 0;
#ifdef R3_X86
        if (use_avx2 && osize == 4 && stride % 4 == 0) {
            r = unpack_rows4_avx2(p[j], plen[j], rows, gpr, bits, (uint32_t *)(void *)(out + j * piece), stride / 4);
        }
#endif
        for (; r < rows; r++) {
            unpack_contig(p[j] + r * row_bytes, plen[j] - r * row_bytes, width, bits, out + r * stride + j * piece,
                          osize);
        }
    }
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
 * Non-temporal stores for large outputs: a decode whose output is at least stream_min bytes
 * (by default the size of the last-level cache: such an output cannot stay in it anyway)
 * writes it with streaming stores, which skip reading each line of out before writing it
 * (the read-for-ownership of a plain store) and leave the cache to the payload; smaller
 * outputs keep plain stores (whoever reads them next finds them in the cache).
 * set_stream_min() changes it (tests run every path with 0).
 */
static Py_ssize_t stream_min = -1; /* -1: not decided yet */

static Py_ssize_t llc_bytes(void) {
    Py_ssize_t size = 0;
#ifdef __linux__
    FILE *fh = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r"); /* one instance, e.g. "32768K" */
    if (fh) {
        long long v = 0;
        char unit = 0;
        if (fscanf(fh, "%lld%c", &v, &unit) >= 1 && v > 0) {
            size = (Py_ssize_t)(unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v);
        }
        fclose(fh);
    }
#endif
    return size > 0 ? size : (Py_ssize_t)32 << 20;
}

Py_ssize_t stream_from(void) {
    if (stream_min < 0) {
        stream_min = llc_bytes();
    }
    return stream_min;
}

R3_DOC(set_stream_min_doc, "set_stream_min(nbytes) -> int\n\n"
"Decode outputs of at least nbytes (one unpack or decode of one frame) with non-temporal\n"
"stores, where the CPU has AVX2; -1: the default, the size of one last-level cache (read\n"
"from /sys on Linux, else 32 MiB). Returns the previous threshold. For tests and\n"
"benchmarks: both kinds of store compute the same output.");

PyObject *py_set_stream_min(PyObject *self, PyObject *args) {
    Py_ssize_t nbytes;
    if (!PyArg_ParseTuple(args, "n", &nbytes)) {
        return NULL;
    }
    if (nbytes < -1) {
        PyErr_Format(PyExc_ValueError, "set_stream_min: nbytes must be >= 0, or -1 for the default, got %zd", nbytes);
        return NULL;
    }
    const Py_ssize_t prev = stream_from();
    stream_min = nbytes;
    return PyLong_FromSsize_t(prev);
}

#ifdef R3_X86
/* widen_avx2 with non-temporal 32-byte stores after a head that aligns out to 32 bytes;
   every width pair but 16 -> 8 bits (0: not done) */
R3_TARGET_AVX2 static int widen_stream_avx2(const uint8_t *p, Py_ssize_t n, int bytes, char *out, int osize) {
    if ((uintptr_t)out % (uintptr_t)osize || (bytes == 2 && osize == 1)) {
        return 0;
    }
    Py_ssize_t i = (Py_ssize_t)((32 - (uintptr_t)out % 32) % 32) / osize; /* the head */
    if (i > n) {
        i = n;
    }
    widen_avx2(p, i, bytes, out, osize);
    if (bytes == osize) {
        const Py_ssize_t nb = n * bytes;
        Py_ssize_t b = i * bytes;
        for (; b + 128 <= nb; b += 128) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(p + b));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(p + b + 32));
            const __m256i x2 = _mm256_loadu_si256((const __m256i *)(p + b + 64));
            const __m256i x3 = _mm256_loadu_si256((const __m256i *)(p + b + 96));
            _mm256_stream_si256((__m256i *)(void *)(out + b), x0);
            _mm256_stream_si256((__m256i *)(void *)(out + b + 32), x1);
            _mm256_stream_si256((__m256i *)(void *)(out + b + 64), x2);
            _mm256_stream_si256((__m256i *)(void *)(out + b + 96), x3);
        }
        for (; b + 32 <= nb; b += 32) {
            _mm256_stream_si256((__m256i *)(void *)(out + b), _mm256_loadu_si256((const __m256i *)(p + b)));
        }
        memcpy(out + b, p + b, (size_t)(nb - b));
    } else if (bytes == 1 && osize == 4) {
        for (; i + 8 <= n; i += 8) {
            _mm256_stream_si256((__m256i *)(void *)(out + 4 * i), _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + i))));
        }
        widen_avx2(p + i, n - i, 1, out + 4 * i, 4);
    } else if (bytes == 1) {
        for (; i + 16 <= n; i += 16) {
            _mm256_stream_si256((__m256i *)(void *)(out + 2 * i), _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(p + i))));
        }
        widen_avx2(p + i, n - i, 1, out + 2 * i, 2);
    } else {
        for (; i + 8 <= n; i += 8) {
            _mm256_stream_si256((__m256i *)(void *)(out + 4 * i),
                                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
        }
        widen_avx2(p + 2 * i, n - i, 2, out + 4 * i, 4);
    }
    _mm_sfence();
    return 1;
}
#endif

/*
 * Unpack n ids from p (plen bytes, at least packed_nbytes(n, bits)) into out, a
 * contiguous array of 1-, 2- or 4-byte words (values are truncated to the word).
 */
void unpack_contig(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize) {
    unpack_contig_as(p, plen, n, bits, out, osize, n * osize >= stream_from());
}

/* unpack_contig with non-temporal stores or not as stream says (a fused decode's blocks: the
   whole output's size chooses, not the block's) */
void unpack_contig_as(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize, int stream) {
    stream = stream && use_avx2;
    if ((bits == 8 && !(osize > 1 && avx512_on())) || bits == 16) {
#ifdef R3_X86
        if (stream && widen_stream_avx2(p, n, bits / 8, out, osize)) {
            return;
        }
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
    if (avx512_on()) {
        g = unpack_avx512(p, plen, n, bits, out, osize, stream && (uintptr_t)out % 16 == 0) / 8;
    } else if (use_avx2) {
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
