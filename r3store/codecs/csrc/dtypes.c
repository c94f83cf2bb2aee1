/*
 * dtypes.c: conversions between the eight native integer types, through a cursor.
 */
#include "r3k.h"

#define DEF_CONV(SN, S, DN, D)                                                               \
    static void conv_##SN##_##DN(const char *src, Py_ssize_t sstride, char *dst, Py_ssize_t n) { \
        Py_ssize_t i;                                                                        \
        S x;                                                                                 \
        D y;                                                                                 \
        if (sstride == (Py_ssize_t)sizeof(S)) {                                              \
            for (i = 0; i < n; i++) {                                                        \
                memcpy(&x, src + i * (Py_ssize_t)sizeof(S), sizeof(S));                      \
                y = (D)x;                                                                    \
                memcpy(dst + i * (Py_ssize_t)sizeof(D), &y, sizeof(D));                      \
            }                                                                                \
        } else {                                                                             \
            for (i = 0; i < n; i++) {                                                        \
                memcpy(&x, src + i * sstride, sizeof(S));                                    \
                y = (D)x;                                                                    \
                memcpy(dst + i * (Py_ssize_t)sizeof(D), &y, sizeof(D));                      \
            }                                                                                \
        }                                                                                    \
    }

#define DEF_CONV_ROW(SN, S)          \
    DEF_CONV(SN, S, u8, uint8_t)     \
    DEF_CONV(SN, S, i8, int8_t)      \
    DEF_CONV(SN, S, u16, uint16_t)   \
    DEF_CONV(SN, S, i16, int16_t)    \
    DEF_CONV(SN, S, u32, uint32_t)   \
    DEF_CONV(SN, S, i32, int32_t)    \
    DEF_CONV(SN, S, u64, uint64_t)   \
    DEF_CONV(SN, S, i64, int64_t)

DEF_CONV_ROW(u8, uint8_t)
DEF_CONV_ROW(i8, int8_t)
DEF_CONV_ROW(u16, uint16_t)
DEF_CONV_ROW(i16, int16_t)
DEF_CONV_ROW(u32, uint32_t)
DEF_CONV_ROW(i32, int32_t)
DEF_CONV_ROW(u64, uint64_t)
DEF_CONV_ROW(i64, int64_t)

#define CONV_ROW(SN) \
    {conv_##SN##_u8, conv_##SN##_i8, conv_##SN##_u16, conv_##SN##_i16, conv_##SN##_u32, conv_##SN##_i32, conv_##SN##_u64, conv_##SN##_i64}

const conv_fn conv_table[T_COUNT][T_COUNT] = {
    CONV_ROW(u8), CONV_ROW(i8), CONV_ROW(u16), CONV_ROW(i16),
    CONV_ROW(u32), CONV_ROW(i32), CONV_ROW(u64), CONV_ROW(i64),
};

/* Write n elements from a contiguous source of type st through a cursor. */
void cursor_scatter(cursor_t *c, int dt, const char *src, int st, Py_ssize_t n) {
    /* conv_table converts into contiguous memory; a strided run goes element by element */
    while (n > 0) {
        char *p;
        Py_ssize_t stride, take = cursor_take(c, n, &p, &stride), i;
        if (stride == type_size[dt]) {
            conv_table[st][dt](src, type_size[st], p, take);
        } else {
            for (i = 0; i < take; i++) {
                conv_table[st][dt](src + i * type_size[st], type_size[st], p + i * stride, 1);
            }
        }
        src += take * type_size[st];
        n -= take;
    }
}

void cursor_zero(cursor_t *c, int dt, Py_ssize_t n) {
    static const uint64_t zeros[64] = {0};
    while (n > 0) {
        Py_ssize_t step = n < 64 ? n : 64;
        cursor_scatter(c, dt, (const char *)zeros, T_U64, step);
        n -= step;
    }
}
