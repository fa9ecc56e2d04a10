"""A user's own recipe parts, outside ppokit's source: one policy loss and one advantage
estimator, each registered by importing this module (``--import _toy_recipe``). Each
counts its calls so that tests can see it was the one used."""

import torch

import ppokit
from ppokit.core import PolicyLoss, aggregate

CALLS = {"loss": 0, "estimator": 0}


@ppokit.register_policy_loss("toy_tanh")
def toy_tanh(spec, logp, logp_old, advantages, mask=None, **agg):
    """-tanh-bounded ratio times the advantage: the surrogate's slope fades smoothly
    (instead of stopping) as the ratio leaves 1 ± clip_range."""
    CALLS["loss"] += 1
    ratio = torch.exp(logp - logp_old)
    eps = spec.clip_range
    bounded = 1.0 + eps * torch.tanh((ratio - 1.0) / eps)
    per = -bounded * advantages
    if mask is not None:
        per = torch.where(mask, per, torch.zeros((), dtype=per.dtype))
    return PolicyLoss(loss=aggregate(per, mask, **agg), per_sample=per, ratio=ratio)


@ppokit.register_advantage_estimator("toy_mc")
def toy_mc(steps, spec):
    """The discounted return within each episode minus the recorded value, by a plain
    backward loop (a bootstrap from next_values where an episode is cut, not ended)."""
    CALLS["estimator"] += 1
    r, nv = steps.rewards.double(), steps.next_values.double()
    term, end = steps.terminated.bool(), steps.episode_end.bool()
    ret = torch.zeros_like(r)
    carry = torch.where(end[-1] & term[-1], torch.zeros_like(r[-1]), nv[-1])
    for t in range(r.shape[0] - 1, -1, -1):
        if t < r.shape[0] - 1:
            carry = torch.where(end[t], torch.where(term[t], 0.0, nv[t]), carry)
        carry = r[t] + spec.gamma * carry
        ret[t] = carry
    ret = ret.to(steps.rewards.dtype)
    return ret - steps.values, ret
