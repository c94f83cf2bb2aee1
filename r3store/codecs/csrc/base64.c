/*
 * base64.c: a strict base64 decoder (the canonical subset of RFC 4648; anything else is
 * left to binascii): b64decode(), b64_decoded_size().
 */
#include "r3k.h"

/* ---------------------------------------------------------------------------------
 * base64 (RFC 4648 alphabet, canonical padding only)
 * --------------------------------------------------------------------------------- */

static int8_t b64_value[256];

void b64_init(void) {
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


R3_DOC(b64decode_doc, "b64decode(text, out) -> int\n\n"
"Decode canonical base64 (str or bytes-like; RFC 4648 alphabet, length a multiple of 4,\n"
"'=' padding only at the end) into the writable bytes out. Returns the bytes written,\n"
"or -1 if the text is not canonical base64 or out is too small (nothing is raised:\n"
"the caller asks binascii for the exact verdict).");

PyObject *py_b64decode(PyObject *self, PyObject *args) {
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

R3_DOC(b64size_doc, "b64_decoded_size(text) -> int\n\n"
"Bytes that canonical base64 text decodes to (from its length and padding), or -1.");

PyObject *py_b64size(PyObject *self, PyObject *args) {
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
