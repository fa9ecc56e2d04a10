"""The inputs of tests/test_hostile_inputs.py: environments and reward functions that do
what they must not, data files that are not what their flag expects, a deep TOML file,
run directories to hand to commands. Each ``make_*`` writes into a scratch directory."""

from __future__ import annotations

import json
from pathlib import Path

BAD_ENVS = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _Base(gym.Env):
    observation_space = spaces.Box(-10.0, 10.0, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.obs(), {}

    def step(self, action):
        self.t += 1
        return self.obs(), self.reward(), False, self.t >= 20, {}

    def obs(self):
        return np.zeros(4, np.float32)

    def reward(self):
        return 1.0


class BadNan(_Base):
    def obs(self):
        return np.full(4, np.nan, np.float32)


class BadInf(_Base):
    def obs(self):
        return np.full(4, np.inf, np.float32)


class BadShape(_Base):
    def obs(self):
        return np.zeros(7, np.float32)


class BadOutside(_Base):
    def obs(self):
        return np.full(4, 50.0, np.float32)


class BadDtype(_Base):
    def obs(self):
        return np.array(list("abcd"))


class BadRaiseReset(_Base):
    def reset(self, *, seed=None, options=None):
        raise RuntimeError("boom in reset")


class BadStrreward(_Base):
    def reward(self):
        return "one"


class BadRaiseLate(_Base):
    calls = 0

    def step(self, action):
        BadRaiseLate.calls += 1
        if BadRaiseLate.calls > 200:
            raise RuntimeError("boom in step")
        return super().step(action)


class BadNanReward(_Base):
    def reward(self):
        return float("nan")


for _name in ("BadNan", "BadInf", "BadShape", "BadOutside", "BadDtype", "BadRaiseReset",
              "BadStrreward", "BadRaiseLate", "BadNanReward"):
    gym.register(f"{_name}-v0", entry_point=f"{__name__}:{_name}")
'''

REWARDS = '''
_calls = {"n": 0}


def good(prompts, completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def raises(prompts, completions, **kwargs):
    raise RuntimeError("reward exploded")


def raises_value(prompts, completions, **kwargs):
    raise ValueError("reward value error")


def raises_key(prompts, completions, **kwargs):
    return [kwargs["nonexistent_column"][0] for _ in completions]


def huge(prompts, completions, **kwargs):
    return [1e300 for _ in completions]


def wrong_count(prompts, completions, **kwargs):
    return [1.0]


def later_raises(prompts, completions, **kwargs):
    _calls["n"] += 1
    if _calls["n"] > 3:
        raise RuntimeError(f"reward exploded on call {_calls['n']}")
    return [0.5 for _ in completions]
'''

CHAT_TEMPLATE = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
                 "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
                 "{{ m['content'] }}{% endfor %}")

MODULES = ("badenvs", "rewards")


def write_modules(root: Path) -> None:
    (root / "badenvs.py").write_text(BAD_ENVS)
    (root / "rewards.py").write_text(REWARDS)


def write_toml(root: Path) -> None:
    (root / "toml").mkdir(exist_ok=True)
    (root / "toml" / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")


def _jsonl(path: Path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in rows))


def write_data(root: Path) -> None:
    """Prompt, preference and demonstration files, good and bad."""
    _jsonl(root / "p_ok.jsonl", [{"prompt": f"{i}{i + 1}{i + 2}>"} for i in range(20)])
    _jsonl(root / "p_oov.jsonl", [{"prompt": "ÄÖÜ€😀 HELLO"} for _ in range(10)])
    _jsonl(root / "p_big.jsonl", [{"prompt": "1" * 300_000} for _ in range(3)])
    _jsonl(root / "p_badrole.jsonl",
           [{"prompt": [{"role": "user", "content": "12>"}]} for _ in range(9)]
           + [{"prompt": [{"role": "hacker", "content": "12>"}]}])
    _jsonl(root / "sft_badline.jsonl", ["123"])
    _jsonl(root / "sft_badjson.jsonl", ["{not json"])
    (root / "sft_bytes.jsonl").write_bytes(b'{"prompt": "\xff\xfe", "completion": "1"}\n')
    (root / "pairs_bytes.jsonl").write_bytes(
        b'{"prompt": "\xff", "chosen": "1", "rejected": "2"}\n')
    _jsonl(root / "pairs_num.jsonl", ["1", "2", "3"])
    _jsonl(root / "pairs_deep.jsonl", ["[" * 100_000 + "]" * 100_000])
