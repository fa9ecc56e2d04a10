"""The fused minibatch step: a backend of the update engine for ppokit's MLP actor-critic.

Why: on a small MLP the eager step (autograd + optimiser) is mostly per-call overhead — the
autograd graph, the distribution helpers, one kernel launch per tensor operation from
Python. The arithmetic is a few ``[M, 64]`` (or ``[M, 256]``) matrix products. This module
computes what :func:`ppokit.engine.eager_minibatch_step` computes as one compiled kernel
(:func:`_ppo_step`):

* forward and backward of both MLPs written out (``addmm``, tanh/ReLU and their backward
  kernels), no autograd graph;
* the PPO-Clip gradient in closed form: ``∂(−min(ρÂ, clip(ρ)Â))/∂log π = −ρÂ`` except on
  the samples whose clipped branch is active, where it is exactly 0 (the definition of
  ``clip_active_frac``);
* the value loss ``(V − R)²`` (optionally clipped, ``max`` or ``clipped`` form), entropy
  bonus, minibatch advantage whitening (ddof 1, eps 1e-8, as :func:`ppokit.core.masked_whiten`);
* the critic's whole branch runs on torch's inter-op thread in parallel with the actor's,
  outside the GIL (the kernel is TorchScript), so both cores work during the update;
* global gradient-norm clipping on the flat gradient (:class:`ppokit.engine.flat.FlatParameters`),
  then the optimiser's own step (ppokit's :class:`~ppokit.algos.optim.Adam` over the same
  flat buffers: one fused-kernel call).

**Two implementations of the same step.** Where the C extension is built, the default is
the native step (:mod:`ppokit.engine.native`: the arithmetic below written out in C, Adam
included, one call per minibatch; 2-5x the TorchScript kernel on a 64-wide MLP, on one
core). The TorchScript kernel below runs otherwise, and for layers wider than
:data:`~ppokit.engine.native.NATIVE_MAX_WIDTH`, where torch's matrix products win.

**What runs and how it is held to the reference.** The trainer uses this step whenever
:func:`supports` accepts the update spec and the policy (``fast = true``, the default); it
says once in its log when it falls back to the eager step and why. :func:`supports` is
derived from :class:`~ppokit.engine.UpdateSpec`: every spec field must appear in
:data:`_SPEC_SUPPORT`, so a new field fails loudly (``tests/test_fast_path.py``) until this
backend says whether it handles it. The reference is :func:`reference_step` — the engine's
eager step with the policy's own forward, no trainer object — and the tests compare both on
many random minibatches, compiled and as plain Python.
"""

from __future__ import annotations

import atexit
import functools
import time
import warnings
from collections.abc import Callable
from typing import Optional

import torch
from torch import nn

from ppokit.policies.mlp import MLPActorCritic
from ppokit.threads import usable_cores

from .flat import FlatParameters
from .forward import policy_forward, reference_step
from .native import NATIVE_MAX_WIDTH, NativeStep
from .native import why_not as native_why_not
from .update import STAT_KEYS, UpdateSpec, spec_fields

__all__ = ["FusedStep", "supports", "reference_step", "policy_forward", "KERNEL_STAT_KEYS"]

_ANY = object()
# every UpdateSpec field and what this backend handles: a set of allowed values, a predicate
# or _ANY (the value is a kernel argument)
_SPEC_SUPPORT: dict[str, object] = {
    "policy_loss": {"clip", "vanilla"},
    "clip_range": _ANY,
    "clip_range_high": {None},
    "dual_clip": {None},
    "agg": {"token-mean"},
    "norm_length": _ANY,  # only read by seq-mean-token-sum-norm
    "use_critic": {True},
    "vf_coef": _ANY,
    "ent_coef": _ANY,
    "kl_anchor": {"none"},
    "kl_coef": _ANY,  # unused without a KL term
    "kl_estimator": _ANY,  # (likewise)
    "clip_range_vf": _ANY,
    "value_clip_mode": {"max", "clipped"},
    "max_grad_norm": _ANY,
    "target_kl": _ANY,
    "target_kl_check": {"minibatch", "epoch"},
    "n_epochs": _ANY,
    "minibatch_size": _ANY,
    "grad_accum": {1},
    "normalize_advantage": _ANY,
    "advantage_norm_scope": {"minibatch", "batch"},
}


def supports(spec: UpdateSpec, policy: nn.Module, masked: bool = False) -> str | None:
    """``None`` when the fused step computes this spec's update for this policy, else the
    reason why not (``masked``: the rollouts carry action masks, which the kernels do not
    apply). A spec field this backend does not know is an error."""
    unknown = [f for f in spec_fields() if f not in _SPEC_SUPPORT]
    if unknown:
        raise RuntimeError(f"fused step: UpdateSpec fields {unknown} are not covered by "
                           "ppokit.engine.fused._SPEC_SUPPORT; say whether the kernel "
                           "handles them")
    for name, allowed in _SPEC_SUPPORT.items():
        v = getattr(spec, name)
        if allowed is not _ANY and v not in allowed:
            return f"{name}={v}"
    if masked:
        return "action masks (the masked logits run in the eager step)"
    if getattr(policy, "recurrent", False):
        return "a recurrent policy (its sequences run in the eager step)"
    if not isinstance(policy, MLPActorCritic):
        return "the policy is not ppokit's MLP actor-critic"
    if policy.kind not in ("categorical", "gaussian"):
        return f"{policy.kind} action heads"
    if policy.obs_onehot is not None:
        return "one-hot (Discrete) observations"
    if getattr(policy, "encoder", None) is not None:
        return "an observation encoder (CNN or multi-input) before the MLP"
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in policy.parameters()):
        return "parameters that are not float32 on the CPU"
    in_dim = getattr(policy, "obs_dim", None)
    first = next((m for m in policy.actor if isinstance(m, nn.Linear)), None)
    if first is None or (in_dim is not None and first.in_features != in_dim):
        return "an observation encoder before the MLP"
    for seq in (policy.actor, policy.critic):
        for m in seq:
            if not isinstance(m, (nn.Linear, nn.Tanh, nn.ReLU)):
                return f"layer {type(m).__name__}"
    return None


# --------------------------------------------------------------------------- the kernel
# Written in the subset of Python that TorchScript compiles. Compiled, one call runs the
# whole minibatch step in C++: no Python overhead per operation, and the critic's branch
# (forward, value loss, backward) runs on torch's inter-op thread *without the GIL*, in
# parallel with the actor's branch on the calling thread. The same functions also run as
# plain Python (then ``torch.jit.fork`` executes the critic synchronously); that is the
# fallback when TorchScript is unavailable, and the tests check both against the eager step.


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
    if categorical:
        logp_all = torch.log_softmax(out, -1)
        probs = logp_all.exp()
        a = actions.unsqueeze(-1)
        logp = logp_all.gather(-1, a).squeeze(-1)
        p_logp = probs * logp_all
        ent_stat = p_logp.sum()  # −n · mean entropy
        ent_scale = -inv_n
        z = out  # (Gaussian only)
        inv_std = out
    else:
        inv_std = torch.exp(-log_std)
        z = (actions - out) * inv_std
        log_sqrt_2pi = 0.9189385332046727  # ½ log 2π (TorchScript cannot read a global)
        logp = (z * z).mul_(-0.5).sub_(log_std).sub_(log_sqrt_2pi).sum(-1)
        ent_stat = (log_std + (0.5 + log_sqrt_2pi)).sum()  # the entropy (state-independent)
        ent_scale = 1.0
        probs = out  # (categorical only)
        logp_all = out
        p_logp = out
        a = actions
    if norm_adv:
        if n > 1:
            # shifted by one sample first, as masked_whiten: equal advantages give exact zeros
            adv = adv - adv[0]
            std, mean = torch.std_mean(adv)
            adv = (adv - mean) / (std + 1e-8)
        else:
            adv = torch.zeros_like(adv)
    log_ratio = logp - logp_old
    ratio = torch.exp(log_ratio)
    kl_sum = (torch.expm1(log_ratio) - log_ratio).sum()
    if kl_limit >= 0.0:
        if float(kl_sum) * inv_n > kl_limit:
            if fut is not None:
                torch.jit.wait(fut)
            return torch.empty(0), True
    if use_clip:
        s1 = ratio * adv
        s2 = ratio.clamp(1.0 - clip, 1.0 + clip) * adv
        active = s2 < s1
        pl_sum = torch.minimum(s1, s2).sum()
        # −∂/∂log π of min(ρÂ, clip(ρ)Â): ρÂ, except exactly 0 where the clipped branch is active
        g_logp = s1.masked_fill_(active, 0.0).mul_(-inv_n)
        clip_count = ((ratio - one).abs_() > clip).sum(dtype=torch.float32)
        active_count = active.sum(dtype=torch.float32)
    else:
        pl_sum = (logp * adv).sum()
        g_logp = adv * (-inv_n)
        clip_count = torch.zeros_like(kl_sum)
        active_count = clip_count
    gl = g_logp.unsqueeze(-1)
    if categorical:
        g_out = probs * gl.neg()
        g_out.scatter_add_(-1, a, gl)
        if ent_coef != 0.0:
            # d(-ent_coef * mean H)/d logits = ent_coef/n * p * (log p + H)
            ent = p_logp.sum(-1, keepdim=True).neg_()
            g_out.add_(probs * (logp_all + ent), alpha=ent_coef * inv_n)
    else:
        # d logp / d mean = z / std ; d logp / d log_std = z^2 - 1
        g_out = (z * inv_std).mul_(gl)
        torch.sum((z * z).sub_(one).mul_(gl), 0, out=log_std_grad)
        if ent_coef != 0.0:
            log_std_grad.sub_(ent_coef)
    _mlp_backward(g_out, hs, aws, agws, agbs, relu_a)
    if fut is not None:
        vl = torch.jit.wait(fut)
    grad_norm = torch.linalg.vector_norm(flat_grad)
    if max_grad_norm >= 0.0:
        # torch.nn.utils.clip_grad_norm_'s rule, scale by min(1, max / (norm + 1e-6)),
        # skipping the multiplication by exactly 1
        if float(grad_norm) + 1e-6 > max_grad_norm:
            flat_grad.mul_(max_grad_norm / (grad_norm + 1e-6))
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


def _python_kernel(*args, **kwargs):
    """``_ppo_step`` run as plain Python (``torch.jit.fork`` then runs the critic branch
    synchronously, with a deprecation warning per call that is not the caller's business)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return _ppo_step(*args, **kwargs)


def kernel(script: bool = True, serial: bool = False):
    """The step kernel: compiled when ``script`` and possible, else plain Python;
    ``serial``: the critic's branch before the actor's (:func:`_ppo_step_serial`)."""
    if not script:
        return _python_kernel
    if serial not in _KERNEL:
        if not _KERNEL:
            atexit.register(_let_the_critic_thread_finish)
        _KERNEL[serial] = _compile_kernel(_ppo_step_serial if serial else _ppo_step)
    return _KERNEL[serial] or _python_kernel


def _let_the_critic_thread_finish() -> None:
    """At exit, give up the GIL for a moment. The inter-op thread that ran the critic's
    branch takes the GIL once more after its result is delivered (to let go of the tensors
    it was given); if the interpreter is already shutting down then, Python ends that
    thread from under C++ frames that may not be unwound, and the process aborts
    ("terminate called without an active exception", exit 134) after all its work is
    done. A process that exits right after a parallel step hit that now and then; a
    moment without the GIL lets the thread finish first."""
    time.sleep(0.005)


class FasterOfTwo:
    """Choose between two ways of doing the same work (True / False) by how long each
    takes now. The first ``skip`` calls of each way are not timed (their warm-up:
    TorchScript profiles and optimises a graph over its first runs), the next ``2 *
    window`` alternate; from then on the way with the lower median of its last ``window``
    times runs, and every ``every`` calls the other runs ``trials`` times, which is enough
    to replace its median (a machine's load changes)."""

    def __init__(self, skip: int = 3, window: int = 5, every: int = 500, trials: int = 3):
        self.skip, self.window, self.every, self.trials = skip, window, every, trials
        self.times: dict[bool, list[float]] = {True: [], False: []}
        self.calls = 0

    def median(self, way: bool) -> float:
        t = sorted(self.times[way])
        return t[len(t) // 2] if t else float("inf")

    def next(self) -> bool:
        n = self.calls
        if n < 2 * (self.skip + self.window):
            return n % 2 == 0
        best = self.median(True) <= self.median(False)
        return (not best) if n % self.every < self.trials else best

    def took(self, way: bool, seconds: float) -> None:
        self.calls += 1
        if self.calls <= 2 * self.skip:
            return
        t = self.times[way]
        t.append(seconds)
        del t[:-self.window]


def _layers(seq: nn.Sequential) -> tuple[list[nn.Linear], str]:
    lins = [m for m in seq if isinstance(m, nn.Linear)]
    act = "tanh" if any(isinstance(m, nn.Tanh) for m in seq) else "relu"
    return lins, act


class FusedStep:
    """One minibatch update of ``spec`` for ``policy`` without autograd.

    ``flat`` must hold the policy's parameters (created before the optimiser); the step
    writes every gradient into ``flat.grad``, clips its norm and calls ``optimizer.step()``
    (ppokit's Adam over the same flat buffers: one kernel call). :meth:`step` returns the
    statistics as one vector ordered as :data:`KERNEL_STAT_KEYS`, or ``None`` when
    ``kl_limit`` stopped it before the step; calling the object returns them as a dict.
    ``script=False`` runs the kernel as plain Python. ``parallel``: True runs the critic's
    branch beside the actor's (on torch's inter-op thread), False before it (one core at
    a time); None (the default) or ``"auto"`` picks whichever is faster now
    (:class:`FasterOfTwo`: both compute the same numbers bit for bit, and when another
    process keeps the second core busy the serial way wins). The native backend offers
    the same two ways (its critic beside the actor on the extension's worker thread, or
    before it) and by default (``"auto"``) chooses between them itself, step by step,
    while the worker keeps up: see the comment in ``__init__`` and
    :class:`~ppokit.engine.native.NativeStep`.

    ``backend``: ``"native"`` — the same step in C, Adam included
    (:mod:`ppokit.engine.native`; needs the built extension and ppokit's flat Adam);
    ``"script"`` — the TorchScript kernel; ``"python"`` — that kernel as plain Python;
    ``"auto"`` (the default) — native when it can run and no layer is wider than
    :data:`~ppokit.engine.native.NATIVE_MAX_WIDTH`, else script. The choice depends on the
    network's shape alone, never on timing, so a resumed run computes with the kernel its
    original did. :attr:`backend` says which one runs (:attr:`native_reason`: why not
    native).
    """

    BACKENDS = ("auto", "native", "script", "python")

    def __init__(self, spec: UpdateSpec, policy: MLPActorCritic, flat: FlatParameters,
                 optimizer, *, script: bool = True, parallel: bool | None = None,
                 backend: str = "auto"):
        reason = supports(spec, policy)
        if reason is not None:
            raise ValueError(f"the fused step does not support {reason}")
        if backend not in self.BACKENDS:
            raise ValueError(f"FusedStep: backend must be one of {self.BACKENDS}, "
                             f"got {backend!r}")
        if not script:
            backend = "python"
        params = [p for p in policy.parameters() if p.requires_grad]
        if not flat.owns(params):
            raise ValueError("the fused step needs FlatParameters over the policy's "
                             "parameters, created before the optimiser")
        self.policy, self.flat, self.opt, self.spec = policy, flat, optimizer, spec
        script = backend != "python"
        self.kernel = kernel(script)
        self.serial_kernel = kernel(script, serial=True)
        # called with each minibatch exactly as the kernel receives it (ppokit check)
        self.input_observer: Callable[[dict], None] | None = None
        a_lins, a_act = _layers(policy.actor)
        c_lins, c_act = _layers(policy.critic)
        nets = ([m.weight for m in a_lins], [m.bias for m in a_lins],
                [m.weight.grad for m in a_lins], [m.bias.grad for m in a_lins],
                [m.weight for m in c_lins], [m.bias for m in c_lins],
                [m.weight.grad for m in c_lins], [m.bias.grad for m in c_lins])
        self._nets = tuple([t.detach() for t in ts] for ts in nets)
        gauss = policy.kind == "gaussian"
        self._log_std = (policy.log_std.detach(), policy.log_std.grad) if gauss else \
            (torch.empty(0), torch.empty(0))
        s = spec
        self._opts = dict(
            categorical=not gauss, relu_a=a_act == "relu", relu_c=c_act == "relu",
            use_clip=s.policy_loss == "clip",
            norm_adv=bool(s.normalize_advantage and s.advantage_norm_scope == "minibatch"),
            vf_coef=float(s.vf_coef),
            clip_vf=float(s.clip_range_vf) if s.clip_range_vf is not None else -1.0,
            clip_max=s.value_clip_mode == "max", ent_coef=float(s.ent_coef),
            max_grad_norm=float(s.max_grad_norm) if s.max_grad_norm is not None else -1.0,
            one=torch.tensor(1.0), two=torch.tensor(2.0))
        if parallel not in (None, True, False, "auto"):
            raise ValueError(f"FusedStep: parallel must be True, False, 'auto' or None, "
                             f"got {parallel!r}")
        timed = parallel is None or parallel == "auto"
        self.parallel = True if timed else bool(parallel)
        self.pick = FasterOfTwo() if timed else None
        self.native: NativeStep | None = None
        if backend in ("auto", "native"):
            why = native_why_not()
            if why is None and not (getattr(optimizer, "flat", None) is flat
                                    and hasattr(optimizer, "exp_avg")):
                why = "the optimiser is not ppokit's Adam over the flat buffers"
            widest = max(m.out_features for m in a_lins + c_lins)
            if why is None and backend == "auto" and widest > NATIVE_MAX_WIDTH:
                # wider layers: torch's matrix products (MKL) beat the native loops
                why = f"layers wider than {NATIVE_MAX_WIDTH}"
            if why is None:
                self.native = NativeStep(policy, a_lins, c_lins, flat, optimizer, self._opts)
            elif backend == "native":
                raise ValueError(f"FusedStep: the native backend cannot run: {why}")
            self.native_reason = why
        else:
            self.native_reason = f"backend={backend!r}"
        if self.native is not None and timed:
            # The native step chooses for itself, step by step: its critic beside the
            # actor (on the extension's worker thread: 0.6-0.7x the step's time on a
            # quiet machine) while the worker keeps up, before it while another process
            # holds the second core (a fixed choice measured 1.13-1.29x one thread's time
            # there, bench.load). By default, with one CPU to run on (pinned), never
            # beside it.
            self.parallel = "auto" if parallel == "auto" or usable_cores() >= 2 else False
            self.pick = None
        self.backend = "native" if self.native is not None else \
            ("script" if isinstance(self.kernel, torch.jit.ScriptFunction) else "python")

    def __call__(self, mb: dict[str, torch.Tensor], clip_range: float,
                 kl_limit: float | None = None) -> dict[str, torch.Tensor] | None:
        stats = self.step(mb, clip_range, kl_limit)
        return None if stats is None else dict(zip(KERNEL_STAT_KEYS, stats.unbind()))

    def step(self, mb: dict[str, torch.Tensor], clip_range: float,
             kl_limit: float | None = None) -> torch.Tensor | None:
        if self.input_observer is not None:
            self.input_observer(mb)
        x = mb["obs"]
        x = x.reshape(x.shape[0], -1)
        actions = mb["actions"]
        if self._opts["categorical"]:
            actions = actions.long()
        else:  # a Box of any shape, read flattened (ppokit.policies.actions)
            actions = actions.reshape(actions.shape[0], -1)
        if self.native is not None:  # (it times nothing here: "auto" is the kernel's own)
            return self.native(x, actions, mb["logp"], mb["advantages"], mb["returns"],
                               mb["values"], float(clip_range),
                               float(kl_limit) if kl_limit is not None else -1.0,
                               parallel=self.parallel)
        pick = self.pick
        if pick is not None:
            self.parallel = way = pick.next()
            t0 = time.perf_counter()
        run = self.kernel if self.parallel else self.serial_kernel
        if run is _python_kernel and not self.parallel:
            run = functools.partial(_python_kernel, parallel=False)
        stats, stopped = run(
            x, actions, mb["logp"], mb["advantages"], mb["returns"], mb["values"],
            *self._nets, *self._log_std, self.flat.grad, clip=float(clip_range),
            kl_limit=float(kl_limit) if kl_limit is not None else -1.0, **self._opts)
        if pick is not None:
            pick.took(way, time.perf_counter() - t0)
        if stopped:
            return None
        self.opt.step()
        return stats
