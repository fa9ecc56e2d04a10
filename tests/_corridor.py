"""A tiny custom environment written as a user's module: walk right along a corridor.

``write_module(dir, name, env_id)`` writes ``dir/name.py``, which registers ``env_id`` when
imported (Gymnasium's ``module:Id`` form) and, if ``marker`` is given, creates that file as
a visible side effect of being imported."""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import gymnasium as gym
import numpy as np
{marker}

class Corridor(gym.Env):
    """Position 0..size; action 1 steps right, 0 left; -0.1 a step, +1 at the end. The
    observation is the relative position, ``width`` times."""

    def __init__(self, size=3, width=1):
        self.size = int(size)
        self.width = int(width)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.width,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = 0

    def _obs(self):
        return np.full(self.width, self.pos / self.size, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {{}}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
        done = self.pos >= self.size
        return self._obs(), (1.0 if done else -0.1), done, False, {{}}


gym.register({env_id!r}, entry_point=Corridor, max_episode_steps=20)
'''

# the best return of a corridor of ``size``: size - 1 steps at -0.1, then +1
def best_return(size: int) -> float:
    return 1.0 - 0.1 * (size - 1)


def write_module(directory: Path, name: str, env_id: str, marker: Path | None = None) -> Path:
    mark = "" if marker is None else f"open({str(marker)!r}, 'w').write('imported')"
    path = Path(directory) / f"{name}.py"
    path.write_text(SOURCE.format(marker=mark, env_id=env_id))
    return path
