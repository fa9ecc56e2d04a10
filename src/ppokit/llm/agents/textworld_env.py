"""TextWorld games as text environments (the ``textworld`` extra).

A game is a file TextWorld compiled (``tw-make custom --world-size 2 --quest-length 2
--output games/g.z8``); the user names it (``--env textworld --env-kwargs '{"game":
"games/g.z8"}'``), and only that file is read. Each model turn is one command (its first
line); the reward is the game's score gained by it; the episode terminates when the game
is won or lost and is truncated at ``max_steps`` commands. ``demonstration`` is the game's
own walkthrough from the current reset (its ``policy_commands``), for a warm start.
"""

from __future__ import annotations

import os
import random

from ppokit.errors import UsageError, require_extra

__all__ = ["TextWorldEnv"]


class TextWorldEnv:
    """One TextWorld game (module doc)."""

    def __init__(self, game: str, max_steps: int = 50):
        require_extra(("textworld",), "textworld", "TextWorld games (--env textworld)")
        if not isinstance(game, str) or not os.path.isfile(game):
            raise UsageError(f"env_kwargs: game: expected a TextWorld game file (.z8 or "
                             f".ulx, made by tw-make), got {game!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise UsageError(f"env_kwargs: max_steps: expected an integer >= 1, got "
                             f"{max_steps!r}")
        import textworld
        import textworld.gym

        infos = textworld.EnvInfos(won=True, lost=True, max_score=True, policy_commands=True)
        env_id = textworld.gym.register_game(game, request_infos=infos,
                                             max_episode_steps=max_steps)
        self.env = textworld.gym.make(env_id)
        self.score, self.info = 0, {}

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset()  # (a TextWorld game is the same from every reset)
        self.score, self.info = 0, info
        return _text(obs), {"max_score": info.get("max_score")}

    def step(self, text: str):
        command = (text.strip().splitlines() or [""])[0].strip()
        obs, score, done, info = self.env.step(command)
        reward, self.score, self.info = float(score - self.score), score, info
        ended = bool(info.get("won") or info.get("lost"))
        return (_text(obs), reward, bool(done and ended), bool(done and not ended),
                {"won": bool(info.get("won"))})

    def demonstration(self, rng: random.Random) -> list[str]:
        return list(self.info.get("policy_commands") or [])

    def close(self) -> None:
        self.env.close()


_BANNER = set("_|\\$/<> ")


def _text(obs: str) -> str:
    """The game's text without its title banner, its prompt and status line and blank
    lines (the model reads what the game says, in fewer tokens)."""
    lines = [line.rstrip() for line in obs.splitlines()]
    kept = [line for line in lines if line.strip() and not set(line) <= _BANNER
            and not line.startswith(">")]
    return "\n".join(kept) or "."
