/*
 * The rollout's actor. An action for each of a vector env's M rows from the current weights: the actor's
 * forward pass (net_forward, as in the step) then, for a categorical head, the
 * scaled inverse-CDF rule of ppokit.policies.mlp.sample_categorical_np (the action is the
 * number of cumulative sums of exp(z - max z) below u times their total), or for a Gaussian
 * head mean + exp(log_std) * noise. The rollout calls it once per vector step, where NumPy
 * spent most of its time between its dozen calls.
 *
 * splan (int64): [0] categorical (1) or Gaussian (0), [1] ReLU (1) or tanh (0), [2] layers
 * L, [3] log_std offset (-1: none), then the L + 1 widths, then the L (weight, bias) offset
 * pairs, every offset counted in floats from the address `base`.
 *
 * Reached through ppokit.kernels.sample (ppokit.policies.NumpySampler); held to the
 * policy's torch forward and sampling rule by tests/test_train_policies.py
 * (test_numpy_sampler_matches_the_torch_policy).
 */
#include "kernels.h"

static int64_t sample_scratch(const int64_t *splan, int64_t M)
{
    int64_t w = 1;
    for (int64_t l = 0; l <= splan[2]; l++) w = splan[4 + l] > w ? splan[4 + l] : w;
    return 2 * M * w + w * w;
}

/* the sum of a vector's lanes by halving (four shuffles and adds) */
typedef int32_t v16i __attribute__((vector_size(64)));
static inline float hsum_tree(v16 a)
{
#if defined(__clang__) || !defined(__GNUC__)
    return hsum(a);
#else
    const v16i h8 = {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7};
    const v16i h4 = {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11};
    const v16i h2 = {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13};
    const v16i h1 = {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14};
    a += __builtin_shuffle(a, h8);
    a += __builtin_shuffle(a, h4);
    a += __builtin_shuffle(a, h2);
    a += __builtin_shuffle(a, h1);
    return a[0];
#endif
}

/* out[m, o] = b[o] + <in[m, :], W[o, :]>, four outputs at a time (one load of the row's
 * inputs for four weight rows) */
MULTIVERSION
static void dots4(int64_t M, int64_t O, int64_t I, const float *in, const float *W,
                  const float *b, float *out)
{
    const int64_t i16 = I / 16 * 16, o4 = O / 4 * 4;
    for (int64_t m = 0; m < M; m++) {
        const float *x = in + m * I;
        for (int64_t o = 0; o < o4; o += 4) {
            const float *w0 = W + o * I, *w1 = w0 + I, *w2 = w1 + I, *w3 = w2 + I;
            v16 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0};
            for (int64_t i = 0; i < i16; i += 16) {
                const v16 u = ld(x + i);
                c0 += u * ld(w0 + i); c1 += u * ld(w1 + i);
                c2 += u * ld(w2 + i); c3 += u * ld(w3 + i);
            }
            float s0 = hsum_tree(c0), s1 = hsum_tree(c1), s2 = hsum_tree(c2),
                  s3 = hsum_tree(c3);
            for (int64_t i = i16; i < I; i++) {
                s0 += x[i] * w0[i]; s1 += x[i] * w1[i];
                s2 += x[i] * w2[i]; s3 += x[i] * w3[i];
            }
            float *om = out + m * O + o;
            om[0] = b[o] + s0; om[1] = b[o + 1] + s1; om[2] = b[o + 2] + s2; om[3] = b[o + 3] + s3;
        }
        if (o4 < O) dots(1, O - o4, I, x, W + o4 * I, b + o4, out + m * O + o4);
    }
}

static void actor_sample(const int64_t *splan, const float *base, const float *x, int64_t M,
                         const float *noise, void *out, float *scratch)
{
    Net a;
    float *hs[64];
    a.L = splan[2];
    a.dims = splan + 4;
    a.offs = a.dims + a.L + 1;
    a.relu = (int)splan[1];
    int64_t w = 1;
    for (int64_t l = 0; l <= a.L; l++) w = a.dims[l] > w ? a.dims[l] : w;
    hs[0] = (float *)x;
    for (int64_t l = 1; l <= a.L; l++) hs[l] = scratch + (l % 2) * M * w;
    float *wt = scratch + 2 * M * w;
    for (int64_t l = 0; l < a.L; l++) {
        const int64_t I = a.dims[l], O = a.dims[l + 1];
        const float *W = base + a.offs[2 * l], *b = base + a.offs[2 * l + 1];
        if (I < 16 && O >= 16) {  /* a narrow input: W^T is small, the product wide */
            transpose(W, O, I, wt);
            gemm(M, O, I, hs[l], I, 1, wt, O, b, hs[l + 1], O);
        } else {  /* no transpose of a square weight for a few rows: dot products */
            dots4(M, O, I, hs[l], W, b, hs[l + 1]);
        }
        if (l + 1 < a.L) {
            if (a.relu) relu_inplace(hs[l + 1], M * O);
            else tanh_inplace(hs[l + 1], M * O);
        }
    }
    const int64_t A = a.dims[a.L];
    const float *z = hs[a.L];
    if (splan[0]) {
        int64_t *act = (int64_t *)out;
        float cdf[64];
        for (int64_t m = 0; m < M; m++) {
            const float *zm = z + m * A;
            float mx = zm[0];
            for (int64_t j = 1; j < A; j++) mx = zm[j] > mx ? zm[j] : mx;
            float c = 0.0f;
            for (int64_t j = 0; j < A; j++) { c += expf(zm[j] - mx); cdf[j] = c; }
            const float thr = noise[m] * c;
            int64_t k = 0;
            for (int64_t j = 0; j < A; j++) k += cdf[j] < thr;
            act[m] = k;
        }
    } else {
        float *act = (float *)out;
        const float *log_std = base + splan[3];
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < A; j++)
                act[m * A + j] = z[m * A + j] + expf(log_std[j]) * noise[m * A + j];
    }
}

/* sample(splan, base, x, noise, out, scratch, M) -> None: actions of M rows into `out`
 * (int64 [M] or float32 [M, A]); x float32 [M, in], noise float32 [M] or [M, A]; splan,
 * base and scratch (sample_scratch(M) floats) are addresses, checked by the caller */
PyObject *py_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "sample() takes 7 arguments");
        return NULL;
    }
    void *plan, *base, *scratch;
    if (!as_ptr(args[0], &plan) || !as_ptr(args[1], &base) || !as_ptr(args[5], &scratch))
        return NULL;
    const int64_t M = PyLong_AsLongLong(args[6]);
    if (M == -1 && PyErr_Occurred()) return NULL;
    const int64_t *sp = (const int64_t *)plan;
    const int64_t L = sp[2], D = sp[4], A = sp[4 + L], cat = sp[0];
    if (M < 1 || L < 1 || L > 63 || (cat && A > 64)) {
        PyErr_SetString(PyExc_ValueError, "sample: bad rows or plan");
        return NULL;
    }
    Py_buffer bx, bn, bo;
    if (get_buf(args[2], &bx, 'f', M * D, "the observations") < 0) return NULL;
    if (get_buf(args[3], &bn, 'f', cat ? M : M * A, "the noise") < 0) {
        PyBuffer_Release(&bx);
        return NULL;
    }
    if (get_buf(args[4], &bo, cat ? 'q' : 'f', cat ? M : M * A, "the actions") < 0) {
        PyBuffer_Release(&bx);
        PyBuffer_Release(&bn);
        return NULL;
    }
    actor_sample(sp, base, bx.buf, M, bn.buf, bo.buf, scratch);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&bn);
    PyBuffer_Release(&bo);
    Py_RETURN_NONE;
}

PyObject *py_sample_scratch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return plan_rows(args, nargs, "sample_scratch(plan, M)", sample_scratch);
}
