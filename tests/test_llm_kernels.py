"""The decoder's compiled steps (ppokit/kernels/decoder.py) against the torch formulas the
fused forward runs without them, forward and backward, on random shapes and values: RMS
norm with its cast, the rotary embedding with the split of the fused q/k/v product and the
SiLU-gated product, in float32 and bfloat16, and attention over short sequences (float32,
random masks, grouped key heads) against ``scaled_dot_product_attention`` — rows of any
width (the 16-wide loops and their scalar tails), inputs that are views. Float32 results
agree to float32 rounding; bfloat16 ones to one or two bfloat16 roundings (the kernels
round at the same steps as torch; a product computed as a fused multiply-add can land on
the other side of a rounding boundary). The bfloat16 gated product has two loops in C: rows
of a multiple of 16 columns take the AVX512-BF16 instructions where the machine has them,
other rows the generic loop — the random widths here reach both."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ppokit.kernels import available
from ppokit.kernels import decoder as kd

pytestmark = pytest.mark.skipif(not available() or not kd.usable(torch.zeros(1)),
                                reason="the compiled kernels are not built here")

SETTINGS = settings(max_examples=40, deadline=None)
BF = torch.bfloat16
DTYPES = st.sampled_from([torch.float32, BF])


def _close(a, b, dtype, scale=1.0):
    """Equal to float32 rounding, or to two bfloat16 roundings of values of size ``scale``."""
    assert a.dtype == b.dtype and a.shape == b.shape
    if dtype == BF:
        torch.testing.assert_close(a.float(), b.float(), rtol=1.6e-2, atol=1.6e-2 * scale)
    else:
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6 * scale)


def _ref_rms(x, w, eps, dtype):
    var = x.pow(2).mean(-1, keepdim=True)
    return (w * (x * torch.rsqrt(var + eps))).to(dtype)


@SETTINGS
@given(n=st.integers(1, 24), d=st.integers(1, 70), dtype=DTYPES,
       eps=st.sampled_from([1e-6, 1e-5, 0.1]), seed=st.integers(0, 2**31 - 1),
       transposed=st.booleans())
def test_rms_norm_matches_the_formula(n, d, dtype, eps, seed, transposed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, n, generator=g).t() if transposed else torch.randn(n, d, generator=g)
    x = (x * 3).requires_grad_()
    w = torch.randn(d, generator=g).requires_grad_()
    y = kd.rms_norm(x, w, eps, dtype)
    ref = _ref_rms(x, w, eps, dtype)
    _close(y, ref, dtype, scale=float(w.detach().abs().max()))
    dy = torch.randn(n, d, generator=g).to(dtype)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    rx, rw = torch.autograd.grad(ref, (x, w), dy)
    # the sizes the gradients are sums of (a gradient can cancel to rounding noise: one
    # column, d = 1, has none at all)
    with torch.no_grad():
        rstd = torch.rsqrt(x.pow(2).mean(-1) + eps).max()
        g_max = dy.float().abs().max()
        dx_scale = float(g_max * w.abs().max() * rstd)
        dw_scale = float(n * g_max * (x.abs().max() * rstd))
    torch.testing.assert_close(dx, rx, rtol=1e-4, atol=1e-5 * dx_scale)
    torch.testing.assert_close(dw, rw, rtol=1e-4, atol=1e-5 * dw_scale)


def _rotate(t, cos, sin):
    half = t.shape[-1] // 2
    return (t * cos) + (torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin)


@SETTINGS
@given(n=st.integers(1, 12), kv=st.integers(1, 3), rep=st.integers(1, 3),
       half=st.sampled_from([1, 3, 4, 16, 19, 32]), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1))
def test_rotary_split_matches_the_formula(n, kv, rep, half, dtype, seed):
    H, hd = kv * rep, 2 * half
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, (H + 2 * kv) * hd, generator=g).to(dtype).requires_grad_()
    ang = torch.rand(n, 1, hd, generator=g) * 6.3
    cos, sin = ang.cos(), ang.sin()
    q, k, v = kd.rotary_split(qkv, cos, sin, (H, kv, hd))
    tq, tk, tv = qkv.view(n, H + 2 * kv, hd).split([H, kv, kv], -2)
    rq, rk, rv = _rotate(tq, cos, sin).float(), _rotate(tk, cos, sin).float(), tv.float()
    assert q.shape == (n, H, hd) and k.shape == v.shape == (n, kv, hd)
    for a, b in ((q, rq), (k, rk)):  # float32 out of the same inputs either way
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert torch.equal(v, rv)
    grads = [torch.randn(t.shape, generator=g) for t in (q, k, v)]
    (d,) = torch.autograd.grad((q, k, v), qkv, grads)
    (r,) = torch.autograd.grad((rq, rk, rv), qkv, grads)
    _close(d, r, dtype, scale=4.0)


@SETTINGS
@given(n=st.integers(1, 12), f=st.integers(1, 70), dtype=DTYPES,
       seed=st.integers(0, 2**31 - 1), big=st.booleans())
def test_gated_matches_the_formula(n, f, dtype, seed, big):
    g = torch.Generator().manual_seed(seed)
    # big: arguments past e^x's clamp (|x| > 87), where silu is x or 0
    gu = (torch.randn(n, 2 * f, generator=g) * (60.0 if big else 3.0)).to(dtype)
    gu.requires_grad_()
    y = kd.gated(gu)
    gate, up = gu.chunk(2, -1)
    ref = F.silu(gate) * up
    scale = float(ref.detach().abs().max()) + 1e-3
    _close(y, ref, dtype, scale=scale)
    dy = torch.randn(n, f, generator=g).to(dtype)
    (d,) = torch.autograd.grad(y, gu, dy)
    (r,) = torch.autograd.grad(ref, gu, dy)
    _close(d, r, dtype, scale=float(r.abs().max()) + 1e-3)


def _ref_attention(q, k, v, mask, scale):
    rep = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    kt, vt = kt.repeat_interleave(rep, 1), vt.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask[:, None], scale=scale)
    return out.transpose(1, 2)


@SETTINGS
@given(r=st.integers(1, 4), tq=st.integers(1, 9), tk=st.integers(1, 40), kv=st.integers(1, 3),
       rep=st.integers(1, 3), hd=st.sampled_from([1, 5, 16, 24, 64]),
       seed=st.integers(0, 2**31 - 1), density=st.floats(0.05, 1.0))
def test_attention_matches_sdpa(r, tq, tk, kv, rep, hd, seed, density):
    g = torch.Generator().manual_seed(seed)
    H = kv * rep
    q = torch.randn(r, tq, H, hd, generator=g).requires_grad_()
    k = torch.randn(r, tk, kv, hd, generator=g).requires_grad_()
    v = torch.randn(r, tk, kv, hd, generator=g).requires_grad_()
    mask = torch.rand(r, tq, tk, generator=g) < density
    mask[torch.arange(r)[:, None], torch.arange(tq)[None], torch.randint(
        0, tk, (r, tq), generator=g)] = True  # every query sees a key
    scale = hd ** -0.5
    out = kd.attention(q, k, v, mask, scale)
    ref = _ref_attention(q, k, v, mask, scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    d_o = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q, k, v), d_o)
    want = torch.autograd.grad(ref, (q, k, v), d_o)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * (1 + float(b.abs().max())))


@SETTINGS
@given(b=st.integers(1, 6), cap=st.integers(1, 30), data=st.data(), kv=st.integers(1, 3),
       rep=st.integers(1, 3), hd=st.sampled_from([2, 16, 20, 64]),
       seed=st.integers(0, 2**31 - 1))
def test_decode_attention_reads_the_cache_in_place(b, cap, data, kv, rep, hd, seed):
    n = data.draw(st.integers(1, cap))
    g = torch.Generator().manual_seed(seed)
    H = kv * rep
    q = torch.randn(b, H, hd, generator=g)
    kc, vc = torch.randn(b, cap, kv, hd, generator=g), torch.randn(b, cap, kv, hd, generator=g)
    keys = torch.rand(b, cap, generator=g) < 0.7
    keys[torch.arange(b), torch.randint(0, n, (b,), generator=g)] = True
    out = kd.decode_attention(q, kc, vc, keys, n, 0.2)
    scores = torch.einsum("bkrd,bjkd->bkrj", q.view(b, kv, rep, hd), kc[:, :n]) * 0.2
    probs = torch.softmax(scores.masked_fill(~keys[:, None, None, :n], float("-inf")), -1)
    ref = torch.einsum("bkrj,bjkd->bkrd", probs, vc[:, :n]).reshape(b, H * hd)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_attention_declines_what_it_does_not_cover():
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 5, 2, 8)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    assert kd.attention(q, k, k, mask.float(), 0.3) is None  # not a bool mask
    assert kd.attention(q.double(), k.double(), k.double(), mask, 0.3) is None
    assert kd.attention(q, torch.randn(2, 5, 3, 8), torch.randn(2, 5, 3, 8), mask,
                        0.3) is None  # 4 query heads over 3 key heads
    assert kd.attention(q, k, k, mask[:, :, :4], 0.3) is None
    cache, keys = torch.randn(2, 6, 2, 8), torch.ones(2, 6, dtype=torch.bool)
    q1 = torch.randn(2, 4, 8)
    assert kd.decode_attention(q1, cache, cache, keys, 7, 0.3) is None  # past the capacity
    assert kd.decode_attention(q1, cache, cache, keys, 0, 0.3) is None
    assert kd.decode_attention(q1, cache.transpose(1, 2), cache.transpose(1, 2),
                               keys, 3, 0.3) is None  # head-major cache


def test_no_gradient_path_gives_the_same_values():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 40, generator=g), torch.randn(40, generator=g)
    qkv = torch.randn(5, 3 * 2 * 8, generator=g).to(BF)
    cos, sin = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    gu = torch.randn(5, 34, generator=g).to(BF)
    qa, ka = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 5, 2, 8, generator=g)
    mask = torch.rand(2, 3, 5, generator=g) < 0.7
    mask[..., 0] = True
    with torch.no_grad():
        plain = (kd.rms_norm(x, w, 1e-6, BF), *kd.rotary_split(qkv, cos, sin, (2, 2, 8)),
                 kd.gated(gu), kd.attention(qa, ka, ka, mask, 0.3))
    for t in (x, qkv, gu, qa, ka):
        t.requires_grad_()
    graded = (kd.rms_norm(x, w, 1e-6, BF), *kd.rotary_split(qkv, cos, sin, (2, 2, 8)),
              kd.gated(gu), kd.attention(qa, ka, ka, mask, 0.3))
    for a, b in zip(plain, graded):
        assert torch.equal(a, b.detach())


def test_declines_what_it_does_not_cover(monkeypatch):
    x, w = torch.randn(3, 8), torch.randn(8)
    assert kd.rms_norm(x.double(), w, 1e-6, BF) is None
    assert kd.rms_norm(x, w, 1e-6, torch.float16) is None
    assert kd.rms_norm(x, torch.randn(7), 1e-6, BF) is None
    assert kd.rotary_split(torch.randn(3, 40), torch.randn(3, 8), torch.randn(3, 8),
                           (2, 1, 8)) is None  # 40 columns are not (2 + 2) x 8
    assert kd.rotary_split(torch.randn(3, 30), torch.randn(3, 5), torch.randn(3, 5),
                           (2, 2, 5)) is None  # odd head size
    assert kd.gated(torch.randn(3, 7)) is None
    assert kd.gated(torch.randn(3, 8).half()) is None
    monkeypatch.setenv("PPOKIT_NATIVE", "0")
    assert kd.rms_norm(x, w, 1e-6, BF) is None
    assert kd.gated(torch.randn(3, 8)) is None


def test_fused_forward_same_with_and_without_the_kernels(monkeypatch):
    """The whole fused pass of a small Qwen2 model under bfloat16 autocast: logits and
    gradients with the kernels as without them, to bfloat16 rounding."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ppokit.llm.modeling.fused import fused_logits

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=40, hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=96, max_position_embeddings=64))
    ids = torch.randint(1, 40, (6, 11))
    mask = torch.ones_like(ids)
    mask[:2, :3] = 0  # left padding in two prompts

    def run():
        model.zero_grad()
        with torch.autocast("cpu", dtype=BF):
            out = fused_logits(model, ids, mask, prompt_len=5)
        out.float().pow(2).mean().backward()
        return out.detach().float(), [p.grad.clone() for p in model.parameters()]

    with_k, grads_k = run()
    monkeypatch.setenv("PPOKIT_NATIVE", "0")
    without, grads = run()
    torch.testing.assert_close(with_k, without, rtol=3e-2, atol=3e-2)
    for a, b in zip(grads_k, grads):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-2 * float(b.abs().max()) + 1e-6)
