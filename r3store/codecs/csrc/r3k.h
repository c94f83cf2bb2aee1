/*
 * r3k.h: the internal header of r3store.codecs._kernels (not installed, not a public API).
 *
 * The extension is one module built from one C file per concern (setup.py lists them):
 *
 *   buffers.c  buffer-protocol helpers, the integer type of a buffer, the strided cursor
 *   dtypes.c   integer conversions between the eight native integer types
 *   crc32c.c   CRC-32C (table, SSE4.2, PCLMULQDQ and VPCLMULQDQ folding), crc32c(),
 *              crc_path()/set_crc_path()
 *   pack.c     bit packing (widths 1..16, AVX2 for <= 14 bits), pack()
 *   unpack.c   bit unpacking into 1-, 2-, 4-byte words (AVX2, AVX-512 VBMI), unpack(),
 *              set_avx512(), set_stream_min() (non-temporal stores for large outputs)
 *   frames.c   r3store.bitpack frames: encode_frame(), encode_frames(), check_frame(), decode_frames()
 *   checks.c   route validation for writers (AVX2 fast path), check_routes(); audit
 *              statistics (top id, repeats, id histogram), route_stats()
 *   gather.c   row gather with pad rows, gather_rows()
 *   setcodec.c r3store.set frames: set_encode(), set_check(), set_decode(),
 *              setcodec_avx512(), setcodec_gather_decode()
 *   module.c   CPU feature choice, simd()/set_simd()/cpu_features(), the method table
 *
 * Arrays arrive through the buffer protocol (any integer format, any strides); no numpy
 * headers are needed, and the module uses the stable ABI (Python >= 3.11). Every kernel
 * runs with the GIL released. The build targets the baseline ISA; AVX2/BMI2/SSE4.2 code
 * lives in functions with target attributes and runs only when the CPU reports those
 * features at import (__builtin_cpu_supports). The numpy code in
 * r3store/codecs/_kernels_numpy.py is the reference: the test suite checks both agree.
 *
 * Adding a concern: a new .c file including this header, its Python functions declared
 * below (R3_DOC for their docstrings), one line each in module.c's method table and the
 * file in setup.py's sources list.
 */
#ifndef R3K_H
#define R3K_H

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

/* the functions shared between the files stay inside the module (PyInit__kernels is
   exported by PyMODINIT_FUNC's own attribute) */
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility push(hidden)
#endif

#define R3_MAXDIM 64
#define R3_CHUNK 4096 /* ids staged at a time (a multiple of 8: byte-aligned in the stream) */

/* a docstring visible to module.c's method table */
#define R3_DOC(name, str) const char name[] = PyDoc_STR(str)

/* module.c: the kernels chosen at import (set_simd changes them) */
extern int use_avx2;  /* AVX2 + BMI2 kernels */

/* crc32c.c: the CRC-32C code path (set_crc_path and set_simd change it) */
enum { CRC_PATH_TABLE, CRC_PATH_SSE42, CRC_PATH_PCLMUL, CRC_PATH_AVX512, CRC_PATH_COUNT };
extern int crc_path;
int crc_best_path(void);

/* ---------------------------------------------------------------------------------
 * element types (buffers.c, dtypes.c)
 * --------------------------------------------------------------------------------- */

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_U64, T_I64, T_COUNT };

static const int type_size[T_COUNT] = {1, 1, 2, 2, 4, 4, 8, 8};

int buffer_type(const Py_buffer *v);
int get_int_buffer(PyObject *obj, Py_buffer *v, int writable, const char *what);
int get_bytes_buffer(PyObject *obj, Py_buffer *v);
int get_i64_array(PyObject *obj, Py_buffer *v, const char *what);
/* n int64 arrays of the length of the first (a batch decode's frame table): 0, or -1 with an
 * exception set and no buffer held */
int get_i64_arrays(PyObject *const *objs, Py_buffer *arr, const char *const *names, int n);
/* a frame's position tag (FORMAT.md 5.1): CRC-32C of "<row chunk>/<layer chunk>" extended from
 * prefix_crc (the CRC of the array's prefix); -1 if the text does not fit */
int position_tag(uint32_t prefix_crc, long long row_chunk, long long layer_chunk, uint32_t *tag);
/* the ids of one chunk of a batch decode into out (chunk_rows x layers_per_chunk x top_k), after
 * checking out's shape and type and the chunk's size; -1 with a ValueError naming fn */
Py_ssize_t batch_chunk_ids(const char *fn, const Py_buffer *out, int otype, Py_ssize_t chunk_rows, Py_ssize_t lpc);
int check_bits(int bits);

static inline Py_ssize_t packed_nbytes(Py_ssize_t n, int bits) {
    return (Py_ssize_t)(((uint64_t)n * (uint64_t)bits + 7u) / 8u);
}

/* strided cursor: walks any N-d buffer in C order as runs along its innermost dim */
typedef struct {
    int nd; /* outer dims */
    Py_ssize_t shape[R3_MAXDIM], strides[R3_MAXDIM], idx[R3_MAXDIM];
    Py_ssize_t inner_n, inner_s; /* elements and byte stride of the innermost dim */
    Py_ssize_t total;
    char *run; /* start of the current run */
    Py_ssize_t pos; /* elements of the current run already consumed */
} cursor_t;

void cursor_init(cursor_t *c, const Py_buffer *v);
int is_c_contiguous(const Py_buffer *v);
Py_ssize_t cursor_take(cursor_t *c, Py_ssize_t want, char **p, Py_ssize_t *stride);

/* conversions: strided source of type S -> contiguous destination of type D */
typedef void (*conv_fn)(const char *src, Py_ssize_t sstride, char *dst, Py_ssize_t n);
extern const conv_fn conv_table[T_COUNT][T_COUNT];
void cursor_scatter(cursor_t *c, int dt, const char *src, int st, Py_ssize_t n);
void cursor_zero(cursor_t *c, int dt, Py_ssize_t n);

/* ---------------------------------------------------------------------------------
 * CRC-32C (crc32c.c)
 * --------------------------------------------------------------------------------- */

void crc_init_tables(void);
uint32_t crc32c_extend(uint32_t value, const uint8_t *p, size_t n);
/* CRC-32C of n ids of in_bytes (1, 2) bytes at p while copying or zero-extending them to osize-byte
   words at out (osize >= in_bytes), each byte read once; only where crc_widen_supported() */
int crc_widen_supported(void);
int crc_avx512_cpu(void); /* the CPU can run the 'avx512' CRC path */
uint32_t crc32c_widen(uint32_t value, const uint8_t *p, size_t n, int in_bytes, char *out, int osize, int stream);

/* ---------------------------------------------------------------------------------
 * bit packing (pack.c) and unpacking (unpack.c)
 * --------------------------------------------------------------------------------- */

uint64_t pack_buffer(const Py_buffer *src, int type, int bits, uint8_t *out, Py_ssize_t *n_used);

static inline int fits(uint64_t acc, int bits) { return (acc >> bits) == 0; }

void unpack_contig(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize);
void unpack_contig_as(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, char *out, int osize, int stream);
/* the output size from which decodes use non-temporal stores (set_stream_min) */
Py_ssize_t stream_from(void);
void unpack_rows(const uint8_t *const *p, const Py_ssize_t *plen, int count, Py_ssize_t rows, Py_ssize_t gpr,
                 int bits, char *out, Py_ssize_t stride, int osize, Py_ssize_t out_bytes);
void unpack_to_buffer(const uint8_t *p, Py_ssize_t plen, Py_ssize_t n, int bits, Py_buffer *out, int otype);

/* ---------------------------------------------------------------------------------
 * the Python functions (module.c lists them)
 * --------------------------------------------------------------------------------- */

#define R3_PYFUNC(name)                                  \
    extern const char name##_doc[];                      \
    PyObject *py_##name(PyObject *self, PyObject *args);

R3_PYFUNC(pack)
R3_PYFUNC(unpack)
R3_PYFUNC(encode_frame)
R3_PYFUNC(encode_frames)
R3_PYFUNC(check_frame)
R3_PYFUNC(decode_frames)
R3_PYFUNC(decode_frame)
R3_PYFUNC(set_fused)
R3_PYFUNC(check_routes)
R3_PYFUNC(route_stats)
R3_PYFUNC(route_stats_pieces)
R3_PYFUNC(gather_rows)
R3_PYFUNC(route_runs)
R3_PYFUNC(crc32c)
R3_PYFUNC(crc_path)
R3_PYFUNC(set_crc_path)
R3_PYFUNC(set_avx512)
R3_PYFUNC(set_stream_min)
R3_PYFUNC(setcodec_avx512)
R3_PYFUNC(setcodec_gather_decode)
R3_PYFUNC(set_encode)
R3_PYFUNC(set_check)
R3_PYFUNC(set_decode)
R3_PYFUNC(set_decode_frames)

#undef R3_PYFUNC

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC visibility pop
#endif

#endif /* R3K_H */
