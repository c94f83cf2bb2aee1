/*
 * crc32c.c: CRC-32C (Castagnoli): a slicing-by-8 table, SSE4.2 crc32 (three streams),
 * PCLMULQDQ and VPCLMULQDQ/AVX-512 folding, chosen at import: crc32c(), crc_path(),
 * set_crc_path().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * CRC-32C (Castagnoli, reflected 0x82F63B78)
 * --------------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];

#define CRC_SHORT 256
#define CRC_POLY 0x82F63B78u

static uint32_t crc_short[4][256]; /* the raw register shifted over CRC_SHORT zero bytes */
static void crc_zeros(uint32_t zeros[][256], size_t len);

static void crc_init_slices(void) {
    crc_zeros(crc_short, CRC_SHORT);
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

/*
 * Three interleaved hardware streams (the crc32 instruction's latency, not its throughput,
 * bounds one stream), joined by shifting a CRC over SHORT zero bytes with a table: the
 * method and the GF(2) operator code of Mark Adler's crc32c.c (zlib licence,
 * https://stackoverflow.com/a/17646775).
 */
static uint32_t gf2_matrix_times(const uint32_t *mat, uint32_t vec) {
    uint32_t sum = 0;
    while (vec) {
        if (vec & 1) {
            sum ^= *mat;
        }
        vec >>= 1;
        mat++;
    }
    return sum;
}

static void gf2_matrix_square(uint32_t *square, const uint32_t *mat) {
    int n;
    for (n = 0; n < 32; n++) {
        square[n] = gf2_matrix_times(mat, mat[n]);
    }
}

/* The operator applying len zero bytes (a power of two) to a raw CRC register. */
static void crc_zeros_op(uint32_t *even, size_t len) {
    uint32_t odd[32], row = 1;
    int n;
    odd[0] = CRC_POLY; /* one zero bit */
    for (n = 1; n < 32; n++) {
        odd[n] = row;
        row <<= 1;
    }
    gf2_matrix_square(even, odd); /* two zero bits */
    gf2_matrix_square(odd, even); /* four zero bits */
    do {                          /* then one zero byte, two, ... */
        gf2_matrix_square(even, odd);
        len >>= 1;
        if (len == 0) {
            return;
        }
        gf2_matrix_square(odd, even);
        len >>= 1;
    } while (len);
    for (n = 0; n < 32; n++) {
        even[n] = odd[n];
    }
}

static void crc_zeros(uint32_t zeros[][256], size_t len) {
    uint32_t op[32];
    uint32_t n;
    crc_zeros_op(op, len);
    for (n = 0; n < 256; n++) {
        zeros[0][n] = gf2_matrix_times(op, n);
        zeros[1][n] = gf2_matrix_times(op, n << 8);
        zeros[2][n] = gf2_matrix_times(op, n << 16);
        zeros[3][n] = gf2_matrix_times(op, n << 24);
    }
}

static uint32_t crc_shift(uint32_t zeros[][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

#ifdef R3_X86
R3_TARGET_SSE42 static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c0 = crc, c1, c2, w0, w1, w2;
    while (n >= 3 * CRC_SHORT) {
        const uint8_t *end = p + CRC_SHORT;
        c1 = c2 = 0;
        do {
            memcpy(&w0, p, 8);
            memcpy(&w1, p + CRC_SHORT, 8);
            memcpy(&w2, p + 2 * CRC_SHORT, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            p += 8;
        } while (p < end);
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = crc_shift(crc_short, (uint32_t)c0) ^ (uint32_t)c2;
        p += 2 * CRC_SHORT;
        n -= 3 * CRC_SHORT;
    }
    while (n >= 8) {
        memcpy(&w0, p, 8);
        c0 = _mm_crc32_u64(c0, w0);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c0;
    while (n--) {
        crc = _mm_crc32_u8(crc, *p++);
    }
    return crc;
}
#endif

/*
 * Carry-less-multiply folding: the method of Intel's "Fast CRC Computation for Generic
 * Polynomials Using PCLMULQDQ Instruction" (Gopal et al., 2009), for the reflected
 * Castagnoli polynomial. The message is read as 128-bit lanes; a lane L (bytes b0..b15,
 * its low qword the first 8 bytes) is moved D bits further along the message, keeping
 * its value mod P, by
 *
 *     L' = clmul(L.lo, K(D + 32)) ^ clmul(L.hi, K(D - 32)),  K(n) = reflect32(x^n mod P) << 1
 *
 * (a clmul of two bit-reflected operands lands one bit low, hence the << 1: the form of
 * the paper's k1..k6 and of Linux's, isa-l's and zlib's constant tables). The constants
 * are computed here at import by crc_xpow() rather than copied. Four lanes fold 512 bits
 * apart (PCLMULQDQ, 64 bytes a step) or four 512-bit registers 2048 bits apart
 * (VPCLMULQDQ + AVX-512, 256 bytes a step); they are folded into one 128-bit lane, whose
 * raw CRC (two crc32 instructions from a zero register) is the CRC of everything folded,
 * the incoming register having been XORed into the first four bytes. Bytes past the last
 * whole lane go through crc_hw, and so do inputs shorter than a path's minimum (128 bytes
 * for PCLMULQDQ, 256 for VPCLMULQDQ: below them the set-up costs more than it saves).
 */
static uint32_t crc_xpow(unsigned n) { /* reflect32(x^n mod P): x^0 is bit 31 */
    uint32_t c = 0x80000000u;
    while (n--) {
        c = (c >> 1) ^ (CRC_POLY & (0u - (c & 1u)));
    }
    return c;
}

/* a * b mod P, both reflected like crc_xpow's (portable; import time only) */
static uint32_t crc_multmodp(uint32_t a, uint32_t b) {
    uint32_t p = 0;
    int i;
    for (i = 31; i >= 0; i--) { /* bit i of a is the coefficient of x^(31 - i) */
        if (a & (1u << i)) {
            p ^= b;
        }
        b = (b >> 1) ^ (CRC_POLY & (0u - (b & 1u))); /* b *= x */
    }
    return p;
}

/* fold constants {lo qword: K(D + 32), hi qword: K(D - 32)} for D = 128, 256, 384, 512, 2048 */
static uint64_t crc_k[5][2];
enum { K128, K256, K384, K512, K2048 };

/* crc_q[i] = x^(2^i - 33) mod P for i >= 6 (see crc_mulq) */
#define CRC_Q_MIN 6
#define CRC_Q_MAX 48
static uint32_t crc_q[CRC_Q_MAX];

static void crc_init_fold(void) {
    static const unsigned dist[5] = {128, 256, 384, 512, 2048};
    int i;
    for (i = 0; i < 5; i++) {
        crc_k[i][0] = (uint64_t)crc_xpow(dist[i] + 32) << 1;
        crc_k[i][1] = (uint64_t)crc_xpow(dist[i] - 32) << 1;
    }
    uint32_t x2 = crc_xpow(1u << CRC_Q_MIN); /* x^(2^(i-1)) at step i */
    crc_q[CRC_Q_MIN] = crc_xpow((1u << CRC_Q_MIN) - 33);
    for (i = CRC_Q_MIN + 1; i < CRC_Q_MAX; i++) {
        crc_q[i] = crc_multmodp(crc_q[i - 1], x2);
        x2 = crc_multmodp(x2, x2);
    }
}

#ifdef R3_X86
#define R3_TARGET_PCLMUL __attribute__((target("pclmul,sse4.2")))
#define R3_TARGET_VPCLMUL __attribute__((target("avx512f,avx512bw,vpclmulqdq,pclmul,sse4.2")))

#define CRC_FOLD_MIN 128    /* shorter inputs: the crc32 instruction alone */
#define CRC_FOLD512_MIN 256 /* shorter inputs: the crc32 instruction alone */

R3_TARGET_PCLMUL static inline __m128i fold128(__m128i x, __m128i k, __m128i next) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

R3_TARGET_PCLMUL static inline __m128i kvec(int which) {
    return _mm_set_epi64x((long long)crc_k[which][1], (long long)crc_k[which][0]);
}

/* from one 128-bit lane (all the folded message) and the bytes after it to the raw CRC */
R3_TARGET_PCLMUL static uint32_t crc_lane_finish(__m128i x, const uint8_t *p, size_t n) {
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return crc_hw((uint32_t)c, p, n);
}

/* 128-bit lanes until fewer than 16 bytes are left, then the finish; x covers the bytes before p */
R3_TARGET_PCLMUL static uint32_t crc_lane_tail(__m128i x, const uint8_t *p, size_t n) {
    const __m128i k1 = kvec(K128);
    while (n >= 16) {
        x = fold128(x, k1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    return crc_lane_finish(x, p, n);
}

/* n >= 64 */
R3_TARGET_PCLMUL static uint32_t crc_pclmul(uint32_t crc, const uint8_t *p, size_t n) {
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    const __m128i k4 = kvec(K512), k1 = kvec(K128);
    p += 64;
    n -= 64;
    while (n >= 64) {
        x0 = fold128(x0, k4, _mm_loadu_si128((const __m128i *)p));
        x1 = fold128(x1, k4, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = fold128(x2, k4, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = fold128(x3, k4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x1 = fold128(x0, k1, x1);
    x2 = fold128(x1, k1, x2);
    x3 = fold128(x2, k1, x3);
    return crc_lane_tail(x3, p, n);
}

R3_TARGET_VPCLMUL static inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                     0x96); /* a ^ b ^ c */
}

/* n >= 256 */
R3_TARGET_VPCLMUL static uint32_t crc_vpclmul(uint32_t crc, const uint8_t *p, size_t n) {
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128);
    __m512i x3 = _mm512_loadu_si512(p + 192);
    const __m512i k16 = _mm512_broadcast_i32x4(kvec(K2048)), k4 = _mm512_broadcast_i32x4(kvec(K512));
    p += 256;
    n -= 256;
    while (n >= 256) {
        x0 = fold512(x0, k16, _mm512_loadu_si512(p));
        x1 = fold512(x1, k16, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, k16, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, k16, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    x1 = fold512(x0, k4, x1);
    x2 = fold512(x1, k4, x2);
    x3 = fold512(x2, k4, x3);
    while (n >= 64) {
        x3 = fold512(x3, k4, _mm512_loadu_si512(p));
        p += 64;
        n -= 64;
    }
    /* the four lanes of x3 are 384, 256, 128 and 0 bits from its end */
    __m128i x = fold128(_mm512_extracti32x4_epi32(x3, 0), kvec(K384), _mm512_extracti32x4_epi32(x3, 3));
    x = fold128(_mm512_extracti32x4_epi32(x3, 1), kvec(K256), x);
    x = fold128(_mm512_extracti32x4_epi32(x3, 2), kvec(K128), x);
    return crc_lane_tail(x, p, n);
}

/*
 * Inputs of CRC_HYBRID_MIN bytes or more: the 512-bit folding and three crc32 streams at
 * once (the carry-less multiplier and the crc32 unit are separate units; on the AMD EPYC
 * this was measured on, the folding alone is bound by the multiplies and leaves the crc32
 * unit idle: 0.016 ns per byte alone, 0.0113 with three streams of five words a step,
 * 8 KiB to 8 MiB; three or eight words: 0.013-0.015). Each step folds 256 bytes at the
 * front and takes CRC_HYBRID_WORDS words from each of three streams that share the back
 * of the input; the four register values are then joined, each shifted over the bytes
 * after it by a multiplication by x^(8m) mod P (crc_mulq), and the bytes after the last
 * whole step go through crc_hw.
 */
#define CRC_HYBRID_WORDS 5
#define CRC_HYBRID_MIN 8192

/* a * x^(e + 33) mod P for q = x^e mod P: one carry-less multiply, then the crc32
   instruction reduces the 64-bit product (its register update is a multiplication by x^32,
   and the reflected product lands one bit low) */
R3_TARGET_PCLMUL static inline uint32_t crc_mulq(uint32_t a, uint32_t q) {
    const __m128i r = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a), _mm_cvtsi32_si128((int)q), 0x00);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
}

/* x^(8 len - 33) mod P, len a positive multiple of 8 below 2^44 */
R3_TARGET_PCLMUL static uint32_t crc_qpow(uint64_t len) {
    uint64_t e = len * 8;
    uint32_t q = crc_q[__builtin_ctzll(e)];
    for (e &= e - 1; e; e &= e - 1) {
        q = crc_mulq(q, crc_q[__builtin_ctzll(e)]); /* x^(a - 33) x^(b - 33) x^33 */
    }
    return q;
}

R3_TARGET_VPCLMUL static uint32_t crc_hybrid(uint32_t crc, const uint8_t *p, size_t n) {
    const size_t step = 256 + 3 * 8 * CRC_HYBRID_WORDS, it = n / step, m = it * 8 * CRC_HYBRID_WORDS;
    const uint8_t *s = p + it * 256; /* stream 1; 2 and 3 follow it, m bytes apart */
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = _mm512_loadu_si512(p + 64);
    __m512i x2 = _mm512_loadu_si512(p + 128);
    __m512i x3 = _mm512_loadu_si512(p + 192);
    const __m512i k16 = _mm512_broadcast_i32x4(kvec(K2048)), k4 = _mm512_broadcast_i32x4(kvec(K512));
    uint64_t c1 = 0, c2 = 0, c3 = 0, w1, w2, w3;
    size_t i;
    int j;
    for (i = 1; i <= it; i++) {
        if (i < it) {
            const uint8_t *q = p + i * 256;
            x0 = fold512(x0, k16, _mm512_loadu_si512(q));
            x1 = fold512(x1, k16, _mm512_loadu_si512(q + 64));
            x2 = fold512(x2, k16, _mm512_loadu_si512(q + 128));
            x3 = fold512(x3, k16, _mm512_loadu_si512(q + 192));
        }
        for (j = 0; j < CRC_HYBRID_WORDS; j++, s += 8) {
            memcpy(&w1, s, 8);
            memcpy(&w2, s + m, 8);
            memcpy(&w3, s + 2 * m, 8);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            c3 = _mm_crc32_u64(c3, w3);
        }
    }
    x1 = fold512(x0, k4, x1);
    x2 = fold512(x1, k4, x2);
    x3 = fold512(x2, k4, x3);
    __m128i x = fold128(_mm512_extracti32x4_epi32(x3, 0), kvec(K384), _mm512_extracti32x4_epi32(x3, 3));
    x = fold128(_mm512_extracti32x4_epi32(x3, 1), kvec(K256), x);
    x = fold128(_mm512_extracti32x4_epi32(x3, 2), kvec(K128), x);
    uint32_t c = crc_lane_finish(x, p, 0); /* the raw CRC of the front it * 256 bytes */
    const uint32_t km = crc_qpow(m);
    c = crc_mulq(c, km) ^ (uint32_t)c1;
    c = crc_mulq(c, km) ^ (uint32_t)c2;
    c = crc_mulq(c, km) ^ (uint32_t)c3;
    return crc_hw(c, p + it * step, n - it * step);
}
#endif

/* ---------------------------------------------------------------------------------
 * the path chosen at import (set_crc_path changes it)
 * --------------------------------------------------------------------------------- */

int crc_path = CRC_PATH_TABLE;

static const char *const crc_path_names[CRC_PATH_COUNT] = {"table", "sse4.2", "pclmul", "avx512"};

static int crc_path_supported(int path) {
#ifdef R3_X86
    __builtin_cpu_init();
    const int sse42 = __builtin_cpu_supports("sse4.2") != 0;
    const int pclmul = sse42 && __builtin_cpu_supports("pclmul");
    switch (path) {
    case CRC_PATH_TABLE: return 1;
    case CRC_PATH_SSE42: return sse42;
    case CRC_PATH_PCLMUL: return pclmul;
    case CRC_PATH_AVX512:
        return pclmul && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
               && __builtin_cpu_supports("vpclmulqdq");
    default: return 0;
    }
#else
    return path == CRC_PATH_TABLE;
#endif
}

/*
 * 'avx512' where the CPU has it, else 'sse4.2', else 'table'. 'pclmul' is never chosen by
 * itself: on the AMD EPYC this was measured on, the 128-bit folding ran at 0.115 ns
 * per byte, the three crc32 streams at 0.043 and the 512-bit folding at 0.016 (8 MiB, one
 * thread, in cache).
 */
int crc_best_path(void) {
    if (crc_path_supported(CRC_PATH_AVX512)) {
        return CRC_PATH_AVX512;
    }
    return crc_path_supported(CRC_PATH_SSE42) ? CRC_PATH_SSE42 : CRC_PATH_TABLE;
}

void crc_init_tables(void) {
    crc_init_slices();
    crc_init_fold();
}

uint32_t crc32c_extend(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t crc = ~value;
#ifdef R3_X86
    switch (crc_path) {
    case CRC_PATH_AVX512:
        if (n >= CRC_HYBRID_MIN) {
            return ~crc_hybrid(crc, p, n);
        }
        return ~(n >= CRC_FOLD512_MIN ? crc_vpclmul(crc, p, n) : crc_hw(crc, p, n));
    case CRC_PATH_PCLMUL:
        return ~(n >= CRC_FOLD_MIN ? crc_pclmul(crc, p, n) : crc_hw(crc, p, n));
    case CRC_PATH_SSE42:
        return ~crc_hw(crc, p, n);
    default:
        break;
    }
#endif
    return ~crc_sw(crc, p, n);
}

R3_DOC(crc_path_doc, "crc_path() -> str\n\n"
"The CRC-32C code in use: 'avx512' (VPCLMULQDQ folding of 4 x 512 bits, with three\n"
"crc32 instruction streams alongside from 8 KiB), 'pclmul'\n"
"(PCLMULQDQ folding of 4 x 128 bits), 'sse4.2' (three crc32 instruction streams) or\n"
"'table' (slicing-by-8). The folding paths hand inputs under 256 (avx512) or 128 bytes\n"
"(pclmul) and the bytes after the last 16-byte lane to the crc32 instruction.");

PyObject *py_crc_path(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(crc_path_names[crc_path]);
}

R3_DOC(set_crc_path_doc, "set_crc_path(path) -> str\n\n"
"Use the CRC-32C code path ('avx512', 'pclmul', 'sse4.2', 'table', or 'best': the\n"
"fastest this CPU has); returns the previous one. ValueError when the CPU lacks it.\n"
"For tests and benchmarks: every path computes the same function. set_simd() also\n"
"sets it ('scalar': 'table'; 'avx2': 'best').");

PyObject *py_set_crc_path(PyObject *self, PyObject *args) {
    const char *name;
    int path, prev = crc_path;
    if (!PyArg_ParseTuple(args, "s", &name)) {
        return NULL;
    }
    if (strcmp(name, "best") == 0) {
        path = crc_best_path();
    } else {
        for (path = 0; path < CRC_PATH_COUNT && strcmp(name, crc_path_names[path]) != 0; path++) {
        }
        if (path == CRC_PATH_COUNT) {
            PyErr_Format(PyExc_ValueError, "CRC-32C path must be 'avx512', 'pclmul', 'sse4.2', 'table' or 'best', "
                         "got '%s'", name);
            return NULL;
        }
        if (!crc_path_supported(path)) {
            PyErr_Format(PyExc_ValueError, "this CPU cannot run the '%s' CRC-32C path", name);
            return NULL;
        }
    }
    crc_path = path;
    return PyUnicode_FromString(crc_path_names[prev]);
}

R3_DOC(crc32c_doc, "crc32c(data, value=0) -> int\n\nCRC-32C of data, extending value.");

PyObject *py_crc32c(PyObject *self, PyObject *args) {
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

/* ---------------------------------------------------------------------------------
 * CRC-32C fused with the copy or widen of byte-aligned ids (8- and 16-bit frames)
 * --------------------------------------------------------------------------------- */

/* n ids of in_bytes (1 or 2) bytes each from p, zero-extended (or copied) to osize-byte words
   at out (osize >= in_bytes); plain C */
static void widen_plain(const uint8_t *p, size_t n, int in_bytes, char *out, int osize) {
    size_t i;
    if (in_bytes == osize) {
        memcpy(out, p, n * (size_t)osize);
    } else if (in_bytes == 1 && osize == 2) {
        for (i = 0; i < n; i++) {
            const uint16_t v = p[i];
            memcpy(out + 2 * i, &v, 2);
        }
    } else if (in_bytes == 1) {
        for (i = 0; i < n; i++) {
            const uint32_t v = p[i];
            memcpy(out + 4 * i, &v, 4);
        }
    } else {
        for (i = 0; i < n; i++) {
            uint16_t w;
            memcpy(&w, p + 2 * i, 2);
            const uint32_t v = w;
            memcpy(out + 4 * i, &v, 4);
        }
    }
}

#ifdef R3_X86
/* the 64 payload bytes v, as ids of IN bytes, stored at o as OSIZE-byte words (64 * OSIZE / IN
   bytes); STREAM: non-temporal stores (o 64-byte aligned) */
#define R3_STORE64(o, v) (STREAM ? _mm512_stream_si512((void *)(o), (v)) : _mm512_storeu_si512((void *)(o), (v)))
R3_TARGET_VPCLMUL static inline void widen_store64(char *o, __m512i v, const int IN, const int OSIZE,
                                                   const int STREAM) {
    if (IN == OSIZE) {
        R3_STORE64(o, v);
    } else if (IN == 1 && OSIZE == 2) {
        R3_STORE64(o, _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v)));
        R3_STORE64(o + 64, _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1)));
    } else if (IN == 1) {
        R3_STORE64(o, _mm512_cvtepu8_epi32(_mm512_castsi512_si128(v)));
        R3_STORE64(o + 64, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 1)));
        R3_STORE64(o + 128, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 2)));
        R3_STORE64(o + 192, _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(v, 3)));
    } else {
        R3_STORE64(o, _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)));
        R3_STORE64(o + 64, _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)));
    }
}
#undef R3_STORE64

/*
 * The 512-bit folding of crc_vpclmul on the very loads that the copy or widen stores: every
 * payload byte is read once. nb >= 256 payload bytes; the raw register crc extended over them
 * is returned. The folding keeps the four 512-bit registers of crc_vpclmul (256 bytes a step).
 */
R3_TARGET_VPCLMUL static inline uint32_t crc_widen_body(uint32_t crc, const uint8_t *p, size_t nb, char *out,
                                                        const int IN, const int OSIZE, const int STREAM) {
    const size_t ex = (size_t)(OSIZE / IN); /* output bytes per payload byte */
    __m512i v0 = _mm512_loadu_si512(p), v1 = _mm512_loadu_si512(p + 64), v2 = _mm512_loadu_si512(p + 128),
            v3 = _mm512_loadu_si512(p + 192);
    widen_store64(out, v0, IN, OSIZE, STREAM);
    widen_store64(out + 64 * ex, v1, IN, OSIZE, STREAM);
    widen_store64(out + 128 * ex, v2, IN, OSIZE, STREAM);
    widen_store64(out + 192 * ex, v3, IN, OSIZE, STREAM);
    __m512i x0 = _mm512_xor_si512(v0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = v1, x2 = v2, x3 = v3;
    const __m512i k16 = _mm512_broadcast_i32x4(kvec(K2048)), k4 = _mm512_broadcast_i32x4(kvec(K512));
    size_t at = 256;
    for (; at + 256 <= nb; at += 256) {
        v0 = _mm512_loadu_si512(p + at);
        v1 = _mm512_loadu_si512(p + at + 64);
        v2 = _mm512_loadu_si512(p + at + 128);
        v3 = _mm512_loadu_si512(p + at + 192);
        x0 = fold512(x0, k16, v0);
        x1 = fold512(x1, k16, v1);
        x2 = fold512(x2, k16, v2);
        x3 = fold512(x3, k16, v3);
        widen_store64(out + at * ex, v0, IN, OSIZE, STREAM);
        widen_store64(out + (at + 64) * ex, v1, IN, OSIZE, STREAM);
        widen_store64(out + (at + 128) * ex, v2, IN, OSIZE, STREAM);
        widen_store64(out + (at + 192) * ex, v3, IN, OSIZE, STREAM);
    }
    x1 = fold512(x0, k4, x1);
    x2 = fold512(x1, k4, x2);
    x3 = fold512(x2, k4, x3);
    for (; at + 64 <= nb; at += 64) {
        v0 = _mm512_loadu_si512(p + at);
        x3 = fold512(x3, k4, v0);
        widen_store64(out + at * ex, v0, IN, OSIZE, STREAM);
    }
    if (STREAM) {
        _mm_sfence();
    }
    widen_plain(p + at, (nb - at) / (size_t)IN, IN, out + at * ex, OSIZE);
    __m128i x = fold128(_mm512_extracti32x4_epi32(x3, 0), kvec(K384), _mm512_extracti32x4_epi32(x3, 3));
    x = fold128(_mm512_extracti32x4_epi32(x3, 1), kvec(K256), x);
    x = fold128(_mm512_extracti32x4_epi32(x3, 2), kvec(K128), x);
    return crc_lane_tail(x, p + at, nb - at);
}

#define R3_CRC_WIDEN(IN, OSIZE)                                                                                   \
    R3_TARGET_VPCLMUL static uint32_t crc_widen_##IN##_##OSIZE(uint32_t crc, const uint8_t *p, size_t nb,        \
                                                               char *out, int stream) {                          \
        return stream ? crc_widen_body(crc, p, nb, out, IN, OSIZE, 1) : crc_widen_body(crc, p, nb, out, IN, OSIZE, 0); \
    }
R3_CRC_WIDEN(1, 1) R3_CRC_WIDEN(1, 2) R3_CRC_WIDEN(1, 4) R3_CRC_WIDEN(2, 2) R3_CRC_WIDEN(2, 4)
#undef R3_CRC_WIDEN
#endif

int crc_widen_supported(void) {
#ifdef R3_X86
    return crc_path == CRC_PATH_AVX512 && use_avx2;
#else
    return 0;
#endif
}

/*
 * CRC-32C of the n * in_bytes payload bytes at p (extending value, as crc32c_extend) while
 * they are copied or zero-extended to n osize-byte words at out (in_bytes 1 or 2, osize >=
 * in_bytes): one read of each byte. Needs crc_widen_supported() (the caller falls back
 * otherwise). stream: non-temporal stores (used only when out lines up to 64 bytes after a
 * head of plain stores).
 */
uint32_t crc32c_widen(uint32_t value, const uint8_t *p, size_t n, int in_bytes, char *out, int osize, int stream) {
    uint32_t crc = ~value;
#ifdef R3_X86
    size_t nb = n * (size_t)in_bytes, head = 0;
    if (stream) { /* plain stores until out is 64-byte aligned (whole ids; else no streaming) */
        const size_t mis = (size_t)((64 - (uintptr_t)out % 64) % 64);
        if (mis % (size_t)osize) {
            stream = 0;
        } else {
            head = mis / (size_t)osize * (size_t)in_bytes;
        }
    }
    if (nb < 256 + head) {
        widen_plain(p, n, in_bytes, out, osize);
        return ~crc_hw(crc, p, nb);
    }
    if (head) {
        widen_plain(p, head / (size_t)in_bytes, in_bytes, out, osize);
        crc = crc_hw(crc, p, head);
        out += head / (size_t)in_bytes * (size_t)osize;
        p += head;
        nb -= head;
    }
    uint32_t (*fn)(uint32_t, const uint8_t *, size_t, char *, int) =
        in_bytes == 1 ? (osize == 1 ? crc_widen_1_1 : osize == 2 ? crc_widen_1_2 : crc_widen_1_4)
                      : (osize == 2 ? crc_widen_2_2 : crc_widen_2_4);
    return ~fn(crc, p, nb, out, stream);
#else
    (void)stream;
    widen_plain(p, n, in_bytes, out, osize);
    return ~crc_sw(crc, p, n * (size_t)in_bytes);
#endif
}

int crc_avx512_cpu(void) { return crc_path_supported(CRC_PATH_AVX512); }
