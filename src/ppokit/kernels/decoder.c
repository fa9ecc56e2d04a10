/*
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
 * attention's scores) run in another order.
 *
 * Reached through ppokit.kernels.decoder_op (ppokit.kernels.decoder wraps each step as an
 * autograd function); held to the torch formulas of ppokit.kernels.decoder's references,
 * values and gradients, float32 and bfloat16, by tests/test_llm_kernels.py.
 */
#include "kernels.h"
#if PPOKIT_X86
#include <immintrin.h>
#endif

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

#if PPOKIT_X86
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
PyObject *py_decoder(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
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
