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

Two ways to choose actions
--------------------------
With ``fast=True`` and ppokit's MLP actor-critic (categorical or Gaussian head) the actor
runs in NumPy on each step's few rows (:class:`ppokit.policies.NumpySampler`), from noise
drawn for the whole window at once from ``generator``; the log-probabilities of the taken
actions and all values (including those of truncated episodes' final observations) are
then computed in one batched torch pass over the window, with the parameters that chose
the actions. Otherwise each step calls ``policy.act`` (any :class:`ppokit.policies.Policy`),
the reference path. Both record the same quantities.

Action masks
------------
With a ``mask_source`` (:class:`ppokit.envs.masks.MaskSource`: the env gives masks in its
observation, an ``action_masks()`` method or its infos) the mask of each observation is
read when the observation arrives, passed to ``policy.act`` and stored with the step
(``Rollout.action_masks``), so that the update scores each action under the mask it was
sampled under. Masked steps always take the ``policy.act`` path (the NumPy actor has no
mask). The mask of the current observation is part of :meth:`Collector.state_dict`.

Centralised critic
------------------
With a policy whose critic reads a global state (``policy.state_dim``; the env gives the
state in each info as ``info["ppokit_state"]``, :mod:`ppokit.envs.multiagent`) the state
of each observation is read when the observation arrives and stored with the step
(``Rollout.states``); the values — the bootstrap at an episode's end and after the window
included — are the critic's on the states, the actions the actor's on the observations.
The current state is part of :meth:`Collector.state_dict`. NEXT_STEP mode only (the
state returned at an episode's end is its final one).

``ppokit.core.gae`` then bootstraps truncations from ``next_values`` and stops the carry at
``episode_end`` (two masks). Episode returns and lengths are measured on raw rewards.

Games instead of episodes
-------------------------
A vector env whose ``game_scores`` attribute is true (the Atari games of
:mod:`ppokit.envs.atari`) reports, in the info of the step where a game really ends, its
score over all lives with unclipped rewards (``game_score``) and its length
(``game_length``). The collector's finished list then holds those games instead of its
training episodes (one life each, clipped rewards), so the return ppokit reports is the
game's score.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from ppokit.envs.multiagent import STATE_KEY
from ppokit.envs.normalize import ObsNormalizer, RewardScaler
from ppokit.envs.vec import autoreset_mode_of
from ppokit.policies.actions import ActionConverter
from ppokit.policies.encoders import ImageCNN, frozen_weights
from ppokit.policies.mlp import NumpySampler

from .buffer import Rollout

__all__ = ["Collector", "finished_games", "idle_rows"]


def finished_games(info: dict | None, ended: np.ndarray) -> list[tuple[float, int]]:
    """``(game_score, game_length)`` of the envs in ``ended`` whose step info reports a
    finished game: in ``info["final_info"]`` (SAME_STEP: the step's own info, since the
    returned one is the reset's) or in ``info`` itself (NEXT_STEP)."""
    if not info:
        return []
    src = info.get("final_info", info) if "game_score" not in info else info
    if "game_score" not in src:
        return []
    score, length = src["game_score"], src["game_length"]
    mask = src.get("_game_score", np.ones(len(score), bool))
    return [(float(score[i]), int(length[i])) for i in np.flatnonzero(ended)
            if i < len(mask) and mask[i]]


def idle_rows(info: dict | None) -> np.ndarray | None:
    """The rows a step's ``info`` marks as ignored (:data:`ppokit.envs.multiagent.IDLE_KEY`),
    ``None`` when it marks none."""
    return None if not info else info.get("ppokit_idle")


class Collector:
    """Steps ``env`` with ``policy`` and returns :class:`Rollout` windows of ``n_steps``.

    Args:
        env: a Gymnasium ``VectorEnv`` in either auto-reset mode.
        policy: a :class:`ppokit.policies.Policy`.
        generator: the torch generator used for action sampling.
        obs_normalizer / reward_scaler: optional running normalisers (updated while
            collecting).
        use_critic: when False the recorded values are 0 (REINFORCE without baseline).
        fast: choose actions with the NumPy actor where the policy allows it (see the
            module documentation); ``False`` always calls ``policy.act``.
    """

    def __init__(self, env: VectorEnv, policy, *, generator: torch.Generator | None = None,
                 obs_normalizer: ObsNormalizer | None = None,
                 reward_scaler: RewardScaler | None = None, use_critic: bool = True,
                 fast: bool = False, mask_source=None):
        self.env = env
        self.mask_source = mask_source
        self.masks: np.ndarray | None = None  # [N, W] bool: the current observation's
        self.policy = policy
        self.generator = generator
        self.obs_norm = obs_normalizer
        self.reward_scaler = reward_scaler
        self.use_critic = use_critic
        self.fast = fast
        self._sampler: NumpySampler | None = None
        self.num_envs = env.num_envs
        self.mode = autoreset_mode_of(env)
        if self.mode not in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
            raise ValueError(f"autoreset mode {self.mode} is not supported "
                             "(same_step or next_step)")
        self.space = env.single_action_space
        self.box = isinstance(self.space, spaces.Box)
        # the policy's actions (stored) -> the env's (start offsets, Box clipping, dtype)
        self.to_env = ActionConverter(self.space)
        # fast: uint8 pixels are stored as they come (4x less memory to write and gather);
        # the policy's image encoder scales them itself. Otherwise float32 (the reference)
        self.keep_uint8 = (fast and obs_normalizer is None
                           and getattr(policy, "encoder", None) is not None)
        # channel-first uint8 pixels for a convolutional trunk are kept channels-last in
        # memory (the layout its convolutions compute in): converted once per step here,
        # so the update's minibatches need no conversion (pixels_nhwc)
        enc = getattr(policy, "encoder", None)
        shape = getattr(env.single_observation_space, "shape", None) or ()
        self.pixels_nhwc = (self.keep_uint8 and isinstance(enc, ImageCNN)
                            and not enc.channels_last and len(shape) == 3
                            and env.single_observation_space.dtype == np.uint8)
        self.obs: torch.Tensor | None = None  # current (normalised) observation [N, ...]
        self.pending = np.zeros(self.num_envs, bool)  # NEXT_STEP: next step is a dummy
        self.ep_return = np.zeros(self.num_envs, np.float64)
        self.ep_length = np.zeros(self.num_envs, np.int64)
        self.finished: list[tuple[float, int]] = []
        # finished games (score, length) from the envs' infos instead of episodes
        self.games = bool(getattr(env, "game_scores", False))
        # a centralised critic: the global state of the current observation [N, S]
        self.central = use_critic and getattr(policy, "state_dim", None) is not None
        self.global_state: np.ndarray | None = None
        if self.central and self.mode != AutoresetMode.NEXT_STEP:
            raise ValueError("centralised critic: the environment must run in next_step "
                             "auto-reset mode (its final state comes with the episode end)")

    # ------------------------------------------------------------------ observations
    def _prep_obs(self, raw: np.ndarray, update: bool) -> np.ndarray:
        raw = np.asarray(raw)
        if self.obs_norm is not None:
            return self.obs_norm(raw, update=update)
        if self.keep_uint8 and raw.dtype == np.uint8:
            if self.pixels_nhwc and raw.ndim == 4:
                # [N, C, H, W] values in N, H, W, C memory order (always a new array)
                t = torch.from_numpy(raw)
                return torch.empty_like(t, memory_format=torch.channels_last).copy_(t).numpy()
            return raw.copy()  # always a copy: the env may reuse its buffer
        return raw.astype(np.float32, order="C")  # (a vector env may return a transpose)

    def reset(self, seed: int | None = None) -> None:
        raw, info = self.env.reset(seed=seed)
        if self.mask_source is not None:
            self.masks = self.mask_source.read(raw, info)
        self.obs = torch.from_numpy(self._prep_obs(raw, update=True))
        self.global_state = self._read_state(info)
        self.pending[:] = False
        self.ep_return[:] = 0.0
        self.ep_length[:] = 0

    def _values(self, obs: torch.Tensor, state: np.ndarray | None = None) -> torch.Tensor:
        if not self.use_critic:
            return torch.zeros(obs.shape[0])
        if self.central:
            return self.policy.value(obs, torch.from_numpy(state))
        return self.policy.value(obs)

    def _read_state(self, info: dict | None) -> np.ndarray | None:
        """The global state ``[N, S]`` of the observation ``info`` came with (a
        centralised critic), else ``None``."""
        if not self.central:
            return None
        st = None if not info else info.get(STATE_KEY)
        if st is None:
            raise ValueError("centralised critic: the environment's info holds no global "
                             f"state ({STATE_KEY!r}; ppokit.envs.multiagent with "
                             "global_state)")
        return np.array(st, np.float32).reshape(self.num_envs, -1)

    def _numpy_sampler(self) -> NumpySampler | None:
        if (not self.fast or self.mask_source is not None
                or not NumpySampler.supports(self.policy)):
            return None
        if self._sampler is None or self._sampler.policy is not self.policy:
            self._sampler = NumpySampler(self.policy)
        self._sampler.bind()  # the parameters' storage may have been replaced
        return self._sampler

    # ------------------------------------------------------------------ collection
    @staticmethod
    def _two_masks(te: np.ndarray, tr: np.ndarray, r: np.ndarray, pending: np.ndarray,
                   next_step: bool, idle: np.ndarray | None = None) -> tuple:
        """One vector step's ``(terminated, episode_end, reward, valid, pending,
        real_end)``. ``SAME_STEP``: every step is valid and an episode ends where it says.
        ``NEXT_STEP``: the step after an episode's end is the reset's dummy step (``valid``
        false, reward 0, marked terminated and ended so nothing flows across it);
        ``pending`` carries "the next step is a dummy" and ``real_end`` marks the steps
        where an episode really finished. ``idle``: rows whose step the env says it
        ignored (``info["ppokit_idle"]``: an agent that finished while the others play
        on, :mod:`ppokit.envs.multiagent`), dummy steps too. ``valid`` is ``None`` in
        ``SAME_STEP``."""
        done = te | tr
        if not next_step:
            return te, done, r, None, pending, done
        ok = ~pending if idle is None else ~(pending | idle)
        te, done = te | ~ok, done | ~ok
        pending = done & ok
        return te, done, np.where(ok, r, 0.0), ok, pending, pending

    def _count_episodes(self, r: np.ndarray, ok: np.ndarray | None,
                        real_end: np.ndarray, info: dict | None = None) -> None:
        """Add a step's raw rewards to the running episode returns and lengths (dummy
        steps do not count) and move the finished episodes to ``finished`` — or, for an
        env that reports games (``games``), the games that ended at this step."""
        self.ep_return += r
        self.ep_length += 1 if ok is None else ok
        if real_end.any():
            if self.games:
                self.finished.extend(finished_games(info, real_end))
            else:
                for i in np.flatnonzero(real_end):
                    self.finished.append((float(self.ep_return[i]), int(self.ep_length[i])))
            self.ep_return[real_end] = 0.0
            self.ep_length[real_end] = 0

    def collect(self, n_steps: int) -> Rollout:
        """Run ``n_steps`` vector steps and return the (not yet finalised) rollout."""
        if self.obs is None:
            raise RuntimeError("reset() the collector first")
        n = self.num_envs
        sampler = self._numpy_sampler()
        o = self.obs.numpy()
        obs_buf, act_buf = self._obs_action_buffers(o, n_steps)
        rew = np.zeros((n_steps, n), np.float32)
        term = np.zeros((n_steps, n), bool)
        end = np.zeros((n_steps, n), bool)
        valid = np.ones((n_steps, n), bool)
        masked = self.mask_source is not None
        mask_buf = np.empty((n_steps, *self.masks.shape), bool) if masked else None
        state_buf = (np.empty((n_steps, *self.global_state.shape), np.float32) if self.central
                     else None)
        fixes: list[tuple[int, np.ndarray, np.ndarray]] = []  # truncations (SAME_STEP)
        next_step = self.mode == AutoresetMode.NEXT_STEP
        scaler = self.reward_scaler
        noise, logp_buf, val_buf = self._step_buffers(sampler, n_steps)
        pending = self.pending
        # no weight changes during a rollout: bf16 image trunks cast theirs once, not per step
        with frozen_weights(self.policy), torch.inference_mode():
            for t in range(n_steps):
                obs_buf[t] = o
                if state_buf is not None:
                    state_buf[t] = self.global_state
                if sampler is not None:
                    sampler(o, noise[t], out=act_buf[t])
                else:
                    if masked:
                        mask_buf[t] = self.masks
                    self._policy_act(o, act_buf[t], logp_buf[t], val_buf[t], masked)
                raw, r, te, tr, info = self.env.step(self.to_env(act_buf[t]))
                te, done, r, ok, pending, real_end = self._two_masks(
                    te, tr, r, pending, next_step, idle_rows(info))
                if masked:  # (a step whose action the env ignores may allow nothing)
                    self.masks = self.mask_source.read(raw, info, dummy=pending)
                self.global_state = self._read_state(info)
                if ok is not None:
                    valid[t] = ok
                term[t] = te
                end[t] = done
                self._count_episodes(r, ok, real_end, info)
                rew[t] = r if scaler is None else scaler(r, real_end, ok)
                if not next_step and tr.any():
                    trunc = tr & ~te
                    if trunc.any():
                        idx = np.flatnonzero(trunc)
                        fin = np.stack([np.asarray(info["final_obs"][i]) for i in idx])
                        fixes.append((t, idx, self._prep_obs(fin, update=False)))
                o = self._prep_obs(raw, update=True)
        # tensors made outside inference mode: they are ordinary tensors (autograd may use them)
        self.pending = pending
        self.obs = torch.from_numpy(o)
        obs_t = torch.from_numpy(obs_buf)
        act_t = torch.from_numpy(act_buf)
        extra = torch.from_numpy(np.concatenate([o] + [f[2] for f in fixes]))
        states_t = None if state_buf is None else torch.from_numpy(state_buf)
        logp_t, values_t, next_values = self._logp_and_values(obs_t, act_t, logp_buf, val_buf,
                                                              extra, fixes, states_t)
        return Rollout(obs=obs_t, actions=act_t, logp=logp_t, values=values_t,
                       rewards=torch.from_numpy(rew), terminated=torch.from_numpy(term),
                       episode_end=torch.from_numpy(end), next_values=next_values,
                       valid=torch.from_numpy(valid),
                       action_masks=None if mask_buf is None else torch.from_numpy(mask_buf),
                       states=states_t)

    def _step_buffers(self, sampler: NumpySampler | None, n_steps: int) -> tuple:
        """``(noise, logp, values)`` arrays of a window: with the NumPy sampler its noise
        (one uniform per row, or one normal per entry of the flattened Box action) and no
        log-probabilities or values (one forward pass over the rollout gives them); else
        no noise and the arrays ``policy.act`` fills."""
        n = self.num_envs
        if sampler is not None:
            width = 1 if sampler.kind == "categorical" else int(np.prod(self.space.shape))
            draw = torch.rand if sampler.kind == "categorical" else torch.randn
            return draw((n_steps, n, width), generator=self.generator).numpy(), None, None
        return None, np.empty((n_steps, n), np.float32), np.zeros((n_steps, n), np.float32)

    def _obs_action_buffers(self, o: np.ndarray, n_steps: int
                            ) -> tuple[np.ndarray, np.ndarray]:
        """The rollout's observation and action arrays ``[T, N, ...]``: pixels for a
        channels-last CNN stored as T, N, H, W, C (seen as T, N, C, H, W)."""
        n = self.num_envs
        if self.pixels_nhwc and o.ndim == 4:  # [T, N, C, H, W] stored as T, N, H, W, C
            nn_, c, h, w = o.shape
            obs_buf = np.empty((n_steps, nn_, h, w, c), o.dtype).transpose(0, 1, 4, 2, 3)
        else:
            obs_buf = np.empty((n_steps, *o.shape), o.dtype)  # float32, or uint8 pixels
        dtype = np.float32 if self.box else np.int64
        return obs_buf, np.empty((n_steps, n, *self.space.shape), dtype)

    def _policy_act(self, o: np.ndarray, act: np.ndarray, logp: np.ndarray,
                    val: np.ndarray, masked: bool) -> None:
        """One step's actions by the torch policy (``policy.act``), written into the
        step's rows ``act``, ``logp`` and (with a critic) ``val``."""
        kw = {"state": torch.from_numpy(self.global_state)} if self.central else {}
        if masked:
            action, lp, value = self.policy.act(torch.from_numpy(o), self.generator,
                                                torch.from_numpy(self.masks), **kw)
        else:
            action, lp, value = self.policy.act(torch.from_numpy(o), self.generator, **kw)
        act[...] = action.numpy().reshape(act.shape)
        logp[...] = lp.numpy()
        if self.use_critic:
            val[...] = value.numpy()

    def _logp_and_values(self, obs_t: torch.Tensor, act_t: torch.Tensor,
                         logp_buf: np.ndarray | None, val_buf: np.ndarray | None,
                         extra: torch.Tensor, fixes: list, states_t: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp, values, next_values)`` ``[T, N]`` of the rollout: from one forward pass
        over it where the NumPy sampler drew the actions (``logp_buf`` None), else the
        policy's own; the next values from the critic on ``extra`` — the last
        observations, then each truncated episode's final one (``fixes``) — or, for a
        centralised critic (``states_t``, the window's states), on the current state."""
        n_steps, n = act_t.shape[:2]
        # (not inference mode: the losses may use these tensors)
        with frozen_weights(self.policy), torch.no_grad():
            if logp_buf is None:
                flat_obs = obs_t.reshape(n_steps * n, *obs_t.shape[2:])
                flat_act = act_t.reshape(n_steps * n, *act_t.shape[2:])
                kw = {} if states_t is None else {"state": states_t.reshape(n_steps * n, -1)}
                logp, _, values = self.policy.evaluate(flat_obs, flat_act, **kw)
                logp_t = logp.reshape(n_steps, n)
                values_t = (values.reshape(n_steps, n) if self.use_critic
                            else torch.zeros(n_steps, n))
            else:
                logp_t = torch.from_numpy(logp_buf)
                values_t = torch.from_numpy(val_buf)
            v_extra = self._values(extra, self.global_state)
        next_values = torch.cat([values_t[1:], v_extra[:n].unsqueeze(0)])
        k = n
        for t, idx, _fin in fixes:
            next_values[t, torch.from_numpy(idx)] = v_extra[k:k + len(idx)]
            k += len(idx)
        return logp_t, values_t, next_values

    def pop_finished(self) -> list[tuple[float, int]]:
        out, self.finished = self.finished, []
        return out

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"obs": self.obs.numpy().copy(), "pending": self.pending.copy(),
               "ep_return": self.ep_return.copy(), "ep_length": self.ep_length.copy()}
        if self.masks is not None:
            out["action_masks"] = self.masks.copy()
        if self.global_state is not None:
            out["global_state"] = self.global_state.copy()
        return out

    def load_state_dict(self, d: dict) -> None:
        obs = np.asarray(d["obs"])
        keep = self.keep_uint8 and obs.dtype == np.uint8
        self.obs = torch.from_numpy(np.array(obs, np.uint8 if keep else np.float32))
        self.pending = np.asarray(d["pending"], bool).copy()
        self.ep_return = np.asarray(d["ep_return"], np.float64).copy()
        self.ep_length = np.asarray(d["ep_length"], np.int64).copy()
        if self.mask_source is not None:
            self.masks = np.asarray(d["action_masks"], bool).copy()
        if self.central:
            self.global_state = np.asarray(d["global_state"], np.float32).copy()
