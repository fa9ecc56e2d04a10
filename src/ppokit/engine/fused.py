"""The fused minibatch step: a backend of the update engine for ppokit's MLP actor-critic.

Why: on a small MLP the eager step (autograd + optimiser) is mostly per-call overhead — the
autograd graph, the distribution helpers, one kernel launch per tensor operation from
Python. The arithmetic is a few ``[M, 64]`` (or ``[M, 256]``) matrix products. This module
computes what :func:`ppokit.engine.eager_minibatch_step` computes as one compiled kernel
(:func:`ppokit.engine.fused_kernel._ppo_step`, in TorchScript):

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
the native step (:mod:`ppokit.engine.native`: the arithmetic above written out in C, Adam
included, one call per minibatch; 2-5x the TorchScript kernel on a 64-wide MLP, on one
core). The TorchScript kernel (:mod:`ppokit.engine.fused_kernel`) runs otherwise, and for
layers wider than :data:`~ppokit.engine.native.NATIVE_MAX_WIDTH`, where torch's matrix
products win.

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

import functools
import time
from collections.abc import Callable

import torch
from torch import nn

from ppokit.policies.mlp import MLPActorCritic
from ppokit.threads import usable_cores

from .flat import FlatParameters
from .forward import policy_forward, reference_step
from .fused_kernel import KERNEL_STAT_KEYS, kernel, python_kernel
from .native import NATIVE_MAX_WIDTH, NativeStep
from .native import why_not as native_why_not
from .update import UpdateSpec, spec_fields

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
    # a loss's own options: the kernels compute clip and vanilla, which declare none (a
    # loss with options is the user's and runs in the eager step, reading them there)
    "options": lambda v: len(v) == 0,
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
        if allowed is _ANY:
            continue
        if not (allowed(v) if callable(allowed) else v in allowed):
            return f"{name}={v}"
    if masked:
        return "action masks (the masked logits run in the eager step)"
    if getattr(policy, "recurrent", False):
        return "a recurrent policy (its sequences run in the eager step)"
    if not isinstance(policy, MLPActorCritic):
        return "the policy is not ppokit's MLP actor-critic"
    if getattr(policy, "state_dim", None) is not None:
        return "a centralised critic (its values read the global state)"
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
        if run is python_kernel and not self.parallel:
            run = functools.partial(python_kernel, parallel=False)
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
