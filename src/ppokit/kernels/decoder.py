"""The decoder's elementwise steps in C (``decoder.c``), for ppokit's fused forward
(:mod:`ppokit.llm.modeling.fused`): RMS norm with its cast to the projections' format, the
rotary embedding with the split of the fused query/key/value product, and the SiLU-gated
product of the MLP, each as an autograd function whose forward and backward are one pass
over the rows; and attention over short sequences in float32 (:func:`attention`,
token-major, so that the heads need no transposed copies).

Why: on the CPU, at the sizes the token trainer runs (a few hundred tokens of width 256 to
2048 per minibatch), torch spent about as much time on these steps as on the matrix
products: each is five to fifteen tensor operations, each a dispatch and a pass over
memory with a temporary, and autograd adds as many again. On the 10M-parameter bench
model one layer's norm, rotary embedding and gated product took about 9 ms of a 28 ms
forward and backward in torch. torch's CPU attention kernel is built for long sequences;
on a minibatch's prompts (7 tokens) and completions (9 tokens over 16 keys) the compiled
one took 0.8–0.9 of its time, forward and backward, gathers included.

Each function returns None where it does not apply — the extension not built or turned off
(``PPOKIT_NATIVE=0``), a tensor off the CPU, a format other than float32 or bfloat16 — and
the caller then runs the torch formula. The values are torch's: the rotary embedding and
the gated product round to bfloat16 at the same steps as torch's operations and give the
same bits up to a float32 rounding where the compiler fuses a product and a sum; the
norm and attention differ by the order of their sums.
``tests/test_llm_kernels.py`` holds each, forward and backward, to the torch formula on
random inputs.
"""

from __future__ import annotations

import torch

from . import decoder_op, has_decoder

__all__ = ["usable", "rms_norm", "rotary_split", "gated", "attention", "decode_attention"]

_BF16, _F32 = torch.bfloat16, torch.float32


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can run on ``tensors`` (CPU, float32 or bfloat16)."""
    if not has_decoder():
        return False
    return all(t.device.type == "cpu" and t.dtype in (_F32, _BF16) for t in tensors)


def _grad_wanted(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ------------------------------------------------------------------------------ RMS norm
def _rms_fwd(x, w, eps, dtype):
    y = torch.empty(x.shape, dtype=dtype)
    rstd = torch.empty(x.shape[:-1], dtype=_F32)
    n, d = x.numel() // max(x.shape[-1], 1), x.shape[-1]
    decoder_op(0, x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr(), n, d,
               int(dtype == _BF16), float(eps))
    return y, rstd


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps, dtype):
        y, rstd = _rms_fwd(x, w, eps, dtype)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        if dy.dtype not in (_F32, _BF16):
            dy = dy.float()
        dy = dy.contiguous()
        dx = torch.empty_like(x)
        dw = torch.zeros_like(w)
        n, d = x.numel() // max(x.shape[-1], 1), x.shape[-1]
        decoder_op(1, x.data_ptr(), w.data_ptr(), rstd.data_ptr(), dy.data_ptr(),
                   dx.data_ptr(), dw.data_ptr(), n, d, int(dy.dtype == _BF16))
        return dx, (dw if ctx.needs_input_grad[1] else None), None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             dtype: torch.dtype) -> torch.Tensor | None:
    """``(weight * (x * rsqrt(mean(x², -1) + eps))).to(dtype)`` for float32 ``x [..., D]``
    and ``weight [D]``, ``dtype`` float32 or bfloat16; None where the kernel does not apply."""
    if (x.dtype != _F32 or weight.dtype != _F32 or weight.shape != x.shape[-1:]
            or dtype not in (_F32, _BF16) or not usable(x, weight) or x.numel() == 0):
        return None
    x, weight = x.contiguous(), weight.contiguous()
    if _grad_wanted(x, weight):
        return _RMSNorm.apply(x, weight, eps, dtype)
    return _rms_fwd(x, weight, eps, dtype)[0]


# ------------------------------------------------------------------------ rotary + split
def _rope_fwd(qkv, cos, sin, heads):
    H, KV, hd = heads
    n = qkv.shape[0]
    q = torch.empty(n, H, hd, dtype=_F32)
    k = torch.empty(n, KV, hd, dtype=_F32)
    v = torch.empty(n, KV, hd, dtype=_F32)
    decoder_op(2, qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(),
               v.data_ptr(), n, H, KV, hd, int(qkv.dtype == _BF16))
    return q, k, v


class _RotarySplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, heads):
        ctx.save_for_backward(cos, sin)
        ctx.heads, ctx.dtype = heads, qkv.dtype
        return _rope_fwd(qkv, cos, sin, heads)

    @staticmethod
    def backward(ctx, dq, dk, dv):
        cos, sin = ctx.saved_tensors
        H, KV, hd = ctx.heads
        n = cos.shape[0]
        dq, dk, dv = (g.float().contiguous() for g in (dq, dk, dv))
        dqkv = torch.empty(n, (H + 2 * KV) * hd, dtype=ctx.dtype)
        decoder_op(3, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), cos.data_ptr(),
                   sin.data_ptr(), dqkv.data_ptr(), n, H, KV, hd, int(ctx.dtype == _BF16))
        return dqkv, None, None, None


def rotary_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 heads: tuple[int, int, int]):
    """The fused product's rows ``qkv [N, (H + 2 KV) hd]`` (float32 or bfloat16) split into
    ``q [N, H, hd]``, ``k``, ``v [N, KV, hd]`` in float32, q and k rotated: ``t cos +
    rotate_half(t) sin`` with ``rotate_half(t) = (-t[hd/2:], t[:hd/2])`` and ``cos``,
    ``sin`` float32 ``[N, hd]`` (or ``[N, 1, hd]``); None where the kernel does not apply."""
    H, KV, hd = heads
    if qkv.ndim != 2 or hd % 2 or qkv.shape[1] != (H + 2 * KV) * hd or qkv.shape[0] == 0:
        return None
    n = qkv.shape[0]
    if cos.dtype != _F32 or sin.dtype != _F32 or cos.numel() != n * hd or sin.numel() != n * hd:
        return None
    if not usable(qkv, cos, sin):
        return None
    qkv = qkv.contiguous()
    cos, sin = cos.reshape(n, hd).contiguous(), sin.reshape(n, hd).contiguous()
    if _grad_wanted(qkv):
        return _RotarySplit.apply(qkv, cos, sin, (H, KV, hd))
    return _rope_fwd(qkv, cos, sin, (H, KV, hd))


# ---------------------------------------------------------------------- gated product
def _gated_fwd(gu):
    f = gu.shape[-1] // 2
    y = torch.empty(*gu.shape[:-1], f, dtype=gu.dtype)
    decoder_op(4, gu.data_ptr(), y.data_ptr(), gu.numel() // max(2 * f, 1), f,
               int(gu.dtype == _BF16))
    return y


class _Gated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gu):
        ctx.save_for_backward(gu)
        return _gated_fwd(gu)

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        f = gu.shape[-1] // 2
        dy = dy.to(gu.dtype).contiguous()
        dgu = torch.empty_like(gu)
        decoder_op(5, gu.data_ptr(), dy.data_ptr(), dgu.data_ptr(), gu.numel() // (2 * f), f,
                   int(gu.dtype == _BF16))
        return dgu


def gated(gu: torch.Tensor) -> torch.Tensor | None:
    """``silu(gate) * up`` of ``gu = [gate, up]`` along the last dimension (float32 or
    bfloat16, the result in the same format); None where the kernel does not apply."""
    if gu.ndim < 1 or gu.shape[-1] % 2 or gu.numel() == 0 or not usable(gu):
        return None
    gu = gu.contiguous()
    if _grad_wanted(gu):
        return _Gated.apply(gu)
    return _gated_fwd(gu)



# -------------------------------------------------------------------------- attention
def _attn_fwd(q, k, v, mask, scale):
    R, Tq, H, hd = q.shape
    Tk, KV = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    p = torch.empty(R, H, Tq, Tk, dtype=_F32)
    decoder_op(6, q.data_ptr(), k.data_ptr(), v.data_ptr(), mask.data_ptr(), o.data_ptr(),
               p.data_ptr(), R, Tq, Tk, H, KV, hd, Tk * KV * hd, Tq * Tk, float(scale))
    return o, p


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        o, p = _attn_fwd(q, k, v, mask, scale)
        ctx.save_for_backward(q, k, v, p)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, d_o):
        q, k, v, p = ctx.saved_tensors
        R, Tq, H, hd = q.shape
        Tk, KV = k.shape[1], k.shape[2]
        d_o = d_o.float().contiguous()
        dq = torch.empty_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        ds = torch.empty(Tk, dtype=_F32)  # scratch, held here: the call reads its address
        decoder_op(7, q.data_ptr(), k.data_ptr(), v.data_ptr(), p.data_ptr(), d_o.data_ptr(),
                   dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), ds.data_ptr(), R, Tq, Tk, H,
                   KV, hd, float(ctx.scale))
        return dq, dk, dv, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float) -> torch.Tensor | None:
    """Softmax attention in float32, token-major: ``q [R, Tq, H, hd]``, ``k``, ``v [R, Tk,
    KV, hd]`` (query head h reads key head ``h // (H / KV)``), ``mask [R, Tq, Tk]`` bool
    (True: may attend; every query must see at least one key) → ``[R, Tq, H, hd]``, what
    ``scaled_dot_product_attention`` computes on the head-major transposes; None where the
    kernel does not apply."""
    if (q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or q.shape[0] != k.shape[0]
            or q.shape[3] != k.shape[3] or k.shape[2] == 0 or q.shape[2] % k.shape[2]
            or mask.shape != (q.shape[0], q.shape[1], k.shape[1]) or mask.dtype != torch.bool
            or any(t.dtype != _F32 for t in (q, k, v)) or not usable(q, k, v)
            or mask.device.type != "cpu" or q.numel() == 0 or k.shape[1] == 0):
        return None
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    mask = mask.contiguous().view(torch.uint8)
    if _grad_wanted(q, k, v):
        return _Attention.apply(q, k, v, mask, float(scale))
    return _attn_fwd(q, k, v, mask, float(scale))[0]


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     key_mask: torch.Tensor, n: int, scale: float) -> torch.Tensor | None:
    """One decoding step's attention (no gradient): each row's query ``q [B, H, hd]`` over
    the first ``n`` positions of its keys and values ``k_cache``, ``v_cache [B, cap, KV,
    hd]`` (float32, contiguous), ``key_mask [B, cap]`` bool (True: a real key; each row
    has one among the first n) → ``[B, H·hd]``; None where the kernel does not apply."""
    if (q.ndim != 3 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape
            or q.shape[0] != k_cache.shape[0] or q.shape[2] != k_cache.shape[3]
            or k_cache.shape[2] == 0 or q.shape[1] % k_cache.shape[2]
            or key_mask.shape != k_cache.shape[:2] or key_mask.dtype != torch.bool
            or not 0 < n <= k_cache.shape[1] or q.shape[0] == 0
            or any(t.dtype != _F32 for t in (q, k_cache, v_cache))
            or not usable(q, k_cache, v_cache) or key_mask.device.type != "cpu"
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()
                    and key_mask.is_contiguous())):
        return None
    B, H, hd = q.shape
    cap, KV = k_cache.shape[1], k_cache.shape[2]
    q = q.detach().contiguous()
    o = torch.empty(B, H * hd, dtype=_F32)
    p = torch.empty(B, H, n, dtype=_F32)
    mask = key_mask.view(torch.uint8)
    decoder_op(6, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), mask.data_ptr(),
               o.data_ptr(), p.data_ptr(), B, 1, n, H, KV, hd, cap * KV * hd, cap, float(scale))
    return o
