"""Running observation normalisation and reward scaling, kept outside the environment so
their statistics are plain arrays saved and restored with every checkpoint.

* :class:`RunningMeanStd` — parallel (Chan et al.) update of mean and variance.
* :class:`ObsNormalizer` — ``clip((obs − μ) / sqrt(σ² + ε), ±clip)``; statistics are
  updated from each batch of raw observations the collector sees while training.
* :class:`RewardScaler` — divides rewards by the running std of the discounted return
  ``G ← γ G + r`` (reset at every episode end), then clips; the mean is not removed, so
  the sign of rewards is kept.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RunningMeanStd", "ObsNormalizer", "RewardScaler"]


class RunningMeanStd:
    """Mean and (population) variance of every sample seen so far, per feature, updated one
    batch at a time with the parallel formula of Chan et al. ``epsilon`` is a pseudo-count
    of the initial estimate (mean 0, variance 1)."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = float(epsilon)

    def update(self, x: np.ndarray) -> None:
        """Fold in the batch ``x`` ``[B, *shape]``. (Called on every rollout step, so written
        with plain ufuncs; a one-row batch, the usual case, has batch variance exactly 0.)"""
        x = np.asarray(x, np.float64)
        b_count = x.shape[0]
        if b_count == 1:
            b_mean = x[0]
            b_m2 = 0.0
        else:
            b_mean = np.add.reduce(x, 0) / b_count
            dev = x - b_mean
            b_m2 = np.add.reduce(dev * dev, 0)
        delta = b_mean - self.mean
        tot = self.count + b_count
        self.mean = self.mean + delta * (b_count / tot)
        m2 = self.var * self.count + b_m2 + delta * delta * (self.count * b_count / tot)
        self.var = m2 / tot
        self.count = tot

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean.copy(), "var": self.var.copy(),
                "count": np.array([self.count], np.float64)}

    def load_state_dict(self, d: dict) -> None:
        self.mean = np.asarray(d["mean"], np.float64).copy()
        self.var = np.asarray(d["var"], np.float64).copy()
        self.count = float(np.asarray(d["count"]).reshape(-1)[0])


class ObsNormalizer:
    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8):
        self.rms = RunningMeanStd(shape)
        self.clip = float(clip)
        self.eps = eps

    def __call__(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        if update:
            self.rms.update(obs)
        out = (obs - self.rms.mean) / np.sqrt(self.rms.var + self.eps)
        np.maximum(out, -self.clip, out=out)
        np.minimum(out, self.clip, out=out)
        return out.astype(np.float32)

    def state_dict(self):
        return self.rms.state_dict()

    def load_state_dict(self, d):
        self.rms.load_state_dict(d)


class RewardScaler:
    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, eps: float = 1e-8):
        self.rms = RunningMeanStd(())
        self.ret = np.zeros(num_envs, np.float64)
        self.gamma = float(gamma)
        self.clip = float(clip)
        self.eps = eps

    def __call__(self, rewards: np.ndarray, episode_end: np.ndarray,
                 valid: np.ndarray | None = None) -> np.ndarray:
        """Scale one step of rewards ``[N]``; ``valid`` False marks dummy steps (ignored)."""
        r = np.asarray(rewards, np.float64)
        if valid is None:
            self.ret = self.ret * self.gamma + r
            self.rms.update(self.ret)
        else:
            self.ret = np.where(valid, self.ret * self.gamma + r, self.ret)
            if valid.any():
                self.rms.update(self.ret[valid])
        out = r / np.sqrt(self.rms.var + self.eps)
        np.maximum(out, -self.clip, out=out)
        np.minimum(out, self.clip, out=out)
        self.ret[np.asarray(episode_end, bool)] = 0.0
        return out.astype(np.float32)

    def state_dict(self):
        d = self.rms.state_dict()
        d["ret"] = self.ret.copy()
        return d

    def load_state_dict(self, d):
        self.rms.load_state_dict(d)
        self.ret = np.asarray(d["ret"], np.float64).copy()
