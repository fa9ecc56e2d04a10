"""Discounted returns and reward-to-go (docs/theory.md#policy-gradient-and-returns).

Time-major layout ``[T]`` or ``[T, N]``. ``episode_end[t] = 1`` means the episode ended
after step t (terminated or truncated): the sum does not cross it.
"""

from __future__ import annotations

import torch

from .validation import (
    Tensor,
    as_tensor,
    check_binary,
    check_ndim,
    check_nonempty,
    check_same_shape,
    check_unit_interval,
    float_inputs,
)

__all__ = ["reward_to_go_advantages", "discounted_return", "reward_to_go", "discount_weights"]


def discounted_return(rewards, gamma: float) -> Tensor:
    """``R(τ) = Σ_t γ^t r_t`` of one trajectory. ``rewards``: ``[T]`` → scalar; ``[T, N]`` →
    ``[N]`` (one trajectory per column). docs/theory.md#policy-gradient-and-returns."""
    gamma = check_unit_interval(gamma, "gamma")
    r = float_inputs({"rewards": rewards}, finite=("rewards",))["rewards"]
    check_nonempty(r, "rewards")
    check_ndim(r, "rewards", (1, 2), "[T] or [T, N]")
    w = gamma ** torch.arange(r.shape[0], dtype=torch.float64, device=r.device)
    w = w.to(r.dtype)
    return (w if r.ndim == 1 else w[:, None]).mul(r).sum(0)


def _time_inputs(rewards, episode_end):
    r = float_inputs({"rewards": rewards}, finite=("rewards",))["rewards"]
    check_nonempty(r, "rewards")
    check_ndim(r, "rewards", (1, 2), "[T] or [T, N]")
    if episode_end is None:
        end = torch.zeros_like(r, dtype=torch.bool)
    else:
        end = as_tensor(episode_end, "episode_end").to(r.device)
        check_same_shape(r, "rewards", episode_end=end)
        end = check_binary(end, "episode_end")
    return r, end


def reward_to_go(rewards, gamma: float, episode_end=None, *, bootstrap=None) -> Tensor:
    """``G_t = Σ_{l ≥ 0} γ^l r_{t+l}`` within the episode (docs/theory.md#reward-to-go).

    Args:
        rewards: ``[T]`` or ``[T, N]``.
        gamma: discount in [0, 1].
        episode_end: optional, same shape, 0/1: the sum stops after a 1.
        bootstrap: optional value added (discounted) after the last step of the window when
            the episode is still running there: ``[]`` for ``[T]``, ``[N]`` for ``[T, N]``.
            Default: 0 (the window is a whole episode).

    Returns: ``[T]`` or ``[T, N]`` reward-to-go.
    """
    gamma = check_unit_interval(gamma, "gamma")
    r, end = _time_inputs(rewards, episode_end)
    carry = torch.zeros_like(r[0])
    if bootstrap is not None:
        b = as_tensor(bootstrap, "bootstrap", like=r)
        if tuple(b.shape) != tuple(carry.shape):
            raise ValueError(f"bootstrap: expected shape {tuple(carry.shape)}, got "
                             f"{tuple(b.shape)}")
        carry = b.clone()
    out = torch.empty_like(r)
    keep = (~end).to(r.dtype)
    for t in range(r.shape[0] - 1, -1, -1):
        carry = r[t] + gamma * keep[t] * carry
        out[t] = carry
    return out


def discount_weights(gamma: float, episode_end=None, *, length: int | None = None,
                     start_step=None) -> Tensor:
    """The exact finite-horizon weights ``γ^t`` (docs/theory.md#discount-weights).

    ``∇J = E[Σ_t γ^t G_t ∇ log π(a_t|s_t)]``: the reward-to-go restarts its discount at
    each step, so the step's own ``γ^t`` (t counted from the episode start) must multiply
    it. Common PPO code drops this factor (a uniform average over steps); ppokit makes it
    available explicitly.

    Args:
        gamma: discount in [0, 1].
        episode_end: ``[T]`` or ``[T, N]`` 0/1; the step counter restarts after each 1.
        length: T, when ``episode_end`` is None (then one episode starting at t = 0).
        start_step: optional ``[]``/``[N]`` step index of the first row within its episode
            (for windows that begin mid-episode). Default 0.

    Returns: ``[T]`` or ``[T, N]`` float weights.
    """
    gamma = check_unit_interval(gamma, "gamma")
    if episode_end is None:
        if length is None or length < 1:
            raise ValueError(f"length: expected an integer >= 1 when episode_end is None, "
                             f"got {length!r}")
        end = torch.zeros(length, dtype=torch.bool)
    else:
        end = check_binary(as_tensor(episode_end, "episode_end"), "episode_end")
        check_nonempty(end, "episode_end")
        check_ndim(end, "episode_end", (1, 2), "[T] or [T, N]")
    step = torch.zeros(end.shape[1:], dtype=torch.float64)
    if start_step is not None:
        s = as_tensor(start_step, "start_step", dtype=torch.float64)
        if tuple(s.shape) != tuple(step.shape):
            raise ValueError(f"start_step: expected shape {tuple(step.shape)}, got "
                             f"{tuple(s.shape)}")
        step = s.clone()
    steps = torch.empty(end.shape, dtype=torch.float64)
    for t in range(end.shape[0]):
        steps[t] = step
        step = torch.where(end[t], torch.zeros_like(step), step + 1)
    return torch.pow(torch.tensor(gamma, dtype=torch.float64), steps).to(torch.float32)


def reward_to_go_advantages(rewards, values, next_values, terminated, episode_end,
                            gamma: float, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """REINFORCE's advantage with the same signature as :func:`ppokit.core.gae`:
    ``(returns − values, returns)`` where ``returns`` is the discounted return within the
    episode (:func:`reward_to_go`). A truncation adds ``γ V(final state)`` to its reward and
    a window that ends mid-episode bootstraps from ``next_values[T−1]`` — both zero when no
    critic is used (``values = next_values = 0``), giving the plain Monte-Carlo return.
    ``lam`` is ignored. Shapes: ``[T]`` or ``[T, N]``; returns two tensors of that shape.
    """
    episode_end = torch.as_tensor(episode_end, dtype=torch.bool)
    terminated = torch.as_tensor(terminated, dtype=torch.bool)
    rewards = torch.as_tensor(rewards)
    next_values = torch.as_tensor(next_values, dtype=rewards.dtype)
    trunc = (episode_end & ~terminated).to(rewards.dtype)
    r = rewards + gamma * trunc * next_values
    boot = next_values[-1] * (~episode_end[-1]).to(r.dtype)
    ret = reward_to_go(r, gamma, episode_end, bootstrap=boot)
    return ret - torch.as_tensor(values, dtype=ret.dtype), ret
