"""The seam between the trainer and what samples its completions.

A rollout engine takes a batch of encoded, left-padded prompts (one row per completion:
a group's ``samples_per_prompt`` rows repeat its prompt) and returns a
:class:`~ppokit.llm.modeling.rollout.TokenRollout`: the token ids it drew and its own
log-probability of each (``TokenRollout.logp``, the behaviour policy's), stopping each
row at EOS or ``max_new_tokens``. Sampling is plain: ``softmax(logits / temperature)``,
no top-k or top-p (``temperature = 0``: greedy).

Before each iteration's generation the trainer calls :meth:`RolloutEngine.prepare`: an
engine that holds its own copy of the weights receives the policy's current ones there
and proves, with a probe, that it serves them (:mod:`.weights`).

:class:`PpokitEngine` is ppokit's own sampler (:func:`ppokit.llm.modeling.rollout.generate`)
on the trainer's policy: it shares the weights, so there is nothing to push, and its
log-probs are the trainer's own computation (``old_logprobs = "sampler"`` may use them).
"""

from __future__ import annotations

import torch

from ..modeling.rollout import TokenRollout, generate

__all__ = ["RolloutEngine", "PpokitEngine", "rollout_from_tokens"]


class RolloutEngine:
    """What an engine offers the trainer (subclasses implement :meth:`generate`)."""

    name = "engine"
    # the log-probs it returns are the trainer's own forward (may serve as PPO's old
    # log-probs); an engine with its own numerics has them recomputed by the trainer
    trainer_logprobs = False
    # it samples a model it is handed (``generate(..., model=)``), the trainer's policy by
    # default; else it serves its own copy of the weights, which prepare() refreshes
    shares_policy = False

    def generate(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *,
                 max_new_tokens: int, eos_token_id: int, pad_token_id: int,
                 temperature: float, generator: torch.Generator | None = None,
                 **kwargs) -> TokenRollout:
        raise NotImplementedError

    def prepare(self, tr) -> dict:
        """Make the engine serve the trainer ``tr``'s current policy; statistics to log."""
        return {}

    def close(self) -> None:
        """Release what the engine holds (processes, memory)."""


class PpokitEngine(RolloutEngine):
    """ppokit's sampler on the policy ``policy()`` returns (the trainer's, shared)."""

    name = "ppokit"
    trainer_logprobs = True
    shares_policy = True

    def __init__(self, policy, all_done=None):
        self.policy, self.all_done = policy, all_done

    def generate(self, prompt_ids, prompt_mask, *, max_new_tokens, eos_token_id, pad_token_id,
                 temperature, generator=None, model=None) -> TokenRollout:
        """``model``: sample from this model instead of the policy (e.g. the reference)."""
        return generate(self.policy() if model is None else model, prompt_ids, prompt_mask,
                        max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                        pad_token_id=pad_token_id, temperature=temperature,
                        generator=generator, all_done=self.all_done)


def rollout_from_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        tokens: list[list[int]], logps: list[list[float]], *,
                        eos_token_id: int, pad_token_id: int) -> TokenRollout:
    """The rollout of completions drawn elsewhere, in the layout ppokit's sampler gives:
    ``tokens[b]`` (EOS included when the row stopped there, nothing after it) and
    ``logps[b]`` (the engine's log-prob of each) appended to the left-padded prompt row
    ``b``, the generated part right-padded to the longest completion."""
    bsz, p = prompt_ids.shape
    if len(tokens) != bsz or any(len(t) != len(lp) for t, lp in zip(tokens, logps)):
        raise ValueError("rollout_from_tokens: one list of tokens and of log-probs per "
                         "prompt row, of equal lengths")
    if any(len(t) == 0 for t in tokens):
        raise ValueError("rollout_from_tokens: an engine returned an empty completion")
    width = max(len(t) for t in tokens)
    gen = torch.full((bsz, width), pad_token_id, dtype=torch.long)
    alive = torch.zeros((bsz, width), dtype=torch.bool)
    logp = torch.zeros((bsz, p + width), dtype=torch.float32)
    responses = []
    for b, (ids, lps) in enumerate(zip(tokens, logps)):
        n = len(ids)
        gen[b, :n] = torch.tensor(ids, dtype=torch.long)
        alive[b, :n] = True
        logp[b, p:p + n] = torch.tensor(lps, dtype=torch.float32)
        responses.append(list(ids[:-1]) if ids[-1] == eos_token_id else list(ids))
    has_eos = ((gen == eos_token_id) & alive).any(1)
    return TokenRollout(torch.cat([prompt_ids, gen], 1),
                        torch.cat([prompt_mask.long(), alive.long()], 1),
                        torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), alive], 1),
                        p, ~has_eos, responses, logp)
