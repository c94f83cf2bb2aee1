/*
 * crc32c.c: CRC-32C (Castagnoli), a slicing-by-8 table and SSE4.2 (three streams): crc32c().
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

void crc_init_tables(void) {
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

uint32_t crc32c_extend(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t crc = ~value;
#ifdef R3_X86
    if (use_sse42) {
        return ~crc_hw(crc, p, n);
    }
#endif
    return ~crc_sw(crc, p, n);
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
