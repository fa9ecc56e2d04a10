"""Pre-flight checks on an environment policy and a surrogate loss.

Each check is a *necessary* local condition, not proof of a correct trainer: a setup that
fails one is certainly wired wrong; one that passes them all can still be wrong elsewhere.

* ``ratio-identity``: the log-probs stored at collection time (``act``) and those the update
  computes (``evaluate`` on an identical copy, in training mode) agree, so every ratio is 1
  and approx KL is 0 before the first step — to the rounding of the two passes, which run
  other batch sizes (:func:`ratio_tolerance`).
* ``zero-advantage-gradient``: with every advantage 0 the pure policy surrogate (no entropy,
  KL or critic term) gives exactly zero gradient on every parameter.
* ``flipped-advantage-direction``: at ratio 1 (no clipping active) a small step on the
  surrogate raises the log-probs of actions with positive advantage and lowers those with
  negative advantage; flipping every advantage's sign reverses that.
* ``surrogate-finite-difference``: in float64, the surrogate's autograd gradient agrees with
  central finite differences, both with respect to the per-sample log-probs and along random
  directions in parameter space (through ``evaluate``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ppokit.core import clipped_surrogate_loss
from ppokit.errors import UsageError

from .result import CheckResult

Tensor = torch.Tensor
Surrogate = Callable[..., Tensor]

__all__ = ["Batch", "ppo_surrogate", "collect_batch", "check_ratio_identity",
           "check_zero_advantage", "check_flipped_direction", "check_finite_difference",
           "ratio_tolerance", "RATIO_TOL", "RATIO_TOL_CAP", "KL_TOL", "FD_TOL"]

RATIO_TOL = 1e-6      # the tightest a policy is held to (float64, small MLPs)
RATIO_TOL_CAP = 0.05  # above it a dtype cannot tell rounding from a bug (dropout: 0.1+)
KL_TOL = 1e-9
FD_TOL = 1e-5


def ppo_surrogate(clip_eps: float = 0.2) -> Surrogate:
    """ppokit's PPO-Clip policy loss ``(logp, logp_old, advantages, mask=None) -> loss``."""

    def surrogate(logp, logp_old, advantages, mask=None):
        return clipped_surrogate_loss(logp, logp_old, advantages, mask, clip_eps=clip_eps).loss

    return surrogate


@dataclass
class Batch:
    """Observations, the actions taken and their log-probs as the collector recorded them."""

    obs: Tensor
    actions: Tensor
    logp_old: Tensor

    def __len__(self) -> int:
        return int(self.obs.shape[0])


def collect_batch(policy, env_id: str = "CartPole-v1", n: int = 256, seed: int = 0,
                  num_envs: int = 8, obs_transform: Callable | None = None,
                  env_kwargs: dict | None = None, agent_id: bool = False,
                  agent_groups: str = "shared") -> Batch:
    """Step ``env_id`` (built with ``env_kwargs``) with ``policy.act`` (under inference mode,
    as a collector does) until ``n`` transitions are recorded. ``obs_transform`` maps raw
    observations to what the policy sees (e.g. a trained run's observation normaliser).
    A multi-agent environment gives one row per agent (``agent_id``, ``agent_groups``: the
    run's settings; groups of different action counts, whose padded actions are masked,
    are refused: these checks apply no action masks)."""
    from ppokit.envs import make_vec
    from ppokit.envs.multiagent import agents_of
    from ppokit.policies.actions import env_actions

    k = agents_of(env_id, env_kwargs)  # (rows come in copies x agents)
    num_envs = -(-num_envs // k) * k
    # ppokit's own vector env: a module:Id only if the user named it (ppokit.envs.source),
    # an Atari game with its preprocessing (the observations the policy trains on)
    env = make_vec(env_id, num_envs, env_kwargs=env_kwargs, agent_id=agent_id,
                   agent_groups=agent_groups)
    gen = torch.Generator().manual_seed(seed)
    try:
        raw, info = env.reset(seed=seed)
        if agent_groups != "shared" and "action_mask" in info:
            raise UsageError(f"agent_groups: {env_id}'s groups have different numbers of "
                             "actions (the extra ones masked out) or masks of their own; "
                             "ppokit check's policy checks apply no action masks")
        obs_l, act_l, logp_l = [], [], []
        while sum(len(o) for o in obs_l) < n:
            o = np.asarray(raw, dtype=np.float32)
            if obs_transform is not None:
                o = np.asarray(obs_transform(o), dtype=np.float32)
            ot = torch.as_tensor(o)
            with torch.inference_mode():
                a, logp, _ = policy.act(ot, generator=gen)
            obs_l.append(ot.clone())
            act_l.append(a.clone())
            logp_l.append(logp.clone())
            raw, *_ = env.step(env_actions(a.numpy(), env.single_action_space))
    finally:
        env.close()
    return Batch(torch.cat(obs_l)[:n], torch.cat(act_l)[:n], torch.cat(logp_l)[:n])


def _params(module) -> list[Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def ratio_tolerance(policy) -> float:
    """How far ``exp(logp_new − logp_old)`` may stray from 1 between collection (a step's
    rows) and the update's pass (the whole batch) from rounding alone: the two passes sum
    the same products in different orders (other batch sizes, other kernels). A sum of
    ``n`` rounded terms moves by about ``eps·√n`` of its size, so ``tol = eps · Σ √fan_in``
    over the policy's linear and convolution layers, ``eps`` the machine epsilon of its
    parameters' dtype, at least :data:`RATIO_TOL` and at most :data:`RATIO_TOL_CAP` (the
    token checks' rule, :func:`ppokit.checks.token_checks.ratio_tolerance`, by layer).
    CartPole's 64×64 MLP actor-critic in float32: 1.2e-7 · 2 · (2 + 8 + 8) = 4.3e-6; the
    Nature CNN's trunk alone 1.2e-7 · (16 + 22.6 + 24 + 56) = 1.4e-5, against 1.1e-6 seen
    on Breakout after two iterations; dropout left on moves ratios by 0.1 and more."""
    total = 0.0
    for m in policy.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)):
            total += (m.weight[0].numel()) ** 0.5  # one output's fan-in
    p = next(iter(policy.parameters()), None)
    dtype = p.dtype if p is not None and p.dtype.is_floating_point else torch.float32
    return float(min(max(torch.finfo(dtype).eps * total, RATIO_TOL), RATIO_TOL_CAP))


def check_ratio_identity(policy, batch: Batch) -> CheckResult:
    tol = ratio_tolerance(policy)
    new = copy.deepcopy(policy)
    new.train()
    with torch.no_grad():
        logp_new = new.evaluate(batch.obs, batch.actions)[0]
    lr = (logp_new.double() - batch.logp_old.double())
    dev = float((torch.exp(lr) - 1).abs().max())
    k3 = float((torch.expm1(lr) - lr).mean())
    k1 = float((-lr).mean())
    ok = dev <= tol and k3 <= KL_TOL and abs(k1) <= tol
    return CheckResult(
        "ratio-identity", ok,
        f"max|ρ−1| {_fmt(dev)}, approx_kl k3 {_fmt(k3)}, k1 {_fmt(k1)} ({len(batch)} samples)",
        f"max|ρ−1| ≤ {tol:.2g}, k3 ≤ {KL_TOL:g}",
        "" if ok else "log-probs recorded at collection (act) differ from those the update "
        "computes (evaluate) for the same parameters: look for dropout or other train-mode "
        "behaviour, a different observation preprocessing, or log-probs of a transformed "
        "(e.g. clipped) action.",
        {"max_ratio_dev": dev, "approx_kl": k3, "approx_kl_k1": k1})


def check_zero_advantage(policy, batch: Batch, surrogate: Surrogate, seed: int = 0
                         ) -> CheckResult:
    gen = torch.Generator().manual_seed(seed)
    worst = 0.0
    zeros = torch.zeros_like(batch.logp_old)
    # at ratio 1 and with ratios spread around 1 (some outside the clip range)
    olds = (batch.logp_old, batch.logp_old + 0.3 * torch.randn(
        batch.logp_old.shape, generator=gen, dtype=batch.logp_old.dtype))
    params = _params(policy)
    for old in olds:
        logp = policy.evaluate(batch.obs, batch.actions)[0]
        loss = surrogate(logp, old, zeros)
        if loss.requires_grad:
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            for g in grads:
                if g is not None:
                    worst = max(worst, float(g.abs().max()))
    ok = worst == 0.0
    return CheckResult(
        "zero-advantage-gradient", ok, f"max|∂L/∂θ| {worst:.3g}", "exactly 0",
        "" if ok else "with every advantage zero the policy surrogate still pushes the "
        "parameters: something other than advantage-weighted ratios is in it (an entropy, KL "
        "or value term, or advantages re-normalised inside the loss).",
        {"max_grad": worst})


def _step_and_measure(policy, batch: Batch, surrogate: Surrogate, adv: Tensor,
                      ref: Tensor, step: float) -> float:
    """Take a normalised gradient step of size ``step`` on ``surrogate`` with advantages
    ``adv`` at ratio 1; return the mean of ``ref · Δlogp`` over the chosen actions."""
    p = copy.deepcopy(policy)
    p.train()
    with torch.no_grad():
        logp_old = p.evaluate(batch.obs, batch.actions)[0].detach()
    logp = p.evaluate(batch.obs, batch.actions)[0]
    loss = surrogate(logp, logp_old, adv)
    params = _params(p)
    grads = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else []
    grads = [torch.zeros_like(q) if g is None else g for q, g in zip(params, grads)]
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads))) if grads else 0.0
    if norm == 0.0:
        return 0.0
    with torch.no_grad():
        for q, g in zip(params, grads):
            q -= step * g / norm
        logp_after = p.evaluate(batch.obs, batch.actions)[0]
    return float((ref.double() * (logp_after.double() - logp_old.double())).mean())


def _double(policy, batch: Batch) -> tuple[object, Batch] | None:
    try:
        p = copy.deepcopy(policy).double()
        acts = batch.actions.double() if batch.actions.is_floating_point() else batch.actions
        b = Batch(batch.obs.double(), acts, batch.logp_old.double())
        with torch.no_grad():
            p.evaluate(b.obs[:2], b.actions[:2])
        return p, b
    except (RuntimeError, TypeError, AttributeError):
        return None


def check_flipped_direction(policy, batch: Batch, surrogate: Surrogate, seed: int = 0,
                            step: float = 1e-4, float64: bool = True) -> CheckResult:
    d = _double(policy, batch) if float64 else None
    p, b = d if d is not None else (policy, batch)
    gen = torch.Generator().manual_seed(seed + 1)
    adv = torch.randn(b.logp_old.shape, generator=gen, dtype=b.logp_old.dtype)
    up = _step_and_measure(p, b, surrogate, adv, adv, step)
    down = _step_and_measure(p, b, surrogate, -adv, adv, step)
    ok = up > 0 and down < 0
    return CheckResult(
        "flipped-advantage-direction", ok,
        f"mean Â·Δlogp {up:+.3g} with Â, {down:+.3g} with −Â",
        "> 0 with Â, < 0 with −Â (ratio 1)",
        "" if ok else "a small step on the surrogate does not raise the log-probs of actions "
        "with positive advantage (and lower those with negative advantage): look for a sign "
        "error in the loss (maximising where it should minimise, or the advantage sign).",
        {"with_adv": up, "with_neg_adv": down})


def check_finite_difference(policy, batch: Batch, surrogate: Surrogate, seed: int = 0,
                            samples: int = 16, directions: int = 3, h: float = 1e-6
                            ) -> CheckResult:
    d = _double(policy, batch)
    if d is None:
        return CheckResult("surrogate-finite-difference", None, "-", f"rel. error ≤ {FD_TOL:g}",
                           "the policy cannot run in float64, so a finite-difference "
                           "comparison would measure rounding, not the gradient")
    p, b = d
    gen = torch.Generator().manual_seed(seed + 2)
    idx = torch.randperm(len(b), generator=gen)[:samples]
    obs, acts = b.obs[idx], b.actions[idx]
    with torch.no_grad():
        logp0 = p.evaluate(obs, acts)[0].detach()
    logp_old = logp0 + 0.3 * torch.randn(logp0.shape, generator=gen, dtype=logp0.dtype)
    adv = torch.randn(logp0.shape, generator=gen, dtype=logp0.dtype)
    errs: list[float] = []

    def rel(a: float, f: float) -> float:
        return abs(a - f) / max(abs(a), abs(f), 1e-6)

    # (a) with respect to the per-sample log-probs
    x = logp0.clone().requires_grad_(True)
    g = torch.autograd.grad(surrogate(x, logp_old, adv), x, allow_unused=True)[0]
    g = torch.zeros_like(x) if g is None else g
    with torch.no_grad():
        for i in range(len(x)):
            e = torch.zeros_like(x)
            e[i] = h
            fd = (float(surrogate(logp0 + e, logp_old, adv))
                  - float(surrogate(logp0 - e, logp_old, adv))) / (2 * h)
            errs.append(rel(float(g[i]), fd))
    # (b) along random directions in parameter space, through evaluate
    params = _params(p)
    logp = p.evaluate(obs, acts)[0]
    grads = torch.autograd.grad(surrogate(logp, logp_old, adv), params, allow_unused=True)
    grads = [torch.zeros_like(q) if gg is None else gg for q, gg in zip(params, grads)]
    for _ in range(directions):
        vs = [torch.randn(q.shape, generator=gen, dtype=q.dtype) for q in params]
        vnorm = float(torch.sqrt(sum((v ** 2).sum() for v in vs)))
        vs = [v / vnorm for v in vs]
        auto = float(sum((gg * v).sum() for gg, v in zip(grads, vs)))
        vals = []
        with torch.no_grad():
            for sgn in (1.0, -1.0):
                for q, v in zip(params, vs):
                    q += sgn * h * v
                vals.append(float(surrogate(p.evaluate(obs, acts)[0], logp_old, adv)))
                for q, v in zip(params, vs):
                    q -= sgn * h * v
        errs.append(rel(auto, (vals[0] - vals[1]) / (2 * h)))
    worst = max(errs)
    ok = worst <= FD_TOL
    return CheckResult(
        "surrogate-finite-difference", ok,
        f"max rel. error {worst:.2g} ({len(x)} log-prob inputs"
        + (f", {directions} parameter directions" if directions else "") + ", float64)",
        f"≤ {FD_TOL:g}",
        "" if ok else "the gradient autograd computes is not the derivative of the loss value: "
        "look for a detached or hand-written piece of the surrogate (e.g. a ratio computed "
        "outside the graph) or a custom backward.",
        {"max_rel_error": worst})
