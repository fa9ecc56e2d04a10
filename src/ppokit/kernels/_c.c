/*
 * ppokit's compiled kernels (the extension ppokit.kernels._c, built by setup.py).
 *
 * The native minibatch step: the fused PPO step of ppokit.engine.fused (_ppo_step) for an
 * MLP actor-critic, written out in C as one call, Adam included (ppokit.engine.native);
 * the rollout's actor (actor_sample: the actions of a vector step); the recurrent update's
 * LSTM (lstm_fwd, lstm_bwd); and the environment
 * GAE's reverse scan (ppokit.core.gae), at the end of this file.
 *
 * Why: on a 64x64 MLP the TorchScript kernel spends most of its time between operations
 * (a dispatch per tensor operation, about 80 of them, plus Adam's own call); the arithmetic
 * itself is a few small matrix products. Here every loop runs in one function on float32
 * buffers the caller owns: no allocation, no dispatch, no threads, deterministic (the same
 * inputs give the same bits on the same machine).
 *
 * Layout. Parameters, gradients and Adam's moments are torch tensors laid out by
 * ppokit.engine.flat.FlatParameters; `plan` (built once by ppokit.engine.native) gives the
 * networks' shapes and each tensor's offset in those buffers. Linear weights are [out, in]
 * row-major (torch's nn.Linear). The Python side checks every buffer's dtype, size and
 * contiguity before it hands over a pointer.
 *
 * plan (int64): [0] categorical (1) or Gaussian (0) head, [1] actor ReLU (1) or tanh (0),
 * [2] critic ReLU/tanh, [3] actor layers La, [4] critic layers Lc, [5] log_std offset (-1:
 * none), [6] flat length, then the actor's La+1 widths, the critic's Lc+1 widths, the actor's
 * (weight, bias) offsets (2 La), the critic's (2 Lc).
 *
 * hp (double): [0] clip range, [1] clipped objective (1) or vanilla (0), [2] whiten the
 * advantages, [3] KL limit (< 0: none), [4] vf_coef, [5] value clip range (< 0: none),
 * [6] value clip "max" form (1) or "clipped" (0), [7] ent_coef, [8] max grad norm (< 0:
 * none), [9] learning rate, [10] beta1, [11] beta2, [12] eps, [13] run Adam (1) or only
 * write the gradient (0), [14] the critic's branch on the worker thread, beside the
 * actor's (1), before it on the caller's (0), or beside it while the worker keeps up (2:
 * auto_parallel below): the same bits every way.
 *
 * stats (float[10], as ppokit.engine.fused.KERNEL_STAT_KEYS): policy loss, value loss,
 * entropy, approx KL (k3), approx KL (k1), clip fraction, clip-active fraction, min and
 * max ratio, gradient norm before clipping.
 */
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* one build runs the widest vector unit the machine has (chosen once, at load time) */
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define MULTIVERSION
#endif

typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* C[p, n] = bias[n] (or 0) + sum_k A(p, k) B[k, n], A(p, k) = A[p*sap + k*sak],
 * B rows contiguous (stride ldb), C rows of stride ldc. Every C[p, n] sums its k terms in
 * order k = 0, 1, ... starting from the bias. */
MULTIVERSION
static void gemm(int64_t P, int64_t N, int64_t K, const float *A, int64_t sap, int64_t sak,
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

/* the sum of a vector's lanes as a tree (depth 4: the additions overlap) */
static inline float hsum(v16 a)
{
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = a[j] + a[j + 8];
    for (int j = 0; j < 4; j++) t[j] = t[j] + t[j + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* <a, b> over n floats: sixteen partial sums, their total, then the tail */
static inline float dot_n(const float *a, const float *b, int64_t n)
{
    const int64_t n16 = n / 16 * 16;
    v16 acc = {0};
    for (int64_t i = 0; i < n16; i += 16) acc += ld(a + i) * ld(b + i);
    float s = hsum(acc);
    for (int64_t i = n16; i < n; i++) s += a[i] * b[i];
    return s;
}

/* out[m, o] = b[o] + <in[m, :], W[o, :]> for a narrow output (a policy or value head):
 * sixteen partial sums over i, then their total. */
MULTIVERSION
static void dots(int64_t M, int64_t O, int64_t I, const float *in, const float *W,
                 const float *b, float *out)
{
    for (int64_t m = 0; m < M; m++) {
        const float *x = in + m * I;
        for (int64_t o = 0; o < O; o++) out[m * O + o] = b[o] + dot_n(x, W + o * I, I);
    }
}

/* e^x for float32, vectorisable (no branches, no library call): Cody-Waite reduction
 * x = n ln2 + r, a degree-7 polynomial for e^r on |r| <= ln2/2, and 2^n from the exponent
 * bits. Relative error < 2 ulp on [-87.3, 88.3]; inputs outside are clamped to it (e^x
 * then over- or underflows to the nearest normal float, which the callers below absorb). */
/* its steps on a float or on sixteen (exp_v below): n = round(x / ln2), r = x - n ln2 in
 * two parts, y = e^r by the polynomial */
#define EXP_STEPS(x, n, r, y)                                                                 \
    do {                                                                                      \
        n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                           \
        r = x - n * 0.693359375f;                                                             \
        r = r + n * 2.12194440e-4f;                                                           \
        y = r * 1.9875691500e-4f + 1.3981999507e-3f;                                          \
        y = y * r + 8.3334519073e-3f;                                                         \
        y = y * r + 4.1665795894e-2f;                                                         \
        y = y * r + 1.6666665459e-1f;                                                         \
        y = y * r + 5.0000001201e-1f;                                                         \
        y = y * r * r + r + 1.0f;                                                             \
    } while (0)

static inline float exp_f(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.3f ? 88.3f : x;
    float n, r, y;
    EXP_STEPS(x, n, r, y);
    union { float f; int32_t i; } s;
    s.i = ((int32_t)n + 127) << 23;
    return y * s.f;
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

#if defined(__GNUC__) && defined(__x86_64__)
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

static void tanh_inplace(float *h, int64_t n)
{
#if defined(__GNUC__) && defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) {
        tanh_avx512(h, n);
        return;
    }
#endif
    tanh_generic(h, n);
}

MULTIVERSION
static void relu_inplace(float *h, int64_t n)
{
    for (int64_t i = 0; i < n; i++) h[i] = h[i] > 0.0f ? h[i] : 0.0f;
}

/* g *= dact(h), from the activation's output h: 1 - h^2 (tanh) or h > 0 (ReLU) */
MULTIVERSION
static void act_backward(float *g, const float *h, int64_t n, int relu)
{
    if (relu)
        for (int64_t i = 0; i < n; i++) g[i] = h[i] > 0.0f ? g[i] : 0.0f;
    else
        for (int64_t i = 0; i < n; i++) g[i] = g[i] * (1.0f - h[i] * h[i]);
}

/* dst[c, r] = src[r, c], in 16 x 16 tiles (a row-by-row transpose of a 256-wide matrix
 * writes each element to another cache line and costs as much as a matrix product) */
MULTIVERSION
static void transpose(const float *src, int64_t R, int64_t C, float *dst)
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

typedef struct {
    int64_t L;             /* linear layers */
    const int64_t *dims;   /* L + 1 widths: input, hidden..., output */
    const int64_t *offs;   /* (weight, bias) offset pairs into the flat buffers */
    int relu;
    float **hs;            /* L + 1 activations: hs[0] the input, hs[L] the output */
} Net;

/* forward; hs[1..L] must point at scratch of M * dims[l] floats */
static void net_forward(const Net *net, const float *flat, int64_t M, float *wt)
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
static void net_backward(const Net *net, const float *flat, float *grad, int64_t M,
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

static int64_t max_width(const Net *a, const Net *c)
{
    int64_t w = 1;
    for (int64_t l = 0; l <= a->L; l++) w = a->dims[l] > w ? a->dims[l] : w;
    for (int64_t l = 0; l <= c->L; l++) w = c->dims[l] > w ? c->dims[l] : w;
    return w;
}

static void read_plan(const int64_t *plan, Net *a, Net *c)
{
    a->L = plan[3];
    c->L = plan[4];
    a->dims = plan + 7;
    c->dims = a->dims + a->L + 1;
    a->offs = c->dims + c->L + 1;
    c->offs = a->offs + 2 * a->L;
    a->relu = (int)plan[1];
    c->relu = (int)plan[2];
}

/* floats of scratch a minibatch of M rows needs */
static int64_t scratch_floats(const int64_t *plan, int64_t M)
{
    Net a, c;
    read_plan(plan, &a, &c);
    const int64_t w = max_width(&a, &c);
    int64_t n = 0;
    for (int64_t l = 1; l <= a.L; l++) n += M * a.dims[l];
    for (int64_t l = 1; l <= c.L; l++) n += M * c.dims[l];
    n += 4 * M * w;  /* two gradient buffers for each network */
    n += 2 * w * w;  /* a transposed weight for each */
    n += 8 * M;      /* per-sample vectors */
    return n;
}

/* sum of squares, sixteen float partial sums (as torch's vectorised reductions) */
MULTIVERSION
static double sum_sq(const float *g, int64_t n)
{
    const int64_t n16 = n / 16 * 16;
    v16 acc = {0};
    for (int64_t i = 0; i < n16; i += 16) {
        const v16 u = ld(g + i);
        acc += u * u;
    }
    double s = 0.0;
    for (int j = 0; j < 16; j++) s += (double)acc[j];
    for (int64_t i = n16; i < n; i++) s += (double)g[i] * (double)g[i];
    return s;
}

MULTIVERSION
static void scale(float *restrict g, int64_t n, float a)
{
    for (int64_t i = 0; i < n; i++) g[i] *= a;
}

/* torch.optim.Adam's update (the fused kernel's arithmetic: exp_avg by lerp, the bias
 * corrections folded into the step size and the denominator) */
MULTIVERSION
static void adam(float *restrict p, const float *restrict grad, float *restrict m,
                 float *restrict v, int64_t n, float step_size, float bc2_sqrt, float b1c,
                 float b2, float b2c, float eps)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = grad[i];
        const float m1 = m[i] + b1c * (g - m[i]);
        const float m2 = b2 * v[i] + b2c * g * g;
        m[i] = m1;
        v[i] = m2;
        p[i] -= step_size * m1 / (sqrtf(m2) / bc2_sqrt + eps);
    }
}

/* ---- the critic's branch: forward, value loss and backward, on its own scratch */

typedef struct {
    const Net *c;
    const float *flat;
    float *grad;
    int64_t M;
    const float *ret, *v_old;
    const double *hp;
    float *gv, *gtmp, *wt;
    double vl;  /* out: the value loss */
} CriticJob;

static void critic_run(CriticJob *j)
{
    const Net *c = j->c;
    const int64_t M = j->M;
    const double inv_n = 1.0 / (double)M, clip_vf = j->hp[5];
    net_forward(c, j->flat, M, j->wt);
    const float *v = c->hs[c->L];
    const float *ret = j->ret, *v_old = j->v_old;
    double vl = 0.0;
    float *gv = j->gv;
    const float vscale = (float)(2.0 * j->hp[4] * inv_n);
    for (int64_t m = 0; m < M; m++) {
        const float diff = v[m] - ret[m];
        float g;
        if (clip_vf >= 0.0) {
            const float cv = (float)clip_vf, dv = v[m] - v_old[m];
            const float dvc = dv < -cv ? -cv : (dv > cv ? cv : dv);
            const float diff_c = (v_old[m] + dvc) - ret[m];
            const float inside = fabsf(dv) <= cv ? 1.0f : 0.0f;
            if (j->hp[6] != 0.0) {
                const float sq = diff * diff, sq_c = diff_c * diff_c;
                if (sq_c > sq) { vl += sq_c; g = diff_c * inside; }
                else { vl += sq; g = diff; }
            } else {
                vl += diff_c * diff_c;
                g = diff_c * inside;
            }
        } else {
            vl += diff * diff;
            g = diff;
        }
        gv[m] = g * vscale;
    }
    j->vl = vl * inv_n;
    net_backward(c, j->flat, j->grad, M, gv, j->gtmp, j->wt);
}

/* One worker thread per process runs the critic's branch beside the caller's actor branch
 * when the step is asked to (hp[14]): the two write disjoint parts of the gradient and
 * read nothing the other writes, so the numbers are the same bits either way. It never
 * touches Python. Started on first use, again in a forked child (which has no threads).
 *
 * Hand-offs spin: waking a sleeping thread costs tens of microseconds on the virtual
 * machines measured here, a third of the branch it would run. The worker spins for a new
 * job for up to SPIN_NS after each one (the update's minibatches come every few hundred
 * microseconds), or until a serial step parks it, then sleeps on a condition variable;
 * when the caller has finished its own branch and the worker has not yet taken the job
 * (another process holds the other core), the caller takes it back and runs it itself;
 * else it spins for the result, yielding its core if the worker is descheduled. */
#define SPIN_NS 2000000L
enum { W_IDLE, W_POSTED, W_RUNNING, W_DONE };
static pthread_mutex_t w_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t w_job = PTHREAD_COND_INITIALIZER;
static CriticJob *w_current = NULL;
static int w_state = W_IDLE, w_sleeping = 0, w_park = 0, w_alive = 0;
static pid_t w_pid = 0;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker_main(void *arg)
{
    (void)arg;
    __atomic_store_n(&w_alive, 1, __ATOMIC_RELEASE);
    for (;;) {
        const long until = now_ns() + SPIN_NS;
        int spins = 0;
        while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_POSTED) {
            cpu_relax();
            if (++spins % 256 == 0 && (now_ns() > until
                                       || __atomic_load_n(&w_park, __ATOMIC_RELAXED))) {
                pthread_mutex_lock(&w_mu);
                while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_POSTED) {
                    w_sleeping = 1;
                    pthread_cond_wait(&w_job, &w_mu);
                    w_sleeping = 0;
                }
                pthread_mutex_unlock(&w_mu);
                break;
            }
        }
        int posted = W_POSTED;  /* take the job, unless the caller took it back */
        if (!__atomic_compare_exchange_n(&w_state, &posted, W_RUNNING, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            continue;
        critic_run(w_current);
        __atomic_store_n(&w_state, W_DONE, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* 0 when the worker runs in this process, 1 when it was started now, -1 if it cannot be */
static int worker_ready(void)
{
    const pid_t pid = getpid();
    if (w_pid == pid) return 0;
    if (w_pid != 0) {  /* a forked child: the parent's worker did not come along */
        pthread_mutex_init(&w_mu, NULL);
        pthread_cond_init(&w_job, NULL);
        w_state = W_IDLE;
        w_sleeping = 0;
    }
    __atomic_store_n(&w_alive, 0, __ATOMIC_RELEASE);
    pthread_attr_t attr;
    pthread_t t;
    sigset_t all, old;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);  /* signals stay with the threads that handle them */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    const int rc = pthread_create(&t, &attr, worker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) return -1;
    w_pid = pid;
    return 1;
}

/* a serial step: the worker stops spinning (it would only take a core from the caller,
 * or from another process, while the steps run without it) */
static void worker_park(void)
{
    if (w_pid == getpid()) __atomic_store_n(&w_park, 1, __ATOMIC_RELAXED);
}

/* posts the job; returns 1 when the worker was asleep (it has to be woken, which takes
 * longer than a branch: that job tells nothing of whether it keeps up) */
static int worker_post(CriticJob *j)
{
    w_current = j;
    __atomic_store_n(&w_park, 0, __ATOMIC_RELAXED);
    pthread_mutex_lock(&w_mu);
    __atomic_store_n(&w_state, W_POSTED, __ATOMIC_RELEASE);
    const int asleep = w_sleeping;
    if (asleep) pthread_cond_signal(&w_job);
    pthread_mutex_unlock(&w_mu);
    return asleep;
}

/* waits for the critic's branch; returns 1 when the worker missed it (the caller took it
 * back, or had to yield its core for the worker to finish), else 0 */
static int worker_wait(void)
{
    int posted = W_POSTED;  /* not started (the worker is not running): do it here */
    if (__atomic_compare_exchange_n(&w_state, &posted, W_IDLE, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        critic_run(w_current);
        return 1;
    }
    int spins = 0;
    while (__atomic_load_n(&w_state, __ATOMIC_ACQUIRE) != W_DONE) {
        cpu_relax();
        if (++spins > 20000) sched_yield();  /* the worker is not running: let it */
    }
    __atomic_store_n(&w_state, W_IDLE, __ATOMIC_RELAXED);
    return spins > 20000;
}

/* The automatic choice (hp[14] == 2): the critic beside the actor while the worker keeps
 * up, before it while another process holds the second core. Beside it a step takes
 * 0.6-0.7x the time on a quiet machine; with the second core busy the worker is rarely
 * running when a job is posted, and while it spins for jobs it takes time from the caller
 * (three threads on two cores) — that cost falls outside the step, so the step's own time
 * does not show it, but the worker's misses do. Three misses in the last 16 steps beside
 * it switch to the serial way (the worker parked: asleep, costing nothing) for a back-off
 * of steps, doubled each time the probe that follows also fails (1024 up to 32768) and
 * reset when one holds. A probe costs little (a missed job is run by the caller) but can
 * stall a step by a scheduler's time slice when the worker is preempted half-way through
 * its job, so probes are rare: at most one in 1024 steps, one in 32768 under a load that
 * stays. Per process, like the worker; the numbers are the same bits either way,
 * so the choice never changes a result. */
static unsigned a_misses = 0;  /* bits: the last 16 steps beside the actor, 1 = missed */
static long a_serial_left = 0, a_backoff = 1024, a_probe = 0;
static long long a_steps = 0, a_beside = 0, a_missed = 0;  /* counts, for auto_state() */
static pid_t a_pid = 0;
static long a_last_ns = 0;  /* when the last step beside the actor ended */

static void auto_this_process(void)
{
    if (a_pid != getpid()) {  /* a forked child: a worker of its own, a history of its own */
        a_pid = getpid();
        a_misses = 0;
        a_serial_left = a_probe = 0;
        a_backoff = 1024;
        a_steps = a_beside = a_missed = 0;
    }
}

static int auto_parallel(void)
{
    auto_this_process();
    a_steps++;
    if (a_serial_left > 0) {
        a_serial_left--;
        return 0;
    }
    return 1;
}

static void auto_record(int missed)
{
    a_beside++;
    a_missed += missed != 0;
    a_misses = ((a_misses << 1) | (unsigned)(missed != 0)) & 0xffffu;
    if (__builtin_popcount(a_misses) >= 3) {
        a_serial_left = a_backoff;
        a_backoff = a_backoff < 32768 ? 2 * a_backoff : 32768;
        a_misses = 0;
        a_probe = 0;
    } else if (++a_probe >= 64) {
        a_backoff = 1024;  /* it held: the next back-off starts short again */
    }
}

/* the step; returns 1 when the KL limit stopped it before the actor's gradient, the
 * parameters or Adam's state were written (the critic's gradient is), else 0 */
/* waits for the worker's branch; the automatic choice learns from it unless the worker
 * had to be started or woken for it */
static void wait_critic(int automatic, int woken)
{
    const int missed = worker_wait();
    if (automatic && !woken) auto_record(missed);
    if (automatic) a_last_ns = now_ns();
}

static int ppo_step(const int64_t *plan, float *flat, float *grad, float *exp_avg,
                    float *exp_avg_sq, float *step_t, const float *x, const void *actions,
                    const float *logp_old, const float *adv_in, const float *ret,
                    const float *v_old, int64_t M, const double *hp, float *scratch,
                    float *stats)
{
    Net a, c;
    read_plan(plan, &a, &c);
    const int categorical = (int)plan[0];
    const int64_t ls_off = plan[5], n_flat = plan[6];
    const int64_t A = a.dims[a.L], w = max_width(&a, &c);
    const double inv_n = 1.0 / (double)M;
    const float clip = (float)hp[0];
    float *hs_a[64], *hs_c[64];
    if (a.L > 63 || c.L > 63) return -1;
    float *s = scratch;
    hs_a[0] = (float *)x;
    for (int64_t l = 1; l <= a.L; l++) { hs_a[l] = s; s += M * a.dims[l]; }
    hs_c[0] = (float *)x;
    for (int64_t l = 1; l <= c.L; l++) { hs_c[l] = s; s += M * c.dims[l]; }
    a.hs = hs_a;
    c.hs = hs_c;
    float *g1 = s; s += M * w;
    float *g2 = s; s += M * w;
    float *wt = s; s += w * w;
    float *cg1 = s; s += M * w;
    float *cg2 = s; s += M * w;
    float *cwt = s; s += w * w;
    float *logp = s; s += M;
    float *adv = s; s += M;
    float *ratio = s; s += M;
    float *glogp = s; s += M;
    float *ent_m = s; s += M;

    /* the critic: value loss and its whole backward, beside the actor's branch on the
     * worker thread (hp[14]) or here, first */
    CriticJob job = {&c, flat, grad, M, ret, v_old, hp, cg1, cg2, cwt, 0.0};
    const int automatic = hp[14] == 2.0;
    int woken = 0;
    const int parallel = hp[14] != 0.0 && (!automatic || auto_parallel())
                         && worker_ready() >= 0;
    if (parallel) {
        /* a job tells nothing of whether the worker keeps up when it is still starting,
         * or had to be woken after a pause in the steps (it sleeps SPIN_NS after its last job); woken
         * between steps that follow each other, it had been starved of a core */
        const int asleep = worker_post(&job);
        woken = !__atomic_load_n(&w_alive, __ATOMIC_ACQUIRE)
                || (asleep && automatic && now_ns() - a_last_ns > SPIN_NS / 2);
    } else {
        worker_park();
        critic_run(&job);
    }

    /* the actor's forward, log-probabilities and entropy */
    net_forward(&a, flat, M, wt);
    const float *out = hs_a[a.L];
    double ent_stat = 0.0;
    float *gout = g1;  /* [M, A]: the log-probabilities of every action */
    if (categorical) {
        const int64_t *act = (const int64_t *)actions;
        for (int64_t m = 0; m < M; m++) {
            const float *z = out + m * A;
            float *lp = gout + m * A;
            float mx = z[0];
            for (int64_t j = 1; j < A; j++) mx = z[j] > mx ? z[j] : mx;
            float sum = 0.0f;
            for (int64_t j = 0; j < A; j++) sum += expf(z[j] - mx);
            const float lse = logf(sum);
            float pl = 0.0f;
            for (int64_t j = 0; j < A; j++) {
                lp[j] = (z[j] - mx) - lse;
                pl += expf(lp[j]) * lp[j];
            }
            ent_m[m] = -pl;
            ent_stat += pl;
            logp[m] = lp[act[m]];
        }
    } else {
        const float *act = (const float *)actions;
        const float *log_std = flat + ls_off;
        const float half_log_2pi = 0.9189385332046727f;
        for (int64_t m = 0; m < M; m++) {
            float lp = 0.0f;
            for (int64_t j = 0; j < A; j++) {
                const float z = (act[m * A + j] - out[m * A + j]) * expf(-log_std[j]);
                lp += -0.5f * z * z - log_std[j] - half_log_2pi;
            }
            logp[m] = lp;
        }
        for (int64_t j = 0; j < A; j++) ent_stat += log_std[j] + (0.5 + half_log_2pi);
    }

    /* advantages, whitened over the minibatch (shifted by the first sample first: equal
     * advantages give exact zeros) */
    if (hp[2] != 0.0) {
        if (M > 1) {
            double mean = 0.0, var = 0.0;
            for (int64_t m = 0; m < M; m++) mean += (double)(adv_in[m] - adv_in[0]);
            mean /= (double)M;
            for (int64_t m = 0; m < M; m++) {
                const double d = (double)(adv_in[m] - adv_in[0]) - mean;
                var += d * d;
            }
            const float std = (float)sqrt(var / (double)(M - 1)), fmean = (float)mean;
            for (int64_t m = 0; m < M; m++)
                adv[m] = ((adv_in[m] - adv_in[0]) - fmean) / (std + 1e-8f);
        } else {
            adv[0] = 0.0f;
        }
    } else {
        memcpy(adv, adv_in, (size_t)M * sizeof(float));
    }

    /* ratios, KL and the early stop */
    double kl_sum = 0.0, k1_sum = 0.0;
    float rmin = INFINITY, rmax = -INFINITY;
    for (int64_t m = 0; m < M; m++) {
        const float lr = logp[m] - logp_old[m];
        const float r = expf(lr);
        ratio[m] = r;
        kl_sum += (double)(expm1f(lr) - lr);
        k1_sum += (double)lr;
        rmin = r < rmin ? r : rmin;
        rmax = r > rmax ? r : rmax;
    }
    if (hp[3] >= 0.0 && kl_sum * inv_n > hp[3]) {
        if (parallel) wait_critic(automatic, woken);
        return 1;  /* the critic's gradient is written; nothing else */
    }

    /* the policy loss's gradient with respect to log pi */
    double pl_sum = 0.0, clip_count = 0.0, active_count = 0.0;
    const float ninv = (float)(-inv_n);
    for (int64_t m = 0; m < M; m++) {
        if (hp[1] != 0.0) {
            const float r = ratio[m];
            const float rc = r < 1.0f - clip ? 1.0f - clip : (r > 1.0f + clip ? 1.0f + clip : r);
            const float s1 = r * adv[m], s2 = rc * adv[m];
            const int active = s2 < s1;
            pl_sum += active ? s2 : s1;
            glogp[m] = active ? 0.0f : s1 * ninv;
            clip_count += fabsf(r - 1.0f) > clip;
            active_count += active;
        } else {
            pl_sum += (double)(logp[m] * adv[m]);
            glogp[m] = adv[m] * ninv;
        }
    }

    /* dloss/d(actor output), recomputed from the output (g1 was the critic's scratch) */
    float *ga = g1;
    const float ent_coef = (float)hp[7];
    if (categorical) {
        const int64_t *act = (const int64_t *)actions;
        const float ent_scale = (float)(hp[7] * inv_n);
        for (int64_t m = 0; m < M; m++) {
            const float *z = out + m * A;
            float mx = z[0];
            for (int64_t j = 1; j < A; j++) mx = z[j] > mx ? z[j] : mx;
            float sum = 0.0f;
            for (int64_t j = 0; j < A; j++) sum += expf(z[j] - mx);
            const float lse = logf(sum), gl = glogp[m];
            for (int64_t j = 0; j < A; j++) {
                const float lpj = (z[j] - mx) - lse, p = expf(lpj);
                float g = p * -gl + (j == act[m] ? gl : 0.0f);
                if (ent_coef != 0.0f) g += ent_scale * (p * (lpj + ent_m[m]));
                ga[m * A + j] = g;
            }
        }
    } else {
        const float *act = (const float *)actions;
        const float *log_std = flat + ls_off;
        float *ls_grad = grad + ls_off;
        for (int64_t j = 0; j < A; j++) ls_grad[j] = 0.0f;
        for (int64_t m = 0; m < M; m++) {
            const float gl = glogp[m];
            for (int64_t j = 0; j < A; j++) {
                const float inv_std = expf(-log_std[j]);
                const float z = (act[m * A + j] - out[m * A + j]) * inv_std;
                ga[m * A + j] = z * inv_std * gl;
                ls_grad[j] += (z * z - 1.0f) * gl;
            }
        }
        if (ent_coef != 0.0f)
            for (int64_t j = 0; j < A; j++) ls_grad[j] -= ent_coef;
    }
    net_backward(&a, flat, grad, M, ga, g2, wt);
    if (parallel) wait_critic(automatic, woken);
    const double vl = job.vl;

    /* the global gradient norm, clipping (torch.nn.utils.clip_grad_norm_'s rule) */
    const float norm = (float)sqrt(sum_sq(grad, n_flat));
    if (hp[8] >= 0.0 && (double)norm + 1e-6 > hp[8])
        scale(grad, n_flat, (float)(hp[8] / ((double)norm + 1e-6)));

    stats[0] = (float)(-pl_sum * inv_n);
    stats[1] = (float)vl;
    stats[2] = (float)(categorical ? -ent_stat * inv_n : ent_stat);
    stats[3] = (float)(kl_sum * inv_n);
    stats[4] = (float)(-k1_sum * inv_n);
    stats[5] = (float)(clip_count * inv_n);
    stats[6] = (float)(active_count * inv_n);
    stats[7] = rmin;
    stats[8] = rmax;
    stats[9] = norm;

    /* Adam over the whole flat buffer (the padding has gradient 0 and stays 0) */
    if (hp[13] != 0.0) {
        *step_t += 1.0f;
        const double t = (double)*step_t, b1 = hp[10], b2 = hp[11];
        const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        const float step_size = (float)(hp[9] / bc1), bc2_sqrt = (float)sqrt(bc2);
        const float fb1 = (float)(1.0 - b1), fb2 = (float)b2, fb2c = (float)(1.0 - b2);
        adam(flat, grad, exp_avg, exp_avg_sq, n_flat, step_size, bc2_sqrt, fb1, fb2, fb2c,
             (float)hp[12]);
    }
    return 0;
}

/* ------------------------------------------------------------------ reverse scan */

/* y[t, :] = x[t, :] + a[t, :] * y[t + 1, :], y[T, :] = 0, for [T, N] row-major buffers:
 * ppokit.core.gae's recursion, one multiplication and one addition per element in the
 * loop's order (no fused multiply-add: the result is the plain loop's, bit for bit) */
#define REVERSE_SCAN(NAME, TYPE)                                                        \
    __attribute__((optimize("fp-contract=off"))) MULTIVERSION                            \
    static void NAME(const TYPE *x, const TYPE *a, TYPE *y, int64_t T, int64_t N)        \
    {                                                                                    \
        for (int64_t t = T - 1; t >= 0; t--) {                                           \
            const TYPE *xt = x + t * N, *at = a + t * N, *next = y + (t + 1) * N;        \
            TYPE *yt = y + t * N;                                                        \
            for (int64_t n = 0; n < N; n++) {                                            \
                /* the loop's first carry is a zero, multiplied and added like any */   \
                const TYPE carry = at[n] * (t + 1 < T ? next[n] : (TYPE)0);              \
                yt[n] = xt[n] + carry;                                                   \
            }                                                                            \
        }                                                                                \
    }
REVERSE_SCAN(reverse_scan_f32, float)
REVERSE_SCAN(reverse_scan_f64, double)

/* ppokit.core.gae on checked-shape [T, N] buffers (bool masks as bytes), in one pass
 * backwards: delta = (r + (gamma * not_term) * nv) - v, carry coefficient
 * (gamma lam) * not_end, A_t = delta_t + c_t A_{t+1}, returns A + v — each operation in
 * the order torch's expression in ppokit.core.advantage evaluates it, so the results are
 * gae_reference's bits. Returns 0, or 1 at the first non-finite r, v or nv, or 2 where a
 * step is terminated but does not end its episode (the caller's checked path then raises
 * the error that names it); nothing is written then. */
#define GAE(NAME, TYPE)                                                                   \
    __attribute__((optimize("fp-contract=off"))) MULTIVERSION                             \
    static int NAME(const TYPE *restrict r, const TYPE *restrict v,                       \
                    const TYPE *restrict nv, const uint8_t *restrict term,                \
                    const uint8_t *restrict end, int64_t T, int64_t N, TYPE gamma,        \
                    TYPE gl, TYPE *restrict adv, TYPE *restrict ret)                      \
    {                                                                                     \
        const int64_t n_all = T * N;                                                      \
        int bad = 0, stray = 0; /* no early exit: the checks vectorise */                 \
        for (int64_t i = 0; i < n_all; i++) {                                             \
            bad |= !isfinite(r[i]) | !isfinite(v[i]) | !isfinite(nv[i]);                  \
            stray |= term[i] & (end[i] ^ 1);                                              \
        }                                                                                 \
        if (bad) return 1;                                                                \
        if (stray) return 2;                                                              \
        /* flat passes (they vectorise whatever N is): delta into adv, the carry         \
         * coefficient into ret; then the recursion row by row; then ret = adv + v */    \
        for (int64_t i = 0; i < n_all; i++) {                                             \
            const TYPE boot = (gamma * (TYPE)(term[i] ^ 1)) * nv[i];                      \
            adv[i] = (r[i] + boot) - v[i];                                                \
            ret[i] = gl * (TYPE)(end[i] ^ 1);                                             \
        }                                                                                 \
        for (int64_t t = T - 1; t >= 0; t--) {                                            \
            TYPE *at = adv + t * N;                                                       \
            const TYPE *ct = ret + t * N, *next = adv + (t + 1) * N;                      \
            if (t + 1 == T)                                                               \
                for (int64_t n = 0; n < N; n++) at[n] = at[n] + ct[n] * (TYPE)0;          \
            else                                                                          \
                for (int64_t n = 0; n < N; n++) at[n] = at[n] + ct[n] * next[n];          \
        }                                                                                 \
        for (int64_t i = 0; i < n_all; i++) ret[i] = adv[i] + v[i];                       \
        return 0;                                                                         \
    }
GAE(gae_f32, float)
GAE(gae_f64, double)

/* ppokit.core.token_gae on [B, L] rows with a bool action mask: per row, from the last
 * position back, at an action delta = (r + gamma * next_v) - v, A = delta + (gamma lam)
 * carry, carry = A, next_v = v; a masked position hands both on and gets A = 0, R = 0;
 * R = A + v at an action. The operations of token_gae_reference's loop in its order (its
 * bits), row by row (rows side by side, position by position, were 5x slower: a row
 * stride of 4096 floats puts every row's line in the same cache set). boot: the value after each row's last action, or NULL (0). Returns
 * 0, or 1 when a reward or value at an action is not finite (nothing written then). */
#define TOKEN_GAE(NAME, TYPE)                                                             \
    __attribute__((optimize("fp-contract=off")))                                          \
    static int NAME(const TYPE *r, const TYPE *v, const uint8_t *m, const TYPE *boot,     \
                    int64_t B, int64_t L, TYPE gamma, TYPE gl, TYPE *adv, TYPE *ret)      \
    {                                                                                     \
        int bad = 0;                                                                      \
        for (int64_t i = 0; i < B * L; i++)                                               \
            bad |= m[i] & (!isfinite(r[i]) | !isfinite(v[i]));                            \
        if (bad) return 1;                                                                \
        for (int64_t b = 0; b < B; b++) {                                                 \
            const TYPE *rb = r + b * L, *vb = v + b * L;                                  \
            const uint8_t *mb = m + b * L;                                                \
            TYPE *ab = adv + b * L, *retb = ret + b * L;                                  \
            TYPE carry = 0, next_v = boot ? boot[b] : (TYPE)0;                            \
            for (int64_t t = L - 1; t >= 0; t--) {                                        \
                if (mb[t]) {                                                              \
                    const TYPE delta = (rb[t] + gamma * next_v) - vb[t];                  \
                    const TYPE a = delta + gl * carry;                                    \
                    carry = a;                                                            \
                    next_v = vb[t];                                                       \
                    ab[t] = a;                                                            \
                    retb[t] = a + vb[t];                                                  \
                } else {                                                                  \
                    ab[t] = 0;                                                            \
                    retb[t] = 0;                                                          \
                }                                                                         \
            }                                                                             \
        }                                                                                 \
        return 0;                                                                         \
    }
TOKEN_GAE(token_gae_f32, float)
TOKEN_GAE(token_gae_f64, double)

/* ------------------------------------------------------------------ the rollout's actor
 *
 * An action for each of a vector env's M rows from the current weights: the actor's
 * forward pass (net_forward, as in the step) then, for a categorical head, the
 * scaled inverse-CDF rule of ppokit.policies.mlp.sample_categorical_np (the action is the
 * number of cumulative sums of exp(z - max z) below u times their total), or for a Gaussian
 * head mean + exp(log_std) * noise. The rollout calls it once per vector step, where NumPy
 * spent most of its time between its dozen calls.
 *
 * splan (int64): [0] categorical (1) or Gaussian (0), [1] ReLU (1) or tanh (0), [2] layers
 * L, [3] log_std offset (-1: none), then the L + 1 widths, then the L (weight, bias) offset
 * pairs, every offset counted in floats from the address `base`. */
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

/* ------------------------------------------------------------------ the LSTM of the update
 *
 * One single-layer LSTM (torch's nn.LSTM, batch_first, gates in torch's order i, f, g, o)
 * over S sequences of L steps, forward and backward, for the recurrent trainer's update
 * (ppokit.kernels.lstm wraps it as an autograd function). torch runs such a small LSTM as
 * a dozen tensor operations per time step, forward, and again backward; here a step is one
 * product with W_hh and a pass over the gates, and the input projection and the weight
 * gradients are one product each over all S x L positions.
 *
 * Buffers (float32, row-major): x [S, L, F], h0 and c0 [S, H], w_ih [4H, F], w_hh [4H, H],
 * bias [4H] (b_ih + b_hh), y [S, L, H] (every h_t), acts [S, L, 4H] (the gates after their
 * nonlinearity), cs [S, L, H] (every c_t). */
/* sigmoid(v) = (1 + tanh(v / 2)) / 2, through the vectorised tanh (absolute error about
 * 5e-8) */
MULTIVERSION
static void sigmoid_inplace(float *v, int64_t n)
{
    for (int64_t k = 0; k < n; k++) v[k] *= 0.5f;
    tanh_inplace(v, n);
    for (int64_t k = 0; k < n; k++) v[k] = 0.5f + 0.5f * v[k];
}

static int64_t lstm_scratch(int64_t S, int64_t L, int64_t F, int64_t H)
{
    const int64_t G = 4 * H;
    const int64_t fwd = F * G + H * G + S * L * G + S * G + 2 * S * H;
    const int64_t bwd = S * L * G + S * L * H + 3 * S * H + F * G;
    return fwd > bwd ? fwd : bwd;
}

MULTIVERSION
static void lstm_fwd(int64_t S, int64_t L, int64_t F, int64_t H, const float *x,
                     const float *h0, const float *c0, const float *wih, const float *whh,
                     const float *bias, float *y, float *acts, float *cs, float *scratch)
{
    const int64_t G = 4 * H;
    float *wihT = scratch, *whhT = wihT + F * G, *xw = whhT + H * G, *rec = xw + S * L * G,
          *hprev = rec + S * G, *tc = hprev + S * H;
    transpose(wih, G, F, wihT);
    transpose(whh, G, H, whhT);
    gemm(S * L, G, F, x, F, 1, wihT, G, bias, xw, G);  /* every input's projection */
    memcpy(hprev, h0, (size_t)(S * H) * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        gemm(S, G, H, hprev, H, 1, whhT, G, NULL, rec, G);
        /* the gates: sigmoid of all four in one pass, the cell gate's input doubled
         * first and its result mapped back, tanh(u) = 2 sigmoid(2u) - 1 */
        for (int64_t s = 0; s < S; s++) {
            float *r = rec + s * G;
            const float *a = xw + (s * L + t) * G;
            for (int64_t j = 0; j < G; j++) r[j] += a[j];
            for (int64_t j = 2 * H; j < 3 * H; j++) r[j] *= 2.0f;
        }
        sigmoid_inplace(rec, S * G);
        for (int64_t s = 0; s < S; s++) {
            float *r = rec + s * G;
            for (int64_t j = 2 * H; j < 3 * H; j++) r[j] = 2.0f * r[j] - 1.0f;
            const float *cp = t == 0 ? c0 + s * H : cs + (s * L + t - 1) * H;
            float *c = cs + (s * L + t) * H;
            for (int64_t j = 0; j < H; j++) {
                c[j] = r[H + j] * cp[j] + r[j] * r[2 * H + j];
                tc[s * H + j] = c[j];
            }
            memcpy(acts + (s * L + t) * G, r, (size_t)G * sizeof(float));
        }
        tanh_inplace(tc, S * H);
        for (int64_t s = 0; s < S; s++) {
            const float *o = rec + s * G + 3 * H;
            float *h = y + (s * L + t) * H;
            for (int64_t j = 0; j < H; j++) h[j] = o[j] * tc[s * H + j];
            memcpy(hprev + s * H, h, (size_t)H * sizeof(float));
        }
    }
}

/* backward from dy = dloss/dy [S, L, H] (the final state's gradient is zero): writes
 * dwih [4H, F], dwhh [4H, H], db [4H], and where not NULL dx [S, L, F], dh0 and dc0 */
MULTIVERSION
static void lstm_bwd(int64_t S, int64_t L, int64_t F, int64_t H, const float *x,
                     const float *h0, const float *c0, const float *wih, const float *whh,
                     const float *y, const float *acts, const float *cs, const float *dy,
                     float *dwih, float *dwhh, float *db, float *dx, float *dh0, float *dc0,
                     float *scratch)
{
    const int64_t G = 4 * H;
    float *da = scratch, *hp = da + S * L * G, *dh = hp + S * L * H, *dc = dh + S * H,
          *tc = dc + S * H;
    for (int64_t s = 0; s < S; s++)  /* h_{t-1} of every position */
        for (int64_t t = 0; t < L; t++)
            memcpy(hp + (s * L + t) * H, t == 0 ? h0 + s * H : y + (s * L + t - 1) * H,
                   (size_t)H * sizeof(float));
    memset(dh, 0, (size_t)(S * H) * sizeof(float));
    memset(dc, 0, (size_t)(S * H) * sizeof(float));
    for (int64_t t = L - 1; t >= 0; t--) {
        for (int64_t s = 0; s < S; s++)
            memcpy(tc + s * H, cs + (s * L + t) * H, (size_t)H * sizeof(float));
        tanh_inplace(tc, S * H);
        for (int64_t s = 0; s < S; s++) {
            const int64_t idx = s * L + t;
            const float *a = acts + idx * G;
            const float *cp = t == 0 ? c0 + s * H : cs + (idx - 1) * H;
            float *d = da + idx * G;
            for (int64_t j = 0; j < H; j++) {
                const float i = a[j], f = a[H + j], g = a[2 * H + j], o = a[3 * H + j];
                const float th = tc[s * H + j];
                const float dht = dy[idx * H + j] + dh[s * H + j];
                const float dct = dc[s * H + j] + dht * o * (1.0f - th * th);
                dc[s * H + j] = dct * f;
                d[j] = dct * g * i * (1.0f - i);
                d[H + j] = dct * cp[j] * f * (1.0f - f);
                d[2 * H + j] = dct * i * (1.0f - g * g);
                d[3 * H + j] = dht * th * o * (1.0f - o);
            }
        }
        /* dh_{t-1} = da_t W_hh */
        gemm(S, H, G, da + t * G, L * G, 1, whh, H, NULL, dh, H);
    }
    gemm(G, H, S * L, da, 1, G, hp, H, NULL, dwhh, H);
    /* dW_ih^T [F, G] = X^T da (vectorised over the 4H gates; F is often a handful) */
    float *dwihT = tc + S * H;
    gemm(F, G, S * L, x, 1, F, da, G, NULL, dwihT, G);
    transpose(dwihT, F, G, dwih);
    for (int64_t j = 0; j < G; j++) db[j] = 0.0f;
    for (int64_t r = 0; r < S * L; r++)
        for (int64_t j = 0; j < G; j++) db[j] += da[r * G + j];
    if (dx) gemm(S * L, F, G, da, G, 1, wih, F, NULL, dx, F);
    if (dh0) memcpy(dh0, dh, (size_t)(S * H) * sizeof(float));
    if (dc0) memcpy(dc0, dc, (size_t)(S * H) * sizeof(float));
}

/* ------------------------------------------------------------------ Python binding */

static int as_ptr(PyObject *o, void **p)
{
    *p = PyLong_AsVoidPtr(o);
    return !(*p == NULL && PyErr_Occurred());
}

/* step(plan, flat, grad, exp_avg, exp_avg_sq, step_t, x, actions, logp_old, adv, ret,
 *      v_old, M, hp, scratch, stats) -> 0 (stepped) or 1 (stopped by the KL limit);
 * every buffer argument is an address (torch's data_ptr()), checked by the caller */
static PyObject *py_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "step() takes 16 arguments");
        return NULL;
    }
    void *p[16];
    for (int i = 0; i < 16; i++) {
        if (i == 12) continue;
        if (!as_ptr(args[i], &p[i])) return NULL;
    }
    const int64_t M = PyLong_AsLongLong(args[12]);
    if (M == -1 && PyErr_Occurred()) return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = ppo_step((const int64_t *)p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
                 p[9], p[10], p[11], M, (const double *)p[13], p[14], p[15]);
    Py_END_ALLOW_THREADS
    if (r < 0) {
        PyErr_SetString(PyExc_ValueError, "native step: more than 63 layers");
        return NULL;
    }
    return PyLong_FromLong(r);
}

/* f(plan, M) -> floats of scratch, for the bindings of scratch_floats and sample_scratch */
static PyObject *plan_rows(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                           int64_t (*f)(const int64_t *, int64_t))
{
    void *plan;
    if (nargs != 2 || !as_ptr(args[0], &plan)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    const int64_t M = PyLong_AsLongLong(args[1]);
    if (M == -1 && PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(f((const int64_t *)plan, M));
}

static PyObject *py_scratch_floats(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return plan_rows(args, nargs, "scratch_floats(plan, M)", scratch_floats);
}

/* reverse_scan(x, a, y, T, N, double) -> None; addresses of contiguous [T, N] buffers */
static PyObject *py_reverse_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *p[3];
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "reverse_scan() takes 6 arguments");
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (!as_ptr(args[i], &p[i])) return NULL;
    const int64_t T = PyLong_AsLongLong(args[3]), N = PyLong_AsLongLong(args[4]);
    const int dbl = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || dbl < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (dbl) reverse_scan_f64(p[0], p[1], p[2], T, N);
    else reverse_scan_f32(p[0], p[1], p[2], T, N);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* gae(r, v, nv, term, end, adv, ret, T, N, gamma, gamma_lam, double) -> 0, 1 or 2 */
static PyObject *py_gae(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *p[7];
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "gae() takes 12 arguments");
        return NULL;
    }
    for (int i = 0; i < 7; i++)
        if (!as_ptr(args[i], &p[i])) return NULL;
    const int64_t T = PyLong_AsLongLong(args[7]), N = PyLong_AsLongLong(args[8]);
    const double gamma = PyFloat_AsDouble(args[9]), gl = PyFloat_AsDouble(args[10]);
    const int dbl = PyObject_IsTrue(args[11]);
    if (PyErr_Occurred() || dbl < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (dbl)
        rc = gae_f64(p[0], p[1], p[2], p[3], p[4], T, N, gamma, gl, p[5], p[6]);
    else
        rc = gae_f32(p[0], p[1], p[2], p[3], p[4], T, N, (float)gamma, (float)gl, p[5], p[6]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

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
static PyObject *py_interleave(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

/* tanh(x, n) -> None: the step's tanh in place on n floats */
static PyObject *py_tanh(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

/* ---------------------------------------------------------------------------------------
 * The decoder's elementwise steps (ppokit.kernels.decoder; the fused forward of
 * ppokit/llm/modeling/fused.py calls them through autograd functions): RMS norm, the
 * rotary embedding with the split of the fused q/k/v product, and the SiLU-gated product
 * of the MLP, forward and backward, each one pass over its rows instead of the five to
 * fifteen tensor operations (and their temporaries) the same formulas take in torch.
 *
 * Activations are float32 or bfloat16 (`bf`: uint16 holding a bfloat16's upper half).
 * float32 -> bfloat16 rounds to nearest even as torch does (a NaN stays a quiet NaN).
 * Where the torch formulas round to bfloat16 between two steps, these round at the same
 * step, so that the same inputs give torch's values up to float32 rounding: the compiler
 * may fuse a product and a sum into one multiply-add, and sums (the norm's squares,
 * attention's scores) run in another order. */

static inline float bf_ld(const uint16_t *p, int64_t i)
{
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)p[i] << 16;
    return c.f;
}

static inline uint16_t bf_round(float f)
{
    union { float f; uint32_t u; } c;
    c.f = f;
    const uint32_t nan = (c.u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t r = (c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16;
    return (uint16_t)(nan ? 0x7fc0u : r);
}

/* f rounded to bfloat16, as a float */
static inline float bf_rt(float f)
{
    const uint16_t b = bf_round(f);
    return bf_ld(&b, 0);
}

/* the same sixteen at a time (GCC vector extensions: AVX-512 where the clone has it) */
typedef int32_t i16v __attribute__((vector_size(64)));
typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16v __attribute__((vector_size(32)));

static inline v16 bf_ld16(const uint16_t *p)
{
    h16v h;
    memcpy(&h, p, sizeof h);
    const u16v u = __builtin_convertvector(h, u16v) << 16;
    v16 f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline u16v bf_bits16(v16 f)
{
    u16v u;
    memcpy(&u, &f, sizeof u);
    const u16v nan = (u16v)((u & 0x7fffffffu) > 0x7f800000u);
    const u16v r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (r & ~nan) | (0x7fc0u & nan);
}

static inline void bf_st16(uint16_t *p, v16 f)
{
    const h16v h = __builtin_convertvector(bf_bits16(f), h16v);
    memcpy(p, &h, sizeof h);
}

static inline v16 bf_rt16(v16 f)
{
    const u16v u = bf_bits16(f) << 16;
    v16 r;
    memcpy(&r, &u, sizeof r);
    return r;
}

static inline v16 splat(float x) { return (v16){0} + x; }

static inline v16 vsel(i16v m, v16 a, v16 b) /* m ? a : b, lane by lane */
{
    return (v16)(((i16v)a & m) | ((i16v)b & ~m));
}

/* exp_f sixteen at a time (the same steps) */
static inline v16 exp_v(v16 x)
{
    x = vsel(x < -87.3f, splat(-87.3f), x);
    x = vsel(x > 88.3f, splat(88.3f), x);
    v16 n, r, y;
    EXP_STEPS(x, n, r, y);
    const i16v e = (__builtin_convertvector(n, i16v) + 127) << 23;
    return y * (v16)e;
}

/* sixteen activations (bfloat16 if bf) as floats, and their store */
static inline v16 act_ld16(const void *p, int64_t i, int bf)
{
    return bf ? bf_ld16((const uint16_t *)p + i) : ld((const float *)p + i);
}

static inline void act_st16(void *p, int64_t i, v16 v, int bf)
{
    if (bf)
        bf_st16((uint16_t *)p + i, v);
    else
        st((float *)p + i, v);
}

static inline float act_ld(const void *p, int64_t i, int bf)
{
    return bf ? bf_ld(p, i) : ((const float *)p)[i];
}

static inline void act_st(void *p, int64_t i, float v, int bf)
{
    if (bf)
        ((uint16_t *)p)[i] = bf_round(v);
    else
        ((float *)p)[i] = v;
}

/* y = w * (x * rstd) with rstd = 1 / sqrt(mean(x^2) + eps) per row; x [N, D] float32, y in
 * bfloat16 (ybf) or float32; rstd [N] kept for the backward */
MULTIVERSION
static void rms_fwd(const float *x, const float *w, float eps, int64_t N, int64_t D, void *y,
                    int ybf, float *rstd)
{
    const int64_t d16 = D / 16 * 16;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * D;
        const float r = 1.0f / sqrtf(dot_n(xr, xr, D) / (float)D + eps);
        rstd[n] = r;
        for (int64_t i = 0; i < d16; i += 16)
            act_st16(y, n * D + i, ld(w + i) * (ld(xr + i) * r), ybf);
        for (int64_t i = d16; i < D; i++) act_st(y, n * D + i, w[i] * (xr[i] * r), ybf);
    }
}

/* its backward: dx = rstd (g - xhat mean(g xhat)), g = dy w, xhat = x rstd; dw += dy xhat
 * summed over the rows (the caller zeroes dw) */
MULTIVERSION
static void rms_bwd(const float *x, const float *w, const float *rstd, const void *dy, int dybf,
                    int64_t N, int64_t D, float *dx, float *dw)
{
    const int64_t d16 = D / 16 * 16;
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * D;
        float *dxr = dx + n * D;
        const float r = rstd[n];
        v16 acc = {0};
        for (int64_t i = 0; i < d16; i += 16) {  /* dx holds g = dy w until the last loop */
            const v16 e = act_ld16(dy, n * D + i, dybf), xh = ld(xr + i) * r;
            const v16 g = e * ld(w + i);
            st(dw + i, ld(dw + i) + e * xh);
            st(dxr + i, g);
            acc += g * xh;
        }
        float s = hsum(acc);
        for (int64_t i = d16; i < D; i++) {
            const float e = act_ld(dy, n * D + i, dybf), xh = xr[i] * r;
            dw[i] += e * xh;
            dxr[i] = e * w[i];
            s += dxr[i] * xh;
        }
        const float m = s / (float)D;
        for (int64_t i = 0; i < d16; i += 16)
            st(dxr + i, (ld(dxr + i) - (ld(xr + i) * r) * m) * r);
        for (int64_t i = d16; i < D; i++) dxr[i] = (dxr[i] - (xr[i] * r) * m) * r;
    }
}

/* the fused q/k/v product's rows [N, (H + 2 KV) hd] (bfloat16 if bf) -> q [N, H, hd],
 * k [N, KV, hd] rotated (t cos + rotate_half(t) sin, rotate_half(t) = (-t2, t1)) and v
 * [N, KV, hd], float32; cos, sin [N, hd] */
MULTIVERSION
static void rope_fwd(const void *qkv, int bf, const float *cos_, const float *sin_, int64_t N,
                     int64_t H, int64_t KV, int64_t hd, float *q, float *k, float *v)
{
    const int64_t half = hd / 2, width = (H + 2 * KV) * hd, h16 = half / 16 * 16;
    for (int64_t n = 0; n < N; n++) {
        const float *c = cos_ + n * hd, *s = sin_ + n * hd;
        const int64_t row = n * width;
        for (int64_t h = 0; h < H + KV; h++) {
            float *o = h < H ? q + (n * H + h) * hd : k + (n * KV + h - H) * hd;
            const int64_t t = row + h * hd;
            for (int64_t j = 0; j < h16; j += 16) {
                const v16 a = act_ld16(qkv, t + j, bf), b = act_ld16(qkv, t + j + half, bf);
                st(o + j, a * ld(c + j) + (-b) * ld(s + j));
                st(o + j + half, b * ld(c + j + half) + a * ld(s + j + half));
            }
            for (int64_t j = h16; j < half; j++) {
                const float a = act_ld(qkv, t + j, bf), b = act_ld(qkv, t + j + half, bf);
                o[j] = a * c[j] + (-b) * s[j];
                o[j + half] = b * c[j + half] + a * s[j + half];
            }
        }
        float *vo = v + n * KV * hd;
        const int64_t vt = row + (H + KV) * hd, m = KV * hd, m16 = m / 16 * 16;
        for (int64_t j = 0; j < m16; j += 16) st(vo + j, act_ld16(qkv, vt + j, bf));
        for (int64_t j = m16; j < m; j++) vo[j] = act_ld(qkv, vt + j, bf);
    }
}

/* its backward: dq, dk, dv (float32, the shapes of q, k, v) -> dqkv [N, (H + 2 KV) hd]
 * (bfloat16 if bf: each of the two terms of a rotated value's gradient rounded, then their
 * sum, as torch's autograd rounds them) */
MULTIVERSION
static void rope_bwd(const float *dq, const float *dk, const float *dv, const float *cos_,
                     const float *sin_, int64_t N, int64_t H, int64_t KV, int64_t hd,
                     void *dqkv, int bf)
{
    const int64_t half = hd / 2, width = (H + 2 * KV) * hd, h16 = half / 16 * 16;
    for (int64_t n = 0; n < N; n++) {
        const float *c = cos_ + n * hd, *s = sin_ + n * hd;
        const int64_t row = n * width;
        for (int64_t h = 0; h < H + KV; h++) {
            const float *g = h < H ? dq + (n * H + h) * hd : dk + (n * KV + h - H) * hd;
            const int64_t t = row + h * hd;
            /* t_j enters o_j (cos) and o_{j+half} (sin); t_{j+half} enters o_{j+half} (cos)
             * and o_j (-sin) */
            for (int64_t j = 0; j < h16; j += 16) {
                v16 a0 = ld(g + j) * ld(c + j), a1 = ld(g + j + half) * ld(s + j + half);
                v16 b0 = ld(g + j + half) * ld(c + j + half), b1 = ld(g + j) * ld(s + j);
                if (bf) {
                    a0 = bf_rt16(a0), a1 = bf_rt16(a1), b0 = bf_rt16(b0), b1 = bf_rt16(b1);
                }
                act_st16(dqkv, t + j, a0 + a1, bf);
                act_st16(dqkv, t + j + half, b0 - b1, bf);
            }
            for (int64_t j = h16; j < half; j++) {
                float a0 = g[j] * c[j], a1 = g[j + half] * s[j + half];
                float b0 = g[j + half] * c[j + half], b1 = g[j] * s[j];
                if (bf) {
                    a0 = bf_rt(a0), a1 = bf_rt(a1), b0 = bf_rt(b0), b1 = bf_rt(b1);
                }
                act_st(dqkv, t + j, a0 + a1, bf);
                act_st(dqkv, t + j + half, b0 - b1, bf);
            }
        }
        const float *gv = dv + n * KV * hd;
        const int64_t vt = row + (H + KV) * hd, m = KV * hd, m16 = m / 16 * 16;
        for (int64_t j = 0; j < m16; j += 16) act_st16(dqkv, vt + j, ld(gv + j), bf);
        for (int64_t j = m16; j < m; j++) act_st(dqkv, vt + j, gv[j], bf);
    }
}

/* n (< 16) activations from i as sixteen lanes (the rest zero), and the store of the first
 * n lanes: a row's last partial block runs through the same sixteen-lane code */
static inline v16 act_ld_part(const void *p, int64_t i, int64_t n, int bf)
{
    float t[16] = {0};
    for (int64_t l = 0; l < n; l++) t[l] = act_ld(p, i + l, bf);
    return ld(t);
}

static inline void act_st_part(void *p, int64_t i, int64_t n, v16 v, int bf)
{
    for (int64_t l = 0; l < n; l++) act_st(p, i + l, v[l], bf);
}

/* the gated product y = silu(gate) * up of rows gu [N, 2F] (gate the first F columns),
 * y [N, F], silu(g) = g sigmoid(g) = g / (1 + e^-g); bfloat16 (bf: silu's value rounded
 * before the product, as torch's two operations round it) or float32. The row functions
 * are inlined with bf a constant, so that each format has its own loop. */
static inline v16 swiglu16(v16 g, v16 u, int bf)
{
    v16 a = g * (1.0f / (1.0f + exp_v(-g)));
    if (bf) a = bf_rt16(a);
    return a * u;
}

static inline __attribute__((always_inline)) void swiglu_fwd_rows(
    const void *gu, const int bf, int64_t N, int64_t F, void *y)
{
    for (int64_t n = 0; n < N; n++) {
        const int64_t r = n * 2 * F, o = n * F;
        int64_t j = 0;
        for (; j + 16 <= F; j += 16)
            act_st16(y, o + j, swiglu16(act_ld16(gu, r + j, bf), act_ld16(gu, r + F + j, bf), bf),
                     bf);
        if (j < F) {
            const int64_t m = F - j;
            act_st_part(y, o + j, m, swiglu16(act_ld_part(gu, r + j, m, bf),
                                              act_ld_part(gu, r + F + j, m, bf), bf), bf);
        }
    }
}

MULTIVERSION
static void swiglu_fwd_generic(const void *gu, int bf, int64_t N, int64_t F, void *y)
{
    if (bf)
        swiglu_fwd_rows(gu, 1, N, F, y);
    else
        swiglu_fwd_rows(gu, 0, N, F, y);
}

/* its backward: dy [N, F] -> dgu [N, 2F]: d up = dy silu(g), d gate = (dy up) s (1 + g
 * (1 - s)), s = sigmoid(g) (bf: rounded where torch's autograd rounds) */
static inline void swiglu_bwd16(v16 g, v16 u, v16 e, int bf, v16 *dg, v16 *du)
{
    const v16 s = 1.0f / (1.0f + exp_v(-g));
    v16 a = g * s, da = e * u;
    if (bf) a = bf_rt16(a), da = bf_rt16(da);
    *dg = da * (s * (1.0f + g * (1.0f - s)));
    *du = e * a;
}

static inline __attribute__((always_inline)) void swiglu_bwd_rows(
    const void *gu, const void *dy, const int bf, int64_t N, int64_t F, void *dgu)
{
    for (int64_t n = 0; n < N; n++) {
        const int64_t r = n * 2 * F, o = n * F;
        v16 dg, du;
        int64_t j = 0;
        for (; j + 16 <= F; j += 16) {
            swiglu_bwd16(act_ld16(gu, r + j, bf), act_ld16(gu, r + F + j, bf),
                         act_ld16(dy, o + j, bf), bf, &dg, &du);
            act_st16(dgu, r + j, dg, bf);
            act_st16(dgu, r + F + j, du, bf);
        }
        if (j < F) {
            const int64_t m = F - j;
            swiglu_bwd16(act_ld_part(gu, r + j, m, bf), act_ld_part(gu, r + F + j, m, bf),
                         act_ld_part(dy, o + j, m, bf), bf, &dg, &du);
            act_st_part(dgu, r + j, m, dg, bf);
            act_st_part(dgu, r + F + j, m, du, bf);
        }
    }
}

MULTIVERSION
static void swiglu_bwd_generic(const void *gu, const void *dy, int bf, int64_t N, int64_t F,
                               void *dgu)
{
    if (bf)
        swiglu_bwd_rows(gu, dy, 1, N, F, dgu);
    else
        swiglu_bwd_rows(gu, dy, 0, N, F, dgu);
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The bfloat16 gated product with the instructions made for it (AVX512-BF16), where the
 * machine has them: one instruction rounds sixteen floats to bfloat16 (to nearest even, as
 * torch; a NaN stays a NaN, a denormal input becomes zero), where the generic loop spends
 * eight on the integer steps; the sigmoid's reciprocal from rcp14 and one Newton step
 * (relative error about 2^-23) instead of a division. */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BF16_TARGET static inline __m512 bfx_ld(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

BF16_TARGET static inline __m256i bfx_bits(__m512 f)
{
    return (__m256i)_mm512_cvtneps_pbh(f);
}

BF16_TARGET static inline __m512 bfx_rt(__m512 f)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bfx_bits(f)), 16));
}

BF16_TARGET static inline __m512 bfx_sigmoid(__m512 g)  /* 1 / (1 + e^-g) */
{
    const __m512 one = _mm512_set1_ps(1.0f), two = _mm512_set1_ps(2.0f);
    v16 e = exp_v(-(v16)g);
    const __m512 d = _mm512_add_ps(one, (__m512)e);
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, two));
}

/* (rows of a multiple of 16 columns; the dispatcher sends others to the generic loop) */
BF16_TARGET static void swiglu_fwd_bf16x(const uint16_t *gu, int64_t N, int64_t F, uint16_t *y)
{
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *g_ = gu + n * 2 * F, *u_ = g_ + F;
        uint16_t *o = y + n * F;
        for (int64_t j = 0; j < F; j += 16) {
            const __m512 g = bfx_ld(g_ + j), u = bfx_ld(u_ + j);
            const __m512 a = bfx_rt(_mm512_mul_ps(g, bfx_sigmoid(g)));
            _mm256_storeu_si256((__m256i *)(o + j), bfx_bits(_mm512_mul_ps(a, u)));
        }
    }
}

BF16_TARGET static void swiglu_bwd_bf16x(const uint16_t *gu, const uint16_t *dy, int64_t N,
                                         int64_t F, uint16_t *dgu)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t n = 0; n < N; n++) {
        const uint16_t *g_ = gu + n * 2 * F, *u_ = g_ + F, *e_ = dy + n * F;
        uint16_t *dg = dgu + n * 2 * F, *du = dg + F;
        for (int64_t j = 0; j < F; j += 16) {
            const __m512 g = bfx_ld(g_ + j), u = bfx_ld(u_ + j), e = bfx_ld(e_ + j);
            const __m512 sg = bfx_sigmoid(g);
            const __m512 a = bfx_rt(_mm512_mul_ps(g, sg)), da = bfx_rt(_mm512_mul_ps(e, u));
            /* s (1 + g (1 - s)) */
            const __m512 ds = _mm512_mul_ps(sg, _mm512_add_ps(one, _mm512_mul_ps(
                g, _mm512_sub_ps(one, sg))));
            _mm256_storeu_si256((__m256i *)(dg + j), bfx_bits(_mm512_mul_ps(da, ds)));
            _mm256_storeu_si256((__m256i *)(du + j), bfx_bits(_mm512_mul_ps(e, a)));
        }
    }
}

static int have_bf16x(void)
{
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")
                         && __builtin_cpu_supports("avx512vl");
    return have;
}
#define BF16X 1
#else
#define BF16X 0
#endif

static void swiglu_fwd(const void *gu, int bf, int64_t N, int64_t F, void *y)
{
#if BF16X
    if (bf && F % 16 == 0 && have_bf16x()) {
        swiglu_fwd_bf16x(gu, N, F, y);
        return;
    }
#endif
    swiglu_fwd_generic(gu, bf, N, F, y);
}

static void swiglu_bwd(const void *gu, const void *dy, int bf, int64_t N, int64_t F, void *dgu)
{
#if BF16X
    if (bf && F % 16 == 0 && have_bf16x()) {
        swiglu_bwd_bf16x(gu, dy, N, F, dgu);
        return;
    }
#endif
    swiglu_bwd_generic(gu, dy, bf, N, F, dgu);
}

/* Attention over short sequences, float32 (the fused forward's attention on the CPU, where
 * torch's flash kernel is built for long ones): queries q [R, Tq, H, hd], keys and values
 * k, v [R, Tk, KV, hd] (query head h reads key head h / (H / KV)), mask [R, Tq, Tk] (1: the
 * query may see the key; every query sees at least one), output o [R, Tq, H, hd]; the
 * softmax p [R, H, Tq, Tk] is kept for the backward. */
static inline void axpy_n(float *y, float a, const float *x, int64_t n)  /* y += a x */
{
    const int64_t n16 = n / 16 * 16;
    for (int64_t i = 0; i < n16; i += 16) st(y + i, ld(y + i) + a * ld(x + i));
    for (int64_t i = n16; i < n; i++) y[i] += a * x[i];
}

/* (kv_row: floats from one row's keys to the next's, Tk KV hd when packed; mask_row:
 * bytes from one row's mask to the next's, Tq Tk when packed: a decoding step reads the
 * first Tk positions of a cache that holds more) */
MULTIVERSION
static void attn_fwd(const float *q, const float *k, const float *v, const uint8_t *mask,
                     int64_t R, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd,
                     int64_t kv_row, int64_t mask_row, float scale, float *o, float *p)
{
    const int64_t rep = H / KV, Tkp = (Tk + 15) / 16 * 16;
    float *sc = malloc((size_t)Tkp * sizeof(float));
    if (!sc) return;  /* (the caller's buffers are then left as they were) */
    for (int64_t r = 0; r < R; r++)
        for (int64_t t = 0; t < Tq; t++) {
            const uint8_t *m = mask + r * mask_row + t * Tk;
            for (int64_t h = 0; h < H; h++) {
                const float *qv = q + ((r * Tq + t) * H + h) * hd;
                const float *kb = k + r * kv_row + h / rep * hd;
                const float *vb = v + r * kv_row + h / rep * hd;
                float mx = -INFINITY;
                for (int64_t j = Tk; j < Tkp; j++) sc[j] = -INFINITY;
                for (int64_t j = 0; j < Tk; j++) {
                    sc[j] = m[j] ? dot_n(qv, kb + j * KV * hd, hd) * scale : -INFINITY;
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                v16 tot = {0};  /* e^(s - max), sixteen keys at a time; a masked key's is 0 */
                for (int64_t j = 0; j < Tkp; j += 16) {
                    const v16 x = ld(sc + j);
                    const v16 e = vsel(x == -INFINITY, splat(0.0f), exp_v(x - mx));
                    st(sc + j, e);
                    tot += e;
                }
                const float inv = 1.0f / hsum(tot);
                float *pr = p + ((r * H + h) * Tq + t) * Tk;
                float *out = o + ((r * Tq + t) * H + h) * hd;
                memset(out, 0, (size_t)hd * sizeof(float));
                for (int64_t j = 0; j < Tk; j++) {
                    pr[j] = sc[j] * inv;
                    if (pr[j] != 0.0f) axpy_n(out, pr[j], vb + j * KV * hd, hd);
                }
            }
        }
    free(sc);
}

/* its backward from the output's gradient d_o: dq (written), dk and dv (added to: the
 * caller zeroes them); ds [Tk] scratch */
MULTIVERSION
static void attn_bwd(const float *q, const float *k, const float *v, const float *p,
                     const float *d_o, int64_t R, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                     int64_t hd, float scale, float *dq, float *dk, float *dv, float *ds)
{
    const int64_t rep = H / KV;
    for (int64_t r = 0; r < R; r++)
        for (int64_t t = 0; t < Tq; t++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t qi = ((r * Tq + t) * H + h) * hd, kv0 = (r * Tk * KV + h / rep) * hd;
                const float *pr = p + ((r * H + h) * Tq + t) * Tk, *g = d_o + qi;
                float dot_pd = 0.0f;
                for (int64_t j = 0; j < Tk; j++) {
                    ds[j] = pr[j] != 0.0f ? dot_n(g, v + kv0 + j * KV * hd, hd) : 0.0f;
                    dot_pd += pr[j] * ds[j];
                }
                float *dqv = dq + qi;
                memset(dqv, 0, (size_t)hd * sizeof(float));
                for (int64_t j = 0; j < Tk; j++) {
                    if (pr[j] == 0.0f) continue;
                    const float s = pr[j] * (ds[j] - dot_pd) * scale;
                    axpy_n(dqv, s, k + kv0 + j * KV * hd, hd);
                    axpy_n(dk + kv0 + j * KV * hd, s, q + qi, hd);
                    axpy_n(dv + kv0 + j * KV * hd, pr[j], g, hd);
                }
            }
}

/* decoder(op, addresses..., sizes..., flags...) -> None: op 0 rms_fwd(x, w, y, rstd, N, D,
 * ybf, eps), 1 rms_bwd(x, w, rstd, dy, dx, dw, N, D, dybf), 2 rope_fwd(qkv, cos, sin, q,
 * k, v, N, H, KV, hd, bf), 3 rope_bwd(dq, dk, dv, cos, sin, dqkv, N, H, KV, hd, bf),
 * 4 swiglu_fwd(gu, y, N, F, bf), 5 swiglu_bwd(gu, dy, dgu, N, F, bf), 6 attn_fwd(q, k, v,
 * mask, o, p, R, Tq, Tk, H, KV, hd, kv_row, mask_row, scale), 7 attn_bwd(q, k, v, p, d_o, dq, dk, dv, ds, R, Tq,
 * Tk, H, KV, hd, scale) (ds: Tk floats of scratch); every buffer
 * checked by the caller (ppokit.kernels.decoder) */
static PyObject *py_decoder(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    static const int nptr[8] = {4, 6, 6, 6, 2, 3, 6, 9}, nint[8] = {3, 3, 5, 5, 3, 3, 8, 6};
    const long op = nargs ? PyLong_AsLong(args[0]) : -1;
    const int has_float = op == 0 || op == 6 || op == 7;
    if (op < 0 || op > 7 || nargs != 1 + nptr[op] + nint[op] + has_float) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "decoder(op, ...): bad call");
        return NULL;
    }
    void *p[9];
    int64_t v[8];
    for (int i = 0; i < nptr[op]; i++)
        if (!as_ptr(args[1 + i], &p[i])) return NULL;
    for (int i = 0; i < nint[op]; i++) v[i] = PyLong_AsLongLong(args[1 + nptr[op] + i]);
    const double eps = has_float ? PyFloat_AsDouble(args[nargs - 1]) : 0.0;
    if (PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    switch (op) {
    case 0: rms_fwd(p[0], p[1], (float)eps, v[0], v[1], p[2], (int)v[2], p[3]); break;
    case 1: rms_bwd(p[0], p[1], p[2], p[3], (int)v[2], v[0], v[1], p[4], p[5]); break;
    case 2: rope_fwd(p[0], (int)v[4], p[1], p[2], v[0], v[1], v[2], v[3], p[3], p[4], p[5]);
        break;
    case 3: rope_bwd(p[0], p[1], p[2], p[3], p[4], v[0], v[1], v[2], v[3], p[5], (int)v[4]);
        break;
    case 4: swiglu_fwd(p[0], (int)v[2], v[0], v[1], p[1]); break;
    case 5: swiglu_bwd(p[0], p[1], (int)v[2], v[0], v[1], p[2]); break;
    case 6: attn_fwd(p[0], p[1], p[2], p[3], v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7],
                     (float)eps, p[4], p[5]);
        break;
    case 7: attn_bwd(p[0], p[1], p[2], p[3], p[4], v[0], v[1], v[2], v[3], v[4], v[5], (float)eps,
                     p[5], p[6], p[7], p[8]);
        break;
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* token_gae(r, v, m, boot or 0, adv, ret, B, L, gamma, gamma_lam, double) -> 0 or 1 */
static PyObject *py_token_gae(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    void *p[6];
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "token_gae() takes 11 arguments");
        return NULL;
    }
    for (int i = 0; i < 6; i++)  /* boot (3) may be 0: no buffer */
        if (!as_ptr(args[i], &p[i])) return NULL;
    const int64_t B = PyLong_AsLongLong(args[6]), L = PyLong_AsLongLong(args[7]);
    const double gamma = PyFloat_AsDouble(args[8]), gl = PyFloat_AsDouble(args[9]);
    const int dbl = PyObject_IsTrue(args[10]);
    if (PyErr_Occurred() || dbl < 0) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    if (dbl)
        rc = token_gae_f64(p[0], p[1], p[2], p[3], B, L, gamma, gl, p[4], p[5]);
    else
        rc = token_gae_f32(p[0], p[1], p[2], p[3], B, L, (float)gamma, (float)gl, p[4],
                           p[5]);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* a contiguous buffer of `n` items of the format `fmt` (one character, or "q"/"l" for
 * int64) from `o`, or an error naming `what` */
static int get_buf(PyObject *o, Py_buffer *b, char fmt, int64_t n, const char *what)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "sample: %s must be a contiguous array", what);
        return -1;
    }
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    const int ok_fmt = fmt == 'q' ? ((f[0] == 'q' || f[0] == 'l') && f[1] == 0
                                     && b->itemsize == 8)
                                  : (f[0] == fmt && f[1] == 0 && b->itemsize == 4);
    if (!ok_fmt || b->len != n * b->itemsize) {
        PyErr_Format(PyExc_ValueError, "sample: %s must hold %lld %s", what, (long long)n,
                     fmt == 'q' ? "int64 values" : "float32 values");
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* sample(splan, base, x, noise, out, scratch, M) -> None: actions of M rows into `out`
 * (int64 [M] or float32 [M, A]); x float32 [M, in], noise float32 [M] or [M, A]; splan,
 * base and scratch (sample_scratch(M) floats) are addresses, checked by the caller */
static PyObject *py_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

static PyObject *py_sample_scratch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return plan_rows(args, nargs, "sample_scratch(plan, M)", sample_scratch);
}

/* the LSTM bindings' arguments: `nargs` must be `want`; the first four are the sizes
 * S, L, F, H, the rest addresses (0 becomes NULL). Returns -1 with an error set. */
static int lstm_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want,
                     const char *usage, int64_t *d, void **p)
{
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    for (int k = 0; k < 4; k++) {
        d[k] = PyLong_AsLongLong(args[k]);
        if (d[k] == -1 && PyErr_Occurred()) return -1;
    }
    for (Py_ssize_t k = 4; k < want; k++)
        if (!as_ptr(args[k], &p[k - 4])) return -1;
    return 0;
}

/* lstm_scratch(S, L, F, H) -> floats of scratch lstm_fwd and lstm_bwd need */
static PyObject *py_lstm_scratch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int64_t d[4];
    if (lstm_args(args, nargs, 4, "lstm_scratch() takes 4 arguments", d, NULL) < 0)
        return NULL;
    return PyLong_FromLongLong(lstm_scratch(d[0], d[1], d[2], d[3]));
}

/* lstm_fwd(S, L, F, H, x, h0, c0, w_ih, w_hh, bias, y, acts, cs, scratch): addresses of
 * buffers the caller (ppokit.kernels.lstm) has checked */
static PyObject *py_lstm_fwd(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int64_t d[4];
    void *p[10];
    if (lstm_args(args, nargs, 14, "lstm_fwd() takes 14 arguments", d, p) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    lstm_fwd(d[0], d[1], d[2], d[3], p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
             p[9]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* lstm_bwd(S, L, F, H, x, h0, c0, w_ih, w_hh, y, acts, cs, dy, dwih, dwhh, db, dx, dh0,
 * dc0, scratch): addresses (dx, dh0, dc0: 0 when not wanted) */
static PyObject *py_lstm_bwd(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int64_t d[4];
    void *p[16];
    if (lstm_args(args, nargs, 20, "lstm_bwd() takes 20 arguments", d, p) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    lstm_bwd(d[0], d[1], d[2], d[3], p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8],
             p[9], p[10], p[11], p[12], p[13], p[14], p[15]);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* auto_state() -> (steps, steps posted beside the actor, of those missed by the worker,
 * serial steps left in the current back-off, the next back-off): the automatic choice's
 * counts in this process */
static PyObject *py_auto_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    (void)args;
    if (nargs != 0) {
        PyErr_SetString(PyExc_TypeError, "auto_state() takes no arguments");
        return NULL;
    }
    auto_this_process();
    return Py_BuildValue("(LLLll)", a_steps, a_beside, a_missed, a_serial_left, a_backoff);
}

static PyMethodDef methods[] = {
    {"lstm_fwd", (PyCFunction)(void (*)(void))py_lstm_fwd, METH_FASTCALL,
     "A single-layer LSTM over [S, L] sequences, forward."},
    {"lstm_bwd", (PyCFunction)(void (*)(void))py_lstm_bwd, METH_FASTCALL,
     "Its backward."},
    {"lstm_scratch", (PyCFunction)(void (*)(void))py_lstm_scratch, METH_FASTCALL,
     "Floats of scratch the LSTM needs."},
    {"sample", (PyCFunction)(void (*)(void))py_sample, METH_FASTCALL,
     "The rollout's actions from the actor's current weights."},
    {"sample_scratch", (PyCFunction)(void (*)(void))py_sample_scratch, METH_FASTCALL,
     "Floats of scratch sample() needs for M rows."},
    {"auto_state", (PyCFunction)(void (*)(void))py_auto_state, METH_FASTCALL,
     "The native step's automatic choice of where its critic runs: its counts."},
    {"token_gae", (PyCFunction)(void (*)(void))py_token_gae, METH_FASTCALL,
     "ppokit.core.token_gae on checked [B, L] buffers."},
    {"decoder", (PyCFunction)(void (*)(void))py_decoder, METH_FASTCALL,
     "The decoder's RMS norm, rotary embedding and gated product, forward and backward."},
    {"interleave", (PyCFunction)(void (*)(void))py_interleave, METH_FASTCALL,
     "uint8 frames from plane order to pixel order."},
    {"tanh", (PyCFunction)(void (*)(void))py_tanh, METH_FASTCALL,
     "The native step's tanh, in place."},
    {"gae", (PyCFunction)(void (*)(void))py_gae, METH_FASTCALL,
     "ppokit.core.gae on checked [T, N] buffers."},
    {"reverse_scan", (PyCFunction)(void (*)(void))py_reverse_scan, METH_FASTCALL,
     "y_t = x_t + a_t y_{t+1} along the first axis of [T, N] buffers."},
    {"step", (PyCFunction)(void (*)(void))py_step, METH_FASTCALL,
     "One fused PPO minibatch step (see ppokit.engine.native)."},
    {"scratch_floats", (PyCFunction)(void (*)(void))py_scratch_floats, METH_FASTCALL,
     "Floats of scratch a minibatch of M rows needs."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c",
                                    "ppokit's compiled kernels (see ppokit.kernels).", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&module); }
