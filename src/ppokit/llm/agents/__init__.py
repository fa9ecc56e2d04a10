"""Language-model agents: multi-turn episodes in text environments, with tools, trained by
the same engine as every other run (docs/agents.md).

* :mod:`.env` — the text-environment interface (Gymnasium's shape with text), its checks,
  ids, ``module:Id`` and factories, and the built-in environments;
* :mod:`.conversation` — an episode as the exact tokens the policy saw;
* :mod:`.tools` — Python functions as tools: schemas, calls, failures as observations;
* :mod:`.toolworker` — the worker processes a user's tool runs in (killed past its time);
* :mod:`.bounds` — every episode within the model's context (observations, tool replies);
* :mod:`.rollout` — episodes played in a batch and laid out as one token rollout.
"""

from .conversation import Episode, Renderer
from .env import TEXT_ENVS, CheckedTextEnv, GuessNumberEnv, make_text_env, text_env_factory
from .rollout import EpisodeBatch, episode_stats, play, to_rollout
from .tools import ToolSet, tool_schema

__all__ = ["Episode", "Renderer", "TEXT_ENVS", "CheckedTextEnv", "GuessNumberEnv",
           "make_text_env", "text_env_factory", "EpisodeBatch", "episode_stats", "play",
           "to_rollout", "ToolSet", "tool_schema"]
