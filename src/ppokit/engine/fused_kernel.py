"""The TorchScript kernel of the fused minibatch step (:mod:`ppokit.engine.fused`): the MLP
actor-critic's PPO step written out as tensor operations — both MLPs' forward and backward,
the PPO-Clip gradient in closed form, the value loss, the entropy bonus, advantage
whitening and global gradient-norm clipping — with the critic's branch forked to torch's
inter-op thread (:func:`_ppo_step`), and :func:`kernel`, which compiles it once.

Every helper here is compiled with the step (TorchScript compiles the functions a scripted
function calls), so each is written in the subset TorchScript reads: no globals, typed
arguments, tuples for several results.
"""

from __future__ import annotations

import atexit
import time
import warnings
from typing import Optional

import torch

from .update import STAT_KEYS

__all__ = ["KERNEL_STAT_KEYS", "kernel", "python_kernel"]


def _mlp_forward(x: torch.Tensor, ws: list[torch.Tensor], bs: list[torch.Tensor],
                 relu: bool, one: torch.Tensor, two: torch.Tensor) -> list[torch.Tensor]:
    """``[input of layer 0, input of layer 1, ..., output]``.

    Hidden activations are ReLU or tanh, the latter computed as ``2 σ(2u) − 1`` (with the
    factor 2 of ``2u`` folded into the matrix product's ``alpha``/``beta``, exact in
    floating point): several times faster than ``torch.tanh`` on the CPU builds measured
    here, equal to it within float32 rounding (absolute error < 1e-7). ``one``/``two`` are
    0-d float tensors: a Python number operand costs a scalar-tensor conversion per call.
    """
    hs = [x]
    h = x
    last = len(ws) - 1
    for i in range(len(ws)):
        if i == last:
            h = torch.addmm(bs[i], h, ws[i].t())
        elif relu:
            h = torch.relu_(torch.addmm(bs[i], h, ws[i].t()))
        else:
            h = torch.addmm(bs[i], h, ws[i].t(), beta=2.0, alpha=2.0)
            h = torch.sigmoid_(h).mul_(two).sub_(one)
        hs.append(h)
    return hs


def _mlp_backward(g: torch.Tensor, hs: list[torch.Tensor], ws: list[torch.Tensor],
                  gws: list[torch.Tensor], gbs: list[torch.Tensor], relu: bool) -> None:
    """Write every weight's and bias's gradient into ``gws``/``gbs``, given
    ``g = ∂loss/∂output`` (the input's gradient is not needed)."""
    n = len(ws)
    for j in range(n):
        i = n - 1 - j
        h_in = hs[i]
        torch.mm(g.t(), h_in, out=gws[i])
        torch.sum(g, 0, out=gbs[i])
        if i > 0:
            g = g.mm(ws[i])
            # the activations' own backward kernels, from their outputs: g·(h > 0) and
            # g·(1 − h²), one pass each and no temporaries
            if relu:
                g = torch.ops.aten.threshold_backward(g, h_in, 0.0)
            else:
                g = torch.ops.aten.tanh_backward(g, h_in)


def _critic_branch(x: torch.Tensor, ret: torch.Tensor, v_old: torch.Tensor,
                   ws: list[torch.Tensor], bs: list[torch.Tensor], gws: list[torch.Tensor],
                   gbs: list[torch.Tensor], relu: bool, vf_coef: float, clip_vf: float,
                   clip_max: bool, one: torch.Tensor, two: torch.Tensor) -> torch.Tensor:
    """Value loss ``(V − R)²`` (optionally clipped around ``v_old``: ``clip_vf >= 0``,
    pessimistic ``max`` form or the ``clipped`` prediction form) and its gradient."""
    hs = _mlp_forward(x, ws, bs, relu, one, two)
    v = hs[-1].squeeze(-1)
    diff = v - ret
    if clip_vf >= 0.0:
        dv = v - v_old
        diff_c = (v_old + dv.clamp(-clip_vf, clip_vf)) - ret
        inside = dv.abs() <= clip_vf
        if clip_max:
            sq = diff * diff
            sq_c = diff_c * diff_c
            use_c = sq_c > sq
            vl = torch.where(use_c, sq_c, sq).mean()
            g_v = torch.where(use_c, diff_c * inside, diff)
        else:
            vl = (diff_c * diff_c).mean()
            g_v = diff_c * inside
    else:
        vl = (diff * diff).mean()
        g_v = diff
    g = g_v.mul(2.0 * vf_coef / x.shape[0]).unsqueeze(-1)
    _mlp_backward(g, hs, ws, gws, gbs, relu)
    return vl


def _log_probs(out: torch.Tensor, actions: torch.Tensor, log_std: torch.Tensor,
               categorical: bool, inv_n: float
               ) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor, torch.Tensor,
                          torch.Tensor, torch.Tensor, torch.Tensor]:
    """The actions' log-probabilities under the actor's output ``out`` and what the
    gradient needs of them: ``(logp, entropy statistic, its scale, probs, log-softmax,
    probs · log-softmax, z, 1/std)``. The entropy statistic is ``−n ·`` the mean entropy
    (categorical, scale ``−1/n``) or the state-independent Gaussian entropy (scale 1); the
    entries of the other distribution are ``out``, unused."""
    if categorical:
        logp_all = torch.log_softmax(out, -1)
        probs = logp_all.exp()
        logp = logp_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        p_logp = probs * logp_all
        return logp, p_logp.sum(), -inv_n, probs, logp_all, p_logp, out, out
    inv_std = torch.exp(-log_std)
    z = (actions - out) * inv_std
    log_sqrt_2pi = 0.9189385332046727  # ½ log 2π (TorchScript cannot read a global)
    logp = (z * z).mul_(-0.5).sub_(log_std).sub_(log_sqrt_2pi).sum(-1)
    ent_stat = (log_std + (0.5 + log_sqrt_2pi)).sum()  # the entropy (state-independent)
    return logp, ent_stat, 1.0, out, out, out, z, inv_std


def _whiten(adv: torch.Tensor) -> torch.Tensor:
    """The minibatch's advantages whitened (ddof 1, eps 1e-8), shifted by one sample
    first, as masked_whiten: equal advantages give exact zeros; one sample gives 0."""
    if adv.shape[0] > 1:
        adv = adv - adv[0]
        std, mean = torch.std_mean(adv)
        return (adv - mean) / (std + 1e-8)
    return torch.zeros_like(adv)


def _policy_objective(ratio: torch.Tensor, logp: torch.Tensor, adv: torch.Tensor,
                      kl_sum: torch.Tensor, clip: float, use_clip: bool, inv_n: float,
                      one: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(Σ objective, ∂loss/∂log π, clipped count, clip-active count)`` of PPO-Clip
    (``use_clip``) or the plain policy gradient."""
    if use_clip:
        s1 = ratio * adv
        s2 = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
        active = s2 < s1
        pl_sum = torch.minimum(s1, s2).sum()
        # −∂/∂log π of min(ρÂ, clip(ρ)Â): ρÂ, except exactly 0 where the clipped branch is active
        g_logp = s1.masked_fill_(active, 0.0).mul_(-inv_n)
        clip_count = ((ratio - one).abs_() > clip).sum(dtype=torch.float32)
        return pl_sum, g_logp, clip_count, active.sum(dtype=torch.float32)
    clip_count = torch.zeros_like(kl_sum)
    return (logp * adv).sum(), adv * (-inv_n), clip_count, clip_count


def _output_grad(gl: torch.Tensor, actions: torch.Tensor, probs: torch.Tensor,
                 logp_all: torch.Tensor, p_logp: torch.Tensor, z: torch.Tensor,
                 inv_std: torch.Tensor, log_std_grad: torch.Tensor, categorical: bool,
                 ent_coef: float, inv_n: float, one: torch.Tensor) -> torch.Tensor:
    """The loss's gradient in the actor's output from ``gl = ∂loss/∂log π`` ``[M, 1]``,
    the entropy bonus's included; a Gaussian's log-std gradient goes to ``log_std_grad``."""
    if categorical:
        g_out = probs * gl.neg()
        g_out.scatter_add_(-1, actions.unsqueeze(-1), gl)
        if ent_coef != 0.0:
            # d(-ent_coef * mean H)/d logits = ent_coef/n * p * (log p + H)
            ent = p_logp.sum(-1, keepdim=True).neg_()
            g_out.add_(probs * (logp_all + ent), alpha=ent_coef * inv_n)
        return g_out
    # d logp / d mean = z / std ; d logp / d log_std = z^2 - 1
    g_out = (z * inv_std).mul_(gl)
    torch.sum((z * z).sub_(one).mul_(gl), 0, out=log_std_grad)
    if ent_coef != 0.0:
        log_std_grad.sub_(ent_coef)
    return g_out


def _clip_grad_norm(flat_grad: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """The gradient's norm, and the gradient scaled as torch.nn.utils.clip_grad_norm_
    does (by min(1, max / (norm + 1e-6)), skipping the multiplication by exactly 1);
    ``max_grad_norm`` < 0: no clipping."""
    grad_norm = torch.linalg.vector_norm(flat_grad)
    if max_grad_norm >= 0.0:
        if float(grad_norm) + 1e-6 > max_grad_norm:
            flat_grad.mul_(max_grad_norm / (grad_norm + 1e-6))
    return grad_norm


def _ppo_step(x: torch.Tensor, actions: torch.Tensor, logp_old: torch.Tensor,
              adv: torch.Tensor, ret: torch.Tensor, v_old: torch.Tensor,
              aws: list[torch.Tensor], abs_: list[torch.Tensor], agws: list[torch.Tensor],
              agbs: list[torch.Tensor], cws: list[torch.Tensor], cbs: list[torch.Tensor],
              cgws: list[torch.Tensor], cgbs: list[torch.Tensor], log_std: torch.Tensor,
              log_std_grad: torch.Tensor, flat_grad: torch.Tensor, categorical: bool,
              relu_a: bool, relu_c: bool, clip: float, use_clip: bool, norm_adv: bool,
              kl_limit: float, vf_coef: float, clip_vf: float, clip_max: bool,
              ent_coef: float, max_grad_norm: float, one: torch.Tensor,
              two: torch.Tensor, parallel: bool = True) -> tuple[torch.Tensor, bool]:
    """Loss and gradients of one minibatch, written into ``flat_grad`` and clipped.

    Returns ``(stats, stopped)``: ``stats`` holds policy loss, value loss, entropy, approx
    KL (k3), approx KL (k1), clip fraction, clip-active fraction, min and max ratio and the
    gradient norm before clipping (:data:`STAT_KEYS`); ``stopped`` is True when
    ``kl_limit >= 0`` and the approx KL exceeds it: then nothing was stepped and ``stats``
    is empty. Negative ``clip_vf`` / ``kl_limit`` / ``max_grad_norm`` mean "off".
    ``parallel`` False waits for the critic's branch before the actor's starts (the same
    arithmetic; for a machine whose other cores are busy).
    """
    fut: Optional[torch.jit.Future[torch.Tensor]] = None  # noqa: UP045 - TorchScript
    if parallel:
        fut = torch.jit.fork(_critic_branch, x, ret, v_old, cws, cbs, cgws, cgbs, relu_c,
                             vf_coef, clip_vf, clip_max, one, two)
        vl = one
    else:  # the critic's branch first, then the actor's: one core at a time
        vl = _critic_branch(x, ret, v_old, cws, cbs, cgws, cgbs, relu_c, vf_coef, clip_vf,
                            clip_max, one, two)
    n = x.shape[0]
    inv_n = 1.0 / n
    hs = _mlp_forward(x, aws, abs_, relu_a, one, two)
    out = hs[-1]
    logp, ent_stat, ent_scale, probs, logp_all, p_logp, z, inv_std = _log_probs(
        out, actions, log_std, categorical, inv_n)
    if norm_adv:
        adv = _whiten(adv)
    log_ratio = logp - logp_old
    ratio = torch.exp(log_ratio)
    kl_sum = (torch.expm1(log_ratio) - log_ratio).sum()
    if kl_limit >= 0.0:
        if float(kl_sum) * inv_n > kl_limit:
            if fut is not None:
                torch.jit.wait(fut)
            return torch.empty(0), True
    pl_sum, g_logp, clip_count, active_count = _policy_objective(
        ratio, logp, adv, kl_sum, clip, use_clip, inv_n, one)
    g_out = _output_grad(g_logp.unsqueeze(-1), actions, probs, logp_all, p_logp, z, inv_std,
                         log_std_grad, categorical, ent_coef, inv_n, one)
    _mlp_backward(g_out, hs, aws, agws, agbs, relu_a)
    if fut is not None:
        vl = torch.jit.wait(fut)
    grad_norm = _clip_grad_norm(flat_grad, max_grad_norm)
    r_min, r_max = torch.aminmax(ratio)
    stats = torch.stack([pl_sum, vl, ent_stat, kl_sum, log_ratio.sum(), clip_count,
                         active_count, r_min, r_max, grad_norm])
    scale = torch.tensor([-inv_n, 1.0, ent_scale, inv_n, -inv_n, inv_n, inv_n, 1.0, 1.0, 1.0])
    return stats.mul_(scale), False


def _ppo_step_serial(x: torch.Tensor, actions: torch.Tensor, logp_old: torch.Tensor,
                     adv: torch.Tensor, ret: torch.Tensor, v_old: torch.Tensor,
                     aws: list[torch.Tensor], abs_: list[torch.Tensor],
                     agws: list[torch.Tensor], agbs: list[torch.Tensor],
                     cws: list[torch.Tensor], cbs: list[torch.Tensor],
                     cgws: list[torch.Tensor], cgbs: list[torch.Tensor], log_std: torch.Tensor,
                     log_std_grad: torch.Tensor, flat_grad: torch.Tensor, categorical: bool,
                     relu_a: bool, relu_c: bool, clip: float, use_clip: bool, norm_adv: bool,
                     kl_limit: float, vf_coef: float, clip_vf: float, clip_max: bool,
                     ent_coef: float, max_grad_norm: float, one: torch.Tensor,
                     two: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``_ppo_step`` with ``parallel`` False, compiled as a graph of its own: one compiled
    function called with both values of ``parallel`` left a thread behind at exit now and
    then (an abort after the last output) when the value changed after many calls."""
    return _ppo_step(x, actions, logp_old, adv, ret, v_old, aws, abs_, agws, agbs, cws, cbs,
                     cgws, cgbs, log_std, log_std_grad, flat_grad, categorical, relu_a, relu_c,
                     clip, use_clip, norm_adv, kl_limit, vf_coef, clip_vf, clip_max, ent_coef,
                     max_grad_norm, one, two, False)


# the kernel's statistics vector: the engine's STAT_KEYS but the last (no KL term here)
KERNEL_STAT_KEYS = STAT_KEYS[:10]


def _compile_kernel(fn):
    """The TorchScript-compiled ``fn`` (``_ppo_step`` or ``_ppo_step_serial``), or ``None``
    when this torch cannot compile it (the plain-Python kernel is used then). TorchScript is
    deprecated upstream but is the one way to run the step GIL-free without a compiler
    toolchain or a compile-time cost."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.script(fn)
    except Exception:  # noqa: BLE001 - any failure means: use the Python kernel
        return None


_KERNEL: dict = {}  # serial -> compiled kernel or None, filled on first use


def python_kernel(*args, **kwargs):
    """``_ppo_step`` run as plain Python (``torch.jit.fork`` then runs the critic branch
    synchronously, with a deprecation warning per call that is not the caller's business)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _ppo_step(*args, **kwargs)


def kernel(script: bool = True, serial: bool = False):
    """The step kernel: compiled when ``script`` and possible, else plain Python;
    ``serial``: the critic's branch before the actor's (:func:`_ppo_step_serial`)."""
    if not script:
        return python_kernel
    if serial not in _KERNEL:
        if not _KERNEL:
            atexit.register(_let_the_critic_thread_finish)
        _KERNEL[serial] = _compile_kernel(_ppo_step_serial if serial else _ppo_step)
    return _KERNEL[serial] or python_kernel


def _let_the_critic_thread_finish() -> None:
    """At exit, give up the GIL for a moment. The inter-op thread that ran the critic's
    branch takes the GIL once more after its result is delivered (to let go of the tensors
    it was given); if the interpreter is already shutting down then, Python ends that
    thread from under C++ frames that may not be unwound, and the process aborts
    ("terminate called without an active exception", exit 134) after all its work is
    done. A process that exits right after a parallel step hit that now and then; a
    moment without the GIL lets the thread finish first."""
    time.sleep(0.005)
