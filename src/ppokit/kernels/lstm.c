/*
 * The LSTM of the recurrent update. One single-layer LSTM (torch's nn.LSTM, batch_first, gates in torch's order i, f, g, o)
 * over S sequences of L steps, forward and backward, for the recurrent trainer's update
 * (ppokit.kernels.lstm wraps it as an autograd function). torch runs such a small LSTM as
 * a dozen tensor operations per time step, forward, and again backward; here a step is one
 * product with W_hh and a pass over the gates, and the input projection and the weight
 * gradients are one product each over all S x L positions.
 *
 * Buffers (float32, row-major): x [S, L, F], h0 and c0 [S, H], w_ih [4H, F], w_hh [4H, H],
 * bias [4H] (b_ih + b_hh), y [S, L, H] (every h_t), acts [S, L, 4H] (the gates after their
 * nonlinearity), cs [S, L, H] (every c_t).
 *
 * Reached through ppokit.kernels.lstm_forward / lstm_backward (ppokit.kernels.lstm.lstm is
 * the autograd function); held to torch's nn.LSTM, forward and gradients, by
 * tests/test_lstm_native.py.
 */
#include "kernels.h"

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
PyObject *py_lstm_scratch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int64_t d[4];
    if (lstm_args(args, nargs, 4, "lstm_scratch() takes 4 arguments", d, NULL) < 0)
        return NULL;
    return PyLong_FromLongLong(lstm_scratch(d[0], d[1], d[2], d[3]));
}

/* lstm_fwd(S, L, F, H, x, h0, c0, w_ih, w_hh, bias, y, acts, cs, scratch): addresses of
 * buffers the caller (ppokit.kernels.lstm) has checked */
PyObject *py_lstm_fwd(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
PyObject *py_lstm_bwd(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
