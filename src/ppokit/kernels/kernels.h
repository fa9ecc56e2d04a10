/*
 * What ppokit's compiled kernels share (the extension ppokit.kernels._c; the map of which
 * file holds which kernel, and the Python function each is held to, is in
 * docs/architecture.md, "The native layer"):
 *
 *   mlp.c          dense layers: the matrix product, the activations, an MLP's forward
 *                  and backward (used by the PPO step and the rollout's actor)
 *   ppo_step.c     the fused PPO minibatch step for an MLP actor-critic, Adam included
 *   step_worker.c  the thread that runs the step's critic branch beside the actor's
 *   actor.c        the rollout's actions from the actor's current weights
 *   lstm.c         the recurrent update's single-layer LSTM, forward and backward
 *   decoder.c      the decoder's RMS norm, rotary embedding, gated product, attention
 *   module.c       argument helpers and the module's method table
 *
 * Everything here is either a small inline helper every file may use or a declaration of
 * a function one file defines and another calls.
 */
#ifndef PPOKIT_KERNELS_H
#define PPOKIT_KERNELS_H

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

/* One build runs the widest vector unit the machine has, chosen once at load time:
 * MULTIVERSION functions are compiled for AVX-512, AVX2 and the baseline, and PPOKIT_X86
 * code paths (tanh_avx512 in mlp.c, the AVX512-BF16 gated product in decoder.c) are taken
 * where the CPU reports the instructions. Two other builds exist for tests and
 * measurements (setup.py's PPOKIT_ISA): -DPPOKIT_NO_AVX512 keeps the AVX2 and baseline
 * clones only and no AVX-512 path; -DPPOKIT_GENERIC compiles every kernel's portable loop
 * alone (tests/test_kernels_generic.py holds every kernel to its reference that way). The
 * portable loops are for correctness, not speed: GCC splits the 64-byte vectors into
 * pieces the baseline instruction set has, several times slower than the AVX2 clone. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) \
    && !defined(PPOKIT_GENERIC)
#ifdef PPOKIT_NO_AVX512
#define MULTIVERSION __attribute__((target_clones("avx2,fma", "default")))
#else
#define MULTIVERSION __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#endif
#else
#define MULTIVERSION
#endif
#if defined(__GNUC__) && defined(__x86_64__) && !defined(PPOKIT_GENERIC) \
    && !defined(PPOKIT_NO_AVX512)
#define PPOKIT_X86 1
#else
#define PPOKIT_X86 0
#endif

typedef float v16 __attribute__((vector_size(64)));

static inline v16 ld(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, v16 v) { memcpy(p, &v, sizeof v); }

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

typedef struct {
    int64_t L;             /* linear layers */
    const int64_t *dims;   /* L + 1 widths: input, hidden..., output */
    const int64_t *offs;   /* (weight, bias) offset pairs into the flat buffers */
    int relu;
    float **hs;            /* L + 1 activations: hs[0] the input, hs[L] the output */
} Net;

/* ---- mlp.c */
void gemm(int64_t P, int64_t N, int64_t K, const float *A, int64_t sap, int64_t sak,
          const float *B, int64_t ldb, const float *bias, float *C, int64_t ldc);
void dots(int64_t M, int64_t O, int64_t I, const float *in, const float *W, const float *b,
          float *out);
void tanh_inplace(float *h, int64_t n);
void relu_inplace(float *h, int64_t n);
void act_backward(float *g, const float *h, int64_t n, int relu);
void transpose(const float *src, int64_t R, int64_t C, float *dst);
void net_forward(const Net *net, const float *flat, int64_t M, float *wt);
void net_backward(const Net *net, const float *flat, float *grad, int64_t M, float *g,
                  float *gtmp, float *wt);

/* ---- ppo_step.c and step_worker.c: the critic's branch, run by either thread */
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

void critic_run(CriticJob *j);
int auto_parallel(void);
int worker_ready(void);
int worker_post(CriticJob *j, int automatic);
void worker_park(void);
void wait_critic(int automatic, int woken);

/* ---- module.c: argument helpers for the bindings */
int as_ptr(PyObject *o, void **p);
PyObject *plan_rows(PyObject *const *args, Py_ssize_t nargs, const char *usage,
                    int64_t (*f)(const int64_t *, int64_t));
int get_buf(PyObject *o, Py_buffer *b, char fmt, int64_t n, const char *what);

/* ---- the bindings, one group per file (module.c's table lists them) */
#define BINDING(name) PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
BINDING(py_tanh);
BINDING(py_step);
BINDING(py_scratch_floats);
BINDING(py_auto_state);
BINDING(py_sample);
BINDING(py_sample_scratch);
BINDING(py_lstm_scratch);
BINDING(py_lstm_fwd);
BINDING(py_lstm_bwd);
BINDING(py_decoder);
#undef BINDING

#endif
