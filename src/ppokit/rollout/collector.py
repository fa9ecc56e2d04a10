"""Collecting rollouts from a Gymnasium vector env, correct in both auto-reset modes.

Where truncation is bootstrapped (the one place)
-------------------------------------------------
For transition ``t`` the collector records ``next_values[t] = V(s_{t+1})`` of the *real*
next state:

* normally that is the value the policy computes at step ``t + 1`` (or, for the last row,
  of the observation left over after the window), so no extra forward pass is needed;
* ``SAME_STEP`` mode: when env ``i`` ended at step ``t`` the returned observation is
  already the reset one, so on a *truncation* ``next_values[t, i]`` is replaced by
  V(``info["final_obs"][i]``). A termination needs no value (the TD target has none);
* ``NEXT_STEP`` mode: the observation returned at an episode end *is* the final one, so
  ``values[t + 1]`` is right; the following step is a dummy (the env ignores the action,
  returns the reset observation and reward 0). That row is stored with ``valid = False``,
  ``terminated = episode_end = True`` and reward 0, so it neither carries into GAE nor is
  ever trained on, and it counts toward no episode.

``ppokit.core.gae`` then bootstraps truncations from ``next_values`` and stops the carry at
``episode_end`` (two masks). Episode returns and lengths are measured on raw rewards.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from ppokit.envs.normalize import ObsNormalizer, RewardScaler
from ppokit.envs.vec import autoreset_mode_of

from .buffer import Rollout

__all__ = ["Collector"]


class Collector:
    """Steps ``env`` with ``policy`` and returns :class:`Rollout` windows of ``n_steps``.

    Args:
        env: a Gymnasium ``VectorEnv`` in either auto-reset mode.
        policy: a :class:`ppokit.policies.Policy`.
        generator: the torch generator used for action sampling.
        obs_normalizer / reward_scaler: optional running normalisers (updated while
            collecting).
        use_critic: when False the recorded values are 0 (REINFORCE without baseline).
    """

    def __init__(self, env: VectorEnv, policy, *, generator: torch.Generator | None = None,
                 obs_normalizer: ObsNormalizer | None = None,
                 reward_scaler: RewardScaler | None = None, use_critic: bool = True):
        self.env = env
        self.policy = policy
        self.generator = generator
        self.obs_norm = obs_normalizer
        self.reward_scaler = reward_scaler
        self.use_critic = use_critic
        self.num_envs = env.num_envs
        self.mode = autoreset_mode_of(env)
        if self.mode not in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
            raise ValueError(f"autoreset mode {self.mode} is not supported "
                             "(same_step or next_step)")
        self.space = env.single_action_space
        self.box = isinstance(self.space, spaces.Box)
        if self.box:
            self.low = self.space.low.astype(np.float32)
            self.high = self.space.high.astype(np.float32)
        self.obs: torch.Tensor | None = None  # current (normalised) observation [N, ...]
        self.pending = np.zeros(self.num_envs, bool)  # NEXT_STEP: next step is a dummy
        self.ep_return = np.zeros(self.num_envs, np.float64)
        self.ep_length = np.zeros(self.num_envs, np.int64)
        self.finished: list[tuple[float, int]] = []

    # ------------------------------------------------------------------ observations
    def _prep_obs(self, raw: np.ndarray, update: bool) -> np.ndarray:
        raw = np.asarray(raw)
        if self.obs_norm is not None:
            return self.obs_norm(raw, update=update)
        return raw.astype(np.float32, copy=False)

    def reset(self, seed: int | None = None) -> None:
        raw, _ = self.env.reset(seed=seed)
        self.obs = torch.from_numpy(np.array(self._prep_obs(raw, update=True)))
        self.pending[:] = False
        self.ep_return[:] = 0.0
        self.ep_length[:] = 0

    def _to_env(self, action: torch.Tensor) -> np.ndarray:
        a = action.numpy()
        if self.box:
            a = np.clip(a.reshape(self.num_envs, *self.space.shape), self.low, self.high)
        return a

    def _values(self, obs: torch.Tensor) -> torch.Tensor:
        if not self.use_critic:
            return torch.zeros(obs.shape[0])
        return self.policy.value(obs)

    # ------------------------------------------------------------------ collection
    def collect(self, n_steps: int) -> Rollout:
        """Run ``n_steps`` vector steps and return the (not yet finalised) rollout."""
        if self.obs is None:
            raise RuntimeError("reset() the collector first")
        n = self.num_envs
        obs_buf = torch.empty((n_steps, *self.obs.shape), dtype=self.obs.dtype)
        logp_buf = torch.empty((n_steps, n))
        val_buf = torch.empty((n_steps + 1, n))
        act_buf = None
        rew = np.zeros((n_steps, n), np.float32)
        term = np.zeros((n_steps, n), bool)
        end = np.zeros((n_steps, n), bool)
        valid = np.ones((n_steps, n), bool)
        fixes: list[tuple[int, np.ndarray, torch.Tensor]] = []
        next_step = self.mode == AutoresetMode.NEXT_STEP
        scaler = self.reward_scaler
        with torch.inference_mode():
            for t in range(n_steps):
                obs_buf[t] = self.obs
                action, logp, value = self.policy.act(self.obs, self.generator)
                if act_buf is None:
                    act_buf = torch.empty((n_steps, *action.shape), dtype=action.dtype)
                act_buf[t] = action
                logp_buf[t] = logp
                val_buf[t] = value if self.use_critic else 0.0
                raw, r, te, tr, info = self.env.step(self._to_env(action))
                done = te | tr
                if next_step:
                    ok = ~self.pending
                    valid[t] = ok
                    te = te | self.pending
                    done = done | self.pending
                    r = np.where(ok, r, 0.0)
                    self.pending = (te | tr) & ok
                else:
                    ok = None
                term[t] = te
                end[t] = done
                self.ep_return += r
                if ok is None:
                    self.ep_length += 1
                else:
                    self.ep_length += ok
                real_end = done if ok is None else done & ok
                if real_end.any():
                    for i in np.flatnonzero(real_end):
                        self.finished.append((float(self.ep_return[i]), int(self.ep_length[i])))
                    self.ep_return[real_end] = 0.0
                    self.ep_length[real_end] = 0
                rew[t] = r if scaler is None else scaler(r, real_end, ok)
                if not next_step and tr.any():
                    trunc = tr & ~te
                    if trunc.any():
                        idx = np.flatnonzero(trunc)
                        fin = np.stack([np.asarray(info["final_obs"][i]) for i in idx])
                        fin_t = torch.from_numpy(self._prep_obs(fin, update=False))
                        fixes.append((t, idx, self._values(fin_t)))
                self.obs = torch.from_numpy(np.array(self._prep_obs(raw, update=True)))
            val_buf[n_steps] = self._values(self.obs)
        next_values = val_buf[1:].clone()
        for t, idx, v in fixes:
            next_values[t, torch.from_numpy(idx)] = v
        return Rollout(obs=obs_buf, actions=act_buf, logp=logp_buf, values=val_buf[:-1],
                       rewards=torch.from_numpy(rew), terminated=torch.from_numpy(term),
                       episode_end=torch.from_numpy(end), next_values=next_values,
                       valid=torch.from_numpy(valid))

    def pop_finished(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        return {"obs": self.obs.numpy().copy(), "pending": self.pending.copy(),
                "ep_return": self.ep_return.copy(), "ep_length": self.ep_length.copy()}

    def load_state_dict(self, d: dict) -> None:
        self.obs = torch.from_numpy(np.array(d["obs"]))
        self.pending = np.asarray(d["pending"], bool).copy()
        self.ep_return = np.asarray(d["ep_return"], np.float64).copy()
        self.ep_length = np.asarray(d["ep_length"], np.int64).copy()
