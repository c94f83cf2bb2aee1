/*
 * module.c: r3store.codecs._kernels, compiled kernels behind r3store.codecs.kernels.
 *
 * - bit-pack / unpack of r3store.bitpack payloads (widths 1..16, schema/FORMAT.md 5.1),
 *   whole frames included (header, CRC-32C): pack.c, unpack.c, frames.c, crc32c.c;
 * - route validation for writers (ids in [0, num_experts), no id twice in a row,
 *   dense layers all zero), fused with the conversion to the writer's uint16 buffer:
 *   checks.c;
 * - a row gather (rows of a (rows, layers, top_k) array by an int64 index, -1 = pad row)
 *   with dtype conversion: gather.c.
 *
 * (base64 is pybase64's, from r3store.codecs.kernels.)
 *
 * This file chooses the kernels by the CPU at import and holds the method table; r3k.h
 * describes the layout of the sources.
 */
#include "r3k.h"

int use_avx2 = 0;  /* AVX2 + BMI2 kernels */

PyDoc_STRVAR(simd_doc, "simd() -> str\n\n'avx2' when the AVX2/BMI2 kernels run, else 'scalar'.");

static PyObject *py_simd(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(use_avx2 ? "avx2" : "scalar");
}

PyDoc_STRVAR(cpu_doc, "cpu_features() -> dict\n\nWhat the CPU reports (x86: avx2, bmi2, sse4.2, pclmulqdq, avx512f,\n"
"avx512bw, vpclmulqdq).");

static PyObject *py_cpu_features(PyObject *self, PyObject *unused) {
    int avx2 = 0, bmi2 = 0, sse42 = 0, pclmul = 0, avx512f = 0, avx512bw = 0, vpclmul = 0;
#ifdef R3_X86
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2") != 0;
    bmi2 = __builtin_cpu_supports("bmi2") != 0;
    sse42 = __builtin_cpu_supports("sse4.2") != 0;
    pclmul = __builtin_cpu_supports("pclmul") != 0;
    avx512f = __builtin_cpu_supports("avx512f") != 0;
    avx512bw = __builtin_cpu_supports("avx512bw") != 0;
    vpclmul = __builtin_cpu_supports("vpclmulqdq") != 0;
#endif
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:O}", "avx2", avx2 ? Py_True : Py_False, "bmi2",
                         bmi2 ? Py_True : Py_False, "sse4.2", sse42 ? Py_True : Py_False, "pclmulqdq",
                         pclmul ? Py_True : Py_False, "avx512f", avx512f ? Py_True : Py_False, "avx512bw",
                         avx512bw ? Py_True : Py_False, "vpclmulqdq", vpclmul ? Py_True : Py_False);
}

PyDoc_STRVAR(set_simd_doc, "set_simd(level) -> str\n\n"
"Use 'avx2' (only where the CPU has it; with the fastest CRC-32C path, see\n"
"set_crc_path) or 'scalar' kernels (the\n"
"portable C, table CRC-32C included); returns the previous level.\n"
"For tests and benchmarks: both levels compute the same function.");

static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    const char *level;
    int prev = use_avx2;
    if (!PyArg_ParseTuple(args, "s", &level)) {
        return NULL;
    }
    if (strcmp(level, "scalar") == 0) {
        use_avx2 = 0;
        crc_path = CRC_PATH_TABLE; /* the table CRC-32C too: "scalar" is the portable code, all of it */
    } else if (strcmp(level, "avx2") == 0) {
        int ok = 0;
#ifdef R3_X86
        __builtin_cpu_init();
        ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
#endif
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "this CPU has no AVX2/BMI2");
            return NULL;
        }
        use_avx2 = 1;
        crc_path = crc_best_path();
    } else {
        PyErr_Format(PyExc_ValueError, "level must be 'avx2' or 'scalar', got '%s'", level);
        return NULL;
    }
    return PyUnicode_FromString(prev ? "avx2" : "scalar");
}

static PyMethodDef methods[] = {
    {"pack", py_pack, METH_VARARGS, pack_doc},
    {"unpack", py_unpack, METH_VARARGS, unpack_doc},
    {"encode_frame", py_encode_frame, METH_VARARGS, encode_frame_doc},
    {"encode_frames", py_encode_frames, METH_VARARGS, encode_frames_doc},
    {"check_frame", py_check_frame, METH_VARARGS, check_frame_doc},
    {"check_routes", py_check_routes, METH_VARARGS, check_routes_doc},
    {"route_stats", py_route_stats, METH_VARARGS, route_stats_doc},
    {"route_stats_pieces", py_route_stats_pieces, METH_VARARGS, route_stats_pieces_doc},
    {"gather_rows", py_gather_rows, METH_VARARGS, gather_rows_doc},
    {"route_runs", py_route_runs, METH_VARARGS, route_runs_doc},
    {"decode_frames", py_decode_frames, METH_VARARGS, decode_frames_doc},
    {"crc32c", py_crc32c, METH_VARARGS, crc32c_doc},
    {"crc_path", (PyCFunction)py_crc_path, METH_NOARGS, crc_path_doc},
    {"set_crc_path", py_set_crc_path, METH_VARARGS, set_crc_path_doc},
    {"set_avx512", py_set_avx512, METH_VARARGS, set_avx512_doc},
    {"set_stream_min", py_set_stream_min, METH_VARARGS, set_stream_min_doc},
    {"decode_frame", py_decode_frame, METH_VARARGS, decode_frame_doc},
    {"set_fused", py_set_fused, METH_VARARGS, set_fused_doc},
    {"setcodec_avx512", py_setcodec_avx512, METH_VARARGS, setcodec_avx512_doc},
    {"setcodec_gather_decode", py_setcodec_gather_decode, METH_VARARGS, setcodec_gather_decode_doc},
    {"set_encode", py_set_encode, METH_VARARGS, set_encode_doc},
    {"set_check", py_set_check, METH_VARARGS, set_check_doc},
    {"set_decode", py_set_decode, METH_VARARGS, set_decode_doc},
    {"set_decode_frames", py_set_decode_frames, METH_VARARGS, set_decode_frames_doc},
    {"simd", py_simd, METH_NOARGS, simd_doc},
    {"set_simd", py_set_simd, METH_VARARGS, set_simd_doc},
    {"cpu_features", py_cpu_features, METH_NOARGS, cpu_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kernels",
    "Compiled kernels of r3store (bit-packing, frames, route checks, row gather).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    crc_init_tables();
#ifdef R3_X86
    __builtin_cpu_init();
    use_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2");
#endif
    crc_path = crc_best_path();
    return PyModule_Create(&module);
}
