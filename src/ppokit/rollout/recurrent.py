"""Rollouts with memory: the hidden state through episode boundaries, and sequence batches.

Where the state is reset (episode starts)
-----------------------------------------
``starts[t, i]`` says that ``obs[t, i]`` is the first observation of an episode; the state
the policy sees it with is then the zero state. What counts as a start follows the
auto-reset mode, the same bookkeeping as :mod:`ppokit.rollout.collector`:

* ``SAME_STEP``: the observation returned by a step that ended an episode (terminated *or*
  truncated) is already the reset one, so the next row starts an episode;
* ``NEXT_STEP``: the observation returned at an episode end is the real final one; the
  next row (the dummy step, ``valid = False``) is seen *with the running state* (its value
  is the episode's bootstrap, V(final observation) with the state the episode built), and
  the row after it, the reset observation, starts the new episode. The dummy step neither
  resets the state nor is trained on.

A truncation in ``SAME_STEP`` mode is bootstrapped from V(``info["final_obs"]``) seen with
the state after the episode's last row, which is the state the policy would have carried
into it — not the zero state of the episode that replaced it.

Two masks in the hidden state, then: ``episode_end`` (terminated or truncated) stops the
advantage's carry *and* resets the state; ``terminated`` alone decides whether there is a
bootstrap, and a truncation's bootstrap value still uses the old episode's state.

Sequence batches
----------------
:meth:`RecurrentRollout.sequence_batch` cuts each env's column of the window at its episode
starts: every piece is one episode's steps within the window (truncated back-propagation
through time: a piece starting at ``t = 0`` continues from the state recorded there). The
pieces are padded to the longest one, ``[S, L]``, with a mask that is False on padding and
on dummy rows; the state at each piece's first row is taken from the rollout. The update
engine then treats pieces as rows, exactly as the token trainer treats sequences: the
surrogate, value loss, entropy, advantage whitening and statistics are means over the mask,
so padding never counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from ppokit.engine.update import Forward

from .buffer import Rollout
from .collector import Collector, idle_rows

Tensor = torch.Tensor

__all__ = ["RecurrentRollout", "RecurrentCollector", "recurrent_forward", "STATE_KEYS"]

STATE_KEYS = ("state_0", "state_1", "state_2", "state_3")  # rows-first [S, layers, H]


@dataclass
class RecurrentRollout(Rollout):
    """A :class:`Rollout` plus ``starts`` ``[T, N]`` (``obs[t]`` begins an episode) and
    ``states``: the policy's state before each row, each tensor ``[T, N, layers, H]``
    (zero where ``starts``)."""

    starts: Tensor | None = None
    states: tuple[Tensor, ...] = field(default_factory=tuple)

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(env, t0, length)`` of every piece: each env's column cut at its episode
        starts and at the window's start, in env-major order."""
        T, N = self.num_steps, self.num_envs
        cut = self.starts.numpy().copy()
        cut[0] = True
        flat = cut.T.reshape(-1)  # env-major: env i's column is [i*T, (i+1)*T)
        begin = np.flatnonzero(flat)
        length = np.diff(np.append(begin, N * T))
        return begin // T, begin % T, length

    def sequence_batch(self) -> tuple[dict[str, Tensor], Tensor]:
        """``(data, mask)`` of the padded pieces (see the module documentation): ``obs``
        ``[S, L, ...]``, ``actions``, ``logp``, ``values``, ``advantages``, ``returns``
        ``[S, L]`` and the state at each piece's start under :data:`STATE_KEYS`
        ``[S, layers, H]``; ``mask`` ``[S, L]`` marks the real, valid steps."""
        if self.advantages is None:
            raise RuntimeError("compute_advantages() first")
        env, t0, length = self.segments()
        L = int(length.max())
        steps = np.arange(L)
        inside = steps[None, :] < length[:, None]
        t_idx = torch.from_numpy(np.minimum(t0[:, None] + steps[None, :],
                                            (t0 + length - 1)[:, None]))
        e_idx = torch.from_numpy(np.broadcast_to(env[:, None], t_idx.shape).copy())
        mask = torch.from_numpy(inside) & self.valid[t_idx, e_idx]
        data = {name: getattr(self, name)[t_idx, e_idx]
                for name in ("obs", "actions", "logp", "values", "advantages", "returns")}
        te, ee = torch.from_numpy(t0), torch.from_numpy(env)
        for key, s in zip(STATE_KEYS, self.states):
            data[key] = s[te, ee]
        return data, mask


def recurrent_forward(policy) -> callable:
    """The forward adapter of a recurrent policy for the update engine: the minibatch's
    pieces run as sequences from their recorded start states."""
    def forward(rows: dict) -> Forward:
        state = tuple(rows[k].transpose(0, 1) for k in STATE_KEYS[:policy.n_state])
        logp, ent, v = policy.evaluate_sequences(rows["obs"], rows["actions"], state)
        return Forward(logp, ent, v)
    return forward


class RecurrentCollector(Collector):
    """:class:`Collector` for a recurrent policy (``policy.act(obs, state, generator)``):
    it carries the state and the episode-start flags from one window to the next, records
    them with every row and resets the state exactly at episode starts (see the module
    documentation). Each step calls the policy (no NumPy fast path)."""

    def __init__(self, env, policy, **kw):
        kw.pop("fast", None)
        super().__init__(env, policy, fast=False, **kw)
        self.state = policy.initial_state(self.num_envs)
        self.starts = np.ones(self.num_envs, bool)

    def reset(self, seed: int | None = None) -> None:
        super().reset(seed)
        self.state = self.policy.initial_state(self.num_envs)
        self.starts = np.ones(self.num_envs, bool)

    def collect(self, n_steps: int) -> RecurrentRollout:
        if self.obs is None:
            raise RuntimeError("reset() the collector first")
        n = self.num_envs
        pol = self.policy
        o = self.obs.numpy()
        obs_buf = np.empty((n_steps, *o.shape), np.float32)
        act_dtype = np.float32 if self.box else np.int64
        act_buf = np.empty((n_steps, n, *self.space.shape), act_dtype)
        logp_buf = np.empty((n_steps, n), np.float32)
        val_buf = np.zeros((n_steps, n), np.float32)
        rew = np.zeros((n_steps, n), np.float32)
        term = np.zeros((n_steps, n), bool)
        end = np.zeros((n_steps, n), bool)
        valid = np.ones((n_steps, n), bool)
        starts_buf = np.zeros((n_steps, n), bool)
        state_bufs = [torch.empty(n_steps, n, *s.shape[::2]) for s in self.state]
        fixes: list[tuple[int, np.ndarray, np.ndarray]] = []  # SAME_STEP truncations: V(final)
        next_step = self.mode == AutoresetMode.NEXT_STEP
        scaler = self.reward_scaler
        pending = self.pending
        starts = self.starts
        state = self.state
        with torch.inference_mode():
            for t in range(n_steps):
                obs_buf[t] = o
                starts_buf[t] = starts
                state = pol.reset(state, starts)
                for buf, s in zip(state_bufs, state):
                    buf[t] = s.transpose(0, 1)
                action, logp, value, after = pol.act(torch.from_numpy(o), state,
                                                     self.generator)
                act_buf[t] = action.numpy().reshape(act_buf.shape[1:])
                logp_buf[t] = logp.numpy()
                if self.use_critic:
                    val_buf[t] = value.numpy()
                raw, r, te, tr, info = self.env.step(self.to_env(act_buf[t]))
                # NEXT_STEP: the dummy step returned the reset observation, so the new
                # episode's state starts where the old ``pending`` was set (or after an
                # idle step: an agent waiting for its environment's reset)
                was_pending = pending
                idle = idle_rows(info)
                te, done, r, ok, pending, real_end = self._two_masks(te, tr, r, pending,
                                                                     next_step, idle)
                if idle is not None:
                    was_pending = was_pending | idle
                starts = was_pending if next_step else done
                if ok is not None:
                    valid[t] = ok
                term[t] = te
                end[t] = done
                self._count_episodes(r, ok, real_end, info)
                rew[t] = r if scaler is None else scaler(r, real_end, ok)
                if not next_step and tr.any() and self.use_critic:
                    fix = self._final_values(tr & ~te, info, after)
                    if fix is not None:
                        fixes.append((t, *fix))
                state = after
                o = self._prep_obs(raw, update=True)
            last_state = pol.reset(state, starts)
            v_last = (pol.value(torch.from_numpy(o), last_state) if self.use_critic
                      else torch.zeros(n))  # (where o starts an episode it is never used)
            v_last = v_last.numpy().copy()
        self.pending = pending
        self.starts = np.asarray(starts, bool).copy()
        self.state = tuple(s.clone() for s in state)  # not inference tensors
        self.obs = torch.from_numpy(o)
        values_t = torch.from_numpy(val_buf)
        next_values = torch.cat([values_t[1:], torch.from_numpy(v_last)[None]])
        for t, idx, v in fixes:
            next_values[t, torch.from_numpy(idx)] = torch.from_numpy(v)
        return RecurrentRollout(
            obs=torch.from_numpy(obs_buf), actions=torch.from_numpy(act_buf),
            logp=torch.from_numpy(logp_buf), values=values_t, rewards=torch.from_numpy(rew),
            terminated=torch.from_numpy(term), episode_end=torch.from_numpy(end),
            next_values=next_values, valid=torch.from_numpy(valid),
            starts=torch.from_numpy(starts_buf), states=tuple(state_bufs))

    def _final_values(self, trunc: np.ndarray, info: dict, after: tuple
                      ) -> tuple[np.ndarray, np.ndarray] | None:
        """``(rows, V(final observation))`` of the episodes truncated this step
        (``trunc``), each seen with the state its episode built (not reset); None when
        none was."""
        if not trunc.any():
            return None
        idx = np.flatnonzero(trunc)
        fin = np.stack([np.asarray(info["final_obs"][i]) for i in idx])
        fin_t = torch.from_numpy(self._prep_obs(fin, update=False))
        ti = torch.from_numpy(idx)
        v_fin = self.policy.value(fin_t, tuple(s[:, ti] for s in after))
        return idx, v_fin.numpy().copy()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, np.ndarray]:
        d = super().state_dict()
        d["starts"] = self.starts.copy()
        for key, s in zip(STATE_KEYS, self.state):
            d[key] = s.numpy().copy()
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.starts = np.asarray(d["starts"], bool).copy()
        n = self.policy.n_state
        want = tuple(self.policy.initial_state(self.num_envs)[0].shape)
        state = tuple(torch.from_numpy(np.array(d[k], np.float32)) for k in STATE_KEYS[:n])
        if any(tuple(s.shape) != want for s in state):
            raise ValueError(f"recurrent state: expected tensors of shape {want}")
        self.state = state
