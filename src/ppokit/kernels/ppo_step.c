/*
 * The native minibatch step: the fused PPO step of ppokit.engine.fused_kernel (_ppo_step)
 * for an MLP actor-critic, written out in C as one call, Adam included. Reached through
 * ppokit.kernels.ppo_step (ppokit.engine.native.NativeStep calls it); held to the eager
 * torch step by tests/test_native_step.py (test_native_step_equals_eager_step).
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
#include "kernels.h"

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

void critic_run(CriticJob *j)
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

/* the step; returns 1 when the KL limit stopped it before the actor's gradient, the
 * parameters or Adam's state were written (the critic's gradient is), else 0 */
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
        woken = worker_post(&job, automatic);
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

/* step(plan, flat, grad, exp_avg, exp_avg_sq, step_t, x, actions, logp_old, adv, ret,
 *      v_old, M, hp, scratch, stats) -> 0 (stepped) or 1 (stopped by the KL limit);
 * every buffer argument is an address (torch's data_ptr()), checked by the caller */
PyObject *py_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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

PyObject *py_scratch_floats(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    return plan_rows(args, nargs, "scratch_floats(plan, M)", scratch_floats);
}
