"""What the token trainer does differently in an agent run (``env`` set): each
iteration's batch is ``prompts_per_iter`` episode seeds × ``samples_per_prompt`` episodes
(a critic-free preset's groups are the episodes of one seed), played in the environment
instead of completions scored by reward functions; held-out evaluation plays episodes
from seeds training never draws; the built-in model's warm start imitates the
environment's own demonstrations (an environment with a ``demonstration(rng)`` method
returning the assistant turns of a game from its current reset).

Seeds come from the trainer's prompt stream (the same on every rank, each rank playing its
block), so an agent run resumes exactly like any other: every episode starts from a reset
with its seed. Functions of the trainer ``tr``
(:class:`~ppokit.llm.training.trainer.TokenTrainer`) and of :class:`AgentRunner`.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ppokit.errors import UserCodeError

from ..labelling.batching import IterationBatch
from ..modeling.tuning import nll_steps
from .bounds import CHARS_PER_TOKEN, first_episode, respond, tool_replies
from .conversation import Episode, Renderer
from .env import CheckedTextEnv, text_env_factory
from .rollout import episode_stats, play, to_rollout
from .tools import ToolSet

__all__ = ["AgentRunner", "EVAL_SEED_OFFSET", "warm_start_episodes"]

EVAL_SEED_OFFSET = 1 << 31  # held-out episodes: seeds at and above this, never drawn


class AgentRunner:
    """The environment, its tools and the episodes of an agent run."""

    def __init__(self, env: Any, env_kwargs: dict, tools: list, tool_format: str,
                 tool_time_limit: float):
        self.factory, self.label = text_env_factory(env, env_kwargs)
        self.tools = ToolSet(tools, tool_format, tool_time_limit) if tools else None
        self.pool: list[CheckedTextEnv] = []

    def envs(self, n: int) -> list[CheckedTextEnv]:
        """``n`` environments, made once and reused (each reset with its seed)."""
        while len(self.pool) < n:
            self.pool.append(CheckedTextEnv(self.factory(), self.label))
        return self.pool[:n]

    def renderer(self, tok) -> Renderer:
        json_tools = self.tools is not None and self.tools.fmt == "json"
        return Renderer(tok, self.tools.schemas if json_tools else None)

    def play(self, tr, seeds: list[int], generator: torch.Generator | None = None,
             temperature: float | None = None) -> list[Episode]:
        from ..inputs.data import model_context

        context = model_context(tr.policy)[0] or 4096
        with torch.no_grad(), tr.autocast(tr.cfg.sampler_precision):
            return play(self.envs(len(seeds)), seeds, self.renderer(tr.tok),
                        lambda ids, mask: tr.sample_ids(ids, mask, generator, temperature),
                        max_turns=tr.cfg.max_turns, max_new_tokens=tr.max_new_tokens,
                        context=context, tools=self.tools)

    def collect(self, tr) -> IterationBatch:
        """This rank's episodes of one iteration, as the trainer's batch."""
        cfg = tr.cfg
        seeds = [tr.py_rng.randrange(EVAL_SEED_OFFSET) for _ in range(cfg.prompts_per_iter)]
        k = len(seeds) // tr.world
        seeds = seeds[tr.rank * k:(tr.rank + 1) * k]
        rows = [s for s in seeds for _ in range(cfg.samples_per_prompt)]
        eps = self.play(tr, rows)
        batch = to_rollout(eps, tr.tok.pad_token_id)
        prompts = [ep.messages[0]["content"] for ep in eps]
        comps = [tr.tok.decode(ep.ids[ep.prompt_len:]) for ep in eps]
        out = IterationBatch(rows, prompts, batch.roll, comps, batch.scores, {}, 0.0,
                             self.stats(eps))
        out.turn_rewards = batch.turn_rewards
        return out

    def evaluate(self, tr) -> dict:
        """``eval/episode/...``: episodes from held-out seeds, sampled at the training
        temperature with a generator of its own (the same seeds each time)."""
        n = tr.cfg.n_eval_prompts
        seeds = [EVAL_SEED_OFFSET + k for k in range(n)]
        gen = torch.Generator().manual_seed(tr.cfg.seed + 7919)
        eps = self.play(tr, seeds, generator=gen)
        return {f"eval/{k}": v for k, v in self.stats(eps).items()}

    def stats(self, eps: list[Episode]) -> dict:
        """The metrics of a batch of episodes."""
        return episode_stats(eps)

    def close(self) -> None:
        """End the tools' worker processes."""
        if self.tools is not None:
            self.tools.close()


def warm_start_episodes(runner: AgentRunner, model, tok, *, steps: int, lr: float,
                        seed: int, batch_size: int = 32, reserve: int = 8) -> dict:
    """SFT of ``model`` on the environment's demonstrations: each sample is one game from
    a reset with a fresh seed, its assistant turns (``env.demonstration(rng)``) played
    through the environment and its tools (bounded as in training: :mod:`.bounds`, the
    next turn's ``reserve`` tokens kept free) and laid out as an episode; the loss is the
    negative log-likelihood of the assistant tokens (their end-of-sequence tokens
    included)."""
    from ..inputs.data import model_context

    env = runner.factory() if runner.factory is not None else None
    if not callable(getattr(env, "demonstration", None)):
        raise AttributeError("demonstration")
    checked = CheckedTextEnv(env, runner.label)
    renderer = Renderer(tok)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    context = model_context(model)[0] or 4096

    def batch(step: int):
        eps = [_demonstrated(checked, env, renderer, rng, runner.tools, context, reserve)
               for _ in range(batch_size)]
        roll = to_rollout(eps, tok.pad_token_id).roll
        return roll.input_ids, roll.attention_mask, roll.action_mask

    return nll_steps(model, batch, steps=steps, lr=lr)


def _demonstration(checked: CheckedTextEnv, env, rng: random.Random) -> list[str]:
    where = f"env {checked.label}: demonstration()"
    try:
        turns = env.demonstration(rng)
        turns = list(turns) if isinstance(turns, (list, tuple)) else turns
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: the user's code failed
        raise UserCodeError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
        raise UserCodeError(f"{where}: expected a list of the assistant's turns (strings), "
                            f"got {type(turns).__name__}")
    return turns


def _demonstrated(checked: CheckedTextEnv, env, renderer: Renderer, rng: random.Random,
                  tools: ToolSet | None, context: int, reserve: int) -> Episode:
    tok = renderer.tok
    ep = first_episode(checked, renderer, rng.randrange(EVAL_SEED_OFFSET), context=context,
                       reserve=reserve)
    for text in _demonstration(checked, env, rng):
        left = context - len(ep.ids)
        ids = (tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               if len(text) <= left * CHARS_PER_TOKEN else None)
        if ids is None or len(ids) > left:  # the turn does not fit: the game ends here
            break
        ep.add(ids, action=True)
        ep.turn_ends.append(len(ep.ids) - 1)
        calls = tools.calls(text) if tools is not None else []
        reply = (tool_replies(tools, {0: (ep, calls)}, renderer, context=context,
                              reserve=reserve)[0] if calls else None)
        respond(ep, checked, text, renderer, reply, context=context)
        if ep.done:
            break
    return ep
