/*
 * gather.c: a row gather (rows of a (rows, layers, top_k) array by an int64 index, -1 = pad
 * row) with dtype conversion: gather_rows(); the runs of route rows a layout plan holds: route_runs().
 */
#include "r3k.h"

R3_DOC(gather_rows_doc, "gather_rows(src, index, out, fill_value, num_experts, pad_start) -> pad_rows\n\n"
"out[i] = src[index[i]] for index[i] >= 0, converted to out's integer type. src: (rows,\n"
"layers, top_k), any integer type and strides; index: C-contiguous int64; out:\n"
"C-contiguous (len(index), layers, top_k). A row with index -1 is a pad row: every id is\n"
"fill_value when num_experts is 0, else pad row p (counted from pad_start) holds\n"
"(p * top_k + j) % num_experts in slot j of every layer. Returns the pad rows written.");

PyObject *py_gather_rows(PyObject *self, PyObject *args) {
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

R3_DOC(route_runs_doc, "route_runs(index, token_offsets, mask, runs) -> int\n\n"
"The route rows a layout plan's positions hold, as runs: one pass over index (C-contiguous\n"
"int64, a plan's positions in C order: each a token of the concatenated token order, or -1\n"
"for padding). token_offsets (C-contiguous int64, B + 1 increasing values from 0): where\n"
"each sample starts in that order. Position p holds route row t - token_offsets[s] of\n"
"sample s, t = index[p] in [token_offsets[s], token_offsets[s + 1] - 1); a sample's last\n"
"token and padding hold none. mask (writable, 1 byte per position): 1 where a position\n"
"holds a route row, else 0 (the batch's replay mask). runs (writable C-contiguous int64\n"
"(capacity, 4)): per run of positions holding consecutive rows of one sample, (sample,\n"
"first row, stop row, first position), in position order. Returns the number of runs, or\n"
"-1 when there are more than capacity (mask and runs then hold a part). IndexError when\n"
"index holds a value outside [-1, token_offsets[B]).");

PyObject *py_route_runs(PyObject *self, PyObject *args) {
    PyObject *index_obj, *off_obj, *mask_obj, *runs_obj;
    Py_buffer index, off, mask, runs;
    if (!PyArg_ParseTuple(args, "OOOO", &index_obj, &off_obj, &mask_obj, &runs_obj)) {
        return NULL;
    }
    if (get_i64_array(index_obj, &index, "index") < 0) {
        return NULL;
    }
    if (get_i64_array(off_obj, &off, "token_offsets") < 0) {
        PyBuffer_Release(&index);
        return NULL;
    }
    if (PyObject_GetBuffer(mask_obj, &mask, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&index);
        PyBuffer_Release(&off);
        return NULL;
    }
    if (PyObject_GetBuffer(runs_obj, &runs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&index);
        PyBuffer_Release(&off);
        PyBuffer_Release(&mask);
        return NULL;
    }
    const Py_ssize_t n = index.len / 8, B = off.len / 8 - 1;
    const int64_t *idx = (const int64_t *)index.buf, *o = (const int64_t *)off.buf;
    const char *fault = NULL;
    Py_ssize_t i, m = 0;
    if (B < 0 || o[0] != 0) {
        fault = "route_runs: token_offsets must hold B + 1 >= 1 values from 0";
    } else if (mask.len != n || mask.itemsize != 1 || buffer_type(&runs) != T_I64 || runs.len % 32) {
        fault = "route_runs: mask must hold 1 byte per position and runs 4 int64 per run";
    }
    for (i = 0; !fault && i < B; i++) {
        if (o[i + 1] <= o[i]) {
            fault = "route_runs: token_offsets must increase (every sample holds a token)";
        }
    }
    if (fault) {
        PyErr_SetString(PyExc_ValueError, fault);
    } else {
        const int64_t total = o[B];
        uint8_t *mk = (uint8_t *)mask.buf;
        int64_t *run = (int64_t *)runs.buf, *cur = NULL;
        const Py_ssize_t capacity = runs.len / 32;
        Py_ssize_t s = 0;
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            const int64_t t = idx[i];
            if (t < -1 || t >= total) {
                fault = "route_runs: index holds a token outside [-1, token_offsets[B])";
                break;
            }
            if (t < 0) {
                mk[i] = 0;
                cur = NULL;
                continue;
            }
            if (t < o[s] || t >= o[s + 1]) { /* another sample: binary search */
                Py_ssize_t lo = 0, hi = B; /* o[lo] <= t < o[hi] */
                while (hi - lo > 1) {
                    const Py_ssize_t mid = lo + (hi - lo) / 2;
                    if (o[mid] <= t) lo = mid; else hi = mid;
                }
                s = lo;
            }
            if (t == o[s + 1] - 1) { /* the sample's last token: no route row */
                mk[i] = 0;
                cur = NULL;
                continue;
            }
            mk[i] = 1;
            const int64_t row = t - o[s];
            if (cur && cur[0] == s && cur[2] == row) {
                cur[2]++;
                continue;
            }
            if (m == capacity) {
                m = -1; /* more runs than room: the caller takes another path */
                break;
            }
            cur = run + 4 * m++;
            cur[0] = s;
            cur[1] = row;
            cur[2] = row + 1;
            cur[3] = i;
        }
        Py_END_ALLOW_THREADS
        if (fault) {
            PyErr_SetString(PyExc_IndexError, fault);
        }
    }
    PyBuffer_Release(&index);
    PyBuffer_Release(&off);
    PyBuffer_Release(&mask);
    PyBuffer_Release(&runs);
    return fault ? NULL : PyLong_FromSsize_t(m);
}
