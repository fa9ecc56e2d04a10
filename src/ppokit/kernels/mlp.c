/*
 * Dense layers on float32 buffers: the matrix product (gemm) and the narrow-output dot
 * products (dots), tanh and ReLU in place and their backward, a tiled transpose, and an
 * MLP's forward and backward over ppokit's flat parameter layout (Net). The PPO step
 * (ppo_step.c) and the rollout's actor (actor.c) run on them, the LSTM (lstm.c) on gemm.
 * The tanh is reached alone through ppokit.kernels.tanh_ and held to torch.tanh by
 * tests/test_native_step.py (test_native_tanh_is_torchs); the rest through the step's and
 * the actor's tests.
 */
#include "kernels.h"

/* C[p, n] = bias[n] (or 0) + sum_k A(p, k) B[k, n], A(p, k) = A[p*sap + k*sak],
 * B rows contiguous (stride ldb), C rows of stride ldc. Every C[p, n] sums its k terms in
 * order k = 0, 1, ... starting from the bias. */
MULTIVERSION
void gemm(int64_t P, int64_t N, int64_t K, const float *A, int64_t sap, int64_t sak,
                 const float *B, int64_t ldb, const float *bias, float *C, int64_t ldc)
{
    const int64_t n32 = N / 32 * 32, n16 = N / 16 * 16, p4 = P / 4 * 4;
    const v16 zero = {0};
    /* column panels of B outermost: a panel (K x 32 floats) stays in L1 while every row
     * block of A runs over it */
    for (int64_t n = 0; n < n32; n += 32) {
        const v16 bx = bias ? ld(bias + n) : zero, by = bias ? ld(bias + n + 16) : zero;
        int64_t p = 0;
        for (; p < p4; p += 4) {
            const float *a0 = A + p * sap, *a1 = a0 + sap, *a2 = a1 + sap, *a3 = a2 + sap;
            v16 x0 = bx, x1 = bx, x2 = bx, x3 = bx, y0 = by, y1 = by, y2 = by, y3 = by;
            const float *b = B + n;
            for (int64_t k = 0; k < K; k++, b += ldb) {
                const v16 u = ld(b), w = ld(b + 16);
                const float s0 = a0[k * sak], s1 = a1[k * sak], s2 = a2[k * sak],
                            s3 = a3[k * sak];
                x0 += s0 * u; y0 += s0 * w;
                x1 += s1 * u; y1 += s1 * w;
                x2 += s2 * u; y2 += s2 * w;
                x3 += s3 * u; y3 += s3 * w;
            }
            float *c0 = C + p * ldc + n, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
            st(c0, x0); st(c0 + 16, y0);
            st(c1, x1); st(c1 + 16, y1);
            st(c2, x2); st(c2 + 16, y2);
            st(c3, x3); st(c3 + 16, y3);
        }
        for (; p < P; p++) {
            const float *a0 = A + p * sap;
            v16 x0 = bx, y0 = by;
            const float *b = B + n;
            for (int64_t k = 0; k < K; k++, b += ldb) {
                const float s0 = a0[k * sak];
                x0 += s0 * ld(b);
                y0 += s0 * ld(b + 16);
            }
            st(C + p * ldc + n, x0);
            st(C + p * ldc + n + 16, y0);
        }
    }
    for (int64_t n = n32; n < n16; n += 16) {
        const v16 bx = bias ? ld(bias + n) : zero;
        int64_t p = 0;
        for (; p < p4; p += 4) {
            const float *a0 = A + p * sap, *a1 = a0 + sap, *a2 = a1 + sap, *a3 = a2 + sap;
            v16 x0 = bx, x1 = bx, x2 = bx, x3 = bx;
            const float *b = B + n;
            for (int64_t k = 0; k < K; k++, b += ldb) {
                const v16 u = ld(b);
                x0 += a0[k * sak] * u; x1 += a1[k * sak] * u;
                x2 += a2[k * sak] * u; x3 += a3[k * sak] * u;
            }
            float *c0 = C + p * ldc + n;
            st(c0, x0); st(c0 + ldc, x1); st(c0 + 2 * ldc, x2); st(c0 + 3 * ldc, x3);
        }
        for (; p < P; p++) {
            const float *a0 = A + p * sap;
            v16 x0 = bx;
            const float *b = B + n;
            for (int64_t k = 0; k < K; k++, b += ldb) x0 += a0[k * sak] * ld(b);
            st(C + p * ldc + n, x0);
        }
    }
    for (int64_t p = 0; p < P; p++) {  /* the last N % 16 columns */
        const float *a0 = A + p * sap;
        for (int64_t n = n16; n < N; n++) {
            float x0 = bias ? bias[n] : 0.0f;
            for (int64_t k = 0; k < K; k++) x0 += a0[k * sak] * B[k * ldb + n];
            C[p * ldc + n] = x0;
        }
    }
}

/* out[m, o] = b[o] + <in[m, :], W[o, :]> for a narrow output (a policy or value head):
 * sixteen partial sums over i, then their total. */
MULTIVERSION
void dots(int64_t M, int64_t O, int64_t I, const float *in, const float *W,
                 const float *b, float *out)
{
    for (int64_t m = 0; m < M; m++) {
        const float *x = in + m * I;
        for (int64_t o = 0; o < O; o++) out[m * O + o] = b[o] + dot_n(x, W + o * I, I);
    }
}

/* tanh as sign(u) (1 - 2 / (1 + e^{2|u|})) (the quotient is at most 1, so its rounding
 * is at most 6e-8: absolute error about 1e-7, as the compiled kernel's 2 sigma(2u) - 1),
 * in place */
MULTIVERSION
static void tanh_generic(float *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        h[i] = copysignf(1.0f - 2.0f / (1.0f + exp_f(2.0f * fabsf(h[i]))), h[i]);
}

#if PPOKIT_X86
#include <immintrin.h>
/* the same with AVX-512 instructions: exp_f's steps, 2^n by scalef, and the reciprocal
 * from rcp14 refined by one Newton step (relative error about 2^-23) instead of a division,
 * whose throughput bounds the loop otherwise */
__attribute__((target("avx512f")))
static void tanh_avx512(float *h, int64_t n)
{
    const __m512 hi = _mm512_set1_ps(88.3f);
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 u = _mm512_loadu_ps(h + i);
        __m512 x = _mm512_mul_ps(_mm512_abs_ps(u), two);
        x = _mm512_min_ps(x, hi);
        const __m512 k = _mm512_roundscale_ps(
            _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
        r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
        __m512 y = _mm512_set1_ps(1.9875691500e-4f);
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
        y = _mm512_fmadd_ps(_mm512_mul_ps(y, r), r, _mm512_add_ps(r, one));
        const __m512 d = _mm512_add_ps(one, _mm512_scalef_ps(y, k));
        __m512 q = _mm512_rcp14_ps(d);
        q = _mm512_mul_ps(q, _mm512_fnmadd_ps(d, q, two));
        const __m512i sign = _mm512_and_si512(_mm512_castps_si512(u),
                                              _mm512_set1_epi32((int)0x80000000u));
        const __m512 t = _mm512_fnmadd_ps(two, q, one);
        _mm512_storeu_ps(h + i, _mm512_castsi512_ps(
            _mm512_or_si512(_mm512_castps_si512(t), sign)));
    }
    tanh_generic(h + i, n - i);
}
#endif

void tanh_inplace(float *h, int64_t n)
{
#if PPOKIT_X86
    if (__builtin_cpu_supports("avx512f")) {
        tanh_avx512(h, n);
        return;
    }
#endif
    tanh_generic(h, n);
}

MULTIVERSION
void relu_inplace(float *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
}

/* g *= dact(h), from the activation's output h: 1 - h^2 (tanh) or h > 0 (ReLU) */
MULTIVERSION
void act_backward(float *g, const float *h, int64_t n, int relu)
{
    if (relu)
        for (int64_t i = 0; i < n; i++) g[i] = h[i] > 0.0f ? g[i] : 0.0f;
    else
        for (int64_t i = 0; i < n; i++) g[i] = g[i] * (1.0f - h[i] * h[i]);
}

/* dst[c, r] = src[r, c], in 16 x 16 tiles (a row-by-row transpose of a 256-wide matrix
 * writes each element to another cache line and costs as much as a matrix product) */
MULTIVERSION
void transpose(const float *src, int64_t R, int64_t C, float *dst)
{
    for (int64_t r0 = 0; r0 < R; r0 += 16) {
        const int64_t r1 = r0 + 16 < R ? r0 + 16 : R;
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            const int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dst[c * R + r] = src[r * C + c];
        }
    }
}

/* forward; hs[1..L] must point at scratch of M * dims[l] floats */
void net_forward(const Net *net, const float *flat, int64_t M, float *wt)
{
    for (int64_t l = 0; l < net->L; l++) {
        const int64_t I = net->dims[l], O = net->dims[l + 1];
        const float *W = flat + net->offs[2 * l], *b = flat + net->offs[2 * l + 1];
        float *out = net->hs[l + 1];
        if (O >= 16) {
            transpose(W, O, I, wt);  /* WT[i, o] */
            gemm(M, O, I, net->hs[l], I, 1, wt, O, b, out, O);
        } else {
            dots(M, O, I, net->hs[l], W, b, out);
        }
        if (l + 1 < net->L) {
            if (net->relu) relu_inplace(out, M * O);
            else tanh_inplace(out, M * O);
        }
    }
}

/* backward from g = dloss/doutput ([M, dims[L]]), overwriting each layer's gradients in
 * `grad`; g and gtmp are scratch of M * max width floats (g is overwritten) */
MULTIVERSION
void net_backward(const Net *net, const float *flat, float *grad, int64_t M,
                         float *g, float *gtmp, float *wt)
{
    for (int64_t l = net->L - 1; l >= 0; l--) {
        const int64_t I = net->dims[l], O = net->dims[l + 1];
        const float *W = flat + net->offs[2 * l], *h = net->hs[l];
        float *gW = grad + net->offs[2 * l], *gb = grad + net->offs[2 * l + 1];
        if (I >= 16) {
            gemm(O, I, M, g, 1, O, h, I, NULL, gW, I);
        } else {  /* a narrow input (the observation): gW^T, vectorised over the outputs */
            gemm(I, O, M, h, 1, I, g, O, NULL, wt, O);
            transpose(wt, I, O, gW);
        }
        for (int64_t o = 0; o < O; o++) gb[o] = 0.0f;
        for (int64_t m = 0; m < M; m++) {
            const float *gm = g + m * O;
            for (int64_t o = 0; o < O; o++) gb[o] += gm[o];
        }
        if (l > 0) {
            gemm(M, I, O, g, O, 1, W, I, NULL, gtmp, I);
            act_backward(gtmp, h, M * I, net->relu);
            float *t = g; g = gtmp; gtmp = t;
        }
    }
}

/* tanh(x, n) -> None: the step's tanh in place on n floats */
PyObject *py_tanh(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *x;
    if (nargs != 2 || !as_ptr(args[0], &x)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "tanh(x, n)");
        return NULL;
    }
    const int64_t n = PyLong_AsLongLong(args[1]);
    if (n == -1 && PyErr_Occurred()) return NULL;
    tanh_inplace(x, n);
    Py_RETURN_NONE;
}
