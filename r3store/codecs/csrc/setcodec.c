/*
 * setcodec.c: r3store.set frames (schema/FORMAT.md 5.2): set_encode(), set_check(), set_decode().
 *
 * A row of k ids is one digit in [0, R): the colex rank sum_i C(c_i, i) of its ids sorted
 * ascending (a set of k distinct ids below E), C(E, k) for the all-zero row (k >= 2), or
 * no digit (an exception row, stored verbatim). m digits form a block, the mixed-radix
 * value sum_j d_j R**j in bit_length(R**m - 1) bits. r3store/codecs/_set_numpy.py is the
 * reference; the test suite checks both give the same bytes and ids.
 *
 * Ranks and blocks below 2**64 ("narrow") use 64-bit arithmetic; larger ones (E = 1024,
 * k = 16 needs 116 bits) unsigned __int128. Decoding a rank finds each id with a guide
 * table (the top 13 bits of the remaining rank give the id to start from; the answer is
 * that id or the next unless the entry is marked) and a short upward scan of the C(c, i)
 * table, eight rows in lockstep; for E <= 256 the last two ids come from one load of a pair
 * table (rank below C(E, 2) -> both ids), for E <= 128 the last three from a triple table.
 * Narrow blocks split into digits by a multiply (no division). A row range of a frame skips
 * the rows before it by whole blocks. With setcodec_gather_decode() on, ranks are unranked 8
 * rows per AVX-512 register with gathers instead (measured slower here; for tests).
 * Encoding with AVX-512 (F, BW; narrow codecs) ranks 32 rows at a time: a transpose, a
 * sorting network and gathers of C(c, i); on AVX2 machines (E <= 256) a row is sorted by
 * a bitmap: popcounts give each id's colex position.
 */
#include "r3k.h"

typedef unsigned __int128 u128;

#define SET_HEADER 32
#define SET_GUIDE_BITS 13 /* guide index bits up to 128 experts; SET_GUIDE_BITS_WIDE above */
#define SET_GUIDE_BITS_WIDE 16
#define SET_GUIDE_C 0x7FFF    /* a guide entry: the id to start from, */
#define SET_GUIDE_FAR 0x8000  /* and whether its bucket's answers reach beyond it + 1 */
#define SET_MAX_E 1024
#define SET_MAX_K 16
#define SET_MAX_M 64
#define SET_WIDE_BITS 120
#ifndef SET_TRIPLE_E
#define SET_TRIPLE_E 128 /* the triple table up to this many experts */
#endif

typedef struct {
    int E, k, m, bits, narrow;
    int stride;                    /* E + 2: C(c, i) for c in 0..E, then a sentinel (all ones) */
    int w[SET_MAX_M + 1];          /* bits of a block of j digits */
    u128 sets, radix;              /* C(E, k), R */
    uint64_t rinv;                 /* narrow, R >= 2: floor((2**64 - 1) / R), to divide by R with a multiply */
    u128 pow[SET_MAX_M + 1];       /* R**j */
    int gshift[SET_MAX_K + 1];     /* guide index = rank >> gshift[i] */
    int gbits;                     /* guide index bits: SET_GUIDE_BITS, SET_GUIDE_BITS_WIDE above 128 experts */
    uint16_t *guide;               /* (k + 1) x 2**gbits */
    uint64_t *c64;                 /* (k + 1) x stride: C(c, i), narrow */
    u128 *c128;                    /* the same, wide */
    uint16_t *pair;                /* narrow, 2 <= k, E <= 256: rank r < C(E, 2) -> c_2 << 8 | c_1; else NULL */
    uint32_t *triple;              /* narrow, 3 <= k, E <= SET_TRIPLE_E: rank r < C(E, 3) -> c_3 << 16 | c_2 << 8 | c_1 */
    uint16_t *tidx;                /* AVX-512 encode: k x 8 x 32 vpermt2w indices (transpose 32 rows) */
    uint32_t tmask[SET_MAX_K][8];  /* the lanes each register pair fills */
    /* AVX-512 decode: 8 rows of k ids (k column vectors, as pairs in zmm registers) back to
       row-major order, output register o from register pairs h by vpermt2d */
    uint32_t didx[SET_MAX_K / 2][SET_MAX_K / 4][16];
    uint16_t dmask[SET_MAX_K / 2][SET_MAX_K / 4];
} set_tab;

static int bitlen128(u128 x) {
    int n = 0;
    while (x) {
        n++;
        x >>= 1;
    }
    return n;
}

static void tab_free(set_tab *t) {
    if (!t) return;
    free(t->guide);
    free(t->c64);
    free(t->c128);
    free(t->pair);
    free(t->triple);
    free(t->tidx);
    free(t);
}

/* The tables of (E, k, m); NULL with a Python error set when the parameters are invalid. */
static set_tab *tab_build(int E, int k, int m) {
    if (E < 1 || E > SET_MAX_E || k < 1 || k > SET_MAX_K || k > E || m < 1 || m > SET_MAX_M) {
        PyErr_Format(PyExc_ValueError, "set codec: need 1 <= top_k <= min(16, num_experts), num_experts <= 1024, "
                     "1 <= block_rows <= 64; got %d, %d, %d", k, E, m);
        return NULL;
    }
    set_tab *t = calloc(1, sizeof(set_tab));
    if (!t) return (set_tab *)PyErr_NoMemory();
    t->E = E;
    t->k = k;
    t->m = m;
    t->bits = E <= 1 ? 1 : bitlen128((u128)(E - 1));
    const int stride = t->stride = E + 2;
    t->c128 = calloc((size_t)(k + 1) * stride, sizeof(u128));
    /* two entries of padding: the AVX-512 decode gathers a guide entry as a 4-byte word */
    /* above 128 experts the ranks' buckets hold more ids each: a 16-bit guide (k + 1 x 128 KiB)
       keeps the upward scan short (DeepSeek-V3 shape: 1.9 -> 1.65 ns per id decoded) */
    t->gbits = E > 128 ? SET_GUIDE_BITS_WIDE : SET_GUIDE_BITS;
    t->guide = calloc(((size_t)(k + 1) << t->gbits) + 2, sizeof(uint16_t));
    if (!t->c128 || !t->guide) {
        tab_free(t);
        return (set_tab *)PyErr_NoMemory();
    }
    for (int c = 0; c <= E; c++) { /* Pascal's triangle: C(c, i) = C(c-1, i-1) + C(c-1, i) */
        t->c128[c] = 1;
        for (int i = 1; i <= k; i++) {
            t->c128[i * stride + c] = c == 0 ? 0 : t->c128[(i - 1) * stride + c - 1] + t->c128[i * stride + c - 1];
        }
    }
    for (int i = 0; i <= k; i++) t->c128[i * stride + E + 1] = ~(u128)0;
    t->sets = t->c128[k * stride + E];
    t->radix = t->sets + (k >= 2 ? 1 : 0);
    t->pow[0] = 1;
    t->w[0] = 0;
    for (int j = 1; j <= m; j++) {
        if (t->pow[j - 1] > ((u128)1 << SET_WIDE_BITS) / t->radix) {
            PyErr_Format(PyExc_ValueError, "set codec: blocks of %d rows exceed %d bits", m, SET_WIDE_BITS);
            tab_free(t);
            return NULL;
        }
        t->pow[j] = t->pow[j - 1] * t->radix;
        t->w[j] = bitlen128(t->pow[j] - 1);
    }
    t->narrow = t->pow[m] <= ((u128)1 << 64);
    if (t->narrow && t->radix >= 2) t->rinv = UINT64_MAX / (uint64_t)t->radix;
    if (t->narrow) {
        t->c64 = malloc((size_t)(k + 1) * stride * sizeof(uint64_t));
        if (!t->c64) {
            tab_free(t);
            return (set_tab *)PyErr_NoMemory();
        }
        for (int i = 0; i < (k + 1) * stride; i++) t->c64[i] = t->c128[i] >> 64 ? UINT64_MAX : (uint64_t)t->c128[i];
    }
    if (t->narrow && k >= 2 && E <= 256) { /* the last two ids of a rank below C(E, 2) by one load */
        const size_t n2 = (size_t)(E * (E - 1) / 2);
        t->pair = malloc((n2 + 1) * sizeof(uint16_t));
        if (!t->pair) {
            tab_free(t);
            return (set_tab *)PyErr_NoMemory();
        }
        size_t r = 0;
        for (int c2 = 1; c2 < E; c2++) {
            for (int c1 = 0; c1 < c2; c1++) t->pair[r++] = (uint16_t)(c2 << 8 | c1); /* colex order */
        }
        t->pair[n2] = 0;
    }
    if (t->narrow && k >= 3 && E <= SET_TRIPLE_E) { /* the last three ids by one load (163 KiB at E = 64, 1.3 MiB at 128) */
        const size_t n3 = (size_t)E * (size_t)(E - 1) * (size_t)(E - 2) / 6;
        t->triple = malloc((n3 + 1) * sizeof(uint32_t));
        if (!t->triple) {
            tab_free(t);
            return (set_tab *)PyErr_NoMemory();
        }
        size_t r = 0;
        for (int c3 = 2; c3 < E; c3++) {
            for (int c2 = 1; c2 < c3; c2++) {
                for (int c1 = 0; c1 < c2; c1++) t->triple[r++] = (uint32_t)c3 << 16 | (uint32_t)c2 << 8 | (uint32_t)c1;
            }
        }
        t->triple[n3] = 0;
    }
    t->tidx = calloc((size_t)k * 8 * 32, sizeof(uint16_t));
    if (!t->tidx) {
        tab_free(t);
        return (set_tab *)PyErr_NoMemory();
    }
    for (int j = 0; j < k; j++) { /* id j of row l is element l * k + j of 32 rows: register pair p = e / 64 */
        for (int l = 0; l < 32; l++) {
            const int el = l * k + j, p = el / 64;
            t->tidx[((size_t)j * 8 + (size_t)p) * 32 + (size_t)l] = (uint16_t)(el - 64 * p);
            t->tmask[j][p] |= (uint32_t)1 << l;
        }
    }
    for (int e = 0; e < 8 * k; e++) { /* id j of row l (element e = l * k + j) is lane (j % 2) * 8 + l of pair j / 2 */
        const int o = e / 16, l = e / k, j = e % k, h = j / 4;
        t->didx[o][h][e % 16] = (uint32_t)(((j / 2) % 2) * 16 + (j % 2) * 8 + l);
        t->dmask[o][h] |= (uint16_t)(1u << (e % 16));
    }
    for (int i = 1; i <= k; i++) { /* ranks at position i lie below C(E, i) */
        const u128 *ci = t->c128 + i * stride;
        const u128 top = ci[E];
        int shift = bitlen128(top > 0 ? top - 1 : 0) - t->gbits;
        if (shift < 0) shift = 0;
        t->gshift[i] = shift;
        uint16_t *g = t->guide + ((size_t)i << t->gbits);
        int c = 0, c_hi = 0;
        for (u128 b = 0; b < ((u128)1 << t->gbits); b++) {
            const u128 r = b << shift; /* the largest c with C(c, i) <= r */
            while (c + 1 < E && ci[c + 1] <= r) c++;
            /* ... and for the last rank of the bucket: SET_GUIDE_FAR when it lies beyond c + 1 */
            const u128 r_hi = ((b + 1) << shift) - 1;
            if (c_hi < c) c_hi = c;
            while (c_hi + 1 < E && ci[c_hi + 1] <= r_hi) c_hi++;
            g[b] = (uint16_t)(c | (c_hi >= c + 2 ? SET_GUIDE_FAR : 0));
        }
    }
    return t;
}

/* tables are built once per (E, k, m) under the GIL and kept (a handful per process) */
#define SET_CACHE 32
static set_tab *tab_cache[SET_CACHE];

static set_tab *tab_get(int E, int k, int m, int *owned) {
    int i;
    *owned = 0;
    for (i = 0; i < SET_CACHE && tab_cache[i]; i++) {
        if (tab_cache[i]->E == E && tab_cache[i]->k == k && tab_cache[i]->m == m) return tab_cache[i];
    }
    set_tab *t = tab_build(E, k, m);
    if (!t) return NULL;
    if (i < SET_CACHE) {
        tab_cache[i] = t;
    } else {
        *owned = 1; /* the cache is full: the caller frees it */
    }
    return t;
}

static void put_u32s(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get_u32s(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* ---------------------------------------------------------------------------------
 * bit streams (little-endian, least significant bit first, as r3store.bitpack's)
 * --------------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    u128 acc;
    int n;
} bitw_t;

static inline void bw_put(bitw_t *w, uint64_t v, int nbits) { /* nbits <= 64, v < 2**nbits */
    w->acc |= (u128)v << w->n;
    w->n += nbits;
    if (w->n >= 64) {
        const uint64_t lo = (uint64_t)w->acc;
        memcpy(w->p, &lo, 8);
        w->p += 8;
        w->acc >>= 64;
        w->n -= 64;
    }
}

static inline void bw_put128(bitw_t *w, u128 v, int nbits) {
    if (nbits > 64) {
        bw_put(w, (uint64_t)v, 64);
        bw_put(w, (uint64_t)(v >> 64), nbits - 64);
    } else {
        bw_put(w, (uint64_t)v, nbits);
    }
}

static inline void bw_flush(bitw_t *w) {
    while (w->n > 0) {
        *w->p++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->n -= 8;
    }
    w->n = 0;
    w->acc = 0;
}

/* w bits (<= 120) at bit position pos of base[0 : nbytes) (zeros past its end) */
static inline u128 load_bits128(const uint8_t *base, size_t nbytes, uint64_t pos, int w) {
    const size_t byte = (size_t)(pos >> 3);
    u128 x = 0;
    if (byte + 16 <= nbytes) {
        memcpy(&x, base + byte, 16);
    } else if (byte < nbytes) {
        uint8_t tmp[16] = {0};
        memcpy(tmp, base + byte, nbytes - byte);
        memcpy(&x, tmp, 16);
    }
    x >>= (pos & 7);
    return w >= 128 ? x : x & ((((u128)1) << w) - 1);
}

static inline uint64_t load_bits64(const uint8_t *base, size_t nbytes, uint64_t pos, int w) { /* w <= 57 */
    const size_t byte = (size_t)(pos >> 3);
    uint64_t x = 0;
    if (byte + 8 <= nbytes) {
        memcpy(&x, base + byte, 8);
    } else if (byte < nbytes) {
        memcpy(&x, base + byte, nbytes - byte);
    }
    return (x >> (pos & 7)) & ((((uint64_t)1) << w) - 1);
}

/* ---------------------------------------------------------------------------------
 * ranks
 * --------------------------------------------------------------------------------- */

#define SET_INLINE static inline __attribute__((always_inline))

/* Classify one row: 0 a set (rank in *rank), 1 the all-zero row (k >= 2), 2 an exception.
   k is a compile-time constant in each instantiation (row_digit below dispatches). */
SET_INLINE int row_digit_k(const set_tab *t, const int64_t *v, u128 *rank, const int k) {
    const int E = t->E, stride = t->stride;
    uint64_t orv = 0;
    int big = 0, dup = 0;
    int pos[SET_MAX_K];
    int32_t w[SET_MAX_K];
    for (int j = 0; j < k; j++) {
        orv |= (uint64_t)v[j];
        big |= v[j] >= E;
        w[j] = (int32_t)v[j]; /* ids lie below 2**bits <= 2**10 here */
    }
    if (!orv && k >= 2) return 1;
    for (int j = 0; j < k; j++) { /* colex position (from 1) = 1 + ids below it; counted, not updated in memory */
        int below = 1, same = 0;
        for (int a = 0; a < k; a++) {
            below += w[a] < w[j];
            same += w[a] == w[j];
        }
        pos[j] = below;
        dup |= same != 1;
    }
    if (big | dup) return 2;
    if (t->narrow) {
        uint64_t r = 0;
        for (int j = 0; j < k; j++) r += t->c64[pos[j] * stride + v[j]];
        *rank = r;
    } else {
        u128 r = 0;
        for (int j = 0; j < k; j++) r += t->c128[pos[j] * stride + v[j]];
        *rank = r;
    }
    return 0;
}

#define SET_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16)

static int row_digit(const set_tab *t, const int64_t *v, u128 *rank) {
    switch (t->k) {
#define X(K) case K: return row_digit_k(t, v, rank, K);
    SET_CASES(X)
#undef X
    default: return 2;
    }
}

/* One id of a rank at colex position i >= 2: the largest c with C(c, i) <= r (r becomes
   r - C(c, i)). The guide gives a c at most the answer, the answer or one below unless
   the entry is marked SET_GUIDE_FAR (0.1-0.3% of the ranks at 64-256 experts): then a
   scan. */
SET_INLINE int find64(const set_tab *t, int i, uint64_t *r) {
    const uint64_t *ci = t->c64 + (size_t)i * (size_t)t->stride;
    const uint64_t v = *r;
    const size_t g = t->guide[((size_t)i << t->gbits) + (size_t)(v >> t->gshift[i])];
    size_t c = g & SET_GUIDE_C;
    if (__builtin_expect(g >= SET_GUIDE_FAR, 0)) {
        while (ci[c + 1] <= v) c++;
        *r = v - ci[c];
        return (int)c;
    }
    const uint64_t a0 = ci[c], a1 = ci[c + 1];
    const size_t s = a1 <= v;
    *r = v - (s ? a1 : a0);
    return (int)(c + s);
}

SET_INLINE int find128(const set_tab *t, int i, u128 r) {
    const u128 *ci = t->c128 + i * t->stride;
    int c = t->guide[((size_t)i << t->gbits) + (size_t)(r >> t->gshift[i])] & SET_GUIDE_C;
    while (ci[c + 1] <= r) c++;
    return c;
}

/* The ascending ids of colex rank r (< C(E, k)) into row[0 : k]. */
SET_INLINE void unrank64(const set_tab *t, uint64_t r, int32_t *row, const int k) {
    for (int i = k; i >= 2; i--) {
        row[i - 1] = find64(t, i, &r);
    }
    row[0] = (int32_t)r;
}

SET_INLINE void unrank128(const set_tab *t, u128 r, int32_t *row, const int k) {
    const int stride = t->stride;
    for (int i = k; i >= 2; i--) {
        const int c = find128(t, i, r);
        r -= t->c128[i * stride + c];
        row[i - 1] = c;
    }
    row[0] = (int32_t)r;
}

/* ---------------------------------------------------------------------------------
 * encode
 * --------------------------------------------------------------------------------- */

static uint64_t digit_bits(const set_tab *t, uint64_t digits) {
    return digits / (uint64_t)t->m * (uint64_t)t->w[t->m] + (uint64_t)t->w[digits % (uint64_t)t->m];
}

static Py_ssize_t payload_size(const set_tab *t, uint64_t n_total, uint64_t n_rows, uint64_t n_except) {
    const uint64_t raw = n_except * (uint64_t)t->k + n_total % (uint64_t)t->k;
    return (Py_ssize_t)((digit_bits(t, n_rows - n_except) + 7) / 8 + 4 * n_except + (raw * (uint64_t)t->bits + 7) / 8);
}

typedef struct {
    const set_tab *t;
    Py_ssize_t full;        /* full rows */
    void *digits;           /* per digit row: uint64_t (narrow) or u128 */
    Py_ssize_t n_digits;    /* digits so far */
    uint32_t *except;       /* exception rows */
    Py_ssize_t n_except;
    int16_t *raw;           /* exception ids, then the tail ids */
    Py_ssize_t n_raw;
    Py_ssize_t n_rows;      /* after the last non-zero row */
    Py_ssize_t digits_at_last; /* digits up to n_rows */
} set_enc_t;

/* One staged row into the encoder's lists: its digit, or an exception with its ids. */
SET_INLINE void enc_row(set_enc_t *e, const int64_t *v, int kind, u128 rank, int64_t orv, Py_ssize_t row, const int k) {
    const set_tab *t = e->t;
    if (kind == 2) {
        e->except[e->n_except++] = (uint32_t)row;
        for (int j = 0; j < k; j++) e->raw[e->n_raw++] = (int16_t)v[j];
    } else {
        if (kind == 1) rank = t->sets;
        if (t->narrow) {
            ((uint64_t *)e->digits)[e->n_digits++] = (uint64_t)rank;
        } else {
            ((u128 *)e->digits)[e->n_digits++] = rank;
        }
    }
    if (orv) { /* rows after the last non-zero one are not stored */
        e->n_rows = row + 1;
        e->digits_at_last = e->n_digits;
    }
}

#ifdef R3_X86
/* The AVX2/BMI2 classifier of narrow codecs with E <= 256 (ids below 2**bits <= 256): the
   row's ids become a bitmap (one word for E <= 64, four in a ymm register otherwise), whose
   popcount finds repeated ids and whose ascending set bits are the sorted ids: the colex
   position of id x is 1 + the set bits below x. Same digits as row_digit. */
static inline __attribute__((always_inline)) R3_TARGET_AVX2 void classify_fast_k(
    set_enc_t *e, const int64_t *stage, Py_ssize_t rows, Py_ssize_t row, const int k, const int four) {
    const set_tab *t = e->t;
    const uint64_t *c64 = t->c64;
    const int stride = t->stride, E = t->E;
    const __m256i offs = _mm256_setr_epi64x(0, 64, 128, 192), ones = _mm256_set1_epi64x(1);
    for (Py_ssize_t r = 0; r < rows; r++, row++) {
        const int64_t *v = stage + r * k;
        uint64_t orv = 0, rank = 0;
        int kind = 0;
        if (!four) {
            uint64_t bm = 0;
            for (int j = 0; j < k; j++) {
                orv |= (uint64_t)v[j];
                bm |= (uint64_t)1 << (v[j] & 63);
            }
            if (!orv && k >= 2) {
                kind = 1;
            } else if ((int)_mm_popcnt_u64(bm) != k || (E < 64 && (bm >> E))) {
                kind = 2;
            } else {
                for (int i = 1; i <= k; i++) {
                    rank += c64[i * stride + (int)_tzcnt_u64(bm)];
                    bm = _blsr_u64(bm);
                }
            }
        } else {
            __m256i acc = _mm256_setzero_si256();
            for (int j = 0; j < k; j++) {
                orv |= (uint64_t)v[j];
                acc = _mm256_or_si256(acc, _mm256_sllv_epi64(ones, _mm256_sub_epi64(_mm256_set1_epi64x(v[j]), offs)));
            }
            uint64_t w[4];
            _mm256_storeu_si256((__m256i *)w, acc);
            const int p1 = (int)_mm_popcnt_u64(w[0]), p2 = p1 + (int)_mm_popcnt_u64(w[1]);
            const int p3 = p2 + (int)_mm_popcnt_u64(w[2]), total = p3 + (int)_mm_popcnt_u64(w[3]);
            const int pre[4] = {1, p1 + 1, p2 + 1, p3 + 1};
            int big = 0;
            if (E < 256) { /* ids lie below 2**bits: with E = 256 none is too large */
                for (int j = 0; j < k; j++) big |= v[j] >= E;
            }
            if (!orv && k >= 2) {
                kind = 1;
            } else if (total != k || big) {
                kind = 2;
            } else {
                for (int j = 0; j < k; j++) {
                    const int x = (int)v[j];
                    const int pos = pre[x >> 6] + (int)_mm_popcnt_u64(_bzhi_u64(w[x >> 6], (unsigned)(x & 63)));
                    rank += c64[pos * stride + x];
                }
            }
        }
        enc_row(e, v, kind, (u128)rank, (int64_t)orv, row, k);
    }
}

static R3_TARGET_AVX2 void classify_fast(set_enc_t *e, const int64_t *stage, Py_ssize_t rows, Py_ssize_t row) {
    const int four = e->t->E > 64;
    switch (e->t->k) {
#define X(K) case K: if (four) classify_fast_k(e, stage, rows, row, K, 1); else classify_fast_k(e, stage, rows, row, K, 0); break;
    SET_CASES(X)
#undef X
    default: break;
    }
}
#endif

/* ---------------------------------------------------------------------------------
 * AVX-512 encode: 32 rows at a time, one row per 16-bit lane
 *
 * The ids of 32 rows (uint16, row-major: k zmm registers) are transposed by vpermt2w into
 * k vectors, vector j holding id j of each row; a sorting network (Knuth's merge exchange,
 * 5.2.2M; vpminuw/vpmaxuw) sorts each lane ascending, so vector i holds c_{i+1}; equal
 * neighbours mark repeated ids, the last vector's value ids >= E, its zero the all-zero
 * row; the rank sum_i C(c_i, i) is k gathers of 64-bit table entries (vpgatherdq) per 8
 * rows. A group holding an exception row goes through the row-at-a-time classifier.
 * --------------------------------------------------------------------------------- */

/* merge-exchange sorting networks of 2..16 inputs (each C(a, b): a < b, the minimum to a) */
#define SET_NET_1(C)
#define SET_NET_2(C) C(0, 1)
#define SET_NET_3(C) C(0, 2) C(0, 1) C(1, 2)
#define SET_NET_4(C) C(0, 2) C(1, 3) C(0, 1) C(2, 3) C(1, 2)
#define SET_NET_5(C) C(0, 4) C(0, 2) C(1, 3) C(2, 4) C(0, 1) C(2, 3) C(1, 4) C(1, 2) C(3, 4)
#define SET_NET_6(C) C(0, 4) C(1, 5) C(0, 2) C(1, 3) C(2, 4) C(3, 5) C(0, 1) C(2, 3) C(4, 5) C(1, 4) C(1, 2) C(3, 4)
#define SET_NET_7(C) C(0, 4) C(1, 5) C(2, 6) C(0, 2) C(1, 3) C(4, 6) C(2, 4) C(3, 5) C(0, 1) C(2, 3) C(4, 5) C(1, 4) C(3, 6) C(1, 2) C(3, 4) C(5, 6)
#define SET_NET_8(C) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(2, 4) C(3, 5) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(1, 4) C(3, 6) C(1, 2) C(3, 4) C(5, 6)
#define SET_NET_9(C) C(0, 8) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(4, 8) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(2, 8) C(2, 4) C(3, 5) C(6, 8) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(1, 8) C(1, 4) C(3, 6) C(5, 8) C(1, 2) C(3, 4) C(5, 6) C(7, 8)
#define SET_NET_10(C) C(0, 8) C(1, 9) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(4, 8) C(5, 9) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(2, 8) C(3, 9) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(1, 8) C(1, 4) C(3, 6) C(5, 8) C(1, 2) C(3, 4) C(5, 6) C(7, 8)
#define SET_NET_11(C) C(0, 8) C(1, 9) C(2, 10) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(4, 8) C(5, 9) C(6, 10) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(2, 8) C(3, 9) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(1, 8) C(3, 10) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10)
#define SET_NET_12(C) C(0, 8) C(1, 9) C(2, 10) C(3, 11) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(4, 8) C(5, 9) C(6, 10) C(7, 11) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(9, 11) C(2, 8) C(3, 9) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(10, 11) C(1, 8) C(3, 10) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10)
#define SET_NET_13(C) C(0, 8) C(1, 9) C(2, 10) C(3, 11) C(4, 12) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(8, 12) C(4, 8) C(5, 9) C(6, 10) C(7, 11) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(9, 11) C(2, 8) C(3, 9) C(6, 12) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(10, 12) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(10, 11) C(1, 8) C(3, 10) C(5, 12) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(9, 12) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10) C(11, 12)
#define SET_NET_14(C) C(0, 8) C(1, 9) C(2, 10) C(3, 11) C(4, 12) C(5, 13) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(8, 12) C(9, 13) C(4, 8) C(5, 9) C(6, 10) C(7, 11) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(9, 11) C(2, 8) C(3, 9) C(6, 12) C(7, 13) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(10, 12) C(11, 13) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(10, 11) C(12, 13) C(1, 8) C(3, 10) C(5, 12) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(9, 12) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10) C(11, 12)
#define SET_NET_15(C) C(0, 8) C(1, 9) C(2, 10) C(3, 11) C(4, 12) C(5, 13) C(6, 14) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(8, 12) C(9, 13) C(10, 14) C(4, 8) C(5, 9) C(6, 10) C(7, 11) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(9, 11) C(12, 14) C(2, 8) C(3, 9) C(6, 12) C(7, 13) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(10, 12) C(11, 13) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(10, 11) C(12, 13) C(1, 8) C(3, 10) C(5, 12) C(7, 14) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(9, 12) C(11, 14) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10) C(11, 12) C(13, 14)
#define SET_NET_16(C) C(0, 8) C(1, 9) C(2, 10) C(3, 11) C(4, 12) C(5, 13) C(6, 14) C(7, 15) C(0, 4) C(1, 5) C(2, 6) C(3, 7) C(8, 12) C(9, 13) C(10, 14) C(11, 15) C(4, 8) C(5, 9) C(6, 10) C(7, 11) C(0, 2) C(1, 3) C(4, 6) C(5, 7) C(8, 10) C(9, 11) C(12, 14) C(13, 15) C(2, 8) C(3, 9) C(6, 12) C(7, 13) C(2, 4) C(3, 5) C(6, 8) C(7, 9) C(10, 12) C(11, 13) C(0, 1) C(2, 3) C(4, 5) C(6, 7) C(8, 9) C(10, 11) C(12, 13) C(14, 15) C(1, 8) C(3, 10) C(5, 12) C(7, 14) C(1, 4) C(3, 6) C(5, 8) C(7, 10) C(9, 12) C(11, 14) C(1, 2) C(3, 4) C(5, 6) C(7, 8) C(9, 10) C(11, 12) C(13, 14)

#ifdef R3_X86
#define R3_TARGET_SET512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,bmi,bmi2,popcnt")))

/* 32 rows of k uint16 ids at s -> their digits into d[0 : 32]. Returns the mask of the
   rows holding a non-zero id, or -1 (nothing written) when a row is an exception. */
static inline __attribute__((always_inline)) R3_TARGET_SET512 int64_t rank32_k(const set_tab *t, const uint16_t *s,
                                                                              uint64_t *d, const int k) {
    __m512i R[SET_MAX_K], V[SET_MAX_K];
#pragma GCC unroll 16
    for (int j = 0; j < k; j++) R[j] = _mm512_loadu_si512((const void *)(s + 32 * j));
#pragma GCC unroll 16
    for (int j = 0; j < k; j++) { /* lane l of V[j] = id j of row l = element l * k + j */
        __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int p = 0; p < (k + 1) / 2; p++) {
            const __m512i idx = _mm512_loadu_si512((const void *)(t->tidx + ((size_t)j * 8 + (size_t)p) * 32));
            const __m512i x = 2 * p + 1 < k ? _mm512_permutex2var_epi16(R[2 * p], idx, R[2 * p + 1])
                                            : _mm512_permutexvar_epi16(idx, R[2 * p]);
            v = p == 0 ? x : _mm512_mask_mov_epi16(v, t->tmask[j][p], x);
        }
        V[j] = v;
    }
#define SET_CMP(a, b)                                   \
    {                                                   \
        const __m512i lo_ = _mm512_min_epu16(V[a], V[b]); \
        V[b] = _mm512_max_epu16(V[a], V[b]);            \
        V[a] = lo_;                                     \
    }
    switch (k) {
#define X(K) case K: SET_NET_##K(SET_CMP) break;
    SET_CASES(X)
#undef X
    default: break;
    }
#undef SET_CMP
    const __mmask32 nonzero = _mm512_test_epi16_mask(V[k - 1], V[k - 1]);
    __mmask32 bad = t->E < (1 << t->bits) ? _mm512_cmpge_epu16_mask(V[k - 1], _mm512_set1_epi16((short)t->E)) : 0;
#pragma GCC unroll 16
    for (int i = 0; i + 1 < k; i++) bad |= _mm512_cmpeq_epi16_mask(V[i], V[i + 1]);
    if (bad & nonzero) return -1;
    const int64_t *c64 = (const int64_t *)t->c64;
    __m512i acc[4];
#pragma GCC unroll 16
    for (int i = 0; i < k; i++) { /* C(c_{i+1}, i + 1): entry (i + 1) * stride + c */
        const __m512i x = _mm512_add_epi16(V[i], _mm512_set1_epi16((short)((i + 1) * t->stride)));
        const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(x));
        const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(x, 1));
        const __m512i g0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(lo), c64, 8);
        const __m512i g1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(lo, 1), c64, 8);
        const __m512i g2 = _mm512_i32gather_epi64(_mm512_castsi512_si256(hi), c64, 8);
        const __m512i g3 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(hi, 1), c64, 8);
        if (i == 0) {
            acc[0] = g0, acc[1] = g1, acc[2] = g2, acc[3] = g3;
        } else {
            acc[0] = _mm512_add_epi64(acc[0], g0), acc[1] = _mm512_add_epi64(acc[1], g1);
            acc[2] = _mm512_add_epi64(acc[2], g2), acc[3] = _mm512_add_epi64(acc[3], g3);
        }
    }
    if (k >= 2) { /* the all-zero row: digit C(E, k) */
        const __m512i sets = _mm512_set1_epi64((long long)(uint64_t)t->sets);
        const uint32_t z = ~(uint32_t)nonzero;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) acc[q] = _mm512_mask_mov_epi64(acc[q], (__mmask8)(z >> (8 * q)), sets);
    }
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) _mm512_storeu_si512((void *)(d + 8 * q), acc[q]);
    return (int64_t)(uint32_t)nonzero;
}

/* Classify rows of k uint16 ids (all below 2**bits) into the encoder's lists, 32 at a time;
   returns the rows done (a multiple of 32; the caller does the rest and the groups refused). */
static inline __attribute__((always_inline)) R3_TARGET_SET512 Py_ssize_t classify512_k(
    set_enc_t *e, const uint16_t *s, Py_ssize_t rows, Py_ssize_t row, const int k) {
    Py_ssize_t r = 0;
    for (; r + 32 <= rows; r += 32) {
        uint64_t *d = (uint64_t *)e->digits + e->n_digits;
        const int64_t nz = rank32_k(e->t, s + r * k, d, k);
        if (nz < 0) break;
        if (nz) {
            const int last = 31 - __builtin_clz((unsigned)nz);
            e->n_rows = row + r + last + 1;
            e->digits_at_last = e->n_digits + last + 1;
        }
        e->n_digits += 32;
    }
    return r;
}

static R3_TARGET_SET512 Py_ssize_t classify512(set_enc_t *e, const uint16_t *s, Py_ssize_t rows, Py_ssize_t row) {
    switch (e->t->k) {
#define X(K) case K: return classify512_k(e, s, rows, row, K);
    SET_CASES(X)
#undef X
    default: return 0;
    }
}
#endif

/* The AVX-512 encoder runs where the CPU has AVX-512 F/BW (and the AVX2 kernels are on);
   setcodec_avx512() turns it off for tests and benchmarks. */
static int set512 = -1; /* -1: not decided yet */

static int set512_cpu(void) {
#ifdef R3_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
           && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    return 0;
#endif
}

static int set512_on(void) {
    if (set512 < 0) set512 = set512_cpu();
    return set512 && use_avx2;
}

R3_DOC(setcodec_avx512_doc, "setcodec_avx512(on) -> bool\n\n"
"Let the set codec's kernels use AVX-512 (F, BW, VL, DQ) where the CPU has it (the default),\n"
"or not; returns the previous setting. It runs only while the AVX2 kernels are on (set_simd).\n"
"For tests and benchmarks: both compute the same function. ValueError when turning it on\n"
"without the CPU's support.");

PyObject *py_setcodec_avx512(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    (void)set512_on(); /* decides the default */
    const int prev = set512;
    if (on && !set512_cpu()) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no AVX-512 F/BW/VL/DQ");
        return NULL;
    }
    set512 = on;
    return PyBool_FromLong(prev);
}

/* The AVX-512 gather decoder (unrank_run512): off by default, as it measured slower than the
   scalar lockstep decoder on the machines tried (a vpgatherqq of 8 entries costs about as much
   as 30 scalar loads on AMD Zen 5 here); setcodec_gather_decode() turns it on. */
static int set512_gather = 0;

static int set512_gather_on(void) { return set512_gather && set512_on(); }

R3_DOC(setcodec_gather_decode_doc, "setcodec_gather_decode(on) -> bool\n\n"
"Let the set codec's decoder unrank 8 rows per AVX-512 register with gathers (while\n"
"setcodec_avx512 is on), or not (the default: the scalar decoder, 8 rows in lockstep, measured\n"
"faster); returns the previous setting. For tests and benchmarks: both compute the same\n"
"function. ValueError when turning it on without the CPU's support.");

PyObject *py_setcodec_gather_decode(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    const int prev = set512_gather;
    if (on && !set512_cpu()) {
        PyErr_SetString(PyExc_ValueError, "this CPU has no AVX-512 F/BW/VL/DQ");
        return NULL;
    }
    set512_gather = on;
    return PyBool_FromLong(prev);
}

/* Classify rows of int64 ids (all below 2**bits) one at a time into the encoder's lists. */
static void classify_rows(set_enc_t *e, const int64_t *stage, Py_ssize_t rows, Py_ssize_t row) {
    const set_tab *t = e->t;
    const int k = t->k;
#ifdef R3_X86
    if (use_avx2 && t->narrow && t->E <= 256) {
        classify_fast(e, stage, rows, row);
        return;
    }
#endif
    for (Py_ssize_t r = 0; r < rows; r++, row++) {
        const int64_t *v = stage + r * k;
        u128 rank = 0;
        const int kind = row_digit(t, v, &rank);
        int64_t orv = 0;
        for (int j = 0; j < k; j++) orv |= v[j];
        enc_row(e, v, kind, rank, orv, row, k);
    }
}

/* Stage the ids (any type and layout) as int64 rows and classify them; 0 when an id is out of range. */
static int encode_rows(set_enc_t *e, const Py_buffer *src, int type) {
    const set_tab *t = e->t;
    const int k = t->k;
    const int64_t hi = (int64_t)1 << t->bits;
    cursor_t c;
    cursor_init(&c, src);
    const Py_ssize_t n = c.total;
#ifdef R3_X86
    const int use512 = t->narrow && set512_on();
#else
    const int use512 = 0;
#endif
    /* the AVX-512 path takes groups of 32 rows: chunks of whole groups */
    const Py_ssize_t per = use512 ? (R3_CHUNK / (32 * k)) * (32 * k) : (R3_CHUNK / k) * k;
    int64_t stage[R3_CHUNK];
    uint16_t stage16[R3_CHUNK];
    Py_ssize_t start, row = 0;
    for (start = 0; start < n; start += per) {
        Py_ssize_t cnt = n - start < per ? n - start : per, got = 0;
        const int direct16 = use512 && (type == T_U16 || type == T_U8); /* staged as uint16 straight away */
        while (got < cnt) {
            char *p;
            Py_ssize_t stride, take = cursor_take(&c, cnt - got, &p, &stride);
            const int dt = direct16 ? T_U16 : T_I64;
            char *dst = direct16 ? (char *)(stage16 + got) : (char *)(stage + got);
            if (stride == type_size[type]) {
                conv_table[type][dt](p, stride, dst, take);
            } else {
                for (Py_ssize_t i = 0; i < take; i++) conv_table[type][dt](p + i * stride, stride, dst + i * type_size[dt], 1);
            }
            got += take;
        }
        const Py_ssize_t rows = cnt / k;
        if (use512) {
            if (direct16) {
                uint16_t acc16 = 0;
                for (Py_ssize_t i = 0; i < cnt; i++) acc16 |= stage16[i];
                if ((int64_t)acc16 >= hi) return 0;
            } else {
                uint64_t acc = 0; /* every id in [0, 2**bits) iff their OR is (negatives set the high bits) */
                for (Py_ssize_t i = 0; i < cnt; i++) acc |= (uint64_t)stage[i];
                if (acc >= (uint64_t)hi) return 0;
                for (Py_ssize_t i = 0; i < cnt; i++) stage16[i] = (uint16_t)stage[i];
            }
#ifdef R3_X86
            Py_ssize_t r = 0;
            while (r < rows) {
                r += classify512(e, stage16 + r * k, rows - r, row + r);
                if (r >= rows) break;
                /* a group holding an exception row, or the last rows: one row at a time */
                const Py_ssize_t take = rows - r < 32 ? rows - r : 32;
                for (Py_ssize_t i = 0; i < take * k; i++) stage[i] = stage16[r * k + i];
                classify_rows(e, stage, take, row + r);
                r += take;
            }
#endif
            for (Py_ssize_t i = rows * k; i < cnt; i++) e->raw[e->n_raw++] = (int16_t)stage16[i]; /* the tail */
        } else {
            uint64_t acc = 0; /* every id in [0, 2**bits) iff their OR is (negatives set the high bits) */
            for (Py_ssize_t i = 0; i < cnt; i++) acc |= (uint64_t)stage[i];
            if (acc >= (uint64_t)hi) return 0;
            classify_rows(e, stage, rows, row);
            for (Py_ssize_t i = rows * k; i < cnt; i++) e->raw[e->n_raw++] = (int16_t)stage[i]; /* the tail */
        }
        row += rows;
    }
    return 1;
}

static void write_payload(const set_enc_t *e, uint8_t *p) {
    const set_tab *t = e->t;
    const Py_ssize_t nd = e->digits_at_last;
    bitw_t w = {p, 0, 0};
    Py_ssize_t i = 0;
    while (i < nd) {
        const int cnt = nd - i < t->m ? (int)(nd - i) : t->m;
        if (t->narrow) {
            const uint64_t *d = (const uint64_t *)e->digits + i;
            uint64_t v = 0;
            for (int j = cnt - 1; j >= 0; j--) v = v * (uint64_t)t->radix + d[j];
            bw_put(&w, v, t->w[cnt]);
        } else {
            const u128 *d = (const u128 *)e->digits + i;
            u128 v = 0;
            for (int j = cnt - 1; j >= 0; j--) v = v * t->radix + d[j];
            bw_put128(&w, v, t->w[cnt]);
        }
        i += cnt;
    }
    bw_flush(&w);
    for (Py_ssize_t x = 0; x < e->n_except; x++) {
        put_u32s(w.p, e->except[x]);
        w.p += 4;
    }
    for (Py_ssize_t x = 0; x < e->n_raw; x++) bw_put(&w, (uint64_t)(uint16_t)e->raw[x], t->bits);
    bw_flush(&w);
}

R3_DOC(set_encode_doc, "set_encode(src, num_experts, top_k, block_rows, tag) -> bytes | None\n\n"
"One r3store.set frame of the ids of src (any integer type, shape and strides; C order).\n"
"None when an id lies outside [0, 2**bits) (the caller reports which).");

PyObject *py_set_encode(PyObject *self, PyObject *args) {
    PyObject *src_obj;
    int E, k, m, owned;
    unsigned long tag;
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "Oiiik", &src_obj, &E, &k, &m, &tag)) return NULL;
    if (tag > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "set_encode: tag must be a u32");
        return NULL;
    }
    set_tab *t = tab_get(E, k, m, &owned);
    if (!t) return NULL;
    if (get_int_buffer(src_obj, &src, 0, "ids") < 0) {
        if (owned) tab_free(t);
        return NULL;
    }
    cursor_t c;
    cursor_init(&c, &src);
    const Py_ssize_t n = c.total;
    PyObject *frame = NULL;
    set_enc_t e = {0};
    e.t = t;
    if ((uint64_t)n > 0xFFFFFFFFu) {
        PyErr_SetString(PyExc_OverflowError, "a frame holds fewer than 2**32 ids");
        goto done;
    }
    e.full = n / k;
    e.digits = malloc((size_t)(e.full + 1) * (t->narrow ? sizeof(uint64_t) : sizeof(u128)));
    e.except = malloc((size_t)(e.full + 1) * sizeof(uint32_t));
    e.raw = malloc((size_t)(n + 1) * sizeof(int16_t));
    if (!e.digits || !e.except || !e.raw) {
        PyErr_NoMemory();
        goto done;
    }
    int ok;
    const int type = buffer_type(&src);
    Py_BEGIN_ALLOW_THREADS
    ok = encode_rows(&e, &src, type);
    Py_END_ALLOW_THREADS
    if (!ok) {
        frame = Py_None;
        Py_INCREF(frame);
        goto done;
    }
    const Py_ssize_t plen = payload_size(t, (uint64_t)n, (uint64_t)e.n_rows, (uint64_t)e.n_except);
    frame = PyBytes_FromStringAndSize(NULL, SET_HEADER + plen);
    if (!frame) goto done;
    uint8_t *d = (uint8_t *)PyBytes_AsString(frame);
    memcpy(d, "R3ST", 4);
    d[4] = 1;
    d[5] = (uint8_t)k;
    d[6] = (uint8_t)(E & 0xFF);
    d[7] = (uint8_t)(E >> 8);
    put_u32s(d + 8, (uint32_t)n);
    put_u32s(d + 12, (uint32_t)e.n_rows);
    put_u32s(d + 16, (uint32_t)e.n_except);
    d[20] = (uint8_t)m;
    d[21] = (uint8_t)t->w[m];
    d[22] = d[23] = 0;
    put_u32s(d + 24, (uint32_t)tag);
    Py_BEGIN_ALLOW_THREADS
    memset(d + SET_HEADER, 0, (size_t)plen);
    write_payload(&e, d + SET_HEADER);
    put_u32s(d + 28, crc32c_extend(crc32c_extend(0, d, 28), d + SET_HEADER, (size_t)plen));
    Py_END_ALLOW_THREADS
done:
    free(e.digits);
    free(e.except);
    free(e.raw);
    PyBuffer_Release(&src);
    if (owned) tab_free(t);
    return frame;
}

/* ---------------------------------------------------------------------------------
 * check and decode
 * --------------------------------------------------------------------------------- */

/* Header checks as check_set_frame_numpy: 0 valid, else the first failed check (1..7). */
static int set_status(const set_tab *t, const uint8_t *d, Py_ssize_t len, uint32_t *n_total, uint32_t *n_rows,
                      uint32_t *n_except, uint32_t *tag) {
    if (len < SET_HEADER) return 1;
    if (memcmp(d, "R3ST", 4) != 0) return 2;
    const uint32_t crc = crc32c_extend(crc32c_extend(0, d, 28), d + SET_HEADER, (size_t)(len - SET_HEADER));
    if (crc != get_u32s(d + 28)) return 3;
    if (d[4] != 1) return 4;
    *n_total = get_u32s(d + 8);
    *n_rows = get_u32s(d + 12);
    *n_except = get_u32s(d + 16);
    *tag = get_u32s(d + 24);
    const int E = d[6] | (d[7] << 8);
    if (d[5] != t->k || E != t->E || d[20] != t->m || d[21] != t->w[t->m] || *n_rows > *n_total / (uint32_t)t->k ||
        *n_except > *n_rows) {
        return 5;
    }
    if (len - SET_HEADER != payload_size(t, *n_total, *n_rows, *n_except)) return 6;
    if (d[22] || d[23]) return 7;
    return 0;
}

/* Payload checks before anything is written: 0, or 8 (a block out of range, padding bits),
   9 (exception rows not increasing below n_rows), 10 (padding bits of the verbatim ids). */
static int set_payload_status(const set_tab *t, const uint8_t *p, size_t plen, uint32_t n_total, uint32_t n_rows,
                              uint32_t n_except) {
    const uint64_t nd = n_rows - n_except, nbits = digit_bits(t, nd);
    const uint64_t full = nd / (uint64_t)t->m;
    const int part = (int)(nd % (uint64_t)t->m);
    const int w = t->w[t->m];
    uint64_t b;
    if (t->narrow && w <= 57) {
        const uint64_t lim = (uint64_t)t->pow[t->m];
        for (b = 0; b < full; b++) {
            if (load_bits64(p, plen, b * (uint64_t)w, w) >= lim) return 8;
        }
    } else if (t->pow[t->m] < ((u128)1 << w)) {
        for (b = 0; b < full; b++) {
            if (load_bits128(p, plen, b * (uint64_t)w, w) >= t->pow[t->m]) return 8;
        }
    }
    if (part && load_bits128(p, plen, full * (uint64_t)w, t->w[part]) >= t->pow[part]) return 8;
    if (nbits % 8 && (p[nbits / 8] >> (nbits % 8))) return 8;
    const uint8_t *ex = p + (nbits + 7) / 8;
    for (uint32_t x = 0; x < n_except; x++) {
        const uint32_t r = get_u32s(ex + 4 * (size_t)x);
        if (r >= n_rows || (x && r <= get_u32s(ex + 4 * (size_t)(x - 1)))) return 9;
    }
    const uint64_t raw_bits = ((uint64_t)n_except * (uint64_t)t->k + n_total % (uint64_t)t->k) * (uint64_t)t->bits;
    const uint8_t *raw = ex + 4 * (size_t)n_except;
    if (raw_bits % 8 && (raw[raw_bits / 8] >> (raw_bits % 8))) return 9 + 1;
    return 0;
}

#define SET_BATCH 256 /* digits decoded ahead */
#ifndef SET_LANES
#define SET_LANES 8 /* rows unranked in lockstep */
#endif

/* Decode a checked payload of a wide codec (blocks above 64 bits) into out[0 : n_total] (int32,
   contiguous); k constant per instantiation. */
SET_INLINE void set_decode_wide_k(const set_tab *t, const uint8_t *p, size_t plen, uint32_t n_total, uint32_t n_rows,
                             uint32_t n_except, int32_t *out, const int k) {
    const int m = t->m;
    const uint64_t nd = n_rows - n_except, nbits = digit_bits(t, nd);
    const uint8_t *ex = p + (nbits + 7) / 8;
    const uint8_t *raw = ex + 4 * (size_t)n_except;
    const size_t raw_len = plen - (size_t)(raw - p);
    uint32_t next_ex = n_except ? get_u32s(ex) : UINT32_MAX, x = 0;
    uint64_t raw_pos = 0, digit = 0, bitpos = 0;
    int left = 0;
    u128 v128 = 0;
    for (uint32_t row = 0; row < n_rows; row++) {
        int32_t *dst = out + (size_t)row * k;
        if (row == next_ex) {
            for (int j = 0; j < k; j++, raw_pos += t->bits) dst[j] = (int32_t)load_bits64(raw, raw_len, raw_pos, t->bits);
            x++;
            next_ex = x < n_except ? get_u32s(ex + 4 * (size_t)x) : UINT32_MAX;
            continue;
        }
        if (!left) {
            left = nd - digit < (uint64_t)m ? (int)(nd - digit) : m;
            v128 = load_bits128(p, plen, bitpos, t->w[left]);
            bitpos += (uint64_t)t->w[left];
        }
        u128 d;
        if (m == 1) {
            d = v128;
        } else {
            d = v128 % t->radix;
            v128 /= t->radix;
        }
        left--;
        digit++;
        if (k >= 2 && d == t->sets) {
            memset(dst, 0, (size_t)k * sizeof(int32_t));
        } else {
            unrank128(t, d, dst, k);
        }
    }
    const size_t full_ids = (size_t)(n_total / (uint32_t)k) * (size_t)k;
    memset(out + (size_t)n_rows * k, 0, (full_ids - (size_t)n_rows * k) * sizeof(int32_t));
    for (size_t i = full_ids; i < n_total; i++, raw_pos += t->bits) out[i] = (int32_t)load_bits64(raw, raw_len, raw_pos, t->bits);
}

/* v / R and v % R of a narrow codec by a multiply: the estimate mulhi(v, rinv) is at most
   two below the quotient. */
SET_INLINE uint64_t divr64(const uint64_t v, const uint64_t R, const uint64_t rinv, uint64_t *rem) {
    uint64_t q = (uint64_t)(((u128)v * rinv) >> 64), r = v - q * R;
    while (r >= R) {
        q++;
        r -= R;
    }
    *rem = r;
    return q;
}

/* Unrank n narrow digits d[] into the consecutive rows dst[0 : n * k] (the all-zero digit:
   k zeros), SET_LANES rows in lockstep: independent chains of dependent loads the CPU
   overlaps. The tables' addresses sit in locals, so the stores of ids do not reload them. */
SET_INLINE void unrank_run64_p(const set_tab *t, const uint64_t *d, int32_t *dst, int n, const int k,
                               const int tail) {
    const uint16_t *const pair = t->pair, *const guide = t->guide;
    const uint32_t *const triple = t->triple;
    const uint64_t *const c64 = t->c64;
    const size_t stride = (size_t)t->stride;
    const int gbits = t->gbits;
    const uint64_t zero = k >= 2 ? (uint64_t)t->sets : UINT64_MAX;
    int gs[SET_MAX_K + 1];
    for (int i = 0; i <= k; i++) gs[i] = t->gshift[i];
    int q = 0;
    for (; q + SET_LANES <= n; q += SET_LANES) {
        uint64_t r[SET_LANES];
        int32_t *const o = dst + (size_t)q * k;
#pragma GCC unroll 16
        for (int l = 0; l < SET_LANES; l++) r[l] = d[q + l] == zero ? 0 : d[q + l];
        for (int i = k; i > tail; i--) {
            const uint64_t *const ci = c64 + (size_t)i * stride;
            const uint16_t *const gi = guide + ((size_t)i << gbits);
            const int sh = gs[i];
#pragma GCC unroll 16
            for (int l = 0; l < SET_LANES; l++) {
                const uint64_t v = r[l];
                const size_t g = gi[v >> sh];
                size_t c = g & SET_GUIDE_C;
                if (__builtin_expect(g >= SET_GUIDE_FAR, 0)) {
                    while (ci[c + 1] <= v) c++;
                    r[l] = v - ci[c];
                    o[l * k + i - 1] = (int32_t)c;
                } else {
                    const uint64_t a0 = ci[c], a1 = ci[c + 1];
                    const size_t s = a1 <= v;
                    r[l] = v - (s ? a1 : a0);
                    o[l * k + i - 1] = (int32_t)(c + s);
                }
            }
        }
#pragma GCC unroll 16
        for (int l = 0; l < SET_LANES; l++) {
            if (tail == 3) {
                const uint32_t tr = triple[r[l]];
                o[l * k + 2] = (int32_t)(tr >> 16);
                o[l * k + 1] = (int32_t)(tr >> 8 & 0xFF);
                o[l * k] = (int32_t)(tr & 0xFF);
            } else if (tail == 2) {
                const uint16_t pr = pair[r[l]];
                o[l * k + 1] = pr >> 8;
                o[l * k] = pr & 0xFF;
            } else {
                o[l * k] = (int32_t)r[l];
            }
            if (d[q + l] == zero) memset(o + l * k, 0, (size_t)k * sizeof(int32_t));
        }
    }
    for (; q < n; q++) {
        if (d[q] == zero) {
            memset(dst + (size_t)q * k, 0, (size_t)k * sizeof(int32_t));
        } else {
            unrank64(t, d[q], dst + (size_t)q * k, k);
        }
    }
}

/* The last ids of a row from the triple or the pair table where there is one. */
SET_INLINE void unrank_run64(const set_tab *t, const uint64_t *d, int32_t *dst, int n, const int k) {
    if (k >= 3 && t->triple) {
        unrank_run64_p(t, d, dst, n, k, 3);
    } else if (k >= 2 && t->pair) {
        unrank_run64_p(t, d, dst, n, k, 2);
    } else {
        unrank_run64_p(t, d, dst, n, k, 1);
    }
}

#ifdef R3_X86
/* ---------------------------------------------------------------------------------
 * AVX-512 decode (narrow codecs): 8 rows per zmm register, one rank per 64-bit lane,
 * SET_V512 registers in flight
 *
 * At each colex position i the guide entry of every lane (rank >> gshift[i]) is gathered
 * (vpgatherdd of a 4-byte word at the 2-byte entry), then C(c, i) and C(c + 1, i) (two
 * vpgatherdq); a compare gives c or c + 1 and the value subtracted. Lanes whose entry is
 * marked SET_GUIDE_FAR and still below their answer go on one masked gather a step, the
 * other lanes idle (rare). The last two or three ids come from a gather of the pair
 * or triple table. The ids, one ymm register of 8 int32 per position, are put back in row
 * order by vpermt2d (t->didx) and stored. Same ids as unrank_run64_p.
 * --------------------------------------------------------------------------------- */

#ifndef SET_V512
#define SET_V512 2 /* zmm registers of 8 rows unranked together */
#endif

static inline __attribute__((always_inline)) R3_TARGET_SET512 void unrank512_k(const set_tab *t, const uint64_t *d,
                                                                              int32_t *dst, int n, const int k,
                                                                              const int tail) {
    const uint64_t *const c64 = t->c64;
    const uint16_t *const guide = t->guide;
    const size_t stride = (size_t)t->stride;
    const __m512i zero = _mm512_set1_epi64(k >= 2 ? (long long)(uint64_t)t->sets : -1);
    const __m256i one = _mm256_set1_epi32(1), low15 = _mm256_set1_epi32(SET_GUIDE_C), low8 = _mm256_set1_epi32(0xFF);
    const __m256i far_bit = _mm256_set1_epi32(SET_GUIDE_FAR);
    const int outs = (k + 1) / 2, pairs = (k + 3) / 4; /* zmm registers of output; of column pairs */
    int gs[SET_MAX_K + 1];
    for (int i = 0; i <= k; i++) gs[i] = t->gshift[i];
    int q = 0;
    for (; q + 8 * SET_V512 <= n; q += 8 * SET_V512) {
        __m512i r[SET_V512];
        __mmask8 z[SET_V512];
        __m256i col[SET_V512][SET_MAX_K];
#pragma GCC unroll 4
        for (int u = 0; u < SET_V512; u++) {
            const __m512i x = _mm512_loadu_si512((const void *)(d + q + 8 * u));
            z[u] = _mm512_cmpeq_epu64_mask(x, zero);
            r[u] = _mm512_maskz_mov_epi64((__mmask8)~z[u], x);
        }
#pragma GCC unroll 16
        for (int i = k; i > tail; i--) {
            const long long *const ci = (const long long *)(c64 + (size_t)i * stride);
            const int *const gi = (const int *)(const void *)(guide + ((size_t)i << t->gbits));
            const __m128i sh = _mm_cvtsi32_si128(gs[i]);
#pragma GCC unroll 4
            for (int u = 0; u < SET_V512; u++) {
                const __m512i v = r[u];
                const __m256i gix = _mm512_cvtepi64_epi32(_mm512_srl_epi64(v, sh));
                const __m256i g = _mm256_i32gather_epi32(gi, gix, 2);
                __m256i c = _mm256_and_si256(g, low15);
                const __m512i a0 = _mm512_i32gather_epi64(c, ci, 8);
                const __m512i a1 = _mm512_i32gather_epi64(c, ci + 1, 8);
                const __mmask8 s1 = _mm512_cmple_epu64_mask(a1, v), far = _mm256_test_epi32_mask(g, far_bit);
                __m512i lo = _mm512_mask_mov_epi64(a0, s1, a1);
                c = _mm256_mask_add_epi32(c, s1, c, one);
                if (__builtin_expect(far != 0, 0)) { /* the long scan: lanes with C(c + 1, i) <= v step on */
                    __mmask8 m = far & s1;
                    while (m) {
                        const __m512i hi = _mm512_mask_i32gather_epi64(lo, m, c, ci + 1, 8);
                        m = _mm512_mask_cmple_epu64_mask(m, hi, v);
                        c = _mm256_mask_add_epi32(c, m, c, one);
                        lo = _mm512_mask_mov_epi64(lo, m, hi);
                    }
                }
                r[u] = _mm512_sub_epi64(v, lo);
                col[u][i - 1] = c;
            }
        }
#pragma GCC unroll 4
        for (int u = 0; u < SET_V512; u++) {
            if (tail == 3) {
                const __m256i tr = _mm512_i64gather_epi32(r[u], (const int *)t->triple, 4);
                col[u][2] = _mm256_srli_epi32(tr, 16);
                col[u][1] = _mm256_and_si256(_mm256_srli_epi32(tr, 8), low8);
                col[u][0] = _mm256_and_si256(tr, low8);
            } else if (tail == 2) {
                const __m256i pr = _mm512_i64gather_epi32(r[u], (const int *)(const void *)t->pair, 2);
                col[u][1] = _mm256_and_si256(_mm256_srli_epi32(pr, 8), low8);
                col[u][0] = _mm256_and_si256(pr, low8);
            } else {
                col[u][0] = _mm512_cvtepi64_epi32(r[u]);
            }
            __m512i S[SET_MAX_K / 2];
#pragma GCC unroll 8
            for (int p = 0; p < outs; p++) { /* column pair p: ids 2p and 2p + 1 of the 8 rows, all-zero rows zeroed */
                const __m256i lo = _mm256_maskz_mov_epi32((__mmask8)~z[u], col[u][2 * p]);
                S[p] = 2 * p + 1 < k ? _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                                          _mm256_maskz_mov_epi32((__mmask8)~z[u], col[u][2 * p + 1]), 1)
                                     : _mm512_zextsi256_si512(lo);
            }
            int32_t *const o = dst + (size_t)(q + 8 * u) * k;
#pragma GCC unroll 8
            for (int w = 0; w < outs; w++) {
                __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int h = 0; h < pairs; h++) {
                    const __m512i idx = _mm512_loadu_si512((const void *)t->didx[w][h]);
                    const __m512i x = 2 * h + 1 < outs ? _mm512_permutex2var_epi32(S[2 * h], idx, S[2 * h + 1])
                                                       : _mm512_permutexvar_epi32(idx, S[2 * h]);
                    v = h == 0 ? x : _mm512_mask_mov_epi32(v, t->dmask[w][h], x);
                }
                if ((k & 1) && w == outs - 1) {
                    _mm512_mask_storeu_epi32((void *)(o + 16 * w), 0x00FF, v);
                } else {
                    _mm512_storeu_si512((void *)(o + 16 * w), v);
                }
            }
        }
    }
    if (q < n) unrank_run64_p(t, d + q, dst + (size_t)q * k, n - q, k, tail);
}

/* unrank_run64 with AVX-512 (narrow codecs; the CPU has F, BW, VL, DQ) */
static R3_TARGET_SET512 void unrank_run512(const set_tab *t, const uint64_t *d, int32_t *dst, int n) {
    switch (t->k) {
#define X(K)                                                        \
    case K:                                                         \
        if (K >= 3 && t->triple) {                                  \
            unrank512_k(t, d, dst, n, K, K >= 3 ? 3 : 1);           \
        } else if (K >= 2 && t->pair) {                             \
            unrank512_k(t, d, dst, n, K, K >= 2 ? 2 : 1);           \
        } else {                                                    \
            unrank512_k(t, d, dst, n, K, 1);                        \
        }                                                           \
        break;
    SET_CASES(X)
#undef X
    default: break;
    }
}
#endif

/* Decode rows [a, b) (b <= n_total / k) of a checked payload of a narrow codec into
   out[0 : (b - a) * k] (int32, contiguous), and with a = 0, b = n_total / k the tail ids
   (n_total % k) after them: the rows between two exception rows are one run of digits,
   read SET_BATCH at a time from the blocks, then unranked together. Rows before a cost
   a search of the exception rows and the digits of one block: the blocks before it are
   skipped (all but the last have w[m] bits). */
SET_INLINE void set_decode_narrow_k(const set_tab *t, const uint8_t *p, size_t plen, uint32_t n_total,
                                    uint32_t n_rows, uint32_t n_except, int32_t *out, const int k, uint32_t a,
                                    uint32_t b) {
    const int m = t->m, bits = t->bits;
    const uint64_t nd = n_rows - n_except, nbits = digit_bits(t, nd);
    const uint8_t *ex = p + (nbits + 7) / 8;
    const uint8_t *raw = ex + 4 * (size_t)n_except;
    const size_t raw_len = plen - (size_t)(raw - p);
    const uint64_t R = (uint64_t)t->radix, rinv = t->rinv;
    int w_of[SET_MAX_M + 1];
    for (int j = 0; j <= m; j++) w_of[j] = t->w[j];
    const uint32_t last = b < n_rows ? b : n_rows; /* rows up to here are stored */
    uint32_t row = a < n_rows ? a : n_rows, x = 0;
    if (row) { /* the exception rows below it */
        uint32_t hi = n_except;
        while (x < hi) {
            const uint32_t mid = x + (hi - x) / 2;
            if (get_u32s(ex + 4 * (size_t)mid) < row) {
                x = mid + 1;
            } else {
                hi = mid;
            }
        }
    }
    uint32_t next_ex = x < n_except ? get_u32s(ex + 4 * (size_t)x) : UINT32_MAX;
    uint64_t raw_pos = (uint64_t)x * (uint64_t)k * (uint64_t)bits, digit = row - x, bitpos, v = 0;
    int left = 0;
    if (m == 1) {
        bitpos = digit * (uint64_t)w_of[1];
    } else {
        const uint64_t blk = digit / (uint64_t)m;
        const int skip = (int)(digit - blk * (uint64_t)m);
        bitpos = blk * (uint64_t)w_of[m];
        if (skip) { /* row starts inside a block: its first digits divided out */
            left = nd - blk * (uint64_t)m < (uint64_t)m ? (int)(nd - blk * (uint64_t)m) : m;
            const int bw = w_of[left];
            v = bw <= 57 ? load_bits64(p, plen, bitpos, bw) : (uint64_t)load_bits128(p, plen, bitpos, bw);
            bitpos += (uint64_t)bw;
            for (int s = 0; s < skip; s++) {
                uint64_t rem;
                v = divr64(v, R, rinv, &rem);
            }
            left -= skip;
        }
    }
    uint64_t batch[SET_BATCH];
#ifdef R3_X86
    const int use512 = set512_gather_on();
#endif
    while (row < last) {
        const uint32_t stop = next_ex < last ? next_ex : last;
        while (row < stop) {
            const int nb = stop - row < SET_BATCH ? (int)(stop - row) : SET_BATCH;
            if (m == 1) {
                const int w = w_of[1];
                if (w <= 57) {
                    for (int q = 0; q < nb; q++, bitpos += (uint64_t)w) batch[q] = load_bits64(p, plen, bitpos, w);
                } else {
                    for (int q = 0; q < nb; q++, bitpos += (uint64_t)w) {
                        batch[q] = (uint64_t)load_bits128(p, plen, bitpos, w);
                    }
                }
            } else {
                int q = 0;
                while (q < nb) {
                    if (m == 2 && !left) { /* (64, 6): whole blocks of two digits, one division for both
                                              (a checked block is below R**2) */
                        for (; q + 2 <= nb && nd - digit >= 2; q += 2, digit += 2) {
                            const int bw = w_of[2];
                            const uint64_t x = bw <= 57 ? load_bits64(p, plen, bitpos, bw)
                                                        : (uint64_t)load_bits128(p, plen, bitpos, bw);
                            bitpos += (uint64_t)bw;
                            uint64_t rem;
                            batch[q + 1] = divr64(x, R, rinv, &rem);
                            batch[q] = rem;
                        }
                        if (q == nb) break;
                    }
                    /* one digit: a block cut by the batch's end, the last short one, or m > 2 */
                    if (!left) {
                        left = nd - digit < (uint64_t)m ? (int)(nd - digit) : m;
                        const int bw = w_of[left];
                        v = bw <= 57 ? load_bits64(p, plen, bitpos, bw) : (uint64_t)load_bits128(p, plen, bitpos, bw);
                        bitpos += (uint64_t)bw;
                    }
                    uint64_t rem;
                    v = divr64(v, R, rinv, &rem);
                    batch[q++] = rem;
                    left--;
                    digit++;
                }
            }
            int32_t *const dst = out + (size_t)(row - a) * k;
#ifdef R3_X86
            if (use512) {
                unrank_run512(t, batch, dst, nb);
            } else {
                unrank_run64(t, batch, dst, nb, k);
            }
#else
            unrank_run64(t, batch, dst, nb, k);
#endif
            row += (uint32_t)nb;
        }
        if (row < last) { /* row == next_ex: an exception, stored verbatim */
            int32_t *dst = out + (size_t)(row - a) * k;
            for (int j = 0; j < k; j++, raw_pos += (uint64_t)bits) dst[j] = (int32_t)load_bits64(raw, raw_len, raw_pos, bits);
            x++;
            next_ex = x < n_except ? get_u32s(ex + 4 * (size_t)x) : UINT32_MAX;
            row++;
        }
    }
    const uint32_t zeros = a > n_rows ? a : n_rows; /* rows after the last stored one */
    if (b > zeros) memset(out + (size_t)(zeros - a) * k, 0, (size_t)(b - zeros) * k * sizeof(int32_t));
    if (a == 0 && b == n_total / (uint32_t)k) {
        raw_pos = (uint64_t)n_except * (uint64_t)k * (uint64_t)bits;
        for (size_t i = (size_t)b * k; i < n_total; i++, raw_pos += (uint64_t)bits) {
            out[i] = (int32_t)load_bits64(raw, raw_len, raw_pos, bits);
        }
    }
}

/* Rows [a, b) of a checked payload into out[0 : (b - a) * k] (see set_decode_narrow_k); a
   wide codec decodes only whole frames (a = 0, b = n_total / k). */
static void set_decode_rows(const set_tab *t, const uint8_t *p, size_t plen, uint32_t n_total, uint32_t n_rows,
                            uint32_t n_except, int32_t *out, uint32_t a, uint32_t b) {
    if (t->narrow) {
        switch (t->k) {
#define X(K) case K: set_decode_narrow_k(t, p, plen, n_total, n_rows, n_except, out, K, a, b); break;
        SET_CASES(X)
#undef X
        default: break;
        }
        return;
    }
    switch (t->k) {
#define X(K) case K: set_decode_wide_k(t, p, plen, n_total, n_rows, n_except, out, K); break;
    SET_CASES(X)
#undef X
    default: break;
    }
}

static void set_decode_into(const set_tab *t, const uint8_t *p, size_t plen, uint32_t n_total, uint32_t n_rows,
                            uint32_t n_except, int32_t *out) {
    set_decode_rows(t, p, plen, n_total, n_rows, n_except, out, 0, n_total / (uint32_t)t->k);
}

R3_DOC(set_check_doc, "set_check(buf, num_experts, top_k, block_rows) -> (status, n_total, n_rows, n_except, tag)\n\n"
"Header, CRC-32C and size checks of an r3store.set frame (status 0: valid so far; else the\n"
"number of the first failed check, as check_set_frame_numpy).");

PyObject *py_set_check(PyObject *self, PyObject *args) {
    PyObject *obj;
    int E, k, m, owned, status;
    Py_buffer b;
    uint32_t n_total = 0, n_rows = 0, n_except = 0, tag = 0;
    if (!PyArg_ParseTuple(args, "Oiii", &obj, &E, &k, &m)) return NULL;
    set_tab *t = tab_get(E, k, m, &owned);
    if (!t) return NULL;
    if (get_bytes_buffer(obj, &b) < 0) {
        if (owned) tab_free(t);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = set_status(t, (const uint8_t *)b.buf, b.len, &n_total, &n_rows, &n_except, &tag);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (owned) tab_free(t);
    if (status && status != 5 && status != 6 && status != 7) n_total = n_rows = n_except = tag = 0;
    return Py_BuildValue("(ikkkk)", status, (unsigned long)n_total, (unsigned long)n_rows, (unsigned long)n_except,
                         (unsigned long)tag);
}

R3_DOC(set_decode_doc, "set_decode(buf, num_experts, top_k, block_rows, out, tag=-1) -> int\n\n"
"Check and decode an r3store.set frame into out (any integer type and layout, exactly\n"
"n_total elements, C order). Returns 0, or the number of the first failed check (1..10;\n"
"11: the frame's position tag is not tag, when tag >= 0; out is then untouched).");

PyObject *py_set_decode(PyObject *self, PyObject *args) {
    PyObject *obj, *out_obj;
    int E, k, m, owned, status;
    Py_buffer b, out;
    uint32_t n_total = 0, n_rows = 0, n_except = 0, tag = 0;
    long long want_tag = -1;
    if (!PyArg_ParseTuple(args, "OiiiO|L", &obj, &E, &k, &m, &out_obj, &want_tag)) return NULL;
    set_tab *t = tab_get(E, k, m, &owned);
    if (!t) return NULL;
    if (get_bytes_buffer(obj, &b) < 0) {
        if (owned) tab_free(t);
        return NULL;
    }
    if (get_int_buffer(out_obj, &out, 1, "out") < 0) {
        PyBuffer_Release(&b);
        if (owned) tab_free(t);
        return NULL;
    }
    cursor_t c;
    cursor_init(&c, &out);
    const int otype = buffer_type(&out);
    const int direct = otype == T_I32 && is_c_contiguous(&out);
    const uint8_t *d = (const uint8_t *)b.buf;
    int32_t *tmp = NULL;
    Py_BEGIN_ALLOW_THREADS
    status = set_status(t, d, b.len, &n_total, &n_rows, &n_except, &tag);
    if (!status && (Py_ssize_t)n_total != c.total) status = 5;
    if (!status && want_tag >= 0 && (long long)tag != want_tag) status = 11;
    if (!status) status = set_payload_status(t, d + SET_HEADER, (size_t)(b.len - SET_HEADER), n_total, n_rows, n_except);
    if (!status) {
        int32_t *dst = direct ? (int32_t *)out.buf : (tmp = malloc((size_t)n_total * sizeof(int32_t) + 4));
        if (dst) {
            set_decode_into(t, d + SET_HEADER, (size_t)(b.len - SET_HEADER), n_total, n_rows, n_except, dst);
            if (!direct) cursor_scatter(&c, otype, (const char *)tmp, T_I32, (Py_ssize_t)n_total);
        } else {
            status = -1;
        }
    }
    Py_END_ALLOW_THREADS
    free(tmp);
    PyBuffer_Release(&b);
    PyBuffer_Release(&out);
    if (owned) tab_free(t);
    if (status < 0) return PyErr_NoMemory();
    return PyLong_FromLong(status);
}

R3_DOC(set_decode_frames_doc, "set_decode_frames(blob, starts, lengths, num_experts, top_k, block_rows, out, rows,\n"
"layers, chunk_rows, layers_per_chunk, prefix_crc, row_chunks, layer_chunks, check_tags, row_first=None,\n"
"row_count=None) -> int\n\n"
"Check and decode many r3store.set frames of one storage object straight into their places\n"
"in out, a C-contiguous integer array (n, L, K) of 1-, 2- or 4-byte words, as decode_frames\n"
"does for r3store.bitpack: frame f is blob[starts[f] : starts[f] + lengths[f]], holds\n"
"chunk_rows * layers_per_chunk * K ids and lands in out[rows[f] : rows[f] + chunk_rows,\n"
"layers[f] : layers[f] + layers_per_chunk]; with check_tags its position tag must be the\n"
"CRC-32C of '<prefix>/<row_chunks[f]>/<layer_chunks[f]>' (prefix_crc = crc32c(prefix + '/')).\n"
"row_first, row_count (None, or int64 arrays like starts): only the chunk's rows\n"
"[row_first[f], row_first[f] + row_count[f]) are written, to out rows [rows[f], rows[f] +\n"
"row_count[f]); the rows before them are skipped by whole blocks of digits, not decoded.\n"
"Every check of set_decode is made. Returns -1 when every frame decoded, else the index of\n"
"the first frame that failed a check or lies outside blob or out (frames before it are\n"
"decoded, the others untouched; the caller names the fault).");

PyObject *py_set_decode_frames(PyObject *self, PyObject *args) {
    PyObject *blob_obj, *out_obj, *arr_obj[8] = {NULL, NULL, NULL, NULL, NULL, NULL, Py_None, Py_None};
    const char *names[8] = {"starts", "lengths", "rows", "layers", "row_chunks", "layer_chunks", "row_first",
                            "row_count"};
    int E, k, m, owned = 0, check_tags, i, ok = 1;
    Py_ssize_t chunk_rows, lpc, f, failed = -1;
    unsigned long prefix_crc;
    Py_buffer blob, out, arr[8];
    if (!PyArg_ParseTuple(args, "OOOiiiOOOnnkOOp|OO", &blob_obj, &arr_obj[0], &arr_obj[1], &E, &k, &m, &out_obj,
                          &arr_obj[2], &arr_obj[3], &chunk_rows, &lpc, &prefix_crc, &arr_obj[4], &arr_obj[5],
                          &check_tags, &arr_obj[6], &arr_obj[7])) {
        return NULL;
    }
    /* the row ranges come together or not at all */
    const int narr = arr_obj[6] != Py_None || arr_obj[7] != Py_None ? 8 : 6;
    if (narr == 8 && (arr_obj[6] == Py_None || arr_obj[7] == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "set_decode_frames: give both row_first and row_count, or neither");
        return NULL;
    }
    set_tab *t = tab_get(E, k, m, &owned);
    if (!t) return NULL;
    if (get_bytes_buffer(blob_obj, &blob) < 0) {
        if (owned) tab_free(t);
        return NULL;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&blob);
        if (owned) tab_free(t);
        return NULL;
    }
    if (get_i64_arrays(arr_obj, arr, names, narr) < 0) {
        PyBuffer_Release(&blob);
        PyBuffer_Release(&out);
        if (owned) tab_free(t);
        return NULL;
    }
    const int otype = buffer_type(&out);
    const Py_ssize_t n_total = batch_chunk_ids("set_decode_frames", &out, otype, chunk_rows, lpc);
    ok = n_total > 0;
    const Py_ssize_t N = ok ? out.shape[0] : 0, L = ok ? out.shape[1] : 0, K = ok ? out.shape[2] : 0;
    const Py_ssize_t width = lpc * K, n = arr[0].len / 8;
    int32_t *stage = NULL;
    if (ok && !(stage = (int32_t *)malloc((size_t)n_total * 4 + 4))) {
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
        const int direct = (otype == T_I32 || otype == T_U32) && lpc == L; /* a chunk is one run of out */
        /* a chunk row is whole set rows: a row range decodes alone (narrow codecs) */
        const int by_rows = t->narrow && width % k == 0;
        const uint32_t per_row = (uint32_t)(width / k);
        const conv_fn conv = conv_table[T_I32][otype];
        char *base = (char *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (f = 0; f < n; f++) {
            uint32_t nt = 0, nr = 0, ne = 0, tag = 0;
            const Py_ssize_t r0 = rf ? (Py_ssize_t)rf[f] : 0, rows_f = rn ? (Py_ssize_t)rn[f] : chunk_rows;
            if (st[f] < 0 || ln[f] < 0 || st[f] > blob.len - ln[f] || r0 < 0 || rows_f < 0 || r0 > chunk_rows - rows_f
                || rw[f] < 0 || rw[f] > N - rows_f || ly[f] < 0 || ly[f] > L - lpc) {
                failed = f;
                break;
            }
            const uint8_t *d = (const uint8_t *)blob.buf + st[f];
            const Py_ssize_t len = (Py_ssize_t)ln[f];
            if (set_status(t, d, len, &nt, &nr, &ne, &tag) || (Py_ssize_t)nt != n_total) {
                failed = f;
                break;
            }
            uint32_t want = 0;
            if (check_tags && (position_tag((uint32_t)prefix_crc, (long long)rc[f], (long long)lc[f], &want) < 0
                               || want != tag)) {
                failed = f;
                break;
            }
            const uint8_t *pl = d + SET_HEADER;
            const size_t plen = (size_t)(len - SET_HEADER);
            if (set_payload_status(t, pl, plen, nt, nr, ne)) {
                failed = f;
                break;
            }
            char *o0 = base + ((rw[f] * L + ly[f]) * K) * osize;
            const int whole = r0 == 0 && rows_f == chunk_rows;
            if (direct && whole) {
                set_decode_into(t, pl, plen, nt, nr, ne, (int32_t *)o0);
                continue;
            }
            if (!rows_f) continue;
            const int32_t *from = stage;
            if (whole) {
                set_decode_into(t, pl, plen, nt, nr, ne, stage);
            } else if (by_rows) { /* set rows [r0 * per_row, (r0 + rows_f) * per_row) alone */
                const uint32_t a = (uint32_t)r0 * per_row, b = (uint32_t)(r0 + rows_f) * per_row;
                if (direct) {
                    set_decode_rows(t, pl, plen, nt, nr, ne, (int32_t *)o0, a, b);
                    continue;
                }
                set_decode_rows(t, pl, plen, nt, nr, ne, stage, a, b);
            } else {
                set_decode_into(t, pl, plen, nt, nr, ne, stage);
                from = stage + r0 * width;
            }
            for (Py_ssize_t r = 0; r < rows_f; r++) {
                conv((const char *)(from + r * width), 4, o0 + r * L * K * osize, width);
            }
        }
        Py_END_ALLOW_THREADS
        free(stage);
    }
    for (i = 0; i < narr; i++) PyBuffer_Release(&arr[i]);
    PyBuffer_Release(&blob);
    PyBuffer_Release(&out);
    if (owned) tab_free(t);
    if (!ok) return NULL;
    return PyLong_FromSsize_t(failed);
}
