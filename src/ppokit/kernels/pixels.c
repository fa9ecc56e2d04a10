/*
 * Frames from plane order to pixel order, for the collector's storage of channel-first
 * pixels (ppokit.kernels.pixels_last); held to torch's channels_last copy by
 * tests/test_cnn_fast_path.py.
 */
#include "kernels.h"

/* Pixels from plane order to pixel order: dst[f][p][k] = src[f][k][p], uint8, for
 * `frames` frames of `planes` planes of `pixels` pixels (the collector's channel-first
 * frames stored height-width-channel). Four planes (stacked Atari frames) are packed as
 * one 32-bit word per pixel, which the compiler vectorises; any other count moves byte
 * by byte. */
static void interleave_u8(const uint8_t *restrict src, uint8_t *restrict dst, int64_t frames,
                          int64_t planes, int64_t pixels)
{
    for (int64_t f = 0; f < frames; f++) {
        const uint8_t *s = src + f * planes * pixels;
        uint8_t *d = dst + f * planes * pixels;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (planes == 4) {
            const uint8_t *a = s, *b = s + pixels, *c = s + 2 * pixels, *e = s + 3 * pixels;
            for (int64_t p = 0; p < pixels; p++) {
                const uint32_t w = (uint32_t)a[p] | ((uint32_t)b[p] << 8) |
                                   ((uint32_t)c[p] << 16) | ((uint32_t)e[p] << 24);
                memcpy(d + 4 * p, &w, 4);
            }
            continue;
        }
#endif
        for (int64_t p = 0; p < pixels; p++)
            for (int64_t k = 0; k < planes; k++) d[p * planes + k] = s[k * pixels + p];
    }
}

/* interleave(src, dst, frames, planes, pixels) -> None (addresses, checked by the caller) */
PyObject *py_interleave(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *src, *dst;
    if (nargs != 5 || !as_ptr(args[0], &src) || !as_ptr(args[1], &dst)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "interleave(src, dst, frames, planes, pixels)");
        return NULL;
    }
    const int64_t f = PyLong_AsLongLong(args[2]), k = PyLong_AsLongLong(args[3]),
                  n = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    interleave_u8(src, dst, f, k, n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}
