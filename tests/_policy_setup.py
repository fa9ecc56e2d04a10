"""A policy on flat storage with ppokit's Adam, and a plain copy with torch's fused Adam:
the pair the fused and native minibatch steps are compared on (tests/test_fast_path.py,
tests/test_native_step.py)."""

import copy

import torch
from gymnasium import spaces

from ppokit.algos.optim import Adam
from ppokit.engine.flat import FlatParameters
from ppokit.policies import make_policy


def setup_policy(kind, activation, hidden, obs_dim, n_act, seed, cfg):
    """``(policy, flat, its Adam, reference copy, the copy's torch Adam)`` for a
    ``kind`` ("categorical" over ``n_act`` actions, or "gaussian" of ``n_act`` dimensions)
    MLP policy of ``hidden`` widths over ``obs_dim`` observations."""
    torch.manual_seed(seed)
    obs_space = spaces.Box(-1, 1, (obs_dim,))
    act_space = spaces.Discrete(n_act) if kind == "categorical" else \
        spaces.Box(-1, 1, (n_act,))
    pol = make_policy(obs_space, act_space, hidden=hidden, activation=activation,
                      log_std_init=-0.5)
    pol_ref = copy.deepcopy(pol)
    # the trainer's optimisers: ppokit's Adam over flat storage (the fused step) and
    # torch.optim.Adam(fused=True) on the plain copy (the reference): the same kernel
    flat = FlatParameters(pol.parameters())
    opt = Adam(pol.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps, flat=flat)
    opt_ref = torch.optim.Adam(pol_ref.parameters(), lr=cfg.learning_rate,
                               eps=cfg.optimizer_eps, fused=True)
    return pol, flat, opt, pol_ref, opt_ref


def at_a_clip_edge(policy, mb, clip, clip_range_vf, tol=1e-5):
    """Whether a ratio lies within ``tol`` of 1 ± clip (or a value within ``tol`` of its
    old value ± clip_range_vf). There the loss's gradient jumps, and two computations
    equal to float32 rounding may land on either side (a case found: a ratio 4e-9 from
    1 − clip gave grad norms 2.4e-4 apart), so such minibatches are not compared."""
    with torch.no_grad():
        logp, _, v = policy.evaluate(mb["obs"], mb["actions"])
    ratio = torch.exp(logp - mb["logp"])
    edges = [(ratio - (1 - clip)).abs(), (ratio - (1 + clip)).abs()]
    if clip_range_vf is not None:
        d = (v - mb["values"]).abs()
        edges.append((d - clip_range_vf).abs())
    return bool(torch.stack(edges).min() < tol) or _at_a_relu_kink(policy, mb["obs"], tol)


def _at_a_relu_kink(policy, obs, tol):
    """Whether a ReLU's input lies within ``tol`` (relative to its layer's inputs) of 0
    for some sample: there the unit's gradient is either on or off, and sums taken in
    another order may land on either side (a case found: a critic unit's input 1.7e-7
    from 0 made grad norms 1.857 and 1.854)."""
    x = obs.reshape(obs.shape[0], -1).float()
    with torch.no_grad():
        for trunk in (getattr(policy, "actor", None), getattr(policy, "critic", None)):
            if not isinstance(trunk, torch.nn.Sequential):
                continue
            h = before = x
            for layer in trunk:
                if isinstance(layer, torch.nn.ReLU):
                    # (a row whose layer input is all zeros gets the bias alone, the same
                    # in any order of summation: not a kink either way)
                    live = before.ne(0).any(dim=1, keepdim=True)
                    scale = h.abs().amax(dim=1, keepdim=True).clamp_min(1.0)
                    if bool(((h / scale).abs().lt(tol) & live).any()):
                        return True
                before, h = h, layer(h)
    return False
