/*
 * crc32c.c: CRC-32C (Castagnoli), a slicing-by-8 table and SSE4.2: crc32c().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * CRC-32C (Castagnoli, reflected 0x82F63B78)
 * --------------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];

void crc_init_tables(void) {
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
