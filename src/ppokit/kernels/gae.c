/*
 * Advantage estimation: the environment GAE (gae_f32/f64) with its input checks, its
 * recursion alone (reverse_scan), and the language-model trainer's per-token GAE
 * (token_gae). Reached through ppokit.kernels.gae / reverse_scan / token_gae, which
 * ppokit.core.gae and ppokit.core.token_gae run; held bit for bit to
 * ppokit.core.advantage.gae_reference and token_gae_reference by tests/test_native_step.py
 * (test_native_reverse_scan_is_the_loop_bit_for_bit, test_native_token_gae_is_the_position_
 * loop_bit_for_bit) and tests/test_core_gae_fast.py.
 */
#include "kernels.h"

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

/* reverse_scan(x, a, y, T, N, double) -> None; addresses of contiguous [T, N] buffers */
PyObject *py_reverse_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
PyObject *py_gae(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

/* token_gae(r, v, m, boot or 0, adv, ret, B, L, gamma, gamma_lam, double) -> 0 or 1 */
PyObject *py_token_gae(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
