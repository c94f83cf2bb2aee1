/*
 * checks.c: route validation for writers (ids in [0, num_experts), no id twice in a row,
 * dense layers all zero), fused with the conversion to the writer's uint16 buffer: check_routes().
 */
#include "r3k.h"

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

R3_DOC(check_routes_doc, "check_routes(routes, kinds, num_experts, out) -> None | (fault, row, layer, slot)\n\n"
"Validate routes (rows, layers, top_k) of any integer type and strides. kinds: bytes, one\n"
"per layer, 0 for a dense layer (all ids must be 0), 1 for an MoE layer (ids in\n"
"[0, num_experts), none twice in a row). out: None or a C-contiguous uint16 array\n"
"(rows, MoE layers, top_k) that receives the MoE ids. Returns None, or the first fault\n"
"in the order dense, range, repeat: 1 dense id not 0, 2 id out of range, 3 id repeated\n"
"(slot 0), each at its first position in C order.");

PyObject *py_check_routes(PyObject *self, PyObject *args) {
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

/* ---------------------------------------------------------------------------------
 * route statistics for audits (validate): per (row, layer) the top id and whether an
 * id repeats, and a per-layer histogram of the ids of the cells a mask keeps
 * --------------------------------------------------------------------------------- */

typedef void (*stats_fn)(const char *base, const Py_ssize_t *shape, const Py_ssize_t *strides, int64_t *top,
                         uint8_t *repeated, int64_t *hist, Py_ssize_t nbins, const uint8_t *mask, int64_t *v);

/* v: scratch of top_k int64. Repeats: pairwise compares up to 32 ids, else a sorted copy. */
#define DEF_STATS(TN, T, WIDE)                                                                     \
    static void stats_##TN(const char *base, const Py_ssize_t *shape, const Py_ssize_t *strides,   \
                           int64_t *top, uint8_t *repeated, int64_t *hist, Py_ssize_t nbins,       \
                           const uint8_t *mask, int64_t *v) {                                       \
        const Py_ssize_t R = shape[0], L = shape[1], K = shape[2];                                 \
        const Py_ssize_t s0 = strides[0], s1 = strides[1], s2 = strides[2];                        \
        Py_ssize_t r, l, i, j;                                                                     \
        T x;                                                                                       \
        for (r = 0; r < R; r++) {                                                                  \
            for (l = 0; l < L; l++) {                                                              \
                const char *p = base + r * s0 + l * s1;                                            \
                const Py_ssize_t cell = r * L + l;                                                 \
                int64_t m = INT64_MIN;                                                             \
                int rep = 0;                                                                       \
                for (i = 0; i < K; i++) {                                                          \
                    memcpy(&x, p + i * s2, sizeof(T));                                             \
                    v[i] = (int64_t)(WIDE)x;                                                       \
                    m = v[i] > m ? v[i] : m;                                                       \
                }                                                                                  \
                if (K <= 32) {                                                                     \
                    for (i = 0; i < K - 1; i++) { /* no early exit: branch-free compares */      \
                        for (j = i + 1; j < K; j++) {                                              \
                            rep |= v[i] == v[j];                                                   \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                if (hist && (!mask || mask[cell])) {                                               \
                    int64_t *h = hist + l * nbins;                                                 \
                    for (i = 0; i < K; i++) {                                                      \
                        if (v[i] >= 0 && v[i] < nbins) {                                           \
                            h[v[i]]++;                                                             \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
                if (K > 32) {                                                                      \
                    qsort(v, (size_t)K, sizeof(int64_t), cmp_i64);                                 \
                    for (i = 1; i < K && !rep; i++) {                                              \
                        rep = v[i] == v[i - 1];                                                    \
                    }                                                                              \
                }                                                                                  \
                top[cell] = K ? m : 0;                                                             \
                repeated[cell] = (uint8_t)rep;                                                     \
            }                                                                                      \
        }                                                                                          \
    }

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

DEF_STATS(u8, uint8_t, uint64_t)
DEF_STATS(i8, int8_t, int64_t)
DEF_STATS(u16, uint16_t, uint64_t)
DEF_STATS(i16, int16_t, int64_t)
DEF_STATS(u32, uint32_t, uint64_t)
DEF_STATS(i32, int32_t, int64_t)
DEF_STATS(u64, uint64_t, uint64_t)
DEF_STATS(i64, int64_t, int64_t)

static const stats_fn stats_table[T_COUNT] = {stats_u8, stats_i8, stats_u16, stats_i16,
                                              stats_u32, stats_i32, stats_u64, stats_i64};

#ifdef R3_X86
/*
 * The common case of route_stats in one vector per (row, layer): 32-bit ids, top_k = 8,
 * each (layer, 8) block contiguous. Repeats: compares against the 4 rotations that pair
 * every two slots; the top id: a max reduction. The histogram stays scalar, counted in a
 * uint32 copy (layers x nbins x 4 bytes: L1-resident at 48 x 128) added to hist at the end
 * (and every HIST32_ROWS rows, so no count wraps).
 */
#define HIST32_ROWS ((Py_ssize_t)1 << 28) /* 2**28 rows x 8 ids < 2**32 counts per bin */
R3_TARGET_AVX2 static void stats_i32_k8_avx2(const char *base, Py_ssize_t R, Py_ssize_t L, Py_ssize_t s0,
                                             int is_signed, int64_t *top, uint8_t *repeated, int64_t *hist,
                                             Py_ssize_t nbins, const uint8_t *mask) {
    const __m256i rot1 = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
    const __m256i rot2 = _mm256_setr_epi32(2, 3, 4, 5, 6, 7, 0, 1);
    const __m256i rot3 = _mm256_setr_epi32(3, 4, 5, 6, 7, 0, 1, 2);
    const __m256i rot4 = _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3);
    Py_ssize_t r, l;
    int i;
    /* the uint32 copy of hist (NULL: counted straight into hist, when nbins is past 2**31 or no memory) */
    uint32_t *h32 = hist && nbins > 0 && nbins <= ((Py_ssize_t)1 << 31) && L > 0
                        ? (uint32_t *)calloc((size_t)(L * nbins), sizeof(uint32_t)) : NULL;
    for (r = 0; r < R; r++) {
        const char *row = base + r * s0;
        for (l = 0; l < L; l++) {
            const Py_ssize_t cell = r * L + l;
            const char *p = row + l * 32;
            const __m256i x = _mm256_loadu_si256((const __m256i *)p);
            __m256i eq = _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot1));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot2)));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot3)));
            eq = _mm256_or_si256(eq, _mm256_cmpeq_epi32(x, _mm256_permutevar8x32_epi32(x, rot4)));
            repeated[cell] = (uint8_t)!_mm256_testz_si256(eq, eq);
            __m256i m = is_signed ? _mm256_max_epi32(x, _mm256_permutevar8x32_epi32(x, rot4))
                                  : _mm256_max_epu32(x, _mm256_permutevar8x32_epi32(x, rot4));
            m = is_signed ? _mm256_max_epi32(m, _mm256_permutevar8x32_epi32(m, rot2))
                          : _mm256_max_epu32(m, _mm256_permutevar8x32_epi32(m, rot2));
            m = is_signed ? _mm256_max_epi32(m, _mm256_permutevar8x32_epi32(m, rot1))
                          : _mm256_max_epu32(m, _mm256_permutevar8x32_epi32(m, rot1));
            const int32_t lane = _mm256_cvtsi256_si32(m);
            top[cell] = is_signed ? (int64_t)lane : (int64_t)(uint32_t)lane;
            if (h32 && (!mask || mask[cell])) {
                /* as uint32, a negative int32 id is >= 2**31 >= nbins: not counted, as below */
                uint32_t *h = h32 + l * nbins;
                uint32_t w[8];
                memcpy(w, p, sizeof w);
                for (i = 0; i < 8; i++) {
                    if (w[i] < (uint32_t)nbins) {
                        h[w[i]]++;
                    }
                }
            } else if (hist && (!mask || mask[cell])) {
                int64_t *h = hist + l * nbins;
                int32_t w[8];
                memcpy(w, p, sizeof w);
                for (i = 0; i < 8; i++) {
                    const int64_t v = is_signed ? (int64_t)w[i] : (int64_t)(uint32_t)w[i];
                    if (v >= 0 && v < nbins) {
                        h[v]++;
                    }
                }
            }
        }
        if (h32 && ((r + 1) % HIST32_ROWS == 0 || r + 1 == R)) {
            for (Py_ssize_t j = 0; j < L * nbins; j++) {
                hist[j] += h32[j];
            }
            memset(h32, 0, (size_t)(L * nbins) * sizeof *h32);
        }
    }
    free(h32);
}
#endif

R3_DOC(route_stats_doc, "route_stats(routes, top, repeated, hist, mask) -> None\n\n"
"Per (row, layer) of routes (rows, layers, top_k), any integer type and strides: top[row,\n"
"layer] = the largest id (as int64; 0 when top_k is 0) and repeated[row, layer] = 1 when an\n"
"id appears twice, else 0. top: C-contiguous int64 (rows, layers); repeated: C-contiguous\n"
"bytes (rows * layers). hist: None or a C-contiguous int64 array (layers, nbins) to which\n"
"every id in [0, nbins) of a cell is counted, when mask (None, or rows * layers bytes) is\n"
"non-zero for the cell.");

static int get_c_buffer(PyObject *obj, Py_buffer *v, Py_ssize_t nbytes, int i64, const char *what) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        return -1;
    }
    if ((i64 && buffer_type(v) != T_I64) || (nbytes >= 0 && v->len != nbytes)) {
        PyErr_Format(PyExc_ValueError, "route_stats: %s must be a C-contiguous %s buffer of %zd bytes", what,
                     i64 ? "int64" : "byte", nbytes);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* The strides of a routes buffer (C order when the exporter gives none). */
static void routes_strides(const Py_buffer *routes, Py_ssize_t strides[3]) {
    if (routes->strides) {
        for (int i = 0; i < 3; i++) strides[i] = routes->strides[i];
        return;
    }
    strides[2] = routes->itemsize;
    strides[1] = strides[2] * routes->shape[2];
    strides[0] = strides[1] * routes->shape[1];
}

/* hist (None, or int64 (layers, nbins)) and mask (None, or rows * layers bytes) of route_stats
   and route_stats_pieces; 0 with has_hist/has_mask set (release what is held), or -1 with an
   error set and nothing held. */
static int get_hist_mask(PyObject *hist_obj, PyObject *mask_obj, Py_ssize_t R, Py_ssize_t L, const char *fn,
                         Py_buffer *hist, int *has_hist, Py_buffer *mask, int *has_mask) {
    *has_hist = hist_obj != Py_None;
    *has_mask = mask_obj != Py_None;
    if (*has_hist) {
        if (get_c_buffer(hist_obj, hist, -1, 1, "hist") < 0) return -1;
        if (hist->ndim != 2 || hist->shape[0] != L) {
            PyErr_Format(PyExc_ValueError, "%s: hist must have shape (layers, nbins)", fn);
            PyBuffer_Release(hist);
            return -1;
        }
    }
    if (*has_mask) {
        int bad = PyObject_GetBuffer(mask_obj, mask, PyBUF_SIMPLE) < 0;
        if (!bad && mask->len != R * L) {
            PyErr_Format(PyExc_ValueError, "%s: mask must hold one byte per (row, layer)", fn);
            PyBuffer_Release(mask);
            bad = 1;
        }
        if (bad) {
            if (*has_hist) PyBuffer_Release(hist);
            return -1;
        }
    }
    return 0;
}

/* Per (row, layer) cell of rows x L x K routes at base: the AVX2 kernel for 32-bit ids at
   top_k = 8 in C order, else the per-type one (scratch: K int64). */
static void stats_cells(const char *base, Py_ssize_t rows, Py_ssize_t L, Py_ssize_t K, const Py_ssize_t *strides,
                        int type, int64_t *top, uint8_t *repeated, int64_t *hist, Py_ssize_t nbins,
                        const uint8_t *mask, int64_t *scratch) {
#ifdef R3_X86
    if (use_avx2 && (type == T_I32 || type == T_U32) && K == 8 && strides[2] == 4 && strides[1] == 32) {
        stats_i32_k8_avx2(base, rows, L, strides[0], type == T_I32, top, repeated, hist, nbins, mask);
        return;
    }
#endif
    const Py_ssize_t shape[3] = {rows, L, K};
    stats_table[type](base, shape, strides, top, repeated, hist, nbins, mask, scratch);
}

PyObject *py_route_stats(PyObject *self, PyObject *args) {
    PyObject *routes_obj, *top_obj, *rep_obj, *hist_obj, *mask_obj;
    Py_buffer routes, top, rep, hist, mask;
    int has_hist = 0, has_mask = 0, ok = 1;
    if (!PyArg_ParseTuple(args, "OOOOO", &routes_obj, &top_obj, &rep_obj, &hist_obj, &mask_obj)) {
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
    const Py_ssize_t R = routes.shape[0], L = routes.shape[1], K = routes.shape[2];
    if (get_c_buffer(top_obj, &top, R * L * 8, 1, "top") < 0) {
        PyBuffer_Release(&routes);
        return NULL;
    }
    if (get_c_buffer(rep_obj, &rep, R * L, 0, "repeated") < 0) {
        PyBuffer_Release(&routes);
        PyBuffer_Release(&top);
        return NULL;
    }
    if (get_hist_mask(hist_obj, mask_obj, R, L, "route_stats", &hist, &has_hist, &mask, &has_mask) < 0) {
        ok = 0;
    }
    int64_t *scratch = NULL;
    if (ok && !(scratch = (int64_t *)malloc((size_t)(K ? K : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        if (has_mask) PyBuffer_Release(&mask);
        if (has_hist) PyBuffer_Release(&hist);
        ok = 0;
    }
    if (ok) {
        Py_ssize_t strides[3];
        routes_strides(&routes, strides);
        const int type = buffer_type(&routes);
        Py_BEGIN_ALLOW_THREADS
        stats_cells((const char *)routes.buf, R, L, K, strides, type, (int64_t *)top.buf, (uint8_t *)rep.buf,
                    has_hist ? (int64_t *)hist.buf : NULL, has_hist ? hist.shape[1] : 0,
                    has_mask ? (const uint8_t *)mask.buf : NULL, scratch);
        Py_END_ALLOW_THREADS
        free(scratch);
        if (has_mask) PyBuffer_Release(&mask);
        if (has_hist) PyBuffer_Release(&hist);
    }
    PyBuffer_Release(&routes);
    PyBuffer_Release(&top);
    PyBuffer_Release(&rep);
    if (!ok) {
        return NULL;
    }
    Py_RETURN_NONE;
}


/* ---------------------------------------------------------------------------------
 * route_stats summed over pieces of rows (validate: one piece per sample a row block
 * holds): the per-cell results of a tile of rows stay in a cache-sized scratch, so the
 * common case (nothing wrong) writes no per-cell array at all
 * --------------------------------------------------------------------------------- */

#define STATS_TILE 1024

/* Per layer over rows cells: top[l] = max, nonzero[l] += cells whose top is not 0, rep[l] |= repeats
   (the tile's per-cell results are in L2; the loop over layers vectorises). */
static inline __attribute__((always_inline)) void stats_sum_body(
        const int64_t *restrict tt, const uint8_t *restrict tr, Py_ssize_t rows, Py_ssize_t L, int64_t *restrict top,
        int64_t *restrict nonzero, uint8_t *restrict rep) {
    for (Py_ssize_t r = 0; r < rows; r++, tt += L, tr += L) {
        for (Py_ssize_t l = 0; l < L; l++) {
            top[l] = tt[l] > top[l] ? tt[l] : top[l];
            nonzero[l] += tt[l] != 0;
            rep[l] |= tr[l];
        }
    }
}

/* the same loop compiled twice: for the baseline ISA and for AVX2 (64-bit compares in vectors) */
static void stats_sum_plain(const int64_t *tt, const uint8_t *tr, Py_ssize_t rows, Py_ssize_t L, int64_t *top,
                            int64_t *nonzero, uint8_t *rep) {
    stats_sum_body(tt, tr, rows, L, top, nonzero, rep);
}

#ifdef R3_X86
R3_TARGET_AVX2 static void stats_sum_avx2(const int64_t *tt, const uint8_t *tr, Py_ssize_t rows, Py_ssize_t L,
                                          int64_t *top, int64_t *nonzero, uint8_t *rep) {
    stats_sum_body(tt, tr, rows, L, top, nonzero, rep);
}
#endif

static void stats_sum_rows(const int64_t *tt, const uint8_t *tr, Py_ssize_t rows, Py_ssize_t L, int64_t *top,
                           int64_t *nonzero, uint8_t *rep) {
#ifdef R3_X86
    if (use_avx2) {
        stats_sum_avx2(tt, tr, rows, L, top, nonzero, rep);
        return;
    }
#endif
    stats_sum_plain(tt, tr, rows, L, top, nonzero, rep);
}

R3_DOC(route_stats_pieces_doc, "route_stats_pieces(routes, cuts, top, repeated, nonzero, hist, mask) -> None\n\n"
"route_stats summed over pieces of rows: piece p is rows [cuts[p], cuts[p + 1]) of routes\n"
"(rows, layers, top_k), any integer type and strides. top[p, l]: the largest id of the piece's\n"
"cells in layer l (-1 when the piece has no rows); repeated[p, l]: 1 when one of them holds an\n"
"id twice; nonzero[p, l]: how many of them hold an id other than 0 (their largest id is not 0).\n"
"cuts: C-contiguous int64, non-decreasing, from 0 to rows; top, nonzero: C-contiguous int64\n"
"(pieces, layers); repeated: pieces * layers bytes. hist and mask as in route_stats.");

PyObject *py_route_stats_pieces(PyObject *self, PyObject *args) {
    PyObject *routes_obj, *cuts_obj, *top_obj, *rep_obj, *nz_obj, *hist_obj, *mask_obj;
    Py_buffer routes, cuts, top, rep, nz, hist, mask;
    int has_hist = 0, has_mask = 0, held = 0, ok = 1;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &routes_obj, &cuts_obj, &top_obj, &rep_obj, &nz_obj, &hist_obj,
                          &mask_obj)) {
        return NULL;
    }
    if (get_int_buffer(routes_obj, &routes, 0, "routes") < 0) return NULL;
    held = 1;
    if (routes.ndim != 3) {
        PyErr_SetString(PyExc_ValueError, "routes must have 3 dimensions");
        ok = 0;
    }
    const Py_ssize_t R = ok ? routes.shape[0] : 0, L = ok ? routes.shape[1] : 0, K = ok ? routes.shape[2] : 0;
    Py_ssize_t n = 0;
    if (ok && PyObject_GetBuffer(cuts_obj, &cuts, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        ok = 0;
    } else if (ok) {
        held = 2;
        if (buffer_type(&cuts) != T_I64 || cuts.len < 8) {
            PyErr_SetString(PyExc_ValueError, "route_stats_pieces: cuts must be a C-contiguous int64 array of >= 1 value");
            ok = 0;
        } else {
            const int64_t *c = (const int64_t *)cuts.buf;
            n = cuts.len / 8 - 1;
            if (c[0] != 0 || c[n] != R) ok = 0;
            for (Py_ssize_t p = 0; ok && p < n; p++) ok = c[p] <= c[p + 1];
            if (!ok) PyErr_SetString(PyExc_ValueError, "route_stats_pieces: cuts must rise from 0 to the rows");
        }
    }
    if (ok && get_c_buffer(top_obj, &top, n * L * 8, 1, "top") < 0) ok = 0;
    else if (ok) held = 3;
    if (ok && get_c_buffer(rep_obj, &rep, n * L, 0, "repeated") < 0) ok = 0;
    else if (ok) held = 4;
    if (ok && get_c_buffer(nz_obj, &nz, n * L * 8, 1, "nonzero") < 0) ok = 0;
    else if (ok) held = 5;
    if (ok && get_hist_mask(hist_obj, mask_obj, R, L, "route_stats_pieces", &hist, &has_hist, &mask, &has_mask) < 0) {
        ok = 0;
    }
    const Py_ssize_t tile = STATS_TILE;
    int64_t *ttop = NULL, *scratch = NULL;
    uint8_t *trep = NULL;
    if (ok) {
        ttop = (int64_t *)malloc((size_t)(tile * (L ? L : 1)) * sizeof(int64_t));
        trep = (uint8_t *)malloc((size_t)(tile * (L ? L : 1)));
        scratch = (int64_t *)malloc((size_t)(K ? K : 1) * sizeof(int64_t));
        if (!ttop || !trep || !scratch) {
            PyErr_NoMemory();
            if (has_mask) PyBuffer_Release(&mask);
            if (has_hist) PyBuffer_Release(&hist);
            ok = 0;
        }
    }
    if (ok) {
        Py_ssize_t strides[3];
        routes_strides(&routes, strides);
        const int type = buffer_type(&routes);
        const int64_t *c = (const int64_t *)cuts.buf;
        int64_t *ptop = (int64_t *)top.buf, *pnz = (int64_t *)nz.buf;
        uint8_t *prep = (uint8_t *)rep.buf;
        int64_t *h = has_hist ? (int64_t *)hist.buf : NULL;
        const Py_ssize_t nbins = has_hist ? hist.shape[1] : 0;
        const uint8_t *m = has_mask ? (const uint8_t *)mask.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t p = 0; p < n; p++) {
            int64_t *at = ptop + p * L, *an = pnz + p * L;
            uint8_t *ar = prep + p * L;
            for (Py_ssize_t l = 0; l < L; l++) {
                at[l] = -1;
                an[l] = 0;
                ar[l] = 0;
            }
            for (Py_ssize_t r0 = c[p]; r0 < c[p + 1]; r0 += tile) {
                const Py_ssize_t rows = c[p + 1] - r0 < tile ? c[p + 1] - r0 : tile;
                const char *b = (const char *)routes.buf + r0 * strides[0];
                const uint8_t *mt = m ? m + r0 * L : NULL;
                stats_cells(b, rows, L, K, strides, type, ttop, trep, h, nbins, mt, scratch);
                stats_sum_rows(ttop, trep, rows, L, at, an, ar);
            }
        }
        Py_END_ALLOW_THREADS
        if (has_mask) PyBuffer_Release(&mask);
        if (has_hist) PyBuffer_Release(&hist);
    }
    free(ttop);
    free(trep);
    free(scratch);
    if (held >= 5) PyBuffer_Release(&nz);
    if (held >= 4) PyBuffer_Release(&rep);
    if (held >= 3) PyBuffer_Release(&top);
    if (held >= 2) PyBuffer_Release(&cuts);
    PyBuffer_Release(&routes);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}
