"""The native minibatch step: the fused step's arithmetic in C, one call per minibatch.

:mod:`ppokit.engine.fused` computes an MLP actor-critic's PPO minibatch step without
autograd, as one TorchScript graph. On the small networks PPO is run with on classic
control (two 64-wide layers), that graph still spends most of its time between its eighty
or so operations (one dispatch each) and in the optimiser's separate call.
``ppokit/kernels/ppo_step.c`` writes the same step out as loops over float32 buffers — the
forward and backward of both networks, the losses, the gradient-norm clipping and Adam —
in one function: no allocation, no dispatch, no threads.

It is compiled when ppokit is installed (:mod:`ppokit.kernels`, an optional extension
built by ``setup.py``, so an install without a C compiler still works and uses the
TorchScript kernel). The fused step
uses it when it is there and the optimiser is ppokit's flat Adam; :func:`available` says
whether it is, and why not. Its results equal the eager step's within float32 rounding
(``tests/test_native_step.py`` compares them on many random minibatches): the sums run in
another order than torch's kernels, so a run is not bit-for-bit the TorchScript kernel's,
but the native step is deterministic, and a run resumed on the same build computes exactly
what the original did.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ppokit import kernels

__all__ = ["available", "NativeStep", "NATIVE_MAX_WIDTH"]

# The fused step's "auto" backend runs the native step on networks no wider than this.
# Measured one step at a time on one core (python -m bench.native_step, 2026-12-02), the
# TorchScript kernel's time over the native step's: hidden 64 — 2.0-5.1x, 128 — 2.1-2.6x,
# 256 — 1.1-1.4x, 512 — 0.84x (there torch's MKL matrix products beat these loops).
NATIVE_MAX_WIDTH = 256

def available() -> bool:
    """Whether the native step can run here (:func:`ppokit.kernels.available`)."""
    return kernels.available("step")


def why_not() -> str | None:
    """``None`` when the native step can run, else why not (:func:`ppokit.kernels.why_not`:
    the extension is not built, or ``PPOKIT_NATIVE=0``)."""
    return kernels.why_not("step")


def _offset(t: torch.Tensor, base: torch.Tensor) -> int:
    d = t.data_ptr() - base.data_ptr()
    if d % 4 or not t.is_contiguous():
        raise ValueError("native step: a parameter is not a contiguous view of the flat "
                         "buffer")
    return d // 4


class NativeStep:
    """One minibatch step of the native kernel for ``policy`` (whose parameters are the
    views of ``flat``) and ppokit's flat Adam ``optimizer``. ``opts`` are the fused step's
    kernel options (:class:`ppokit.engine.fused.FusedStep`). Calling it returns the
    statistics (ordered as :data:`ppokit.engine.fused.KERNEL_STAT_KEYS`) or ``None`` when
    the KL limit stopped the step; the gradient, the parameters and Adam's state are
    updated in place. ``parallel``: True runs the critic's branch on the extension's worker
    thread beside the actor's, False before it on the calling thread, ``"auto"`` beside it
    while the worker keeps up and before it while it does not (another process holding the
    second core: ``ppo_step.c`` says how it is told); the same bits every way."""

    def __init__(self, policy: nn.Module, actor: list[nn.Linear], critic: list[nn.Linear],
                 flat, optimizer, opts: dict):
        if not available():
            raise RuntimeError(f"native step: {why_not()}")
        base = flat.data
        covered = sum(m.weight.numel() + m.bias.numel() for m in actor + critic)
        log_std = getattr(policy, "log_std", None) if not opts["categorical"] else None
        if log_std is not None:
            covered += log_std.numel()
        if covered != sum(p.numel() for p in flat.params):
            raise ValueError("native step: the policy has parameters outside its two MLPs")
        offs = []
        for m in actor + critic:
            offs += [_offset(m.weight, base), _offset(m.bias, base)]
        a_dims = [actor[0].in_features] + [m.out_features for m in actor]
        c_dims = [critic[0].in_features] + [m.out_features for m in critic]
        if c_dims[-1] != 1 or a_dims[0] != c_dims[0]:
            raise ValueError("native step: the critic must map the actor's input to one value")
        for seq in (actor, critic):
            for m, n in zip(seq, seq[1:]):
                if m.out_features != n.in_features:
                    raise ValueError("native step: layer widths do not chain")
        self.plan = np.array(
            [int(opts["categorical"]), int(opts["relu_a"]), int(opts["relu_c"]), len(actor),
             len(critic), _offset(log_std, base) if log_std is not None else -1, base.numel(),
             *a_dims, *c_dims, *offs], dtype=np.int64)
        self.action_dim = a_dims[-1]
        self.categorical = bool(opts["categorical"])
        self.hp = np.array([
            0.2, float(opts["use_clip"]), float(opts["norm_adv"]), -1.0, opts["vf_coef"],
            opts["clip_vf"], float(opts["clip_max"]), opts["ent_coef"],
            opts["max_grad_norm"], 0.0, 0.9, 0.999, 1e-8, 1.0, 0.0], dtype=np.float64)
        self._plan_p = self.plan.ctypes.data
        self._hp_p = self.hp.ctypes.data
        self.flat, self.opt = flat, optimizer
        self.in_dim = a_dims[0]
        self.scratch = torch.empty(0)
        self._rows = -1

    def _scratch(self, rows: int) -> int:
        if rows > self._rows:
            self.scratch = torch.empty(kernels.scratch_floats(self._plan_p, rows))
            self._rows = rows
        return self.scratch.data_ptr()

    def __call__(self, x: torch.Tensor, actions: torch.Tensor, logp_old: torch.Tensor,
                 adv: torch.Tensor, ret: torch.Tensor, v_old: torch.Tensor,
                 clip: float, kl_limit: float,
                 parallel: bool | str = False) -> torch.Tensor | None:
        m = x.shape[0]
        if x.shape != (m, self.in_dim):
            raise ValueError(f"native step: observations of shape {tuple(x.shape)}, "
                             f"expected ({m}, {self.in_dim})")
        want_a = (m,) if self.categorical else (m, self.action_dim)
        a_dtype = torch.int64 if self.categorical else torch.float32
        rows = [x.contiguous(), actions.to(a_dtype).contiguous()]
        for t in (logp_old, adv, ret, v_old):
            if t.shape != (m,):
                raise ValueError(f"native step: a per-sample input of shape {tuple(t.shape)}, "
                                 f"expected ({m},)")
            rows.append(t.contiguous())
        if rows[1].shape != want_a:
            raise ValueError(f"native step: actions of shape {tuple(actions.shape)}, "
                             f"expected {want_a}")
        for t in rows[:1] + rows[2:]:
            if t.dtype != torch.float32 or t.device.type != "cpu":
                raise ValueError(f"native step: inputs must be float32 on the CPU, got "
                                 f"{t.dtype} on {t.device}")
        g = self.opt.param_groups[0]
        hp = self.hp
        hp[0] = clip
        hp[3] = kl_limit
        hp[9] = g["lr"]
        hp[10], hp[11] = g["betas"]
        hp[12] = g["eps"]
        hp[14] = 2.0 if parallel == "auto" else (1.0 if parallel else 0.0)
        opt, flat = self.opt, self.flat
        stats = torch.empty(10)
        stopped = kernels.ppo_step(
            self._plan_p, flat.data.data_ptr(), flat.grad.data_ptr(),
            opt.exp_avg.data_ptr(), opt.exp_avg_sq.data_ptr(), opt.step_t.data_ptr(),
            *[t.data_ptr() for t in rows], m, self._hp_p, self._scratch(m),
            stats.data_ptr())
        return None if stopped else stats

