"""A text environment of a user's own module, registered with Gymnasium when imported (the
``module:Id`` form of ``--env``): say the number one below the one shown."""

import gymnasium


class Countdown(gymnasium.Env):
    observation_space = gymnasium.spaces.Text(16, charset="0123456789:")
    action_space = gymnasium.spaces.Text(16, charset="0123456789")

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.n = 3 + int(self.np_random.integers(5))
        return f"{self.n}:", {}

    def step(self, action):
        ok = action.strip() == str(self.n - 1)
        self.n -= 1
        done = self.n <= 1
        return ("" if done else f"{self.n}:"), float(ok), done, False, {}


gymnasium.register("ppokit-tests/Countdown-v0", entry_point=Countdown)
