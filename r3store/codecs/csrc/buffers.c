/* buffers.c: buffer-protocol helpers, the integer type of a buffer, the strided cursor. */
#include "r3k.h"

/* Integer type of a buffer from its format and itemsize; -1 if not a native integer. */
int buffer_type(const Py_buffer *v) {
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

int get_int_buffer(PyObject *obj, Py_buffer *v, int writable, const char *what) {
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

int get_bytes_buffer(PyObject *obj, Py_buffer *v) {
    return PyObject_GetBuffer(obj, v, PyBUF_SIMPLE);
}

/* ---------------------------------------------------------------------------------
 * strided cursor: walks any N-d buffer in C order as runs along its innermost dim
 * --------------------------------------------------------------------------------- */

void cursor_init(cursor_t *c, const Py_buffer *v) {
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

int is_c_contiguous(const Py_buffer *v) {
    cursor_t c;
    cursor_init(&c, v);
    return c.total <= 1 || (c.nd == 0 && c.inner_s == v->itemsize);
}

/* Next stretch of at most `want` elements: pointer, count, byte stride. */
Py_ssize_t cursor_take(cursor_t *c, Py_ssize_t want, char **p, Py_ssize_t *stride) {
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
 * argument checks shared by the Python functions
 * --------------------------------------------------------------------------------- */

int check_bits(int bits) {
    if (bits < 1 || bits > 16) {
        PyErr_Format(PyExc_ValueError, "bits must be in [1, 16], got %d", bits);
        return -1;
    }
    return 0;
}

int get_i64_array(PyObject *obj, Py_buffer *v, const char *what) {
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

int get_i64_arrays(PyObject *const *objs, Py_buffer *arr, const char *const *names, int n) {
    int i;
    for (i = 0; i < n; i++) {
        if (get_i64_array(objs[i], &arr[i], names[i]) < 0) {
            break;
        }
        if (arr[i].len != arr[0].len) {
            PyErr_Format(PyExc_ValueError, "%s has another length than %s", names[i], names[0]);
            PyBuffer_Release(&arr[i]);
            break;
        }
    }
    if (i == n) {
        return 0;
    }
    while (--i >= 0) {
        PyBuffer_Release(&arr[i]);
    }
    return -1;
}

/* the decimal digits of v >= 0 at p (no terminator); returns their count */
static int put_decimal(char *p, unsigned long long v) {
    char tmp[20];
    int k = 0, i;
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (i = 0; i < k; i++) {
        p[i] = tmp[k - 1 - i];
    }
    return k;
}

int position_tag(uint32_t prefix_crc, long long row_chunk, long long layer_chunk, uint32_t *tag) {
    /* the text '<row_chunk>/<layer_chunk>' as snprintf("%lld/%lld") writes it (negatives
       signed), without snprintf: this runs once per frame of every batch decode */
    char text[48];
    int k = 0;
    if (row_chunk < 0) text[k++] = '-';
    k += put_decimal(text + k, row_chunk < 0 ? 0ull - (unsigned long long)row_chunk : (unsigned long long)row_chunk);
    text[k++] = '/';
    if (layer_chunk < 0) text[k++] = '-';
    k += put_decimal(text + k,
                     layer_chunk < 0 ? 0ull - (unsigned long long)layer_chunk : (unsigned long long)layer_chunk);
    *tag = crc32c_extend(prefix_crc, (const uint8_t *)text, (size_t)k);
    return 0;
}

Py_ssize_t batch_chunk_ids(const char *fn, const Py_buffer *out, int otype, Py_ssize_t chunk_rows, Py_ssize_t lpc) {
    if (out->ndim != 3 || otype < 0 || type_size[otype] > 4 || chunk_rows < 1 || lpc < 1 || lpc > out->shape[1]) {
        PyErr_Format(PyExc_ValueError, "%s: out must be a 3-D array of 1-, 2- or 4-byte integers "
                                       "and 1 <= layers_per_chunk <= its layers", fn);
        return -1;
    }
    const Py_ssize_t n_total = chunk_rows * lpc * out->shape[2];
    if (n_total <= 0 || n_total > ((Py_ssize_t)1 << 26)) {
        PyErr_Format(PyExc_ValueError, "%s: chunk of more than 2**26 ids", fn);
        return -1;
    }
    return n_total;
}
